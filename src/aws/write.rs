//! Writing items: BatchWriteItem, 25 at a time, until every item is written
//! (puts for the backfill; puts and deletes for the tail).
//!
//! DynamoDB answers a busy batch with the writes it did not do
//! (UnprocessedItems) instead of an error; a writer that ignores them loses
//! data silently. Here they are retried with exponential backoff and jitter,
//! and count as a throttle for the adaptive rate. Throttling errors, transient
//! failures and validation errors are told apart: a throttle slows the run
//! (never gives up), a transient failure is retried a bounded number of times,
//! and a validation error — one bad item fails the whole batch — is narrowed
//! down by writing the batch's requests one by one (PutItem, DeleteItem), so
//! only the bad one is refused.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{DeleteRequest, PutRequest, ReturnConsumedCapacity, WriteRequest};

use crate::aws::rate::Control;
use crate::aws::retry::{backoff, jitter};
use crate::aws::{AwsError, Clients, to_sdk_item};
use crate::core::value::{Item, item_size, write_units};

pub const BATCH: usize = 25;

/// What happened to a batch: capacity consumed, and for each item `None`
/// (written) or the reason DynamoDB refused it.
#[derive(Debug, Default)]
pub struct BatchResult {
    pub consumed: f64,
    pub refused: Vec<Option<String>>,
}

/// One request of a BatchWriteItem: put a whole item, or delete by key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Write<'a> {
    Put(&'a Item),
    /// The key attributes of the item to delete.
    Delete(&'a Item),
}

impl Write<'_> {
    /// The capacity it is expected to use: a put by its size; a delete by the
    /// size of the item it deletes, unknown here, so one unit (corrected by
    /// the ConsumedCapacity returned).
    fn units(&self) -> f64 {
        match self {
            Write::Put(i) => write_units(item_size(i)) as f64,
            Write::Delete(_) => 1.0,
        }
    }

    fn request(&self) -> Option<WriteRequest> {
        Some(match self {
            Write::Put(i) => WriteRequest::builder()
                .put_request(
                    PutRequest::builder()
                        .set_item(Some(to_sdk_item(i)))
                        .build()
                        .ok()?,
                )
                .build(),
            Write::Delete(k) => WriteRequest::builder()
                .delete_request(
                    DeleteRequest::builder()
                        .set_key(Some(to_sdk_item(k)))
                        .build()
                        .ok()?,
                )
                .build(),
        })
    }
}

fn requests(writes: &[Write<'_>]) -> Vec<WriteRequest> {
    writes.iter().filter_map(Write::request).collect()
}

/// Put up to 25 items (distinct keys) under `control`, retrying
/// UnprocessedItems, throttles and up to `max_retries` transient failures.
pub async fn write_batch(
    clients: &Clients,
    table: &str,
    items: &[Item],
    control: &Control,
    max_retries: u32,
) -> Result<BatchResult, AwsError> {
    let writes: Vec<Write<'_>> = items.iter().map(Write::Put).collect();
    write_requests(clients, table, &writes, control, max_retries).await
}

/// Up to 25 puts and deletes, each of a different key (DynamoDB refuses a
/// batch that names a key twice, and applies a batch's requests in no
/// order), written as [`write_batch`] writes puts; `refused` is per request.
pub async fn write_requests(
    clients: &Clients,
    table: &str,
    writes: &[Write<'_>],
    control: &Control,
    max_retries: u32,
) -> Result<BatchResult, AwsError> {
    debug_assert!(writes.len() <= BATCH);
    let mut result = BatchResult {
        consumed: 0.0,
        refused: vec![None; writes.len()],
    };
    if writes.is_empty() {
        return Ok(result);
    }
    let units: f64 = writes.iter().map(Write::units).sum();
    // None: every request, built from `writes` for each attempt (no copy kept
    // on the common path, where one call writes them all); Some: the part
    // DynamoDB left unprocessed, copied for each retry.
    let mut unprocessed: Option<Vec<WriteRequest>> = None;
    let mut attempt = 0;
    let mut failures = 0;
    loop {
        let request = match &unprocessed {
            None => requests(writes),
            Some(rest) => rest.clone(),
        };
        // The cost is known before the call: take it up front, correct it after.
        let estimate = units * request.len() as f64 / writes.len().max(1) as f64;
        let _in_flight = control.acquire_write(estimate).await;
        let res = clients
            .dynamodb
            .batch_write_item()
            .set_request_items(Some(HashMap::from([(table.to_string(), request)])))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match res {
            Ok(out) => {
                let used = out
                    .consumed_capacity()
                    .iter()
                    .filter_map(|c| c.capacity_units())
                    .sum::<f64>();
                control.write.spend(used - estimate).await;
                result.consumed += used;
                let rest = out
                    .unprocessed_items
                    .and_then(|mut m| m.remove(table))
                    .unwrap_or_default();
                if rest.is_empty() {
                    break;
                }
                // Unprocessed items are DynamoDB's quiet way of throttling.
                let e = AwsError::Throttled {
                    action: "BatchWriteItem",
                    resource: table.into(),
                    code: "UnprocessedItems".into(),
                    detail: format!("{} items unprocessed", rest.len()),
                    reasons: Vec::new(),
                    endpoint: clients.endpoints.dynamodb.clone(),
                };
                unprocessed = Some(rest);
                control.write_throttled(&e, attempt).await;
                attempt = (attempt + 1).min(6);
            }
            Err(e) => match clients.error("BatchWriteItem", table, e) {
                // A refused call consumed nothing: give the estimate back.
                e @ AwsError::Throttled { .. } => {
                    control.write.spend(-estimate).await;
                    control.write_throttled(&e, attempt).await;
                    attempt = (attempt + 1).min(6);
                }
                AwsError::Service { code, .. } if code == "ValidationException" => {
                    return isolate(clients, table, writes, control, max_retries, result).await;
                }
                e if e.is_transient() && failures < max_retries => {
                    control.write.spend(-estimate).await;
                    failures += 1;
                    tracing::info!(action = "BatchWriteItem", table, failures, error = %e, "retrying");
                    tokio::time::sleep(backoff(failures, jitter())).await;
                }
                e => return Err(e),
            },
        }
    }
    Ok(result)
}

/// A batch failed validation: find the request(s) at fault by sending each
/// alone (PutItem or DeleteItem).
async fn isolate(
    clients: &Clients,
    table: &str,
    writes: &[Write<'_>],
    control: &Control,
    max_retries: u32,
    mut result: BatchResult,
) -> Result<BatchResult, AwsError> {
    for (i, write) in writes.iter().enumerate() {
        let mut attempt = 0;
        let mut failures = 0;
        loop {
            let _in_flight = control.wait_write().await;
            let res = match write {
                Write::Put(item) => clients
                    .dynamodb
                    .put_item()
                    .table_name(table)
                    .set_item(Some(to_sdk_item(item)))
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .map(|o| o.consumed_capacity().and_then(|c| c.capacity_units()))
                    .map_err(|e| clients.error("PutItem", table, e)),
                Write::Delete(key) => clients
                    .dynamodb
                    .delete_item()
                    .table_name(table)
                    .set_key(Some(to_sdk_item(key)))
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .map(|o| o.consumed_capacity().and_then(|c| c.capacity_units()))
                    .map_err(|e| clients.error("DeleteItem", table, e)),
            };
            match res {
                Ok(used) => {
                    let used = used.unwrap_or(1.0);
                    control.write.spend(used).await;
                    result.consumed += used;
                    break;
                }
                Err(e @ AwsError::Throttled { .. }) => {
                    control.write_throttled(&e, attempt).await;
                    attempt = (attempt + 1).min(6);
                }
                Err(AwsError::Service { code, detail, .. }) if code == "ValidationException" => {
                    let what = match write {
                        Write::Put(_) => "the item",
                        Write::Delete(_) => "the delete",
                    };
                    result.refused[i] = Some(format!("DynamoDB refused {what}: {detail}"));
                    break;
                }
                Err(e) if e.is_transient() && failures < max_retries => {
                    failures += 1;
                    tracing::info!(action = "BatchWriteItem", table, failures, error = %e, "retrying one write");
                    tokio::time::sleep(backoff(failures, jitter())).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(result)
}

/// Put any number of items, `concurrency` batches in flight, no rate limit.
/// For loading test and demo tables.
pub async fn put_all(
    clients: &Clients,
    table: &str,
    items: &[Item],
    concurrency: usize,
) -> Result<f64, AwsError> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let control = Control::new(None, None);
    stream::iter(items.chunks(BATCH))
        .map(|chunk| write_batch(clients, table, chunk, &control, 10))
        .buffer_unordered(concurrency.max(1))
        .try_fold(0.0, |acc, r| async move {
            if let Some(reason) = r.refused.iter().flatten().next() {
                return Err(AwsError::Other {
                    action: "BatchWriteItem",
                    resource: table.into(),
                    detail: reason.clone(),
                    endpoint: clients.endpoints.dynamodb.clone(),
                });
            }
            Ok(acc + r.consumed)
        })
        .await
}
