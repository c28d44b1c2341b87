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

use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, PutRequest, ReturnConsumedCapacity, WriteRequest,
};

use crate::aws::rate::Control;
pub(crate) use crate::aws::rate::keys::Blame;
use crate::aws::retry::{ThrottlesToCaller, backoff, jitter};
use crate::aws::{AwsError, Clients, to_sdk, to_sdk_item};
use crate::core::value::{Item, Value, item_size, write_units};

pub(crate) const BATCH: usize = 25;

/// What happened to a batch: capacity consumed, and for each item `None`
/// (written) or the reason DynamoDB refused it.
#[derive(Debug, Default)]
pub(crate) struct BatchResult {
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

fn requests(writes: &[Write<'_>], pending: &[usize]) -> Vec<WriteRequest> {
    pending
        .iter()
        .filter_map(|&i| writes[i].request())
        .collect()
}

/// What paces a batch's items beyond the table's budget, and whose limit
/// their throttles hit: the backfill's writer paces and adapts per
/// partition key ([`crate::aws::rate::keys::KeyRates`]).
pub(crate) trait Pace: Sync {
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
pub(crate) struct NoPace;

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
pub(crate) fn blame_of(reasons: &[String]) -> Option<Blame> {
    if reasons.is_empty() {
        None
    } else if reasons.iter().all(|r| r.contains("KeyRange")) {
        Some(Blame::Keys)
    } else {
        Some(Blame::Table)
    }
}

/// Put up to 25 items (distinct keys) under `control`, retrying
/// UnprocessedItems, throttles and up to `max_retries` transient failures.
pub(crate) async fn write_batch(
    clients: &Clients,
    table: &str,
    items: &[Item],
    control: &Control,
    max_retries: u32,
) -> Result<BatchResult, AwsError> {
    write_batch_paced(clients, table, items, control, max_retries, &NoPace).await
}

/// [`write_batch`], each attempt's items chosen by `pace` too, and each
/// throttle blamed on the table or the items' keys as `pace` says.
pub(crate) async fn write_batch_paced(
    clients: &Clients,
    table: &str,
    items: &[impl std::borrow::Borrow<Item>],
    control: &Control,
    max_retries: u32,
    pace: &impl Pace,
) -> Result<BatchResult, AwsError> {
    let writes: Vec<Write<'_>> = items.iter().map(|i| Write::Put(i.borrow())).collect();
    write_requests_paced(clients, table, &writes, control, max_retries, pace).await
}

/// Up to 25 puts and deletes, each of a different key (DynamoDB refuses a
/// batch that names a key twice, and applies a batch's requests in no
/// order), written as [`write_batch`] writes puts; `refused` is per request.
pub(crate) async fn write_requests(
    clients: &Clients,
    table: &str,
    writes: &[Write<'_>],
    control: &Control,
    max_retries: u32,
) -> Result<BatchResult, AwsError> {
    write_requests_paced(clients, table, writes, control, max_retries, &NoPace).await
}

/// How one BatchWriteItem call went.
enum Attempt {
    /// Everything sent was written.
    Written,
    /// Some or all of it was refused by a throttle: these (indices).
    Throttled(AwsError, Vec<usize>),
    Failed(AwsError),
}

/// [`write_requests`], paced and blamed as `pace` says.
async fn write_requests_paced(
    clients: &Clients,
    table: &str,
    writes: &[Write<'_>],
    control: &Control,
    max_retries: u32,
    pace: &impl Pace,
) -> Result<BatchResult, AwsError> {
    debug_assert!(writes.len() <= BATCH);
    let mut result = BatchResult {
        consumed: 0.0,
        refused: vec![None; writes.len()],
    };
    let units: Vec<f64> = writes.iter().map(Write::units).collect();
    // The requests not done yet: all of them, less what each call wrote.
    let mut pending: Vec<usize> = (0..writes.len()).collect();
    let (mut attempt, mut failures) = (0, 0);
    while !pending.is_empty() {
        let sending = pace.ready(&pending).await;
        let estimate: f64 = sending.iter().map(|&i| units[i]).sum();
        let (e, refused) = match send(clients, table, writes, &sending, estimate, control).await {
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
                let alone = Alone {
                    clients,
                    table,
                    control,
                    max_retries,
                };
                return alone.isolate(writes, &pending, result).await;
            }
            (_, Attempt::Failed(e)) if e.is_transient() && failures < max_retries => {
                failures += 1;
                tracing::info!(action = "BatchWriteItem", table, failures, error = %e, "retrying");
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

/// One BatchWriteItem call of the requests at `sending`, `estimate` units
/// taken from the budget before and settled after; the units consumed.
async fn send(
    clients: &Clients,
    table: &str,
    writes: &[Write<'_>],
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
            requests(writes, sending),
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
        Attempt::Throttled(e, unprocessed(writes, sending, &rest)),
    )
}

/// The indices (among `pending`) of the requests DynamoDB left unprocessed.
/// It answers with the requests as sent, usually in order; a request that
/// matches none (never seen) leaves every pending request to send again —
/// a repeated put of the same image, or delete of the same key, is harmless.
fn unprocessed(writes: &[Write<'_>], pending: &[usize], rest: &[WriteRequest]) -> Vec<usize> {
    let mut out = Vec::with_capacity(rest.len());
    let mut from = 0;
    for r in rest {
        let n = pending.len();
        let found = (0..n)
            .map(|k| (from + k) % n)
            .find(|&k| is_request(r, &writes[pending[k]]));
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

/// Whether DynamoDB's unprocessed request `r` is `write`.
fn is_request(r: &WriteRequest, write: &Write<'_>) -> bool {
    match (write, r.put_request(), r.delete_request()) {
        (Write::Put(item), Some(put), _) => same_item(put.item(), item),
        (Write::Delete(key), _, Some(del)) => same_item(del.key(), key),
        _ => false,
    }
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

/// Where a batch that failed validation is narrowed down: each request
/// alone (PutItem or DeleteItem), so only the one at fault is refused.
struct Alone<'a> {
    clients: &'a Clients,
    table: &'a str,
    control: &'a Control,
    max_retries: u32,
}

impl Alone<'_> {
    async fn isolate(
        &self,
        writes: &[Write<'_>],
        pending: &[usize],
        mut result: BatchResult,
    ) -> Result<BatchResult, AwsError> {
        for &i in pending {
            match self.write_one(&writes[i]).await? {
                Ok(used) => result.consumed += used,
                Err(reason) => result.refused[i] = Some(reason),
            }
        }
        Ok(result)
    }

    /// One request until done: the units it used, or why DynamoDB refused it.
    async fn write_one(&self, write: &Write<'_>) -> Result<Result<f64, String>, AwsError> {
        let (clients, table, control) = (self.clients, self.table, self.control);
        let (mut attempt, mut failures) = (0, 0);
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
                    return Ok(Ok(used));
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
                    return Ok(Err(format!("DynamoDB refused {what}: {detail}")));
                }
                Err(e) if e.is_transient() && failures < self.max_retries => {
                    failures += 1;
                    tracing::info!(action = "BatchWriteItem", table, failures, error = %e, "retrying one write");
                    tokio::time::sleep(backoff(failures, jitter())).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
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
        Write::Put(i).request().unwrap()
    }

    fn delete(k: &Item) -> WriteRequest {
        Write::Delete(k).request().unwrap()
    }

    #[test]
    fn unprocessed_requests_are_found_among_those_sent_in_any_order() {
        let items: Vec<Item> = (0..6)
            .map(|i| item(if i % 2 == 0 { "a" } else { "b" }, i))
            .collect();
        // Even requests are puts, odd ones deletes of the same shape.
        let writes: Vec<Write<'_>> = items
            .iter()
            .enumerate()
            .map(|(i, it)| {
                if i % 2 == 0 {
                    Write::Put(it)
                } else {
                    Write::Delete(it)
                }
            })
            .collect();
        let sent = [1, 2, 4, 5];
        assert_eq!(
            unprocessed(&writes, &sent, &[delete(&items[5]), put(&items[2])]),
            [2, 5]
        );
        assert_eq!(unprocessed(&writes, &sent, &[]), Vec::<usize>::new());
        // One DynamoDB never saw: write everything sent again, rather than lose it.
        assert_eq!(unprocessed(&writes, &sent, &[put(&items[0])]), sent);
        // A put is not a delete of the same attributes.
        assert_eq!(unprocessed(&writes, &sent, &[put(&items[5])]), sent);
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
