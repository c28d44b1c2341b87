#!/usr/bin/env python3
"""Generate vectors/hash-vectors.json: test vectors for rekey's shard hashes.

This is an independent, pure-Python implementation of the three hash
functions defined in docs/hashes.md. It deliberately shares no code with the
Rust implementation (src/hash.rs); the Rust unit tests and the reference
implementations in docs/ref/ are all checked against its output.

    fnv1a32     FNV-1a 32-bit over the UTF-8 bytes
                (offset basis 2166136261, prime 16777619, mod 2**32).
    murmur3_32  MurmurHash3 x86_32, seed 0, over the UTF-8 bytes.
    java31      h = (h * 31 + code_point) mod 2**32 over the Unicode code
                points (NOT UTF-16 units), starting from h = 0.

    shard(hash, text, n) = hash(text) % n

Usage (from the crate root):

    python3 scripts/gen_hash_vectors.py > vectors/hash-vectors.json
"""

import json
import sys

MASK32 = 0xFFFFFFFF
SHARD_COUNTS = (2, 10, 16, 20, 256)


def fnv1a32(text: str) -> int:
    h = 2166136261
    for byte in text.encode("utf-8"):
        h ^= byte
        h = (h * 16777619) & MASK32
    return h


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK32


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    h ^= h >> 16
    return h


def murmur3_32(text: str, seed: int = 0) -> int:
    data = text.encode("utf-8")
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & MASK32
    nblocks = len(data) // 4

    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * c1) & MASK32
        k = _rotl32(k, 15)
        k = (k * c2) & MASK32
        h ^= k
        h = _rotl32(h, 13)
        h = (h * 5 + 0xE6546B64) & MASK32

    tail = data[4 * nblocks :]
    if tail:
        k = int.from_bytes(tail, "little")  # 1..3 bytes, little-endian
        k = (k * c1) & MASK32
        k = _rotl32(k, 15)
        k = (k * c2) & MASK32
        h ^= k

    h ^= len(data) & MASK32
    return _fmix32(h)


def java31(text: str) -> int:
    h = 0
    for ch in text:  # Python iterates code points, like JS `for...of`
        h = (h * 31 + ord(ch)) & MASK32
    return h


HASHES = {"fnv1a32": fnv1a32, "murmur3_32": murmur3_32, "java31": java31}

INPUTS = [
    "",
    "a",  # 1 byte: murmur tail of 1
    "ab",  # 2 bytes: tail of 2
    "abc",  # 3 bytes: tail of 3
    "abcd",  # 4 bytes: one block, no tail
    "abcde",  # 5 bytes: one block + tail of 1
    "hello",
    "order-1",
    "ORDER#12345",
    "TENANT#acme#DAY#2026-07-07",
    "user#00000000-0000-0000-0000-000000000000",
    "ü",  # 2 UTF-8 bytes, 1 code point
    "日本語",  # 9 UTF-8 bytes, 3 code points
    "🦀",  # non-BMP: 4 UTF-8 bytes, 1 code point, 2 UTF-16 units
    "crab 🦀 Straße #42 日本",  # mixed
    "The quick brown fox jumps over the lazy dog",
    "x" * 201,
    "pk#" + "0123456789abcdef" * 16,  # 259 chars
]


def self_check() -> None:
    """Known published values, so a broken generator fails loudly."""
    assert murmur3_32("", 0) == 0
    assert murmur3_32("hello", 0) == 613153351  # 0x248BFA47
    assert murmur3_32("", 1) == 0x514E28B7
    assert fnv1a32("") == 2166136261
    assert fnv1a32("a") == 0xE40C292C
    assert fnv1a32("foobar") == 0xBF9CF968
    # For BMP-only strings java31 equals Java's String.hashCode (as unsigned).
    assert java31("hello") == 99162322
    assert java31("The quick brown fox jumps over the lazy dog") == (-609428141) & MASK32


def vector(text: str) -> dict:
    row = {"input": text}
    for name, fn in HASHES.items():
        row[name] = fn(text)
    row["shard"] = {
        name: {str(n): fn(text) % n for n in SHARD_COUNTS}
        for name, fn in HASHES.items()
    }
    return row


def main() -> None:
    self_check()
    rows = [vector(text) for text in INPUTS]
    json.dump(rows, sys.stdout, ensure_ascii=False, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
