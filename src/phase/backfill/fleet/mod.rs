//! `rekey worker`: one of N identical processes sharing one migration's
//! backfill through a DynamoDB control table ([`crate::state::fleet`]).
//!
//! Each worker takes Scan segments ("units"; with `--from-export`, the
//! export's data files: [`export`]) under the fleet's scheduler
//! ([`crate::phase::fleet`]: conditional takes, renewals on a heartbeat,
//! re-balancing, its share of the table's budgets), and reads, transforms,
//! claims and writes them page by page exactly as `rekey backfill` does —
//! the same [`Writer`], the same transform — except that a page's target
//! keys are claimed in the control table (so collisions between workers are
//! caught; one conditional write per item, skipped altogether when
//! [`crate::core::inverse::key_injective`] proves that no two source items
//! can share a target key) and its checkpoint and counters are committed there, in one
//! write conditioned on the lease (the fence). A worker that lost a lease
//! stops writing for its unit at once: it fences itself on its own clock
//! before every BatchWriteItem and every commit. Once every unit is done, it
//! records "backfill done" in the control table and exits.

mod export;
mod tail_mark;
mod unit;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::control::{ControlCalls, ControlTable};
use crate::aws::rate::Control;
use crate::aws::{AwsError, Clients};
use crate::core::plan::{Mode, Plan};
use crate::phase::error::{InputError, Stopped};
use crate::phase::fleet::{Beside, Budgets, Drive, Leasing, Shared, lead};
use crate::phase::progress::Progress;
use crate::phase::tail;
use crate::phase::tail::fleet::{FleetTailOptions, FleetTailReport};
use crate::state::StateDir;
use crate::state::fleet::{Counters, Fleet, FleetError, FleetRef, Lease, Snapshot, Unit};
use crate::state::rejects::RejectsFile;

use super::source::export_page;
use super::writer::Writer;
use super::{BackfillOptions, control, tables};

pub use tail_mark::{publish_final, publish_tail};

/// `rekey worker`.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Rates, page size, `--segments` (when this worker creates the
    /// migration), the rejects file (this worker's own).
    pub backfill: BackfillOptions,
    pub fleet: FleetRef,
    pub worker_id: String,
    /// How long a lease lives without a renewal.
    pub lease: Duration,
    /// Units held at once, at most.
    pub max_units: usize,
    /// `--tail`: this worker also takes stream shards (`phase::tail::fleet`),
    /// from before the backfill's first Scan, and runs on once it is done.
    pub tail: Option<FleetTailOptions>,
}

/// Segments of a migration created without `--segments`: enough for a
/// fleet (a unit is the smallest piece a worker can take over).
pub const DEFAULT_FLEET_SEGMENTS: u32 = 32;

#[derive(Debug, Clone, Serialize)]
pub struct WorkerReport {
    pub worker: String,
    pub state: String,
    /// The migration's units: Scan segments, or the export's data files.
    pub segments: u32,
    /// `--from-export`: the export the units read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<crate::state::fleet::export::ExportSource>,
    /// Units this worker finished.
    pub units_finished: Vec<u32>,
    /// Units this worker handed back to a worker holding fewer (re-balancing).
    pub units_handed_back: Vec<u32>,
    /// What this worker committed.
    pub this_worker: Counters,
    /// The whole migration's committed counters when this worker left.
    pub totals: Counters,
    pub backfill_done: bool,
    pub rejects_file: String,
    pub elapsed_seconds: f64,
    /// Whether this worker claimed target keys in the control table (false:
    /// the plan is proven collision-free, see [`claims_needed`]).
    pub claims: bool,
    /// Requests this worker sent to the control table.
    pub control_calls: ControlCalls,
    /// `--tail`: what this worker's share of the stream did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<FleetTailReport>,
}

/// A backfill unit: a Scan segment (`unit`) or an export's data file
/// (`export`), each read by its own file; neither knows the other.
impl Drive for unit::UnitDrive {
    fn run(
        self: Arc<Self>,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> futures::future::BoxFuture<'static, anyhow::Result<bool>> {
        Box::pin(async move {
            match &self.reads {
                unit::Reads::Scan {
                    segments,
                    page_limit,
                } => {
                    let (segments, page_limit) = (*segments, *page_limit);
                    self.run_segment(segments, page_limit, unit, l, stop).await
                }
                unit::Reads::Export { files, lines } => {
                    let (files, lines) = (files.clone(), *lines);
                    self.run_file(&files, lines, unit, l, stop).await
                }
            }
        })
    }
    fn scanned(&self) -> futures::future::BoxFuture<'_, u64> {
        Box::pin(async { self.this.lock().await.scanned })
    }
    fn all_done(&self) -> futures::future::BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(self.shared.fleet.mark_done().await?) })
    }
}

/// Why target keys must be claimed in the control table, or None when the
/// plan proves that a target key determines its source key, so that no two
/// source items — read by this worker or another — can collide. The claims
/// are one conditional write per item: most of the control table's requests.
pub fn why_claim(plan: &Plan) -> Option<String> {
    crate::core::inverse::key_injective(plan).err()
}

/// What the worker says of its claims, once, when it joins.
fn claims_note(why: Option<&str>) -> String {
    match why {
        None => "no target-key claims: each target key determines its source key, so no two \
                 items can collide (rekey check); the control table gets no write per item"
            .into(),
        Some(why) => format!(
            "target keys claimed in the control table, one conditional write per item: {why}"
        ),
    }
}

fn refuse_unsupported(plan: &Plan, opts: &WorkerOptions) -> anyhow::Result<()> {
    let b = &opts.backfill;
    let what = if plan.mode == Mode::InPlace {
        Some("an in-place plan")
    } else if b.via_import.is_some() {
        Some("--via-import")
    } else {
        None
    };
    match what {
        Some(w) => Err(InputError(format!(
            "rekey worker does not run {w} yet: it re-keys by Scan or from an export into an existing target (use rekey backfill)"
        ))
        .into()),
        None => Ok(()),
    }
}

/// Runs one worker until every unit is done (Ok, `backfill_done`) or `stop`
/// (its pages in flight committed, its leases released, then [`Stopped`]).
/// With `--tail`, the tail stops through a child of `stop`: a failed
/// backfill stops the tail alone.
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &WorkerOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<WorkerReport> {
    refuse_unsupported(plan, opts)?;
    let started = Instant::now();
    let (source, target) = tables(clients, plan, &opts.backfill).await?;
    let fleet = Fleet::new(
        ControlTable::new(clients, &opts.fleet.table),
        opts.fleet.clone(),
        &opts.worker_id,
    );
    let joined = export::join(clients, &fleet, plan, opts, progress).await?;
    let segments = joined.units;
    progress.note(&format!(
        "worker {} joined {} ({segments} units{})",
        opts.worker_id,
        opts.fleet.display(),
        match &joined.export {
            None => String::new(),
            Some((e, _)) => format!(": the data files of {}", e.describe()),
        }
    ));
    let why = why_claim(plan);
    progress.note(&claims_note(why.as_deref()));
    let full = control(&opts.backfill, &source, target.as_ref())?;
    let budgets = Budgets {
        read: full.read.rate().await,
        write: full.write.rate().await,
    };
    let control = Arc::new(Control::new(budgets.read, budgets.write));
    let shared = Shared::new(fleet, opts.lease);
    let writer = Arc::new(Writer::new(clients, plan, &opts.backfill, control.clone()));
    if let Some(parent) = opts
        .backfill
        .rejects
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        // The default is in the state directory, which a worker may not have yet.
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let rejects = RejectsFile::open(&opts.backfill.rejects)?;
    let drive = Arc::new(unit::UnitDrive {
        clients: clients.clone(),
        plan: Arc::new(plan.clone()),
        shared: shared.clone(),
        writer,
        control: control.clone(),
        rejects: Mutex::new(rejects),
        this: Mutex::new(Counters::default()),
        reads: match &joined.export {
            None => unit::Reads::Scan {
                segments,
                page_limit: opts.backfill.page_limit,
            },
            Some((_, files)) => unit::Reads::Export {
                files: files.clone(),
                lines: export_page(opts.backfill.page_limit),
            },
        },
        claims_at_once: opts.backfill.concurrency.max(1),
        claims: why.is_some(),
    });
    progress.start("worker", Some(source.item_count));
    let leasing = Leasing {
        max_units: opts.max_units,
        stop: stop.clone(),
    };
    let tail_stop = stop.child_token();
    // `--tail`: the stream's shards beside the units, under the same
    // heartbeat; the tail runs on once the backfill is done.
    let beside = opts.tail.as_ref().map(|t| Beside {
        run: tail::fleet::run(
            clients,
            plan,
            shared.fleet.clone(),
            shared.shards.clone(),
            control.clone(),
            t,
            &tail_stop,
        ),
        stop: tail_stop.clone(),
    });
    let (outcome, tail) = lead(
        &shared,
        drive.clone(),
        &leasing,
        control,
        budgets,
        progress,
        beside,
    )
    .await;
    progress.finish();
    let (finished, done) = outcome?;
    let tail = tail.transpose()?;
    let snap = shared.fleet.read().await?;
    let report = WorkerReport {
        worker: opts.worker_id.clone(),
        state: opts.fleet.display(),
        segments,
        export: joined.export.map(|(e, _)| e),
        units_finished: finished.into_iter().collect(),
        units_handed_back: shared.handed_back(),
        this_worker: *drive.this.lock().await,
        totals: snap.totals(),
        backfill_done: done,
        rejects_file: opts.backfill.rejects.display().to_string(),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        claims: why.is_some(),
        control_calls: shared.fleet.control.calls(),
        tail,
    };
    if !done || (opts.tail.is_some() && stop.is_cancelled()) {
        return Err(Stopped.into());
    }
    Ok(report)
}

/// `rekey tail --fleet`: waits until the fleet recorded "backfill done",
/// then marks the tail's state directory as a local backfill would, so the
/// tail applies what it buffered. Ends at the mark, or when `stop` is
/// cancelled.
pub async fn mirror_done(
    clients: &Clients,
    fleet: &FleetRef,
    state_dir: &StateDir,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let f = Fleet::open(clients, fleet, "tail");
    loop {
        match f.meta().await {
            Ok(Some(m)) if m.done_ms.is_some() => {
                state_dir.mark_backfill_done()?;
                return Ok(());
            }
            Ok(_) => {}
            // Not there yet (the first worker creates it): ask again.
            Err(FleetError::Aws(AwsError::NotFound { .. })) => {}
            Err(e) => return Err(e.into()),
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// `rekey status --state dynamodb://…`: what the control table holds.
pub async fn fleet_status(clients: &Clients, fleet: &FleetRef) -> anyhow::Result<Snapshot> {
    let f = Fleet::open(clients, fleet, "status");
    Ok(f.read().await?)
}
