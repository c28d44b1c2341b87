// Check the Java reference (docs/ref/Shard.java) against the vectors.
// Reads the flattened vectors on stdin, one check per line (see
// check_hash_refs.sh): HASH <tab> N-or-"-" <tab> UTF-8-hex-input <tab> expected
// where N "-" means the plain hash, otherwise shard(HASH, input, N).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

public final class ShardCheck {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        int passed = 0;
        int failed = 0;
        for (String line; (line = in.readLine()) != null; ) {
            String[] f = line.split("\t", -1);
            String name = f[0];
            byte[] bytes = new byte[f[2].length() / 2];
            for (int i = 0; i < bytes.length; i++) {
                bytes[i] = (byte) Integer.parseInt(f[2].substring(2 * i, 2 * i + 2), 16);
            }
            String input = new String(bytes, StandardCharsets.UTF_8);
            long want = Long.parseLong(f[3]);
            long got = f[1].equals("-") ? Shard.hash(name, input) : Shard.shard(name, input, Integer.parseInt(f[1]));
            if (got == want) {
                passed++;
            } else {
                failed++;
                System.out.println("FAIL " + name + " n=" + f[1] + " input=" + f[2] + ": got " + got + ", want " + want);
            }
        }
        System.out.println("java: " + passed + " passed, " + failed + " failed");
        System.exit(failed == 0 && passed > 0 ? 0 : 1);
    }
}
