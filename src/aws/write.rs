//! Writing items: BatchWriteItem, 25 at a time, until every item is written.
//!
//! DynamoDB answers a busy batch with the writes it did not do
//! (UnprocessedItems) instead of an error; a writer that ignores them loses
//! data silently. Here they are retried with backoff and jitter, and count as
//! a throttle for the adaptive rate: the table's, or — when a [`Pace`] (the
//! backfill's writer) blames them on the refused items' own partition keys —
//! those keys' rates. A pace may also send a batch in parts, as its keys'
//! rates allow, so that a slow key never holds back the rest. Throttling
//! errors come back from the SDK at once, not after its own retries
//! ([`ThrottlesToCaller`]). Throttling errors, transient
//! failures and validation errors are told apart: a throttle slows the run
//! (never gives up), a transient failure is retried a bounded number of times,
//! and a validation error — one bad item fails the whole batch — is narrowed
//! down by writing the batch's items one by one, so only the bad item is
//! rejected.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, ReturnConsumedCapacity, WriteRequest};

use crate::aws::rate::Control;
pub use crate::aws::rate::keys::Blame;
use crate::aws::retry::{ThrottlesToCaller, backoff, jitter};
use crate::aws::{AwsError, Clients, to_sdk, to_sdk_item};
use crate::core::value::{Item, Value, item_size, write_units};

pub const BATCH: usize = 25;

/// What happened to a batch: capacity consumed, and for each item `None`
/// (written) or the reason DynamoDB refused it.
#[derive(Debug, Default)]
pub struct BatchResult {
    pub consumed: f64,
    pub refused: Vec<Option<String>>,
}

fn requests(items: &[Item], pending: &[usize]) -> Vec<WriteRequest> {
    pending
        .iter()
        .filter_map(|&i| {
            PutRequest::builder()
                .set_item(Some(to_sdk_item(&items[i])))
                .build()
                .ok()
        })
        .map(|p| WriteRequest::builder().put_request(p).build())
        .collect()
}

/// What paces a batch's items beyond the table's budget, and whose limit
/// their throttles hit: the backfill's writer paces and adapts per
/// partition key ([`crate::aws::rate::keys::KeyRates`]).
pub trait Pace: Sync {
    /// Of the batch's items at `pending` (indices), those that may be sent
    /// now (at least one: waits until then). The others wait for a later
    /// request, so that a slow key never holds back the rest.
    fn ready(&self, pending: &[usize]) -> impl Future<Output = Vec<usize>> + Send;
    /// DynamoDB's answer to an attempt: the items it wrote and those it
    /// throttled, with its ThrottlingReasons (empty for UnprocessedItems).
    /// `Blame::Keys`: the refused items' own keys were over their limits
    /// (and are slowed), so the table's rate need not come down.
    fn answered(&self, written: &[usize], throttled: &[usize], reasons: &[String]) -> Blame;
}

/// No pacing beyond the table's budget: every throttle is the table's.
pub struct NoPace;

impl Pace for NoPace {
    async fn ready(&self, pending: &[usize]) -> Vec<usize> {
        pending.to_vec()
    }
    fn answered(&self, _: &[usize], _: &[usize], _: &[String]) -> Blame {
        Blame::Table
    }
}

/// What DynamoDB's ThrottlingReasons say: `Keys` when every reason is a key
/// range's, `Table` when one is anything else, None when there are none.
pub fn blame_of(reasons: &[String]) -> Option<Blame> {
    if reasons.is_empty() {
        None
    } else if reasons.iter().all(|r| r.contains("KeyRange")) {
        Some(Blame::Keys)
    } else {
        Some(Blame::Table)
    }
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
    write_batch_paced(clients, table, items, control, max_retries, &NoPace).await
}

/// How one BatchWriteItem call went.
enum Attempt {
    /// Everything sent was written.
    Written,
    /// Some or all of it was refused by a throttle: these (indices).
    Throttled(AwsError, Vec<usize>),
    Failed(AwsError),
}

/// [`write_batch`], each attempt's items chosen by `pace` too, and each
/// throttle blamed on the table or the items' keys as `pace` says.
pub async fn write_batch_paced(
    clients: &Clients,
    table: &str,
    items: &[Item],
    control: &Control,
    max_retries: u32,
    pace: &impl Pace,
) -> Result<BatchResult, AwsError> {
    debug_assert!(items.len() <= BATCH);
    let mut result = BatchResult {
        consumed: 0.0,
        refused: vec![None; items.len()],
    };
    let units: Vec<f64> = items
        .iter()
        .map(|i| write_units(item_size(i)) as f64)
        .collect();
    // The items not written yet: all of them, less what each call wrote.
    let mut pending: Vec<usize> = (0..items.len()).collect();
    let (mut attempt, mut failures) = (0, 0);
    while !pending.is_empty() {
        let sending = pace.ready(&pending).await;
        let estimate: f64 = sending.iter().map(|&i| units[i]).sum();
        let (e, refused) = match send(clients, table, items, &sending, estimate, control).await {
            (used, Attempt::Written) => {
                result.consumed += used;
                pace.answered(&sending, &[], &[]);
                pending.retain(|i| !sending.contains(i));
                continue;
            }
            (used, Attempt::Throttled(e, refused)) => {
                result.consumed += used;
                (e, refused)
            }
            (_, Attempt::Failed(AwsError::Service { code, .. }))
                if code == "ValidationException" =>
            {
                return isolate(
                    clients,
                    table,
                    items,
                    &pending,
                    control,
                    max_retries,
                    result,
                )
                .await;
            }
            (_, Attempt::Failed(e)) if e.is_transient() && failures < max_retries => {
                failures += 1;
                tokio::time::sleep(backoff(failures, jitter())).await;
                continue;
            }
            (_, Attempt::Failed(e)) => return Err(e),
        };
        let reasons = match &e {
            AwsError::Throttled { reasons, .. } => reasons.as_slice(),
            _ => &[],
        };
        let written: Vec<usize> = sending
            .iter()
            .copied()
            .filter(|i| !refused.contains(i))
            .collect();
        pending.retain(|i| !written.contains(i));
        match pace.answered(&written, &refused, reasons) {
            Blame::Keys => control.write_key_throttled(&e, attempt).await,
            Blame::Table => control.write_throttled(&e, attempt).await,
        }
        attempt = (attempt + 1).min(6);
    }
    Ok(result)
}

/// One BatchWriteItem call of the items at `sending`, `estimate` units
/// taken from the budget before and settled after; the units consumed.
async fn send(
    clients: &Clients,
    table: &str,
    items: &[Item],
    sending: &[usize],
    estimate: f64,
    control: &Control,
) -> (f64, Attempt) {
    let in_flight = control.acquire_write(estimate).await;
    let res = clients
        .dynamodb
        .batch_write_item()
        .set_request_items(Some(HashMap::from([(
            table.to_string(),
            requests(items, sending),
        )])))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .customize()
        .config_override(
            aws_sdk_dynamodb::config::Builder::default().retry_classifier(ThrottlesToCaller),
        )
        .send()
        .await;
    let out = match res {
        Ok(out) => out,
        Err(e) => {
            // A refused or failed call consumed nothing: give the estimate back.
            in_flight.settle(0.0).await;
            return match clients.error("BatchWriteItem", table, e) {
                e @ AwsError::Throttled { .. } => (0.0, Attempt::Throttled(e, sending.to_vec())),
                e => (0.0, Attempt::Failed(e)),
            };
        }
    };
    let used = out
        .consumed_capacity()
        .iter()
        .filter_map(|c| c.capacity_units())
        .sum::<f64>();
    in_flight.settle(used).await;
    let rest = out
        .unprocessed_items
        .and_then(|mut m| m.remove(table))
        .unwrap_or_default();
    if rest.is_empty() {
        return (used, Attempt::Written);
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
    (
        used,
        Attempt::Throttled(e, unprocessed(items, sending, &rest)),
    )
}

/// The indices (among `pending`) of the items DynamoDB left unprocessed. It
/// answers with the requests as sent, usually in order; a request that
/// matches none (never seen) leaves every pending item to write again —
/// a repeated put of the same image is harmless.
fn unprocessed(items: &[Item], pending: &[usize], rest: &[WriteRequest]) -> Vec<usize> {
    let mut out = Vec::with_capacity(rest.len());
    let mut from = 0;
    for r in rest {
        let Some(put) = r.put_request() else {
            return pending.to_vec();
        };
        let n = pending.len();
        let found = (0..n)
            .map(|k| (from + k) % n)
            .find(|&k| same_item(put.item(), &items[pending[k]]));
        match found {
            Some(k) => {
                out.push(pending[k]);
                from = k + 1;
            }
            None => return pending.to_vec(),
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether an SDK item is `item`.
fn same_item(sdk: &HashMap<String, AttributeValue>, item: &Item) -> bool {
    sdk.len() == item.len()
        && item.iter().all(|(k, v)| {
            sdk.get(k).is_some_and(|a| match (a, v) {
                (AttributeValue::S(a), Value::S(b)) | (AttributeValue::N(a), Value::N(b)) => a == b,
                (AttributeValue::S(_) | AttributeValue::N(_), _) => false,
                (a, v) => *a == to_sdk(v),
            })
        })
}

/// A batch failed validation: find the item(s) at fault by writing each of
/// those at `pending` alone.
async fn isolate(
    clients: &Clients,
    table: &str,
    items: &[Item],
    pending: &[usize],
    control: &Control,
    max_retries: u32,
    mut result: BatchResult,
) -> Result<BatchResult, AwsError> {
    for &i in pending {
        let item = &items[i];
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

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pk: &str, sk: u32) -> Item {
        Item::from([
            ("PK".to_string(), Value::S(pk.into())),
            ("SK".to_string(), Value::N(sk.to_string())),
            ("tags".to_string(), Value::Ss(vec!["a".into(), "b".into()])),
        ])
    }

    fn put(i: &Item) -> WriteRequest {
        let p = PutRequest::builder()
            .set_item(Some(to_sdk_item(i)))
            .build()
            .unwrap();
        WriteRequest::builder().put_request(p).build()
    }

    #[test]
    fn unprocessed_items_are_found_among_those_sent_in_any_order() {
        let items: Vec<Item> = (0..6)
            .map(|i| item(if i % 2 == 0 { "a" } else { "b" }, i))
            .collect();
        let sent = [1, 2, 4, 5];
        assert_eq!(
            unprocessed(&items, &sent, &[put(&items[5]), put(&items[2])]),
            [2, 5]
        );
        assert_eq!(unprocessed(&items, &sent, &[]), Vec::<usize>::new());
        // One DynamoDB never saw: write everything sent again, rather than lose it.
        assert_eq!(unprocessed(&items, &sent, &[put(&items[0])]), sent);
        assert!(!same_item(&to_sdk_item(&items[1]), &items[3]));
    }

    #[test]
    fn throttling_reasons_name_keys_or_the_table() {
        let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(blame_of(&[]), None);
        assert_eq!(
            blame_of(&r(&["TableWriteKeyRangeThroughputExceeded"])),
            Some(Blame::Keys)
        );
        assert_eq!(
            blame_of(&r(&[
                "TableWriteKeyRangeThroughputExceeded",
                "TableWriteProvisionedThroughputExceeded"
            ])),
            Some(Blame::Table)
        );
    }
}
