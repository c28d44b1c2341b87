//! `rekey verify`: is the target exactly transform(source), both ways?
//!
//! * Forward: a parallel Scan of the source; each item goes through the pure
//!   [`transform`]; the expected items are fetched from the target by key with
//!   BatchGetItem and compared exactly (value equality: numbers by value, sets
//!   unordered). An item is matched, missing or different; rejects and skips are
//!   counted apart, so that `scanned = matched + mismatched + rejected + skipped`.
//! * Backward (orphans): a Scan of the target; each item must map back to a
//!   source item. With `source_key_prefix` the target item names its source: read
//!   it, transform it, and its target key must be this item's. Without it, the
//!   forward pass claimed every expected target key in an on-disk index
//!   (`<state dir>/verify/expected.redb`, [`crate::state::claims`]: flat memory); a
//!   target key not in it is a candidate.
//!
//! While the tail runs, source and target legitimately differ for a moment, so
//! a difference found at time T1 is only a candidate. It counts once it has
//! survived a re-check made after the tail has applied every source write up to
//! T1 + 1 s (the tail publishes `applied_through` in `<state dir>/tail/status.json`),
//! with a source item that was not written between two consistent reads — a
//! stream watch ([`crate::phase::watch`]) counts the writes, since equal content can
//! hide A→B→A (docs/verify.md).
//!
//! Checkpointed like the backfill: per Scan segment, the resume key, the
//! counters and the page's candidates are one atomic batch in the verify's own
//! sled store (`<state dir>/verify`), so a verify runs beside a tail and a
//! backfill, and resumes after kill -9.
//!
//! Invariant: for every committed page, `scanned = matched + missing +
//! different + unconfirmed + pending + rejected + skipped + unsampled`, and
//! on the target side `target_scanned = target_matched + orphans +
//! unconfirmed_orphans + pending_orphans`; at the end nothing is pending.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use md5::{Digest as _, Md5};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::rate::{Control, Rate};
use crate::aws::scan::{self, Page, ScanOptions, SegmentStart};
use crate::core::inverse::{InverseOutcome, InverseReason, Inverter};
use crate::core::plan::{Mode, Plan};
use crate::core::value::Item;
use crate::phase::error::{InputError, Stopped};
use crate::phase::progress::Progress;
use crate::state::snapshot::{Counts, VerifyResult, rfc3339};
use crate::state::{StateDir, StateStore};

/// Keys per BatchGetItem call (DynamoDB's limit).
use crate::aws::item::batch_get;

pub(crate) mod fleet;
mod forward;
pub(crate) mod inplace;
mod ledger;
mod orphans;
mod recheck;
mod repair;
mod report;
mod reverse;

use forward::forward;
use ledger::{Ledger, seg_key};
use orphans::{backward, orphan_pass, recheck_orphans_all};
pub(crate) use recheck::wait_for_tail;
pub use recheck::{TailWait, wait_for_fleet_tail};
use recheck::{Watcher, recheck_forward_all};
use repair::repair;
pub(crate) use report::render;
use report::write_mismatches;
pub(crate) use reverse::run_reverse;
/// How far past a candidate's discovery the tail must have applied.
const MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(1);
/// Re-check rounds before a candidate whose source keeps changing is unconfirmed.
const MAX_ROUNDS: usize = 5;

#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub state_dir: StateDir,
    pub segments: Option<u32>,
    pub page_limit: Option<i32>,
    /// Source reads (RCU/s or a share of provisioned); None: unlimited.
    pub read_rate: Option<Rate>,
    /// Target reads; None: unlimited.
    pub target_read_rate: Option<Rate>,
    /// WCU/s for `--repair`.
    pub write_rate: f64,
    /// How long a re-check waits for the tail.
    pub recheck_timeout: Duration,
    /// A tail status older than this means the tail is not running.
    pub stale_after: Duration,
    pub restart: bool,
    pub repair: bool,
    /// Percent of source items to verify (forward only); None: all, both ways.
    pub sample: Option<f64>,
    /// `--reverse`: the source against inverse(target) ([`run_reverse`]).
    pub reverse: bool,
    pub max_retries: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Step {
    Forward,
    Recheck,
    Backward,
    OrphanPass,
    OrphanRecheck,
    Done,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunMeta {
    #[serde(with = "rfc3339")]
    started_at: DateTime<Utc>,
    sample: Option<f64>,
    segments: u32,
    phase: Step,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SegState {
    After(Item),
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Missing,
    Different,
    Orphan,
    Unconfirmed,
}

/// A difference: a candidate while it awaits its re-check, then a mismatch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Mismatch {
    pub kind: Kind,
    /// For `unconfirmed`: what it looked like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspected: Option<Kind>,
    pub source_key: Option<Item>,
    pub target_key: Option<Item>,
    /// For `different`: the attributes that differ.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the difference was seen (ms since the epoch).
    #[serde(default)]
    pub found_at_ms: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Example {
    pub kind: Kind,
    /// The key as DynamoDB JSON; the operator surface redacts it before
    /// showing it (`ops::redact`), from `named_by`.
    pub key: String,
    /// The key the example is known by, and whether it is a target key.
    #[serde(skip)]
    pub named_by: Option<(Item, bool)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SampleEstimate {
    pub percent: f64,
    pub compared: u64,
    pub mismatched: u64,
    pub mismatch_rate: f64,
    /// Wilson score upper bound, 95 % confidence.
    pub mismatch_rate_upper_95: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RepairReport {
    pub rewritten: u64,
    pub deleted: u64,
    /// Keys whose source is gone or no longer maps: nothing to write.
    pub skipped: u64,
    /// Re-verified after the repair and still different (or unconfirmed).
    pub still_different: u64,
    pub examples: Vec<Example>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    #[serde(flatten)]
    pub result: VerifyResult,
    pub resumed: bool,
    /// Source items scanned by this process (less than the total after a resume).
    pub this_run_scanned: u64,
    pub consumed_rcu_source: f64,
    pub consumed_rcu_target: f64,
    pub elapsed_seconds: f64,
    pub mismatches_file: String,
    pub examples: Vec<Example>,
    /// Why candidates stayed unconfirmed, or how the re-check ran (no tail).
    pub notes: Vec<String>,
    pub sample: Option<SampleEstimate>,
    pub repair: Option<RepairReport>,
}

impl VerifyReport {
    /// Exit status 0 when clean (or when `--repair` left nothing different).
    pub fn ok(&self) -> bool {
        match &self.repair {
            Some(r) => {
                r.still_different == 0
                    && self.result.counts.unconfirmed + self.result.counts.unconfirmed_orphans == 0
            }
            None => self.result.clean,
        }
    }
}

// ---- pure helpers -------------------------------------------------------------

/// Whether `--sample percent` picks the item with this encoded source key: a
/// hash of the key, so every run picks the same items.
pub fn sampled(encoded_key: &[u8], percent: f64) -> bool {
    if percent >= 100.0 {
        return true;
    }
    let d = Md5::digest(encoded_key);
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    let x = u64::from_be_bytes(b) as f64 / 18_446_744_073_709_551_616.0;
    x < percent / 100.0
}

/// Wilson score interval's upper bound for `k` of `n` at 95 % confidence.
pub(crate) fn wilson_upper(k: u64, n: u64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let (n, p, z) = (n as f64, k as f64 / n as f64, 1.96f64);
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre + spread) / (1.0 + z2 / n)).min(1.0)
}

/// Attribute names whose values differ (or exist on one side only).
pub(crate) fn differing_attributes(expected: &Item, actual: &Item) -> Vec<String> {
    let names: BTreeSet<&String> = expected.keys().chain(actual.keys()).collect();
    names
        .into_iter()
        .filter(|n| expected.get(*n) != actual.get(*n))
        .cloned()
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn key_item(item: &Item, names: &[&str]) -> Item {
    names
        .iter()
        .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
        .collect()
}

/// The source key a target item keeps under `source_key_prefix`.
fn kept_source_key(plan: &Plan, target_item: &Item) -> Option<Item> {
    let prefix = plan.source_key_prefix.as_ref()?;
    plan.source_key
        .names()
        .iter()
        .map(|n| {
            target_item
                .get(&format!("{prefix}{n}"))
                .map(|v| (n.to_string(), v.clone()))
        })
        .collect()
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_else(Utc::now)
}

// ---- the run ------------------------------------------------------------------

const KEY_RUN: &str = "verify/run";
const KEY_COUNTS: &str = "verify/counts";
/// The last finished verify: what a cutover gate reads.
pub(crate) const KEY_LAST: &str = "verify/last";
const CAND: &str = "cand/";
const OCAND: &str = "ocand/";
const MM: &str = "mm/";
/// `touched/<target key hex>/<source key hex>` → source key: what the stream
/// watch saw map to a target key during the orphan pass (watch.rs).
const TOUCHED: &str = "touched/";
/// `writes/<source key hex>` → how many writes the stream watch has seen to a
/// source item that is a forward candidate or owns an orphan candidate.
const WRITES: &str = "writes/";
/// `owner/<source key hex>`: the item has mapped to an orphan candidate's key.
const OWNER: &str = "owner/";

struct Ctx {
    clients: Clients,
    plan: Plan,
    opts: VerifyOptions,
    /// The run's stop, handed to [`run`] (or [`fleet::run_fleet`]).
    stop: CancellationToken,
    src: Arc<Control>,
    tgt: Arc<Control>,
    ledger: Mutex<Ledger>,
    sample: Option<f64>,
    /// Record expected target keys for the orphan pass (no source_key_prefix, no sample).
    track_expected: bool,
    rcu_src: Mutex<f64>,
    rcu_tgt: Mutex<f64>,
    this_run: AtomicU64,
    waiting: AtomicBool,
    phase: std::sync::Mutex<Step>,
    notes: std::sync::Mutex<Vec<String>>,
    /// A fleet verify: the re-checks wait on the fleet tail's `TAIL` item,
    /// not on a tail's status file on this machine.
    fleet_tail: Option<crate::state::fleet::Fleet>,
    /// Target items name their source through the plan's inverse (a fleet
    /// verify of a plan without `source_key_prefix`, which has no index of
    /// expected keys): see [`Ctx::named_sources`].
    named_by_inverse: bool,
}

/// What a target item says of the source item it came from.
#[derive(Debug, Clone, PartialEq)]
enum Named {
    /// The source item's key.
    Source(Item),
    /// No source item maps to it: it carries no source key, or no rule's
    /// target shapes read it.
    Nothing,
    /// The plan's inverse cannot tell (an ambiguous key, a computed part
    /// that does not recompute): a candidate it cannot settle.
    Unreadable(String),
}

impl Named {
    fn key(&self) -> Option<&Item> {
        match self {
            Named::Source(k) => Some(k),
            _ => None,
        }
    }
}

impl Ctx {
    fn src_names(&self) -> Vec<&str> {
        self.plan.source_key.names()
    }
    fn tgt_names(&self) -> Vec<&str> {
        self.plan.target_key.names()
    }
    /// Whether target items name their source item (`source_key_prefix`, or
    /// the inverse), so that an orphan is read back item by item; else the
    /// orphan check needs the forward pass's index of expected keys.
    fn names_sources(&self) -> bool {
        self.plan.source_key_prefix.is_some() || self.named_by_inverse
    }

    /// The source item each target item names (see [`Ctx::names_sources`]).
    /// Through the inverse, no source item maps to an item no rule's target
    /// shapes read, one without its target key, or one whose computed key
    /// part (a shard) is not what its source key computes; the inverse never
    /// returns a wrong key, and anything else it cannot read is left
    /// unconfirmed rather than called an orphan ([`unreadable_key`] refuses
    /// the plans where that would be every item).
    ///
    /// [`unreadable_key`]: fleet::unreadable_key
    fn named_sources(&self, targets: &[&Item]) -> Vec<Named> {
        let named = |k: Option<Item>| k.map_or(Named::Nothing, Named::Source);
        if !self.named_by_inverse || self.plan.source_key_prefix.is_some() {
            return targets
                .iter()
                .map(|t| named(kept_source_key(&self.plan, t)))
                .collect();
        }
        let inverse = Inverter::keys(&self.plan);
        let sn = self.src_names();
        targets
            .iter()
            .map(|t| match inverse.invert(t) {
                InverseOutcome::Put { item, .. } => Named::Source(key_item(&item, &sn)),
                InverseOutcome::Skip => Named::Nothing,
                InverseOutcome::Reject(r) => match r.reason {
                    InverseReason::NoRuleMatched
                    | InverseReason::MissingTargetKey(_)
                    | InverseReason::ComputedMismatch { .. } => Named::Nothing,
                    _ => Named::Unreadable(format!("the plan's inverse cannot read it back: {r}")),
                },
            })
            .collect()
    }

    fn note(&self, text: String) {
        let mut n = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        if !n.contains(&text) {
            n.push(text);
        }
    }
    fn set_phase(&self, p: Step) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }

    async fn get(
        &self,
        target: bool,
        keys: &[Item],
        consistent: bool,
    ) -> anyhow::Result<HashMap<Vec<u8>, Item>> {
        let (table, names, control, rcu) = if target {
            (
                &self.plan.target_table,
                self.tgt_names(),
                &self.tgt,
                &self.rcu_tgt,
            )
        } else {
            (
                &self.plan.source_table,
                self.src_names(),
                &self.src,
                &self.rcu_src,
            )
        };
        let (found, used) = batch_get(
            &self.clients,
            table,
            &names,
            keys,
            consistent,
            control,
            self.opts.max_retries,
        )
        .await?;
        *rcu.lock().await += used;
        Ok(found)
    }

    async fn wait_tail(&self, through: DateTime<Utc>) -> TailWait {
        self.waiting.store(true, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let (timeout, stale) = (self.opts.recheck_timeout, self.opts.stale_after);
        let w = match &self.fleet_tail {
            Some(f) => wait_for_fleet_tail(f, through, timeout, stale).await,
            None => wait_for_tail(&self.opts.state_dir, through, timeout, stale).await,
        };
        self.waiting.store(false, Ordering::Relaxed);
        tracing::debug!(
            waited_ms = started.elapsed().as_millis() as u64,
            caught_up = matches!(w, TailWait::CaughtUp),
            "verify waited for the tail"
        );
        match &w {
            TailWait::NoTail => self.note(
                "no tail status file: re-checked once, immediately, assuming the application has stopped writing".into(),
            ),
            TailWait::Behind(m) => self.note(m.clone()),
            TailWait::CaughtUp => {}
        }
        w
    }

    /// Resume points of one Scan pass.
    async fn starts(&self, pass: &str, segments: u32) -> anyhow::Result<Vec<SegmentStart>> {
        let l = self.ledger.lock().await;
        (0..segments)
            .map(|n| {
                Ok(match l.store.get::<SegState>(&seg_key(pass, n))? {
                    None => SegmentStart::Beginning,
                    Some(SegState::After(k)) => SegmentStart::After(k),
                    Some(SegState::Done) => SegmentStart::Done,
                })
            })
            .collect()
    }
}

fn seg_state(page: &Page) -> SegState {
    match &page.next {
        Some(k) => SegState::After(k.clone()),
        None => SegState::Done,
    }
}

/// Both tables described and their keys checked; the read budgets
/// (`--read-rate` on the source, `--target-read-rate` on the target) in
/// capacity units, a share of provisioned capacity resolved.
struct Tables {
    source: crate::aws::TableInfo,
    src_rate: Option<f64>,
    tgt_rate: Option<f64>,
}

async fn tables(clients: &Clients, plan: &Plan, opts: &VerifyOptions) -> anyhow::Result<Tables> {
    let source = clients.describe_table(&plan.source_table).await?;
    source.check_key(&plan.source_key, "source")?;
    let target = clients.describe_table(&plan.target_table).await?;
    target.check_key(&plan.target_key, "target")?;
    let rate = |r: Option<Rate>, t: &crate::aws::TableInfo| {
        r.map(|r| r.resolve(&t.name, t.provisioned_read, "read"))
            .transpose()
            .map_err(InputError)
    };
    Ok(Tables {
        src_rate: rate(opts.read_rate, &source)?,
        tgt_rate: rate(opts.target_read_rate, &target)?,
        source,
    })
}

/// Verifies both ways (or a sample forwards). Once `stop` is cancelled
/// (Ctrl-C, SIGTERM, `rekey run` stopping) it checkpoints and returns
/// `Stopped`; a rerun resumes.
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &VerifyOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<VerifyReport> {
    check_inputs(plan, opts)?;
    let started = Instant::now();
    let Tables {
        source,
        src_rate,
        tgt_rate,
    } = tables(clients, plan, opts).await?;

    let store = StateStore::open(&opts.state_dir.verify_store(), plan)?;
    let expected = crate::state::claims::Claims::open(&opts.state_dir.expected_keys())?;
    let (mut meta, resumed) = open_run(&store, &expected, opts, source.size_bytes)?;
    let counts: Counts = store.get(KEY_COUNTS)?.unwrap_or_default();
    let ctx = Arc::new(Ctx {
        clients: clients.clone(),
        plan: plan.clone(),
        opts: opts.clone(),
        stop: stop.clone(),
        src: Arc::new(Control::new(src_rate, None)),
        tgt: Arc::new(Control::new(tgt_rate, Some(opts.write_rate))),
        ledger: Mutex::new(Ledger {
            store,
            expected,
            counts,
        }),
        sample: meta.sample,
        track_expected: plan.source_key_prefix.is_none() && meta.sample.is_none(),
        rcu_src: Mutex::new(0.0),
        rcu_tgt: Mutex::new(0.0),
        this_run: AtomicU64::new(0),
        waiting: AtomicBool::new(false),
        phase: std::sync::Mutex::new(meta.phase),
        notes: std::sync::Mutex::new(Vec::new()),
        fleet_tail: None,
        named_by_inverse: false,
    });

    progress.start("verify", Some(source.item_count));
    let ticker = spawn_ticker(
        ctx.clone(),
        progress.clone(),
        opts.state_dir.verify_progress_log(),
    );
    let result = drive(&ctx, &mut meta).await;
    ticker.abort();
    let _ = ticker.await;
    progress.finish();
    result?;

    let counts = ctx.ledger.lock().await.counts;
    anyhow::ensure!(
        counts.accounted() && counts.pending == 0 && counts.pending_orphans == 0,
        "verify counters do not add up: {counts:?}"
    );
    let finished = VerifyResult {
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        plan_fingerprint: plan.fingerprint.clone(),
        started_at: meta.started_at,
        finished_at: Utc::now(),
        clean: counts.differences() == 0,
        sample_percent: meta.sample,
        reverse: false,
        counts,
    };
    let mismatches_file = opts.state_dir.mismatches();
    let examples = {
        let l = ctx.ledger.lock().await;
        let examples = write_mismatches(&l.store, &mismatches_file)?;
        l.store.put(KEY_LAST, &finished)?;
        l.store.flush()?;
        examples
    };
    crate::state::snapshot::publish(&opts.state_dir.verify_snapshot(), &finished)?;

    let repair = if opts.repair && counts.differences() > 0 {
        Some(repair(&ctx).await?)
    } else {
        None
    };
    let sample = meta.sample.map(|percent| sample_estimate(percent, &counts));
    let notes = ctx.notes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(VerifyReport {
        result: finished,
        resumed,
        this_run_scanned: ctx.this_run.load(Ordering::Relaxed),
        consumed_rcu_source: *ctx.rcu_src.lock().await,
        consumed_rcu_target: *ctx.rcu_tgt.lock().await,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        mismatches_file: mismatches_file.display().to_string(),
        examples,
        notes,
        sample,
        repair,
    })
}

fn check_inputs(plan: &Plan, opts: &VerifyOptions) -> anyhow::Result<()> {
    if plan.mode == Mode::InPlace {
        return Err(InputError(format!(
            "{}: source and target are the same table; verify compares two tables",
            plan.path.display()
        ))
        .into());
    }
    if let Some(p) = opts.sample
        && !(p > 0.0 && p <= 100.0)
    {
        return Err(InputError(format!(
            "--sample {p}: give a percentage above 0, at most 100"
        ))
        .into());
    }
    Ok(())
}

/// The run to continue, or a new one: a finished run, --restart, or a
/// different --sample starts from scratch. True when resumed.
fn open_run(
    store: &StateStore,
    expected: &crate::state::claims::Claims,
    opts: &VerifyOptions,
    source_bytes: u64,
) -> anyhow::Result<(RunMeta, bool)> {
    let mut meta = store.get::<RunMeta>(KEY_RUN)?;
    let resumed = match &meta {
        Some(m) if m.phase != Step::Done && !opts.restart && m.sample == opts.sample => true,
        _ => {
            for p in [
                "verify/fwd/",
                "verify/bwd/",
                "verify/p2/",
                CAND,
                OCAND,
                MM,
                TOUCHED,
                WRITES,
                OWNER,
            ] {
                store.remove_prefix(p)?;
            }
            expected.clear()?;
            store.remove(KEY_COUNTS)?;
            meta = None;
            false
        }
    };
    let meta = match meta {
        Some(m) => m,
        None => {
            let m = RunMeta {
                started_at: Utc::now(),
                sample: opts.sample,
                segments: opts
                    .segments
                    .unwrap_or_else(|| scan::default_segments(source_bytes, 4)),
                phase: Step::Forward,
            };
            store.put(KEY_RUN, &m)?;
            store.flush()?;
            m
        }
    };
    Ok((meta, resumed))
}

fn sample_estimate(percent: f64, counts: &Counts) -> SampleEstimate {
    let compared = counts.matched + counts.mismatched();
    SampleEstimate {
        percent,
        compared,
        mismatched: counts.mismatched(),
        mismatch_rate: if compared == 0 {
            0.0
        } else {
            counts.mismatched() as f64 / compared as f64
        },
        mismatch_rate_upper_95: wilson_upper(counts.mismatched(), compared),
    }
}

fn spawn_ticker(ctx: Arc<Ctx>, progress: Progress, log: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut samples = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .ok();
        let t0 = Instant::now();
        let (mut last_src, mut last_tgt) = (0.0, 0.0);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            ctx.src.tick().await;
            ctx.tgt.tick().await;
            let c = ctx.ledger.lock().await.counts;
            let phase = *ctx.phase.lock().unwrap_or_else(|e| e.into_inner());
            let waiting = ctx.waiting.load(Ordering::Relaxed);
            let (src, tgt) = (*ctx.rcu_src.lock().await, *ctx.rcu_tgt.lock().await);
            let json = serde_json::json!({
                "phase": phase,
                "counts": c,
                "waiting_for_tail": waiting,
                "source_rcu_per_sec": src - last_src,
                "target_rcu_per_sec": tgt - last_tgt,
            });
            progress.status(
                format!(
                    "{phase:?}: {:.0} + {:.0} RCU/s, matched {}, candidates {}, differences {}, target {}{}",
                    src - last_src,
                    tgt - last_tgt,
                    c.matched,
                    c.pending + c.pending_orphans,
                    c.differences(),
                    c.target_scanned,
                    if waiting { ", waiting for the tail" } else { "" }
                ),
                json.clone(),
            );
            (last_src, last_tgt) = (src, tgt);
            if let Some(f) = samples.as_mut() {
                use std::io::Write as _;
                let mut line = json;
                line["t"] = t0.elapsed().as_secs_f64().into();
                line["scanned"] = c.scanned.into();
                let _ = writeln!(f, "{line}");
            }
            progress.update(c.scanned, 0.0);
        }
    })
}

/// The steps from where the last run stopped. A stop (`ctx.stop`) ends
/// any step at once: a scan pass abandons its pages in flight (each page's
/// comparison commits with its checkpoint, so an abandoned page is read
/// again), a re-check its round or its wait; everything settled so far is
/// checkpointed, and a rerun goes on from the step it was in.
async fn drive(ctx: &Arc<Ctx>, meta: &mut RunMeta) -> anyhow::Result<()> {
    let stop = ctx.stop.clone();
    loop {
        ctx.set_phase(meta.phase);
        let started = std::time::Instant::now();
        let next = tokio::select! {
            next = step(ctx, meta) => next?,
            () = stop.cancelled() => return Err(Stopped.into()),
        };
        if stop.is_cancelled() {
            return Err(Stopped.into());
        }
        if next == Step::Done && meta.phase == Step::Done {
            return Ok(());
        }
        tracing::info!(
            step = ?meta.phase,
            took_ms = started.elapsed().as_millis() as u64,
            "verify step done"
        );
        ctx.ledger.lock().await.set_phase(meta, next)?;
    }
}

/// One step; the step after it.
async fn step(ctx: &Arc<Ctx>, meta: &RunMeta) -> anyhow::Result<Step> {
    let segments = meta.segments;
    Ok(match meta.phase {
        Step::Forward => {
            forward(ctx, segments).await?;
            Step::Recheck
        }
        Step::Recheck => {
            recheck_forward_all(ctx).await?;
            if ctx.sample.is_some() {
                Step::Done
            } else {
                Step::Backward
            }
        }
        Step::Backward => {
            backward(ctx, segments).await?;
            if ctx.plan.source_key_prefix.is_some() {
                Step::OrphanRecheck
            } else {
                Step::OrphanPass
            }
        }
        // Without the prefix the re-check needs the stream watch the pass
        // started, which does not survive a restart: pass and re-check are
        // one phase, redone together.
        Step::OrphanPass => {
            orphan_pass(ctx, segments).await?;
            Step::Done
        }
        Step::OrphanRecheck if ctx.plan.source_key_prefix.is_none() => {
            orphan_pass(ctx, segments).await?;
            Step::Done
        }
        Step::OrphanRecheck => {
            let watcher = Watcher::start(ctx).await?;
            recheck_orphans_all(ctx, watcher.as_ref()).await?;
            if let Some(w) = watcher {
                w.stop().await;
            }
            Step::Done
        }
        Step::Done => Step::Done,
    })
}

fn scan_opts(ctx: &Ctx, table: &str, segments: u32) -> ScanOptions {
    ScanOptions {
        table: table.to_string(),
        segments,
        page_limit: ctx.opts.page_limit,
        consistent_read: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::Value;
    use crate::core::value::encode_key;

    #[test]
    fn counts_add_up_scanned_is_matched_mismatched_rejected_skipped() {
        let mut c = Counts::default();
        // A page: 10 scanned, 6 matched, 2 candidates, 1 rejected, 1 skipped.
        c.add(&Counts {
            scanned: 10,
            matched: 6,
            pending: 2,
            rejected: 1,
            skipped: 1,
            ..Default::default()
        });
        assert!(c.accounted());
        // The re-check: one transient, one missing.
        c.add(&Counts {
            pending: 0u64.wrapping_sub(2),
            matched: 1,
            resolved: 1,
            missing: 1,
            ..Default::default()
        });
        assert!(c.accounted(), "{c:?}");
        assert_eq!(c.pending, 0);
        assert_eq!(
            c.scanned,
            c.matched + c.mismatched() + c.rejected + c.skipped
        );
        // The target side.
        c.add(&Counts {
            target_scanned: 8,
            target_matched: 7,
            pending_orphans: 1,
            ..Default::default()
        });
        assert!(c.accounted());
        c.add(&Counts {
            pending_orphans: 0u64.wrapping_sub(1),
            orphans: 1,
            ..Default::default()
        });
        assert!(c.accounted());
        assert_eq!(c.differences(), 2);
        // Broken books are caught.
        c.scanned += 1;
        assert!(!c.accounted());
    }

    #[test]
    fn sampling_is_deterministic_and_close_to_the_share() {
        let keys: Vec<Vec<u8>> = (0..20_000)
            .map(|i| {
                let mut it = Item::new();
                it.insert("PK".into(), Value::S(format!("USER#{i}")));
                encode_key(&it, &["PK"]).unwrap()
            })
            .collect();
        let pick = |p: f64| keys.iter().filter(|k| sampled(k, p)).count();
        let first: Vec<bool> = keys.iter().map(|k| sampled(k, 10.0)).collect();
        let again: Vec<bool> = keys.iter().map(|k| sampled(k, 10.0)).collect();
        assert_eq!(first, again, "the same items every run");
        let n = pick(10.0);
        assert!((1_700..2_300).contains(&n), "{n}");
        assert_eq!(pick(100.0), keys.len());
        // A larger share picks a superset.
        assert!(keys.iter().all(|k| !sampled(k, 10.0) || sampled(k, 50.0)));
    }

    #[test]
    fn wilson_bound_is_above_the_rate_and_shrinks_with_n() {
        assert!(wilson_upper(0, 100) > 0.0 && wilson_upper(0, 100) < 0.05);
        assert!(wilson_upper(0, 10_000) < wilson_upper(0, 100));
        let u = wilson_upper(5, 100);
        assert!(u > 0.05 && u < 0.12, "{u}");
        assert_eq!(wilson_upper(0, 0), 1.0);
    }

    #[test]
    fn differing_attributes_use_value_equality() {
        let a: Item = serde_json::from_str(
            r#"{"PK":{"S":"a"},"n":{"N":"1.50"},"s":{"SS":["x","y"]},"gone":{"S":"q"}}"#,
        )
        .unwrap();
        let b: Item = serde_json::from_str(
            r#"{"PK":{"S":"a"},"n":{"N":"1.5"},"s":{"SS":["y","x"]},"new":{"BOOL":true}}"#,
        )
        .unwrap();
        assert_eq!(differing_attributes(&a, &b), vec!["gone", "new"]);
    }

    #[tokio::test]
    async fn tail_status_decides_the_wait() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let at = Utc::now();
        let quick = Duration::from_millis(300);
        let stale = Duration::from_secs(30);
        assert_eq!(
            wait_for_tail(&dir, at, quick, stale).await,
            TailWait::NoTail
        );
        std::fs::create_dir_all(dir.tail_store()).unwrap();
        let write = |updated: DateTime<Utc>, through: DateTime<Utc>| {
            std::fs::write(
                dir.tail_snapshot(),
                serde_json::json!({"pid": 1, "updated_at": updated.to_rfc3339(),
                    "applied_through": through.to_rfc3339(), "lag_seconds": 0.1,
                    "backfill_done": true, "shards": []})
                .to_string(),
            )
            .unwrap();
        };
        write(Utc::now(), at + chrono::TimeDelta::seconds(2));
        assert_eq!(
            wait_for_tail(&dir, at, quick, stale).await,
            TailWait::CaughtUp
        );
        write(Utc::now(), at - chrono::TimeDelta::seconds(2));
        let TailWait::Behind(m) = wait_for_tail(&dir, at, quick, stale).await else {
            panic!()
        };
        assert!(m.contains("not keeping up"), "{m}");
        write(
            Utc::now() - chrono::TimeDelta::seconds(60),
            at + chrono::TimeDelta::seconds(2),
        );
        let TailWait::Behind(m) = wait_for_tail(&dir, at, quick, stale).await else {
            panic!()
        };
        assert!(m.contains("not running"), "{m}");
    }
}
