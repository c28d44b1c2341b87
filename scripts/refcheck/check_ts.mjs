// Check the TypeScript reference (docs/ref/shard.ts) against the vectors.
// Usage: node check_ts.mjs SHARD_TS VECTORS_JSON
// Node 20 cannot run .ts, so the few type annotations are stripped first;
// shard.ts is written so that this is a purely mechanical edit.
import { readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [tsPath, vectorsPath] = process.argv.slice(2);
const js = readFileSync(tsPath, "utf8")
  .replace(/^export type .*;\n/gm, "")
  .replace(/: (string|number|HashName)\b/g, "");
const out = join(mkdtempSync(join(tmpdir(), "shard-ts-")), "shard.mjs");
writeFileSync(out, js);
const ref = await import(pathToFileURL(out).href);

let passed = 0;
let failed = 0;
const check = (what, got, want) => {
  if (got === want) passed++;
  else {
    failed++;
    console.log(`FAIL ${what}: got ${got}, want ${want}`);
  }
};
for (const v of JSON.parse(readFileSync(vectorsPath, "utf8"))) {
  for (const name of ["fnv1a32", "murmur3_32", "java31"]) {
    check(`${name}(${JSON.stringify(v.input)})`, ref.hash(name, v.input), v[name]);
    for (const [n, want] of Object.entries(v.shard[name])) {
      check(`shard(${name}, ${JSON.stringify(v.input)}, ${n})`, ref.shard(name, v.input, Number(n)), want);
    }
  }
}
console.log(`typescript: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
