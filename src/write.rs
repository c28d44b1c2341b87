//! Writing items: BatchWriteItem, 25 at a time, with UnprocessedItems retried.
//!
//! DynamoDB answers a batch with the writes it did not do (UnprocessedItems)
//! instead of an error when a partition is busy; a writer that ignores them
//! loses data silently. Here they are retried with exponential backoff and
//! jitter until done, or until the retry budget says something is wrong.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};

use crate::aws::{AwsError, Clients, to_sdk_item};
use crate::value::Item;

pub const BATCH: usize = 25;

/// Backoff for retry `attempt` (0-based): exponential from 50 ms, capped at
/// 5 s, with full jitter so that parallel writers do not retry in lockstep.
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let base = 0.05 * 2f64.powi(attempt.min(16) as i32);
    Duration::from_secs_f64(base.min(5.0) * jitter.clamp(0.0, 1.0))
}

/// A cheap jitter source; exactness of randomness does not matter here, only
/// that concurrent writers differ.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() % 1_000_000) as f64 / 1_000_000.0
}

/// Put up to 25 items, retrying UnprocessedItems. Returns consumed WCU.
pub async fn put_batch(clients: &Clients, table: &str, items: &[Item]) -> Result<f64, AwsError> {
    debug_assert!(items.len() <= BATCH);
    let mut pending: Vec<WriteRequest> = items
        .iter()
        .filter_map(|i| {
            PutRequest::builder()
                .set_item(Some(to_sdk_item(i)))
                .build()
                .ok()
        })
        .map(|p| WriteRequest::builder().put_request(p).build())
        .collect();
    let mut consumed = 0.0;
    let mut attempt = 0;
    while !pending.is_empty() {
        let out = clients
            .dynamodb
            .batch_write_item()
            .set_request_items(Some(HashMap::from([(table.to_string(), pending)])))
            .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| clients.error("BatchWriteItem", table, e))?;
        consumed += out
            .consumed_capacity()
            .iter()
            .filter_map(|c| c.capacity_units())
            .sum::<f64>();
        pending = out
            .unprocessed_items
            .and_then(|mut m| m.remove(table))
            .unwrap_or_default();
        if !pending.is_empty() {
            tokio::time::sleep(backoff(attempt, jitter())).await;
            attempt += 1;
        }
    }
    Ok(consumed)
}

/// Put any number of items, `concurrency` batches in flight.
pub async fn put_all(
    clients: &Clients,
    table: &str,
    items: &[Item],
    concurrency: usize,
) -> Result<f64, AwsError> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    stream::iter(items.chunks(BATCH))
        .map(|chunk| put_batch(clients, table, chunk))
        .buffer_unordered(concurrency.max(1))
        .try_fold(0.0, |acc, c| async move { Ok(acc + c) })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0, 1.0), Duration::from_millis(50));
        assert_eq!(backoff(3, 1.0), Duration::from_millis(400));
        assert_eq!(backoff(30, 1.0), Duration::from_secs(5));
        assert_eq!(backoff(3, 0.0), Duration::ZERO);
        let j = jitter();
        assert!((0.0..1.0).contains(&j));
    }
}
