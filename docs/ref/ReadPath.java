// rekey read path: reference implementation (Java 11+).
// Spec: docs/read-path.md. Read one logical key spread over several partition
// keys as one stream in sort-key order, a page at a time, with rekey's cursor.
// `QueryFn` is your Query call (docs/read-path.md shows one).

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

public final class ReadPath {
    public static final int VERSION = 1;

    private ReadPath() {}

    /** kind: "any", "begins_with" or "between"; a and b "" when unused. */
    public static final class Query {
        public String table, partitionKey, sortKey, rule, kind, a = "", b = "", order;
        public List<String> keys;
        public int limit;
    }

    /** op: null, "begins_with", "between", ">", ">=", "<" or "<=". */
    public static final class KeyCondition {
        public final String op;
        public final List<String> values;
        KeyCondition(String op, List<String> values) { this.op = op; this.values = values; }
    }

    public static final class Request {
        public String key;
        public KeyCondition condition;
        public boolean ascending;
        /** null, or the lastEvaluatedKey of the call before. */
        public Object exclusiveStartKey;
        public int limit;
    }

    public static final class Answer {
        /** Sort key and item, in the read's order. */
        public List<Map.Entry<String, Object>> items = new ArrayList<>();
        /** null when DynamoDB returned no LastEvaluatedKey. */
        public Object lastEvaluatedKey;
    }

    public interface QueryFn { Answer query(Request request); }

    public static final class PageItem {
        public final int key;
        public final String sk;
        public final Object item;
        PageItem(int key, String sk, Object item) { this.key = key; this.sk = sk; this.item = item; }
    }

    public static final class Page {
        public final List<PageItem> items;
        /** null on the last page. */
        public final String cursor;
        Page(List<PageItem> items, String cursor) { this.items = items; this.cursor = cursor; }
    }

    public static final class CursorError extends IllegalArgumentException {
        /** "malformed", "version", "foreign" or "out_of_range". */
        public final String kind;
        CursorError(String kind) { super("bad cursor: " + kind); this.kind = kind; }
    }

    // ---- the cursor ----------------------------------------------------------

    /** s as a JSON string: quote, backslash and control characters escaped, as serde_json and JSON.stringify do. */
    static String json(String s) {
        StringBuilder o = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': o.append("\\\""); break;
                case '\\': o.append("\\\\"); break;
                case '\n': o.append("\\n"); break;
                case '\r': o.append("\\r"); break;
                case '\t': o.append("\\t"); break;
                case '\b': o.append("\\b"); break;
                case '\f': o.append("\\f"); break;
                default:
                    if (c < 0x20) o.append(String.format("\\u%04x", (int) c));
                    else o.append(c);
            }
        }
        return o.append('"').toString();
    }

    /** FNV-1a 64 of the query's canonical JSON, 16 hex digits. */
    public static String queryId(Query q) {
        List<String> parts = new ArrayList<>(List.of("rekey-query/1", q.table, q.partitionKey, q.sortKey, q.rule, q.order, q.kind, q.a, q.b));
        parts.addAll(q.keys);
        StringBuilder text = new StringBuilder("[");
        for (int i = 0; i < parts.size(); i++) text.append(i > 0 ? "," : "").append(json(parts.get(i)));
        long h = 0xcbf29ce484222325L;
        for (byte b : text.append(']').toString().getBytes(StandardCharsets.UTF_8)) {
            h = (h ^ (b & 0xff)) * 0x100000001b3L;
        }
        return String.format("%016x", h);
    }

    public static String encodeCursor(String qid, int key, String sk) {
        String text = "{\"v\":" + VERSION + ",\"q\":" + json(qid) + ",\"k\":" + key + ",\"s\":" + json(sk) + "}";
        return Base64.getUrlEncoder().withoutPadding().encodeToString(text.getBytes(StandardCharsets.UTF_8));
    }

    /** The [key index, sort key] of a cursor of query q; throws CursorError. */
    public static Object[] decodeCursor(String text, Query q) {
        Map<String, Object> c;
        try {
            text = text.strip();
            byte[] raw = Base64.getUrlDecoder().decode(text);
            // Only the canonical form: no padding, no stray trailing bits.
            if (!Base64.getUrlEncoder().withoutPadding().encodeToString(raw).equals(text)) throw new IllegalArgumentException();
            String json = StandardCharsets.UTF_8.newDecoder().decode(java.nio.ByteBuffer.wrap(raw)).toString();
            c = new FlatJson(json).object();
        } catch (IllegalArgumentException | java.nio.charset.CharacterCodingException e) {
            throw new CursorError("malformed");
        }
        if (!(c.get("v") instanceof Long)) throw new CursorError("malformed");
        if ((Long) c.get("v") != VERSION) throw new CursorError("version");
        if (c.size() != 4 || !(c.get("q") instanceof String) || !(c.get("k") instanceof Long) || !(c.get("s") instanceof String)) {
            throw new CursorError("malformed");
        }
        if (!c.get("q").equals(queryId(q))) throw new CursorError("foreign");
        long k = (Long) c.get("k");
        String s = (String) c.get("s");
        if (k >= q.keys.size() || !contains(rangeOf(q), s)) throw new CursorError("out_of_range");
        return new Object[] {(int) k, s};
    }

    /** A JSON object of strings and non-negative integers, nothing else. */
    private static final class FlatJson {
        private final String s;
        private int i;
        FlatJson(String s) { this.s = s; }
        private void ws() { while (i < s.length() && " \t\n\r".indexOf(s.charAt(i)) >= 0) i++; }
        private char next() { if (i >= s.length()) throw new IllegalArgumentException(); return s.charAt(i++); }
        private void expect(char c) { ws(); if (next() != c) throw new IllegalArgumentException(); }
        private char peek() { if (i >= s.length()) throw new IllegalArgumentException(); return s.charAt(i); }
        Map<String, Object> object() {
            Map<String, Object> m = new LinkedHashMap<>();
            expect('{');
            ws();
            if (peek() == '}') {
                i++;
            } else {
                while (true) {
                    ws();
                    String k = string();
                    expect(':');
                    ws();
                    m.put(k, peek() == '"' ? string() : number());
                    ws();
                    char c = next();
                    if (c == '}') break;
                    if (c != ',') throw new IllegalArgumentException();
                }
            }
            ws();
            if (i != s.length()) throw new IllegalArgumentException();
            return m;
        }
        private Long number() {
            int start = i;
            while (i < s.length() && Character.isDigit(s.charAt(i))) i++;
            if (i == start || (s.charAt(start) == '0' && i - start > 1)) throw new IllegalArgumentException();
            return Long.parseLong(s.substring(start, i));
        }
        private String string() {
            if (next() != '"') throw new IllegalArgumentException();
            StringBuilder o = new StringBuilder();
            for (char c = next(); c != '"'; c = next()) {
                if (c < 0x20) throw new IllegalArgumentException();
                if (c != '\\') { o.append(c); continue; }
                char e = next();
                switch (e) {
                    case '"': case '\\': case '/': o.append(e); break;
                    case 'b': o.append('\b'); break;
                    case 'f': o.append('\f'); break;
                    case 'n': o.append('\n'); break;
                    case 'r': o.append('\r'); break;
                    case 't': o.append('\t'); break;
                    case 'u':
                        if (i + 4 > s.length()) throw new IllegalArgumentException();
                        o.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                        break;
                    default: throw new IllegalArgumentException();
                }
            }
            return o.toString();
        }
    }

    // ---- sort-key ranges -----------------------------------------------------

    /** DynamoDB orders strings by UTF-8 bytes, which is code point order (not String.compareTo's UTF-16 order). */
    static int cmp(String a, String b) {
        int i = 0, j = 0;
        while (i < a.length() && j < b.length()) {
            int x = a.codePointAt(i), y = b.codePointAt(j);
            if (x != y) return Integer.compare(x, y);
            i += Character.charCount(x);
            j += Character.charCount(y);
        }
        return Integer.compare(a.length() - i, b.length() - j);
    }

    /** lower, upper: {value, "inclusive"/"strict"} or null; prefix or null. */
    static final class Range {
        String lower, upper, prefix;
        boolean lowerInclusive, upperInclusive;
    }

    static Range rangeOf(Query q) {
        Range r = new Range();
        if (q.kind.equals("begins_with")) r.prefix = q.a;
        if (q.kind.equals("between")) {
            r.lower = q.a;
            r.upper = q.b;
            r.lowerInclusive = r.upperInclusive = true;
        }
        return r;
    }

    static boolean contains(Range r, String sk) {
        return (r.lower == null || cmp(sk, r.lower) > 0 || (r.lowerInclusive && sk.equals(r.lower)))
            && (r.upper == null || cmp(sk, r.upper) < 0 || (r.upperInclusive && sk.equals(r.upper)))
            && (r.prefix == null || sk.startsWith(r.prefix));
    }

    static boolean pastEnd(Range r, String sk, boolean asc) {
        boolean outside = r.prefix != null && !sk.startsWith(r.prefix);
        if (asc) {
            boolean past = r.upper != null && (cmp(sk, r.upper) > 0 || (!r.upperInclusive && sk.equals(r.upper)));
            return past || (outside && cmp(sk, r.prefix) > 0);
        }
        boolean past = r.lower != null && (cmp(sk, r.lower) < 0 || (!r.lowerInclusive && sk.equals(r.lower)));
        return past || (outside && cmp(sk, r.prefix) < 0);
    }

    /** The one sort-key condition DynamoDB takes that holds the whole range. */
    static KeyCondition keyCondition(Range r) {
        if (r.lower != null && r.upper != null) return new KeyCondition("between", List.of(r.lower, r.upper));
        if (r.lower != null) return new KeyCondition(r.lowerInclusive ? ">=" : ">", List.of(r.lower));
        if (r.upper != null) return new KeyCondition(r.upperInclusive ? "<=" : "<", List.of(r.upper));
        if (r.prefix != null) return new KeyCondition("begins_with", List.of(r.prefix));
        return new KeyCondition(null, List.of());
    }

    // ---- a page ----------------------------------------------------------------

    /** One page of q after cursor (null: the first page). Reads the keys one after the other; they may be read in parallel. */
    public static Page readPage(Query q, String cursor, QueryFn query) {
        boolean asc = q.order.equals("asc");
        int limit = Math.max(1, q.limit);
        Object[] after = cursor == null ? null : decodeCursor(cursor, q);
        List<PageItem> all = new ArrayList<>();
        for (int i = 0; i < q.keys.size(); i++) {
            Range r = rangeOf(q);
            if (after != null) {
                // Keys after the cursor's own come after it at an equal sort key.
                boolean inclusive = i > (int) after[0];
                if (asc) { r.lower = (String) after[1]; r.lowerInclusive = inclusive; }
                else { r.upper = (String) after[1]; r.upperInclusive = inclusive; }
            }
            List<PageItem> got = new ArrayList<>();
            Object start = null;
            while (got.size() < limit + 1) {
                Request req = new Request();
                req.key = q.keys.get(i);
                req.condition = keyCondition(r);
                req.ascending = asc;
                req.exclusiveStartKey = start;
                req.limit = limit + 1 - got.size();
                Answer answer = query.query(req);
                boolean done = answer.lastEvaluatedKey == null;
                for (Map.Entry<String, Object> e : answer.items) {
                    if (contains(r, e.getKey())) got.add(new PageItem(i, e.getKey(), e.getValue()));
                    else if (pastEnd(r, e.getKey(), asc)) { done = true; break; }
                }
                if (done) break;
                start = answer.lastEvaluatedKey;
            }
            all.addAll(got.subList(0, Math.min(got.size(), limit + 1)));
        }
        // Merge order: sort key in the read's order, then key index.
        Comparator<PageItem> bySk = (x, y) -> asc ? cmp(x.sk, y.sk) : cmp(y.sk, x.sk);
        all.sort(bySk.thenComparingInt(x -> x.key));
        List<PageItem> items = new ArrayList<>(all.subList(0, Math.min(all.size(), limit)));
        String next = null;
        if (all.size() > limit) {
            PageItem last = items.get(items.size() - 1);
            next = encodeCursor(queryId(q), last.key, last.sk);
        }
        return new Page(items, next);
    }
}
