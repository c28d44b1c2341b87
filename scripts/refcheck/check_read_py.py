"""Check the Python read-path reference (docs/ref/read_path.py) against the vectors.

Usage: python3 check_read_py.py READ_PATH_PY VECTORS_JSON
The data set is served by an in-memory Query with DynamoDB's semantics
(key condition, order, Limit, ExclusiveStartKey, LastEvaluatedKey).
"""

import importlib.util
import json
import sys


def mem_query(data):
    def query(req):
        part = data.get(req["key"], {})
        cond = req["condition"]
        op, vals = cond["op"], cond["values"]
        tests = {
            None: lambda sk: True,
            "begins_with": lambda sk: sk.startswith(vals[0]),
            "between": lambda sk: vals[0] <= sk <= vals[1],
            ">": lambda sk: sk > vals[0],
            ">=": lambda sk: sk >= vals[0],
            "<": lambda sk: sk < vals[0],
            "<=": lambda sk: sk <= vals[0],
        }
        asc = req["ascending"]
        start = req["exclusive_start_key"]
        sks = sorted(part, reverse=not asc)
        sks = [sk for sk in sks if tests[op](sk) and (start is None or (sk > start if asc else sk < start))]
        items = [(sk, part[sk]) for sk in sks[: req["limit"]]]
        lek = items[-1][0] if len(sks) > req["limit"] else None
        return items, lek

    return query


def main() -> int:
    ref_path, vectors_path = sys.argv[1:3]
    spec = importlib.util.spec_from_file_location("read_path", ref_path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    with open(vectors_path, encoding="utf-8") as f:
        v = json.load(f)
    query = mem_query(v["data"])
    passed = failed = 0

    def check(what, got, want):
        nonlocal passed, failed
        if got == want:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {what}: got {got!r}, want {want!r}")

    def q_of(case):
        return {k: v[k] for k in ("table", "partition_key", "sort_key", "rule", "keys")} | {
            "condition": case["condition"], "order": case["order"], "limit": case["limit"]}

    for n, case in enumerate(v["cases"]):
        q = q_of(case)
        check(f"case {n} query id", ref.query_id(q), case["query_id"])
        cursor = None
        for p, want in enumerate(case["pages"]):
            page = ref.read_page(q, cursor, query)
            got_items = [[k, sk, item] for k, sk, item in page["items"]]
            check(f"case {n} page {p} items", got_items, want["items"])
            check(f"case {n} page {p} cursor", page["cursor"], want["cursor"])
            cursor = want["cursor"]
    for b in v["bad_cursors"]:
        q = q_of(v["cases"][b["case"]])
        try:
            ref.decode_cursor(b["cursor"], q)
            got = "accepted"
        except ref.CursorError as e:
            got = e.kind
        check(f"bad cursor {b['cursor']!r}", got, b["error"])
    print(f"python: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
