//! The re-check that turns a candidate into a difference, or not: rounds
//! gated on the tail's `applied_through`, with the stream watch counting the
//! writes between reads (docs/verify.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tracing::Instrument as _;

use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::state::snapshot::Counts;
use crate::state::{StateDir, StoreBatch};

use super::{
    CAND, Ctx, Kind, MARGIN, MAX_ROUNDS, MM, Mismatch, WRITES, differing_attributes, key_item,
    ms_to_time,
};

// ---- the tail's status --------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub enum TailWait {
    /// The tail has applied every source write up to the instant asked for.
    CaughtUp,
    /// No status file: no tail runs; the re-check assumes writes have stopped.
    NoTail,
    /// Stale status or timeout: candidates cannot be settled.
    Behind(String),
}

/// Wait until the tail has applied every source write before `through` —
/// and, in a rollback's window (a reverse tail runs), until the reverse tail
/// has applied every target write before it too, since either table may
/// then be the one the application writes.
pub(crate) async fn wait_for_tail(
    state_dir: &StateDir,
    through: DateTime<Utc>,
    timeout: Duration,
    stale_after: Duration,
) -> TailWait {
    let forward = wait_for_one(&state_dir.tail_snapshot(), through, timeout, stale_after).await;
    if matches!(forward, TailWait::Behind(_)) || !state_dir.reverse_snapshot().exists() {
        return forward;
    }
    match wait_for_one(&state_dir.reverse_snapshot(), through, timeout, stale_after).await {
        TailWait::Behind(why) => TailWait::Behind(format!("reverse: {why}")),
        _ => forward,
    }
}

/// What a tail last published, in the terms the wait judges: its status
/// file on this machine, or the fleet's `TAIL` item.
#[derive(Debug, Clone)]
enum Published {
    /// Nothing published: no tail runs.
    Nothing,
    /// Published but unreadable (another version's format): not keeping up.
    Unreadable,
    /// Cannot be read at all.
    Failed(String),
    Status {
        updated: DateTime<Utc>,
        applied_through: Option<DateTime<Utc>>,
        stopped: bool,
    },
}

/// One direction's tail, by its status file.
async fn wait_for_one(
    path: &std::path::Path,
    through: DateTime<Utc>,
    timeout: Duration,
    stale_after: Duration,
) -> TailWait {
    let read = || async {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Published::Nothing,
            Err(e) => return Published::Failed(format!("cannot read {}: {e}", path.display())),
        };
        // A half-written file cannot happen (tmp + rename); an unreadable one is a
        // tail of another version: treat it as not keeping up.
        match serde_json::from_str::<crate::state::snapshot::TailStatus>(&text) {
            Ok(s) => Published::Status {
                updated: s.updated_at,
                applied_through: s.applied_through,
                stopped: s.stopped,
            },
            Err(_) => Published::Unreadable,
        }
    };
    wait_on(
        read,
        &path.display().to_string(),
        through,
        timeout,
        stale_after,
    )
    .await
}

/// The fleet's tail (`rekey tail --fleet`, on another machine), by the
/// `TAIL` item it publishes in the control table: the fleet verify's wait.
pub async fn wait_for_fleet_tail(
    fleet: &crate::state::fleet::Fleet,
    through: DateTime<Utc>,
    timeout: Duration,
    stale_after: Duration,
) -> TailWait {
    let read = || async {
        match fleet.applied_through().await {
            Ok(None) => Published::Nothing,
            Ok(Some(m)) => Published::Status {
                updated: ms_to_time(m.updated_ms),
                applied_through: m.applied_through_ms.map(ms_to_time),
                stopped: m.stopped,
            },
            Err(e) => Published::Failed(format!("cannot read the fleet tail's progress: {e}")),
        }
    };
    let what = format!("{} (TAIL)", fleet.at.display());
    wait_on(read, &what, through, timeout, stale_after).await
}

/// Waits until what `read` returns says the tail applied through `through`.
async fn wait_on<F, Fut>(
    read: F,
    what: &str,
    through: DateTime<Utc>,
    timeout: Duration,
    stale_after: Duration,
) -> TailWait
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Published>,
{
    let start = Instant::now();
    loop {
        let mut applied_through = None;
        match read().await {
            Published::Nothing | Published::Status { stopped: true, .. } => {
                return TailWait::NoTail;
            }
            Published::Failed(why) => return TailWait::Behind(why),
            Published::Unreadable => {}
            Published::Status {
                updated,
                applied_through: at,
                ..
            } => {
                applied_through = at;
                let age = (Utc::now() - updated).to_std().unwrap_or_default();
                if age > stale_after {
                    return TailWait::Behind(format!(
                        "the tail is not running: {what} was last updated {:.0} s ago",
                        age.as_secs_f64()
                    ));
                }
                if at.is_some_and(|t| t >= through) {
                    return TailWait::CaughtUp;
                }
            }
        }
        if start.elapsed() >= timeout {
            let at = applied_through.map_or("nothing yet".to_string(), |t| t.to_rfc3339());
            return TailWait::Behind(format!(
                "the tail is not keeping up: after {:.0} s it has applied through {at}, the re-check needs {}",
                timeout.as_secs_f64(),
                through.to_rfc3339()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The verdict of a re-check.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Transient: the target caught up (or the source item went away).
    Resolved,
    Confirmed(Mismatch),
    Unconfirmed(Mismatch, String),
}

/// Re-check forward candidates (see docs/verify.md for why this is sound):
/// round by round, after the tail has applied the source writes up to the
/// previous read plus a margin, read the target and then the source
/// (consistently). Equal: transient. Different with a source item unchanged
/// since the previous round — same value, and no write counted by the stream
/// watch in between: confirmed. Without a tail, one immediate round.
pub(super) async fn recheck_forward(
    ctx: &Ctx,
    cands: Vec<Mismatch>,
    watcher: Option<&Watcher>,
) -> anyhow::Result<Vec<Verdict>> {
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    struct Open {
        cand: Mismatch,
        /// The target key to read this round.
        tk: Item,
        /// The source item as the previous round read it (None: absent).
        prev: Option<Option<Item>>,
        /// Writes to the source item the watch had seen before that read.
        prev_writes: Option<u64>,
        verdict: Option<Verdict>,
    }
    let mut open: Vec<Open> = cands
        .into_iter()
        .map(|c| Open {
            tk: c.target_key.clone().unwrap_or_default(),
            cand: c,
            prev: None,
            prev_writes: None,
            verdict: None,
        })
        .collect();
    let mut through = open
        .iter()
        .map(|o| o.cand.found_at_ms)
        .max()
        .map_or_else(Utc::now, ms_to_time)
        + MARGIN;
    let mut tail = true;
    for round in 0..MAX_ROUNDS {
        if open.iter().all(|o| o.verdict.is_some()) {
            break;
        }
        tracing::debug!(
            round,
            open = open.iter().filter(|o| o.verdict.is_none()).count(),
            "verify re-checks forward candidates"
        );
        if tail {
            match ctx.wait_tail(through).await {
                TailWait::CaughtUp => {}
                TailWait::NoTail => tail = false,
                TailWait::Behind(why) => {
                    for o in open.iter_mut().filter(|o| o.verdict.is_none()) {
                        o.verdict = Some(Verdict::Unconfirmed(o.cand.clone(), why.clone()));
                    }
                    break;
                }
            }
        }
        let live: Vec<usize> = (0..open.len())
            .filter(|&i| open[i].verdict.is_none())
            .collect();
        let tkeys: Vec<Item> = live.iter().map(|&i| open[i].tk.clone()).collect();
        let targets = ctx.get(true, &tkeys, true).await?;
        let skeys: Vec<Item> = live
            .iter()
            .map(|&i| open[i].cand.source_key.clone().unwrap_or_default())
            .collect();
        // Between the target read and the source read: the watch's count of
        // writes to each item, so the next round knows whether any came between.
        let writes = match watcher {
            Some(w) => match w.wait(Utc::now(), ctx.opts.recheck_timeout).await {
                Ok(()) => Some(ctx.ledger.lock().await.writes(&skeys, &sn)?),
                Err(why) => {
                    ctx.note(why.clone());
                    for &i in &live {
                        let o = &mut open[i];
                        o.verdict = Some(Verdict::Unconfirmed(o.cand.clone(), why.clone()));
                    }
                    break;
                }
            },
            None => None,
        };
        let sources = ctx.get(false, &skeys, true).await?;
        through = Utc::now() + MARGIN;
        for (n, i) in live.into_iter().enumerate() {
            let o = &mut open[i];
            let seen = writes.as_ref().map(|w| w[n]);
            let sk = encode_key(o.cand.source_key.as_ref().unwrap_or(&Item::new()), &sn);
            let src = sk.and_then(|k| sources.get(&k).cloned());
            let expected = match src.as_ref().map(|s| transform(&ctx.plan, s)) {
                Some(Outcome::Put { item, .. }) => item,
                // Gone, or no longer mapped: nothing is expected of the target here.
                _ => {
                    o.verdict = Some(Verdict::Resolved);
                    continue;
                }
            };
            let new_tk = key_item(&expected, &tn);
            if new_tk != o.tk {
                // The item moved to another target key: read that one next round.
                o.tk = new_tk;
                o.prev = Some(src);
                o.prev_writes = seen;
                continue;
            }
            let actual = encode_key(&o.tk, &tn).and_then(|k| targets.get(&k));
            if actual == Some(&expected) {
                o.verdict = Some(Verdict::Resolved);
                continue;
            }
            // Unchanged since the previous round: the same value, and (with a
            // watch) no write at all — an A→B→A rewrite reads the same.
            let stable = !tail
                || (o.prev.as_ref() == Some(&src) && (seen.is_none() || o.prev_writes == seen));
            if stable {
                let mut m = o.cand.clone();
                m.target_key = Some(o.tk.clone());
                (m.kind, m.attributes) = match actual {
                    Some(t) => (Kind::Different, differing_attributes(&expected, t)),
                    None => (Kind::Missing, Vec::new()),
                };
                o.verdict = Some(Verdict::Confirmed(m));
            } else {
                o.prev = Some(src);
                o.prev_writes = seen;
            }
        }
    }
    Ok(open
        .into_iter()
        .map(|o| {
            o.verdict.unwrap_or_else(|| {
                Verdict::Unconfirmed(
                    o.cand,
                    "the source item kept changing during the re-check".into(),
                )
            })
        })
        .collect())
}

/// A forward candidate's verdict counted (its `pending` is not taken
/// off: the caller does): the difference to record, if any.
pub(super) fn tally_forward(v: Verdict, delta: &mut Counts) -> Option<Mismatch> {
    match v {
        Verdict::Resolved => {
            delta.matched += 1;
            delta.resolved += 1;
            None
        }
        Verdict::Confirmed(m) => {
            match m.kind {
                Kind::Missing => delta.missing += 1,
                _ => delta.different += 1,
            }
            Some(m)
        }
        Verdict::Unconfirmed(m, why) => {
            delta.unconfirmed += 1;
            Some(unconfirmed(m, why))
        }
    }
}

/// An orphan candidate's verdict counted (its `pending_orphans` is not
/// taken off: the caller does); undecided after the last round is
/// unconfirmed. The difference to record, if any.
pub(super) fn tally_orphan(
    v: Option<Verdict>,
    m: Mismatch,
    delta: &mut Counts,
) -> Option<Mismatch> {
    let v = v.unwrap_or_else(|| {
        Verdict::Unconfirmed(
            m,
            "the source item kept changing during the re-check".into(),
        )
    });
    match v {
        Verdict::Resolved => {
            delta.target_matched += 1;
            delta.resolved += 1;
            None
        }
        Verdict::Confirmed(m) => {
            delta.orphans += 1;
            Some(m)
        }
        Verdict::Unconfirmed(m, why) => {
            delta.unconfirmed_orphans += 1;
            Some(unconfirmed(m, why))
        }
    }
}

pub(super) fn unconfirmed(mut m: Mismatch, why: String) -> Mismatch {
    m.suspected = Some(m.kind);
    m.kind = Kind::Unconfirmed;
    m.reason = Some(why);
    m
}

/// Settle every forward candidate, a batch at a time, each batch committed,
/// under a stream watch that counts writes to the candidates' source items.
pub(super) async fn recheck_forward_all(ctx: &Arc<Ctx>) -> anyhow::Result<()> {
    if ctx.ledger.lock().await.counts.pending == 0 {
        return Ok(());
    }
    ctx.ledger.lock().await.store.remove_prefix(WRITES)?;
    let watcher = Watcher::start(ctx).await?;
    settle_forward(ctx, watcher.as_ref()).await?;
    if let Some(w) = watcher {
        w.stop().await;
    }
    Ok(())
}

/// Candidates settled together: one wait for the tails and the watch per
/// round serves them all (their reads go a BatchGetItem's worth at a time).
/// At one BatchGetItem's worth a batch, 118 candidates waited twice for the
/// watch (9–15 s each on a noisy 40-shard stream); the batch is committed
/// whole, so this also bounds what a kill -9 makes verify re-check.
const RECHECK_BATCH: usize = 1000;

/// The next candidates to settle (up to [`RECHECK_BATCH`]).
pub(super) async fn next_candidates(
    ctx: &Ctx,
    prefix: &str,
) -> anyhow::Result<Vec<(String, Mismatch)>> {
    let l = ctx.ledger.lock().await;
    Ok(l.store
        .iter_prefix::<Mismatch>(prefix)
        .take(RECHECK_BATCH)
        .collect::<Result<_, _>>()?)
}

pub(super) async fn settle_forward(ctx: &Ctx, watcher: Option<&Watcher>) -> anyhow::Result<()> {
    loop {
        let batch = next_candidates(ctx, CAND).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let (keys, cands): (Vec<String>, Vec<Mismatch>) = batch.into_iter().unzip();
        let verdicts = recheck_forward(ctx, cands, watcher).await?;
        let mut delta = Counts::default();
        let mut b = StoreBatch::default();
        for (key, v) in keys.iter().zip(verdicts) {
            b.remove(key);
            delta.pending = delta.pending.wrapping_sub(1);
            let id = &key[CAND.len()..];
            if let Some(m) = tally_forward(v, &mut delta) {
                b.put(&format!("{MM}f{id}"), &m)?;
            }
        }
        ctx.ledger.lock().await.commit(b, &delta)?;
    }
}

/// The stream watch, polled in the background; touches go into the verify
/// store before `through` moves past them. While a caller waits, the same
/// task writes probe markers for the shards not yet read past the wait
/// ([`probe`]).
pub(super) struct Watcher {
    pub(super) state: Arc<std::sync::Mutex<WatchState>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub(super) struct WatchState {
    pub(super) through: f64,
    pub(super) error: Option<String>,
    /// The instant a caller waits for the watch to pass (seconds since the
    /// epoch; −∞: nobody waits): probes go out while `through` is short of it.
    pub(super) want: f64,
    /// Probe rounds written so far.
    pub(super) probes: u32,
    /// [`Watcher::stop`] asked the task to end.
    pub(super) stop: bool,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Watcher {
    /// A watch from now on, polled in the background until dropped; None when
    /// the source has no stream.
    pub(super) async fn start(ctx: &Arc<Ctx>) -> anyhow::Result<Option<Watcher>> {
        Ok(crate::phase::watch::Watch::start(&ctx.clients, &ctx.plan)
            .await?
            .map(|w| Watcher::spawn(ctx.clone(), w)))
    }

    pub(super) fn spawn(ctx: Arc<Ctx>, mut watch: crate::phase::watch::Watch) -> Watcher {
        let state = Arc::new(std::sync::Mutex::new(WatchState {
            through: f64::NEG_INFINITY,
            error: None,
            want: f64::NEG_INFINITY,
            probes: 0,
            stop: false,
        }));
        let shared = state.clone();
        let watching = async move {
            let sn = ctx.src_names();
            let mut probing: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
            let mut probed: Option<Instant> = None;
            loop {
                if shared.lock().unwrap_or_else(|e| e.into_inner()).stop {
                    if let Some(handle) = probing {
                        let _ = handle.await;
                    }
                    return;
                }
                let step: anyhow::Result<f64> = async {
                    let touches = watch.poll().await?;
                    if !touches.is_empty() {
                        ctx.ledger.lock().await.record_touches(&touches, &sn)?;
                    }
                    Ok(watch.through().unwrap_or(f64::NEG_INFINITY))
                }
                .await;
                let (through, want) = {
                    let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
                    match step {
                        Ok(t) => s.through = t,
                        Err(e) => s.error = Some(format!("the stream watch stopped: {e:#}")),
                    }
                    if s.error.is_some() {
                        return;
                    }
                    (s.through, s.want)
                };
                // A finished probe's error stops the watch.
                if let Some(handle) = probing.take_if(|h| h.is_finished())
                    && let Ok(Err(why)) = handle.await
                {
                    shared.lock().unwrap_or_else(|e| e.into_inner()).error = Some(why);
                    return;
                }
                // While a caller waits: a round at most every ROUND_EVERY,
                // one at a time.
                let due = probed.is_none_or(|p| p.elapsed() >= crate::phase::markers::ROUND_EVERY);
                if probing.is_none() && due && through < want {
                    let targets = watch.probe_targets(want);
                    shared.lock().unwrap_or_else(|e| e.into_inner()).probes += 1;
                    let ctx = ctx.clone();
                    probed = Some(Instant::now());
                    let probing_now = async move { probe(&ctx, targets).await };
                    probing = Some(tokio::spawn(probing_now.in_current_span()));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let task = tokio::spawn(watching.in_current_span());
        Watcher {
            state,
            task: Some(task),
        }
    }

    /// Ends the watch once the probe it is writing is done, so that a verify
    /// that ends leaves no marker in the source. (Dropped instead — an error
    /// or a stop — the task ends at once, and a cut-short round is swept by
    /// the next writer of markers: crate::state::markers.)
    pub(super) async fn stop(mut self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Wait until the watch has read every write before `t`. Quiet shards
    /// prove nothing by themselves: while this waits, the watch's task
    /// writes probe markers into the source (crate::phase::barrier) for
    /// them to show.
    pub(super) async fn wait(&self, t: DateTime<Utc>, timeout: Duration) -> Result<(), String> {
        let want = t.timestamp_millis() as f64 / 1000.0;
        let start = Instant::now();
        let probes_before = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.want = s.want.max(want);
            s.probes
        };
        loop {
            {
                let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(e) = &s.error {
                    return Err(e.clone());
                }
                if s.through >= want {
                    tracing::debug!(
                        waited_ms = start.elapsed().as_millis() as u64,
                        probes = s.probes - probes_before,
                        "verify waited for its stream watch"
                    );
                    return Ok(());
                }
            }
            if start.elapsed() >= timeout {
                return Err(format!(
                    "the stream watch did not reach {} within {:.0} s",
                    t.to_rfc3339(),
                    timeout.as_secs_f64()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One round of probe markers: the [`PROBE_KEYS`](crate::phase::markers::PROBE_KEYS)
/// markers `targets` when the watch knows one for each shard it waits on,
/// else the full round it names (first marker, size); nothing when the
/// source's key cannot carry a marker (numeric: then only traffic proves
/// anything).
async fn probe(ctx: &Ctx, targets: Result<Vec<u32>, (u32, u32)>) -> Result<(), String> {
    let key = &ctx.plan.source_key;
    if key.partition_key.ty == crate::core::value::ScalarType::N {
        return Ok(());
    }
    let ledger = ctx.opts.state_dir.markers();
    let markers = crate::phase::markers::Markers {
        clients: &ctx.clients,
        key,
        table: &ctx.plan.source_table,
        id: crate::phase::markers::PROBE_KEYS,
        started_at: crate::aws::streams::now_secs(),
        ledger: &ledger,
    };
    let written = match &targets {
        Ok(ns) => markers.these(ns).await,
        Err((from, n)) => markers.round(*from, *n).await,
    };
    written
        .map(|_| ())
        .map_err(|e| format!("the stream watch's probe: {e:#}"))
}
