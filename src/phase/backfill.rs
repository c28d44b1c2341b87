//! `rekey backfill`: copy every existing source item into the target, in the
//! new key shape, at the capacity the operator grants, resumable after kill -9.
//!
//! The data path: a parallel Scan (or an S3 export) yields pages; each item
//! goes through the pure [`transform`]; each target key is claimed in the
//! on-disk [`crate::state::claims`] index (a second source item claiming it is a
//! collision: rejected, never written); the page's items are written with
//! BatchWriteItem, interleaved across target keys and paced per key; when
//! every write of a page is acknowledged, the page's resume point, the
//! counters and the rejects file's length are committed in one batch.
//!
//! Backfill writes are plain puts of the image the Scan read. They may be
//! older than the source by the time they land; the tail fixes that, because
//! it applies every change made since before the backfill started, in order,
//! and only after the backfill is complete (ARCHITECTURE.md, "Backfill and
//! tail converge").
//!
//! In place (the plan's target is its source), the same scan, ledger and
//! checkpoints drive a different write: one conditional UpdateItem of just the
//! computed attributes per item that needs it ([`crate::phase::inplace`]), and
//! `rekey undo` runs the same loop backwards under checkpoint keys of its own.
//!
//! Invariant: for every page committed, scanned = written + rejected +
//! skipped, counted once (counters move only with their page's checkpoint,
//! and the rejects file is truncated back to the committed length on resume).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::state::StateDir;
use crate::state::claims::Claims;
use anyhow::Context as _;
use futures::stream::{self, StreamExt};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::aws::Clients;
use crate::aws::export::{DataFile, ExportLine, ExportLocation, ExportReader, S3Client};
use crate::aws::rate::{Control, Rate, ThrottleStats};
use crate::aws::scan::{self, Page, ScanOptions, SegmentStart};
use crate::aws::write::{BATCH, write_batch};
use crate::core::plan::{Mode, Plan};
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, Value, decode_key, encode_key, item_size, write_units};
use crate::phase::error::{InputError, Stopped};
use crate::phase::inplace::{self, Applied, Direction};
use crate::phase::progress::Progress;
use crate::state::control::ControlFile;
use crate::state::rejects::RejectsFile;
use crate::state::{BackfillStage, StateStore};

#[derive(Debug, Clone)]
pub struct BackfillOptions {
    pub state_dir: StateDir,
    pub rejects: PathBuf,
    /// Scan segments; fixed by the first run (resume points belong to a segment count).
    pub segments: Option<u32>,
    pub page_limit: Option<i32>,
    /// For the Scan; None: unlimited.
    pub read_rate: Option<Rate>,
    /// For the target.
    pub write_rate: Rate,
    /// WCU/s for any one target partition-key value.
    pub key_write_rate: u32,
    /// Writes in flight at once.
    pub concurrency: usize,
    /// Consecutive non-throttle failures of one write before the run stops.
    pub max_retries: u32,
    /// Read this export (`s3://bucket/prefix` or a local directory) instead of scanning.
    pub from_export: Option<String>,
    /// Export data files read at once.
    pub export_files_in_parallel: usize,
    /// Cancelled (Ctrl-C, SIGTERM): finish the pages in flight, checkpoint
    /// them, publish a stopped status and return `Stopped`.
    pub stop: CancellationToken,
    /// In place only: remove what the plan added instead (`rekey undo`), with
    /// checkpoints of its own.
    pub undo: bool,
}

/// Counters committed with each checkpoint.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counters {
    pub scanned: u64,
    pub written: u64,
    pub rejected: u64,
    pub skipped: u64,
    /// Rejects that were collisions: another source item holds the target key.
    pub collisions: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.scanned += o.scanned;
        self.written += o.written;
        self.rejected += o.rejected;
        self.skipped += o.skipped;
        self.collisions += o.collisions;
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SegState {
    Pending,
    /// Resume after this key (DynamoDB JSON).
    After(Item),
    Done,
}

#[derive(Debug, Clone, Serialize)]
pub struct BackfillReport {
    pub source_table: String,
    pub target_table: String,
    pub segments: u32,
    /// Totals over every run of this migration.
    pub totals: Counters,
    /// What this run did (less than the totals after a resume).
    pub this_run: Counters,
    pub resumed: bool,
    pub consumed_rcu: f64,
    pub consumed_wcu: f64,
    pub throttles: ThrottleStats,
    pub elapsed_seconds: f64,
    pub rejects_file: String,
}

/// The checkpoint keys of one job: `backfill/…`, or `undo/…` for the undo of
/// an in-place plan, so that each resumes on its own.
#[derive(Debug, Clone, Copy)]
struct Keys(&'static str);

impl Keys {
    fn of(undo: bool) -> Keys {
        Keys(if undo { "undo" } else { "backfill" })
    }
    fn segments(self) -> String {
        format!("{}/segments", self.0)
    }
    fn counters(self) -> String {
        format!("{}/counters", self.0)
    }
    fn rejects_len(self) -> String {
        format!("{}/rejects_len", self.0)
    }
    fn phase(self) -> String {
        format!("{}/phase", self.0)
    }
    fn seg(self, n: u32) -> String {
        format!("{}/seg/{n:05}", self.0)
    }
}

/// Per written item: its index in the page, and why it was refused, if it was.
type Refusals = Vec<(usize, Option<String>)>;

/// The write side: batches under the table budget and a per-key limit.
struct Writer {
    clients: Clients,
    table: String,
    pk_name: String,
    control: Arc<Control>,
    per_key: DefaultKeyedRateLimiter<String>,
    key_burst: u32,
    concurrency: usize,
    max_retries: u32,
    consumed_wcu: Mutex<f64>,
}

impl Writer {
    /// Write items (distinct target keys) in batches of 25, interleaved across
    /// target keys and paced per key: a Scan returns items clustered by the old
    /// key, and each old key fans out to few new ones. Returns, per item, None
    /// (written) or why DynamoDB refused it.
    async fn write(&self, items: Vec<Item>) -> anyhow::Result<Vec<Option<String>>> {
        let n = items.len();
        let mut by_key: HashMap<String, Vec<(usize, Item)>> = HashMap::new();
        for (i, it) in items.into_iter().enumerate() {
            let pk = it
                .get(&self.pk_name)
                .map(Value::display_text)
                .unwrap_or_default();
            by_key.entry(pk).or_default().push((i, it));
        }
        let mut queues: Vec<(String, std::vec::IntoIter<(usize, Item)>)> = by_key
            .into_iter()
            .map(|(k, v)| (k, v.into_iter()))
            .collect();
        let mut order = Vec::with_capacity(n);
        while !queues.is_empty() {
            queues.retain_mut(|(k, q)| match q.next() {
                Some((i, it)) => {
                    order.push((k.clone(), i, it));
                    true
                }
                None => false,
            });
        }
        let mut batches: Vec<Vec<(String, usize, Item)>> = Vec::new();
        for x in order {
            match batches.last_mut() {
                Some(b) if b.len() < BATCH => b.push(x),
                _ => batches.push(vec![x]),
            }
        }
        let results: Vec<anyhow::Result<Refusals>> = stream::iter(batches)
            .map(|batch| async move {
                for (pk, _, it) in &batch {
                    let wcu = write_units(item_size(it)) as u32;
                    let cells =
                        NonZeroU32::new(wcu.clamp(1, self.key_burst)).unwrap_or(NonZeroU32::MIN);
                    let _ = self.per_key.until_key_n_ready(pk, cells).await;
                }
                let (idx, its): (Vec<usize>, Vec<Item>) =
                    batch.into_iter().map(|(_, i, it)| (i, it)).unzip();
                let r = write_batch(
                    &self.clients,
                    &self.table,
                    &its,
                    &self.control,
                    self.max_retries,
                )
                .await?;
                *self.consumed_wcu.lock().await += r.consumed;
                Ok(idx.into_iter().zip(r.refused).collect())
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let mut out = vec![None; n];
        for r in results {
            for (i, refused) in r.context("backfill write failed")? {
                out[i] = refused;
            }
        }
        Ok(out)
    }
}

/// Shared state of a run: counters, rejects file, checkpoint commits.
struct Ledger {
    keys: Keys,
    store: StateStore,
    claims: Claims,
    totals: Counters,
    this_run: Counters,
    rejects: RejectsFile,
}

impl Ledger {
    /// Commit one page: its rejects, counters and resume point, atomically.
    fn commit(
        &mut self,
        key: &str,
        state: &serde_json::Value,
        page: &Counters,
        rejects: &[(Item, String)],
    ) -> anyhow::Result<()> {
        for (item, reason) in rejects {
            self.rejects.write(item, reason)?;
        }
        let len = self.rejects.flush_len()?;
        self.totals.add(page);
        self.this_run.add(page);
        self.store.put_batch(&[
            (key, state.clone()),
            (&self.keys.counters(), serde_json::to_value(self.totals)?),
            (&self.keys.rejects_len(), serde_json::to_value(len)?),
        ])?;
        self.store.flush()?;
        Ok(())
    }
}

pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &BackfillOptions,
    progress: &Progress,
) -> anyhow::Result<BackfillReport> {
    if opts.undo && plan.mode != Mode::InPlace {
        return Err(InputError(format!(
            "{}: undo removes what an in-place plan added to its table; this plan re-keys into `{}` (drop that table instead)",
            plan.path.display(),
            plan.target_table
        ))
        .into());
    }
    if opts.undo && opts.from_export.is_some() {
        return Err(InputError(
            "undo scans the table itself: an export does not hold what the plan added".into(),
        )
        .into());
    }
    let keys = Keys::of(opts.undo);
    let started = Instant::now();
    let source = clients.describe_table(&plan.source_table).await?;
    source.check_key(&plan.source_key, "source")?;
    let target = clients.describe_table(&plan.target_table).await?;
    target.check_key(&plan.target_key, "target")?;

    let store = StateStore::open(&opts.state_dir, plan)?;
    let totals: Counters = store.get(&keys.counters())?.unwrap_or_default();
    let resumed = store.get::<BackfillStage>(&keys.phase())?.is_some();
    store.put(&keys.phase(), &BackfillStage::Backfilling)?;
    // Lines written for pages that were in flight at a crash are not committed: cut them.
    let committed_len: u64 = store.get(&keys.rejects_len())?.unwrap_or(0);
    let rejects = RejectsFile::open_truncated(&opts.rejects, committed_len)?;

    let read_rate = opts
        .read_rate
        .map(|r| r.resolve(&source.name, source.provisioned_read, "read"))
        .transpose()
        .map_err(InputError)?;
    let write_rate = opts
        .write_rate
        .resolve(&target.name, target.provisioned_write, "write")
        .map_err(InputError)?;
    let control = Arc::new(Control::new(read_rate, Some(write_rate)));
    let key_rate = NonZeroU32::new(opts.key_write_rate.max(1)).unwrap_or(NonZeroU32::MIN);
    // A small burst keeps any one second of a key's writes near the rate: at most
    // rate + burst, well under the partition's 1,000 WCU/s at the default.
    let key_burst = NonZeroU32::new((opts.key_write_rate / 4).max(1)).unwrap_or(NonZeroU32::MIN);
    let writer = Arc::new(Writer {
        clients: clients.clone(),
        table: plan.target_table.clone(),
        pk_name: plan.target_key.partition_key.name.clone(),
        control: control.clone(),
        per_key: RateLimiter::keyed(Quota::per_second(key_rate).allow_burst(key_burst)),
        key_burst: key_burst.get(),
        concurrency: opts.concurrency.max(1),
        max_retries: opts.max_retries,
        consumed_wcu: Mutex::new(0.0),
    });
    let claims = Claims::open(&opts.state_dir.claims())?;
    let ledger = Arc::new(Mutex::new(Ledger {
        keys,
        store,
        claims,
        totals,
        this_run: Counters::default(),
        rejects,
    }));
    let consumed_rcu = Arc::new(Mutex::new(0.0f64));
    let live_items = Arc::new(AtomicU64::new(totals.scanned));

    progress.start(
        if opts.undo { "undo" } else { "backfill" },
        Some(source.item_count),
    );
    let ticker = {
        let (control, writer, ledger, dir) = (
            control.clone(),
            writer.clone(),
            ledger.clone(),
            opts.state_dir.clone(),
        );
        let live = live_items.clone();
        let progress = progress.clone();
        let rcu = consumed_rcu.clone();
        let expected_items = source.item_count;
        tokio::spawn(async move {
            let mut control_file = ControlFile::watcher(&dir);
            let mut last_wcu = 0.0;
            let mut last_rcu = 0.0;
            // One sample a second, for `status` and for measuring rate accuracy.
            let mut samples = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.progress_log())
                .ok();
            let t0 = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                control.tick().await;
                control_file.apply(&control).await;
                writer.per_key.retain_recent();
                let wcu = *writer.consumed_wcu.lock().await;
                let stats = control.stats().await;
                let (rejected, written) = {
                    let l = ledger.lock().await;
                    (l.totals.rejected, l.totals.written)
                };
                let write_limit = control.write.rate().await.unwrap_or(0.0);
                let read_now = *rcu.lock().await;
                let (rcu_s, wcu_s) = (read_now - last_rcu, wcu - last_wcu);
                let paused = control.is_paused();
                progress.status(
                    format!(
                        "{:.0} RCU/s, {:.0} WCU/s (limit {write_limit:.0}), written {written}, rejects {rejected}, throttles {}{}",
                        rcu_s,
                        wcu_s,
                        stats.write_throttles + stats.read_throttles,
                        if paused { ", PAUSED" } else { "" }
                    ),
                    serde_json::json!({
                        "rcu_per_sec": rcu_s,
                        "wcu_per_sec": wcu_s,
                        "write_limit": write_limit,
                        "written": written,
                        "rejected": rejected,
                        "throttles": stats,
                        "paused": paused,
                        "writes_in_flight": control.writes_in_flight(),
                    }),
                );
                last_wcu = wcu;
                last_rcu = read_now;
                let items = live.load(Ordering::Relaxed);
                if let Some(f) = samples.as_mut() {
                    use std::io::Write as _;
                    let line = serde_json::json!({
                        "t": t0.elapsed().as_secs_f64(),
                        "consumed_wcu": wcu,
                        "write_rate": control.write.rate().await,
                        "scanned": items,
                        "written": written,
                        "paused": control.is_paused(),
                    });
                    let _ = writeln!(f, "{line}");
                }
                let counts = ledger.lock().await.totals;
                let _ = crate::state::snapshot::publish(
                    &dir.backfill_snapshot(),
                    &crate::state::snapshot::BackfillStatus {
                        pid: std::process::id(),
                        updated_at: chrono::Utc::now(),
                        done: false,
                        stopped: false,
                        paused,
                        writes_in_flight: control.writes_in_flight(),
                        expected_items,
                        scanned: counts.scanned,
                        written: counts.written,
                        rejected: counts.rejected,
                        skipped: counts.skipped,
                        collisions: counts.collisions,
                        rcu_per_sec: rcu_s,
                        wcu_per_sec: wcu_s,
                        write_limit,
                        throttles: stats.write_throttles + stats.read_throttles,
                    },
                );
                progress.update(items, 0.0);
            }
        })
    };

    let run = Drive {
        clients,
        plan: Arc::new(plan.clone()),
        writer: writer.clone(),
        ledger: ledger.clone(),
        control: control.clone(),
        live: live_items.clone(),
        consumed_rcu: consumed_rcu.clone(),
        direction: opts.undo.then_some(Direction::Undo),
        stop: opts.stop.clone(),
    };
    let (result, segments) = match &opts.from_export {
        None => {
            let segments = run.segments(opts.segments, source.size_bytes).await?;
            (run.scan(segments, opts.page_limit).await, segments)
        }
        Some(loc) => (run.export(loc, opts.export_files_in_parallel).await, 0),
    };
    ticker.abort();
    let _ = ticker.await;
    progress.finish();
    result?;
    if opts.stop.is_cancelled() {
        let l = ledger.lock().await;
        l.store.flush()?;
        let t = l.totals;
        crate::state::snapshot::publish(
            &opts.state_dir.backfill_snapshot(),
            &crate::state::snapshot::BackfillStatus {
                pid: std::process::id(),
                updated_at: chrono::Utc::now(),
                stopped: true,
                expected_items: source.item_count,
                scanned: t.scanned,
                written: t.written,
                rejected: t.rejected,
                skipped: t.skipped,
                collisions: t.collisions,
                ..Default::default()
            },
        )?;
        return Err(Stopped.into());
    }

    let mut ledger = ledger.lock().await;
    ledger
        .store
        .put(&keys.phase(), &BackfillStage::BackfillDone)?;
    ledger.store.flush()?;
    if !opts.undo {
        // From here on the tail may apply what it captured (ARCHITECTURE.md).
        opts.state_dir.mark_backfill_done()?;
    }
    ledger.rejects.flush_len()?;
    let consumed_wcu = *writer.consumed_wcu.lock().await;
    let consumed_rcu = *consumed_rcu.lock().await;
    let t = ledger.totals;
    crate::state::snapshot::publish(
        &opts.state_dir.backfill_snapshot(),
        &crate::state::snapshot::BackfillStatus {
            pid: std::process::id(),
            updated_at: chrono::Utc::now(),
            done: true,
            expected_items: source.item_count,
            scanned: t.scanned,
            written: t.written,
            rejected: t.rejected,
            skipped: t.skipped,
            collisions: t.collisions,
            ..Default::default()
        },
    )?;
    Ok(BackfillReport {
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        segments,
        totals: ledger.totals,
        this_run: ledger.this_run,
        resumed,
        consumed_rcu,
        consumed_wcu,
        throttles: control.stats().await,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        rejects_file: opts.rejects.display().to_string(),
    })
}

/// What both sources need to turn pages into committed writes.
struct Drive<'a> {
    clients: &'a Clients,
    plan: Arc<Plan>,
    writer: Arc<Writer>,
    ledger: Arc<Mutex<Ledger>>,
    control: Arc<Control>,
    live: Arc<AtomicU64>,
    consumed_rcu: Arc<Mutex<f64>>,
    /// `Some(Undo)` for `rekey undo`; in-place plans otherwise go forward.
    direction: Option<Direction>,
    stop: CancellationToken,
}

/// How far one export data file is done.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FileState {
    Lines(u64),
    Done,
}

/// Items per commit when reading an export.
const EXPORT_PAGE: usize = 500;

impl Drive<'_> {
    /// The segment count is fixed by the first run: resume points belong to it.
    async fn segments(&self, asked: Option<u32>, table_bytes: u64) -> anyhow::Result<u32> {
        let l = self.ledger.lock().await;
        if let Some(n) = l.store.get::<u32>(&l.keys.segments())? {
            return Ok(n);
        }
        let n = asked.unwrap_or_else(|| scan::default_segments(table_bytes, 4));
        l.store.put(&l.keys.segments(), &n)?;
        l.store.flush()?;
        Ok(n)
    }

    async fn scan(&self, segments: u32, page_limit: Option<i32>) -> anyhow::Result<()> {
        let mut starts = Vec::with_capacity(segments as usize);
        {
            let l = self.ledger.lock().await;
            for n in 0..segments {
                starts.push(match l.store.get::<SegState>(&l.keys.seg(n))? {
                    None | Some(SegState::Pending) => SegmentStart::Beginning,
                    Some(SegState::After(k)) => SegmentStart::After(k),
                    Some(SegState::Done) => SegmentStart::Done,
                });
            }
        }
        let scan_opts = ScanOptions {
            table: self.plan.source_table.clone(),
            segments,
            page_limit,
            consistent_read: false,
            stop: self.stop.clone(),
        };
        let (writer, ledger, plan, consumed_rcu, live) = (
            self.writer.clone(),
            self.ledger.clone(),
            self.plan.clone(),
            self.consumed_rcu.clone(),
            self.live.clone(),
        );
        let direction = self.direction;
        scan::scan(
            self.clients,
            &scan_opts,
            starts,
            self.control.clone(),
            move |page: Page| {
                let (writer, ledger, plan, consumed_rcu, live) = (
                    writer.clone(),
                    ledger.clone(),
                    plan.clone(),
                    consumed_rcu.clone(),
                    live.clone(),
                );
                async move {
                    *consumed_rcu.lock().await += page.consumed;
                    let (mut counts, rejects) =
                        process_page(&writer, &ledger, &plan, &page.items, direction).await?;
                    counts.scanned += page.unreadable;
                    counts.rejected += page.unreadable;
                    live.fetch_add(counts.scanned, Ordering::Relaxed);
                    let state = match &page.next {
                        Some(k) => SegState::After(k.clone()),
                        None => SegState::Done,
                    };
                    let mut l = ledger.lock().await;
                    let key = l.keys.seg(page.segment);
                    l.commit(&key, &serde_json::to_value(&state)?, &counts, &rejects)
                }
            },
        )
        .await
    }

    /// Read an export's data files, `parallel` at a time, committing each
    /// file's line count after every page of writes.
    async fn export(&self, location: &str, parallel: usize) -> anyhow::Result<()> {
        let loc = ExportLocation::parse(location).map_err(|e| InputError(e.to_string()))?;
        let s3 = matches!(loc, ExportLocation::S3 { .. }).then(|| S3Client {
            client: self.clients.s3.clone(),
            endpoint: self.clients.endpoints.s3.clone(),
        });
        let (reader, manifest) = ExportReader::open(loc, s3).await?;
        if let Some(note) = manifest.selection_note() {
            eprintln!("{note}");
        }
        {
            // The tail must start capturing before this point in time.
            let l = self.ledger.lock().await;
            l.store
                .put("backfill/export_time_ms", &manifest.export_time_epoch_ms)?;
            l.store.put("backfill/export_id", &manifest.export_id)?;
            l.store.flush()?;
        }
        let reader = Arc::new(reader);
        let files = manifest.files.clone();
        stream::iter(files)
            .map(|file| {
                let reader = reader.clone();
                async move {
                    if self.stop.is_cancelled() {
                        return Ok(());
                    }
                    self.export_file(&reader, &file).await
                }
            })
            .buffer_unordered(parallel.max(1))
            .collect::<Vec<anyhow::Result<()>>>()
            .await
            .into_iter()
            .collect()
    }

    async fn export_file(&self, reader: &ExportReader, file: &DataFile) -> anyhow::Result<()> {
        let key = format!("backfill/file/{}", file.key);
        let done = match self.ledger.lock().await.store.get::<FileState>(&key)? {
            Some(FileState::Done) => return Ok(()),
            Some(FileState::Lines(n)) => n,
            None => 0,
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<ExportLine>(EXPORT_PAGE * 2);
        let reading = reader.read_file(file, done, tx);
        let consuming = async {
            let mut lines = done;
            let mut page: Vec<Item> = Vec::with_capacity(EXPORT_PAGE);
            let mut bad: Vec<(Item, String)> = Vec::new();
            let mut last_line = done;
            loop {
                let next = rx.recv().await;
                let at_end = next.is_none();
                if let Some(line) = next {
                    last_line = line.line;
                    match line.item {
                        Ok(item) => page.push(item),
                        Err(msg) => {
                            bad.push((Item::new(), format!("{}:{}: {msg}", file.key, line.line)))
                        }
                    }
                }
                if page.len() + bad.len() >= EXPORT_PAGE || (at_end && last_line > lines) {
                    let (mut counts, mut rejects) =
                        process_page(&self.writer, &self.ledger, &self.plan, &page, None).await?;
                    counts.scanned += bad.len() as u64;
                    counts.rejected += bad.len() as u64;
                    rejects.append(&mut bad);
                    self.live.fetch_add(counts.scanned, Ordering::Relaxed);
                    lines = last_line;
                    self.ledger.lock().await.commit(
                        &key,
                        &serde_json::to_value(FileState::Lines(lines))?,
                        &counts,
                        &rejects,
                    )?;
                    page.clear();
                    if self.stop.is_cancelled() {
                        // Checkpointed: the rest of the file is read on resume.
                        return anyhow::Ok(());
                    }
                }
                if at_end {
                    return anyhow::Ok(());
                }
            }
        };
        let (read, consumed) = tokio::join!(reading, consuming);
        consumed?;
        if self.stop.is_cancelled() {
            // The reader saw its receiver go: not an error, the file is not done.
            return Ok(());
        }
        read?;
        let l = self.ledger.lock().await;
        l.store.put(&key, &FileState::Done)?;
        l.store.flush()?;
        Ok(())
    }
}

/// Transform, claim and write one page's items; returns its counters and rejects.
async fn process_page(
    writer: &Writer,
    ledger: &Mutex<Ledger>,
    plan: &Plan,
    items: &[Item],
    direction: Option<Direction>,
) -> anyhow::Result<(Counters, Vec<(Item, String)>)> {
    if plan.mode == Mode::InPlace {
        let direction = direction.unwrap_or(Direction::Forward);
        return process_page_in_place(writer, plan, items, direction).await;
    }
    let mut c = Counters {
        scanned: items.len() as u64,
        ..Default::default()
    };
    let mut rejects = Vec::new();
    let mut puts = Vec::new();
    let mut sources = Vec::new();
    let mut pairs = Vec::new();
    let target_names = plan.target_key.names();
    let source_names = plan.source_key.names();
    for item in items {
        match transform(plan, item) {
            Outcome::Put { item: out, .. } => {
                let tk = encode_key(&out, &target_names).unwrap_or_default();
                let sk = encode_key(item, &source_names).unwrap_or_default();
                pairs.push((tk, sk));
                puts.push(out);
                sources.push(item);
            }
            Outcome::Reject(r) => {
                c.rejected += 1;
                rejects.push((item.clone(), r.to_string()));
            }
            Outcome::Skip => c.skipped += 1,
        }
    }
    // Claims are durable before anything is written (see claims.rs).
    let owners = ledger.lock().await.claims.claim_all(&pairs)?;
    let mut claimed = (Vec::new(), Vec::new());
    for (((out, src), (tk, _)), owner) in puts.into_iter().zip(sources).zip(&pairs).zip(owners) {
        match owner {
            None => {
                claimed.0.push(out);
                claimed.1.push(src);
            }
            Some(other) => {
                c.rejected += 1;
                c.collisions += 1;
                rejects.push((
                    src.clone(),
                    format!(
                        "collision: target key {} already belongs to source item {} — never overwritten",
                        decode_key(tk).join(" / "),
                        decode_key(&other).join(" / ")
                    ),
                ));
            }
        }
    }
    let (puts, sources) = claimed;
    for (refused, src) in writer.write(puts).await?.into_iter().zip(sources) {
        match refused {
            None => c.written += 1,
            Some(reason) => {
                c.rejected += 1;
                rejects.push((src.clone(), reason));
            }
        }
    }
    Ok((c, rejects))
}

/// In place: one conditional UpdateItem per item that needs one (see
/// [`crate::phase::inplace`]), `concurrency` at a time. Items already right, unmatched,
/// or deleted before rekey could write them are skipped.
async fn process_page_in_place(
    writer: &Writer,
    plan: &Plan,
    items: &[Item],
    direction: Direction,
) -> anyhow::Result<(Counters, Vec<(Item, String)>)> {
    let mut c = Counters {
        scanned: items.len() as u64,
        ..Default::default()
    };
    let results: Vec<anyhow::Result<(Applied, Item)>> = stream::iter(items.to_vec())
        .map(|item| async move {
            let decision = direction.decide(plan, &item);
            if matches!(decision, inplace::Decision::Write(_)) {
                // Paced per partition key like the re-key's writes: a Scan
                // returns an item collection's items together.
                let pk = item
                    .get(&writer.pk_name)
                    .map(Value::display_text)
                    .unwrap_or_default();
                let _ = writer.per_key.until_key_n_ready(&pk, NonZeroU32::MIN).await;
            }
            let applied = inplace::apply(
                &writer.clients,
                plan,
                &writer.control,
                direction,
                decision,
                writer.max_retries,
            )
            .await?;
            Ok((applied, item))
        })
        .buffer_unordered(writer.concurrency)
        .collect()
        .await;
    let mut rejects = Vec::new();
    let mut consumed = 0.0;
    for r in results {
        match r.context("in-place write failed")? {
            (Applied::Written { consumed: u }, _) => {
                c.written += 1;
                consumed += u;
            }
            (Applied::Skipped { consumed: u }, _) => {
                c.skipped += 1;
                consumed += u;
            }
            (
                Applied::Rejected {
                    reason,
                    consumed: u,
                },
                item,
            ) => {
                c.rejected += 1;
                consumed += u;
                rejects.push((item, reason));
            }
        }
    }
    *writer.consumed_wcu.lock().await += consumed;
    Ok((c, rejects))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up() {
        let mut a = Counters {
            scanned: 3,
            written: 2,
            rejected: 1,
            skipped: 0,
            collisions: 1,
        };
        a.add(&Counters {
            scanned: 2,
            skipped: 2,
            ..Default::default()
        });
        assert_eq!(a.scanned, a.written + a.rejected + a.skipped);
    }

    #[test]
    fn segment_states_round_trip_through_json() {
        let mut k = Item::new();
        k.insert("PK".into(), Value::S("a".into()));
        for s in [SegState::Pending, SegState::After(k), SegState::Done] {
            let j = serde_json::to_string(&s).unwrap();
            let back: SegState = serde_json::from_str(&j).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), j);
        }
    }
}
