"""Figures of one rekey backfill behind a limit, for scripts/bench/throttle.

    throttle_figures.py WORK LABEL LIMIT IDEAL_ITEMS

LIMIT is the stand-in's limit in WCU/s (per table or per key); IDEAL_ITEMS the
items that limit has to pass (all of them for a table limit, the hottest
key's for a per-key one; `-` for a tail: the writes the stand-in acknowledged). Reads, in WORK:
  LABEL.out                  rekey's --json report (a backfill's, or a tail's)
  LABEL.elapsed              a tail's seconds (its report has none)
  LABEL.before.json          the stand-in's GET /stats before the run
  LABEL.after.json           ... and after (per-second windows since it started)
  state-LABEL/progress.jsonl rekey's one sample a second
Prints, per 10-second window of the run, items written/s, throttled item
attempts, throttled ÷ written, and the rates rekey held; then the run's
throttled ÷ written after its first 10 s and ideal ÷ elapsed time.
Prints figures, asserts nothing.
"""

import json
import statistics
import sys

WINDOW = 10


def load_samples(path):
    samples = []
    try:
        for line in open(path):
            try:
                samples.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return samples


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def main():
    work, label, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
    before = json.load(open(f"{work}/{label}.before.json"))
    after = json.load(open(f"{work}/{label}.after.json"))
    try:
        report = json.load(open(f"{work}/{label}.out"))
    except (OSError, ValueError):
        print("  no report: the run failed (see above)")
        return
    samples = load_samples(f"{work}/state-{label}/progress.jsonl")
    if "totals" in report:
        written = report["totals"]["written"]
        elapsed = report["elapsed_seconds"]
        wcu = report["consumed_wcu"]
    else:
        # A tail: the target writes that arrived (its report counts records
        # applied, before a response's writes per key are reduced to the last),
        # timed by the script; 500-byte puts and deletes, 1 WCU each.
        written = after["written_items"] - before["written_items"]
        elapsed = float(open(f"{work}/{label}.elapsed").read())
        wcu = float(written)
    per_item = wcu / written if written else 1.0
    ideal_items = float(written if sys.argv[4] == "-" else sys.argv[4])

    # The stand-in counts per second since it started; the run began in second `start`.
    start = int(before["uptime_seconds"])
    secs = {w["second"] - start: w for w in after["windows"] if w["second"] >= start}
    last = max(secs) if secs else 0
    rows = []
    print(f"  {'window':>9} {'written/s':>10} {'throttled':>10} {'thr÷written':>12} "
          f"{'budget WCU/s':>13} {'limited keys':>13} {'key rate median/max':>20}")
    for k in range(0, last // WINDOW + 1):
        lo, hi = k * WINDOW, (k + 1) * WINDOW
        ws = [secs[s] for s in range(lo, hi) if s in secs]
        n_secs = min(hi, last + 1) - lo
        w_items = sum(w["written_items"] for w in ws)
        t_items = sum(w["throttled_items"] for w in ws)
        sm = [s for s in samples if lo <= s.get("t", -1) < hi]
        budget = mean(s.get("write_rate") for s in sm)
        keys = [s["key_rates"] for s in sm if s.get("key_rates")]
        limited = mean(k["limited"] for k in keys) if keys else None
        kmed = mean(k["median"] for k in keys) if keys else None
        kmax = mean(k["max"] for k in keys) if keys else None
        rows.append((k, w_items, t_items))
        ratio = t_items / w_items if w_items else None
        print(f"  {lo:>3}–{hi:<3} s {w_items / max(n_secs, 1):>10,.0f} {t_items:>10,} "
              f"{fmt(ratio, '>12.3f'):>12} {fmt(budget):>13} {fmt(limited, '.1f'):>13} "
              f"{fmt(kmed) + ' / ' + fmt(kmax):>20}")
    w_after = sum(w for k, w, _ in rows if k >= 1)
    t_after = sum(t for k, _, t in rows if k >= 1)
    t_all = sum(t for _, _, t in rows)
    ideal = ideal_items * per_item / limit
    d = lambda f: after[f] - before[f]
    print(f"  run: {written:,} items written in {elapsed:.1f} s ({wcu:,.0f} WCU, {per_item:.2f} per item);"
          f" the stand-in refused {t_all:,} item attempts in {d('throttled_requests'):,} requests"
          f" and answered {d('errors_500') if 'errors_500' in after else '?'} requests HTTP 500")
    bw = after["requests"].get("BatchWriteItem", 0) - before["requests"].get("BatchWriteItem", 0)
    print(f"  BatchWriteItem requests: {bw:,} ({written / bw if bw else float('nan'):.1f} items written per request)")
    print(f"  rekey's throttles: {json.dumps(report.get('throttles'))}")
    print(f"  throttled ÷ written after the first {WINDOW} s: {t_after:,} / {w_after:,} = "
          f"{(t_after / w_after if w_after else float('nan')):.3f}")
    print(f"  ideal {ideal_items:,.0f} items × {per_item:.2f} WCU ÷ {limit:,.0f} WCU/s = {ideal:.1f} s;"
          f" ideal ÷ elapsed = {ideal / elapsed:.3f}")


if __name__ == "__main__":
    main()
