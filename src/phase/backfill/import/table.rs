//! The end of a `--via-import` backfill: ImportTable, called once per
//! migration (the job marked requested first, the ARN recorded as soon as
//! DynamoDB answers), then DescribeImport until the import ends, shown on
//! the progress display and in `backfill.json`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::import::{ImportFailed, ImportInfo, ImportSpec, ImportStatus};
use crate::aws::{AwsError, import as s3import};
use crate::core::import::MAX_OBJECTS;
use crate::core::plan::Plan;
use crate::phase::backfill::Counters;
use crate::phase::backfill::ledger::Ledger;
use crate::phase::backfill::status::{Ending, snapshot};
use crate::phase::error::InputError;
use crate::phase::progress::Progress;
use crate::state::StateDir;
use crate::state::snapshot::{BackfillStatus, ImportProgress};

use super::{ImportSink, JOB_KEY, lock};

/// The first DescribeImport comes this long after ImportTable, later ones
/// every [`POLL`]: an import takes minutes at least.
const FIRST_POLL: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_secs(5);

/// What a `--via-import` backfill reports.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub objects_at: String,
    pub objects: u64,
    pub import_arn: String,
    pub status: String,
    pub processed_items: u64,
    pub processed_bytes: u64,
    pub imported_items: u64,
    /// Items DynamoDB could not import (CloudWatch has them).
    pub error_count: u64,
}

/// What the wait on an import publishes besides its own progress.
pub(in crate::phase::backfill) struct Books<'a> {
    pub(in crate::phase::backfill) dir: &'a StateDir,
    pub(in crate::phase::backfill) totals: Counters,
    pub(in crate::phase::backfill) expected_items: u64,
}

impl ImportSink {
    /// ImportTable, once per migration: the job is marked requested first,
    /// and the ARN recorded as soon as DynamoDB answers. With an ARN
    /// recorded, DescribeImport instead.
    async fn start(&self, plan: &Plan, ledger: &Mutex<Ledger>) -> anyhow::Result<ImportInfo> {
        let mut job = lock(&self.job).clone();
        if let Some(arn) = &job.arn {
            let info = s3import::describe_import(&self.clients, arn).await?;
            if info.table_name() != plan.target_table {
                anyhow::bail!(InputError(format!(
                    "the import this migration recorded ({arn}) creates table `{}`, not the plan's target `{}`",
                    info.table_name(),
                    plan.target_table
                )));
            }
            return Ok(info);
        }
        let objects = self.objects.load(Ordering::Relaxed);
        if objects == 0 {
            anyhow::bail!(InputError(format!(
                "no source item maps to a target item: there is nothing to import into `{}` \
                 (ImportTable needs data); create the table and backfill without --via-import",
                plan.target_table
            )));
        }
        if objects > MAX_OBJECTS {
            anyhow::bail!(InputError(format!(
                "{objects} objects in {}, over the {MAX_OBJECTS} one import takes: delete them and \
                 the state directory, and backfill again with a larger --import-object-size",
                job.objects_at()
            )));
        }
        let again = job.requested;
        job.requested = true;
        {
            let l = ledger.lock().await;
            l.store.put(JOB_KEY, &job)?;
            l.store.flush()?;
        }
        let spec = ImportSpec {
            table: &plan.target_table,
            key: &plan.target_key,
            indexes: &plan.indexes,
            bucket: &job.bucket,
            key_prefix: &job.data_prefix,
            client_token: &job.client_token,
        };
        let info = match s3import::import_table(&self.clients, &spec).await {
            Ok(info) => info,
            Err(AwsError::Service { code, .. }) if again && code == "ResourceInUseException" => {
                anyhow::bail!(
                    "ImportTable into `{}` was called by an earlier run that stopped before it \
                     recorded the import, and DynamoDB no longer matches the call to it (its \
                     client token lasts 8 hours): find the import with `aws dynamodb \
                     list-imports`, and once it has COMPLETED, backfill again without --via-import \
                     (a plain backfill rewrites the same items) or delete the table and the state \
                     directory and start over",
                    plan.target_table
                )
            }
            Err(e) => return Err(e.into()),
        };
        job.arn = Some(info.arn.clone());
        {
            let l = ledger.lock().await;
            l.store.put(JOB_KEY, &job)?;
            l.store.flush()?;
        }
        *lock(&self.job) = job;
        Ok(info)
    }

    /// Every page is in an object: the import, and the wait for its end,
    /// reported through `progress` and `backfill.json`. `None` when stopped
    /// while waiting: the import goes on in DynamoDB, a rerun waits for it.
    pub(in crate::phase::backfill) async fn import(
        &self,
        plan: &Plan,
        ledger: &Mutex<Ledger>,
        books: Books<'_>,
        progress: &Progress,
        stop: &CancellationToken,
    ) -> anyhow::Result<Option<ImportReport>> {
        let mut info = self.start(plan, ledger).await?;
        progress.note(&format!(
            "import: ImportTable {} creates `{}` from {} objects in {}",
            info.arn,
            plan.target_table,
            self.objects.load(Ordering::Relaxed),
            lock(&self.job).objects_at()
        ));
        progress.start("import", Some(books.totals.written));
        let mut delay = FIRST_POLL;
        let ended = loop {
            self.publish_wait(&info, &books, progress);
            match info.status {
                ImportStatus::Completed => break true,
                ImportStatus::Failed | ImportStatus::Cancelled => break false,
                _ => {}
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => {
                    progress.finish();
                    return Ok(None);
                }
            }
            delay = POLL;
            info = s3import::describe_import(&self.clients, &info.arn).await?;
        };
        progress.finish();
        if !ended {
            return Err(ImportFailed::new(&self.clients, &plan.target_table, &info).into());
        }
        s3import::wait_table_active(&self.clients, &plan.target_table).await?;
        self.clients
            .describe_table(&plan.target_table)
            .await?
            .check_key(&plan.target_key, "target")?;
        Ok(Some(ImportReport {
            objects_at: lock(&self.job).objects_at(),
            objects: self.objects.load(Ordering::Relaxed),
            import_arn: info.arn.clone(),
            status: info.status.to_string(),
            processed_items: info.processed_items,
            processed_bytes: info.processed_bytes,
            imported_items: info.imported_items,
            error_count: info.errors,
        }))
    }

    /// The wait's progress: on the display, and in `backfill.json`.
    fn publish_wait(&self, info: &ImportInfo, books: &Books<'_>, progress: &Progress) {
        progress.update(info.processed_items, 0.0);
        progress.status(
            format!(
                "{} {}: {} items, {} bytes processed, {} errors",
                info.arn, info.status, info.processed_items, info.processed_bytes, info.errors
            ),
            serde_json::json!({
                "import_arn": info.arn,
                "status": info.status.to_string(),
                "processed_items": info.processed_items,
                "processed_bytes": info.processed_bytes,
                "errors": info.errors,
            }),
        );
        let live = BackfillStatus {
            import: Some(ImportProgress {
                status: Some(info.status.to_string()),
                processed_items: info.processed_items,
                processed_bytes: info.processed_bytes,
                ..self.progress()
            }),
            ..Default::default()
        };
        let status = snapshot(
            &books.totals,
            books.expected_items,
            Ending::Running,
            Some(live),
        );
        let _ = crate::state::snapshot::publish(&books.dir.backfill_snapshot(), &status);
    }
}

/// The note for items DynamoDB counted as errors: they are not in the target.
pub(in crate::phase::backfill) fn error_note(plan: &Plan, r: &ImportReport) -> Option<String> {
    (r.error_count > 0).then(|| {
        format!(
            "warning: DynamoDB could not import {} of the {} items processed (its CloudWatch log \
             group for the import names them; import {}): they are missing from `{}`. \
             `rekey verify {} --repair` rewrites them from the source",
            r.error_count,
            r.processed_items,
            r.import_arn,
            plan.target_table,
            plan.path.display()
        )
    })
}
