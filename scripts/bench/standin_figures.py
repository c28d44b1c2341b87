"""Figures of one rekey run against the stand-in, for scripts/bench/standin.

    standin_figures.py KIND WORK LABEL [IDLE]

KIND is backfill, analyze, verify or tail. Reads, in WORK:
  LABEL.time          `/usr/bin/time -f '%e %U %S %M'` of rekey: wall s, user s, sys s, peak RSS KB
  LABEL.out           rekey's --json report
  LABEL.before.json   the stand-in's GET /stats before the run
  LABEL.after.json    ... and after
  LABEL.load          `uptime` before the run
Prints one figure line per measure, and appends `KIND LABEL <json>` to
WORK/summary.txt. Prints figures, asserts nothing.
"""

import json
import statistics
import sys


def main():
    kind, work, label = sys.argv[1], sys.argv[2], sys.argv[3]
    idle = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    wall, user, system, rss_kb = open(f"{work}/{label}.time").read().split()[-4:]
    wall, user, system, rss_kb = float(wall), float(user), float(system), int(rss_kb)
    before = json.load(open(f"{work}/{label}.before.json"))
    after = json.load(open(f"{work}/{label}.after.json"))
    load = open(f"{work}/{label}.load").read().strip()
    try:
        report = json.load(open(f"{work}/{label}.out"))
    except (OSError, ValueError):
        report = None

    def delta(field):
        return after[field] - before[field]

    s_cpu = delta("cpu_user_seconds") + delta("cpu_system_seconds")
    r_cpu = user + system
    # Per-second windows of this run only (the stand-in counts from its start).
    first = int(before["uptime_seconds"]) + 1
    windows = [w for w in after["windows"] if w["second"] >= first]

    def steady(field):
        """Median of the full 1-s windows between the first and the last busy one."""
        busy = [i for i, w in enumerate(windows) if w[field] > 0]
        if len(busy) < 3:
            return None
        inner = windows[busy[0] + 1 : busy[-1]]
        return statistics.median(w[field] for w in inner) if inner else None

    out = {"load": load, "wall_s": wall, "rekey_cpu_s": r_cpu, "rekey_peak_rss_mib": rss_kb / 1024,
           "standin_cpu_s": s_cpu, "standin_peak_rss_mib": after["max_rss_kb"] / 1024}
    if kind == "backfill":
        written = report["totals"]["written"] if report else delta("written_items")
        elapsed = report["elapsed_seconds"] if report else wall
        items, rate = written, written / elapsed
        st = steady("written_items")
        what = (f"backfill: {written:,} items in {elapsed:.2f} s = {rate:,.0f} items/s"
                + (f" (steady: median {st:,.0f}/s over full seconds)" if st else "")
                + f"; the stand-in acknowledged {delta('written_items'):,} writes,"
                f" {delta('write_units'):,.0f} WCU, {delta('throttled_requests')} throttled requests")
    elif kind == "analyze":
        items = delta("scanned_items")
        rate = items / wall
        what = f"analyze: {items:,} items scanned in {wall:.2f} s (wall) = {rate:,.0f} items/s"
    elif kind == "verify":
        c = report["counts"] if report else {}
        items = c.get("scanned", delta("scanned_items"))
        from datetime import datetime

        def ts(t):
            return datetime.fromisoformat(t.replace("Z", "+00:00"))

        elapsed = (ts(report["finished_at"]) - ts(report["started_at"])).total_seconds() if report else wall
        rate = items / elapsed
        what = (f"verify: {items:,} source items (+ {c.get('target_scanned', 0):,} target items back) in"
                f" {elapsed:.2f} s = {rate:,.0f} source items/s, {(items + c.get('target_scanned', 0)) / elapsed:,.0f}"
                f" items/s both ways; matched {c.get('matched', '?'):,}, missing {c.get('missing', '?')},"
                f" different {c.get('different', '?')}, orphans {c.get('orphans', '?')};"
                f" the stand-in served {delta('scanned_items') + delta('target_scanned_items'):,} scanned"
                f" + {delta('got_items'):,} got")
    elif kind == "tail":
        records = report["records"] if report else delta("stream_records")
        applied = (report["puts"] + report["deletes"]) if report else delta("written_items")
        elapsed = max(wall - idle, 1e-9)
        items, rate = records, records / elapsed
        st = steady("written_items")
        what = (f"tail: {records:,} records ({applied:,} target writes) in {elapsed:.2f} s"
                f" (wall − {idle:g} s idle wait) = {rate:,.0f} records/s"
                + (f" (steady: median {st:,.0f}/s over full seconds)" if st else "")
                + f"; the stand-in served {delta('stream_records'):,} records,"
                f" acknowledged {delta('written_items'):,} writes")
    else:
        raise SystemExit(f"unknown kind {kind}")
    out.update(items=items, rate=rate,
               rekey_us_per_item=r_cpu / max(items, 1) * 1e6,
               standin_us_per_item=s_cpu / max(items, 1) * 1e6)
    print(f"  {what}")
    print(f"  rekey: CPU {out['rekey_us_per_item']:.1f} µs/item (user {user:.2f} s + sys {system:.2f} s),"
          f" peak RSS {out['rekey_peak_rss_mib']:.0f} MiB, wall {wall:.2f} s")
    print(f"  stand-in: CPU {out['standin_us_per_item']:.2f} µs/item ({s_cpu:.2f} s),"
          f" peak RSS {out['standin_peak_rss_mib']:.0f} MiB")
    print(f"  load before: {load}")
    with open(f"{work}/summary.txt", "a") as f:
        f.write(f"{kind} {label} {json.dumps(out)}\n")


if __name__ == "__main__":
    main()
