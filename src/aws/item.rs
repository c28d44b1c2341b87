//! Calls on single items — PutItem, DeleteItem, GetItem, a conditional
//! UpdateItem — and BatchGetItem, in rekey's types. The retry policy around
//! them (rate budgets, throttles) is the caller's, except BatchGetItem's
//! UnprocessedKeys, which only this call can see, and the transient failures
//! of the idempotent three (crate::aws::retry::transient); `put_once`, the
//! load test's measured write, is made once.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{KeysAndAttributes, ReturnConsumedCapacity};

use crate::aws::rate::Control;
use crate::aws::retry::{backoff, jitter, single_attempt, transient};
use crate::aws::{AwsError, Clients, from_sdk_item, to_sdk, to_sdk_item};
use crate::core::value::{Item, Value, encode_key};

/// Keys per BatchGetItem call (DynamoDB's maximum).
pub(crate) const GET_BATCH: usize = 100;

/// PutItem, made again on a transient failure (it is idempotent).
pub async fn put_item(clients: &Clients, table: &str, item: &Item) -> Result<(), AwsError> {
    let item = to_sdk_item(item);
    transient(|| async {
        clients
            .dynamodb
            .put_item()
            .table_name(table)
            .set_item(Some(item.clone()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| clients.error("PutItem", table, e))
    })
    .await
}

/// PutItem, made once (`rekey loadtest`'s measured write): a throttle or a
/// transient failure is the caller's to count, never retried. The write
/// units it consumed.
pub(crate) async fn put_once(clients: &Clients, table: &str, item: &Item) -> Result<f64, AwsError> {
    let out = clients
        .dynamodb
        .put_item()
        .table_name(table)
        .set_item(Some(to_sdk_item(item)))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .customize()
        .config_override(single_attempt())
        .send()
        .await
        .map_err(|e| clients.error("PutItem", table, e))?;
    Ok(out
        .consumed_capacity()
        .and_then(|c| c.capacity_units())
        .unwrap_or(0.0))
}

/// DeleteItem, made again on a transient failure (it is idempotent).
pub async fn delete_item(clients: &Clients, table: &str, key: &Item) -> Result<(), AwsError> {
    let key = to_sdk_item(key);
    transient(|| async {
        clients
            .dynamodb
            .delete_item()
            .table_name(table)
            .set_key(Some(key.clone()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| clients.error("DeleteItem", table, e))
    })
    .await
}

/// The item, or None if there is none.
pub async fn get_item(
    clients: &Clients,
    table: &str,
    key: &Item,
    consistent: bool,
) -> Result<Option<Item>, AwsError> {
    let key = to_sdk_item(key);
    transient(|| async {
        clients
            .dynamodb
            .get_item()
            .table_name(table)
            .set_key(Some(key.clone()))
            .consistent_read(consistent)
            .send()
            .await
            .map(|o| o.item.and_then(from_sdk_item))
            .map_err(|e| clients.error("GetItem", table, e))
    })
    .await
}

/// An UpdateItem's expressions, every name and value through a placeholder.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Expressions {
    pub update: String,
    pub condition: String,
    pub names: BTreeMap<String, String>,
    pub values: BTreeMap<String, Value>,
}

/// A conditional UpdateItem: the capacity it consumed, or None when its
/// condition failed (nothing was written).
pub(crate) async fn update_item_if(
    clients: &Clients,
    table: &str,
    key: &Item,
    e: &Expressions,
) -> Result<Option<f64>, AwsError> {
    let mut req = clients
        .dynamodb
        .update_item()
        .table_name(table)
        .set_key(Some(to_sdk_item(key)))
        .update_expression(&e.update)
        .condition_expression(&e.condition)
        .return_consumed_capacity(ReturnConsumedCapacity::Total);
    for (k, v) in &e.names {
        req = req.expression_attribute_names(k, v);
    }
    for (k, v) in &e.values {
        req = req.expression_attribute_values(k, to_sdk(v));
    }
    match req.send().await {
        Ok(out) => Ok(Some(
            out.consumed_capacity()
                .and_then(|c| c.capacity_units())
                .unwrap_or(1.0),
        )),
        Err(err)
            if err
                .as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            Ok(None)
        }
        Err(err) => Err(clients.error("UpdateItem", table, err)),
    }
}

/// Read items by key, 100 per call, retrying UnprocessedKeys with backoff and
/// jitter (a throttle: it lowers `control`'s read rate), throttling errors, and up
/// to `max_retries` transient failures. Returns the items found, by encoded key,
/// and the capacity consumed.
pub async fn batch_get(
    clients: &Clients,
    table: &str,
    key_names: &[&str],
    keys: &[Item],
    consistent: bool,
    control: &Control,
    max_retries: u32,
) -> Result<(HashMap<Vec<u8>, Item>, f64), AwsError> {
    let mut found = HashMap::new();
    let mut consumed = 0.0;
    // BatchGetItem refuses a request with the same key twice.
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&Item> = keys
        .iter()
        .filter(|k| seen.insert(encode_key(k, key_names).unwrap_or_default()))
        .collect();
    for chunk in unique.chunks(GET_BATCH) {
        let mut pending: Vec<_> = chunk.iter().map(|k| to_sdk_item(k)).collect();
        let (mut attempt, mut failures) = (0, 0);
        while !pending.is_empty() {
            control.wait_read().await;
            let ka = KeysAndAttributes::builder()
                .set_keys(Some(pending.clone()))
                .consistent_read(consistent)
                .build()
                .map_err(|e| AwsError::Other {
                    action: "BatchGetItem",
                    resource: table.into(),
                    detail: e.to_string(),
                    endpoint: clients.endpoints.dynamodb.clone(),
                })?;
            let res = clients
                .dynamodb
                .batch_get_item()
                .request_items(table, ka)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            match res {
                Ok(out) => {
                    failures = 0;
                    let used: f64 = out
                        .consumed_capacity()
                        .iter()
                        .filter_map(|c| c.capacity_units())
                        .sum();
                    control.read.spend(used).await;
                    consumed += used;
                    for it in out
                        .responses
                        .and_then(|mut r| r.remove(table))
                        .unwrap_or_default()
                    {
                        if let Some(item) = from_sdk_item(it)
                            && let Some(k) = encode_key(&item, key_names)
                        {
                            found.insert(k, item);
                        }
                    }
                    pending = out
                        .unprocessed_keys
                        .and_then(|mut m| m.remove(table))
                        .map(|ka| ka.keys)
                        .unwrap_or_default();
                    if !pending.is_empty() {
                        let e = AwsError::Throttled {
                            action: "BatchGetItem",
                            resource: table.into(),
                            code: "UnprocessedKeys".into(),
                            detail: format!("{} keys unprocessed", pending.len()),
                            reasons: Vec::new(),
                            endpoint: clients.endpoints.dynamodb.clone(),
                        };
                        control.read_throttled_retry(&e, attempt).await;
                        attempt = (attempt + 1).min(6);
                    }
                }
                Err(e) => match clients.error("BatchGetItem", table, e) {
                    e @ AwsError::Throttled { .. } => {
                        control.read_throttled_retry(&e, attempt).await;
                        attempt = (attempt + 1).min(6);
                    }
                    e if e.is_transient() && failures < max_retries => {
                        failures += 1;
                        tracing::info!(action = "BatchGetItem", table, failures, error = %e, "retrying");
                        tokio::time::sleep(backoff(failures, jitter())).await;
                    }
                    e => return Err(e),
                },
            }
        }
    }
    Ok((found, consumed))
}
