//! `rekey status` as an operator reads it: the snapshots `state::snapshot`
//! gathers, rendered as lines.

use crate::state::snapshot::{StatusReport, TailStatus, show_time};

/// A snapshot as one line of JSON, keys in order (as `--json` prints them).
fn sorted_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).map_or_else(|e| e.to_string(), |v| v.to_string())
}

/// The report as an operator reads it.
pub fn render(r: &StatusReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "state     {}", r.state_dir);
    let _ = writeln!(out, "phase     {:?}", r.phase);
    for d in &r.drivers {
        let _ = writeln!(
            out,
            "driver    {} pid {} {} (last update {})",
            d.component,
            d.pid,
            if d.running { "running" } else { "not running" },
            show_time(&d.updated_at)
        );
    }
    if let Some(b) = &r.backfill {
        let pct = if b.expected_items > 0 {
            format!(
                " ({:.0}% of ~{})",
                100.0 * b.scanned as f64 / b.expected_items as f64,
                b.expected_items
            )
        } else {
            String::new()
        };
        let rates = if b.done || b.stopped {
            String::new()
        } else {
            format!(
                "; {:.0} RCU/s, {:.0} WCU/s (limit {:.0}), throttles {}{}",
                b.rcu_per_sec,
                b.wcu_per_sec,
                b.write_limit,
                b.throttles,
                if b.paused { ", PAUSED" } else { "" }
            )
        };
        let _ = writeln!(
            out,
            "backfill  {}{pct}: scanned {}, written {}, rejected {}, skipped {}, collisions {}{rates}",
            match (b.done, b.stopped) {
                (true, _) => "done",
                (false, true) => "stopped",
                (false, false) => "running",
            },
            b.scanned,
            b.written,
            b.rejected,
            b.skipped,
            b.collisions,
        );
        if let Some(i) = &b.import {
            let import = match &i.import_arn {
                Some(arn) => format!(
                    "; ImportTable {arn} {}: {} items, {} bytes processed",
                    i.status.as_deref().unwrap_or("started"),
                    i.processed_items,
                    i.processed_bytes
                ),
                None => "; ImportTable not called yet".to_string(),
            };
            let _ = writeln!(
                out,
                "import    {} objects in {}{import}",
                i.objects, i.objects_at
            );
        }
    }
    match &r.tail {
        Some(t) => tail_lines(&mut out, "tail     ", t),
        None => {
            let _ = writeln!(out, "tail      never ran");
        }
    }
    if let Some(t) = &r.reverse {
        tail_lines(&mut out, "reverse  ", t);
    }
    match &r.verify {
        Some(v) => {
            let _ = writeln!(out, "verify    {}", sorted_json(v));
        }
        None => {
            let _ = writeln!(out, "verify    never finished");
        }
    }
    let _ = writeln!(
        out,
        "rejects   {} from the backfill, {} from the tail, {} from the reverse tail",
        r.rejects.backfill, r.rejects.tail, r.rejects.reverse
    );
    if let Some(b) = &r.rollback {
        let _ = writeln!(out, "rollback  {}", sorted_json(b));
    }
    if let Some(c) = &r.cutover {
        let _ = writeln!(out, "cutover   {}", sorted_json(c));
    }
    out
}

/// One direction's tail: its counters, lag and `applied_through`, then a line per shard.
fn tail_lines(out: &mut String, label: &str, t: &TailStatus) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "{label} {} records ({} buffered): {} puts, {} deletes, {} rejected, {} in sync, {} conflicts; lag {}; applied through {}{}",
        t.records,
        t.buffered,
        t.puts,
        t.deletes,
        t.rejected,
        t.in_sync,
        t.conflicts,
        t.lag_seconds
            .map_or("unknown".to_string(), |l| format!("{l:.1} s")),
        t.applied_through
            .as_ref()
            .map_or("(not applying yet)".to_string(), show_time),
        if t.stopped { " (stopped)" } else { "" }
    );
    for s in &t.shards {
        let _ = writeln!(
            out,
            "          {} {} lag {}",
            s.shard_id,
            s.state,
            s.lag_seconds
                .map_or("unknown".to_string(), |l| format!("{l:.1} s"))
        );
    }
}
