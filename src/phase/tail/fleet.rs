//! The fleet's tail (`rekey worker --tail`): the source's stream shared by N
//! workers, one lease per shard, under the same lease protocol, heartbeat
//! and fence as the backfill's Scan segments ([`crate::state::fleet::shard`]).
//!
//! Why inside `rekey worker`: an operator runs one kind of fleet process,
//! which backfills and tails; the tail must read the stream from before the
//! backfill's first Scan, and a worker that joins later takes over whatever
//! shard or segment is free. The single-machine `rekey tail` is unchanged.
//!
//! A holder buffers its shard's records as deflated chunks in the control
//! table while the fleet's backfill is not done (a worker's disk is not
//! durable for a fleet), applies its chunks in order once it is and once the
//! parent shard is done, then applies records as it reads them. Every write
//! to the target and every commit is fenced; a refused commit or put means
//! the lease is gone and the shard stops at once.

use std::sync::Arc;
use std::sync::Mutex as SyncMutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use super::apply::{Fenced, apply_fenced};
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{Change, Flow, change_of, source_stream};
use crate::aws::Clients;
use crate::aws::control::Cond;
use crate::aws::rate::Control;
use crate::aws::streams::{self, ReadError, Start, now_secs};
use crate::core::plan::Plan;
use crate::state::fleet::held::Holdings;
use crate::state::fleet::lease::{self, BEATS_PER_LEASE, FENCE_FRACTION, Judgement, Observer};
use crate::state::fleet::shard::{
    self as shard_state, CHUNK_LIMIT, Covers, ShardCheckpoint, ShardKey, ShardUnit, Step,
};
use crate::state::fleet::{Fleet, TailMark, live_workers, passing, wall_ms};
use crate::state::rejects::RejectsFile;

/// How a worker tails.
#[derive(Debug, Clone)]
pub struct FleetTailOptions {
    /// Shards held at once, at most.
    pub max_shards: usize,
    /// Exit once the fleet's backfill is done, every shard's buffer applied
    /// and no shard has moved for this long (None: run until stopped).
    pub exit_when_idle: Option<Duration>,
    /// Between reads of a shard that had nothing new.
    pub poll: Duration,
    /// This worker's tail rejects.
    pub rejects: PathBuf,
    /// Its probes' rounds in flight (crate::state::markers).
    pub markers: crate::state::markers::Ledger,
}

/// What this worker's tail did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetTailReport {
    pub records: u64,
    pub buffered: u64,
    pub chunks_written: u64,
    pub chunks_applied: u64,
    pub puts: u64,
    pub deletes: u64,
    pub rejected: u64,
    /// Shards this worker finished (read to their end, everything applied).
    pub shards_done: Vec<String>,
    pub shards: usize,
}

/// What the scheduler last read, for the holders: no extra requests.
#[derive(Default)]
struct Seen {
    backfill_done: bool,
    /// `rekey finish --state` drained the fleet's tail a last time: stop.
    finished: bool,
    shards: Vec<ShardUnit>,
}

/// What every shard holder of this worker shares.
struct Ctx {
    clients: Clients,
    plan: Arc<Plan>,
    fleet: Fleet,
    held: Arc<Holdings<ShardKey>>,
    control: Arc<Control>,
    stream: String,
    poll: Duration,
    seen: SyncMutex<Seen>,
    rejects: Mutex<RejectsFile>,
    report: Mutex<FleetTailReport>,
    /// When this worker last probed (None: it never probes, see
    /// [`publish_through`]).
    probed: Option<SyncMutex<Option<Instant>>>,
    markers: crate::state::markers::Ledger,
}

/// Runs this worker's share of the tail until `stop` or, with
/// `exit_when_idle`, until the fleet's tail is caught up and quiet. Each
/// shard holder stops through a child of `stop` (and alone, when its lease
/// is lost).
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    fleet: Fleet,
    held: Arc<Holdings<ShardKey>>,
    control: Arc<Control>,
    opts: &FleetTailOptions,
    stop: &CancellationToken,
) -> anyhow::Result<FleetTailReport> {
    let info = clients.describe_table(&plan.source_table).await?;
    info.check_key(&plan.source_key, "source")?;
    let stream = source_stream(&info, Flow::Forward)?;
    let ctx = Arc::new(Ctx {
        clients: clients.clone(),
        plan: Arc::new(plan.clone()),
        fleet,
        held,
        control,
        stream,
        poll: opts.poll,
        seen: SyncMutex::new(Seen::default()),
        rejects: Mutex::new(RejectsFile::open(&opts.rejects)?),
        report: Mutex::new(FleetTailReport::default()),
        // A worker that exits when idle does not probe: its probes would be
        // traffic, and it would never be idle.
        probed: opts.exit_when_idle.is_none().then(|| SyncMutex::new(None)),
        markers: opts.markers.clone(),
    });
    let mut tasks: JoinSet<(String, anyhow::Result<bool>)> = JoinSet::new();
    let result = schedule(&ctx, opts, stop, &mut tasks).await;
    ctx.held.cancel_all();
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = ended(&ctx, r).await
            && result.is_ok()
        {
            return Err(e);
        }
    }
    ctx.held.release_all(&ctx.fleet).await;
    ctx.rejects.lock().await.flush_len()?;
    result?;
    let report = ctx.report.lock().await.clone();
    Ok(report)
}

/// Every beat: list the stream, create the shards' units, take this
/// worker's share of those that may be taken, and see whether to exit.
async fn schedule(
    ctx: &Arc<Ctx>,
    opts: &FleetTailOptions,
    stop: &CancellationToken,
    tasks: &mut JoinSet<(String, anyhow::Result<bool>)>,
) -> anyhow::Result<()> {
    let every = ctx.held.duration / BEATS_PER_LEASE;
    let mut observer: Observer<String> = Observer::default();
    let mut quiet = Quiet::default();
    loop {
        if stop.is_cancelled() {
            return Ok(());
        }
        match turn(ctx, opts, stop, &mut observer, tasks).await {
            Ok(_) if ctx.seen.lock().is_ok_and(|s| s.finished) => {
                tracing::info!("the migration is finished (rekey finish): the tail stops");
                return Ok(());
            }
            Ok(shards) => {
                if let Some(idle) = opts.exit_when_idle
                    && quiet.idle_for(&shards, ctx.held.now()) >= idle
                {
                    return Ok(());
                }
            }
            Err(e) if passing(&e) => tracing::warn!(error = %e, "fleet tail: trying again"),
            Err(e) => return Err(e),
        }
        let ended_now = tokio::select! {
            () = stop.cancelled() => None,
            () = tokio::time::sleep(every) => None,
            Some(r) = tasks.join_next() => Some(r),
        };
        if let Some(r) = ended_now {
            ended(ctx, r).await?;
        }
    }
}

/// One look: returns the shards' units when the fleet's tail is caught up
/// (the backfill done, every shard live with its buffer applied, none free
/// or expired), else an empty list.
async fn turn(
    ctx: &Arc<Ctx>,
    opts: &FleetTailOptions,
    stop: &CancellationToken,
    observer: &mut Observer<String>,
    tasks: &mut JoinSet<(String, anyhow::Result<bool>)>,
) -> anyhow::Result<Vec<ShardUnit>> {
    let listed = streams::describe_shards(&ctx.clients, &ctx.stream).await?;
    let mut shards = ctx.fleet.read_shards().await?;
    let missing: Vec<_> = listed
        .iter()
        .filter(|l| !shards.iter().any(|s| s.id == l.id))
        .collect();
    if !missing.is_empty() {
        for l in missing {
            ctx.fleet.create_shard(l).await?;
        }
        shards = ctx.fleet.read_shards().await?;
    }
    let snap = ctx.fleet.read_workers().await?;
    let meta = ctx.fleet.meta().await?;
    let backfill_done = meta.as_ref().is_some_and(|m| m.done_ms.is_some());
    let finished = meta.as_ref().is_some_and(|m| m.finished_ms.is_some());
    if let Ok(mut seen) = ctx.seen.lock() {
        seen.backfill_done = backfill_done;
        seen.finished = finished;
        seen.shards = shards.clone();
    }
    if finished {
        return Ok(Vec::new());
    }
    ctx.report.lock().await.shards = shards.len();
    publish_through(ctx, &shards).await?;
    let now = ctx.held.now();
    let me = ctx.fleet.worker.clone();
    let takeable = shard_state::may_take(&shards);
    let open = takeable.len();
    let want = lease::share(
        open,
        live_workers(&snap, &me, ctx.held.duration),
        opts.max_shards,
    );
    let mine = ctx.held.keys();
    let mut candidates = Vec::new();
    let mut unsettled = false;
    for u in &shards {
        let seen = observer.observe(u, now);
        let who = if mine.contains(&ShardKey(u.id.clone())) {
            me.as_str()
        } else {
            ""
        };
        match lease::judge(u, who, &seen, now, ctx.held.duration) {
            Judgement::Free { .. } if takeable.contains(&u.id) => candidates.push((u, None)),
            Judgement::Expired { beat, .. } if takeable.contains(&u.id) => {
                candidates.push((u, Some(beat)))
            }
            Judgement::Done => continue,
            Judgement::Free { .. } | Judgement::Expired { .. } => unsettled = true,
            Judgement::Held | Judgement::Mine => {}
        }
        unsettled |= !u.cp.live || u.cp.applied < u.cp.chunks;
    }
    unsettled |= !candidates.is_empty() || !backfill_done || shards.is_empty();
    // A held shard waiting on its parent does not count against the share:
    // else the holders of children could leave a dead holder's parent
    // untaken, and wait on it forever.
    let mut busy = mine
        .iter()
        .filter(|k| shard_state::may_apply(&shards, &k.0))
        .count();
    for (u, beat) in candidates {
        if busy >= want || stop.is_cancelled() {
            break;
        }
        if shard_state::unheld_past_retention(u, wall_ms()) {
            anyhow::bail!(
                "shard {}: no worker held it for longer than the stream's 24-hour retention, \
                 so records may have been trimmed unread; a new backfill is needed (a new \
                 migration id)",
                u.id
            );
        }
        let sent = ctx.held.now();
        let fence = ctx.held.duration.mul_f64(FENCE_FRACTION);
        let Some(l) = ctx.fleet.take_shard(u, beat, fence).await? else {
            continue; // another worker was first
        };
        tracing::info!(shard = %u.id, lease = l, taken_over = beat.is_some(), "shard taken");
        busy += usize::from(shard_state::may_apply(&shards, &u.id));
        let token = stop.child_token();
        ctx.held
            .insert(ShardKey(u.id.clone()), l, sent, token.clone());
        let (c, unit) = (ctx.clone(), u.clone());
        tasks.spawn(
            async move { (unit.id.clone(), c.hold(unit, l, token).await) }.in_current_span(),
        );
    }
    Ok(if unsettled { Vec::new() } else { shards })
}

/// The fleet's `TAIL` item, which `verify --state` waits on, from the
/// shards' committed progress ([`shard_state::fleet_through`]): published each
/// beat by every worker that holds a shard. Each value is a lower bound when
/// it is read and stays one, so whichever write lands last is true.
async fn publish_through(ctx: &Ctx, shards: &[ShardUnit]) -> anyhow::Result<()> {
    if ctx.held.keys().is_empty() {
        return Ok(());
    }
    let now = streams::now_secs();
    let (_, through) = shard_state::fleet_through(shards, now);
    let mark = TailMark {
        applied_through_ms: through.map(|t| (t * 1000.0) as i64),
        updated_ms: (now * 1000.0) as i64,
        stopped: false,
    };
    ctx.fleet.publish_tail(&mark).await?;
    probe(ctx, shards, through, now).await
}

/// As the single tail does (crate::phase::tail): when the fleet's proof is
/// over 2 s old, a round of probe markers, so that quiet shards show a
/// record and the lag gate and verify's wait see the fleet caught up.
async fn probe(
    ctx: &Ctx,
    shards: &[ShardUnit],
    through: Option<f64>,
    now: f64,
) -> anyhow::Result<()> {
    let Some(probed) = &ctx.probed else {
        return Ok(());
    };
    let key = &ctx.plan.source_key;
    if key.partition_key.ty == crate::core::value::ScalarType::N
        || through.is_some_and(|t| now - t < super::PROBE_AFTER_SECONDS)
    {
        return Ok(());
    }
    {
        let mut last = probed.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed().as_secs_f64() < super::PROBE_AFTER_SECONDS) {
            return Ok(());
        }
        *last = Some(Instant::now());
    }
    let id = crate::phase::markers::new_probe_id();
    let markers = crate::phase::markers::Markers {
        clients: &ctx.clients,
        key,
        table: &ctx.plan.source_table,
        id: &id,
        started_at: now,
        ledger: &ctx.markers,
    };
    let open = shards.iter().filter(|u| !u.cp.done).count();
    markers
        .round(0, crate::phase::markers::round_size(open))
        .await?;
    Ok(())
}

/// How long the fleet's tail has been caught up with nothing moving.
#[derive(Default)]
struct Quiet {
    last: Vec<(String, Option<String>, u64)>,
    since: Duration,
}

impl Quiet {
    /// `shards` empty: not caught up (the wait starts again).
    fn idle_for(&mut self, shards: &[ShardUnit], now: Duration) -> Duration {
        let sig: Vec<_> = shards
            .iter()
            .map(|s| (s.id.clone(), s.cp.seq.clone(), s.cp.applied))
            .collect();
        if shards.is_empty() || sig != self.last {
            self.last = sig;
            self.since = now;
        }
        now.saturating_sub(self.since)
    }
}

/// The lease on a shard is gone: it stops, another worker resumes it.
#[derive(Debug, thiserror::Error)]
#[error("shard {shard}: lease {lease} is no longer this worker's")]
pub struct ShardLost {
    pub shard: String,
    pub lease: u64,
}

/// A holder's task ended: done, stopped, lost or passing (given back), or failed.
async fn ended(
    ctx: &Ctx,
    r: Result<(String, anyhow::Result<bool>), tokio::task::JoinError>,
) -> anyhow::Result<()> {
    let (id, r) = match r {
        Ok(x) => x,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => return Ok(()),
    };
    let key = ShardKey(id.clone());
    match r {
        Ok(true) => {
            ctx.held.give_back(&ctx.fleet, &key).await;
            ctx.report.lock().await.shards_done.push(id);
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(e) if e.chain().any(|c| c.is::<ShardLost>() || c.is::<Fenced>()) || passing(&e) => {
            tracing::warn!(shard = %id, error = %e, "shard given up: its lease is gone, or a call failed");
            ctx.held.give_back(&ctx.fleet, &key).await;
            Ok(())
        }
        Err(e) => Err(e.context(format!("shard {id}"))),
    }
}

impl Ctx {
    fn lost(&self, u: &ShardUnit, lease: u64) -> anyhow::Error {
        ShardLost {
            shard: u.id.clone(),
            lease,
        }
        .into()
    }

    fn fence(&self, u: &ShardUnit, lease: u64) -> anyhow::Result<()> {
        if self.held.may_write(&ShardKey(u.id.clone()), lease) {
            Ok(())
        } else {
            Err(self.lost(u, lease))
        }
    }

    /// What the scheduler last read: the fleet's backfill done, the parent done.
    fn gates(&self, id: &str) -> (bool, bool) {
        self.seen.lock().map_or((false, false), |s| {
            (s.backfill_done, shard_state::may_apply(&s.shards, id))
        })
    }

    /// Holds shard `u` under `lease` until it is done (true), `stop` (false)
    /// or the lease is lost ([`ShardLost`]).
    async fn hold(
        self: Arc<Self>,
        mut u: ShardUnit,
        lease: u64,
        stop: CancellationToken,
    ) -> anyhow::Result<bool> {
        if !u.cp.done {
            // A holder that died (or failed) between writing chunk n and
            // committing it left chunk n uncommitted. A holder that buffers
            // rewrites it; one that goes live never would, so it is cleared
            // before this lease writes anything. Earlier holders stopped
            // writing a fence before this lease was granted.
            self.fleet.delete_chunk(&u.id, u.cp.chunks).await?;
        }
        let mut iterator: Option<String> = None;
        loop {
            if stop.is_cancelled() {
                return Ok(false);
            }
            let (backfill_done, parent_done) = self.gates(&u.id);
            let step = shard_state::step(&u, backfill_done, parent_done);
            let idle = match step {
                Step::Done => return Ok(true),
                Step::Finish => {
                    let mut c = u.cp.clone();
                    c.live = true;
                    c.done = true;
                    self.commit(&mut u, lease, c).await?;
                    tracing::info!(shard = %u.id, "shard done");
                    return Ok(true);
                }
                Step::Wait => true,
                // A stop abandons the chunk or read in hand wherever it
                // waits: uncommitted, it is done again under the next lease,
                // as after a holder's death (see above).
                Step::Apply(k) => {
                    let apply = self.apply_chunk(&mut u, lease, k);
                    match stop.run_until_cancelled(apply).await {
                        None => return Ok(false),
                        Some(r) => r?,
                    }
                    false
                }
                Step::Buffer | Step::Live => {
                    let live = step == Step::Live;
                    let read = self.read(&mut u, lease, live, &mut iterator);
                    match stop.run_until_cancelled(read).await {
                        None => return Ok(false),
                        Some(r) => !r?,
                    }
                }
            };
            if idle {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(self.poll) => {}
                }
            }
        }
    }

    /// Commits `c` (fenced); refused: the lease is gone.
    async fn commit(
        &self,
        u: &mut ShardUnit,
        lease: u64,
        c: ShardCheckpoint,
    ) -> anyhow::Result<()> {
        self.commit_covering(u, lease, c, Covers::default()).await
    }

    /// [`Ctx::commit`] of writes to the target, and of the drain barriers
    /// whose markers were among them (`covers`).
    async fn commit_covering(
        &self,
        u: &mut ShardUnit,
        lease: u64,
        c: ShardCheckpoint,
        covers: Covers,
    ) -> anyhow::Result<()> {
        self.fence(u, lease)?;
        let was = u.cp.clone();
        if self
            .fleet
            .commit_shard(&u.id, lease, &was, &c, &covers)
            .await?
            == Cond::Refused
        {
            return Err(self.lost(u, lease));
        }
        if !covers.observed.is_empty() {
            tracing::info!(shard = %u.id, barriers = ?covers.observed, "drain barrier observed");
        }
        u.cp = c;
        u.barriers.extend(covers.observed);
        Ok(())
    }

    /// The commit's coverage of applied `changes`: the drain markers among
    /// them, and the rejects their application made.
    fn applied(&self, changes: &[Change], rejected: u64) -> Covers {
        Covers {
            applies: true,
            observed: {
                let mut seen: Vec<(String, f64)> = Vec::new();
                for (m, at) in super::apply::markers(&self.plan.source_key, changes) {
                    if !crate::phase::markers::is_probe(&m.barrier)
                        && !seen.iter().any(|(id, _)| *id == m.barrier)
                    {
                        seen.push((m.barrier, at));
                    }
                }
                seen
            },
            rejected,
        }
    }

    /// The shard's proof once `changes` are applied: the newest of `was`
    /// and what they prove ([`super::change_evidence`]).
    fn proven(&self, changes: &[Change], was: Option<f64>) -> Option<f64> {
        changes
            .iter()
            .map(|x| super::change_evidence(&self.plan.source_key, x))
            .chain(was)
            .reduce(f64::max)
    }

    /// Applies chunk `k`, moves the cursor past it, then deletes it.
    async fn apply_chunk(&self, u: &mut ShardUnit, lease: u64, k: u64) -> anyhow::Result<()> {
        let bytes = self.fleet.get_chunk(&u.id, k).await?;
        let records: Vec<(String, Change)> = shard_state::unpack(&bytes)
            .map_err(|e| anyhow::anyhow!("shard {} chunk {k}: {e}", u.id))?;
        let changes: Vec<Change> = records.into_iter().map(|(_, c)| c).collect();
        let rejected = self.apply(u, lease, &changes).await?;
        let mut c = u.cp.clone();
        c.applied = k + 1;
        c.record_at = self.proven(&changes, c.record_at);
        let covers = self.applied(&changes, rejected);
        self.commit_covering(u, lease, c, covers).await?;
        self.report.lock().await.chunks_applied += 1;
        tracing::info!(shard = %u.id, chunk = k, records = changes.len(), "buffer chunk applied");
        if let Err(e) = self.fleet.delete_chunk(&u.id, k).await {
            // Below the cursor: never read again, only left behind.
            tracing::warn!(shard = %u.id, chunk = k, error = %e, "cannot delete an applied chunk");
        }
        Ok(())
    }

    /// Applies `changes` under the fence; counts and rejects. The rejects
    /// made, which the commit covering them counts in the shard's item.
    async fn apply(&self, u: &ShardUnit, lease: u64, changes: &[Change]) -> anyhow::Result<u64> {
        self.fence(u, lease)?;
        let key = ShardKey(u.id.clone());
        let held = self.held.clone();
        let fence = move || held.may_write(&key, lease);
        let t = apply_fenced(&self.clients, &self.plan, &self.control, changes, &fence).await?;
        let mut r = self.report.lock().await;
        r.puts += t.puts;
        r.deletes += t.deletes;
        r.rejected += t.rejects.len() as u64;
        let mut file = self.rejects.lock().await;
        for (item, reason) in &t.rejects {
            file.write(item, &format!("tail: {reason}"))?;
        }
        file.flush_len()?;
        Ok(t.rejects.len() as u64)
    }

    /// One GetRecords of the shard: buffered as chunks, or applied (`live`),
    /// then committed. True when records came.
    async fn read(
        &self,
        u: &mut ShardUnit,
        lease: u64,
        live: bool,
        iterator: &mut Option<String>,
    ) -> anyhow::Result<bool> {
        let it = match iterator.take() {
            Some(i) => i,
            None => {
                let start = u.cp.seq.as_deref().map_or(Start::TrimHorizon, Start::After);
                streams::shard_iterator(&self.clients, &self.stream, &u.id, start).await?
            }
        };
        let read_at = now_secs();
        let page = match streams::get_records(&self.clients, &self.stream, &it, streams::PAGE).await
        {
            Ok(p) => p,
            Err(ReadError::Expired) => return Ok(true),
            Err(ReadError::Trimmed) => anyhow::bail!(
                "shard {}: records were trimmed from the stream before the fleet read them \
                 (TrimmedDataAccessException); changes were lost and a new backfill is needed",
                u.id
            ),
            Err(ReadError::Aws(e)) => return Err(e.into()),
        };
        let finished = page.next.is_none();
        *iterator = page.next.clone();
        let records: Vec<(String, Change)> = page.records.into_iter().map(change_of).collect();
        self.report.lock().await.records += records.len() as u64;
        let got = !records.is_empty();
        if live {
            self.read_live(u, lease, records, finished, read_at).await?;
        } else {
            self.buffer(u, lease, records, finished).await?;
        }
        Ok(got)
    }

    async fn read_live(
        &self,
        u: &mut ShardUnit,
        lease: u64,
        records: Vec<(String, Change)>,
        finished: bool,
        read_at: f64,
    ) -> anyhow::Result<()> {
        let mut c = u.cp.clone();
        c.live = true;
        c.finished = finished;
        let mut covers = Covers::default();
        if let Some((seq, _)) = records.last() {
            c.seq = Some(seq.clone());
            let changes: Vec<Change> = records.into_iter().map(|(_, c)| c).collect();
            let rejected = self.apply(u, lease, &changes).await?;
            c.record_at = self.proven(&changes, c.record_at);
            covers = self.applied(&changes, rejected);
        } else {
            // An empty read: said at most once a beat (it costs a write).
            let beat = self.held.duration.as_secs_f64() / f64::from(BEATS_PER_LEASE);
            let said = u.cp.empty_read_at.unwrap_or(0.0);
            if u.cp.live && !finished && read_at - said < beat {
                return Ok(());
            }
            c.empty_read_at = Some(read_at);
            // At its end, everything read applied (live): a drain barrier
            // counts these ([`crate::phase::barrier::fleet`]).
            c.drains = u.cp.drains + 1;
        }
        self.commit_covering(u, lease, c, covers).await
    }

    /// Buffers the records as chunks, each written then committed.
    async fn buffer(
        &self,
        u: &mut ShardUnit,
        lease: u64,
        records: Vec<(String, Change)>,
        finished: bool,
    ) -> anyhow::Result<()> {
        if records.is_empty() {
            if finished {
                let mut c = u.cp.clone();
                c.finished = true;
                self.commit(u, lease, c).await?;
            }
            return Ok(());
        }
        let pieces = shard_state::pack(&records, CHUNK_LIMIT)
            .map_err(|e| anyhow::anyhow!("shard {}: {e}", u.id))?;
        let last = pieces.len() - 1;
        let mut start = 0;
        for (i, (end, bytes)) in pieces.into_iter().enumerate() {
            let n = u.cp.chunks;
            self.fence(u, lease)?;
            if self.fleet.put_chunk(&u.id, n, lease, bytes).await? == Cond::Refused {
                return Err(self.lost(u, lease));
            }
            let mut c = u.cp.clone();
            c.seq = Some(records[end - 1].0.clone());
            c.chunks = n + 1;
            c.finished = finished && i == last;
            self.commit(u, lease, c).await?;
            let mut r = self.report.lock().await;
            r.chunks_written += 1;
            r.buffered += (end - start) as u64;
            start = end;
        }
        tracing::info!(shard = %u.id, chunks = u.cp.chunks, "buffer chunk committed");
        Ok(())
    }
}
