#!/usr/bin/env bash
# Run the reference implementations in docs/ref/ (TypeScript via node,
# Python, Java) against vectors/hash-vectors.json, and check that
# docs/hashes.md embeds exactly the same code; then the read-path
# references against vectors/read-path-vectors.json (check_read_refs.sh).
#
# Usage (from anywhere): scripts/check_hash_refs.sh
# Needs: node (>= 18), python3, a JDK (>= 11). Optional: tsc, to type-check shard.ts.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
vectors="$root/vectors/hash-vectors.json"
ref="$root/docs/ref"
check="$root/scripts/refcheck"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== docs/hashes.md embeds docs/ref/*"
python3 - "$root/docs/hashes.md" "$ref/shard.ts" "$ref/shard.py" "$ref/Shard.java" <<'PY'
import sys
doc = open(sys.argv[1], encoding="utf-8").read()
stale = [p for p in sys.argv[2:] if open(p, encoding="utf-8").read() not in doc]
for p in stale:
    print(f"docs/hashes.md does not embed the current {p}")
sys.exit(1 if stale else 0)
PY

echo "== TypeScript (node $(node --version))"
if command -v tsc >/dev/null 2>&1; then
    tsc --noEmit --strict --target es2020 --lib es2020,dom "$ref/shard.ts"
    echo "tsc: type-check ok"
else
    echo "tsc not found: skipping the type-check"
fi
node "$check/check_ts.mjs" "$ref/shard.ts" "$vectors"

echo "== Python ($(python3 --version))"
python3 "$check/check_py.py" "$ref/shard.py" "$vectors"

echo "== Java ($(java -version 2>&1 | head -n 1))"
python3 - "$vectors" > "$work/vectors.tsv" <<'PY'
import json, sys
for v in json.load(open(sys.argv[1], encoding="utf-8")):
    hexin = v["input"].encode("utf-8").hex()
    for name in ("fnv1a32", "murmur3_32", "java31"):
        print(f"{name}\t-\t{hexin}\t{v[name]}")
        for n, want in v["shard"][name].items():
            print(f"{name}\t{n}\t{hexin}\t{want}")
PY
javac -d "$work/classes" "$ref/Shard.java" "$check/ShardCheck.java"
java -cp "$work/classes" ShardCheck < "$work/vectors.tsv"

echo "all reference implementations agree with the vectors"

# The read path's references (docs/read-path.md), against their own vectors.
"$root/scripts/check_read_refs.sh"
