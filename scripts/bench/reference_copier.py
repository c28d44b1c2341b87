"""Reference copier: the re-keying copy written the way AWS's documentation
shows it, to compare rekey with.

Parallel Scan (Segment/TotalSegments, one thread per segment, each thread with
its own boto3 session, as the boto3 docs advise) and `Table.batch_writer()` per
thread, applying the same key change as plans/tenant-day-shard.toml:

    PK  TENANT#{tenant}#DAY#{day}  ->  TENANT#{tenant}#DAY#{day}#SHARD#{fnv1a32(order_id) % 16:02}
    SK  ORDER#{order_id}           ->  unchanged
    src_PK, src_SK                 <-  the source key (the plan's source_key_prefix)

No rate limit, no checkpoints, no per-key pacing: the simplest thing that works.

    python reference_copier.py SOURCE TARGET [--segments 4]

Prints one JSON line: {"items", "seconds", "items_per_second"}.
"""

import argparse
import json
import os
import re
import sys
import threading
import time

import boto3

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs", "ref"))
from shard import fnv1a32  # noqa: E402  (docs/ref/shard.py, the documented reference)

PK_RE = re.compile(r"^TENANT#([^#]+)#DAY#([^#]+)$")
SK_RE = re.compile(r"^ORDER#(.+)$")


def rekey(item):
    pk, sk = PK_RE.match(item["PK"]), SK_RE.match(item["SK"])
    if not (pk and sk):
        return None
    out = dict(item)
    out["src_PK"], out["src_SK"] = item["PK"], item["SK"]
    out["PK"] = f"TENANT#{pk.group(1)}#DAY#{pk.group(2)}#SHARD#{fnv1a32(sk.group(1)) % 16:02}"
    return out


def copy_segment(source, target, segment, total, counts):
    session = boto3.session.Session()
    ddb = session.resource("dynamodb", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    src, dst = ddb.Table(source), ddb.Table(target)
    kwargs = {"Segment": segment, "TotalSegments": total}
    n = 0
    with dst.batch_writer() as batch:
        while True:
            page = src.scan(**kwargs)
            for item in page["Items"]:
                new = rekey(item)
                if new is not None:
                    batch.put_item(Item=new)
                    n += 1
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    counts[segment] = n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("--segments", type=int, default=4)
    a = ap.parse_args()
    counts = [0] * a.segments
    started = time.monotonic()
    threads = [
        threading.Thread(target=copy_segment, args=(a.source, a.target, s, a.segments, counts))
        for s in range(a.segments)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    el = time.monotonic() - started
    n = sum(counts)
    print(json.dumps({"items": n, "seconds": round(el, 3), "items_per_second": round(n / el, 1)}))


if __name__ == "__main__":
    main()
