// rekey shard hashes: reference implementation (TypeScript).
// Spec: docs/hashes.md. Every hash returns an unsigned 32-bit integer.

export type HashName = "fnv1a32" | "murmur3_32" | "java31";

const utf8 = new TextEncoder();

// FNV-1a 32-bit over the UTF-8 bytes.
export function fnv1a32(text: string): number {
  let h = 0x811c9dc5; // 2166136261
  for (const b of utf8.encode(text)) {
    h = Math.imul(h ^ b, 0x01000193) >>> 0; // prime 16777619
  }
  return h;
}

// MurmurHash3 x86_32, seed 0, over the UTF-8 bytes.
export function murmur3_32(text: string): number {
  const data = utf8.encode(text);
  const c1 = 0xcc9e2d51;
  const c2 = 0x1b873593;
  let h = 0; // seed
  let i = 0;
  for (; i + 4 <= data.length; i += 4) {
    let k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24);
    k = Math.imul(k, c1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, c2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  const tail = data.length - i; // 0..3 bytes, little-endian
  if (tail > 0) {
    let k = 0;
    if (tail >= 3) k ^= data[i + 2] << 16;
    if (tail >= 2) k ^= data[i + 1] << 8;
    k ^= data[i];
    k = Math.imul(k, c1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, c2);
    h ^= k;
  }
  h ^= data.length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

// h = h * 31 + code point (mod 2^32), over Unicode code points (not UTF-16 units).
export function java31(text: string): number {
  let h = 0;
  for (const ch of text) h = (Math.imul(h, 31) + (ch.codePointAt(0) ?? 0)) >>> 0;
  return h;
}

export function hash(name: HashName, text: string): number {
  switch (name) {
    case "fnv1a32":
      return fnv1a32(text);
    case "murmur3_32":
      return murmur3_32(text);
    case "java31":
      return java31(text);
  }
  throw new Error(`unknown hash ${name}`);
}

// The shard of `text` among `n` shards (n > 0).
export function shard(name: HashName, text: string, n: number): number {
  return hash(name, text) % n;
}
