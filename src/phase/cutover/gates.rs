//! The four gates a switch waits for, judged from the evidence alone (pure:
//! `now` is passed in), so each is tested on evidence written by hand: the
//! backfill complete (for a rollback: a cutover to roll back), the tail
//! caught up, a clean verify recent enough, no rejects unless accepted.

use std::time::Duration;

use crate::phase::tail::Flow;
use crate::state::snapshot::{self, Gate, TailStatus, VerifyResult};

use super::CutoverOptions;
use super::evidence::{Evidence, FleetEvidence, FleetTail};

/// The gates, from the evidence (pure: `now` is passed in).
pub fn gates(e: &Evidence, opts: &CutoverOptions, now: chrono::DateTime<chrono::Utc>) -> Vec<Gate> {
    vec![
        backfill_gate(e),
        tail_gate(e, opts.max_lag, now),
        verify_gate(e, opts.max_verify_age, now),
        rejects_gate(e, opts.accept_rejects),
    ]
}

fn gate(name: &str, ok: bool, detail: String) -> Gate {
    Gate {
        name: name.into(),
        ok,
        detail,
    }
}

/// Forwards: the backfill complete, the fleet's or this machine's.
/// Backwards: a cutover recorded and not finished.
fn backfill_gate(e: &Evidence) -> Gate {
    if e.flow == Flow::Reverse {
        gate(
            "cut over",
            e.cut_over,
            if e.cut_over {
                "a cutover is recorded and not finished".into()
            } else {
                "no cutover to roll back (none recorded, or finished)".into()
            },
        )
    } else if let Some(f) = &e.fleet {
        fleet_backfill_gate(f, e.backfill_done)
    } else {
        gate(
            "backfill complete",
            e.backfill_done,
            match (&e.backfill, e.backfill_done) {
                (Some(b), true) => format!(
                    "{} scanned, {} written, {} rejected, {} skipped",
                    b.scanned, b.written, b.rejected, b.skipped
                ),
                (_, true) => "backfill.done present".into(),
                (Some(b), false) => format!(
                    "still running: {} of ~{} scanned",
                    b.scanned, b.expected_items
                ),
                (None, false) => "not started".into(),
            },
        )
    }
}

fn fleet_backfill_gate(f: &FleetEvidence, done: bool) -> Gate {
    let t = &f.totals;
    gate(
        "backfill complete",
        done,
        format!(
            "fleet {}{}: {}; {} scanned, {} written, {} rejected, {} skipped",
            f.at,
            f.export
                .as_ref()
                .map_or(String::new(), |x| format!(" (from {x})")),
            if done {
                "every unit done"
            } else {
                "still running"
            },
            t.scanned,
            t.written,
            t.rejected,
            t.skipped
        ),
    )
}

/// The tail (or the reverse tail) running with lag under `max_lag`: the
/// fleet's own tail when it has one, else this machine's status file.
fn tail_gate(e: &Evidence, max_lag: f64, now: chrono::DateTime<chrono::Utc>) -> Gate {
    let (name, cmd) = match e.flow {
        Flow::Forward => ("tail caught up", "rekey tail"),
        Flow::Reverse => ("reverse tail caught up", "rekey reverse"),
    };
    let fleet_tail = e.fleet.as_ref().and_then(|f| f.tail.as_ref());
    match (&e.tail, fleet_tail) {
        (_, Some(t)) => fleet_tail_gate(t, max_lag),
        (None, None) => gate(name, false, format!("`{cmd}` has never run")),
        (Some(_), None) if !e.tail_running => gate(
            name,
            false,
            format!("it is not running; start `{cmd}` (it must keep running through the switch)"),
        ),
        (Some(t), None) => local_tail_gate(name, t, max_lag, now),
    }
}

/// This machine's tail, from its status file: fresh, and its lag known and
/// under `max_lag`.
fn local_tail_gate(
    name: &str,
    t: &TailStatus,
    max_lag: f64,
    now: chrono::DateTime<chrono::Utc>,
) -> Gate {
    let stale = (now - t.updated_at).num_seconds() > 30;
    match t.lag_seconds {
        _ if stale => gate(
            name,
            false,
            format!(
                "no word from the tail since {}",
                snapshot::show_time(&t.updated_at)
            ),
        ),
        Some(l) if l <= max_lag => gate(name, true, format!("lag {l:.1} s ≤ {max_lag:.1} s")),
        Some(l) => gate(name, false, format!("lag {l:.1} s > {max_lag:.1} s")),
        None => gate(
            name,
            false,
            "lag unknown (still buffering, or a shard not read yet)".into(),
        ),
    }
}

/// The tail gate on the fleet's own tail: every open shard held, applying,
/// the slowest within `max_lag`.
fn fleet_tail_gate(t: &FleetTail, max_lag: f64) -> Gate {
    let (ok, detail) = if t.unheld > 0 {
        (
            false,
            format!(
                "{} of the stream's {} open shards have no holder: run `rekey worker --tail`",
                t.unheld, t.open
            ),
        )
    } else if t.buffering > 0 {
        (
            false,
            format!(
                "{} of {} shards still buffer (the fleet's backfill or a parent shard is not done)",
                t.buffering, t.open
            ),
        )
    } else {
        match t.lag {
            Some(l) => (
                l <= max_lag,
                format!(
                    "the fleet's tail: lag {l:.1} s {} {max_lag:.1} s over {} shards",
                    if l <= max_lag { "≤" } else { ">" },
                    t.open
                ),
            ),
            None => (false, "the fleet's tail: lag unknown".into()),
        }
    };
    Gate {
        name: "tail caught up".into(),
        ok,
        detail,
    }
}

/// A clean, full verify within `max_age`; for a rollback, a reverse one
/// started after the cutover; for a fleet, one started after its backfill
/// was done.
fn verify_gate(e: &Evidence, max_age: Duration, now: chrono::DateTime<chrono::Utc>) -> Gate {
    let verify = clean_verify_gate(e.verify.as_ref(), max_age, now);
    match (e.flow, &e.verify) {
        (Flow::Reverse, Some(v)) if verify.ok => {
            rollback_verify(v, e.cut_over_at).unwrap_or(verify)
        }
        _ if e.fleet.as_ref().is_some_and(|f| f.verify_before_done) => gate(
            "clean verify",
            false,
            "the fleet's verify started before its backfill was done; verify again".into(),
        ),
        _ => verify,
    }
}

/// The last verify: finished, full, clean, and no older than `max_age`.
fn clean_verify_gate(
    v: Option<&VerifyResult>,
    max_age: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Gate {
    let Some(v) = v else {
        return gate(
            "clean verify",
            false,
            "no verify has finished; run `rekey verify`".into(),
        );
    };
    let age = (now - v.finished_at).to_std().unwrap_or_default();
    let sampled = v.sample_percent.is_some();
    match (v.clean, age) {
        _ if sampled => gate(
            "clean verify",
            false,
            "the last verify was a --sample pass; a cutover needs a full one".into(),
        ),
        (false, _) => gate(
            "clean verify",
            false,
            "the last verify found differences; fix them (`rekey verify --repair`) and verify again".into(),
        ),
        (true, a) if a <= max_age => gate(
            "clean verify",
            true,
            format!("clean, {:.0} s ago", a.as_secs_f64()),
        ),
        (true, a) => gate(
            "clean verify",
            false,
            format!(
                "clean but {:.0} s old (limit {:.0} s); verify again",
                a.as_secs_f64(),
                max_age.as_secs_f64()
            ),
        ),
    }
}

/// A clean, recent verify is a rollback's evidence only when it read the
/// source back from the target (`--reverse`) after the cutover: one from
/// before it knows nothing of the writes the application made to the target
/// since. The failing gate, or None when `v` will do.
fn rollback_verify(
    v: &VerifyResult,
    cut_over_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Option<Gate> {
    let fail = |detail: &str| Gate {
        name: "clean verify".into(),
        ok: false,
        detail: detail.into(),
    };
    if !v.reverse {
        return Some(fail(
            "the last verify was forward; a rollback needs `rekey verify --reverse`",
        ));
    }
    match cut_over_at {
        Some(at) if v.started_at < at => Some(fail(
            "the last reverse verify started before the cutover; run `rekey verify --reverse` again",
        )),
        _ => None,
    }
}

/// No rejects left, or `--accept-rejects`.
fn rejects_gate(e: &Evidence, accept: bool) -> Gate {
    gate(
        "no unresolved rejects",
        e.rejects == 0 || accept,
        match (e.rejects, accept) {
            (0, _) => "none".into(),
            (n, true) => format!("{n} accepted (--accept-rejects)"),
            (n, false) => format!(
                "{n} in {}; fix the plan or pass --accept-rejects",
                match e.flow {
                    Flow::Forward if e.fleet.is_some() => {
                        "the fleet's units (each worker's rejects file) / tail-rejects.jsonl"
                    }
                    Flow::Forward => "rejects.jsonl / tail-rejects.jsonl",
                    Flow::Reverse => "reverse-rejects.jsonl",
                }
            ),
        },
    )
}
