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
//! hide A→B→A (ARCHITECTURE.md, "Verify: no false alarms, no missed drift").
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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use md5::{Digest as _, Md5};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::rate::{Control, Rate};
use crate::aws::scan::{self, Page, ScanOptions, SegmentStart};
use crate::aws::write::write_batch;
use crate::core::plan::{Mode, Plan};
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::phase::error::{InputError, Stopped};
use crate::phase::progress::Progress;
use crate::phase::watch::Touch;
use crate::state::StateDir;
use crate::state::snapshot::{Counts, VerifyResult, rfc3339};
use crate::state::{StateStore, StoreBatch};

/// Keys per BatchGetItem call (DynamoDB's limit).
use crate::aws::item::{GET_BATCH, batch_get};
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
    pub max_retries: u32,
    /// Cancelled (Ctrl-C, SIGTERM, `rekey run` stopping): checkpoint and
    /// return `Stopped`; a rerun resumes.
    pub stop: CancellationToken,
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
pub struct Mismatch {
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
pub fn wilson_upper(k: u64, n: u64) -> f64 {
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
pub fn differing_attributes(expected: &Item, actual: &Item) -> Vec<String> {
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

/// Wait until the tail has applied every source write before `through`.
pub async fn wait_for_tail(
    state_dir: &StateDir,
    through: DateTime<Utc>,
    timeout: Duration,
    stale_after: Duration,
) -> TailWait {
    let path = state_dir.tail_snapshot();
    let start = Instant::now();
    loop {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return TailWait::NoTail,
            Err(e) => return TailWait::Behind(format!("cannot read {}: {e}", path.display())),
        };
        // A half-written file cannot happen (tmp + rename); an unreadable one is a
        // tail of another version: treat it as not keeping up.
        let status: Option<crate::state::snapshot::TailStatus> = serde_json::from_str(&text).ok();
        if status.as_ref().is_some_and(|s| s.stopped) {
            return TailWait::NoTail;
        }
        let applied_through = status.as_ref().and_then(|s| s.applied_through);
        if let Some(s) = &status {
            let updated = s.updated_at;
            let age = (Utc::now() - updated).to_std().unwrap_or_default();
            if age > stale_after {
                return TailWait::Behind(format!(
                    "the tail is not running: {} was last updated {:.0} s ago",
                    path.display(),
                    age.as_secs_f64()
                ));
            }
            if applied_through.is_some_and(|t| t >= through) {
                return TailWait::CaughtUp;
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

// ---- the run ------------------------------------------------------------------

const KEY_RUN: &str = "verify/run";
const KEY_COUNTS: &str = "verify/counts";
/// The last finished verify: what a cutover gate reads.
pub const KEY_LAST: &str = "verify/last";
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

fn seg_key(pass: &str, n: u32) -> String {
    format!("verify/{pass}/{n:05}")
}

struct Ledger {
    store: StateStore,
    /// The expected target keys (target key → source key), for the orphan
    /// pass without a source_key_prefix: on redb, flat in memory (claims.rs).
    expected: crate::state::claims::Claims,
    counts: Counts,
}

impl Ledger {
    /// Counters move only with their page's checkpoint: one atomic, flushed batch.
    fn commit(&mut self, mut batch: StoreBatch, delta: &Counts) -> anyhow::Result<()> {
        let mut next = self.counts;
        next.add(delta);
        debug_assert!(next.accounted(), "{next:?}");
        batch.put(KEY_COUNTS, &next)?;
        self.store.apply(batch)?;
        self.store.flush()?;
        self.counts = next;
        Ok(())
    }

    /// What the stream watch saw, kept only where a re-check will ask: the
    /// items that mapped to an orphan candidate's key (they become its owners),
    /// and a count of writes to every owner and forward candidate.
    fn record_touches(&self, touches: &[Touch], sn: &[&str]) -> anyhow::Result<()> {
        let mut b = StoreBatch::default();
        let mut writes: HashMap<String, u64> = HashMap::new();
        let mut owners = std::collections::HashSet::new();
        for t in touches {
            let sk = encode_key(&t.source_key, sn).unwrap_or_default();
            let owner = format!("{OWNER}{}", hex(&sk));
            if let Some(tk) = &t.target_key
                && self.store.contains(&format!("{OCAND}{}", hex(tk)))?
            {
                b.put(&touch_key(tk, &sk), &t.source_key)?;
                b.put(&owner, &true)?;
                owners.insert(owner.clone());
            }
            let counted = owners.contains(&owner)
                || self.store.contains(&owner)?
                || self.store.contains(&format!("{CAND}{}", hex(&sk)))?;
            if counted {
                let key = format!("{WRITES}{}", hex(&sk));
                let n = match writes.get(&key) {
                    Some(n) => *n,
                    None => self.store.get::<u64>(&key)?.unwrap_or(0),
                };
                writes.insert(key, n + 1);
            }
        }
        for (k, n) in &writes {
            b.put(k, n)?;
        }
        Ok(self.store.apply(b)?)
    }

    /// Writes the watch has recorded to each item (see `record_touches`).
    fn writes(&self, source_keys: &[Item], sn: &[&str]) -> anyhow::Result<Vec<u64>> {
        source_keys
            .iter()
            .map(|k| {
                let sk = encode_key(k, sn).unwrap_or_default();
                Ok(self
                    .store
                    .get::<u64>(&format!("{WRITES}{}", hex(&sk)))?
                    .unwrap_or(0))
            })
            .collect()
    }

    fn set_phase(&mut self, meta: &mut RunMeta, phase: Step) -> anyhow::Result<()> {
        meta.phase = phase;
        self.store.put(KEY_RUN, meta)?;
        self.store.flush()?;
        Ok(())
    }
}

struct Ctx {
    clients: Clients,
    plan: Plan,
    opts: VerifyOptions,
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
}

impl Ctx {
    fn src_names(&self) -> Vec<&str> {
        self.plan.source_key.names()
    }
    fn tgt_names(&self) -> Vec<&str> {
        self.plan.target_key.names()
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
        let w = wait_for_tail(
            &self.opts.state_dir,
            through,
            self.opts.recheck_timeout,
            self.opts.stale_after,
        )
        .await;
        self.waiting.store(false, Ordering::Relaxed);
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

pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &VerifyOptions,
    progress: &Progress,
) -> anyhow::Result<VerifyReport> {
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
    let started = Instant::now();
    let source = clients.describe_table(&plan.source_table).await?;
    source.check_key(&plan.source_key, "source")?;
    let target = clients.describe_table(&plan.target_table).await?;
    target.check_key(&plan.target_key, "target")?;
    let src_rate = opts
        .read_rate
        .map(|r| r.resolve(&source.name, source.provisioned_read, "read"))
        .transpose()
        .map_err(InputError)?;
    let tgt_rate = opts
        .target_read_rate
        .map(|r| r.resolve(&target.name, target.provisioned_read, "read"))
        .transpose()
        .map_err(InputError)?;

    let store = StateStore::open(&opts.state_dir.verify_store(), plan)?;
    let expected = crate::state::claims::Claims::open(&opts.state_dir.expected_keys())?;
    // A finished run, --restart, or a different --sample: a new run from scratch.
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
    let mut meta = match meta {
        Some(m) => m,
        None => {
            let m = RunMeta {
                started_at: Utc::now(),
                sample: opts.sample,
                segments: opts
                    .segments
                    .unwrap_or_else(|| scan::default_segments(source.size_bytes, 4)),
                phase: Step::Forward,
            };
            store.put(KEY_RUN, &m)?;
            store.flush()?;
            m
        }
    };
    let counts: Counts = store.get(KEY_COUNTS)?.unwrap_or_default();
    let ctx = Arc::new(Ctx {
        clients: clients.clone(),
        plan: plan.clone(),
        opts: opts.clone(),
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
    let sample = meta.sample.map(|percent| {
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
    });
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

/// The steps from where the last run stopped. A stop (`opts.stop`) ends a
/// scan pass after its pages in flight, and a re-check between rounds or
/// while it waits; either way everything settled so far is checkpointed, and
/// a rerun goes on from the step it was in.
async fn drive(ctx: &Arc<Ctx>, meta: &mut RunMeta) -> anyhow::Result<()> {
    let stop = ctx.opts.stop.clone();
    loop {
        ctx.set_phase(meta.phase);
        let next = tokio::select! {
            next = step(ctx, meta) => next?,
            () = stop.cancelled(), if !is_scan_pass(meta.phase) => return Err(Stopped.into()),
        };
        if stop.is_cancelled() {
            return Err(Stopped.into());
        }
        if next == Step::Done && meta.phase == Step::Done {
            return Ok(());
        }
        ctx.ledger.lock().await.set_phase(meta, next)?;
    }
}

/// Scan passes stop on their own, after the pages in flight.
fn is_scan_pass(s: Step) -> bool {
    matches!(s, Step::Forward | Step::Backward | Step::OrphanPass)
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
        stop: ctx.opts.stop.clone(),
    }
}

// ---- forward ------------------------------------------------------------------

/// Which table a pass scans.
#[derive(Clone, Copy)]
enum Side {
    Source,
    Target,
}

/// One Scan pass, resumed from its checkpoints (`verify/<pass>/…`), each page
/// handed to `on_page` (which commits the page's checkpoint).
async fn scan_pass<F, Fut>(
    ctx: &Arc<Ctx>,
    pass: &str,
    side: Side,
    segments: u32,
    on_page: F,
) -> anyhow::Result<()>
where
    F: Fn(Arc<Ctx>, Page) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let starts = ctx.starts(pass, segments).await?;
    let (table, control) = match side {
        Side::Source => (&ctx.plan.source_table, ctx.src.clone()),
        Side::Target => (&ctx.plan.target_table, ctx.tgt.clone()),
    };
    let c = ctx.clone();
    scan::scan(
        &ctx.clients,
        &scan_opts(ctx, table, segments),
        starts,
        control,
        move |page: Page| on_page(c.clone(), page),
    )
    .await
}

async fn forward(ctx: &Arc<Ctx>, segments: u32) -> anyhow::Result<()> {
    scan_pass(ctx, "fwd", Side::Source, segments, |ctx, page| async move {
        forward_page(&ctx, page).await
    })
    .await
}

struct Expected {
    sk: Vec<u8>,
    tk: Vec<u8>,
    source_key: Item,
    item: Item,
}

async fn forward_page(ctx: &Ctx, page: Page) -> anyhow::Result<()> {
    *ctx.rcu_src.lock().await += page.consumed;
    let found_at = now_ms();
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let mut delta = Counts {
        scanned: page.items.len() as u64 + page.unreadable,
        rejected: page.unreadable,
        ..Default::default()
    };
    let mut puts = Vec::new();
    for item in &page.items {
        let sk = encode_key(item, &sn).unwrap_or_default();
        if let Some(p) = ctx.sample
            && !sampled(&sk, p)
        {
            delta.unsampled += 1;
            continue;
        }
        match transform(&ctx.plan, item) {
            Outcome::Put { item: out, .. } => puts.push(Expected {
                sk,
                tk: encode_key(&out, &tn).unwrap_or_default(),
                source_key: key_item(item, &sn),
                item: out,
            }),
            Outcome::Reject(_) => delta.rejected += 1,
            Outcome::Skip => delta.skipped += 1,
        }
    }
    let keys: Vec<Item> = puts.iter().map(|e| key_item(&e.item, &tn)).collect();
    let got = ctx.get(true, &keys, false).await?;

    // With source_key_prefix the target item names its writer. A target item
    // written from another source item that maps to the same key is a
    // collision (the backfill rejected one of the two), not a difference.
    let mut owners: HashMap<Vec<u8>, bool> = HashMap::new();
    if ctx.plan.source_key_prefix.is_some() {
        let others: Vec<Item> = puts
            .iter()
            .filter_map(|e| {
                let t = got.get(&e.tk)?;
                kept_source_key(&ctx.plan, t).filter(|k| *k != e.source_key)
            })
            .collect();
        if !others.is_empty() {
            let sources = ctx.get(false, &others, true).await?;
            for (sk, it) in sources {
                let maps = matches!(transform(&ctx.plan, &it), Outcome::Put { item, .. }
                    if puts.iter().any(|e| Some(&e.tk) == encode_key(&item, &tn).as_ref()));
                owners.insert(sk, maps);
            }
        }
    }

    let mut l = ctx.ledger.lock().await;
    let mut batch = StoreBatch::default();
    // Without the prefix: the first source item to claim a target key owns it.
    // Claims are durable before the page's checkpoint (claims.rs), so a
    // redone page re-claims with the same owners.
    let others: Vec<bool> = if ctx.track_expected {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            puts.iter().map(|e| (e.tk.clone(), e.sk.clone())).collect();
        l.expected
            .claim_all(&pairs)?
            .into_iter()
            .map(|o| o.is_some())
            .collect()
    } else {
        Vec::new()
    };
    for (i, e) in puts.into_iter().enumerate() {
        let target = got.get(&e.tk);
        let collision = if ctx.track_expected {
            others[i]
        } else {
            target
                .and_then(|t| kept_source_key(&ctx.plan, t))
                .filter(|k| *k != e.source_key)
                .and_then(|k| encode_key(&k, &sn))
                .is_some_and(|k| owners.get(&k).copied().unwrap_or(false))
        };
        if collision {
            delta.rejected += 1;
            delta.collisions += 1;
            continue;
        }
        let (kind, attributes) = match target {
            Some(t) if *t == e.item => {
                delta.matched += 1;
                continue;
            }
            Some(t) => (Kind::Different, differing_attributes(&e.item, t)),
            None => (Kind::Missing, Vec::new()),
        };
        delta.pending += 1;
        batch.put(
            &format!("{CAND}{}", hex(&e.sk)),
            &Mismatch {
                kind,
                suspected: None,
                source_key: Some(e.source_key),
                target_key: Some(key_item(&e.item, &tn)),
                attributes,
                reason: None,
                found_at_ms: found_at,
            },
        )?;
    }
    batch.put(&seg_key("fwd", page.segment), &seg_state(&page))?;
    ctx.this_run.fetch_add(delta.scanned, Ordering::Relaxed);
    l.commit(batch, &delta)
}

/// The verdict of a re-check.
#[derive(Debug)]
enum Verdict {
    /// Transient: the target caught up (or the source item went away).
    Resolved,
    Confirmed(Mismatch),
    Unconfirmed(Mismatch, String),
}

/// Re-check forward candidates (see ARCHITECTURE.md for why this is sound):
/// round by round, after the tail has applied the source writes up to the
/// previous read plus a margin, read the target and then the source
/// (consistently). Equal: transient. Different with a source item unchanged
/// since the previous round — same value, and no write counted by the stream
/// watch in between: confirmed. Without a tail, one immediate round.
async fn recheck_forward(
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
    for _round in 0..MAX_ROUNDS {
        if open.iter().all(|o| o.verdict.is_some()) {
            break;
        }
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

fn unconfirmed(mut m: Mismatch, why: String) -> Mismatch {
    m.suspected = Some(m.kind);
    m.kind = Kind::Unconfirmed;
    m.reason = Some(why);
    m
}

/// Settle every forward candidate, a batch at a time, each batch committed,
/// under a stream watch that counts writes to the candidates' source items.
async fn recheck_forward_all(ctx: &Arc<Ctx>) -> anyhow::Result<()> {
    if ctx.ledger.lock().await.counts.pending == 0 {
        return Ok(());
    }
    ctx.ledger.lock().await.store.remove_prefix(WRITES)?;
    let watcher = Watcher::start(ctx).await?;
    settle_forward(ctx, watcher.as_ref()).await
}

/// The next candidates to settle (up to one BatchGetItem's worth).
async fn next_candidates(ctx: &Ctx, prefix: &str) -> anyhow::Result<Vec<(String, Mismatch)>> {
    let l = ctx.ledger.lock().await;
    Ok(l.store
        .iter_prefix::<Mismatch>(prefix)
        .take(GET_BATCH)
        .collect::<Result<_, _>>()?)
}

async fn settle_forward(ctx: &Ctx, watcher: Option<&Watcher>) -> anyhow::Result<()> {
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
            match v {
                Verdict::Resolved => {
                    delta.matched += 1;
                    delta.resolved += 1;
                }
                Verdict::Confirmed(m) => {
                    match m.kind {
                        Kind::Missing => delta.missing += 1,
                        _ => delta.different += 1,
                    }
                    b.put(&format!("{MM}f{id}"), &m)?;
                }
                Verdict::Unconfirmed(m, why) => {
                    delta.unconfirmed += 1;
                    b.put(&format!("{MM}f{id}"), &unconfirmed(m, why))?;
                }
            }
        }
        ctx.ledger.lock().await.commit(b, &delta)?;
    }
}

// ---- backward -----------------------------------------------------------------

async fn backward(ctx: &Arc<Ctx>, segments: u32) -> anyhow::Result<()> {
    scan_pass(ctx, "bwd", Side::Target, segments, |ctx, page| async move {
        backward_page(&ctx, page).await
    })
    .await
}

async fn backward_page(ctx: &Ctx, page: Page) -> anyhow::Result<()> {
    *ctx.rcu_tgt.lock().await += page.consumed;
    let found_at = now_ms();
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let mut delta = Counts {
        target_scanned: page.items.len() as u64 + page.unreadable,
        // An item this SDK cannot read is not judged an orphan: nothing is known of it.
        target_matched: page.unreadable,
        ..Default::default()
    };
    // With the prefix: map each target item back to its source item.
    let mut maps_back: HashMap<Vec<u8>, bool> = HashMap::new();
    if ctx.plan.source_key_prefix.is_some() {
        let keys: Vec<Item> = page
            .items
            .iter()
            .filter_map(|t| kept_source_key(&ctx.plan, t))
            .collect();
        let sources = ctx.get(false, &keys, false).await?;
        for t in &page.items {
            let tk = encode_key(t, &tn).unwrap_or_default();
            let ok = kept_source_key(&ctx.plan, t)
                .and_then(|k| encode_key(&k, &sn))
                .and_then(|k| sources.get(&k))
                .is_some_and(|s| {
                    matches!(transform(&ctx.plan, s), Outcome::Put { item, .. }
                        if encode_key(&item, &tn).as_ref() == Some(&tk))
                });
            maps_back.insert(tk, ok);
        }
    }
    let mut l = ctx.ledger.lock().await;
    let mut batch = StoreBatch::default();
    for t in &page.items {
        let tk = encode_key(t, &tn).unwrap_or_default();
        let expected = match maps_back.get(&tk) {
            Some(ok) => *ok,
            None => l.expected.owner(&tk)?.is_some(),
        };
        if expected {
            delta.target_matched += 1;
            continue;
        }
        delta.pending_orphans += 1;
        if let Some(sk) = kept_source_key(&ctx.plan, t).and_then(|k| encode_key(&k, &sn)) {
            // The item it names: the re-check's watch counts writes to it.
            batch.put(&format!("{OWNER}{}", hex(&sk)), &true)?;
        }
        batch.put(
            &format!("{OCAND}{}", hex(&tk)),
            &Mismatch {
                kind: Kind::Orphan,
                suspected: None,
                source_key: kept_source_key(&ctx.plan, t),
                target_key: Some(key_item(t, &tn)),
                attributes: Vec::new(),
                reason: None,
                found_at_ms: found_at,
            },
        )?;
    }
    batch.put(&seg_key("bwd", page.segment), &seg_state(&page))?;
    l.commit(batch, &delta)
}

/// Without the prefix, the orphan re-check is a second pass over the source
/// that only computes target keys: every candidate some source item maps to
/// is resolved (the candidate set is sorted on disk; each computed key is
/// looked up in it). A stream watch runs from before the pass until the
/// candidates are settled, to see items that moved while the pass ran.
async fn orphan_pass(ctx: &Arc<Ctx>, segments: u32) -> anyhow::Result<()> {
    if ctx.ledger.lock().await.counts.pending_orphans == 0 {
        return Ok(());
    }
    {
        // A pass cut short by a restart lost its watch: start over.
        let l = ctx.ledger.lock().await;
        l.store.remove_prefix("verify/p2/")?;
        l.store.remove_prefix(TOUCHED)?;
        l.store.flush()?;
    }
    let watcher = Watcher::start(ctx).await?;
    scan_pass(ctx, "p2", Side::Source, segments, |ctx, page| async move {
        *ctx.rcu_src.lock().await += page.consumed;
        let tn = ctx.tgt_names();
        let mut l = ctx.ledger.lock().await;
        let mut batch = StoreBatch::default();
        let mut delta = Counts::default();
        let mut seen = std::collections::HashSet::new();
        for item in &page.items {
            if let Outcome::Put { item: out, .. } = transform(&ctx.plan, item) {
                let key = format!("{OCAND}{}", hex(&encode_key(&out, &tn).unwrap_or_default()));
                if seen.insert(key.clone()) && l.store.contains(&key)? {
                    batch.remove(&key);
                    delta.pending_orphans = delta.pending_orphans.wrapping_sub(1);
                    delta.target_matched += 1;
                    delta.resolved += 1;
                }
            }
        }
        batch.put(&seg_key("p2", page.segment), &seg_state(&page))?;
        l.commit(batch, &delta)
    })
    .await?;
    // The pass is over: candidates still open were read while the pass ran.
    {
        let l = ctx.ledger.lock().await;
        l.store.put("verify/p2_end_ms", &now_ms())?;
        l.store.flush()?;
    }
    recheck_orphans_all(ctx, watcher.as_ref()).await
}

/// The stream watch, polled in the background; touches go into the verify
/// store before `through` moves past them.
struct Watcher {
    state: Arc<std::sync::Mutex<WatchState>>,
    task: tokio::task::JoinHandle<()>,
}

struct WatchState {
    through: f64,
    error: Option<String>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watcher {
    /// A watch from now on, polled in the background until dropped; None when
    /// the source has no stream.
    async fn start(ctx: &Arc<Ctx>) -> anyhow::Result<Option<Watcher>> {
        Ok(crate::phase::watch::Watch::start(&ctx.clients, &ctx.plan)
            .await?
            .map(|w| Watcher::spawn(ctx.clone(), w)))
    }

    fn spawn(ctx: Arc<Ctx>, mut watch: crate::phase::watch::Watch) -> Watcher {
        let state = Arc::new(std::sync::Mutex::new(WatchState {
            through: f64::NEG_INFINITY,
            error: None,
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let sn = ctx.src_names();
            loop {
                let step: anyhow::Result<f64> = async {
                    let touches = watch.poll().await?;
                    if !touches.is_empty() {
                        ctx.ledger.lock().await.record_touches(&touches, &sn)?;
                    }
                    Ok(watch.through())
                }
                .await;
                let stopped = {
                    let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
                    match step {
                        Ok(t) => s.through = t,
                        Err(e) => s.error = Some(format!("the stream watch stopped: {e:#}")),
                    }
                    s.error.is_some()
                };
                if stopped {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Watcher { state, task }
    }

    /// Wait until the watch has read every write before `t`.
    async fn wait(&self, t: DateTime<Utc>, timeout: Duration) -> Result<(), String> {
        let want = t.timestamp_millis() as f64 / 1000.0;
        let start = Instant::now();
        loop {
            {
                let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(e) = &s.error {
                    return Err(e.clone());
                }
                if s.through >= want {
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

/// An owner of an orphan candidate as one round read it (None: absent), with
/// the writes the watch had seen to it before the read.
type OwnerRead = (Option<Item>, Option<u64>);

fn touch_key(target_key: &[u8], source_key: &[u8]) -> String {
    format!("{TOUCHED}{}/{}", hex(target_key), hex(source_key))
}

/// Settle orphan candidates, round by round after the tail has caught up:
/// read the target item (gone: resolved), then the source items that could
/// own it — with the prefix, the one it names; without it, those the stream
/// watch saw map to this key since before the second pass (none: an orphan,
/// ARCHITECTURE.md). One that maps to this key resolves it; otherwise it is
/// confirmed once two rounds read the same sources.
async fn recheck_orphans_all(ctx: &Ctx, watcher: Option<&Watcher>) -> anyhow::Result<()> {
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let prefix = ctx.plan.source_key_prefix.is_some();
    loop {
        let batch = next_candidates(ctx, OCAND).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut through = batch
            .iter()
            .map(|(_, m)| m.found_at_ms)
            .max()
            .map_or_else(Utc::now, ms_to_time)
            + MARGIN;
        if !prefix {
            let end: Option<i64> = ctx.ledger.lock().await.store.get("verify/p2_end_ms")?;
            through = through.max(end.map_or_else(Utc::now, ms_to_time) + MARGIN);
        }
        let mut verdicts: Vec<Option<Verdict>> = batch.iter().map(|_| None).collect();
        // Per candidate, its owners as the previous round read them, with the
        // writes the watch had seen to each (same twice: nothing changed).
        let mut prev: Vec<Option<Vec<OwnerRead>>> = batch.iter().map(|_| None).collect();
        let mut tail = true;
        for _round in 0..MAX_ROUNDS {
            if verdicts.iter().all(Option::is_some) {
                break;
            }
            if tail {
                match ctx.wait_tail(through).await {
                    TailWait::CaughtUp => {}
                    TailWait::NoTail => tail = false,
                    TailWait::Behind(why) => {
                        for (v, (_, m)) in verdicts.iter_mut().zip(&batch) {
                            if v.is_none() {
                                *v = Some(Verdict::Unconfirmed(m.clone(), why.clone()));
                            }
                        }
                        break;
                    }
                }
            }
            let live: Vec<usize> = (0..batch.len())
                .filter(|&i| verdicts[i].is_none())
                .collect();
            let tkeys: Vec<Item> = live
                .iter()
                .map(|&i| batch[i].1.target_key.clone().unwrap_or_default())
                .collect();
            let targets = ctx.get(true, &tkeys, true).await?;
            let read_at = Utc::now() + MARGIN;
            // Who could own each target item still present.
            let mut owners: Vec<Option<Vec<Item>>> = vec![None; live.len()];
            let mut watch_behind = None;
            if let Some(w) = watcher
                && let Err(why) = w.wait(read_at, ctx.opts.recheck_timeout).await
            {
                ctx.note(why.clone());
                watch_behind = Some(why);
            }
            for (n, k) in tkeys.iter().enumerate() {
                let Some(t) = encode_key(k, &tn).and_then(|tk| targets.get(&tk)) else {
                    continue;
                };
                owners[n] = if prefix {
                    Some(kept_source_key(&ctx.plan, t).into_iter().collect())
                } else if watcher.is_some() {
                    let tk = encode_key(k, &tn).unwrap_or_default();
                    let l = ctx.ledger.lock().await;
                    Some(
                        l.store
                            .scan_prefix::<Item>(&format!("{TOUCHED}{}/", hex(&tk)))?
                            .into_iter()
                            .map(|(_, sk)| sk)
                            .collect(),
                    )
                } else {
                    // No stream, so no tail and no live writes: the pass was exact.
                    Some(Vec::new())
                };
            }
            let skeys: Vec<Item> = owners.iter().flatten().flatten().cloned().collect();
            // As in the forward re-check: writes seen to each owner before it is read.
            let seen: HashMap<Vec<u8>, u64> = if watcher.is_some() && watch_behind.is_none() {
                let counts = ctx.ledger.lock().await.writes(&skeys, &sn)?;
                skeys
                    .iter()
                    .map(|k| encode_key(k, &sn).unwrap_or_default())
                    .zip(counts)
                    .collect()
            } else {
                HashMap::new()
            };
            let sources = if skeys.is_empty() {
                HashMap::new()
            } else {
                ctx.get(false, &skeys, true).await?
            };
            // The next round waits for the tail to pass these reads.
            through = Utc::now() + MARGIN;
            for (n, &i) in live.iter().enumerate() {
                let tk = encode_key(&tkeys[n], &tn).unwrap_or_default();
                let Some(owners) = &owners[n] else {
                    verdicts[i] = Some(Verdict::Resolved);
                    continue;
                };
                let mut m = batch[i].1.clone();
                if let Some(why) = &watch_behind {
                    verdicts[i] = Some(Verdict::Unconfirmed(m, why.clone()));
                    continue;
                }
                let srcs: Vec<OwnerRead> = owners
                    .iter()
                    .map(|k| {
                        let k = encode_key(k, &sn).unwrap_or_default();
                        (sources.get(&k).cloned(), seen.get(&k).copied())
                    })
                    .collect();
                let maps = srcs.iter().filter_map(|(s, _)| s.as_ref()).any(|s| {
                    matches!(transform(&ctx.plan, s), Outcome::Put { item, .. }
                        if encode_key(&item, &tn).as_ref() == Some(&tk))
                });
                if maps {
                    verdicts[i] = Some(Verdict::Resolved);
                } else if owners.is_empty() || !tail || prev[i].as_ref() == Some(&srcs) {
                    if prefix {
                        m.source_key = owners.first().cloned();
                    }
                    verdicts[i] = Some(Verdict::Confirmed(m));
                } else {
                    prev[i] = Some(srcs);
                }
            }
        }
        let mut delta = Counts::default();
        let mut b = StoreBatch::default();
        for ((key, m), v) in batch.into_iter().zip(verdicts) {
            b.remove(&key);
            delta.pending_orphans = delta.pending_orphans.wrapping_sub(1);
            let id = format!("{MM}o{}", &key[OCAND.len()..]);
            match v.unwrap_or_else(|| {
                Verdict::Unconfirmed(
                    m,
                    "the source item kept changing during the re-check".into(),
                )
            }) {
                Verdict::Resolved => {
                    delta.target_matched += 1;
                    delta.resolved += 1;
                }
                Verdict::Confirmed(m) => {
                    delta.orphans += 1;
                    b.put(&id, &m)?;
                }
                Verdict::Unconfirmed(m, why) => {
                    delta.unconfirmed_orphans += 1;
                    b.put(&id, &unconfirmed(m, why))?;
                }
            }
        }
        ctx.ledger.lock().await.commit(b, &delta)?;
    }
}

// ---- output -------------------------------------------------------------------

/// The key a mismatch is known by, and whether it is a target key: the
/// source key, or the target key of an orphan.
fn mismatch_key(m: &Mismatch) -> Option<(&Item, bool)> {
    match (m.kind, m.suspected, &m.source_key, &m.target_key) {
        (Kind::Orphan, _, _, Some(t)) | (_, Some(Kind::Orphan), _, Some(t)) => Some((t, true)),
        (_, _, Some(s), _) => Some((s, false)),
        _ => None,
    }
}

/// An example of a mismatch, named by its key as it is (the operator
/// surface redacts it).
fn example(m: &Mismatch) -> Example {
    let named_by = mismatch_key(m).map(|(k, target)| (k.clone(), target));
    Example {
        kind: m.kind,
        key: named_by
            .as_ref()
            .map(|(k, _)| serde_json::to_string(k).unwrap_or_default())
            .unwrap_or_default(),
        named_by,
        attributes: m.attributes.clone(),
    }
}

const EXAMPLES: usize = 20;

/// Stream the confirmed mismatches from the store into the mismatches file
/// (atomically replaced) and return the first few as examples.
fn write_mismatches(store: &StateStore, path: &Path) -> anyhow::Result<Vec<Example>> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    let mut out = std::io::BufWriter::new(f);
    let mut examples = Vec::new();
    for kv in store.iter_prefix::<Mismatch>(MM) {
        let (_, m) = kv?;
        serde_json::to_writer(&mut out, &m)?;
        out.write_all(b"\n")?;
        if examples.len() < EXAMPLES {
            examples.push(example(&m));
        }
    }
    out.flush()?;
    out.get_ref().sync_data()?;
    drop(out);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(examples)
}

/// The plain-text report. Keys appear as `‹…›` tokens unless `--show-keys`.
pub fn render(r: &VerifyReport) -> String {
    use std::fmt::Write as _;
    let c = &r.result.counts;
    let mut out = String::new();
    let verdict = if r.result.clean {
        "clean"
    } else {
        "DIFFERENCES FOUND"
    };
    let _ = writeln!(
        out,
        "verify {} → {}: {verdict}{}",
        r.result.source_table,
        r.result.target_table,
        match r.result.sample_percent {
            Some(p) => format!(" (sample of {p}%, forward only)"),
            None => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "  source: {} scanned = {} matched + {} mismatched ({} missing, {} different, {} unconfirmed) + {} rejected ({} collisions) + {} skipped{}",
        c.scanned,
        c.matched,
        c.mismatched(),
        c.missing,
        c.different,
        c.unconfirmed,
        c.rejected,
        c.collisions,
        c.skipped,
        if c.unsampled > 0 {
            format!(" + {} not sampled", c.unsampled)
        } else {
            String::new()
        }
    );
    if r.result.sample_percent.is_none() {
        let _ = writeln!(
            out,
            "  target: {} scanned = {} mapped back + {} orphans + {} unconfirmed",
            c.target_scanned, c.target_matched, c.orphans, c.unconfirmed_orphans
        );
    }
    if c.resolved > 0 {
        let _ = writeln!(
            out,
            "  {} transient differences resolved on re-check (the tail caught up)",
            c.resolved
        );
    }
    if let Some(s) = &r.sample {
        let _ = writeln!(
            out,
            "  estimated mismatch rate {:.4}% ({} of {} compared), at most {:.4}% with 95% confidence",
            s.mismatch_rate * 100.0,
            s.mismatched,
            s.compared,
            s.mismatch_rate_upper_95 * 100.0
        );
    }
    for e in &r.examples {
        let _ = write!(out, "  {:?} {}", e.kind, e.key);
        if !e.attributes.is_empty() {
            let _ = write!(out, " (attributes: {})", e.attributes.join(", "));
        }
        out.push('\n');
    }
    if !r.result.clean {
        let _ = writeln!(
            out,
            "  every difference, with its keys: {}",
            r.mismatches_file
        );
    }
    for n in &r.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    if let Some(rep) = &r.repair {
        let _ = writeln!(
            out,
            "  repair: {} rewritten, {} orphans deleted, {} skipped (source gone); {} still differ",
            rep.rewritten, rep.deleted, rep.skipped, rep.still_different
        );
        for e in &rep.examples {
            let _ = writeln!(out, "    still {:?} {}", e.kind, e.key);
        }
    }
    let _ = writeln!(
        out,
        "  {:.0} RCU source, {:.0} RCU target in {:.1} s{}",
        r.consumed_rcu_source,
        r.consumed_rcu_target,
        r.elapsed_seconds,
        if r.resumed {
            format!(" (resumed; this run scanned {})", r.this_run_scanned)
        } else {
            String::new()
        }
    );
    out
}

// ---- repair -------------------------------------------------------------------

/// Rewrite missing and different items from a fresh consistent read of their
/// source, delete orphans, then re-verify exactly those keys. Walks the
/// recorded mismatches a chunk at a time: memory does not grow with them.
async fn repair(ctx: &Ctx) -> anyhow::Result<RepairReport> {
    let mut report = RepairReport::default();
    let mut after = MM.to_string();
    loop {
        let chunk: Vec<(String, Mismatch)> = ctx
            .ledger
            .lock()
            .await
            .store
            .chunk_after(MM, &after, GET_BATCH)?;
        let Some((last, _)) = chunk.last() else {
            return Ok(report);
        };
        after = last.clone();
        let (mut forward, mut orphans) = (Vec::new(), Vec::new());
        for (_, m) in chunk {
            match m.kind {
                Kind::Missing | Kind::Different => forward.push(m),
                Kind::Orphan => orphans.push(m),
                // Not settled: repairing on a guess could undo the tail's work.
                Kind::Unconfirmed => {}
            }
        }
        repair_chunk(ctx, &forward, &orphans, &mut report).await?;
    }
}

async fn repair_chunk(
    ctx: &Ctx,
    forward: &[Mismatch],
    orphans: &[Mismatch],
    report: &mut RepairReport,
) -> anyhow::Result<()> {
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let skeys: Vec<Item> = forward
        .iter()
        .filter_map(|m| m.source_key.clone())
        .collect();
    let sources = ctx.get(false, &skeys, true).await?;
    let mut items = Vec::new();
    for k in &skeys {
        match encode_key(k, &sn)
            .and_then(|k| sources.get(&k))
            .map(|s| transform(&ctx.plan, s))
        {
            Some(Outcome::Put { item, .. }) => items.push(item),
            _ => report.skipped += 1,
        }
    }
    for batch in items.chunks(crate::aws::write::BATCH) {
        let r = write_batch(
            &ctx.clients,
            &ctx.plan.target_table,
            batch,
            &ctx.tgt,
            ctx.opts.max_retries,
        )
        .await?;
        report.rewritten += r.refused.iter().filter(|x| x.is_none()).count() as u64;
    }
    for m in orphans {
        let Some(key) = &m.target_key else { continue };
        loop {
            let _in_flight = ctx.tgt.wait_write().await;
            match crate::aws::item::delete_item(&ctx.clients, &ctx.plan.target_table, key).await {
                Ok(()) => {
                    report.deleted += 1;
                    break;
                }
                Err(e) if e.is_throttle() => ctx.tgt.write_throttled(&e, 2).await,
                Err(e) => return Err(e.into()),
            }
        }
    }
    // Re-verify exactly those keys, with the same re-check rule (a write
    // DynamoDB refused shows up here as still different).
    let now = now_ms();
    let fresh: Vec<Mismatch> = forward
        .iter()
        .map(|m| Mismatch {
            found_at_ms: now,
            ..m.clone()
        })
        .collect();
    let mut still: Vec<Mismatch> = Vec::new();
    for v in recheck_forward(ctx, fresh, None).await? {
        match v {
            Verdict::Resolved => {}
            Verdict::Confirmed(m) => still.push(m),
            Verdict::Unconfirmed(m, why) => still.push(unconfirmed(m, why)),
        }
    }
    let keys: Vec<Item> = orphans
        .iter()
        .filter_map(|m| m.target_key.clone())
        .collect();
    let present = ctx.get(true, &keys, true).await?;
    for m in orphans {
        if m.target_key
            .as_ref()
            .and_then(|k| encode_key(k, &tn))
            .is_some_and(|k| present.contains_key(&k))
        {
            still.push(m.clone());
        }
    }
    report.still_different += still.len() as u64;
    for m in still {
        if report.examples.len() < EXAMPLES {
            report.examples.push(example(&m));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::Value;

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
