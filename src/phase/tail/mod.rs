//! `rekey tail`: keep the target current from the source table's DynamoDB
//! Stream, in per-item order across shard lineage.
//!
//! Convergence with the backfill (docs/tail.md, "Backfill and tail
//! converge"): until the backfill has finished — it leaves a `backfill.done`
//! marker in the plan's state directory — records are not applied but
//! buffered durably in the tail's own store, so that a backfill longer than the
//! stream's 24-hour retention loses nothing. Once the marker exists, the buffer
//! is applied in lineage order (parents before children), then records are
//! applied as they come. Every checkpoint (a shard's last sequence number)
//! moves only after the writes or buffer entries it covers are durable.
//!
//! The tail keeps its own sled store (`<state dir>/tail`), so it can run as a
//! process of its own beside `rekey backfill`. About once a second it
//! publishes its lag per shard, the time up to which every source write is
//! applied (`applied_through`) and the drain barriers it has seen, in the
//! store and in `<state dir>/tail/status.json` (written atomically), which
//! `status`, `verify` and `drain` read without taking the store's lock.
//!
//! Records of one response are applied in lanes, one lane per source item:
//! changes to one item stay in stream order, different items need no order
//! between them (two source items never share a target key: the backfill
//! rejects collisions). A lane's puts and deletes are reduced to the last
//! write per target key and sent in BatchWriteItems ([`apply`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};

use tokio_util::sync::CancellationToken;

use crate::aws::rate::Control;
use crate::aws::streams::{
    self, ReadError, RecordKind, ShardInfo, ShardProgress, ShardThrough, Start, depth, evidence,
    now_secs, ready_shards, seq_key,
};
use crate::aws::{Clients, TableInfo};
use crate::core::marker::marker_in;
use crate::core::plan::{KeySchema, Mode, Plan, TtlDeletes};
use crate::core::value::Item;
use crate::phase::error::Stopped;
use crate::phase::inplace::{Decision, UpdateWrite, plan_update};
use crate::phase::progress::Progress;
use crate::state::StateDir;
use crate::state::StateStore;
use crate::state::rejects::RejectsFile;
use crate::state::snapshot::{self, BarrierState, TailStatus};

/// Written by the backfill when it is complete; the tail applies nothing before.
#[derive(Debug, Clone)]
pub struct TailOptions {
    pub state_dir: StateDir,
    pub rejects: PathBuf,
    /// Exit once the backfill is done, the buffer applied, and no shard has had
    /// a record for this long (catch-up mode; None: run until stopped).
    pub exit_when_idle: Option<Duration>,
    pub write_rate: Option<f64>,
    pub poll_interval: Duration,
    /// Source → target (`rekey tail`) or target → source (`rekey reverse`).
    pub flow: Flow,
}

/// One stream record as the tail keeps it (buffered or about to apply).
/// A stream record as the tail keeps it, with its sequence number.
pub fn change_of(r: streams::Record) -> (String, Change) {
    let kind = match r.kind {
        RecordKind::Insert => ChangeKind::Insert,
        RecordKind::Modify => ChangeKind::Modify,
        RecordKind::Remove => ChangeKind::Remove,
    };
    let at = r.created_at.unwrap_or_else(now_secs);
    let change = Change {
        kind,
        old: r.old,
        new: r.new,
        ttl: r.ttl,
        at,
    };
    (r.seq, change)
}

/// What a change proves of its shard once applied ([`streams::evidence`]):
/// a barrier's marker (in a table keyed by `key`), the barrier's start.
pub fn change_evidence(key: &KeySchema, c: &Change) -> f64 {
    let started = [&c.new, &c.old]
        .into_iter()
        .flatten()
        .find_map(|i| marker_in(key, i))
        .and_then(|m| m.started_at);
    evidence(c.at, started)
}

/// Whether `c` is a probe's marker (crate::phase::markers).
fn is_probe_change(key: &KeySchema, c: &Change) -> bool {
    [&c.new, &c.old]
        .into_iter()
        .flatten()
        .find_map(|i| marker_in(key, i))
        .is_some_and(|m| crate::phase::markers::is_probe(&m.barrier))
}

/// The shards of a listing with their progress, as [`streams::through`] reads them.
fn shard_view<'a>(
    shards: &'a [ShardInfo],
    progress: &HashMap<String, ShardProgress>,
) -> Vec<ShardThrough<'a>> {
    shards
        .iter()
        .map(|s| ShardThrough {
            id: &s.id,
            parent: s.parent.as_deref(),
            record_at: progress.get(&s.id).and_then(|p| p.record_at),
        })
        .collect()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Change {
    pub kind: ChangeKind,
    pub old: Option<Item>,
    pub new: Option<Item>,
    /// A TTL expiry (userIdentity dynamodb.amazonaws.com), not an application delete.
    pub ttl: bool,
    /// Seconds since the epoch when DynamoDB wrote the record.
    pub at: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ChangeKind {
    Insert,
    Modify,
    Remove,
}

/// What the target must do for one change: the pure half of the tail.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Put(Item),
    Delete(Item),
    /// In place: a conditional UpdateItem of the computed attributes (see
    /// [`crate::phase::inplace`]).
    Update(UpdateWrite),
    Reject {
        item: Item,
        reason: String,
    },
}

/// The target writes for a change, in order. A MODIFY whose new image maps to a
/// different target key than the old one deletes the old key first, so no item
/// is left behind under a key it no longer has.
pub fn actions(plan: &Plan, change: &Change) -> Vec<Action> {
    if plan.mode == Mode::InPlace {
        return in_place_actions(plan, change);
    }
    mapped_actions(&Mapper::new(plan, Flow::Forward), change)
}

/// The writes to the table a direction writes for one change of the table it
/// reads (a re-key plan): forwards by the transform, backwards by the inverse.
pub fn mapped_actions(m: &Mapper<'_>, change: &Change) -> Vec<Action> {
    let old_target = change.old.as_ref().and_then(|o| match m.map(o) {
        Mapped::Put(item) => Some(m.write_key_of(&item)),
        _ => None,
    });
    let mut out = Vec::new();
    match change.kind {
        ChangeKind::Remove => {
            if change.ttl && m.plan.ttl_deletes == TtlDeletes::Ignore {
                return out;
            }
            if let Some(k) = old_target {
                out.push(Action::Delete(k));
            }
        }
        ChangeKind::Insert | ChangeKind::Modify => {
            let Some(new) = &change.new else { return out };
            match m.map(new) {
                Mapped::Put(item) => {
                    if let Some(k) = old_target
                        && k != m.write_key_of(&item)
                    {
                        out.push(Action::Delete(k));
                    }
                    out.push(Action::Put(item));
                }
                Mapped::Reject(reason) => {
                    if let Some(k) = old_target {
                        out.push(Action::Delete(k));
                    }
                    out.push(Action::Reject {
                        item: new.clone(),
                        reason,
                    });
                }
                Mapped::Skip => {
                    if let Some(k) = old_target {
                        out.push(Action::Delete(k));
                    }
                }
            }
        }
    }
    out
}

/// In place: INSERT and MODIFY recompute the computed attributes of the new
/// image; REMOVE needs nothing (the item and its attributes are gone). A new
/// image whose computed attributes already hold what the plan gives — which is
/// what rekey's own writes leave, backfill's and the tail's — needs no write:
/// that is why the tail reading its own writes from the stream never loops.
pub fn in_place_actions(plan: &Plan, change: &Change) -> Vec<Action> {
    let Some(new) = change
        .new
        .as_ref()
        .filter(|_| change.kind != ChangeKind::Remove)
    else {
        return Vec::new();
    };
    match plan_update(plan, new) {
        Decision::Write(w) => vec![Action::Update(w)],
        Decision::Correct | Decision::Skip => Vec::new(),
        Decision::Reject(reason) => vec![Action::Reject {
            item: new.clone(),
            reason,
        }],
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ShardState {
    /// Last sequence number applied or buffered.
    seq: Option<String>,
    /// Closed and read to its end.
    finished: bool,
    /// When this checkpoint was last confirmed (epoch seconds, the tail's
    /// clock). A tail that has been away longer than the stream's retention
    /// may have missed trimmed records. (Not the record's own time: on a quiet
    /// table the last record may be days old while the checkpoint is current.)
    at: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TailReport {
    pub records: u64,
    pub buffered: u64,
    pub puts: u64,
    pub deletes: u64,
    /// In place: conditional UpdateItems written.
    pub updates: u64,
    pub rejected: u64,
    /// Guarded writes not made: the table written already held them.
    pub in_sync: u64,
    /// Guarded: records that were the other direction's writes coming back.
    pub echoes: u64,
    /// Guarded writes not made: the table written had changed independently.
    pub conflicts: u64,
    /// Seconds between the last applied record's creation and its application.
    pub last_lag_seconds: f64,
    pub shards: usize,
}

mod apply;
pub(crate) mod fleet;
mod flow;
mod guard;
pub(crate) mod line;
mod probe;
mod publish;

use probe::{PROBE_AFTER_SECONDS, SWEEP_ON_STOP};

pub use flow::{Flow, Mapped, Mapper};

const RETENTION_SECONDS: f64 = 24.0 * 3600.0;

/// How long a reverse tail that finds no line waits for one to be drawn.
const LINE_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether barrier `b` is complete, given the instant before which every
/// write is applied: a barrier is complete once that reaches its start
/// (or, for a marker that carries none, its marker's second).
fn barrier_complete(b: &BarrierState, marker_at: f64, through: Option<f64>) -> bool {
    let start = b.started_at.unwrap_or(marker_at.floor() + 1.0);
    through.is_some_and(|t| t >= start)
}

/// Epoch seconds (the stream's and the tail's clock) as a time.
fn time(secs: f64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis((secs * 1000.0) as i64).unwrap_or_default()
}

/// The tail's state between loop turns.
struct Tail<'a> {
    clients: &'a Clients,
    plan: &'a Plan,
    opts: &'a TailOptions,
    /// The direction's mapping (transform or inverse).
    mapper: Mapper<'a>,
    store: StateStore,
    control: Control,
    rejects: RejectsFile,
    report: TailReport,
    progress: HashMap<String, ShardProgress>,
    /// Barrier id → (state, marker creation time).
    barriers: BTreeMap<String, (BarrierState, f64)>,
    published: Option<Instant>,
    /// The instant before which every write is applied, as last published.
    proven: Option<f64>,
    /// When the tail last started a probe.
    probed: Option<Instant>,
    /// The probe being written, off the turn ([`Tail::probe`]).
    probing: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Which probe marker reaches which shard (crate::phase::markers::ProbeKeys).
    probe_keys: crate::phase::markers::ProbeKeys,
    /// Guarded: the echo ledgers (`guard`), opened when first needed.
    echoes: Option<crate::state::echoes::Echoes>,
    /// Backwards: where the reverse tail starts ([`line`]).
    line: Option<line::Line>,
    /// The last shard listing and when it was made ([`LIST_EVERY`]).
    listing: Option<(Instant, Vec<ShardInfo>)>,
    /// List again at the next turn: a shard closed, its children are due.
    relist: bool,
}

/// Tails the stream until `stop` (or, with `exit_when_idle`, until idle).
/// Once `stop` is cancelled (Ctrl-C, SIGTERM, or `rekey run` stopping) it
/// abandons the read in hand (uncommitted, applied again on resume),
/// publishes a stopped status and returns `Stopped`. The stop is a
/// parameter: `rekey run` hands its tail a child of its own.
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &TailOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<TailReport> {
    let flow = opts.flow;
    if flow == Flow::Reverse {
        reversible(plan)?;
    }
    let info = clients.describe_table(flow.read_table(plan)).await?;
    info.check_key(flow.read_key(plan), flow.read_role())?;
    let stream = source_stream(&info, flow)?;
    let line = match flow {
        Flow::Forward => None,
        Flow::Reverse => {
            let drawn = line::ensure(clients, plan, &opts.state_dir, LINE_TIMEOUT);
            let Some(drawn) = stop.run_until_cancelled(drawn).await else {
                return Err(Stopped.into());
            };
            Some(drawn?)
        }
    };
    let mut t = Tail::open(clients, plan, opts)?;
    if let Some(line) = line {
        t.start_at(line)?;
    }
    let mut iterators: HashMap<String, String> = HashMap::new();
    let mut last_record = Instant::now();
    // The write budget's adaptive rate moves along its curve once a second
    // (as the backfill's status loop does): without it, a rate cut by a
    // throttle would never climb back.
    let mut ticked = Instant::now();
    progress.start("tail", None);
    loop {
        if ticked.elapsed() >= Duration::from_secs(1) {
            t.control.tick().await;
            ticked = Instant::now();
        }
        if opts.state_dir.is_finished() {
            // `rekey finish` drained the tail before it wrote this.
            break;
        }
        if stop.is_cancelled() {
            break;
        }
        // A stop abandons the work in hand wherever it waits (the write
        // budget, a backoff): its checkpoint is not committed, so its records
        // are applied again on resume, in order, as after kill -9.
        if t.backfill_done() && !t.drained()? {
            let Some(drained) = stop.run_until_cancelled(t.drain_buffer()).await else {
                break;
            };
            drained?;
            t.store.put("tail/buffer_drained", &true)?;
            t.store.flush()?;
        }
        let began = Instant::now();
        let turn = t.turn(&stream).await?;
        let listed = began.elapsed();
        let mut got_any = false;
        let fetched = t.fetch_all(&stream, &turn, &mut iterators);
        let Some(fetched) = stop.run_until_cancelled(fetched).await else {
            break;
        };
        let read = began.elapsed();
        let mut pages = Vec::new();
        for (shard, page) in turn.ready.iter().zip(fetched) {
            if let Some(page) = page? {
                pages.push((shard.clone(), page));
            }
        }
        for group in groups(pages) {
            let commit = t.commit(&turn, group, &mut iterators);
            let Some(got) = stop.run_until_cancelled(commit).await else {
                break;
            };
            got_any |= got?;
            // A turn over many shards with much to apply can outlast the 30 s
            // after which readers take a silent tail for a dead one: the
            // status goes out as it goes (at most about once a second).
            t.publish(&turn, progress, true)?;
        }
        if stop.is_cancelled() {
            break;
        }
        // Busy: about once a second. Idle: every turn, so the last word is current.
        t.publish(&turn, progress, got_any)?;
        let applied = began.elapsed();
        t.probe(&turn).await?;
        tracing::debug!(
            ?flow,
            shards = turn.shards.len(),
            ready = turn.ready.len(),
            listed_ms = listed.as_millis() as u64,
            read_ms = read.as_millis() as u64,
            applied_ms = applied.as_millis() as u64,
            probed_ms = began.elapsed().as_millis() as u64,
            "tail turn"
        );
        if got_any {
            last_record = Instant::now();
        } else {
            if let Some(idle) = opts.exit_when_idle
                && t.drained()?
                && last_record.elapsed() >= idle
            {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(opts.poll_interval) => {}
                () = stop.cancelled() => {}
            }
        }
    }
    progress.finish();
    // A probe in flight must not leave markers in the application's table.
    // It is let finish (each marker it puts, it deletes): aborted, a put
    // already sent could land after the sweep's delete and stay. Only one
    // that outlasts the bound is cut short, and its round swept.
    if let Some(mut probing) = t.probing.take()
        && tokio::time::timeout(SWEEP_ON_STOP, &mut probing)
            .await
            .is_err()
    {
        probing.abort();
        let _ = probing.await;
    }
    match tokio::time::timeout(SWEEP_ON_STOP, t.sweep_probes()).await {
        Ok(swept) => swept?,
        Err(_) => tracing::warn!("probe markers not yet swept: the next run sweeps them"),
    }
    t.rejects.flush_len()?;
    let path = flow.snapshot(&opts.state_dir);
    if let Some(mut last) = snapshot::read::<TailStatus>(&path)? {
        last.stopped = true;
        last.updated_at = time(now_secs());
        snapshot::publish(&path, &last)?;
    }
    if stop.is_cancelled() && !opts.state_dir.is_finished() {
        return Err(Stopped.into());
    }
    Ok(t.report)
}

/// The reverse tail needs a second table and a plan whose every rule reads
/// back (`rekey check` says the same); else a clear error (exit 2), not a
/// rejects file with every item in it.
fn reversible(plan: &Plan) -> anyhow::Result<()> {
    if plan.mode == Mode::InPlace {
        anyhow::bail!(crate::phase::error::InputError(
            "the plan is in place: there is no second table to replicate back to (use `rekey undo`)".into()
        ));
    }
    let not: Vec<String> = crate::core::inverse::reversibility(plan)
        .into_iter()
        .filter(|r| !r.reversible())
        .map(|r| {
            let why: Vec<String> = r.reasons.iter().map(ToString::to_string).collect();
            format!("rule `{}`: {}", r.rule, why.join("; "))
        })
        .collect();
    if !not.is_empty() {
        anyhow::bail!(crate::phase::error::InputError(format!(
            "the plan cannot be replicated back, so it cannot be rolled back: {} (`rekey check` says what to change)",
            not.join(", ")
        )));
    }
    Ok(())
}

/// The stream ARN of the table read, or why the tail cannot follow it.
pub(crate) fn source_stream(info: &TableInfo, flow: Flow) -> anyhow::Result<String> {
    let when = match flow {
        Flow::Forward => "before the backfill starts",
        Flow::Reverse => {
            "before the cutover (the reverse tail replicates the target's writes back to the source from then on)"
        }
    };
    match &info.stream {
        Some(s) if s.view == "NEW_AND_OLD_IMAGES" => Ok(s.arn.clone()),
        Some(s) => anyhow::bail!(crate::phase::error::InputError(format!(
            "table `{}` streams {} images; rekey needs NEW_AND_OLD_IMAGES to follow key-changing updates and deletes. \
             The view type cannot be changed in place: disable the stream and enable it again with \
             StreamViewType=NEW_AND_OLD_IMAGES (a new stream), {when}",
            info.name, s.view
        ))),
        None => anyhow::bail!(crate::phase::error::InputError(format!(
            "table `{}` has no stream. Enable one {when}: aws dynamodb update-table --table-name {} \
             --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES",
            info.name, info.name
        ))),
    }
}

impl<'a> Tail<'a> {
    fn open(clients: &'a Clients, plan: &'a Plan, opts: &'a TailOptions) -> anyhow::Result<Self> {
        let store = StateStore::open(&opts.flow.store(&opts.state_dir), plan)?;
        let rejects = RejectsFile::open_truncated(
            &opts.rejects,
            store.get("tail/rejects_len")?.unwrap_or(0),
        )?;
        let barriers = store
            .scan_prefix::<(BarrierState, f64)>("tail/barrier/")?
            .into_iter()
            .map(|(k, v)| (k.trim_start_matches("tail/barrier/").to_string(), v))
            .collect();
        Ok(Tail {
            clients,
            plan,
            opts,
            mapper: Mapper::new(plan, opts.flow),
            store,
            control: Control::new(None, opts.write_rate),
            rejects,
            report: TailReport::default(),
            progress: HashMap::new(),
            barriers,
            published: None,
            proven: None,
            probed: None,
            probing: None,
            probe_keys: crate::phase::markers::ProbeKeys::default(),
            echoes: None,
            line: None,
            listing: None,
            relist: true,
        })
    }

    /// One GetRecords on one shard, nothing applied yet; None: the iterator
    /// had expired (it is got again from the checkpoint next turn: nothing is
    /// skipped or repeated). The turn's shards are read at once
    /// ([`FETCHES`]); their pages are then applied one shard at a time, in
    /// the turn's order ([`Tail::commit`]), as when each was read in turn.
    async fn fetch(
        &self,
        stream: &str,
        turn: &Turn,
        shard: &str,
        iterator: Option<String>,
    ) -> anyhow::Result<Option<streams::Page>> {
        let state = turn.states.get(shard).cloned().unwrap_or_default();
        if let Some(at) = state.at
            && now_secs() - at > RETENTION_SECONDS
        {
            anyhow::bail!(
                "shard {shard}: the checkpoint is older than the stream's 24-hour retention, so records were lost; \
                     a new backfill is needed (start it with a fresh --state-dir)"
            );
        }
        let iterator = match iterator {
            Some(i) => i,
            None => {
                // No checkpoint: from the oldest record kept, which is at or
                // before the moment any backfill started after the stream
                // was enabled.
                let start = state
                    .seq
                    .as_deref()
                    .map_or(Start::TrimHorizon, Start::After);
                streams::shard_iterator(self.clients, stream, shard, start).await?
            }
        };
        // A guarded tail applies a record at a time (a read, then a conditional
        // write): smaller pages keep its turns, and so its status, moving.
        let limit = if self.guarded() {
            GUARDED_PAGE
        } else {
            streams::PAGE
        };
        match streams::get_records(self.clients, stream, &iterator, limit).await {
            Ok(page) => Ok(Some(page)),
            Err(ReadError::Expired) => Ok(None),
            Err(ReadError::Trimmed) => anyhow::bail!(
                "shard {shard}: records were trimmed from the stream before the tail read them (TrimmedDataAccessException); \
                 changes were lost and a new backfill is needed"
            ),
            Err(ReadError::Aws(e)) => Err(e.into()),
        }
    }

    /// Every ready shard of the turn read, [`FETCHES`] at a time; their
    /// pages in the turn's order.
    async fn fetch_all(
        &self,
        stream: &str,
        turn: &Turn,
        iterators: &mut HashMap<String, String>,
    ) -> Vec<anyhow::Result<Option<streams::Page>>> {
        let work: Vec<(usize, Option<String>)> = (turn.ready.iter().enumerate())
            .map(|(i, shard)| (i, iterators.remove(shard)))
            .collect();
        stream::iter(work)
            .map(|(i, iterator)| self.fetch(stream, turn, &turn.ready[i], iterator))
            .buffered(FETCHES)
            .collect()
            .await
    }

    /// A group of the turn's pages applied together (or buffered while the
    /// backfill runs), then each shard's checkpoint. True when records came.
    ///
    /// The shards of a turn hold disjoint keys (one partition each; a
    /// child is read only once its parent is finished), so their pages go
    /// to the writer at once, each item's changes in order in its lane.
    /// Applied one shard after another, a turn over ~40 shards took 8–14 s
    /// to apply a few hundred changes: a round trip per shard.
    async fn commit(
        &mut self,
        turn: &Turn,
        pages: Vec<(String, streams::Page)>,
        iterators: &mut HashMap<String, String>,
    ) -> anyhow::Result<bool> {
        let applying = self.drained()? && self.backfill_done();
        let mut taken = Vec::with_capacity(pages.len());
        let mut changes = Vec::new();
        for (shard, page) in pages {
            let mut t = self.take(turn, &shard, page)?;
            if applying {
                changes.append(&mut t.changes);
            }
            taken.push((shard, t));
        }
        if !changes.is_empty() {
            self.apply_all(changes).await?;
        }
        let mut got_any = false;
        let mut flush = false;
        for (shard, t) in taken {
            got_any |= t.got_any;
            flush |= t.read_any || t.next.is_none();
            self.checkpoint(&shard, t, iterators)?;
        }
        // An empty read moves no checkpoint: its `at` need not outlive a
        // kill -9 (sled writes it out within half a second anyway).
        if flush {
            self.store.flush()?;
        }
        Ok(got_any)
    }

    /// One shard's page counted, its probe keys learnt, and its changes
    /// buffered while the backfill runs (else returned, to apply).
    fn take(&mut self, turn: &Turn, shard: &String, out: streams::Page) -> anyhow::Result<Taken> {
        let state = turn.states.get(shard).cloned().unwrap_or_default();
        let read_any = !out.records.is_empty();
        let mut seq = state.seq.clone();
        let changes: Vec<(String, Change)> = out
            .records
            .into_iter()
            .map(|r| {
                seq = Some(r.seq.clone());
                change_of(r)
            })
            .collect();
        let key = self.opts.flow.read_key(self.plan);
        // Probes are the tail's own: neither counted nor activity (catch-up
        // mode exits once the table is idle).
        let traffic = changes
            .iter()
            .filter(|(_, c)| !is_probe_change(key, c))
            .count();
        self.report.records += traffic as u64;
        for (_, c) in &changes {
            if let Some(n) = probe::key_of(key, c) {
                self.probe_keys.saw(shard, n);
            }
        }
        let newest = changes
            .iter()
            .map(|(_, c)| change_evidence(key, c))
            .reduce(f64::max);
        let mut apply = Vec::new();
        if self.drained()? && self.backfill_done() {
            apply = changes.into_iter().map(|(_, c)| c).collect();
        } else {
            let d = depth(&turn.shards, shard);
            for (s, change) in &changes {
                self.store
                    .put(&format!("tail/buf/{d:04}/{shard}/{}", seq_key(s)), change)?;
                self.report.buffered += 1;
            }
        }
        Ok(Taken {
            changes: apply,
            seq,
            newest,
            next: out.next,
            read_any,
            got_any: traffic > 0,
        })
    }

    /// A shard's page is applied (or buffered): what it proves, and its
    /// checkpoint.
    fn checkpoint(
        &mut self,
        shard: &String,
        t: Taken,
        iterators: &mut HashMap<String, String>,
    ) -> anyhow::Result<()> {
        let p = self.progress.entry(shard.clone()).or_default();
        if let Some(at) = t.newest {
            p.record_at = Some(p.record_at.map_or(at, |r| r.max(at)));
        }
        let finished_now = t.next.is_none();
        self.relist |= finished_now;
        if let Some(next) = t.next {
            iterators.insert(shard.clone(), next);
        }
        let len = self.rejects.flush_len()?;
        self.store.put_batch(&[
            (
                &format!("tail/shard/{shard}"),
                serde_json::to_value(ShardState {
                    seq: t.seq,
                    finished: finished_now,
                    at: Some(now_secs()),
                })?,
            ),
            ("tail/rejects_len", serde_json::to_value(len)?),
        ])?;
        if t.got_any {
            tracing::info!(shard = %shard, finished = finished_now, buffered = self.report.buffered, "tail checkpoint committed");
        } else {
            tracing::debug!(shard = %shard, finished = finished_now, "tail checkpoint committed (empty read)");
        }
        Ok(())
    }
}

/// One shard's page, taken: what [`Tail::checkpoint`] needs once its
/// changes are applied.
struct Taken {
    /// To apply (empty while the backfill runs: they were buffered).
    changes: Vec<Change>,
    /// The last record read: the checkpoint.
    seq: Option<String>,
    /// What the page proves once applied ([`change_evidence`]).
    newest: Option<f64>,
    /// None: the shard is read to its end.
    next: Option<String>,
    read_any: bool,
    /// Records other than probes came.
    got_any: bool,
}

/// Records applied together at most, unless one page holds more: a
/// group's status goes out before the next group is applied.
const GROUP_RECORDS: usize = 2000;

/// The turn's pages in groups of about [`GROUP_RECORDS`] records, in order.
fn groups(pages: Vec<(String, streams::Page)>) -> Vec<Vec<(String, streams::Page)>> {
    let mut out: Vec<Vec<(String, streams::Page)>> = Vec::new();
    let mut records = 0;
    for (shard, page) in pages {
        let n = page.records.len();
        match out.last_mut() {
            Some(group) if records + n <= GROUP_RECORDS => group.push((shard, page)),
            _ => {
                out.push(vec![(shard, page)]);
                records = 0;
            }
        }
        records += n;
    }
    out
}

/// The shard list one loop turn works from.
struct Turn {
    shards: Vec<ShardInfo>,
    states: HashMap<String, ShardState>,
    finished: HashSet<String>,
    ready: Vec<String>,
}

/// The shard listing is made again this often, and whenever a shard has
/// closed. DynamoDB allows DescribeStream 10 times a second per account, and
/// a listing between closures is only for shards begun otherwise. A listing
/// this old is still sound for `applied_through` (a shard begun since is the
/// child of a listed one, whose claim covers it: [`streams::through`]).
const LIST_EVERY: Duration = Duration::from_secs(10);

/// GetRecords calls a turn has in flight at once. DynamoDB allows 5 a
/// second per shard, and a turn reads each shard once; one at a time, a turn
/// over 60 open shards that answer empty pages in runs left the least fresh
/// shard tens of seconds behind.
const FETCHES: usize = 16;

/// Records per GetRecords page of a guarded tail (crate::phase::tail::guard):
/// it applies one at a time, and a page of DynamoDB's 1,000 took longer than
/// the 30 s after which readers (verify's wait, cutover's gates) take a
/// silent tail for a dead one.
const GUARDED_PAGE: i32 = 100;

impl Tail<'_> {
    async fn turn(&mut self, stream: &str) -> anyhow::Result<Turn> {
        let shards = match &self.listing {
            Some((at, shards)) if !self.relist && at.elapsed() < LIST_EVERY => shards.clone(),
            _ => {
                let shards = streams::describe_shards(self.clients, stream).await?;
                // A closed shard with no child listed yet: its children are
                // coming (DynamoDB lists them a moment later).
                let parents: HashSet<&str> =
                    shards.iter().filter_map(|s| s.parent.as_deref()).collect();
                self.relist = shards
                    .iter()
                    .any(|s| s.closed && !parents.contains(s.id.as_str()));
                self.listing = Some((Instant::now(), shards.clone()));
                shards
            }
        };
        self.report.shards = shards.len();
        let states: HashMap<String, ShardState> = shards
            .iter()
            .map(|s| {
                Ok((
                    s.id.clone(),
                    self.store
                        .get::<ShardState>(&format!("tail/shard/{}", s.id))?
                        .unwrap_or_default(),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        let finished: HashSet<String> = states
            .iter()
            .filter(|(_, s)| s.finished)
            .map(|(k, _)| k.clone())
            .collect();
        let ready = ready_shards(&shards, &finished);
        Ok(Turn {
            shards,
            states,
            finished,
            ready,
        })
    }

    /// Backwards: a new store's shards start at the line; then the line is
    /// kept for the echo ledgers.
    fn start_at(&mut self, line: line::Line) -> anyhow::Result<()> {
        if self.store.get::<String>("tail/line")?.is_none() {
            let at = Some(now_secs());
            let lined = line.lined.iter().map(|(s, seq)| (s, Some(seq.clone())));
            let before = line.before.iter().map(|s| (s, None));
            for (shard, seq) in lined.chain(before) {
                let key = format!("tail/shard/{shard}");
                // (A checkpoint of a reverse tail older than lines stands.)
                if self.store.get::<ShardState>(&key)?.is_none() {
                    let finished = seq.is_none();
                    self.store.put(&key, &ShardState { seq, finished, at })?;
                }
            }
            tracing::debug!(
                lined = line.lined.len(),
                before = line.before.len(),
                "reverse: starting at the line"
            );
            self.store.put("tail/line", &line.id)?;
            self.store.flush()?;
        }
        self.line = Some(line);
        Ok(())
    }

    /// Whether records are applied (else buffered): forwards once the
    /// backfill is done; backwards always (the source is complete).
    fn backfill_done(&self) -> bool {
        self.opts.flow == Flow::Reverse || self.opts.state_dir.is_backfill_done()
    }

    fn drained(&self) -> anyhow::Result<bool> {
        Ok(self.store.get::<bool>("tail/buffer_drained")? == Some(true))
    }

    /// Apply the durable buffer in lineage order, a chunk at a time, deleting
    /// each chunk's entries once its writes are acknowledged.
    async fn drain_buffer(&mut self) -> anyhow::Result<()> {
        const CHUNK: usize = 1000;
        loop {
            let chunk = self.store.scan_prefix_limit::<Change>("tail/buf/", CHUNK)?;
            if chunk.is_empty() {
                break;
            }
            let keys: Vec<String> = chunk.iter().map(|(k, _)| k.clone()).collect();
            self.apply_all(chunk.into_iter().map(|(_, c)| c).collect())
                .await?;
            for k in keys {
                self.store.remove(&k)?;
            }
            self.store.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_pages_go_in_groups_of_about_group_records_in_order() {
        let page = |n: usize| streams::Page {
            records: (0..n)
                .map(|i| crate::aws::streams::Record {
                    seq: i.to_string(),
                    kind: RecordKind::Insert,
                    keys: None,
                    old: None,
                    new: None,
                    ttl: false,
                    created_at: None,
                })
                .collect(),
            next: Some("it".into()),
        };
        let pages = vec![
            ("a".to_string(), page(1500)),
            ("b".to_string(), page(400)),
            ("c".to_string(), page(200)),
            ("d".to_string(), page(3000)),
            ("e".to_string(), page(0)),
        ];
        let shape: Vec<Vec<String>> = groups(pages)
            .into_iter()
            .map(|g| g.into_iter().map(|(s, _)| s).collect())
            .collect();
        assert_eq!(shape, vec![vec!["a", "b"], vec!["c"], vec!["d"], vec!["e"]]);
    }
    use crate::core::transform::{Outcome, transform};
    use crate::core::value::Value;

    const PLAN: &str = r#"
[source]
table = "s"
partition_key = "PK"
[target]
table = "t"
partition_key = "PK"
sort_key = "SK"
[options]
ttl_deletes = "ignore"
[[rule]]
match = { PK = "O#{id}" }
key = { PK = "ST#{@status}#{shard(id, 4)}", SK = "{id}" }
"#;

    pub(super) fn plan() -> Plan {
        Plan::parse(PLAN, std::path::Path::new("p")).unwrap()
    }

    pub(super) fn order(id: &str, status: &str) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S(format!("O#{id}")));
        i.insert("status".into(), Value::S(status.into()));
        i
    }

    pub(super) fn change(kind: ChangeKind, old: Option<Item>, new: Option<Item>) -> Change {
        Change {
            kind,
            old,
            new,
            ttl: false,
            at: 0.0,
        }
    }

    #[test]
    fn a_key_changing_modify_deletes_the_old_target_key_first() {
        let p = plan();
        let a = actions(
            &p,
            &change(
                ChangeKind::Modify,
                Some(order("1", "OPEN")),
                Some(order("1", "DONE")),
            ),
        );
        assert_eq!(a.len(), 2);
        let Action::Delete(k) = &a[0] else {
            panic!("{a:?}")
        };
        assert!(matches!(&k["PK"], Value::S(s) if s.starts_with("ST#OPEN#")));
        let Action::Put(it) = &a[1] else { panic!() };
        assert!(matches!(&it["PK"], Value::S(s) if s.starts_with("ST#DONE#")));
        // The same key: just the put.
        let a = actions(
            &p,
            &change(
                ChangeKind::Modify,
                Some(order("1", "OPEN")),
                Some(order("1", "OPEN")),
            ),
        );
        assert!(matches!(a.as_slice(), [Action::Put(_)]));
    }

    #[test]
    fn removes_delete_the_transformed_old_key_and_ttl_follows_the_plan() {
        let p = plan();
        let a = actions(
            &p,
            &change(ChangeKind::Remove, Some(order("1", "OPEN")), None),
        );
        assert!(matches!(a.as_slice(), [Action::Delete(_)]));
        let mut ttl = change(ChangeKind::Remove, Some(order("1", "OPEN")), None);
        ttl.ttl = true;
        assert!(actions(&p, &ttl).is_empty(), "ttl_deletes = ignore");
    }

    #[test]
    fn an_item_that_stops_mapping_leaves_nothing_behind() {
        let p = plan();
        let mut bad = order("1", "OPEN");
        bad.remove("status");
        let a = actions(
            &p,
            &change(ChangeKind::Modify, Some(order("1", "OPEN")), Some(bad)),
        );
        assert!(
            matches!(a.as_slice(), [Action::Delete(_), Action::Reject { .. }]),
            "{a:?}"
        );
    }

    const IN_PLACE: &str = r#"
[source]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[target]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[options]
unmatched = "skip"
[[rule]]
match = { PK = "T#{t}", SK = "TASK#{id}" }
set = { GSI2PK = "T#{t}#ST#{@status}#{shard(id, 4)}" }
"#;

    fn task(status: &str, gsi: Option<&str>) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S("T#a".into()));
        i.insert("SK".into(), Value::S("TASK#1".into()));
        i.insert("status".into(), Value::S(status.into()));
        if let Some(g) = gsi {
            i.insert("GSI2PK".into(), Value::S(g.into()));
        }
        i
    }

    #[test]
    fn in_place_the_tail_updates_wrong_items_and_ignores_its_own_writes() {
        let p = Plan::parse(IN_PLACE, std::path::Path::new("p")).unwrap();
        // An application insert without the attribute: one conditional update.
        let a = actions(
            &p,
            &change(ChangeKind::Insert, None, Some(task("OPEN", None))),
        );
        let [Action::Update(w)] = a.as_slice() else {
            panic!("{a:?}")
        };
        assert_eq!(w.set[0].0, "GSI2PK");
        assert!(
            w.expect
                .contains(&("status".into(), Some(Value::S("OPEN".into()))))
        );
        // The MODIFY that update produces: already right, nothing to do.
        let right = match transform(&p, &task("OPEN", None)) {
            Outcome::Put { item, .. } => item,
            o => panic!("{o:?}"),
        };
        let own = change(
            ChangeKind::Modify,
            Some(task("OPEN", None)),
            Some(right.clone()),
        );
        assert!(actions(&p, &own).is_empty());
        // The application changes the status: recompute.
        let mut moved = right.clone();
        moved.insert("status".into(), Value::S("DONE".into()));
        let a = actions(
            &p,
            &change(ChangeKind::Modify, Some(right.clone()), Some(moved)),
        );
        assert!(matches!(a.as_slice(), [Action::Update(_)]), "{a:?}");
        // Deletes need nothing; neither do unmatched items.
        assert!(actions(&p, &change(ChangeKind::Remove, Some(right), None)).is_empty());
        let mut note = task("OPEN", None);
        note.insert("SK".into(), Value::S("NOTE#1".into()));
        assert!(actions(&p, &change(ChangeKind::Insert, None, Some(note))).is_empty());
        // A new image the plan cannot compute is a reject, never a write.
        let mut bad = task("OPEN", None);
        bad.remove("status");
        assert!(matches!(
            actions(&p, &change(ChangeKind::Insert, None, Some(bad))).as_slice(),
            [Action::Reject { .. }]
        ));
    }

    #[test]
    fn a_barrier_completes_once_every_leaf_shard_has_shown_a_record_from_after_its_start() {
        let b = BarrierState {
            observed_at: 200.0,
            started_at: Some(199.5),
            ..Default::default()
        };
        let info = |id: &str, parent: Option<&str>| ShardInfo {
            id: id.into(),
            parent: parent.map(str::to_string),
            closed: false,
        };
        let shards = vec![info("a", None), info("b", None), info("c", Some("b"))];
        let progress = |at: &[(&str, f64)]| -> HashMap<String, ShardProgress> {
            at.iter()
                .map(|(id, t)| {
                    (
                        id.to_string(),
                        ShardProgress {
                            record_at: Some(*t),
                        },
                    )
                })
                .collect()
        };
        let through = |p| streams::through(&shard_view(&shards, &p));
        // a showed the marker; b (empty pages only, or an old record) proves nothing.
        assert!(!barrier_complete(
            &b,
            199.0,
            through(progress(&[("a", 199.5)]))
        ));
        assert!(!barrier_complete(
            &b,
            199.0,
            through(progress(&[("a", 199.5), ("b", 150.0)]))
        ));
        // b's last record before it closed is its child's proof, until c has its own.
        assert!(barrier_complete(
            &b,
            199.0,
            through(progress(&[("a", 199.5), ("b", 199.6)]))
        ));
        assert!(barrier_complete(
            &b,
            199.0,
            through(progress(&[("a", 199.5), ("b", 10.0), ("c", 201.0)]))
        ));
    }
}
