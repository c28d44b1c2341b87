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
//! and only after the backfill is complete (docs/tail.md, "Backfill and
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

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::rate::{Control, Rate, ThrottleStats};
use crate::core::plan::{Mode, Plan};
use crate::core::value::Item;
use crate::phase::error::{InputError, Stopped};
use crate::phase::inplace::Direction;
use crate::phase::progress::Progress;
use crate::state::claims::Claims;
use crate::state::rejects::RejectsFile;
use crate::state::{BackfillStage, StateDir, StateStore};

pub(crate) mod fleet;
mod import;
mod ledger;
mod page;
mod source;
mod status;
mod writer;

pub use import::ImportReport;

use crate::aws::TableInfo;
use crate::state::snapshot::{BackfillStatus, ImportProgress};

use import::{Books, ImportSink, error_note};
use ledger::{Ledger, Resume};
use source::{Drive, EXPORT_PAGE};
use status::{Ending, Ticker, snapshot};
use writer::Writer;

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
    /// Write requests in flight at once, across all segments and pages.
    pub concurrency: usize,
    /// Consecutive non-throttle failures of one write before the run stops.
    pub max_retries: u32,
    /// Read this export (`s3://bucket/prefix` or a local directory) instead of scanning.
    pub from_export: Option<String>,
    /// Export data files read at once.
    pub export_files_in_parallel: usize,
    /// In place only: remove what the plan added instead (`rekey undo`), with
    /// checkpoints of its own.
    pub undo: bool,
    /// `s3://bucket/prefix`: the target does not exist yet; write its items
    /// there as objects and create it with ImportTable (no write capacity).
    pub via_import: Option<String>,
    /// Uncompressed bytes per import object.
    pub import_object_bytes: u64,
    /// The tail runs in this process (`rekey run`): the stream's retention
    /// cannot run out under it.
    pub tail_in_process: bool,
}

pub use crate::state::Counters;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SegState {
    Pending,
    /// Resume after this key (DynamoDB JSON).
    After(Item),
    /// Stopped mid-page: read again from `from` (None: the beginning),
    /// skipping the items named in `done` (digests of their source keys),
    /// already written and counted.
    Partial {
        from: Option<Item>,
        done: Vec<String>,
    },
    Done,
}

impl From<Resume> for SegState {
    fn from(r: Resume) -> SegState {
        match r {
            Resume::Done => SegState::Done,
            Resume::After(k) => SegState::After(k),
            Resume::Partial { from, done } => SegState::Partial { from, done },
        }
    }
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
    /// `--via-import`: the objects and the import.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub import: Option<ImportReport>,
    /// What the operator was warned of (also shown as it happened).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
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

/// The tables, checked against the plan: (source, target). No target with
/// `--via-import`: the import creates it ([`ImportSink::open`] checks that
/// it does not exist yet).
async fn tables(
    clients: &Clients,
    plan: &Plan,
    opts: &BackfillOptions,
) -> anyhow::Result<(TableInfo, Option<TableInfo>)> {
    let source = clients.describe_table(&plan.source_table).await?;
    source.check_key(&plan.source_key, "source")?;
    if opts.via_import.is_some() {
        return Ok((source, None));
    }
    let target = clients.describe_table(&plan.target_table).await?;
    target.check_key(&plan.target_key, "target")?;
    Ok((source, Some(target)))
}

fn check_undo(plan: &Plan, opts: &BackfillOptions) -> anyhow::Result<()> {
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
    Ok(())
}

/// The store, counters and rejects file as the last run committed them;
/// whether this run resumes one.
fn open_ledger(plan: &Plan, opts: &BackfillOptions) -> anyhow::Result<(Ledger, bool)> {
    let keys = Keys::of(opts.undo);
    let store = StateStore::open(&opts.state_dir, plan)?;
    import::check_resume(&store, opts)?;
    let totals: Counters = store.get(&keys.counters())?.unwrap_or_default();
    let resumed = store.get::<BackfillStage>(&keys.phase())?.is_some();
    store.put(&keys.phase(), &BackfillStage::Backfilling)?;
    // Lines written for pages that were in flight at a crash are not committed: cut them.
    let committed_len: u64 = store.get(&keys.rejects_len())?.unwrap_or(0);
    let rejects = RejectsFile::open_truncated(&opts.rejects, committed_len)?;
    let ledger = Ledger {
        keys,
        store,
        claims: open_claims(plan, opts)?,
        totals,
        this_run: Counters::default(),
        rejects,
    };
    Ok((ledger, resumed))
}

/// The claim index, unless nothing can collide: a plan whose target key
/// determines the source key (in place, the key does not change at all).
fn open_claims(plan: &Plan, opts: &BackfillOptions) -> anyhow::Result<Option<Claims>> {
    if plan.mode == Mode::InPlace {
        return Ok(None);
    }
    match crate::core::inverse::key_injective(plan) {
        Ok(()) => {
            tracing::info!("no claim index: each target key determines its source key");
            Ok(None)
        }
        Err(why) => {
            tracing::info!(reason = %why, "claim index: target keys may collide");
            Ok(Some(Claims::open(&opts.state_dir.claims())?))
        }
    }
}

/// The read and write budgets, from the operator's rates and the tables'
/// provisioned capacity. No write budget into an import: it spends none.
fn control(
    opts: &BackfillOptions,
    source: &TableInfo,
    target: Option<&TableInfo>,
) -> anyhow::Result<Control> {
    let read_rate = opts
        .read_rate
        .map(|r| r.resolve(&source.name, source.provisioned_read, "read"))
        .transpose()
        .map_err(InputError)?;
    let write_rate = target
        .map(|t| {
            opts.write_rate
                .resolve(&t.name, t.provisioned_write, "write")
        })
        .transpose()
        .map_err(InputError)?;
    Ok(Control::new(read_rate, write_rate))
}

/// Copies every source item into the target. Once `stop` is cancelled
/// (Ctrl-C, SIGTERM) it sends no more writes, checkpoints the written part of
/// the pages in flight, publishes a stopped status and returns `Stopped`. The
/// stop is a parameter, not an option: each caller hands in its own signal.
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &BackfillOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<BackfillReport> {
    check_undo(plan, opts)?;
    import::check_options(plan, opts)?;
    let started = Instant::now();
    let (source, target) = tables(clients, plan, opts).await?;
    let (ledger, resumed) = open_ledger(plan, opts)?;
    let live = Arc::new(AtomicU64::new(ledger.totals.scanned));
    let ledger = Arc::new(Mutex::new(ledger));
    let control = Arc::new(control(opts, &source, target.as_ref())?);
    let mut warnings = Vec::new();
    let import = match &opts.via_import {
        None => None,
        Some(_) => {
            let (sink, note) =
                ImportSink::open(clients, plan, opts, &source, &ledger, control.clone()).await?;
            warnings.extend(note);
            Some(Arc::new(sink))
        }
    };
    for w in &warnings {
        progress.note(w);
    }
    let writer = Arc::new(Writer::new(clients, plan, opts, control.clone()));
    let consumed_rcu = Arc::new(Mutex::new(0.0f64));
    let drive = Drive {
        clients,
        plan: Arc::new(plan.clone()),
        writer: writer.clone(),
        ledger: ledger.clone(),
        control: control.clone(),
        live,
        consumed_rcu: consumed_rcu.clone(),
        direction: opts.undo.then_some(Direction::Undo),
        stop: stop.clone(),
        import: import.clone(),
    };
    let segments = if import.as_ref().is_some_and(|s| s.started()) {
        // ImportTable was called: every page is in an object already.
        drive
            .ledger
            .lock()
            .await
            .store
            .get(&Keys::of(false).segments())?
            .unwrap_or(0)
    } else {
        read_pages(&drive, opts, &source, progress).await?
    };

    let books = |totals| Books {
        dir: &opts.state_dir,
        totals,
        expected_items: source.item_count,
    };
    if stop.is_cancelled() {
        let l = ledger.lock().await;
        return Err(stopped(&l, opts, &source, import.as_deref()));
    }
    let import_report = match &import {
        None => None,
        Some(sink) => {
            let totals = ledger.lock().await.totals;
            let Some(r) = sink
                .import(plan, &ledger, books(totals), progress, stop)
                .await?
            else {
                let l = ledger.lock().await;
                return Err(stopped(&l, opts, &source, import.as_deref()));
            };
            if let Some(note) = error_note(plan, &r) {
                progress.note(&note);
                warnings.push(note);
            }
            Some(r)
        }
    };

    let mut ledger = ledger.lock().await;
    let phase = ledger.keys.phase();
    ledger.store.put(&phase, &BackfillStage::BackfillDone)?;
    ledger.store.flush()?;
    if !opts.undo {
        // From here on the tail may apply what it captured (docs/tail.md).
        opts.state_dir.mark_backfill_done()?;
    }
    ledger.rejects.flush_len()?;
    let last = import_report
        .as_ref()
        .zip(import.as_deref())
        .map(|(r, sink)| BackfillStatus {
            import: Some(ImportProgress {
                status: Some(r.status.clone()),
                processed_items: r.processed_items,
                processed_bytes: r.processed_bytes,
                ..sink.progress()
            }),
            ..Default::default()
        });
    let status = snapshot(&ledger.totals, source.item_count, Ending::Done, last);
    crate::state::snapshot::publish(&opts.state_dir.backfill_snapshot(), &status)?;
    Ok(BackfillReport {
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        segments,
        totals: ledger.totals,
        this_run: ledger.this_run,
        resumed,
        consumed_rcu: *consumed_rcu.lock().await,
        consumed_wcu: *writer.consumed_wcu.lock().await,
        throttles: control.stats().await,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        rejects_file: opts.rejects.display().to_string(),
        import: import_report,
        warnings,
    })
}

/// Reads every page (Scan or export) under the ticker, and with
/// `--via-import` writes the parts still open; returns the segment count.
async fn read_pages(
    drive: &Drive<'_>,
    opts: &BackfillOptions,
    source: &TableInfo,
    progress: &Progress,
) -> anyhow::Result<u32> {
    progress.start(
        if opts.undo { "undo" } else { "backfill" },
        Some(source.item_count),
    );
    let ticker = Ticker {
        control: drive.control.clone(),
        writer: drive.writer.clone(),
        ledger: drive.ledger.clone(),
        dir: opts.state_dir.clone(),
        live: drive.live.clone(),
        consumed_rcu: drive.consumed_rcu.clone(),
        progress: progress.clone(),
        expected_items: source.item_count,
        import: drive.import.clone(),
    }
    .spawn();
    let (mut result, segments) = match &opts.from_export {
        None => match drive.segments(opts.segments, source.size_bytes).await {
            Ok(segments) => (drive.scan(segments, opts.page_limit).await, segments),
            Err(e) => (Err(e), 0),
        },
        Some(loc) => {
            let read = drive.export(loc, opts.export_files_in_parallel, EXPORT_PAGE);
            (read.await, 0)
        }
    };
    if let (Ok(()), Some(sink)) = (&result, &drive.import) {
        // After the last page, or a stop: what waits in open parts is written.
        result = sink.flush_all(&drive.ledger).await;
    }
    ticker.abort();
    let _ = ticker.await;
    progress.finish();
    result.map(|()| segments)
}

/// A stop: what is committed stays, the snapshot says stopped.
fn stopped(
    ledger: &Ledger,
    opts: &BackfillOptions,
    source: &TableInfo,
    import: Option<&ImportSink>,
) -> anyhow::Error {
    if let Err(e) = ledger.store.flush() {
        return e.into();
    }
    let live = import.map(|sink| BackfillStatus {
        import: Some(sink.progress()),
        ..Default::default()
    });
    let status = snapshot(&ledger.totals, source.item_count, Ending::Stopped, live);
    match crate::state::snapshot::publish(&opts.state_dir.backfill_snapshot(), &status) {
        Ok(()) => Stopped.into(),
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::Value;
    use source::export_page;

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
    fn an_export_is_read_page_size_lines_a_page() {
        assert_eq!(export_page(None), EXPORT_PAGE);
        assert_eq!(export_page(Some(20)), 20);
        assert_eq!(export_page(Some(0)), 1);
    }

    #[test]
    fn segment_states_round_trip_through_json() {
        let mut k = Item::new();
        k.insert("PK".into(), Value::S("a".into()));
        let partial = SegState::Partial {
            from: Some(k.clone()),
            done: vec!["0123".into()],
        };
        for s in [
            SegState::Pending,
            SegState::After(k),
            partial,
            SegState::Done,
        ] {
            let j = serde_json::to_string(&s).unwrap();
            let back: SegState = serde_json::from_str(&j).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), j);
        }
    }
}
