//! `rekey worker`: one of N identical processes sharing one migration's
//! backfill through a DynamoDB control table ([`crate::state::fleet`]).
//!
//! Each worker takes Scan segments ("units"; with `--from-export`, the
//! export's data files: [`export`]) with conditional writes (the
//! KCL's lease pattern), renews them on a heartbeat, and reads, transforms,
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
//!
//! The budgets are the table's: each worker takes its share (÷ live
//! workers), re-read on every heartbeat.

mod export;
mod tail_mark;
mod unit;

use std::collections::BTreeSet;

use serde::Serialize;
use tokio::task::JoinSet;

use super::*;
use crate::aws::AwsError;
use crate::aws::control::{Cond, ControlCalls, ControlTable};
use crate::phase::tail::{self, fleet::FleetTailOptions, fleet::FleetTailReport};
use crate::state::fleet::held::Holdings;
use crate::state::fleet::lease::{self, BEATS_PER_LEASE, FENCE_FRACTION, Judgement, Observer};
use crate::state::fleet::shard::ShardKey;
use crate::state::fleet::{
    Counters, Fleet, FleetError, FleetRef, Lease, Snapshot, Unit, WorkerInfo, live_workers,
    passing, wall_ms,
};

pub use tail_mark::{publish_final, publish_tail};
pub use unit::LeaseLost;
pub(crate) use unit::{UnitScan, scan_unit};

/// `rekey worker`.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Rates, page size, `--segments` (when this worker creates the
    /// migration), the rejects file (this worker's own), the stop token.
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

/// What runs the units a fleet process leases: the backfill's pages
/// ([`unit::UnitDrive`]) or the verify's (`phase::verify::fleet`). The
/// leases, the heartbeat, the fence, the re-balancing and the release are
/// the same ([`lead`]).
pub(crate) trait Drive: Send + Sync + 'static {
    /// Runs `unit` under lease `l` until it is done (true), `stop` is
    /// cancelled (false: the page in flight committed), or the lease is
    /// lost ([`LeaseLost`]).
    fn run(
        self: Arc<Self>,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> futures::future::BoxFuture<'static, anyhow::Result<bool>>;
    /// Items this process has committed (its progress line).
    fn scanned(&self) -> futures::future::BoxFuture<'_, u64>;
    /// Every unit is done: record it (the backfill's "done", the verify's verdict).
    fn all_done(&self) -> futures::future::BoxFuture<'_, anyhow::Result<()>>;
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

/// How a fleet process leases units.
#[derive(Debug, Clone)]
pub(crate) struct Leasing {
    /// Units held at once, at most.
    pub max_units: usize,
    pub stop: CancellationToken,
}

/// What the worker's tasks share.
pub(crate) struct Shared {
    pub(crate) fleet: Fleet,
    /// The units held.
    units: Holdings<u32>,
    /// The stream shards held (`rekey worker --tail`): renewed by the same heartbeat.
    shards: Arc<Holdings<ShardKey>>,
    /// Units this worker handed back (re-balancing), in order.
    handed_back: std::sync::Mutex<Vec<u32>>,
}

impl Shared {
    pub(crate) fn new(fleet: Fleet, lease: Duration) -> Arc<Shared> {
        let started = Instant::now();
        Arc::new(Shared {
            fleet,
            units: Holdings::new(started, lease),
            shards: Arc::new(Holdings::new(started, lease)),
            handed_back: std::sync::Mutex::default(),
        })
    }

    fn now(&self) -> Duration {
        self.units.now()
    }

    /// The fence: may this worker still write for `unit`?
    pub(crate) fn may_write(&self, unit: u32, l: Lease) -> bool {
        self.units.may_write(&unit, l.lease)
    }

    fn held_units(&self) -> Vec<u32> {
        self.units.keys()
    }
}

/// The table's budgets, resolved; each worker takes its share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budgets {
    pub read: Option<f64>,
    pub write: Option<f64>,
}

fn share_of(total: Option<f64>, live: usize) -> Option<f64> {
    total.map(|t| t / live.max(1) as f64)
}

/// The other workers running with a heartbeat younger than `window`.
fn live_others<'a>(
    snap: &'a Snapshot,
    me: &'a str,
    window: Duration,
) -> impl Iterator<Item = &'a WorkerInfo> + 'a {
    let (fresh, now) = (window.as_millis() as i64, wall_ms());
    snap.workers
        .iter()
        .filter(move |w| w.id != me && w.state == "running" && now - w.heartbeat_ms < fresh)
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

/// Runs one worker until every unit is done (Ok, `backfill_done`) or a stop
/// (its pages in flight committed, its leases released, then [`Stopped`]).
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &WorkerOptions,
    progress: &Progress,
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
        stop: opts.backfill.stop.clone(),
    };
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
        ),
        stop: t.stop.clone(),
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
        units_handed_back: shared
            .handed_back
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default(),
        this_worker: *drive.this.lock().await,
        totals: snap.totals(),
        backfill_done: done,
        rejects_file: opts.backfill.rejects.display().to_string(),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        claims: why.is_some(),
        control_calls: shared.fleet.control.calls(),
        tail,
    };
    if !done || (opts.tail.is_some() && opts.backfill.stop.is_cancelled()) {
        return Err(Stopped.into());
    }
    Ok(report)
}

/// Leads this process's share of the fleet's units through `drive`: the
/// heartbeat (renewals, this process's record, the rate shares on
/// `control`), the scheduler (take, re-balance, release), and the last
/// record (done, stopped or failed). The units this process finished, and
/// whether every unit is done.
pub(crate) async fn lead<T>(
    shared: &Arc<Shared>,
    drive: Arc<dyn Drive>,
    leasing: &Leasing,
    control: Arc<Control>,
    budgets: Budgets,
    progress: &Progress,
    beside: Option<Beside<impl Future<Output = T>>>,
) -> (anyhow::Result<(BTreeSet<u32>, bool)>, Option<T>) {
    let beat_stop = CancellationToken::new();
    let beats = tokio::spawn(heartbeat(
        shared.clone(),
        control,
        budgets,
        beat_stop.clone(),
    ));
    let (outcome, beside) = match beside {
        None => (schedule(shared, &drive, leasing, progress).await, None),
        Some(b) => {
            let units = async {
                let r = schedule(shared, &drive, leasing, progress).await;
                if r.is_err() {
                    b.stop.cancel();
                }
                r
            };
            let (r, t) = tokio::join!(units, b.run);
            (r, Some(t))
        }
    };
    beat_stop.cancel();
    let _ = beats.await;
    // After the last heartbeat, which would say "running" again.
    let state = match &outcome {
        Ok((_, true)) => "done",
        Ok((_, false)) => "stopped",
        Err(_) => "failed",
    };
    if let Err(e) = shared.fleet.report_worker(&[], 0.0, 0.0, state).await {
        tracing::warn!(error = %e, "cannot report this worker");
    }
    (outcome, beside)
}

/// Work that runs beside a process's units under the same heartbeat (the
/// worker's `--tail`), and outlives them: stopped with `stop` if the units fail.
pub(crate) struct Beside<F> {
    pub run: F,
    pub stop: CancellationToken,
}

/// Renews every lease held, then reports this worker and re-reads the
/// number of live workers for the rate shares; every lease duration ÷
/// [`BEATS_PER_LEASE`].
async fn heartbeat(
    shared: Arc<Shared>,
    control: Arc<Control>,
    budgets: Budgets,
    stop: CancellationToken,
) {
    // A fixed beat: the time the renewals take is not added to the wait
    // before the next ones (under load it was, and holders fenced themselves).
    let mut beat = tokio::time::interval(shared.units.duration / BEATS_PER_LEASE);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut live_before = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = beat.tick() => {}
        }
        renew_all(&shared).await;
        let me = shared.fleet.worker.clone();
        let live = match shared.fleet.read_workers().await {
            Ok(snap) => live_workers(&snap, &me, shared.units.duration),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the control table");
                live_before.max(1)
            }
        };
        if live != live_before {
            // A new share: the table's budget over the workers alive now.
            control
                .set_ceilings(share_of(budgets.read, live), share_of(budgets.write, live))
                .await;
            tracing::info!(live, "rate share set");
            live_before = live;
        }
        let (w, r) = (
            share_of(budgets.write, live).unwrap_or(0.0),
            share_of(budgets.read, live).unwrap_or(0.0),
        );
        if let Err(e) = shared
            .fleet
            .report_worker(&shared.held_units(), w, r, "running")
            .await
        {
            tracing::warn!(error = %e, "cannot report this worker");
        }
    }
}

/// One renewal of each lease held, units and shards. A refused renewal
/// means the lease is gone: its unit (or shard) stops at once.
async fn renew_all(shared: &Shared) {
    futures::future::join(
        shared.units.renew_all(&shared.fleet),
        shared.shards.renew_all(&shared.fleet),
    )
    .await;
}

/// Takes units while there are some to take, runs each, and ends when every
/// unit is done (true) or on a stop (false). Returns the units this worker
/// finished.
async fn schedule(
    shared: &Arc<Shared>,
    drive: &Arc<dyn Drive>,
    opts: &Leasing,
    progress: &Progress,
) -> anyhow::Result<(BTreeSet<u32>, bool)> {
    let stop = &opts.stop;
    let mut observer = Observer::default();
    let mut tasks: JoinSet<(u32, anyhow::Result<bool>)> = JoinSet::new();
    let mut finished = BTreeSet::new();
    let every = shared.units.duration / BEATS_PER_LEASE;
    let result = loop {
        if stop.is_cancelled() {
            break Ok(false);
        }
        match step(shared, drive, opts, progress, &mut observer, &mut tasks).await {
            Ok(true) => break Ok(true),
            Ok(false) => {}
            // Asked again at the next beat; the fence and the leases hold meanwhile.
            Err(e) if passing(&e) => tracing::warn!(error = %e, "control table: trying again"),
            Err(e) => break Err(e),
        }
        let ended = tokio::select! {
            () = stop.cancelled() => None,
            () = tokio::time::sleep(every) => None,
            Some(r) = tasks.join_next() => Some(r),
        };
        if let Some(r) = ended
            && let Err(e) = unit_ended(shared, r, &mut finished).await
        {
            break Err(e);
        }
    };
    // Pages in flight finish and commit; then what is held goes back.
    shared.units.cancel_all();
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = unit_ended(shared, r, &mut finished).await
            && result.is_ok()
        {
            return Err(e);
        }
    }
    shared.units.release_all(&shared.fleet).await;
    result.map(|done| (finished, done))
}

/// One look at the migration: true once every unit is done (and recorded
/// so), else the units this worker should take, taken.
async fn step(
    shared: &Arc<Shared>,
    drive: &Arc<dyn Drive>,
    opts: &Leasing,
    progress: &Progress,
    observer: &mut Observer,
    tasks: &mut JoinSet<(u32, anyhow::Result<bool>)>,
) -> anyhow::Result<bool> {
    let snap = shared.fleet.read().await?;
    report_progress(shared, drive, &snap, progress).await;
    if snap.all_done() {
        drive.all_done().await?;
        return Ok(true);
    }
    take_units(shared, drive, opts, &snap, observer, tasks).await?;
    rebalance(shared, opts, &snap);
    Ok(false)
}

/// Hands one unit back when this worker holds more than its share and
/// another live worker (a heartbeat within a lease) holds fewer
/// ([`lease::hand_back`]): the unit stops after its page in flight commits,
/// then its lease is released ([`unit_ended`]) and the other worker takes it
/// from that checkpoint. The unit handed back is the one with the fewest
/// pages committed: the most work moves.
fn rebalance(shared: &Shared, opts: &Leasing, snap: &Snapshot) {
    if shared.units.handing_back(None) || opts.stop.is_cancelled() {
        return;
    }
    let me = shared.fleet.worker.as_str();
    let held = shared.held_units();
    let open = |u: &&Unit| !u.done;
    let holds = |id: &str| {
        snap.units
            .iter()
            .filter(open)
            .filter(|u| u.owner.as_deref() == Some(id))
            .count()
    };
    let others: Vec<&WorkerInfo> = live_others(snap, me, shared.units.duration).collect();
    let balance = lease::Balance {
        held: held.len(),
        open: snap.units.iter().filter(open).count(),
        live: others.len() + 1,
        fewest_other: others.iter().map(|w| holds(&w.id)).min(),
        free: snap
            .units
            .iter()
            .filter(open)
            .filter(|u| u.owner.is_none())
            .count(),
        max: opts.max_units,
    };
    if !lease::hand_back(balance) {
        return;
    }
    let Some(unit) = snap
        .units
        .iter()
        .filter(|u| held.contains(&u.n) && !u.done)
        .min_by_key(|u| (u.page, std::cmp::Reverse(u.n)))
    else {
        return;
    };
    if shared.units.hand_back(&unit.n) {
        tracing::info!(
            unit = unit.n,
            ?balance,
            "handing the unit back at its next page boundary"
        );
    }
}

/// The fleet's committed items, and this worker's units.
async fn report_progress(
    shared: &Shared,
    drive: &Arc<dyn Drive>,
    snap: &Snapshot,
    progress: &Progress,
) {
    let held = shared.held_units();
    let done = snap.units.iter().filter(|u| u.done).count();
    let mine = drive.scanned().await;
    progress.status(
        format!(
            "fleet: {done}/{} units done; this worker: units {held:?}, {mine} items",
            snap.units.len()
        ),
        serde_json::json!({
            "units": snap.units.len(),
            "units_done": done,
            "held": held,
            "this_worker_scanned": mine,
        }),
    );
    progress.update(snap.totals().scanned, 0.0);
}

/// Units to take now: this worker's share of those not done, free ones
/// first, then those whose lease expired (judged on this worker's clock).
async fn take_units(
    shared: &Arc<Shared>,
    drive: &Arc<dyn Drive>,
    opts: &Leasing,
    snap: &Snapshot,
    observer: &mut Observer,
    tasks: &mut JoinSet<(u32, anyhow::Result<bool>)>,
) -> anyhow::Result<()> {
    let now = shared.now();
    let me = shared.fleet.worker.clone();
    let open = snap.units.iter().filter(|u| !u.done).count();
    let want = lease::share(
        open,
        live_workers(snap, &me, shared.units.duration),
        opts.max_units,
    );
    let mut free = Vec::new();
    let mut expired = Vec::new();
    let held = shared.held_units();
    for u in &snap.units {
        let seen = observer.observe(u, now);
        // A unit this worker let go (its fence closed) is judged as anyone's.
        let who = if held.contains(&u.n) { me.as_str() } else { "" };
        match lease::judge(u, who, &seen, now, shared.units.duration) {
            Judgement::Free { .. } => free.push(u),
            Judgement::Expired { beat, .. } => expired.push((u, beat)),
            _ => {}
        }
    }
    // Workers start at different units so that they rarely race for one.
    let offset = (md5_u64(&me) % snap.units.len().max(1) as u64) as usize;
    free.sort_by_key(|u| (u.n as usize + snap.units.len() - offset) % snap.units.len().max(1));
    let candidates = free
        .into_iter()
        .map(|u| (u, None))
        .chain(expired.into_iter().map(|(u, b)| (u, Some(b))));
    for (u, beat) in candidates {
        if shared.held_units().len() >= want || opts.stop.is_cancelled() {
            break;
        }
        let sent = shared.now();
        let Some(l) = shared
            .fleet
            .take(u, beat, shared.units.duration.mul_f64(FENCE_FRACTION))
            .await?
        else {
            continue; // another worker was first
        };
        tracing::info!(
            unit = u.n,
            lease = l.lease,
            page = u.page,
            taken_over = beat.is_some(),
            "unit taken"
        );
        let token = opts.stop.child_token();
        shared.units.insert(u.n, l.lease, sent, token.clone());
        let (drive, unit) = (drive.clone(), u.clone());
        tasks.spawn(async move { (unit.n, drive.run(unit, l, token).await) });
    }
    Ok(())
}

fn md5_u64(s: &str) -> u64 {
    use md5::{Digest, Md5};
    let d = Md5::digest(s.as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// A unit's task ended: done, stopped, lost (not an error: another worker
/// goes on from its checkpoint), or failed (the worker stops).
async fn unit_ended(
    shared: &Shared,
    r: Result<(u32, anyhow::Result<bool>), tokio::task::JoinError>,
    finished: &mut BTreeSet<u32>,
) -> anyhow::Result<()> {
    let (unit, r) = match r {
        Ok(x) => x,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => return Ok(()),
    };
    match r {
        Ok(true) => {
            shared.units.remove(&unit);
            finished.insert(unit);
            tracing::info!(unit, "unit done");
            Ok(())
        }
        // Handed back (re-balancing): its page in flight committed, released now.
        Ok(false) if shared.units.handing_back(Some(&unit)) => {
            if let Some(x) = shared.units.remove(&unit) {
                let r = shared
                    .fleet
                    .release(Lease {
                        unit,
                        lease: x.lease,
                    })
                    .await;
                tracing::info!(unit, released = ?r.ok(), "unit handed back");
                if let Ok(mut v) = shared.handed_back.lock() {
                    v.push(unit);
                }
            }
            Ok(())
        }
        // Stopped: still held, released once every unit has stopped.
        Ok(false) => Ok(()),
        Err(e) if unit::lost(&e) || passing(&e) => {
            tracing::warn!(unit, error = %e, "unit given up: its lease is gone, or a call failed");
            // Still ours if only the fence closed: hand it over at once.
            shared.units.give_back(&shared.fleet, &unit).await;
            Ok(())
        }
        Err(e) => Err(e.context(format!("unit {unit}"))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fleet::WorkerInfo;

    fn worker(id: &str, state: &str, age_ms: i64) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            heartbeat_ms: wall_ms() - age_ms,
            units: vec![],
            write_rate: 0.0,
            read_rate: 0.0,
            state: state.into(),
        }
    }

    #[test]
    fn the_budget_is_shared_by_the_workers_with_a_fresh_heartbeat() {
        let snap = Snapshot {
            workers: vec![
                worker("me", "running", 0),
                worker("b", "running", 1_000),
                worker("c", "running", 100_000),
                worker("d", "stopped", 0),
                worker("e", "done", 0),
            ],
            ..Default::default()
        };
        let live = live_workers(&snap, "me", Duration::from_secs(10));
        assert_eq!(live, 2, "me and b; c is silent, d and e left");
        assert_eq!(share_of(Some(1000.0), live), Some(500.0));
        assert_eq!(share_of(None, live), None);
        assert_eq!(
            live_workers(&Snapshot::default(), "me", Duration::from_secs(10)),
            1
        );
    }

    #[test]
    fn throttles_and_transient_failures_pass_a_lost_lease_is_its_own_case() {
        let endpoint = Arc::new(crate::aws::Endpoint {
            service: crate::aws::Service::DynamoDb,
            url: "http://x".into(),
            source: crate::aws::Source::Flag,
        });
        let transient = AwsError::Unreachable {
            endpoint,
            detail: "reset".into(),
        };
        let e = anyhow::Error::new(FleetError::Aws(transient)).context("commit");
        assert!(passing(&e));
        let schema = AwsError::Schema {
            table: "t".into(),
            detail: "x".into(),
        };
        assert!(!passing(&anyhow::Error::new(FleetError::Aws(schema))));
        let lost = anyhow::Error::new(LeaseLost { unit: 1, lease: 2 });
        assert!(unit::lost(&lost) && !passing(&lost));
        assert!(unit::lost(&anyhow::Error::new(Fenced).context("write")));
    }
}
