//! `--via-import`: the backfill's write strategy for a target table that does
//! not exist yet. Pages are read, transformed and claimed as in every
//! backfill; their target items go into gzip DynamoDB JSON objects in S3
//! instead of BatchWriteItem calls, and when every page is in an object,
//! ImportTable creates the target from them — billed per GB, no write
//! units, nothing throttles.
//!
//! Objects (`core::import`): each stream (a Scan segment, an export data
//! file) fills numbered parts; a part's pages are committed, with the next
//! part number, once its object is written. Until then they are *pending*
//! here: their resume point, counters and rejects wait with the open part, so
//! a checkpoint never runs ahead of an object, and a kill -9 re-reads the
//! open part's pages into the same object name (overwritten, not
//! duplicated).
//!
//! The job (`backfill/import/job` in the state store) holds the location, a
//! client token, and the import's ARN, recorded as soon as ImportTable
//! answers. Resume: no ARN → pages go on from their checkpoints; an ARN →
//! ImportTable is not called again, the run waits on DescribeImport. The
//! job is marked `requested` durably *before* the call, so a kill between
//! the call and the ARN's record calls again with the same token (DynamoDB
//! answers with the same import for 8 hours).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as SyncMutex};

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::aws::export::ExportLocation;
use crate::aws::rate::Control;
use crate::aws::{AwsError, Clients, TableInfo, import as s3import};
use crate::core::import as objects;
use crate::core::import::{Estimate, MAX_OBJECTS, ObjectBuilder, import_refusal, object_key};
use crate::core::plan::{Mode, Plan};
use crate::core::value::{Item, item_size};
use crate::phase::error::InputError;
use crate::state::snapshot::ImportProgress;
use crate::state::{BackfillStage, StateStore};

use super::ledger::{Ledger, PageDone};
use super::{BackfillOptions, Counters, Keys};

mod table;

pub use table::ImportReport;
pub(super) use table::{Books, error_note};

const JOB_KEY: &str = "backfill/import/job";
const PART_KEYS: &str = "backfill/import/part/";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    bucket: String,
    /// The import's S3KeyPrefix: the operator's prefix and `data/`.
    data_prefix: String,
    /// What the pages are read from: `scan`, or the export's location.
    source: String,
    client_token: String,
    /// ImportTable may have been called (recorded before the call).
    requested: bool,
    arn: Option<String>,
}

impl Job {
    fn objects_at(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.data_prefix)
    }

    /// The `--via-import` location: the objects' folder without `data/`.
    fn location(&self) -> String {
        let prefix = self
            .data_prefix
            .strip_suffix(&format!("{}/", objects::DATA_DIR))
            .unwrap_or(&self.data_prefix)
            .trim_end_matches('/');
        if prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{prefix}", self.bucket)
        }
    }
}

/// Pages waiting for their part's object: the last resume point, and the
/// counters and rejects of every page since the last commit.
struct Pending {
    key: String,
    state: serde_json::Value,
    counts: Counters,
    rejects: Vec<(Item, String)>,
    reject_bytes: u64,
}

/// One stream's open part.
struct Part {
    number: u64,
    object: ObjectBuilder,
    pending: Option<Pending>,
}

/// The write strategy: target items into S3 objects.
pub(super) struct ImportSink {
    clients: Clients,
    control: Arc<Control>,
    job: SyncMutex<Job>,
    object_bytes: u64,
    max_retries: u32,
    /// Committed objects, over every run.
    objects: AtomicU64,
    open: SyncMutex<HashMap<String, Part>>,
}

fn lock<T>(m: &SyncMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `--via-import` refuses what it cannot do, before anything is read.
pub(super) fn check_options(plan: &Plan, opts: &BackfillOptions) -> anyhow::Result<()> {
    let Some(loc) = &opts.via_import else {
        return Ok(());
    };
    let refuse = |why: String| Err(InputError(why).into());
    if plan.mode == Mode::InPlace || opts.undo {
        return refuse(format!(
            "{}: --via-import creates a new target table; this plan's target is its source `{}`",
            plan.path.display(),
            plan.source_table
        ));
    }
    match ExportLocation::parse(loc).map_err(|e| InputError(e.to_string()))? {
        ExportLocation::S3 { .. } => Ok(()),
        ExportLocation::Local(_) => refuse(format!(
            "--via-import {loc}: give an s3://bucket/prefix (DynamoDB imports from S3)"
        )),
    }
}

/// A migration that began with `--via-import` goes on with it until its
/// backfill is done: its committed pages are in objects, not in a table.
pub(super) fn check_resume(store: &StateStore, opts: &BackfillOptions) -> anyhow::Result<()> {
    if opts.via_import.is_some() || opts.undo {
        return Ok(());
    }
    let done =
        store.get::<BackfillStage>(&Keys::of(false).phase())? == Some(BackfillStage::BackfillDone);
    match store.get::<Job>(JOB_KEY)? {
        Some(job) if !done => Err(InputError(format!(
            "this backfill writes through an import: its committed pages are objects in {},              not items in a table; run it with --via-import {}",
            job.objects_at(),
            job.location()
        ))
        .into()),
        _ => Ok(()),
    }
}

/// `Err` naming the table and endpoint when the target exists.
async fn refuse_existing_target(clients: &Clients, plan: &Plan) -> anyhow::Result<()> {
    match clients.describe_table(&plan.target_table).await {
        Err(AwsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(_) => Err(InputError(format!(
            "table `{}` exists already (DynamoDB at {}): --via-import creates the target with \
             ImportTable, which makes new tables only. Back it up and delete it, name a new \
             target in the plan, or backfill into it without --via-import",
            plan.target_table, clients.endpoints.dynamodb
        ))
        .into()),
    }
}

fn client_token(plan: &Plan, job: &str) -> String {
    use md5::{Digest, Md5};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!(
        "{}|{}|{job}|{nanos}|{}",
        plan.fingerprint,
        plan.target_table,
        std::process::id()
    );
    Md5::digest(seed.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The job of this migration: recorded on its first run, after the checks a
/// first run needs (no target table, an empty data folder, few enough
/// objects); on a later run, the same location and source are required.
async fn job(
    clients: &Clients,
    plan: &Plan,
    opts: &BackfillOptions,
    source: &TableInfo,
    store: &StateStore,
) -> anyhow::Result<Job> {
    let loc = opts.via_import.as_deref().unwrap_or_default();
    let ExportLocation::S3 { bucket, prefix } = ExportLocation::parse(loc)? else {
        unreachable!("check_options refused local directories");
    };
    let data_prefix = objects::data_prefix(&prefix);
    let read_from = opts.from_export.clone().unwrap_or_else(|| "scan".into());
    if let Some(job) = store.get::<Job>(JOB_KEY)? {
        if job.bucket != bucket || job.data_prefix != data_prefix || job.source != read_from {
            return Err(InputError(format!(
                "this migration imports from {} (read from {}); run it with the same --via-import \
                 and source, or start over with a new --state-dir",
                job.objects_at(),
                job.source
            ))
            .into());
        }
        if job.arn.is_none() && !job.requested {
            refuse_existing_target(clients, plan).await?;
        }
        return Ok(job);
    }
    refuse_existing_target(clients, plan).await?;
    if let Some(key) = s3import::first_object(clients, &bucket, &data_prefix).await? {
        return Err(InputError(format!(
            "s3://{bucket}/{key} is in the import's data folder s3://{bucket}/{data_prefix} \
             already, and DynamoDB would import it too: give --via-import an empty prefix"
        ))
        .into());
    }
    let expected = source.size_bytes / opts.import_object_bytes.max(1);
    if expected > MAX_OBJECTS {
        return Err(InputError(format!(
            "`{}` holds about {} bytes: about {expected} objects of --import-object-size {}, \
             over the {MAX_OBJECTS} one import takes. Give a larger --import-object-size",
            source.name, source.size_bytes, opts.import_object_bytes
        ))
        .into());
    }
    let mut job = Job {
        bucket,
        data_prefix,
        source: read_from,
        client_token: String::new(),
        requested: false,
        arn: None,
    };
    job.client_token = client_token(plan, &job.objects_at());
    store.put(JOB_KEY, &job)?;
    store.flush()?;
    Ok(job)
}

/// The up-front word on time: how long reading and importing may take, and
/// whether the source stream's 24-hour retention could run out before the
/// tail applies what it captured.
fn retention_note(
    opts: &BackfillOptions,
    source: &TableInfo,
    read_rate: Option<f64>,
) -> Option<String> {
    source.stream.as_ref()?;
    let rate = read_rate.filter(|_| opts.from_export.is_none());
    let est = Estimate::of(source.size_bytes, source.item_count, rate);
    if !est.risks_retention() {
        return None;
    }
    let tail = opts.tail_in_process
        || crate::state::snapshot::read::<crate::state::snapshot::TailStatus>(
            &opts.state_dir.tail_snapshot(),
        )
        .ok()
        .flatten()
        .is_some_and(|t| !t.stopped && crate::state::snapshot::alive(t.pid));
    let when = format!(
        "reading `{}` (~{} items, ~{:.1} GiB) and importing it may take ~{} (~{} to read, ~{} to import; a rough estimate, README \"--via-import\"), \
         past half of the 24 hours its stream keeps a change",
        source.name,
        source.item_count,
        source.size_bytes as f64 / (1u64 << 30) as f64,
        objects::show_duration(est.total()),
        objects::show_duration(est.read),
        objects::show_duration(est.import),
    );
    Some(if tail {
        format!(
            "note: {when}. The tail is running: it keeps every change in {} until the import is done, \
             so none is lost; keep it running",
            opts.state_dir.tail_store().display()
        )
    } else {
        format!(
            "warning: {when}, and no `rekey tail` is running for {}: start it now and keep it running \
             (it keeps changes durably until the backfill is done); a tail started more than 24 hours \
             after this backfill would miss changes",
            opts.state_dir.display()
        )
    })
}

impl ImportSink {
    /// The sink of this migration's import, with the checks of [`job`], and
    /// the note on time (none once the import has started).
    pub(super) async fn open(
        clients: &Clients,
        plan: &Plan,
        opts: &BackfillOptions,
        source: &TableInfo,
        ledger: &Mutex<Ledger>,
        control: Arc<Control>,
    ) -> anyhow::Result<(ImportSink, Option<String>)> {
        let l = ledger.lock().await;
        let job = job(clients, plan, opts, source, &l.store).await?;
        let parts: u64 = l
            .store
            .scan_prefix::<u64>(PART_KEYS)?
            .into_iter()
            .map(|(_, n)| n)
            .sum();
        drop(l);
        let note = if job.arn.is_none() {
            retention_note(opts, source, control.read.rate().await)
        } else {
            None
        };
        let sink = ImportSink {
            clients: clients.clone(),
            control,
            job: SyncMutex::new(job),
            object_bytes: opts.import_object_bytes.max(1),
            max_retries: opts.max_retries,
            objects: AtomicU64::new(parts),
            open: SyncMutex::new(HashMap::new()),
        };
        Ok((sink, note))
    }

    /// ImportTable was answered: every page is in its object already.
    pub(super) fn started(&self) -> bool {
        lock(&self.job).arn.is_some()
    }

    pub(super) fn progress(&self) -> ImportProgress {
        let job = lock(&self.job);
        ImportProgress {
            objects_at: job.objects_at(),
            objects: self.objects.load(Ordering::Relaxed),
            import_arn: job.arn.clone(),
            ..Default::default()
        }
    }

    /// `stream`'s open part, taken out (a stream's pages come one at a time).
    async fn take(&self, ledger: &Mutex<Ledger>, stream: &str) -> anyhow::Result<Part> {
        if let Some(p) = lock(&self.open).remove(stream) {
            return Ok(p);
        }
        let key = format!("{PART_KEYS}{stream}");
        let number = ledger.lock().await.store.get::<u64>(&key)?.unwrap_or(0);
        Ok(Part {
            number,
            object: ObjectBuilder::new(),
            pending: None,
        })
    }

    fn put_back(&self, stream: &str, part: Part) {
        lock(&self.open).insert(stream.to_string(), part);
    }

    /// Adds a page's claimed target items to `stream`'s open part; returns,
    /// per item, None or why the import would not store it (a reject).
    pub(super) async fn add(
        &self,
        ledger: &Mutex<Ledger>,
        plan: &Plan,
        stream: &str,
        items: &[Item],
    ) -> anyhow::Result<Vec<Option<String>>> {
        let mut part = self.take(ledger, stream).await?;
        let refusals = items
            .iter()
            .map(|item| {
                let why = import_refusal(plan, item);
                if why.is_none() {
                    part.object.add(item);
                }
                why
            })
            .collect();
        self.put_back(stream, part);
        Ok(refusals)
    }

    /// A page is done: its resume point, counters and rejects wait with the
    /// open part, committed when the part's object is written — now, if
    /// `last` (the stream's last page, or a stop) or the part is full.
    pub(super) async fn commit(
        &self,
        ledger: &Mutex<Ledger>,
        stream: &str,
        page: PageDone,
    ) -> anyhow::Result<()> {
        let PageDone {
            key,
            state,
            counts,
            rejects,
            last,
        } = page;
        let mut part = self.take(ledger, stream).await?;
        let p = part.pending.get_or_insert_with(|| Pending {
            key: key.clone(),
            state: serde_json::Value::Null,
            counts: Counters::default(),
            rejects: Vec::new(),
            reject_bytes: 0,
        });
        p.key = key;
        p.state = state;
        p.counts.add(&counts);
        p.reject_bytes += rejects
            .iter()
            .map(|(i, _)| item_size(i) as u64)
            .sum::<u64>();
        p.rejects.extend(rejects);
        let full = part.object.raw_bytes() + p.reject_bytes >= self.object_bytes;
        if last || full {
            self.flush(ledger, stream, part).await
        } else {
            self.put_back(stream, part);
            Ok(())
        }
    }

    /// Writes the part's object (or, with nothing in it, deletes whatever a
    /// killed run may have left under its name), then commits its pages and
    /// the next part number together.
    async fn flush(&self, ledger: &Mutex<Ledger>, stream: &str, part: Part) -> anyhow::Result<()> {
        let Part {
            number,
            object,
            pending,
        } = part;
        let Some(p) = pending else {
            self.put_back(
                stream,
                Part {
                    number,
                    object,
                    pending: None,
                },
            );
            return Ok(());
        };
        let (bucket, prefix) = {
            let job = lock(&self.job);
            (job.bucket.clone(), job.data_prefix.clone())
        };
        let name = object_key(&prefix, stream, number);
        let next = if object.items() > 0 {
            let body = bytes::Bytes::from(object.finish());
            let _in_flight = self.control.wait_write().await;
            s3import::put_object(&self.clients, &bucket, &name, body, self.max_retries).await?;
            number + 1
        } else {
            s3import::delete_object(&self.clients, &bucket, &name).await?;
            number
        };
        let part_key = format!("{PART_KEYS}{stream}");
        ledger.lock().await.commit_with(
            &p.key,
            &p.state,
            &p.counts,
            &p.rejects,
            &[(part_key.as_str(), serde_json::json!(next))],
        )?;
        self.objects.fetch_add(next - number, Ordering::Relaxed);
        self.put_back(
            stream,
            Part {
                number: next,
                object: ObjectBuilder::new(),
                pending: None,
            },
        );
        Ok(())
    }

    /// Writes and commits `stream`'s open part, if pages wait in it.
    pub(super) async fn flush_stream(
        &self,
        ledger: &Mutex<Ledger>,
        stream: &str,
    ) -> anyhow::Result<()> {
        let part = lock(&self.open).remove(stream);
        match part {
            Some(part) => self.flush(ledger, stream, part).await,
            None => Ok(()),
        }
    }

    /// Every open part with pages waiting: after the last page, or a stop.
    pub(super) async fn flush_all(&self, ledger: &Mutex<Ledger>) -> anyhow::Result<()> {
        let streams: Vec<String> = lock(&self.open).keys().cloned().collect();
        for s in streams {
            self.flush_stream(ledger, &s).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::StreamInfo;
    use crate::core::plan::{KeyAttr, KeySchema};
    use crate::core::value::ScalarType;
    use crate::state::StateDir;

    fn options(dir: &std::path::Path, tail_in_process: bool) -> BackfillOptions {
        let state_dir = StateDir::new(dir);
        BackfillOptions {
            rejects: state_dir.rejects(),
            state_dir,
            segments: None,
            page_limit: None,
            read_rate: None,
            write_rate: crate::aws::rate::Rate::Units(1000.0),
            key_write_rate: 300,
            concurrency: 1,
            max_retries: 1,
            from_export: None,
            export_files_in_parallel: 1,
            undo: false,
            via_import: Some("s3://b/p".into()),
            import_object_bytes: objects::DEFAULT_OBJECT_BYTES,
            tail_in_process,
        }
    }

    fn table(bytes: u64, stream: bool) -> TableInfo {
        TableInfo {
            name: "orders".into(),
            key: KeySchema {
                partition_key: KeyAttr {
                    name: "PK".into(),
                    ty: ScalarType::S,
                },
                sort_key: None,
            },
            item_count: bytes / 1000,
            size_bytes: bytes,
            provisioned_read: None,
            provisioned_write: None,
            stream: stream.then(|| StreamInfo {
                arn: "arn:s".into(),
                view: "NEW_AND_OLD_IMAGES".into(),
            }),
        }
    }

    #[test]
    fn a_long_import_is_a_warning_without_a_running_tail_and_a_note_with_one() {
        let dir = tempfile::tempdir().unwrap();
        let big = table(300 << 30, true);
        let warn = retention_note(&options(dir.path(), false), &big, Some(2000.0)).unwrap();
        assert!(warn.starts_with("warning: reading `orders`"), "{warn}");
        assert!(warn.contains("no `rekey tail` is running"), "{warn}");
        let note = retention_note(&options(dir.path(), true), &big, Some(2000.0)).unwrap();
        assert!(note.starts_with("note: "), "{note}");
        assert!(note.contains("The tail is running"), "{note}");
        // Short, or no stream (no tail can run): nothing to say.
        let small = table(1 << 30, true);
        assert_eq!(
            retention_note(&options(dir.path(), false), &small, None),
            None
        );
        let no_stream = table(300 << 30, false);
        assert_eq!(
            retention_note(&options(dir.path(), false), &no_stream, None),
            None
        );
    }

    #[test]
    fn the_location_is_given_back_as_the_operator_wrote_it() {
        let job = |data_prefix: &str| Job {
            bucket: "b".into(),
            data_prefix: data_prefix.into(),
            source: "scan".into(),
            client_token: "t".into(),
            requested: false,
            arn: None,
        };
        assert_eq!(job("rekey/orders/data/").location(), "s3://b/rekey/orders");
        assert_eq!(job("data/").location(), "s3://b");
        assert_eq!(
            job("rekey/orders/data/").objects_at(),
            "s3://b/rekey/orders/data/"
        );
    }
}
