//! Where a backfill reads: a parallel Scan, or the data files of an S3 export,
//! each page committed once its writes are acknowledged.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::export::{DataFile, ExportLocation, ExportReader, S3Client, lines_channel};
use crate::aws::rate::Control;
use crate::aws::scan::{self, Page, ScanOptions, SegmentStart};
use crate::core::import as core_import;
use crate::core::plan::Plan;
use crate::core::value::Item;
use crate::phase::error::InputError;
use crate::phase::inplace::Direction;

use super::SegState;
use super::import::ImportSink;
use super::ledger::{Ledger, PageDone, PageEnd, Resume, skip_counted};
use super::page::{MAX_SETTLED, PageStep, Put, process_page};
use super::writer::Writer;

/// What both sources need to turn pages into committed writes.
pub(super) struct Drive<'a> {
    pub(super) clients: &'a Clients,
    pub(super) plan: Arc<Plan>,
    pub(super) writer: Arc<Writer>,
    pub(super) ledger: Arc<Mutex<Ledger>>,
    pub(super) control: Arc<Control>,
    pub(super) live: Arc<AtomicU64>,
    pub(super) consumed_rcu: Arc<Mutex<f64>>,
    /// `Some(Undo)` for `rekey undo`; in-place plans otherwise go forward.
    pub(super) direction: Option<Direction>,
    pub(super) stop: CancellationToken,
    /// `--via-import`: pages go into S3 objects, committed with them.
    pub(super) import: Option<Arc<ImportSink>>,
}

/// Where a page of `stream` goes.
fn put<'a>(writer: &'a Writer, import: &'a Option<Arc<ImportSink>>, stream: &'a str) -> Put<'a> {
    match import {
        Some(sink) => Put::Import(sink, stream),
        None => Put::Table(writer),
    }
}

/// A page of `stream` is done: commit it now, or, into S3 objects, with
/// its stream's open part (at once when `last`).
async fn commit_page(
    ledger: &Mutex<Ledger>,
    import: &Option<Arc<ImportSink>>,
    stream: &str,
    page: PageDone,
) -> anyhow::Result<()> {
    match import {
        None => ledger
            .lock()
            .await
            .commit(&page.key, &page.state, &page.counts, &page.rejects),
        Some(sink) => sink.commit(ledger, stream, page).await,
    }
}

/// What a Scan's page handler shares across pages and segments.
pub(super) struct ScanPages {
    writer: Arc<Writer>,
    ledger: Arc<Mutex<Ledger>>,
    plan: Arc<Plan>,
    consumed_rcu: Arc<Mutex<f64>>,
    live: Arc<AtomicU64>,
    import: Option<Arc<ImportSink>>,
    stop: CancellationToken,
    direction: Option<Direction>,
    /// Per segment: the items a stop checkpointed mid-page (digests), to
    /// skip when they are read again.
    carried: Arc<std::sync::Mutex<HashMap<u32, BTreeSet<String>>>>,
}

impl ScanPages {
    /// One page: its items not already counted processed, then committed
    /// with where the segment resumes. A page that settled nothing on a
    /// stop commits nothing: it is read again as it was.
    async fn page(&self, mut page: Page) -> anyhow::Result<()> {
        *self.consumed_rcu.lock().await += page.consumed;
        let carried = self.carried_of(page.segment);
        let (items, met) = skip_counted(&self.plan, std::mem::take(&mut page.items), &carried);
        let stream = core_import::segment_stream(page.segment);
        let to = put(&self.writer, &self.import, &stream);
        let step = PageStep {
            direction: self.direction,
            stop: &self.stop,
            room: MAX_SETTLED.saturating_sub(carried.len()),
        };
        let mut settled = process_page(to, &self.ledger, &self.plan, items, step).await?;
        match &settled.partial {
            // Items of types rekey cannot read have no key to name: counted
            // when their page is whole (a stopped page is read again).
            None => {
                settled.counts.scanned += page.unreadable;
                settled.counts.rejected += page.unreadable;
            }
            Some(done) if done.is_empty() => return Ok(()),
            Some(_) => {}
        }
        self.live
            .fetch_add(settled.counts.scanned, Ordering::Relaxed);
        let end = PageEnd {
            from: page.from,
            next: page.next,
            carried,
            met,
            partial: settled.partial,
        };
        let resume = end.resume();
        let last = matches!(resume, Resume::Done) || self.stop.is_cancelled();
        let still = match &resume {
            Resume::Partial { done, .. } => done.iter().cloned().collect(),
            _ => BTreeSet::new(),
        };
        let done = PageDone {
            key: self.ledger.lock().await.keys.seg(page.segment),
            state: serde_json::to_value(SegState::from(resume))?,
            counts: settled.counts,
            rejects: settled.rejects,
            last,
        };
        commit_page(&self.ledger, &self.import, &stream, done).await?;
        self.set_carried(page.segment, still);
        Ok(())
    }

    fn carried_of(&self, segment: u32) -> BTreeSet<String> {
        let m = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&segment).cloned().unwrap_or_default()
    }

    fn set_carried(&self, segment: u32, done: BTreeSet<String>) {
        let mut m = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(segment, done);
    }
}

/// How far one export data file is done.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum FileState {
    Lines(u64),
    Done,
}

/// Items per commit when reading an export.
pub(super) const EXPORT_PAGE: usize = 500;

impl Drive<'_> {
    /// The segment count is fixed by the first run: resume points belong to it.
    pub(super) async fn segments(
        &self,
        asked: Option<u32>,
        table_bytes: u64,
    ) -> anyhow::Result<u32> {
        let l = self.ledger.lock().await;
        if let Some(n) = l.store.get::<u32>(&l.keys.segments())? {
            return Ok(n);
        }
        let n = asked.unwrap_or_else(|| scan::default_segments(table_bytes, 4));
        l.store.put(&l.keys.segments(), &n)?;
        l.store.flush()?;
        Ok(n)
    }

    pub(super) async fn scan(&self, segments: u32, page_limit: Option<i32>) -> anyhow::Result<()> {
        let mut starts = Vec::with_capacity(segments as usize);
        let mut carried = HashMap::new();
        {
            let l = self.ledger.lock().await;
            for n in 0..segments {
                starts.push(match l.store.get::<SegState>(&l.keys.seg(n))? {
                    None | Some(SegState::Pending) => SegmentStart::Beginning,
                    Some(SegState::After(k)) => SegmentStart::After(k),
                    Some(SegState::Partial { from, done }) => {
                        carried.insert(n, done.into_iter().collect());
                        from.map_or(SegmentStart::Beginning, SegmentStart::After)
                    }
                    Some(SegState::Done) => SegmentStart::Done,
                });
            }
        }
        let scan_opts = ScanOptions {
            table: self.plan.source_table.clone(),
            segments,
            page_limit,
            consistent_read: false,
        };
        let pages = ScanPages {
            writer: self.writer.clone(),
            ledger: self.ledger.clone(),
            plan: self.plan.clone(),
            consumed_rcu: self.consumed_rcu.clone(),
            live: self.live.clone(),
            import: self.import.clone(),
            stop: self.stop.clone(),
            direction: self.direction,
            carried: Arc::new(std::sync::Mutex::new(carried)),
        };
        let pages = Arc::new(pages);
        scan::scan(
            self.clients,
            &scan_opts,
            starts,
            self.control.clone(),
            &self.stop,
            move |page: Page| {
                let pages = pages.clone();
                async move { pages.page(page).await }
            },
        )
        .await
    }

    /// Read an export's data files, `parallel` at a time, committing each
    /// file's line count after every page of writes.
    pub(super) async fn export(
        &self,
        location: &str,
        parallel: usize,
        lines: usize,
    ) -> anyhow::Result<()> {
        let loc = ExportLocation::parse(location).map_err(|e| InputError(e.to_string()))?;
        let s3 = s3_client(self.clients, &loc);
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
                    self.export_file(&reader, &file, lines).await
                }
            })
            .buffer_unordered(parallel.max(1))
            .collect::<Vec<anyhow::Result<()>>>()
            .await
            .into_iter()
            .collect()
    }

    pub(super) async fn export_file(
        &self,
        reader: &ExportReader,
        file: &DataFile,
        lines: usize,
    ) -> anyhow::Result<()> {
        let key = format!("backfill/file/{}", file.key);
        let stream = core_import::export_stream(&file.key);
        let from = match self.ledger.lock().await.store.get::<FileState>(&key)? {
            Some(FileState::Done) => return Ok(()),
            Some(FileState::Lines(n)) => n,
            None => 0,
        };
        let read = FileRead {
            from,
            lines,
            stop: &self.stop,
        };
        let (key, stream) = (&key, &stream);
        let whole = read_file_pages(reader, file, read, move |p: FilePage| async move {
            let to = put(&self.writer, &self.import, stream);
            let step = PageStep {
                direction: None,
                stop: &self.stop,
                room: 0,
            };
            let settled = process_page(to, &self.ledger, &self.plan, p.items, step).await?;
            if settled.partial.is_some() {
                // Stopped mid-page: an export page is a few hundred lines,
                // read again from the file's last commit.
                return Ok(());
            }
            let (mut counts, mut rejects) = (settled.counts, settled.rejects);
            let mut bad = p.bad;
            counts.scanned += bad.len() as u64;
            counts.rejected += bad.len() as u64;
            rejects.append(&mut bad);
            self.live.fetch_add(counts.scanned, Ordering::Relaxed);
            let done = PageDone {
                key: key.clone(),
                state: serde_json::to_value(FileState::Lines(p.lines))?,
                counts,
                rejects,
                last: p.last,
            };
            commit_page(&self.ledger, &self.import, stream, done).await
        })
        .await?;
        if !whole {
            // Stopped: checkpointed, the rest of the file is read on resume.
            return Ok(());
        }
        if let Some(sink) = &self.import {
            // The file's last pages are in an object before it is done.
            sink.flush_stream(&self.ledger, stream).await?;
        }
        let l = self.ledger.lock().await;
        l.store.put(key, &FileState::Done)?;
        l.store.flush()?;
        Ok(())
    }
}

/// The S3 client an export at `loc` is read with (None: a local directory).
pub(super) fn s3_client(clients: &Clients, loc: &ExportLocation) -> Option<S3Client> {
    matches!(loc, ExportLocation::S3 { .. }).then(|| S3Client {
        client: clients.s3.clone(),
        endpoint: clients.endpoints.s3.clone(),
    })
}

/// Lines of an export data file per page (per commit) in a worker's file
/// unit: `--page-size`, else [`EXPORT_PAGE`] (`rekey backfill --from-export`
/// reads [`EXPORT_PAGE`] lines a page).
pub(super) fn export_page(page_limit: Option<i32>) -> usize {
    page_limit.map_or(EXPORT_PAGE, |n| n.max(1) as usize)
}

/// How [`read_file_pages`] reads a data file.
pub(super) struct FileRead<'a> {
    /// Lines already committed: skipped (decompressed, not parsed).
    pub(super) from: u64,
    /// Lines per page.
    pub(super) lines: usize,
    /// Cancelled: the page in flight is handed on, then the read ends.
    pub(super) stop: &'a CancellationToken,
}

/// One page of an export data file.
pub(super) struct FilePage {
    pub(super) items: Vec<Item>,
    /// Lines that are not items, each a reject: (an empty item, `key:line: why`).
    pub(super) bad: Vec<(Item, String)>,
    /// Lines of the file through this page: where the file resumes after it.
    pub(super) lines: u64,
    /// The file's last lines were read, or a stop.
    pub(super) last: bool,
}

/// Reads data file `file` of an export from line `read.from`, in pages of
/// up to `read.lines` lines, each handed to `on_page` (which commits it)
/// before the next is made. True once the file is read through and proved
/// whole (its line count and MD5 checked against the manifest); false on a
/// stop. Both `rekey backfill --from-export` and a worker's file units read
/// exports through this: what differs is where `on_page` commits.
pub(super) async fn read_file_pages<F, Fut>(
    reader: &ExportReader,
    file: &DataFile,
    read: FileRead<'_>,
    mut on_page: F,
) -> anyhow::Result<bool>
where
    F: FnMut(FilePage) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let FileRead { from, lines, stop } = read;
    let (tx, rx) = lines_channel(lines * 2);
    let reading = reader.read_file(file, from, tx);
    let consuming = async {
        // Owned here, so that a stop or an error, which ends this block,
        // drops the receiver: the reader, blocked on a full channel, then
        // sees it gone and ends too, instead of waiting forever.
        let mut rx = rx;
        let mut through = from;
        let mut page: Vec<Item> = Vec::with_capacity(lines);
        let mut bad: Vec<(Item, String)> = Vec::new();
        let mut last_line = from;
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
            if page.len() + bad.len() >= lines || (at_end && last_line > through) {
                through = last_line;
                on_page(FilePage {
                    items: std::mem::take(&mut page),
                    bad: std::mem::take(&mut bad),
                    lines: through,
                    last: at_end || stop.is_cancelled(),
                })
                .await?;
                if stop.is_cancelled() {
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
    if stop.is_cancelled() {
        // The reader saw its receiver go: not an error, the file is not done.
        return Ok(false);
    }
    read?;
    Ok(true)
}
