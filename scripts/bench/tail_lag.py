"""Writer and prober for scripts/bench/tail-lag: black-box lag from a source
write to the target write a stream consumer makes of it.

    python tail_lag.py run SOURCE TARGET --out FILE.json [--rates 25,50,100] [--seconds 50]
        [--seed-items 2000] [--sample-every 5] [--update-share 0.5] [--writer-threads 4]
        [--poll-ms 5] [--drain 20] [--settle 2] [--warmup 5]
    python tail_lag.py report LABEL=FILE.json [LABEL=FILE.json]   # the first is compared to the second
    python tail_lag.py caught-up FILE.json     # exit 0 if the run's last write was seen in the target
    python tail_lag.py prime SOURCE            # one write, read back from the stream (before a consumer starts)
    python tail_lag.py stream-clock SOURCE     # the stream's ApproximateCreationDateTime vs written_at_ns

`run`: a writer process issues writes on SOURCE at a steady rate R for each
rate in turn (open loop: write i is due at t0 + i/R, up to --writer-threads in
flight, a late write goes at once; never two writes to one item at once), a mix
of PutItem of new order items (gen_items.py, after the SEED seeded ones) and
UpdateItem of an existing item (seeded or written earlier, chosen uniformly);
every write carries `version` (per item, counting up) and `written_at_ns`
(time.time_ns() just before the request). Every Nth write is a sample: the
prober (this process) polls TARGET for the sample's new key (reference_copier's
key change) with consistent reads until the item shows that version or a later
one: every --poll-ms while any sample is outstanding, one BatchGetItem
(ConsistentRead) for the oldest 10 outstanding keys, and at once for the next
10 while a whole 10 resolves; all outstanding keys every 50 polls, in case a
consumer applies out of order. (One GetItem per sample every 5 ms would be
thousands of reads a second once lag grows, loading the local server both
sides write to.) lag = time of the response that first showed it -
written_at_ns; its resolution is the poll period plus one round trip. After
each rate the prober waits (at most --drain seconds) for the outstanding
samples, then the next rate starts. Writes the samples to --out and prints one
summary line per rate.

`report`: per rate, lag p50/p90/p99/max (ms), samples seen, writer and apply
rates and whether the consumer kept up; with two files, the ratios side by side.

Endpoint and credentials from AWS_ENDPOINT_URL / AWS_* variables.
"""

import argparse
import itertools
import json
import multiprocessing as mp
import os
import queue
import random
import sys
import threading
import time

import boto3
from boto3.dynamodb.types import TypeSerializer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_items  # noqa: E402
from reference_copier import rekey  # noqa: E402

STEADY_SKIP_S = 5.0  # the apply rate is measured on samples written after this far into a rate


def client():
    return boto3.session.Session().client("dynamodb", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))


def writer(source, seed_items, sample_every, update_share, threads, commands, out):
    """Runs in its own process (no GIL shared with the prober). Open loop: write i
    is due at t0 + i/R whatever the latency, with up to `threads` in flight; no
    two writes to one item are in flight at once (so versions land in order)."""
    ser = TypeSerializer()
    keys = [(it["PK"], it["SK"]) for it in gen_items.items(seed_items)]  # what `ddb.py load` wrote
    fresh = itertools.islice(gen_items.items(10**9), seed_items, None)
    version = {}
    rng = random.Random(0x1A6)
    lock = threading.Lock()
    clients = [client() for _ in range(threads)]
    while True:
        cmd = commands.recv()
        if cmd is None:
            return
        step, rate, seconds = cmd
        n = int(round(rate * seconds))
        st = {"next": 0, "inserts": 0, "updates": 0, "max_late": 0.0}
        in_flight = set()
        t0 = time.monotonic()

        def work(c):
            while True:
                with lock:
                    i = st["next"]
                    if i >= n:
                        return
                    st["next"] += 1
                    key = item = None
                    if keys and rng.random() < update_share:
                        for _ in range(10):  # an item with no write in flight
                            key = keys[rng.randrange(len(keys))]
                            if key not in in_flight:
                                break
                        else:
                            key = None
                    if key is None:
                        item = next(fresh)
                        key = (item["PK"], item["SK"])
                        keys.append(key)
                    v = version.get(key, 0) + 1
                    version[key] = v
                    in_flight.add(key)
                late = time.monotonic() - (t0 + i / rate)
                if late < 0:
                    time.sleep(-late)
                written = time.time_ns()
                if item is None:
                    c.update_item(
                        TableName=source,
                        Key={"PK": {"S": key[0]}, "SK": {"S": key[1]}},
                        UpdateExpression="SET version = :v, written_at_ns = :t, #st = :s",
                        ExpressionAttributeNames={"#st": "status"},
                        ExpressionAttributeValues={
                            ":v": {"N": str(v)},
                            ":t": {"N": str(written)},
                            ":s": {"S": gen_items.STATUSES[v % len(gen_items.STATUSES)]},
                        },
                    )
                else:
                    item["version"] = v
                    item["written_at_ns"] = written
                    c.put_item(TableName=source, Item={k: ser.serialize(x) for k, x in item.items()})
                acked = time.time_ns()
                with lock:
                    in_flight.discard(key)
                    st["updates" if item is None else "inserts"] += 1
                    st["max_late"] = max(st["max_late"], late)
                if i % sample_every == 0 or i == n - 1:  # the last too: all applied when it is
                    out.put(("sample", step, i, key, v, written, acked))

        ts = [threading.Thread(target=work, args=(c,)) for c in clients]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        el = time.monotonic() - t0
        out.put(("end", step, {"writes": n, "inserts": st["inserts"], "updates": st["updates"],
                               "write_seconds": round(el, 3), "max_late_ms": round(st["max_late"] * 1000, 1)}))


def target_key(key):
    new = rekey({"PK": key[0], "SK": key[1]})
    return new["PK"], new["SK"]


HEAD = 10          # oldest outstanding keys polled every tick
SWEEP_TICKS = 50   # every this many ticks, all outstanding keys (in case of out-of-order application)


def poll(c, table, outstanding, everything):
    """Consistent BatchGetItem of the oldest HEAD outstanding keys (all of them,
    100 a request, if `everything`); resolves the samples whose version (or a
    later one) shows. While a whole head resolves, polls the next at once.
    Returns the number of requests."""
    requests = 0
    while outstanding:
        keys = list(outstanding)  # insertion order: oldest first
        if not everything:
            keys = keys[:HEAD]
        resolved = 0
        for k in range(0, len(keys), 100):
            r = c.batch_get_item(RequestItems={table: {
                "Keys": [{"PK": {"S": pk}, "SK": {"S": sk}} for pk, sk in keys[k:k + 100]],
                "ConsistentRead": True,
                "ProjectionExpression": "PK, SK, version",
            }})
            seen = time.time_ns()
            requests += 1
            for item in r["Responses"].get(table, []):
                tk = (item["PK"]["S"], item["SK"]["S"])
                got = int(item["version"]["N"]) if "version" in item else 0
                waiting = []
                for v, s in outstanding.get(tk, []):
                    if got >= v:
                        s[3] = seen
                    else:
                        waiting.append((v, s))
                if waiting:
                    outstanding[tk] = waiting
                elif tk in outstanding:
                    del outstanding[tk]
                    resolved += 1
        if everything or resolved < len(keys):
            break
    return requests


def run(a):
    rates = [float(r) for r in a.rates.split(",")]
    out_q = mp.Queue()
    cmd_here, cmd_there = mp.Pipe()
    w = mp.Process(target=writer, args=(a.source, a.seed_items, a.sample_every, a.update_share, a.writer_threads, cmd_there, out_q))
    w.start()
    c = client()
    tick = a.poll_ms / 1000.0
    steps = []
    warmup = None
    polls = ticks = 0
    probing = 0.0   # seconds spent in poll()
    try:
        plan = [("warm-up", rates[0], a.warmup)] if a.warmup > 0 else []
        plan += [(k, r, a.seconds) for k, r in enumerate(rates)]
        for step, rate, seconds in plan:
            cmd_here.send((step, rate, seconds))
            samples = []                # [idx, written_ns, acked_ns, seen_ns or None]
            outstanding = {}            # target key -> [(version, sample)]
            ended, deadline = None, None
            while True:
                started = time.monotonic()
                while True:
                    try:
                        m = out_q.get_nowait()
                    except queue.Empty:
                        break
                    if m[0] == "sample":
                        _, _, idx, key, v, written, acked = m
                        s = [idx, written, acked, None]
                        samples.append(s)
                        outstanding.setdefault(target_key(key), []).append((v, s))
                    else:
                        ended = m[2]
                        deadline = time.monotonic() + (a.drain if step != "warm-up" else max(a.drain, 60))
                if outstanding:
                    ticks += 1
                    t_poll = time.monotonic()
                    polls += poll(c, a.target, outstanding, ticks % SWEEP_TICKS == 0)
                    probing += time.monotonic() - t_poll
                if ended is not None and (not outstanding or time.monotonic() > deadline):
                    break
                if ended is None and not w.is_alive():
                    sys.exit("tail_lag.py: the writer process died")
                rest = tick - (time.monotonic() - started)
                if rest > 0:
                    time.sleep(rest)
            samples.sort()
            rec = {"rate": rate, "seconds": seconds, **ended, "load1": os.getloadavg()[0], "samples": samples}
            if step == "warm-up":
                if not any(x[3] for x in samples):
                    sys.exit("tail_lag.py: the consumer applied none of the warm-up writes")
                warmup = rec
                w_ = summarize(rec)
                print(f"  warm-up (not counted): {w_['rate']:g} w/s for {seconds:g} s, {w_['seen']}/{w_['samples']} "
                      f"samples seen, lag ms p50 {ms(w_['p50'])} max {ms(w_['max'])}", flush=True)
            else:
                steps.append(rec)
                print("  " + line(summarize(rec)), flush=True)
            time.sleep(a.settle)
    finally:
        cmd_here.send(None)
        w.join(timeout=10)
    with open(a.out, "w") as f:
        json.dump({"label": a.label, "sample_every": a.sample_every, "poll_ms": a.poll_ms,
                   "seed_items": a.seed_items, "update_share": a.update_share, "probe_requests": polls,
                   "probe_rounds": ticks, "probe_seconds": round(probing, 3),
                   "warmup": warmup, "steps": steps}, f)


def pct(sorted_lags, q):
    """Nearest rank; None stands for a sample never seen (infinitely late)."""
    if not sorted_lags:
        return None
    return sorted_lags[min(len(sorted_lags) - 1, max(0, int(-(-q * len(sorted_lags) // 1)) - 1))]


def lags_ms(samples):
    return [(s[3] - s[1]) / 1e6 if s[3] is not None else float("inf") for s in samples]


def summarize(rec):
    samples = rec["samples"]
    lags = sorted(lags_ms(samples))
    third = max(1, len(samples) // 3)
    first, last = sorted(lags_ms(samples[:third])), sorted(lags_ms(samples[-third:]))
    seen = [s for s in samples if s[3] is not None]
    t0 = min((s[1] for s in samples), default=0)
    steady = [s for s in seen if s[1] - t0 >= STEADY_SKIP_S * 1e9]
    apply = None
    if len(steady) >= 2:
        a, z = min(steady, key=lambda s: s[3]), max(steady, key=lambda s: s[3])
        if z[3] > a[3]:
            apply = (z[0] - a[0]) / ((z[3] - a[3]) / 1e9)
    p50_first, p50_last = pct(first, 0.5), pct(last, 0.5)
    # Kept up: every sample seen, lag not growing (p50 of the last third of the
    # samples at most 10 % + 100 ms over the first third's), and applying at 97 %
    # of the rate written or more.
    write_rate = rec["writes"] / rec["write_seconds"]
    kept_up = (bool(samples) and len(seen) == len(samples) and p50_last <= 1.1 * p50_first + 100
               and apply is not None and apply >= 0.97 * write_rate)
    return {
        "rate": rec["rate"], "writes": rec["writes"], "write_rate": write_rate,
        "max_late_ms": rec["max_late_ms"], "samples": len(samples), "seen": len(seen),
        "p50": pct(lags, 0.5), "p90": pct(lags, 0.9), "p99": pct(lags, 0.99), "max": lags[-1] if lags else None,
        "apply_rate": apply, "p50_first": p50_first, "p50_last": p50_last, "kept_up": kept_up,
        "load1": rec.get("load1"),
    }


def ms(x):
    return "-" if x is None else ">drain" if x == float("inf") else f"{x:.0f}"


def line(s):
    return (f"{s['rate']:g} w/s: {s['writes']} writes at {s['write_rate']:.1f} w/s (writer at most "
            f"{s['max_late_ms']:.0f} ms late); {s['seen']}/{s['samples']} samples seen; lag ms p50 {ms(s['p50'])} "
            f"p90 {ms(s['p90'])} p99 {ms(s['p99'])} max {ms(s['max'])}; apply "
            f"{'-' if s['apply_rate'] is None else format(s['apply_rate'], '.1f')} w/s; p50 first/last third "
            f"{ms(s['p50_first'])}/{ms(s['p50_last'])} ms: {'kept up' if s['kept_up'] else 'FELL BEHIND'}; "
            f"load average {'-' if s['load1'] is None else format(s['load1'], '.1f')}")


def report(args):
    sides = []
    for arg in args:
        label, _, path = arg.partition("=")
        d = json.load(open(path))
        sides.append((label, d, [summarize(r) for r in d["steps"]]))
    print("lag = first consistent read of the target showing the write - written_at_ns in the item, ms "
          f"(1 write in {sides[0][1]['sample_every']} sampled, polled every {sides[0][1]['poll_ms']} ms)")
    print(f"{'':10} {'rate w/s':>8} {'written w/s':>11} {'samples':>9} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6} "
          f"{'apply w/s':>9} {'p50 1st/last third':>18} {'kept up':>7} {'load':>5}")
    for label, _, summ in sides:
        for s in summ:
            print(f"{label:10} {s['rate']:8g} {s['write_rate']:11.1f} {s['seen']:>4}/{s['samples']:<4} {ms(s['p50']):>6} "
                  f"{ms(s['p90']):>6} {ms(s['p99']):>6} {ms(s['max']):>6} "
                  f"{'-' if s['apply_rate'] is None else format(s['apply_rate'], '.1f'):>9} "
                  f"{ms(s['p50_first']) + '/' + ms(s['p50_last']):>18} {'yes' if s['kept_up'] else 'NO':>7} "
                  f"{'-' if s['load1'] is None else format(s['load1'], '.1f'):>5}")
    print("written w/s: what the writer achieved (below the rate: the local server or the machine could not take it); "
          "apply w/s: writes applied a second from the samples' order and times, after the first "
          f"{STEADY_SKIP_S:.0f} s; kept up: all samples seen, p50 of the last third <= 1.1 x the first's "
          "+ 100 ms, and apply >= 0.97 x written; load: the machine's 1-minute load average at the end of the rate "
          "(this run's own processes included; the higher, the more other work competed for the cores)")
    for label, d, _ in sides:
        if d.get("probe_rounds"):
            print(f"probe ({label}): {d['probe_rounds']} rounds, {d['probe_requests']} BatchGetItem requests, "
                  f"{d['probe_seconds'] / d['probe_rounds'] * 1000:.1f} ms a round on average (the poll period "
                  f"is the larger of that and {d['poll_ms']:g} ms)")
    if len(sides) == 2:
        (la, _, sa), (lb, _, sb) = sides
        print(f"ratio {la}/{lb} (lower is better for {la}):")
        print(f"{'rate w/s':>8} {'p50 ' + la:>10} {'p50 ' + lb:>12} {'ratio':>6} {'p99 ' + la:>10} {'p99 ' + lb:>12} {'ratio':>6}")

        def ratio(x, y):
            if x is None or y is None or x == float("inf") or y == float("inf") or y == 0:
                return "-"
            return f"{x / y:.2f}"

        for x, y in zip(sa, sb):
            print(f"{x['rate']:8g} {ms(x['p50']):>10} {ms(y['p50']):>12} {ratio(x['p50'], y['p50']):>6} "
                  f"{ms(x['p99']):>10} {ms(y['p99']):>12} {ratio(x['p99'], y['p99']):>6}")


def prime(source):
    """One write on the fresh stream, read back from it, before a consumer starts:
    The local server has answered GetRecords on a shard's first record with
    TrimmedDataAccessException under load, so the consumers start on a shard that
    already has one (an order item the consumers copy like any other)."""
    c = client()
    streams = boto3.session.Session().client("dynamodbstreams", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
    c.put_item(TableName=source, Item={"PK": {"S": "TENANT#warm-up#DAY#2026-07-05"}, "SK": {"S": "ORDER#warm-up"}})
    arn = c.describe_table(TableName=source)["Table"]["LatestStreamArn"]
    deadline = time.monotonic() + 60
    while True:
        try:
            shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
            it = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
            if streams.get_records(ShardIterator=it["ShardIterator"], Limit=1)["Records"]:
                return
        except streams.exceptions.TrimmedDataAccessException as e:
            print(f"prime: {e} (retrying)", file=sys.stderr)
        if time.monotonic() > deadline:
            sys.exit("prime: the stream did not show the write within 60 s")
        time.sleep(0.2)


def stream_clock(source):
    """Why the time is embedded in the item: the stream's own timestamps, next to it."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    streams = boto3.session.Session().client("dynamodbstreams", endpoint_url=endpoint)
    arn = client().describe_table(TableName=source)["Table"]["LatestStreamArn"]
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    it = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    recs = streams.get_records(ShardIterator=it, Limit=1000)["Records"]
    pairs = [(r["dynamodb"]["ApproximateCreationDateTime"].timestamp(), int(r["dynamodb"]["NewImage"]["written_at_ns"]["N"]) / 1e9)
             for r in recs if "written_at_ns" in r["dynamodb"].get("NewImage", {})]
    if not pairs:
        print("stream-clock: no records with written_at_ns")
        return
    c, w = pairs[0]
    diffs = [w - c for c, w in pairs]
    print(f"stream-clock: first record ApproximateCreationDateTime {time.strftime('%H:%M:%S', time.gmtime(c))}.{c % 1 * 1000:03.0f}, "
          f"written_at {time.strftime('%H:%M:%S', time.gmtime(w))}.{w % 1 * 1000:03.0f}; over {len(pairs)} records "
          f"written_at - ApproximateCreationDateTime = {min(diffs):.1f}..{max(diffs):.1f} s, "
          f"{len({c for c, _ in pairs})} distinct ApproximateCreationDateTime values")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        report(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "caught-up":
        # Exit 0 if the consumer had applied the last write of the run (the last sample) when it was stopped.
        last = json.load(open(sys.argv[2]))["steps"][-1]["samples"]
        sys.exit(0 if last and last[-1][3] is not None else 1)
    if len(sys.argv) > 1 and sys.argv[1] == "prime":
        prime(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "stream-clock":
        stream_clock(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["run"])
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--rates", default="25,50,100", help="writes/s, comma-separated, one after the other")
    ap.add_argument("--seconds", type=float, default=50.0, help="per rate")
    ap.add_argument("--seed-items", type=int, default=2000, help="items `ddb.py load` put in SOURCE")
    ap.add_argument("--sample-every", type=int, default=5)
    ap.add_argument("--update-share", type=float, default=0.5)
    ap.add_argument("--writer-threads", type=int, default=4, help="writes in flight at most")
    ap.add_argument("--poll-ms", type=float, default=5.0)
    ap.add_argument("--drain", type=float, default=20.0, help="longest wait for outstanding samples after a rate, s")
    ap.add_argument("--settle", type=float, default=2.0, help="pause between rates, s")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="s at the first rate before the measured ones, not counted (the local server and the consumer warm up)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
