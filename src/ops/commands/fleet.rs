//! More than one machine: `worker`, `tail --fleet`, `status --state
//! dynamodb://…`.

use std::fmt::Write as _;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{connect, print, print_done};
use crate::ops::cli::exit;
use crate::ops::config::{Common, Planned};
use crate::ops::progress;
use crate::phase::backfill::fleet::{self, WorkerOptions, WorkerReport};
use crate::phase::tail::{self, TailOptions};
use crate::state::fleet::export::ExportSource;
use crate::state::fleet::shard::{ShardUnit, fleet_through};
use crate::state::fleet::{Checkpoint, Counters, FleetRef, Snapshot, wall_ms};

/// `rekey worker`: `stop` ends it cleanly (its leases released).
pub(super) async fn worker(
    c: &Common,
    cmd: Planned<WorkerOptions>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let report = fleet::run(&clients, &plan, &options, &progress, &stop).await?;
    print_done(c, &report, worker_text)?;
    Ok(exit::OK)
}

fn worker_text(r: &WorkerReport) -> String {
    let t = &r.totals;
    let w = &r.this_worker;
    format!(
        "worker {} on {}{}: backfill {}. This worker: {} units finished, {} scanned = {} written + {} rejected + {} skipped (rejects in {}). \
         The fleet: {} scanned = {} written + {} rejected + {} skipped ({} collisions) over {} units. \
         Control table: {} requests from this worker ({} GetItem, {} Query, {} PutItem, {} UpdateItem); {}.\n",
        r.worker,
        r.state,
        r.export
            .as_ref()
            .map_or(String::new(), |e| format!(" (from {})", e.describe())),
        if r.backfill_done { "done" } else { "not done" },
        r.units_finished.len(),
        w.scanned,
        w.written,
        w.rejected,
        w.skipped,
        r.rejects_file,
        t.scanned,
        t.written,
        t.rejected,
        t.skipped,
        t.collisions,
        r.segments,
        r.control_calls.total,
        r.control_calls.get_item,
        r.control_calls.query,
        r.control_calls.put_item,
        r.control_calls.update_item,
        if r.claims {
            "target keys claimed"
        } else {
            "no target-key claims (the plan cannot collide)"
        }
    )
}

/// `rekey tail --fleet`: the tail, and beside it the wait for the fleet's
/// "backfill done" record, mirrored into the tail's state directory; `stop`
/// ends both cleanly.
pub(super) async fn tail_fleet(
    c: &Common,
    cmd: Planned<TailOptions>,
    at: FleetRef,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let mirror = {
        let (clients, at, dir, stop) = (
            clients.clone(),
            at.clone(),
            options.state_dir.clone(),
            stop.clone(),
        );
        tokio::spawn(async move { fleet::mirror_done(&clients, &at, &dir, &stop).await })
    };
    // The tail's progress, published in the control table for the fleet's verify.
    let marks = {
        let (clients, at, dir, stop) = (
            clients.clone(),
            at.clone(),
            options.state_dir.clone(),
            CancellationToken::new(),
        );
        let token = stop.clone();
        let task =
            tokio::spawn(async move { fleet::publish_tail(&clients, &at, &dir, &stop).await });
        (task, token)
    };
    let result = tail::run(&clients, &plan, &options, &progress, &stop).await;
    mirror.abort();
    marks.1.cancel();
    match marks.0.await {
        Ok(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot publish the tail's progress")
        }
        Err(e) => tracing::warn!(error = %e, "the tail's progress publisher failed"),
        Ok(Ok(())) => {}
    }
    if let Err(e) = fleet::publish_final(&clients, &at, &options.state_dir).await {
        tracing::warn!(error = %format!("{e:#}"), "cannot publish the tail's last progress");
    }
    let report = result?;
    print_done(c, &report, |r| {
        format!(
            "tail: {} records ({} buffered until the fleet's backfill finished): {} puts, {} deletes, {} rejected; last lag {:.1} s\n",
            r.records, r.buffered, r.puts, r.deletes, r.rejected, r.last_lag_seconds
        )
    })?;
    Ok(exit::OK)
}

/// The fleet as `status` shows it: no key values (a unit's checkpoint is
/// shown by its page count only).
#[derive(Debug, Serialize)]
struct FleetStatus {
    state: String,
    segments: u32,
    /// `--from-export`: the export whose data files are the units.
    #[serde(skip_serializing_if = "Option::is_none")]
    export: Option<ExportSource>,
    backfill_done: bool,
    totals: Counters,
    workers: Vec<WorkerLine>,
    units: Vec<UnitLine>,
    /// The fleet's tail (`rekey worker --tail`), when it has started.
    #[serde(skip_serializing_if = "Option::is_none")]
    tail: Option<TailLine>,
}

/// The fleet's tail: `applied_through` is the minimum over the shards not
/// done (None while one still buffers): every source write before it is in
/// the target.
#[derive(Debug, Serialize)]
struct TailLine {
    applied_through: Option<String>,
    lag_seconds: Option<f64>,
    shards: Vec<ShardLine>,
}

#[derive(Debug, Serialize)]
struct ShardLine {
    shard: String,
    parent: Option<String>,
    owner: Option<String>,
    lease: u64,
    /// Buffer chunks committed, and applied (the cursor).
    chunks: u64,
    applied: u64,
    finished: bool,
    live: bool,
    done: bool,
    lag_seconds: Option<f64>,
    applied_through: Option<String>,
}

fn tail_line(shards: &[ShardUnit]) -> Option<TailLine> {
    if shards.is_empty() {
        return None;
    }
    let now = wall_ms() as f64 / 1000.0;
    let time = |s: f64| {
        chrono::DateTime::from_timestamp_millis((s * 1000.0) as i64).map(|t| t.to_rfc3339())
    };
    let (lag, through) = fleet_through(shards, now);
    Some(TailLine {
        applied_through: through.and_then(time),
        lag_seconds: lag,
        shards: shards
            .iter()
            .map(|s| {
                let (lag, through) = if s.cp.done {
                    (None, None)
                } else {
                    fleet_through(std::slice::from_ref(s), now)
                };
                ShardLine {
                    shard: s.id.clone(),
                    parent: s.parent.clone(),
                    owner: s.owner.clone(),
                    lease: s.lease,
                    chunks: s.cp.chunks,
                    applied: s.cp.applied,
                    finished: s.cp.finished,
                    live: s.cp.live,
                    done: s.cp.done,
                    lag_seconds: lag,
                    applied_through: through.and_then(time),
                }
            })
            .collect(),
    })
}

#[derive(Debug, Serialize)]
struct WorkerLine {
    id: String,
    state: String,
    units: Vec<u32>,
    write_rate: f64,
    read_rate: f64,
    /// Seconds since its last heartbeat, by this machine's clock.
    heartbeat_age_seconds: f64,
}

#[derive(Debug, Serialize)]
struct UnitLine {
    unit: u32,
    /// The export data file the unit reads (None: a Scan segment).
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    owner: Option<String>,
    lease: u64,
    pages: u64,
    started: bool,
    done: bool,
    counts: Counters,
}

fn fleet_status(at: &FleetRef, snap: Snapshot) -> FleetStatus {
    let now = wall_ms();
    FleetStatus {
        state: at.display(),
        segments: snap.meta.as_ref().map_or(0, |m| m.segments),
        export: snap.meta.as_ref().and_then(|m| m.export.clone()),
        backfill_done: snap.meta.as_ref().is_some_and(|m| m.done_ms.is_some()),
        totals: snap.totals(),
        workers: snap
            .workers
            .iter()
            .map(|w| WorkerLine {
                id: w.id.clone(),
                state: w.state.clone(),
                units: w.units.clone(),
                write_rate: w.write_rate,
                read_rate: w.read_rate,
                heartbeat_age_seconds: (now - w.heartbeat_ms) as f64 / 1000.0,
            })
            .collect(),
        units: snap
            .units
            .iter()
            .map(|u| UnitLine {
                unit: u.n,
                file: u.file.clone(),
                owner: u.owner.clone(),
                lease: u.lease,
                pages: u.page,
                started: u.checkpoint != Checkpoint::Beginning,
                done: u.done,
                counts: u.counts,
            })
            .collect(),
        tail: tail_line(&snap.shards),
    }
}

fn fleet_text(s: &FleetStatus) -> String {
    let mut o = String::new();
    let t = &s.totals;
    let done = s.units.iter().filter(|u| u.done).count();
    let _ = writeln!(
        o,
        "fleet {}{}: {done}/{} units done{}; {} scanned = {} written + {} rejected + {} skipped ({} collisions)",
        s.state,
        s.export
            .as_ref()
            .map_or(String::new(), |e| format!(" (from {})", e.describe())),
        s.units.len(),
        if s.backfill_done {
            ", backfill done"
        } else {
            ""
        },
        t.scanned,
        t.written,
        t.rejected,
        t.skipped,
        t.collisions
    );
    for w in &s.workers {
        let _ = writeln!(
            o,
            "  worker {} ({}): units {:?}, {:.0} WCU/s, {:.0} RCU/s, heartbeat {:.1} s ago",
            w.id, w.state, w.units, w.write_rate, w.read_rate, w.heartbeat_age_seconds
        );
    }
    for u in &s.units {
        let _ = writeln!(
            o,
            "  unit {:>3}{}: {} lease {}, {} pages, {} scanned{}",
            u.unit,
            u.file.as_deref().map_or(String::new(), |f| format!(
                " (file {})",
                f.rsplit('/').next().unwrap_or(f)
            )),
            u.owner.as_deref().unwrap_or("free"),
            u.lease,
            u.pages,
            u.counts.scanned,
            if u.done { ", done" } else { "" }
        );
    }
    if let Some(t) = &s.tail {
        let through = t
            .applied_through
            .clone()
            .unwrap_or_else(|| "not yet (a shard is still buffering)".into());
        let _ = writeln!(o, "tail: applied through {through}");
        for x in &t.shards {
            let _ = writeln!(
                o,
                "  shard {}: {} lease {}, {}/{} chunks applied{}{}{}",
                x.shard,
                x.owner.as_deref().unwrap_or("free"),
                x.lease,
                x.applied,
                x.chunks,
                if x.live { ", live" } else { ", buffering" },
                x.lag_seconds
                    .map_or(String::new(), |l| format!(", lag {l:.1} s")),
                if x.done { ", done" } else { "" }
            );
        }
    }
    o
}

/// `rekey status --state dynamodb://…`.
pub(super) async fn status(c: &Common, cmd: Planned<FleetRef>) -> anyhow::Result<i32> {
    let clients = connect(c).await?;
    let snap = fleet::fleet_status(&clients, &cmd.options).await?;
    print(c, &fleet_status(&cmd.options, snap), fleet_text)?;
    Ok(exit::OK)
}
