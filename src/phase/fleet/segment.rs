//! One unit's Scan segment, read from its committed checkpoint: the part of
//! a unit that the backfill's and the verify's units both do the same way
//! (what they do with each page is theirs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::rate::Control;
use crate::aws::scan::{self, Page, ScanOptions, SegmentStart};
use crate::state::fleet::{Checkpoint, Unit};

/// One unit's Scan: segment `segment` of `table`.
pub(crate) struct UnitScan {
    pub table: String,
    pub segments: u32,
    pub segment: u32,
    pub page_limit: Option<i32>,
    pub control: Arc<Control>,
    pub stop: CancellationToken,
}

/// Scans `unit`'s segment from its committed checkpoint, page by page,
/// each page handed to `on_page` with its number (which commits it under
/// the lease). True once the segment's last page is through.
pub(crate) async fn scan_unit<F, Fut>(
    clients: &Clients,
    scan: UnitScan,
    unit: &Unit,
    on_page: F,
) -> anyhow::Result<bool>
where
    F: Fn(Page, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let start = match &unit.checkpoint {
        Checkpoint::Done => return Ok(true),
        Checkpoint::Beginning => SegmentStart::Beginning,
        Checkpoint::After(k) => SegmentStart::After(k.clone()),
        Checkpoint::Partial { from, .. } => from
            .clone()
            .map_or(SegmentStart::Beginning, SegmentStart::After),
        Checkpoint::Lines(_) => {
            anyhow::bail!(
                "unit {}: an export file's checkpoint on a Scan segment",
                unit.n
            )
        }
    };
    let mut starts = vec![SegmentStart::Done; scan.segments as usize];
    starts[scan.segment as usize] = start;
    let opts = ScanOptions {
        table: scan.table,
        segments: scan.segments,
        page_limit: scan.page_limit,
        consistent_read: false,
    };
    let page_no = Arc::new(AtomicU64::new(unit.page));
    let done = Arc::new(AtomicBool::new(false));
    let (pages, finished, stop) = (page_no.clone(), done.clone(), scan.stop.clone());
    scan::scan(
        clients,
        &opts,
        starts,
        scan.control,
        &scan.stop,
        move |page: Page| {
            let (on_page, pages, finished) = (on_page.clone(), pages.clone(), finished.clone());
            let stop = stop.clone();
            async move {
                let last = page.next.is_none();
                on_page(page, pages.load(Ordering::SeqCst)).await?;
                pages.fetch_add(1, Ordering::SeqCst);
                // After a stop the last page may have committed only its written
                // part: the unit is through only if the checkpoint says so, and
                // a stopped unit is released either way.
                finished.store(last && !stop.is_cancelled(), Ordering::SeqCst);
                Ok(())
            }
        },
    )
    .await?;
    Ok(done.load(Ordering::SeqCst))
}
