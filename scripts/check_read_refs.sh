#!/usr/bin/env bash
# Run the read-path reference implementations in docs/ref/ (TypeScript via
# node, Python, Java) against vectors/read-path-vectors.json (the pages and
# cursors the Rust read path gives, src/core/query/tests/vectors.rs), and
# check that docs/read-path.md points at each of them.
#
# Usage (from anywhere): scripts/check_read_refs.sh (check_hash_refs.sh runs it)
# Needs: node (>= 18), python3, a JDK (>= 11). Optional: tsc, to type-check readPath.ts.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
vectors="$root/vectors/read-path-vectors.json"
ref="$root/docs/ref"
check="$root/scripts/refcheck"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== docs/read-path.md names docs/ref/{readPath.ts,read_path.py,ReadPath.java}"
for f in readPath.ts read_path.py ReadPath.java; do
    grep -q "ref/$f" "$root/docs/read-path.md" || { echo "docs/read-path.md does not name docs/ref/$f"; exit 1; }
done

echo "== read path: TypeScript (node $(node --version))"
if command -v tsc >/dev/null 2>&1; then
    tsc --noEmit --strict --target es2020 --lib es2020,dom "$ref/readPath.ts"
    echo "tsc: type-check ok"
else
    echo "tsc not found: skipping the type-check"
fi
node "$check/check_read_ts.mjs" "$ref/readPath.ts" "$vectors"

echo "== read path: Python ($(python3 --version))"
python3 "$check/check_read_py.py" "$ref/read_path.py" "$vectors"

echo "== read path: Java ($(java -version 2>&1 | head -n 1))"
python3 - "$vectors" > "$work/read-vectors.tsv" <<'PY'
import json, sys
v = json.load(open(sys.argv[1], encoding="utf-8"))
h = lambda s: s.encode("utf-8").hex()
print("\t".join(["T", h(v["table"]), h(v["partition_key"]), h(v["sort_key"]), h(v["rule"])]))
for k in v["keys"]:
    print(f"K\t{h(k)}")
for pk, part in v["data"].items():
    for sk, val in part.items():
        print(f"D\t{h(pk)}\t{h(sk)}\t{h(val)}")
for n, c in enumerate(v["cases"]):
    cond = c["condition"]
    print("\t".join(["C", str(n), cond["kind"], h(cond.get("a", "")), h(cond.get("b", "")),
                     c["order"], str(c["limit"]), c["query_id"]]))
    for p, page in enumerate(c["pages"]):
        items = ",".join(f"{k}:{h(sk)}:{h(val)}" for k, sk, val in page["items"])
        print("\t".join(["P", str(n), str(p), page["cursor"] or "-", items]))
for b in v["bad_cursors"]:
    print("\t".join(["B", str(b["case"]), h(b["cursor"]), b["error"]]))
PY
javac -d "$work/classes" "$ref/ReadPath.java" "$check/ReadPathCheck.java"
java -cp "$work/classes" ReadPathCheck < "$work/read-vectors.tsv"

echo "the read-path reference implementations agree with the vectors"
