//! The copy into the target: `backfill` (and `undo`), `tail`.

use std::fmt::Write as _;

use tokio_util::sync::CancellationToken;

use super::{connect, print_done};
use crate::ops::cli::exit;
use crate::ops::config::{Common, Planned};
use crate::ops::progress;
use crate::phase::backfill::{self, BackfillOptions, BackfillReport};
use crate::phase::tail::{self, Flow, TailOptions, TailReport};

/// `rekey backfill`, and `rekey undo` (`options.undo`): `stop` ends it cleanly.
pub(super) async fn backfill(
    c: &Common,
    cmd: Planned<BackfillOptions>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let report = backfill::run(&clients, &plan, &options, &progress, &stop).await?;
    print_done(c, &report, |r| backfill_text(r, options.undo))?;
    Ok(exit::OK)
}

fn backfill_text(report: &BackfillReport, undo: bool) -> String {
    let mut o = String::new();
    let t = &report.totals;
    let _ = writeln!(
        o,
        "{} {} → {}: done. {} scanned = {} written + {} rejected + {} skipped{}",
        if undo { "undo" } else { "backfill" },
        report.source_table,
        report.target_table,
        t.scanned,
        t.written,
        t.rejected,
        t.skipped,
        if report.resumed {
            format!(" (this run: {} scanned)", report.this_run.scanned)
        } else {
            String::new()
        }
    );
    if t.rejected > 0 {
        let _ = writeln!(
            o,
            "  rejects ({} collisions) are in {}",
            t.collisions, report.rejects_file
        );
    }
    if let Some(i) = &report.import {
        let _ = writeln!(
            o,
            "  imported by ImportTable {} ({}): {} items from {} objects in {} ({} bytes processed, {} errors)",
            i.import_arn,
            i.status,
            i.imported_items,
            i.objects,
            i.objects_at,
            i.processed_bytes,
            i.error_count
        );
    }
    for w in &report.warnings {
        let _ = writeln!(o, "  {w}");
    }
    let _ = writeln!(
        o,
        "  {:.0} RCU, {:.0} WCU consumed in {:.1} s; {} write and {} read throttles {:?}",
        report.consumed_rcu,
        report.consumed_wcu,
        report.elapsed_seconds,
        report.throttles.write_throttles,
        report.throttles.read_throttles,
        report.throttles.reasons
    );
    o
}

/// `rekey tail` and `rekey reverse`: `stop` ends it cleanly.
pub(super) async fn tail(
    c: &Common,
    cmd: Planned<TailOptions>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let report = tail::run(&clients, &plan, &options, &progress, &stop).await?;
    match options.flow {
        Flow::Forward => print_done(c, &report, tail_text)?,
        Flow::Reverse => print_done(c, &report, |r| format!("reverse {}", tail_text(r)))?,
    }
    Ok(exit::OK)
}

fn tail_text(report: &TailReport) -> String {
    format!(
        "tail: {} records ({} buffered until the backfill finished): {} puts, {} deletes, {} in-place updates, {} rejected, {} already in sync, {} conflicts; last lag {:.1} s\n",
        report.records,
        report.buffered,
        report.puts,
        report.deletes,
        report.updates,
        report.rejected,
        report.in_sync,
        report.conflicts,
        report.last_lag_seconds
    )
}
