// rekey read path: reference implementation (TypeScript).
// Spec: docs/read-path.md. Read one logical key spread over several partition
// keys as one stream in sort-key order, a page at a time, with rekey's cursor.
// `query` is your Query call (QueryFn below; docs/read-path.md shows one).

export type Condition = { kind: "any" | "begins_with" | "between"; a?: string; b?: string };
export type Query = { table: string; partition_key: string; sort_key: string; rule: string; keys: string[]; condition: Condition; order: "asc" | "desc"; limit: number };
export type KeyCondition = { op: null | "begins_with" | "between" | ">" | ">=" | "<" | "<="; values: string[] };
export type QueryRequest = { key: string; condition: KeyCondition; ascending: boolean; exclusiveStartKey: unknown; limit: number };
export type QueryAnswer = { items: [string, unknown][]; lastEvaluatedKey: unknown };
export type QueryFn = (request: QueryRequest) => Promise<QueryAnswer>;
export type PageItem = { key: number; sk: string; item: unknown };
export type Page = { items: PageItem[]; cursor: string | null };
export type Bound = { value: string; inclusive: boolean };
export type Range = { lower: Bound | null; upper: Bound | null; prefix: string | null };
export type Position = { key: number; sk: string };

export const VERSION = 1;

export class CursorError extends Error {
  kind: string; // "malformed", "version", "foreign" or "out_of_range"
  constructor(kind: string) {
    super(`bad cursor: ${kind}`);
    this.kind = kind;
  }
}

const utf8 = new TextEncoder();

// FNV-1a 64 of the query's canonical JSON, 16 hex digits.
export function queryId(q: Query): string {
  const c = q.condition;
  const parts = ["rekey-query/1", q.table, q.partition_key, q.sort_key, q.rule, q.order, c.kind, c.a ?? "", c.b ?? "", ...q.keys];
  let h = 0xcbf29ce484222325n;
  for (const b of utf8.encode(JSON.stringify(parts))) {
    h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return h.toString(16).padStart(16, "0");
}

function toBase64url(text: string): string {
  let bin = "";
  for (const b of utf8.encode(text)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function fromBase64url(text: string): string {
  if (!/^[A-Za-z0-9_-]*$/.test(text) || text.length % 4 === 1) throw new CursorError("malformed");
  const bin = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  // Only the canonical form: no stray trailing bits.
  if (btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "") !== text) throw new CursorError("malformed");
  return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bin, (ch) => ch.charCodeAt(0)));
}

export function encodeCursor(qid: string, key: number, sk: string): string {
  return toBase64url(`{"v":${VERSION},"q":${JSON.stringify(qid)},"k":${key},"s":${JSON.stringify(sk)}}`);
}

// DynamoDB orders strings by UTF-8 bytes, which is code point order (not
// JavaScript's UTF-16 order: "\u{fffd}" < "\u{1f600}" in UTF-8).
function cmp(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0) ?? 0);
  const y = Array.from(b, (c) => c.codePointAt(0) ?? 0);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
  }
  return x.length - y.length;
}

function rangeOf(c: Condition): Range {
  if (c.kind === "begins_with") return { lower: null, upper: null, prefix: c.a ?? "" };
  if (c.kind === "between") return { lower: { value: c.a ?? "", inclusive: true }, upper: { value: c.b ?? "", inclusive: true }, prefix: null };
  return { lower: null, upper: null, prefix: null };
}

function contains(r: Range, sk: string): boolean {
  const lo = r.lower;
  const up = r.upper;
  return (lo === null || cmp(sk, lo.value) > 0 || (lo.inclusive && sk === lo.value))
    && (up === null || cmp(sk, up.value) < 0 || (up.inclusive && sk === up.value))
    && (r.prefix === null || sk.startsWith(r.prefix));
}

function pastEnd(r: Range, sk: string, asc: boolean): boolean {
  const outside = r.prefix !== null && !sk.startsWith(r.prefix);
  if (asc) {
    const up = r.upper;
    const past = up !== null && (cmp(sk, up.value) > 0 || (!up.inclusive && sk === up.value));
    return past || (outside && cmp(sk, r.prefix ?? "") > 0);
  }
  const lo = r.lower;
  const past = lo !== null && (cmp(sk, lo.value) < 0 || (!lo.inclusive && sk === lo.value));
  return past || (outside && cmp(sk, r.prefix ?? "") < 0);
}

// The one sort-key condition DynamoDB takes that holds the whole range.
export function keyCondition(r: Range): KeyCondition {
  const lo = r.lower;
  const up = r.upper;
  if (lo !== null && up !== null) return { op: "between", values: [lo.value, up.value] };
  if (lo !== null) return { op: lo.inclusive ? ">=" : ">", values: [lo.value] };
  if (up !== null) return { op: up.inclusive ? "<=" : "<", values: [up.value] };
  if (r.prefix !== null) return { op: "begins_with", values: [r.prefix] };
  return { op: null, values: [] };
}

// The (key index, sort key) of a cursor of query q; throws CursorError.
export function decodeCursor(text: string, q: Query): Position {
  let c: any = null;
  try {
    c = JSON.parse(fromBase64url(text.trim()));
  } catch (e) {
    throw new CursorError("malformed");
  }
  if (c === null || typeof c !== "object" || Array.isArray(c)) throw new CursorError("malformed");
  if (!Number.isInteger(c.v) || c.v < 0) throw new CursorError("malformed");
  if (c.v !== VERSION) throw new CursorError("version");
  const fields = Object.keys(c).sort().join(",");
  if (fields !== "k,q,s,v" || typeof c.q !== "string" || !Number.isInteger(c.k) || c.k < 0 || typeof c.s !== "string") {
    throw new CursorError("malformed");
  }
  if (c.q !== queryId(q)) throw new CursorError("foreign");
  if (c.k >= q.keys.length || !contains(rangeOf(q.condition), c.s)) throw new CursorError("out_of_range");
  return { key: c.k, sk: c.s };
}

// One page of q after `cursor` (null: the first page). The keys are read in parallel.
export async function readPage(q: Query, cursor: string | null, query: QueryFn): Promise<Page> {
  const asc = q.order === "asc";
  const limit = Math.max(1, q.limit);
  const after = cursor === null ? null : decodeCursor(cursor, q);
  const perKey = await Promise.all(q.keys.map(async (key, i) => {
    const r = rangeOf(q.condition);
    if (after !== null) {
      // Keys after the cursor's own come after it at an equal sort key.
      const bound = { value: after.sk, inclusive: i > after.key };
      if (asc) r.lower = bound;
      else r.upper = bound;
    }
    const got: PageItem[] = [];
    let start: unknown = null;
    while (got.length < limit + 1) {
      const answer = await query({ key, condition: keyCondition(r), ascending: asc, exclusiveStartKey: start, limit: limit + 1 - got.length });
      let done = answer.lastEvaluatedKey === null || answer.lastEvaluatedKey === undefined;
      for (const [sk, item] of answer.items) {
        if (contains(r, sk)) got.push({ key: i, sk, item });
        else if (pastEnd(r, sk, asc)) {
          done = true;
          break;
        }
      }
      if (done) break;
      start = answer.lastEvaluatedKey;
    }
    return got.slice(0, limit + 1);
  }));
  // Merge order: sort key in the read's order, then key index.
  const all = perKey.flat().sort((a, b) => (asc ? cmp(a.sk, b.sk) : cmp(b.sk, a.sk)) || a.key - b.key);
  const items = all.slice(0, limit);
  const last = items[items.length - 1];
  return { items, cursor: all.length > limit ? encodeCursor(queryId(q), last.key, last.sk) : null };
}
