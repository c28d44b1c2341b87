"""Helpers for the benchmark scripts (the local server through boto3).

    ddb.py create TABLE...             PK/SK string keys, on-demand
    ddb.py create --stream TABLE...    the same, with a NEW_AND_OLD_IMAGES stream
    ddb.py stream TABLE                enables a NEW_AND_OLD_IMAGES stream on TABLE (UpdateTable)
    ddb.py load TABLE N [THREADS]      N generated items (gen_items.py), batch_writer per thread
    ddb.py count TABLE                 items in TABLE (Scan, Select=COUNT)
    ddb.py itemcount TABLE             DescribeTable's ItemCount (live in moto, unlike
                                       AWS; a Scan of 1M items locally is slow)
    ddb.py same TABLE_A TABLE_B        whether both tables hold exactly the same items
    ddb.py rekeyed SOURCE TARGET       whether TARGET holds exactly SOURCE's items under the
                                       tenant-day-shard key change (reference_copier.rekey)
    ddb.py windows PROGRESS BUDGET [WINDOW_S]
                                       consumed WCU/s per window from progress.jsonl vs BUDGET

Endpoint and credentials from AWS_ENDPOINT_URL / AWS_* variables.
"""

import json
import os
import sys
import threading
import time

import boto3

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_items  # noqa: E402


def resource():
    return boto3.session.Session().resource("dynamodb", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))


STREAM = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}


def create(tables, stream=False):
    ddb = resource()
    for name in tables:
        t = ddb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
            AttributeDefinitions=[
                {"AttributeName": "PK", "AttributeType": "S"},
                {"AttributeName": "SK", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
            **({"StreamSpecification": STREAM} if stream else {}),
        )
        t.wait_until_exists()


def enable_stream(table):
    client = resource().meta.client
    client.update_table(TableName=table, StreamSpecification=STREAM)
    client.get_waiter("table_exists").wait(TableName=table)


def load(table, n, threads):
    all_items = list(gen_items.items(n))
    started = time.monotonic()

    def work(k):
        t = resource().Table(table)
        with t.batch_writer() as bw:
            for it in all_items[k::threads]:
                bw.put_item(Item=it)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    el = time.monotonic() - started
    print(f"loaded {n} items into {table} in {el:.1f} s ({n / el:.0f} items/s)", file=sys.stderr)


def scan_all(table, **kw):
    t = resource().Table(table)
    kw = dict(kw)
    while True:
        page = t.scan(**kw)
        yield page
        if "LastEvaluatedKey" not in page:
            return
        kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def count(table):
    return sum(p["Count"] for p in scan_all(table, Select="COUNT"))


def same(a, b):
    def items(t):
        return {(i["PK"], i["SK"]): i for p in scan_all(t) for i in p["Items"]}

    ia, ib = items(a), items(b)
    diff = sum(1 for k in ia.keys() | ib.keys() if ia.get(k) != ib.get(k))
    return len(ia), len(ib), diff


def rekeyed(source, target):
    from reference_copier import rekey

    def items(t):
        return {(i["PK"], i["SK"]): i for p in scan_all(t) for i in p["Items"]}

    expected = {}
    for it in items(source).values():
        new = rekey(it)
        if new is not None:
            expected[(new["PK"], new["SK"])] = new
    got = items(target)
    diff = sum(1 for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    return len(expected), len(got), diff


def windows(path, budget, window):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if len(rows) < 2:
        print(f"only {len(rows)} samples in {path}")
        return
    # Samples are cumulative: rate over a window = ΔWCU / Δt between samples.
    print(f"{'window (s)':>14} {'WCU':>9} {'WCU/s':>8} {'budget':>7} {'ratio':>6}")
    prev = {"t": 0.0, "consumed_wcu": 0.0}
    edge = window
    for r in rows:
        if r["t"] >= edge or r is rows[-1]:
            wcu = r["consumed_wcu"] - prev["consumed_wcu"]
            dt = r["t"] - prev["t"]
            if dt > 0:
                rate = wcu / dt
                tag = " (partial)" if r is rows[-1] and r["t"] < edge else ""
                print(f"{prev['t']:6.0f}-{r['t']:<6.0f} {wcu:9.0f} {rate:8.1f} {budget:7.0f} {rate / budget:6.3f}{tag}")
            prev = r
            edge = r["t"] + window
    last = rows[-1]
    print(f"whole run (to last sample, t={last['t']:.0f} s): {last['consumed_wcu']:.0f} WCU, "
          f"{last['consumed_wcu'] / last['t']:.1f} WCU/s, ratio {last['consumed_wcu'] / last['t'] / budget:.3f}")
    # The first second includes the token bucket's initial burst; show steady state too.
    steady = [r for r in rows if r["t"] >= 5]
    if len(steady) >= 2:
        a, z = steady[0], steady[-1]
        rate = (z["consumed_wcu"] - a["consumed_wcu"]) / (z["t"] - a["t"])
        print(f"steady state (t={a['t']:.0f}..{z['t']:.0f} s): {rate:.1f} WCU/s, ratio {rate / budget:.3f}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "create":
        create([a for a in args if a != "--stream"], stream="--stream" in args)
    elif cmd == "stream":
        enable_stream(args[0])
    elif cmd == "load":
        load(args[0], int(args[1]), int(args[2]) if len(args) > 2 else 4)
    elif cmd == "count":
        print(count(args[0]))
    elif cmd == "itemcount":
        print(resource().meta.client.describe_table(TableName=args[0])["Table"]["ItemCount"])
    elif cmd == "same":
        na, nb, diff = same(args[0], args[1])
        print(f"{args[0]}: {na} items, {args[1]}: {nb} items, differing keys: {diff}")
    elif cmd == "rekeyed":
        ne, ng, diff = rekeyed(args[0], args[1])
        verdict = "yes" if diff == 0 else "NO"
        print(f"{args[1]} == key change of {args[0]}: {verdict} ({ne} expected, {ng} in {args[1]}, differing keys: {diff})")
        if diff:
            sys.exit(1)
    elif cmd == "windows":
        windows(args[0], float(args[1]), float(args[2]) if len(args) > 2 else 30.0)
    else:
        sys.exit(f"unknown command {cmd}")
