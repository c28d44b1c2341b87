//! Parallel segmented Scan under a read budget, streamed page by page.
//!
//! Each segment is a task that reads one page, hands it to the page handler
//! and only then reads the next: memory holds at most one page per segment
//! whatever the table's size. The page
//! carries the key to resume after it, so a consumer that checkpoints a segment
//! only once a page's work is done can restart from exactly there.

use std::future::Future;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{ReturnConsumedCapacity, Select};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::aws::rate::Control;
use crate::aws::retry::{backoff, jitter};
use crate::aws::{Clients, from_sdk_item, to_sdk_item};

/// Consecutive transient failures (5xx, resets) of one Scan page before the run stops.
const MAX_TRANSIENT_FAILURES: u32 = 10;
use crate::core::value::Item;

/// A segment's resume point: the primary key of the last item it read.
pub type StartKey = Item;

#[derive(Debug, Clone)]
pub struct ScanOptions {
    pub table: String,
    pub segments: u32,
    /// Items per page (None: DynamoDB's 1 MB pages).
    pub page_limit: Option<i32>,
    pub consistent_read: bool,
    /// Cancelled: no segment reads another page (pages in flight finish).
    pub stop: CancellationToken,
}

/// Where each segment begins: from the start, after a key, or not at all (done).
#[derive(Debug, Clone)]
pub enum SegmentStart {
    Beginning,
    After(StartKey),
    Done,
}

#[derive(Debug)]
pub struct Page {
    pub segment: u32,
    pub items: Vec<Item>,
    /// Items whose attribute types this SDK does not know: counted, never dropped silently.
    pub unreadable: u64,
    /// Where to resume this segment after this page; None when the segment is finished.
    pub next: Option<StartKey>,
    pub consumed: f64,
}

/// Scan `opts.table`, handing each page to `on_page` and reading the
/// segment's next page only once `on_page` has returned: a handler that
/// checkpoints the page's `next` key after its work is done therefore never
/// records a position past unfinished work. `starts` has one entry per
/// segment (empty means all from the beginning).
pub async fn scan<F, Fut>(
    clients: &Clients,
    opts: &ScanOptions,
    starts: Vec<SegmentStart>,
    control: Arc<Control>,
    on_page: F,
) -> anyhow::Result<()>
where
    F: Fn(Page) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let segments = opts.segments.max(1);
    let mut tasks = JoinSet::new();
    for segment in 0..segments {
        let start = starts
            .get(segment as usize)
            .cloned()
            .unwrap_or(SegmentStart::Beginning);
        let mut next = match start {
            SegmentStart::Done => continue,
            SegmentStart::Beginning => None,
            SegmentStart::After(k) => Some(to_sdk_item(&k)),
        };
        let (clients, opts, control, on_page) = (
            clients.clone(),
            opts.clone(),
            control.clone(),
            on_page.clone(),
        );
        tasks.spawn(async move {
            let mut failures = 0;
            loop {
                tokio::select! {
                    // A stop wins over a read budget that is also ready: no page after it.
                    biased;
                    () = opts.stop.cancelled() => return anyhow::Ok(()),
                    () = control.wait_read() => {}
                }
                let out = clients
                    .dynamodb
                    .scan()
                    .table_name(&opts.table)
                    .segment(segment as i32)
                    .total_segments(segments as i32)
                    .set_limit(opts.page_limit)
                    .consistent_read(opts.consistent_read)
                    .select(Select::AllAttributes)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .set_exclusive_start_key(next.clone())
                    .send()
                    .await
                    .map_err(|e| clients.error("Scan", &opts.table, e));
                let out = match out {
                    Ok(o) => {
                        failures = 0;
                        o
                    }
                    Err(e) if e.is_throttle() => {
                        // The read side adapts too: a throttled Scan slows every segment.
                        control.read_throttled(&e).await;
                        continue;
                    }
                    Err(e) if e.is_transient() && failures < MAX_TRANSIENT_FAILURES => {
                        failures += 1;
                        tracing::info!(action = "Scan", table = %opts.table, failures, error = %e, "retrying");
                        tokio::time::sleep(backoff(failures, jitter())).await;
                        continue;
                    }
                    Err(e) => return Err(anyhow::Error::new(e)),
                };
                let consumed = out
                    .consumed_capacity()
                    .and_then(|c| c.capacity_units())
                    .unwrap_or(0.0);
                control.read.spend(consumed).await;
                let raw = out.items.unwrap_or_default();
                let mut items = Vec::with_capacity(raw.len());
                let mut unreadable = 0;
                for it in raw {
                    match from_sdk_item(it) {
                        Some(i) => items.push(i),
                        None => unreadable += 1,
                    }
                }
                next = out.last_evaluated_key.filter(|k| !k.is_empty());
                let resume_after = match &next {
                    None => None,
                    Some(k) => Some(from_sdk_item(k.clone()).ok_or_else(|| {
                        anyhow::anyhow!(
                            "Scan of `{}` returned a resume key of unknown types",
                            opts.table
                        )
                    })?),
                };
                on_page(Page {
                    segment,
                    items,
                    unreadable,
                    next: resume_after,
                    consumed,
                })
                .await?;
                if next.is_none() {
                    return anyhow::Ok(());
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tasks.abort_all();
                return Err(e);
            }
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => {}
        }
    }
    Ok(())
}

/// Segments for a table: about one per 500 MB, at least `min`, at most 1,000
/// (DynamoDB's guidance is one segment per 2 GB for large tables; smaller
/// segments keep every worker busy on the 1–100 GB tables rekey mostly sees).
pub fn default_segments(table_bytes: u64, min: u32) -> u32 {
    let by_size = (table_bytes / (500 * 1024 * 1024)) as u32 + 1;
    by_size.clamp(min.max(1), 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_grow_with_size_within_bounds() {
        assert_eq!(default_segments(0, 4), 4);
        assert_eq!(default_segments(10 * 1024 * 1024 * 1024, 4), 21);
        assert_eq!(default_segments(u64::MAX / 2, 4), 1000);
    }
}
