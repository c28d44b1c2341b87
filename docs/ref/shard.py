"""rekey shard hashes: reference implementation (Python 3).

Spec: docs/hashes.md. Every hash returns an unsigned 32-bit integer.
"""

MASK = 0xFFFFFFFF


def fnv1a32(text: str) -> int:
    """FNV-1a 32-bit over the UTF-8 bytes."""
    h = 2166136261
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 16777619) & MASK
    return h


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK


def murmur3_32(text: str) -> int:
    """MurmurHash3 x86_32, seed 0, over the UTF-8 bytes."""
    data = text.encode("utf-8")
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = 0  # seed
    end = len(data) - len(data) % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (_rotl((k * c1) & MASK, 15) * c2) & MASK
        h = (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & MASK
    if end < len(data):  # 1..3 tail bytes, little-endian
        k = int.from_bytes(data[end:], "little")
        h ^= (_rotl((k * c1) & MASK, 15) * c2) & MASK
    h ^= len(data) & MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    h ^= h >> 16
    return h


def java31(text: str) -> int:
    """h = h * 31 + code point (mod 2**32), over Unicode code points."""
    h = 0
    for ch in text:
        h = (h * 31 + ord(ch)) & MASK
    return h


HASHES = {"fnv1a32": fnv1a32, "murmur3_32": murmur3_32, "java31": java31}


def shard(name: str, text: str, n: int) -> int:
    """The shard of `text` among `n` shards (n > 0)."""
    return HASHES[name](text) % n
