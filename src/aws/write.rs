//! Writing items: BatchWriteItem, 25 at a time, until every item is written.
//!
//! DynamoDB answers a busy batch with the writes it did not do
//! (UnprocessedItems) instead of an error; a writer that ignores them loses
//! data silently. Here they are retried with exponential backoff and jitter,
//! and count as a throttle for the adaptive rate; throttling errors come back
//! from the SDK at once, not after its own retries ([`ThrottlesToCaller`]).
//! Throttling errors, transient
//! failures and validation errors are told apart: a throttle slows the run
//! (never gives up), a transient failure is retried a bounded number of times,
//! and a validation error — one bad item fails the whole batch — is narrowed
//! down by writing the batch's items one by one, so only the bad item is
//! rejected.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{PutRequest, ReturnConsumedCapacity, WriteRequest};

use crate::aws::rate::Control;
use crate::aws::retry::{ThrottlesToCaller, backoff, jitter};
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

fn requests(items: &[Item]) -> Vec<WriteRequest> {
    items
        .iter()
        .filter_map(|i| {
            PutRequest::builder()
                .set_item(Some(to_sdk_item(i)))
                .build()
                .ok()
        })
        .map(|p| WriteRequest::builder().put_request(p).build())
        .collect()
}

/// Write up to 25 items (distinct keys) under `control`, retrying
/// UnprocessedItems, throttles and up to `max_retries` transient failures.
pub async fn write_batch(
    clients: &Clients,
    table: &str,
    items: &[Item],
    control: &Control,
    max_retries: u32,
) -> Result<BatchResult, AwsError> {
    debug_assert!(items.len() <= BATCH);
    let mut result = BatchResult {
        consumed: 0.0,
        refused: vec![None; items.len()],
    };
    if items.is_empty() {
        return Ok(result);
    }
    let units: f64 = items.iter().map(|i| write_units(item_size(i)) as f64).sum();
    // None: every item, built from `items` for each attempt (no copy kept on
    // the common path, where one call writes them all); Some: the part
    // DynamoDB left unprocessed, copied for each retry.
    let mut unprocessed: Option<Vec<WriteRequest>> = None;
    let mut attempt = 0;
    let mut failures = 0;
    loop {
        let request = match &unprocessed {
            None => requests(items),
            Some(rest) => rest.clone(),
        };
        // The cost is known before the call: take it up front, correct it after.
        let estimate = units * request.len() as f64 / items.len().max(1) as f64;
        let in_flight = control.acquire_write(estimate).await;
        let res = clients
            .dynamodb
            .batch_write_item()
            .set_request_items(Some(HashMap::from([(table.to_string(), request)])))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .customize()
            .config_override(
                aws_sdk_dynamodb::config::Builder::default().retry_classifier(ThrottlesToCaller),
            )
            .send()
            .await;
        match res {
            Ok(out) => {
                let used = out
                    .consumed_capacity()
                    .iter()
                    .filter_map(|c| c.capacity_units())
                    .sum::<f64>();
                in_flight.settle(used).await;
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
                    in_flight.settle(0.0).await;
                    control.write_throttled(&e, attempt).await;
                    attempt = (attempt + 1).min(6);
                }
                AwsError::Service { code, .. } if code == "ValidationException" => {
                    return isolate(clients, table, items, control, max_retries, result).await;
                }
                e if e.is_transient() && failures < max_retries => {
                    in_flight.settle(0.0).await;
                    failures += 1;
                    tokio::time::sleep(backoff(failures, jitter())).await;
                }
                e => return Err(e),
            },
        }
    }
    Ok(result)
}

/// A batch failed validation: find the item(s) at fault by writing each alone.
async fn isolate(
    clients: &Clients,
    table: &str,
    items: &[Item],
    control: &Control,
    max_retries: u32,
    mut result: BatchResult,
) -> Result<BatchResult, AwsError> {
    for (i, item) in items.iter().enumerate() {
        let mut attempt = 0;
        let mut failures = 0;
        loop {
            let _in_flight = control.wait_write().await;
            let res = clients
                .dynamodb
                .put_item()
                .table_name(table)
                .set_item(Some(to_sdk_item(item)))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            match res {
                Ok(out) => {
                    let used = out
                        .consumed_capacity()
                        .and_then(|c| c.capacity_units())
                        .unwrap_or(1.0);
                    control.write.spend(used).await;
                    result.consumed += used;
                    break;
                }
                Err(e) => match clients.error("PutItem", table, e) {
                    e @ AwsError::Throttled { .. } => {
                        control.write_throttled(&e, attempt).await;
                        attempt = (attempt + 1).min(6);
                    }
                    AwsError::Service { code, detail, .. } if code == "ValidationException" => {
                        result.refused[i] = Some(format!("DynamoDB refused the item: {detail}"));
                        break;
                    }
                    e if e.is_transient() && failures < max_retries => {
                        failures += 1;
                        tokio::time::sleep(backoff(failures, jitter())).await;
                    }
                    e => return Err(e),
                },
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
