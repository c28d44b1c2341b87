//! Parallel segmented Scan under a read budget, streamed page by page.
//!
//! Each segment is a task that reads one page, hands it to the page handler
//! and only then reads the next: memory holds at most one page per segment
//! whatever the table's size. The page
//! carries the key to resume after it, so a consumer that checkpoints a segment
//! only once a page's work is done can restart from exactly there.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, Select};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::aws::rate::Control;
use crate::aws::retry::{backoff, jitter};
use crate::aws::{Clients, from_sdk_item, to_sdk_item};

use crate::aws::AwsError;
use crate::core::value::Item;

/// Consecutive transient failures (5xx, resets) of one read (a Scan page, a
/// Query) before the run stops.
const MAX_TRANSIENT_FAILURES: u32 = 10;

/// A read call (Scan, Query) that failed: Ok when it is to be made again
/// (the read budget slowed for a throttle, or after a backoff for the
/// `failures`-th transient failure in a row), the error when not.
pub(super) async fn retry_read(
    control: &Control,
    e: AwsError,
    action: &'static str,
    table: &str,
    failures: &mut u32,
) -> anyhow::Result<()> {
    if e.is_throttle() {
        // The read side adapts too: a throttled read slows every reader.
        control.read_throttled(&e).await;
        return Ok(());
    }
    if e.is_transient() && *failures < MAX_TRANSIENT_FAILURES {
        *failures += 1;
        tracing::info!(action, table, failures = *failures, error = %e, "retrying");
        tokio::time::sleep(backoff(*failures, jitter())).await;
        return Ok(());
    }
    Err(anyhow::Error::new(e))
}

/// A read page's items in rekey's types (those of types rekey cannot read
/// counted), and the key to resume after.
pub(super) struct ReadPage {
    pub items: Vec<Item>,
    pub unreadable: u64,
    pub next: Option<Item>,
}

pub(super) fn read_page(
    raw: Vec<HashMap<String, AttributeValue>>,
    last_evaluated_key: Option<HashMap<String, AttributeValue>>,
    action: &str,
    table: &str,
) -> anyhow::Result<ReadPage> {
    let mut items = Vec::with_capacity(raw.len());
    let mut unreadable = 0;
    for it in raw {
        match from_sdk_item(it) {
            Some(i) => items.push(i),
            None => unreadable += 1,
        }
    }
    let next = match last_evaluated_key.filter(|k| !k.is_empty()) {
        None => None,
        Some(k) => Some(from_sdk_item(k).ok_or_else(|| {
            anyhow::anyhow!("{action} of `{table}` returned a resume key of unknown types")
        })?),
    };
    Ok(ReadPage {
        items,
        unreadable,
        next,
    })
}

/// A segment's resume point: the primary key of the last item it read.
pub type StartKey = Item;

#[derive(Debug, Clone)]
pub struct ScanOptions {
    pub table: String,
    pub segments: u32,
    /// Items per page (None: DynamoDB's 1 MB pages).
    pub page_limit: Option<i32>,
    pub consistent_read: bool,
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
    /// Where this page was read from (None: the segment's beginning): a
    /// stop in the middle of the page resumes there.
    pub from: Option<StartKey>,
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
/// segment (empty means all from the beginning). Once `stop` is cancelled
/// no segment reads another page (pages in flight finish); a parameter, as
/// each caller's stop is its own (a signal, a consumer that has enough).
pub async fn scan<F, Fut>(
    clients: &Clients,
    opts: &ScanOptions,
    starts: Vec<SegmentStart>,
    control: Arc<Control>,
    stop: &CancellationToken,
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
        let mut from = match start {
            SegmentStart::Done => continue,
            SegmentStart::Beginning => None,
            SegmentStart::After(k) => Some(k),
        };
        let mut next = from.as_ref().map(to_sdk_item);
        let (clients, opts, control, stop, on_page) = (
            clients.clone(),
            opts.clone(),
            control.clone(),
            stop.clone(),
            on_page.clone(),
        );
        let segment = async move {
            let mut failures = 0;
            loop {
                tokio::select! {
                    // A stop wins over a read budget that is also ready: no page after it.
                    biased;
                    () = stop.cancelled() => return anyhow::Ok(()),
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
                    Err(e) => {
                        retry_read(&control, e, "Scan", &opts.table, &mut failures).await?;
                        continue;
                    }
                };
                let consumed = out
                    .consumed_capacity()
                    .and_then(|c| c.capacity_units())
                    .unwrap_or(0.0);
                control.read.spend(consumed).await;
                let page = read_page(
                    out.items.unwrap_or_default(),
                    out.last_evaluated_key,
                    "Scan",
                    &opts.table,
                )?;
                next = page.next.as_ref().map(to_sdk_item);
                let read_from = std::mem::replace(&mut from, page.next.clone());
                on_page(Page {
                    segment,
                    from: read_from,
                    items: page.items,
                    unreadable: page.unreadable,
                    next: page.next,
                    consumed,
                })
                .await?;
                if next.is_none() {
                    return anyhow::Ok(());
                }
            }
        };
        // In the caller's span: the log names the phase its requests belong to.
        tasks.spawn(segment.in_current_span());
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
