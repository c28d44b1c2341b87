// rekey shard hashes: reference implementation (Java 8+).
// Spec: docs/hashes.md. Every hash returns an unsigned 32-bit value in a long.

import java.nio.charset.StandardCharsets;

public final class Shard {
    private Shard() {}

    /** FNV-1a 32-bit over the UTF-8 bytes. */
    public static long fnv1a32(String text) {
        int h = 0x811c9dc5; // 2166136261
        for (byte b : text.getBytes(StandardCharsets.UTF_8)) {
            h = (h ^ (b & 0xff)) * 0x01000193; // prime 16777619
        }
        return Integer.toUnsignedLong(h);
    }

    /** MurmurHash3 x86_32, seed 0, over the UTF-8 bytes. */
    public static long murmur3_32(String text) {
        byte[] data = text.getBytes(StandardCharsets.UTF_8);
        final int c1 = 0xcc9e2d51;
        final int c2 = 0x1b873593;
        int h = 0; // seed
        int i = 0;
        for (; i + 4 <= data.length; i += 4) {
            int k = (data[i] & 0xff) | (data[i + 1] & 0xff) << 8
                    | (data[i + 2] & 0xff) << 16 | (data[i + 3] & 0xff) << 24;
            k = Integer.rotateLeft(k * c1, 15) * c2;
            h = Integer.rotateLeft(h ^ k, 13) * 5 + 0xe6546b64;
        }
        int tail = data.length - i; // 0..3 bytes, little-endian
        if (tail > 0) {
            int k = 0;
            if (tail >= 3) k ^= (data[i + 2] & 0xff) << 16;
            if (tail >= 2) k ^= (data[i + 1] & 0xff) << 8;
            k ^= data[i] & 0xff;
            h ^= Integer.rotateLeft(k * c1, 15) * c2;
        }
        h ^= data.length;
        h ^= h >>> 16;
        h *= 0x85ebca6b;
        h ^= h >>> 13;
        h *= 0xc2b2ae35;
        h ^= h >>> 16;
        return Integer.toUnsignedLong(h);
    }

    /**
     * h = h * 31 + code point (mod 2^32), over Unicode code points. Equals
     * String.hashCode() (as unsigned) only when the text has no characters
     * outside the BMP; hashCode() would hash the UTF-16 surrogates instead.
     */
    public static long java31(String text) {
        int h = 0;
        for (int i = 0; i < text.length(); ) {
            int cp = text.codePointAt(i);
            h = h * 31 + cp;
            i += Character.charCount(cp);
        }
        return Integer.toUnsignedLong(h);
    }

    public static long hash(String name, String text) {
        switch (name) {
            case "fnv1a32": return fnv1a32(text);
            case "murmur3_32": return murmur3_32(text);
            case "java31": return java31(text);
            default: throw new IllegalArgumentException("unknown hash " + name);
        }
    }

    /** The shard of {@code text} among {@code n} shards (n > 0). */
    public static int shard(String name, String text, int n) {
        return (int) (hash(name, text) % n);
    }
}
