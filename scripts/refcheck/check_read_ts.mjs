// Check the TypeScript read-path reference (docs/ref/readPath.ts) against the vectors.
// Usage: node check_read_ts.mjs READ_PATH_TS VECTORS_JSON
// Node 20 cannot run .ts, so the type declarations (one line each) and the
// annotations are stripped first; readPath.ts is written so that this is a
// purely mechanical edit. The data set is served by an in-memory Query with
// DynamoDB's semantics (key condition, order, Limit, ExclusiveStartKey).
import { readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [tsPath, vectorsPath] = process.argv.slice(2);
const js = readFileSync(tsPath, "utf8")
  .replace(/^export type .*;\n/gm, "")
  .replace(/: (?:Promise<Page>|string \| null|string|number|boolean|unknown|any|Query|Range|Condition|KeyCondition|PageItem\[\]|Position|QueryFn)(?=[,)=; ])/g, "");
const out = join(mkdtempSync(join(tmpdir(), "read-path-ts-")), "readPath.mjs");
writeFileSync(out, js);
const ref = await import(pathToFileURL(out).href);

// Code point order (= UTF-8 byte order), as DynamoDB compares strings.
const cmp = (a, b) => {
  const x = Array.from(a, (c) => c.codePointAt(0));
  const y = Array.from(b, (c) => c.codePointAt(0));
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
};
const v = JSON.parse(readFileSync(vectorsPath, "utf8"));
const query = async ({ key, condition, ascending, exclusiveStartKey, limit }) => {
  const part = v.data[key] ?? {};
  const [a, b] = condition.values;
  const ok = {
    null: () => true,
    begins_with: (sk) => sk.startsWith(a),
    between: (sk) => cmp(sk, a) >= 0 && cmp(sk, b) <= 0,
    ">": (sk) => cmp(sk, a) > 0,
    ">=": (sk) => cmp(sk, a) >= 0,
    "<": (sk) => cmp(sk, a) < 0,
    "<=": (sk) => cmp(sk, a) <= 0,
  }[String(condition.op)];
  const after = (sk) => exclusiveStartKey === null || (ascending ? cmp(sk, exclusiveStartKey) > 0 : cmp(sk, exclusiveStartKey) < 0);
  const sks = Object.keys(part).sort((p, q) => (ascending ? cmp(p, q) : cmp(q, p))).filter((sk) => ok(sk) && after(sk));
  const items = sks.slice(0, limit).map((sk) => [sk, part[sk]]);
  return { items, lastEvaluatedKey: sks.length > limit ? items[items.length - 1][0] : null };
};

let passed = 0;
let failed = 0;
const check = (what, got, want) => {
  const [g, w] = [JSON.stringify(got), JSON.stringify(want)];
  if (g === w) passed++;
  else {
    failed++;
    console.log(`FAIL ${what}: got ${g}, want ${w}`);
  }
};
const qOf = (c) => ({ table: v.table, partition_key: v.partition_key, sort_key: v.sort_key, rule: v.rule, keys: v.keys, condition: c.condition, order: c.order, limit: c.limit });
for (const [n, c] of v.cases.entries()) {
  const q = qOf(c);
  check(`case ${n} query id`, ref.queryId(q), c.query_id);
  let cursor = null;
  for (const [p, want] of c.pages.entries()) {
    const page = await ref.readPage(q, cursor, query);
    check(`case ${n} page ${p} items`, page.items.map((e) => [e.key, e.sk, e.item]), want.items);
    check(`case ${n} page ${p} cursor`, page.cursor, want.cursor);
    cursor = want.cursor;
  }
}
for (const b of v.bad_cursors) {
  let got = "accepted";
  try {
    ref.decodeCursor(b.cursor, qOf(v.cases[b.case]));
  } catch (e) {
    got = e instanceof ref.CursorError ? e.kind : `threw ${e}`;
  }
  check(`bad cursor ${JSON.stringify(b.cursor)}`, got, b.error);
}
console.log(`typescript: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
