//! `rekey cutover` and `rekey finish`: switching the application to the new
//! table on evidence, at a moment the operator chooses.
//!
//! Cutover checks four gates from what the other processes published
//! ([`crate::state::snapshot`]): the backfill is complete, the tail is running with lag
//! under a threshold, a clean verify is recent enough, and no rejects are left
//! unless accepted. While a postpone flag file exists it waits, re-checking,
//! so the operator picks the moment by deleting the file. Then it proves the
//! tail has applied every source write up to now with a drain barrier
//! ([`crate::phase::barrier`]), records the cutover durably (state store and
//! `cutover.json`), and prints the steps for switching the application. The
//! tail keeps running — writes that still reach the old table during the
//! switch are carried over — until `rekey finish`, which drains once more,
//! records the end and tells the tail to stop.
//!
//! With `--state dynamodb://…` the backfill, rejects and verify are the
//! fleet's; so are the tail gate and the drain barrier when the fleet has a
//! tail of its own (`rekey worker --tail`: the lag from its shards' units,
//! the barrier through [`crate::phase::barrier::fleet`]); else they stay
//! this machine's `rekey tail --fleet`. `finish --state` then records the
//! end in the control table, and the fleet's tail stops.
//!
//! Invariant: a cutover is recorded only after every gate held and the drain
//! barrier completed, in that order, with the gates re-checked after the
//! postpone wait.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::aws::Clients;
use crate::aws::control::ControlTable;
use crate::core::plan::Plan;
use crate::phase::barrier::{self, DrainOptions};
use crate::phase::progress::Progress;
use crate::phase::tail::{Flow, line};
use crate::state::StateDir;
use crate::state::StateStore;
use crate::state::fleet::shard::{self as shard_state, ShardUnit};
use crate::state::fleet::{Counters, Fleet, FleetRef};
use crate::state::snapshot::{self, BackfillStatus};
use crate::state::snapshot::{CutoverRecord, Gate, TailStatus, VerifyResult};

/// The file the tail polls: once it exists the tail stops.
#[derive(Debug, Clone)]
pub struct CutoverOptions {
    pub state_dir: StateDir,
    /// Largest acceptable tail lag, seconds.
    pub max_lag: f64,
    /// Oldest acceptable clean verify.
    pub max_verify_age: Duration,
    pub accept_rejects: bool,
    /// Wait while this file exists.
    pub postpone_file: PathBuf,
    /// How long to keep re-checking gates that are not met before giving up.
    pub wait: Duration,
    pub drain_timeout: Duration,
    /// `--state dynamodb://…`: the backfill, its rejects and the verify are
    /// the fleet's, read from the control table; so are the tail and the
    /// drain barrier when the fleet tails (`worker --tail`), else they are
    /// this machine's (`rekey tail --fleet` runs here).
    pub fleet: Option<FleetRef>,
}

/// What the control table says of a fleet's backfill and verify.
#[derive(Debug, Clone, Default)]
pub struct FleetEvidence {
    pub at: String,
    /// Every unit done ("backfill done"), epoch ms.
    pub done_ms: Option<i64>,
    pub totals: Counters,
    /// `--from-export`: the export the backfill read and the time of its
    /// data (`export ID at LOCATION, data as of TIME`); None: a Scan.
    pub export: Option<String>,
    /// The fleet verify started before the backfill was done: it proves nothing.
    pub verify_before_done: bool,
    /// The fleet's own tail (`rekey worker --tail`), when its workers have
    /// created the stream's shard units: the tail gate reads it.
    pub tail: Option<FleetTail>,
}

/// The fleet's tail, from its shards' units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetTail {
    /// Shards not done.
    pub open: usize,
    /// Of those, held by no worker.
    pub unheld: usize,
    /// Of those, not applying as they read yet (buffering until the
    /// backfill or the parent shard is done).
    pub buffering: usize,
    /// How far behind the stream the slowest live shard's holder is, in
    /// seconds (its newest record applied against this machine's clock,
    /// unless its last empty read came after it): a gate, not a proof — the
    /// drain barrier is the proof.
    pub lag: Option<f64>,
}

impl FleetTail {
    /// None when no worker has created the stream's shard units.
    pub fn of(shards: &[ShardUnit], now: f64) -> Option<FleetTail> {
        if shards.is_empty() {
            return None;
        }
        let open: Vec<&ShardUnit> = shards.iter().filter(|s| !s.cp.done).collect();
        Some(FleetTail {
            open: open.len(),
            unheld: open.iter().filter(|s| s.owner.is_none()).count(),
            buffering: open.iter().filter(|s| !s.cp.live).count(),
            lag: shard_state::fleet_through(shards, now).0,
        })
    }
}

/// What the gates look at, read from the state directory.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// Forward: a cutover's evidence; Reverse: a rollback's (the reverse
    /// tail's status, its rejects, and whether a cutover is recorded).
    pub flow: Flow,
    pub cut_over: bool,
    /// When the cutover being rolled back was recorded.
    pub cut_over_at: Option<chrono::DateTime<chrono::Utc>>,
    pub backfill_done: bool,
    pub backfill: Option<BackfillStatus>,
    pub tail: Option<TailStatus>,
    pub tail_running: bool,
    pub verify: Option<VerifyResult>,
    pub rejects: u64,
    /// A fleet's (`--state dynamodb://…`): backfill, rejects and verify from
    /// the control table.
    pub fleet: Option<FleetEvidence>,
}

impl Evidence {
    pub fn read(state_dir: &StateDir) -> anyhow::Result<Evidence> {
        Evidence::read_for(state_dir, Flow::Forward)
    }

    pub fn read_for(state_dir: &StateDir, flow: Flow) -> anyhow::Result<Evidence> {
        let tail: Option<TailStatus> = snapshot::read(&flow.snapshot(state_dir))?;
        let rejects = match flow {
            Flow::Forward => {
                snapshot::count_lines(&state_dir.rejects())?
                    + snapshot::count_lines(&state_dir.tail_rejects())?
            }
            Flow::Reverse => snapshot::count_lines(&state_dir.reverse_rejects())?,
        };
        let cutover: Option<CutoverRecord> = snapshot::read(&state_dir.cutover_record())?;
        Ok(Evidence {
            flow,
            cut_over: cutover.as_ref().is_some_and(|c| c.finished_at.is_none()),
            cut_over_at: cutover.as_ref().map(|c| c.at),
            backfill_done: state_dir.is_backfill_done(),
            backfill: snapshot::read(&state_dir.backfill_snapshot())?,
            tail_running: tail.as_ref().is_some_and(|t| snapshot::alive(t.pid)),
            tail,
            verify: snapshot::read(&state_dir.verify_snapshot())?,
            rejects,
            fleet: None,
        })
    }

    /// This machine's evidence (the tail, its rejects, the cutover record)
    /// with the fleet's backfill, rejects and verify in place of the local
    /// ones: "backfill done" from `META`, the rejects summed over the units'
    /// counters (the workers' files are on their machines), the verify
    /// from `VERIFY` — counted only if it started after the backfill was done.
    pub async fn read_fleet(
        clients: &Clients,
        state_dir: &StateDir,
        at: &FleetRef,
    ) -> anyhow::Result<Evidence> {
        let mut e = Evidence::read(state_dir)?;
        let backfill = Fleet::open(clients, at, "cutover").read().await?;
        let verdict = Fleet::verify(ControlTable::new(clients, &at.table), at.clone(), "cutover")
            .verify_verdict()
            .await?;
        let done_ms = backfill.meta.as_ref().and_then(|m| m.done_ms);
        let totals = backfill.totals();
        e.backfill_done = done_ms.is_some();
        e.backfill = None;
        // The fleet's tail counts its rejects in the shards' items.
        let tail_rejected: u64 = backfill.shards.iter().map(|s| s.rejected).sum();
        e.rejects =
            totals.rejected + tail_rejected + snapshot::count_lines(&state_dir.tail_rejects())?;
        let finished = verdict.as_ref().and_then(|v| {
            let ms = |t: i64| chrono::DateTime::from_timestamp_millis(t).unwrap_or_default();
            Some(VerifyResult {
                source_table: String::new(),
                target_table: String::new(),
                plan_fingerprint: String::new(),
                started_at: ms(v.started_ms),
                finished_at: ms(v.finished_ms?),
                clean: v.clean?,
                sample_percent: None,
                reverse: false,
                counts: v.counts?,
            })
        });
        let before = |v: &VerifyResult| done_ms.is_none_or(|d| v.started_at.timestamp_millis() < d);
        let export = backfill.meta.as_ref().and_then(|m| m.export.as_ref());
        e.fleet = Some(FleetEvidence {
            at: at.display(),
            done_ms,
            totals,
            export: export.map(|x| {
                let time = chrono::DateTime::from_timestamp_millis(x.export_time_ms)
                    .map_or_else(|| x.export_time_ms.to_string(), |t| snapshot::show_time(&t));
                format!("{}, data as of {time}", x.describe())
            }),
            verify_before_done: finished.as_ref().is_some_and(before),
            tail: FleetTail::of(&backfill.shards, crate::aws::streams::now_secs()),
        });
        e.verify = finished;
        Ok(e)
    }
}

/// The gates, from the evidence (pure: `now` is passed in).
pub fn gates(e: &Evidence, opts: &CutoverOptions, now: chrono::DateTime<chrono::Utc>) -> Vec<Gate> {
    let gate = |name: &str, ok: bool, detail: String| Gate {
        name: name.into(),
        ok,
        detail,
    };
    let (tail_gate, tail_cmd) = match e.flow {
        Flow::Forward => ("tail caught up", "rekey tail"),
        Flow::Reverse => ("reverse tail caught up", "rekey reverse"),
    };
    let backfill = if e.flow == Flow::Reverse {
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
        let t = &f.totals;
        gate(
            "backfill complete",
            e.backfill_done,
            format!(
                "fleet {}{}: {}; {} scanned, {} written, {} rejected, {} skipped",
                f.at,
                f.export
                    .as_ref()
                    .map_or(String::new(), |x| format!(" (from {x})")),
                if e.backfill_done {
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
    };
    let fleet_tail = e.fleet.as_ref().and_then(|f| f.tail.as_ref());
    let tail = match (&e.tail, fleet_tail) {
        (_, Some(t)) => fleet_tail_gate(t, opts.max_lag),
        (None, None) => gate(tail_gate, false, format!("`{tail_cmd}` has never run")),
        (Some(_), None) if !e.tail_running => gate(
            tail_gate,
            false,
            format!(
                "it is not running; start `{tail_cmd}` (it must keep running through the switch)"
            ),
        ),
        (Some(t), None) => {
            let stale = (now - t.updated_at).num_seconds() > 30;
            match t.lag_seconds {
                _ if stale => gate(
                    tail_gate,
                    false,
                    format!(
                        "no word from the tail since {}",
                        snapshot::show_time(&t.updated_at)
                    ),
                ),
                Some(l) if l <= opts.max_lag => gate(
                    tail_gate,
                    true,
                    format!("lag {l:.1} s ≤ {:.1} s", opts.max_lag),
                ),
                Some(l) => gate(
                    tail_gate,
                    false,
                    format!("lag {l:.1} s > {:.1} s", opts.max_lag),
                ),
                None => gate(
                    tail_gate,
                    false,
                    "lag unknown (still buffering, or a shard not read yet)".into(),
                ),
            }
        }
    };
    let verify = match &e.verify {
        None => gate(
            "clean verify",
            false,
            "no verify has finished; run `rekey verify`".into(),
        ),
        Some(v) => {
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
                (true, a) if a <= opts.max_verify_age => gate(
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
                        opts.max_verify_age.as_secs_f64()
                    ),
                ),
            }
        }
    };
    let verify = match (e.flow, &e.verify) {
        (Flow::Reverse, Some(v)) if verify.ok => {
            rollback_verify(v, e.cut_over_at).unwrap_or(verify)
        }
        _ if e.fleet.as_ref().is_some_and(|f| f.verify_before_done) => gate(
            "clean verify",
            false,
            "the fleet's verify started before its backfill was done; verify again".into(),
        ),
        _ => verify,
    };
    let rejects = gate(
        "no unresolved rejects",
        e.rejects == 0 || opts.accept_rejects,
        match (e.rejects, opts.accept_rejects) {
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
    );
    vec![backfill, tail, verify, rejects]
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

#[derive(Debug, Clone, Serialize)]
pub struct CutoverReport {
    /// Recorded now or earlier (a rerun after a cutover reports the record).
    pub cut_over: bool,
    pub gates: Vec<Gate>,
    pub record: Option<CutoverRecord>,
    /// Why not, when `cut_over` is false.
    pub blocked: Option<String>,
}

pub async fn cutover(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
) -> anyhow::Result<CutoverReport> {
    switch(clients, plan, opts, progress, Flow::Forward).await
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

/// `rekey rollback`: the mirror of a cutover. The gates read the reverse
/// tail (caught up, lag under the threshold), a clean verify within the age
/// limit and the reverse rejects; the postpone file is honoured; the drain
/// barrier goes through the target's stream; then the rollback is recorded
/// (`rollback.json`) and the cutover record set aside, so the forward tail —
/// which never stopped — carries on and a later `rekey cutover` can switch
/// again. `cut_over` in the report means "rolled back".
pub async fn rollback(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
) -> anyhow::Result<CutoverReport> {
    switch(clients, plan, opts, progress, Flow::Reverse).await
}

/// Before a cutover, where a rollback is possible: the reverse tail's start
/// line (crate::phase::tail::line), drawn while only rekey writes the
/// target, so a reverse tail started after the application has moved
/// carries back every write it made and nothing of rekey's.
async fn reverse_line(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
) -> anyhow::Result<()> {
    if opts.state_dir.reverse_line().exists() || line::reversible(clients, plan).await?.is_err() {
        return Ok(());
    }
    progress.note("drawing the reverse tail's start line through the target's stream");
    line::ensure(clients, plan, &opts.state_dir, opts.drain_timeout)
        .await
        .map_err(|e| e.context("the reverse tail's start line (a rollback needs it)"))?;
    Ok(())
}

/// Switch the application's table: forwards (cutover) or backwards (rollback).
async fn switch(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
    flow: Flow,
) -> anyhow::Result<CutoverReport> {
    // One driver per plan: the store's lock refuses a second cutover.
    let store = StateStore::open(&opts.state_dir, plan)?;
    let recorded = store.get::<CutoverRecord>("cutover/record")?;
    match (flow, recorded) {
        (Flow::Forward, Some(record)) => {
            return Ok(CutoverReport {
                cut_over: true,
                gates: record.gates.clone(),
                record: Some(record),
                blocked: None,
            });
        }
        (Flow::Reverse, None) => anyhow::bail!(crate::phase::error::InputError(
            "no cutover is recorded for this plan: there is nothing to roll back".into()
        )),
        (Flow::Reverse, Some(r)) if r.finished_at.is_some() => {
            anyhow::bail!(crate::phase::error::InputError(
                "the migration is finished (`rekey finish` ran): the tails have stopped, so it cannot be rolled back".into()
            ))
        }
        _ => {}
    }
    let started = Instant::now();
    let mut said_postponed = false;
    let (gates, fleet_tail) = loop {
        let evidence = match (&opts.fleet, flow) {
            (Some(at), Flow::Forward) => Evidence::read_fleet(clients, &opts.state_dir, at).await?,
            _ => Evidence::read_for(&opts.state_dir, flow)?,
        };
        let g = gates(&evidence, opts, chrono::Utc::now());
        let all_ok = g.iter().all(|g| g.ok);
        let postponed = opts.postpone_file.exists();
        if all_ok && !postponed {
            let fleet_tail = evidence.fleet.as_ref().is_some_and(|f| f.tail.is_some());
            break (g, fleet_tail);
        }
        if postponed {
            if !said_postponed {
                progress.note(&format!(
                    "postponed: waiting while {} exists (delete it to cut over)",
                    opts.postpone_file.display()
                ));
                said_postponed = true;
            }
        } else if started.elapsed() >= opts.wait {
            return Ok(CutoverReport {
                cut_over: false,
                blocked: Some("gates not met".into()),
                gates: g,
                record: None,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for g in &gates {
        progress.note(&format!("gate ok: {} — {}", g.name, g.detail));
    }
    progress.note(&format!(
        "drain barrier: waiting for the {} to apply every {} write made until now",
        match flow {
            Flow::Forward if fleet_tail => "fleet's tail",
            Flow::Forward => "tail",
            Flow::Reverse => "reverse tail",
        },
        flow.read_role()
    ));
    let through = DrainOptions {
        state_dir: opts.state_dir.clone(),
        timeout: opts.drain_timeout,
        flow,
        fleet: opts.fleet.clone().filter(|_| fleet_tail),
    };
    let drain = barrier::drain(clients, plan, &through).await?;
    if !drain.complete {
        return Ok(CutoverReport {
            cut_over: false,
            blocked: Some(format!(
                "the tail did not report drain barrier {} within {:.0} s",
                drain.barrier, drain.waited_seconds
            )),
            gates,
            record: None,
        });
    }
    // After the drain: from the line on the forward tail is guarded, a read
    // and a write per record, too slow to drain an application still
    // writing the source at full rate within the timeout.
    if flow == Flow::Forward && opts.fleet.is_none() {
        reverse_line(clients, plan, opts, progress).await?;
    }
    let record = CutoverRecord {
        at: chrono::Utc::now(),
        barrier: drain.barrier,
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        gates: gates.clone(),
        finished_at: None,
    };
    match flow {
        Flow::Forward => {
            store.put("cutover/record", &record)?;
            store.flush()?;
            snapshot::publish(&opts.state_dir.cutover_record(), &record)?;
        }
        Flow::Reverse => {
            // The rollback first, then the cutover set aside: a crash in
            // between leaves a rollback recorded and a rerun says so.
            store.put("rollback/record", &record)?;
            store.flush()?;
            snapshot::publish(&opts.state_dir.rollback_record(), &record)?;
            store.remove("cutover/record")?;
            store.flush()?;
            match std::fs::remove_file(opts.state_dir.cutover_record()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(anyhow::Error::new(e).context("cannot remove cutover.json"));
                }
                _ => {}
            }
        }
    }
    Ok(CutoverReport {
        cut_over: true,
        gates,
        record: Some(record),
        blocked: None,
    })
}

/// The operator's next steps after a cutover.
pub fn next_steps(plan: &Plan, plan_path: &Path) -> String {
    format!(
        "Next steps:\n\
         1. Point the application's reads and writes at `{target}` (deploy the new key design).\n\
         2. Keep `rekey tail` running meanwhile: writes that still reach `{source}` are carried over.\n\
         3. When no instance writes to `{source}` any more: rekey finish {plan}\n\
         4. Keep `{source}` until you are sure; rekey never deletes it.",
        target = plan.target_table,
        source = plan.source_table,
        plan = plan_path.display()
    )
}

#[derive(Debug, Clone, Serialize)]
pub struct FinishReport {
    pub finished: bool,
    pub barrier: String,
    pub record: Option<CutoverRecord>,
}

/// The operator's next steps after a rollback.
pub fn rollback_steps(plan: &Plan, plan_path: &Path) -> String {
    format!(
        "Next steps:\n\
         1. Point the application's reads and writes back at `{source}` (deploy the old key design).\n\
         2. Keep `rekey reverse` running meanwhile: writes that still reach `{target}` are carried back.\n\
         3. The forward tail never stopped: `{target}` stays current, so you can cut over again later\n\
            (rekey verify {plan}, then rekey cutover {plan}).\n\
         4. To end the migration instead: stop both tails (rekey finish {plan} after a cutover).",
        target = plan.target_table,
        source = plan.source_table,
        plan = plan_path.display()
    )
}

/// After the switch: drain once more (each direction that runs), record
/// the end, stop the tails. With `fleet` (`--state dynamodb://…`) whose
/// workers tail, the last barrier goes through the fleet's tail and the end
/// is recorded in the control table too, where its holders see it and stop.
pub async fn finish(
    clients: &Clients,
    plan: &Plan,
    state_dir: &StateDir,
    drain_timeout: Duration,
    fleet: Option<&FleetRef>,
) -> anyhow::Result<FinishReport> {
    let store = StateStore::open(state_dir, plan)?;
    let Some(mut record) = store.get::<CutoverRecord>("cutover/record")? else {
        anyhow::bail!(crate::phase::error::InputError(
            "no cutover is recorded for this plan; run `rekey cutover` first".into()
        ));
    };
    let fleet_tail = match fleet {
        Some(at) if barrier::fleet::fleet_has_tail(clients, at).await? => Some(at),
        _ => None,
    };
    let through = DrainOptions {
        state_dir: state_dir.clone(),
        timeout: drain_timeout,
        flow: Flow::Forward,
        fleet: fleet_tail.cloned(),
    };
    let drain = barrier::drain(clients, plan, &through).await?;
    if !drain.complete {
        return Ok(FinishReport {
            finished: false,
            barrier: drain.barrier,
            record: Some(record),
        });
    }
    // A reverse tail still running is drained too: both directions end.
    let reverse: Option<TailStatus> = snapshot::read(&state_dir.reverse_snapshot())?;
    if reverse.is_some_and(|r| !r.stopped && snapshot::alive(r.pid)) {
        let back = barrier::drain(
            clients,
            plan,
            &DrainOptions {
                state_dir: state_dir.clone(),
                timeout: drain_timeout,
                flow: Flow::Reverse,
                fleet: None,
            },
        )
        .await?;
        if !back.complete {
            return Ok(FinishReport {
                finished: false,
                barrier: back.barrier,
                record: Some(record),
            });
        }
    }
    record.finished_at = Some(chrono::Utc::now());
    store.put("cutover/record", &record)?;
    store.flush()?;
    snapshot::publish(&state_dir.cutover_record(), &record)?;
    std::fs::write(state_dir.finished(), b"finished\n")?;
    if let Some(at) = fleet_tail {
        Fleet::open(clients, at, "finish").mark_finished().await?;
    }
    Ok(FinishReport {
        finished: true,
        barrier: drain.barrier,
        record: Some(record),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> CutoverOptions {
        CutoverOptions {
            state_dir: StateDir::new("s"),
            max_lag: 5.0,
            max_verify_age: Duration::from_secs(3600),
            accept_rejects: false,
            postpone_file: PathBuf::from("s/postpone"),
            wait: Duration::ZERO,
            drain_timeout: Duration::from_secs(1),
            fleet: None,
        }
    }

    fn ready(now: chrono::DateTime<chrono::Utc>) -> Evidence {
        Evidence {
            flow: Flow::Forward,
            cut_over: false,
            cut_over_at: None,
            backfill_done: true,
            backfill: None,
            tail: Some(TailStatus {
                updated_at: now,
                lag_seconds: Some(0.4),
                applied_through: Some(now),
                ..Default::default()
            }),
            tail_running: true,
            verify: Some(verify_result(true, now - chrono::Duration::seconds(60))),
            rejects: 0,
            fleet: None,
        }
    }

    fn verify_result(clean: bool, finished_at: chrono::DateTime<chrono::Utc>) -> VerifyResult {
        VerifyResult {
            source_table: "a".into(),
            target_table: "b".into(),
            plan_fingerprint: "f".into(),
            started_at: finished_at,
            finished_at,
            clean,
            sample_percent: None,
            reverse: false,
            counts: Default::default(),
        }
    }

    fn failing(g: &[Gate]) -> Vec<String> {
        g.iter().filter(|g| !g.ok).map(|g| g.name.clone()).collect()
    }

    #[test]
    fn a_rollback_needs_a_cutover_and_the_reverse_tail_caught_up() {
        let now = chrono::Utc::now();
        let back = Evidence {
            flow: Flow::Reverse,
            cut_over: true,
            cut_over_at: Some(now - chrono::Duration::seconds(120)),
            backfill_done: false,
            verify: Some(VerifyResult {
                reverse: true,
                ..verify_result(true, now - chrono::Duration::seconds(60))
            }),
            ..ready(now)
        };
        assert!(failing(&gates(&back, &opts(), now)).is_empty());
        let none = Evidence {
            cut_over: false,
            ..back.clone()
        };
        assert_eq!(failing(&gates(&none, &opts(), now)), ["cut over"]);
        let behind = Evidence {
            tail: Some(TailStatus {
                updated_at: now,
                lag_seconds: Some(60.0),
                ..Default::default()
            }),
            ..back
        };
        assert_eq!(
            failing(&gates(&behind, &opts(), now)),
            ["reverse tail caught up"]
        );
    }

    #[test]
    fn a_rollback_needs_a_reverse_verify_started_after_the_cutover() {
        let now = chrono::Utc::now();
        let verified = |reverse, secs_ago| {
            Some(VerifyResult {
                reverse,
                ..verify_result(true, now - chrono::Duration::seconds(secs_ago))
            })
        };
        let back = Evidence {
            flow: Flow::Reverse,
            cut_over: true,
            cut_over_at: Some(now - chrono::Duration::seconds(120)),
            ..ready(now)
        };
        for (reverse, secs_ago, ok) in [(true, 60, true), (false, 60, false), (true, 300, false)] {
            let e = Evidence {
                verify: verified(reverse, secs_ago),
                ..back.clone()
            };
            let g = gates(&e, &opts(), now);
            assert_eq!(
                failing(&g).is_empty(),
                ok,
                "reverse {reverse}, {secs_ago} s ago: {g:?}"
            );
        }
        // A cutover's gate takes either direction.
        let e = Evidence {
            verify: verified(false, 60),
            ..ready(now)
        };
        assert!(failing(&gates(&e, &opts(), now)).is_empty());
    }

    #[test]
    fn every_gate_holds_on_a_ready_migration() {
        let now = chrono::Utc::now();
        assert!(failing(&gates(&ready(now), &opts(), now)).is_empty());
    }

    #[test]
    fn each_gate_fails_on_its_own_evidence() {
        let now = chrono::Utc::now();
        let mut e = ready(now);
        e.backfill_done = false;
        assert_eq!(failing(&gates(&e, &opts(), now)), ["backfill complete"]);

        let mut e = ready(now);
        e.tail.as_mut().unwrap().lag_seconds = Some(9.0);
        assert_eq!(failing(&gates(&e, &opts(), now)), ["tail caught up"]);
        let mut e = ready(now);
        e.tail_running = false;
        assert_eq!(failing(&gates(&e, &opts(), now)), ["tail caught up"]);
        let later = now + chrono::Duration::seconds(45);
        let e = ready(now);
        assert!(
            failing(&gates(&e, &opts(), later)).contains(&"tail caught up".to_string()),
            "stale status"
        );

        let mut e = ready(now);
        e.verify = Some(verify_result(false, now));
        assert_eq!(failing(&gates(&e, &opts(), now)), ["clean verify"]);
        let e = ready(now);
        let much_later = now + chrono::Duration::seconds(7200);
        let f = failing(&gates(&e, &opts(), much_later));
        assert!(f.contains(&"clean verify".to_string()), "too old: {f:?}");

        let mut e = ready(now);
        e.rejects = 3;
        assert_eq!(failing(&gates(&e, &opts(), now)), ["no unresolved rejects"]);
        let accept = CutoverOptions {
            accept_rejects: true,
            ..opts()
        };
        assert!(failing(&gates(&e, &accept, now)).is_empty());
    }

    #[test]
    fn with_its_own_tail_a_fleet_cutover_gates_on_the_shards_not_on_a_local_tail() {
        let now = chrono::Utc::now();
        let tail = FleetTail {
            open: 2,
            unheld: 0,
            buffering: 0,
            lag: Some(1.0),
        };
        let with = |t: FleetTail| Evidence {
            tail: None,
            tail_running: false,
            fleet: Some(FleetEvidence {
                tail: Some(t),
                ..Default::default()
            }),
            ..ready(now)
        };
        let g = gates(&with(tail.clone()), &opts(), now);
        assert!(failing(&g).is_empty(), "no local tail needed: {g:?}");
        for (t, why) in [
            (
                FleetTail {
                    unheld: 1,
                    ..tail.clone()
                },
                "no holder",
            ),
            (
                FleetTail {
                    buffering: 1,
                    ..tail.clone()
                },
                "still buffer",
            ),
            (
                FleetTail {
                    lag: Some(9.0),
                    ..tail.clone()
                },
                "lag 9.0 s >",
            ),
            (
                FleetTail {
                    lag: None,
                    ..tail.clone()
                },
                "lag unknown",
            ),
        ] {
            let g = gates(&with(t), &opts(), now);
            assert_eq!(failing(&g), ["tail caught up"], "{g:?}");
            assert!(g[1].detail.contains(why), "{g:?}");
        }
    }

    #[test]
    fn the_fleet_tail_is_read_from_the_shards_units() {
        use crate::state::fleet::shard::ShardCheckpoint;
        let unit = |id: &str, owner: Option<&str>, cp: ShardCheckpoint| ShardUnit {
            id: id.into(),
            // "old" is done, the parent of a: a child of a done shard.
            parent: (id == "a").then(|| "old".to_string()),
            owner: owner.map(str::to_string),
            lease: 1,
            beat: 0,
            page: 0,
            cp,
            first_apply_ms: None,
            done_ms: None,
            grants: vec![],
            barriers: Default::default(),
            rejected: 0,
        };
        assert_eq!(FleetTail::of(&[], 100.0), None);
        let live = |r: f64| ShardCheckpoint {
            live: true,
            record_at: Some(r),
            ..Default::default()
        };
        let done = ShardCheckpoint {
            done: true,
            ..Default::default()
        };
        let t = FleetTail::of(
            &[
                unit("a", Some("w1"), live(90.0)),
                unit("b", Some("w2"), live(97.0)),
                unit("old", None, done),
                unit("c", None, ShardCheckpoint::default()),
            ],
            100.0,
        )
        .unwrap();
        assert_eq!(
            t,
            FleetTail {
                open: 3,
                unheld: 1,
                buffering: 1,
                lag: Some(10.0),
            }
        );
    }

    #[test]
    fn a_fleet_cutover_gates_on_the_fleets_backfill_rejects_and_a_verify_after_it() {
        let now = chrono::Utc::now();
        let fleet = FleetEvidence {
            at: "dynamodb://ctl/m".into(),
            done_ms: Some((now - chrono::Duration::seconds(120)).timestamp_millis()),
            totals: Counters {
                scanned: 10,
                written: 8,
                rejected: 2,
                ..Default::default()
            },
            export: None,
            verify_before_done: false,
            tail: None,
        };
        let e = Evidence {
            rejects: 2,
            fleet: Some(fleet.clone()),
            ..ready(now)
        };
        let g = gates(&e, &opts(), now);
        assert!(
            g[0].ok && g[0].detail.contains("fleet dynamodb://ctl/m"),
            "{g:?}"
        );
        assert!(
            !g[3].ok && g[3].detail.contains("the fleet's units"),
            "{g:?}"
        );
        let accepted = CutoverOptions {
            accept_rejects: true,
            ..opts()
        };
        assert!(gates(&e, &accepted, now).iter().all(|g| g.ok));
        // From an export: the gate names it and the time of its data.
        let from_export = Evidence {
            fleet: Some(FleetEvidence {
                export: Some("export 01-a at s3://b/p, data as of 2026-12-01T00:00:00.000Z".into()),
                ..fleet.clone()
            }),
            ..e.clone()
        };
        let g = gates(&from_export, &opts(), now);
        assert!(
            g[0].ok
                && g[0]
                    .detail
                    .contains("(from export 01-a at s3://b/p, data as of 2026-12-01"),
            "{g:?}"
        );
        // A verify that started before the backfill was done proves nothing.
        let early = Evidence {
            fleet: Some(FleetEvidence {
                verify_before_done: true,
                ..fleet
            }),
            ..e
        };
        let g = gates(&early, &accepted, now);
        assert!(
            !g[2].ok && g[2].detail.contains("before its backfill"),
            "{g:?}"
        );
    }
}
