// Check the Java read-path reference (docs/ref/ReadPath.java) against the vectors.
// Reads the flattened vectors on stdin (see check_read_refs.sh), one record per
// line, tab-separated, every string as the hex of its UTF-8 bytes:
//   T table pk sk rule | K key | D pk sk value | C n kind a b order limit query-id
//   P n page cursor-or-"-" items (k:sk:value, comma-separated) | B case cursor error
// The data set is served by an in-memory Query with DynamoDB's semantics.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

public final class ReadPathCheck {
    static String unhex(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        return new String(b, StandardCharsets.UTF_8);
    }

    static String hex(String s) {
        StringBuilder o = new StringBuilder();
        for (byte b : s.getBytes(StandardCharsets.UTF_8)) o.append(String.format("%02x", b & 0xff));
        return o.toString();
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        Map<String, TreeMap<String, String>> data = new HashMap<>();
        List<String> keys = new ArrayList<>();
        String[] table = null;
        Map<Integer, ReadPath.Query> cases = new HashMap<>();
        List<String[]> pages = new ArrayList<>();
        List<String[]> bad = new ArrayList<>();
        for (String line; (line = in.readLine()) != null; ) {
            String[] f = line.split("\t", -1);
            switch (f[0]) {
                case "T": table = f; break;
                case "K": keys.add(unhex(f[1])); break;
                case "D":
                    data.computeIfAbsent(unhex(f[1]), k -> new TreeMap<>(ReadPath::cmp)).put(unhex(f[2]), unhex(f[3]));
                    break;
                case "C": {
                    ReadPath.Query q = new ReadPath.Query();
                    q.table = unhex(table[1]);
                    q.partitionKey = unhex(table[2]);
                    q.sortKey = unhex(table[3]);
                    q.rule = unhex(table[4]);
                    q.keys = keys;
                    q.kind = f[2];
                    q.a = unhex(f[3]);
                    q.b = unhex(f[4]);
                    q.order = f[5];
                    q.limit = Integer.parseInt(f[6]);
                    cases.put(Integer.parseInt(f[1]), q);
                    pages.add(new String[] {"Q", f[1], f[7]});
                    break;
                }
                case "P": pages.add(f); break;
                case "B": bad.add(f); break;
                default: throw new IllegalStateException("bad line " + line);
            }
        }
        ReadPath.QueryFn query = req -> {
            TreeMap<String, String> part = data.getOrDefault(req.key, new TreeMap<>(ReadPath::cmp));
            List<String> vals = req.condition.values;
            List<String> sks = new ArrayList<>(req.ascending ? part.navigableKeySet() : part.descendingKeySet());
            List<String> ok = new ArrayList<>();
            for (String sk : sks) {
                String op = req.condition.op;
                boolean matches = op == null
                    || (op.equals("begins_with") && sk.startsWith(vals.get(0)))
                    || (op.equals("between") && ReadPath.cmp(sk, vals.get(0)) >= 0 && ReadPath.cmp(sk, vals.get(1)) <= 0)
                    || (op.equals(">") && ReadPath.cmp(sk, vals.get(0)) > 0)
                    || (op.equals(">=") && ReadPath.cmp(sk, vals.get(0)) >= 0)
                    || (op.equals("<") && ReadPath.cmp(sk, vals.get(0)) < 0)
                    || (op.equals("<=") && ReadPath.cmp(sk, vals.get(0)) <= 0);
                Object start = req.exclusiveStartKey;
                boolean after = start == null || (req.ascending ? ReadPath.cmp(sk, (String) start) > 0 : ReadPath.cmp(sk, (String) start) < 0);
                if (matches && after) ok.add(sk);
            }
            ReadPath.Answer a = new ReadPath.Answer();
            for (String sk : ok.subList(0, Math.min(ok.size(), req.limit))) a.items.add(new AbstractMap.SimpleEntry<>(sk, part.get(sk)));
            a.lastEvaluatedKey = ok.size() > req.limit ? a.items.get(a.items.size() - 1).getKey() : null;
            return a;
        };
        int passed = 0, failed = 0;
        ReadPath.Query q = null;
        String cursor = null;
        int n = -1;
        for (String[] p : pages) {
            String what, got, want;
            if (p[0].equals("Q")) {
                n = Integer.parseInt(p[1]);
                q = cases.get(n);
                cursor = null;
                what = "case " + n + " query id";
                got = ReadPath.queryId(q);
                want = p[2];
            } else {
                ReadPath.Page page = ReadPath.readPage(q, cursor, query);
                List<String> items = new ArrayList<>();
                for (ReadPath.PageItem e : page.items) items.add(e.key + ":" + hex(e.sk) + ":" + hex((String) e.item));
                what = "case " + n + " page " + p[2];
                got = (page.cursor == null ? "-" : page.cursor) + " " + String.join(",", items);
                want = p[3] + " " + p[4];
                cursor = p[3].equals("-") ? null : p[3];
            }
            if (got.equals(want)) passed++;
            else { failed++; System.out.println("FAIL " + what + ": got " + got + ", want " + want); }
        }
        for (String[] b : bad) {
            String got;
            try {
                ReadPath.decodeCursor(unhex(b[2]), cases.get(Integer.parseInt(b[1])));
                got = "accepted";
            } catch (ReadPath.CursorError e) {
                got = e.kind;
            }
            if (got.equals(b[3])) passed++;
            else { failed++; System.out.println("FAIL bad cursor " + unhex(b[2]) + ": got " + got + ", want " + b[3]); }
        }
        System.out.println("java: " + passed + " passed, " + failed + " failed");
        System.exit(failed == 0 && passed > 0 ? 0 : 1);
    }
}
