//! `rekey worker --from-export s3://…`: the fleet's backfill from an S3
//! export, one unit per data file ([`crate::state::fleet::export`]).
//!
//! The worker that creates the migration lists the export's data files from
//! its manifest and records one unit per file, and the export in `META`;
//! a worker that joins opens that export (by id: a newer export at the same
//! location is not read) and finds each unit's file by the key it records.
//! A file's unit is read with the single-machine backfill's own reader
//! ([`read_file_pages`]: the same pages, the same checks of the file's line
//! count and MD5, the same bad-line rejects) from the lines its last holder
//! committed, and each page goes the way a Scan page does
//! ([`UnitDrive::commit_read`]: claims unless the plan is collision-free,
//! fenced writes, checkpoint and counters committed under the lease). The
//! file's unit is done only once the reader has proved the file whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::export::{ExportLocation, ExportReader};
use crate::core::plan::Plan;
use crate::phase::backfill::source::{FilePage, FileRead, read_file_pages, s3_client};
use crate::phase::error::InputError;
use crate::phase::progress::Progress;
use crate::state::fleet::export::{ExportSource, check_source, file_units, unit_files};
use crate::state::fleet::{Checkpoint, Counters, Fleet, Lease, Unit};

use super::unit::{ExportFiles, PageRead, UnitDrive};
use super::{DEFAULT_FLEET_SEGMENTS, WorkerOptions};

/// What joining gave this worker: the units' count, and the export they
/// read when they read one.
pub(super) struct Joined {
    pub(super) units: u32,
    pub(super) export: Option<(ExportSource, Arc<ExportFiles>)>,
}

/// Joins the migration (creating it if need be): by Scan, or, with
/// `--from-export`, over the export's data files. A worker whose source is
/// not the migration's is refused before it reads anything.
pub(super) async fn join(
    clients: &Clients,
    fleet: &Fleet,
    plan: &Plan,
    opts: &WorkerOptions,
    progress: &Progress,
) -> anyhow::Result<Joined> {
    let asked = opts.backfill.segments.unwrap_or(DEFAULT_FLEET_SEGMENTS);
    let Some(given) = &opts.backfill.from_export else {
        let meta = fleet.join_backfill(plan, asked, None).await?;
        if opts.backfill.segments.is_some_and(|n| n != meta.segments) {
            progress.note(&format!(
                "--segments {asked} ignored: the migration was created with {}",
                meta.segments
            ));
        }
        return Ok(Joined {
            units: meta.segments,
            export: None,
        });
    };
    let loc = ExportLocation::parse(given).map_err(|e| InputError(e.to_string()))?;
    let location = loc.to_string();
    fleet.control.ensure().await?;
    let stored = fleet.meta().await?;
    let recorded = stored.as_ref().and_then(|m| m.export.as_ref());
    if stored.is_some() {
        check_source(
            &fleet.at.migration,
            recorded,
            Some((location.as_str(), None)),
        )?;
    }
    let s3 = s3_client(clients, &loc);
    let id = recorded.map(|e| e.export_id.clone());
    let (reader, manifest) = ExportReader::open_export(loc, s3, id.as_deref()).await?;
    if let Some(note) = manifest.selection_note() {
        progress.note(&note);
    }
    let keys = file_units(&manifest.files).map_err(InputError)?;
    let source = ExportSource {
        location,
        export_id: manifest.export_id.clone(),
        export_time_ms: manifest.export_time_epoch_ms,
        files: keys.len() as u32,
    };
    fleet
        .join_backfill(plan, asked, Some((&source, keys.as_slice())))
        .await?;
    let units = fleet.read().await?.units;
    let files = unit_files(&units, &manifest.files)
        .map_err(|e| anyhow::anyhow!("{}: {e}", fleet.at.display()))?;
    let files = Arc::new(ExportFiles { reader, files });
    Ok(Joined {
        units: source.files,
        export: Some((source, files)),
    })
}

impl UnitDrive {
    /// [`Drive::run`] for a data file's unit: its pages from the lines
    /// committed, then, once the reader has proved the file whole, the
    /// unit's last commit (done).
    pub(super) async fn run_file(
        self: Arc<Self>,
        files: &ExportFiles,
        lines: usize,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> anyhow::Result<bool> {
        let from = match &unit.checkpoint {
            Checkpoint::Done => return Ok(true),
            Checkpoint::Beginning => 0,
            Checkpoint::Lines(n) => *n,
            Checkpoint::After(_) | Checkpoint::Partial { .. } => {
                anyhow::bail!(
                    "unit {}: a Scan checkpoint on an export file's unit",
                    unit.n
                )
            }
        };
        let file = files
            .files
            .get(&unit.n)
            .ok_or_else(|| anyhow::anyhow!("unit {}: no data file of the export", unit.n))?;
        let pages = AtomicU64::new(unit.page);
        let read = FileRead {
            from,
            lines,
            stop: &stop,
        };
        let whole = read_file_pages(&files.reader, file, read, |p: FilePage| {
            let page_no = pages.fetch_add(1, Ordering::SeqCst);
            let (me, stop) = (self.clone(), stop.clone());
            async move {
                let lines = p.lines;
                let read = PageRead {
                    items: p.items,
                    unreadable: p.bad.len() as u64,
                    room: 0,
                    bad: p.bad,
                    // Stopped mid-page: an export page is a few hundred
                    // lines, read again from the last commit.
                    checkpoint: Box::new(move |partial| {
                        partial.is_none().then_some(Checkpoint::Lines(lines))
                    }),
                };
                me.commit_read(l, read, page_no, &stop).await
            }
        })
        .await?;
        if !whole {
            return Ok(false);
        }
        let page = pages.load(Ordering::SeqCst);
        self.commit_fenced(l, &Checkpoint::Done, &Counters::default(), page)
            .await?;
        tracing::info!(unit = l.unit, file = %file.key, "data file done");
        Ok(true)
    }
}
