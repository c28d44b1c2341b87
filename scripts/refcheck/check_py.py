"""Check the Python reference (docs/ref/shard.py) against the vectors.

Usage: python3 check_py.py SHARD_PY VECTORS_JSON
"""

import importlib.util
import json
import sys


def main() -> int:
    ref_path, vectors_path = sys.argv[1:3]
    spec = importlib.util.spec_from_file_location("shard", ref_path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)

    passed = failed = 0

    def check(what, got, want):
        nonlocal passed, failed
        if got == want:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {what}: got {got}, want {want}")

    with open(vectors_path, encoding="utf-8") as f:
        vectors = json.load(f)
    for v in vectors:
        for name in ("fnv1a32", "murmur3_32", "java31"):
            check(f"{name}({v['input']!r})", ref.HASHES[name](v["input"]), v[name])
            for n, want in v["shard"][name].items():
                check(f"shard({name}, {v['input']!r}, {n})", ref.shard(name, v["input"], int(n)), want)
    print(f"python: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
