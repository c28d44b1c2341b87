//! The control table of a fleet of workers (`rekey worker --state
//! dynamodb://TABLE`): created on demand, read with consistent reads, and
//! written only with conditional writes, which are how workers agree on who
//! holds what (`state::fleet`).
//!
//! A failed condition is an answer the caller branches on ([`Cond::Refused`]),
//! not an error: it means another worker got there first. Every other failure
//! is an [`AwsError`] naming the control table, the action and the endpoint,
//! like every other call in `aws`.
//!
//! The control table may live at an endpoint of its own
//! ([`STATE_ENDPOINT`]): a control table beside a fleet whose data is
//! elsewhere (another endpoint, a local stand-in for a benchmark) while
//! every data call keeps the usual endpoint settings. Every request is
//! counted ([`ControlCalls`]), so that a worker can say what its
//! coordination cost per unit of work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    CancellationReason, Put, ReturnConsumedCapacity, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem,
};
use serde::Serialize;

use crate::aws::endpoint::{Endpoint, Service, Source};
use crate::aws::item::{Expressions, update_item_if};
use crate::aws::{AwsError, Clients, from_sdk_item, to_sdk, to_sdk_item};
use crate::core::plan::{KeyAttr, KeySchema};
use crate::core::value::{Item, ScalarType, Value};

/// The control table's key attributes: both strings.
pub const PK: &str = "pk";
pub const SK: &str = "sk";

/// What a conditional write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    Written,
    /// The condition did not hold: nothing was written.
    Refused,
}

/// What a transaction of conditional puts did ([`ControlTable::put_all_if`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Puts {
    /// Every put was written.
    Written,
    /// Nothing was written (a transaction is all or nothing). These puts'
    /// conditions failed, each with the item that made it fail when
    /// DynamoDB returned it; every other put may be sent again (it was
    /// cancelled with the rest, by a conflict with another transaction or
    /// a throttle, when this list is empty).
    Cancelled(Vec<(usize, Option<Item>)>),
}

/// DynamoDB's limit on the actions of one TransactWriteItems.
pub(crate) const PUTS_PER_TRANSACTION: usize = 100;

/// The control table's own endpoint, when it is not where the data is: read
/// by [`ControlTable::new`] (so by `worker`, `tail --fleet` and `status`).
/// Unset or empty, the control table uses the DynamoDB endpoint of the data.
pub(crate) const STATE_ENDPOINT: &str = "REKEY_STATE_ENDPOINT_URL";

/// One control table.
#[derive(Debug, Clone)]
pub struct ControlTable {
    pub clients: Clients,
    pub table: String,
    /// Shared by every clone: what this process asked of the table.
    calls: Arc<Counters>,
}

/// Requests sent to the control table by this process, by action: each
/// page of a Query counts once; the SDK's own retries of one request do
/// not count; neither do the table check at join (DescribeTable, and
/// CreateTable for the worker that creates it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ControlCalls {
    pub get_item: u64,
    pub query: u64,
    pub put_item: u64,
    pub update_item: u64,
    pub delete_item: u64,
    /// Transactions of conditional puts (target-key claims, up to
    /// [`PUTS_PER_TRANSACTION`] each).
    pub transact_write_items: u64,
    /// The six added up.
    pub total: u64,
}

#[derive(Debug, Default)]
struct Counters {
    get_item: AtomicU64,
    query: AtomicU64,
    put_item: AtomicU64,
    update_item: AtomicU64,
    delete_item: AtomicU64,
    transact_write_items: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// `clients` with its DynamoDB client sent to `url` instead (the control
/// table's endpoint, from [`STATE_ENDPOINT`]); unchanged when `url` is None
/// or empty. Errors then name that endpoint and the variable.
pub(crate) fn at_endpoint(clients: &Clients, url: Option<String>) -> Clients {
    let Some(url) = url.filter(|u| !u.trim().is_empty()) else {
        return clients.clone();
    };
    let conf = clients
        .dynamodb
        .config()
        .to_builder()
        .endpoint_url(&url)
        .build();
    let mut c = clients.clone();
    c.dynamodb = aws_sdk_dynamodb::Client::from_conf(conf);
    c.endpoints.dynamodb = Arc::new(Endpoint {
        service: Service::DynamoDb,
        url,
        source: Source::Env(STATE_ENDPOINT),
    });
    c
}

/// The key of the item `pk`/`sk`.
pub fn key(pk: &str, sk: &str) -> Item {
    let mut k = Item::new();
    k.insert(PK.into(), Value::S(pk.into()));
    k.insert(SK.into(), Value::S(sk.into()));
    k
}

impl ControlTable {
    /// The table `table` at the data's DynamoDB endpoint, or at
    /// [`STATE_ENDPOINT`] when that is set.
    pub fn new(clients: &Clients, table: &str) -> ControlTable {
        let clients = at_endpoint(clients, std::env::var(STATE_ENDPOINT).ok());
        if clients.endpoints.dynamodb.source == Source::Env(STATE_ENDPOINT) {
            tracing::info!(endpoint = %clients.endpoints.dynamodb, "control table endpoint");
        }
        ControlTable::with(clients, table)
    }

    fn with(clients: Clients, table: &str) -> ControlTable {
        ControlTable {
            clients,
            table: table.to_string(),
            calls: Arc::default(),
        }
    }

    /// The requests sent so far, by every clone of this table.
    pub fn calls(&self) -> ControlCalls {
        let c = &self.calls;
        let (get_item, query, put_item, update_item, delete_item, transact_write_items) = (
            c.get_item.load(Ordering::Relaxed),
            c.query.load(Ordering::Relaxed),
            c.put_item.load(Ordering::Relaxed),
            c.update_item.load(Ordering::Relaxed),
            c.delete_item.load(Ordering::Relaxed),
            c.transact_write_items.load(Ordering::Relaxed),
        );
        ControlCalls {
            get_item,
            query,
            put_item,
            update_item,
            delete_item,
            transact_write_items,
            total: get_item + query + put_item + update_item + delete_item + transact_write_items,
        }
    }

    /// Creates the table (on-demand billing, `pk`/`sk` strings) and waits
    /// until it is ACTIVE; a table that exists already is used as it is,
    /// once ACTIVE (another worker may have just created it).
    pub async fn ensure(&self) -> Result<(), AwsError> {
        let schema = KeySchema {
            partition_key: KeyAttr {
                name: PK.into(),
                ty: ScalarType::S,
            },
            sort_key: Some(KeyAttr {
                name: SK.into(),
                ty: ScalarType::S,
            }),
        };
        match self.clients.describe_table(&self.table).await {
            Ok(info) => {
                info.check_key(&schema, "control")?;
                return self.clients.wait_active(&self.table).await;
            }
            Err(AwsError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        match self.clients.create_table(&self.table, &schema, false).await {
            Ok(()) => Ok(()),
            Err(AwsError::Service { code, .. }) if code == "ResourceInUseException" => {
                self.clients.wait_active(&self.table).await
            }
            Err(e) => Err(e),
        }
    }

    /// The item, read consistently, or None.
    pub async fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>, AwsError> {
        bump(&self.calls.get_item);
        crate::aws::item::get_item(&self.clients, &self.table, &key(pk, sk), true).await
    }

    /// Every item under `pk`, read consistently, page after page.
    pub async fn query(&self, pk: &str) -> Result<Vec<Item>, AwsError> {
        self.query_prefix(pk, "").await
    }

    /// The items under `pk` whose sort key begins with `prefix` (all of
    /// them when it is empty), read consistently, page after page.
    pub(crate) async fn query_prefix(&self, pk: &str, prefix: &str) -> Result<Vec<Item>, AwsError> {
        let mut out = Vec::new();
        let mut start = None;
        let condition = if prefix.is_empty() {
            "#pk = :pk"
        } else {
            "#pk = :pk AND begins_with(#sk, :prefix)"
        };
        loop {
            let mut req = self
                .clients
                .dynamodb
                .query()
                .table_name(&self.table)
                .key_condition_expression(condition)
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", to_sdk(&Value::S(pk.into())));
            if !prefix.is_empty() {
                req = req
                    .expression_attribute_names("#sk", SK)
                    .expression_attribute_values(":prefix", to_sdk(&Value::S(prefix.into())));
            }
            bump(&self.calls.query);
            let page = req
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.clients.error("Query", &self.table, e))?;
            out.extend(
                page.items
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(from_sdk_item),
            );
            start = page.last_evaluated_key.filter(|k| !k.is_empty());
            if start.is_none() {
                return Ok(out);
            }
        }
    }

    /// PutItem of `item` if `condition` holds (names and values through
    /// placeholders in `e`; `e.update` is ignored).
    pub(crate) async fn put_if(&self, item: &Item, e: &Expressions) -> Result<Cond, AwsError> {
        let mut req = self
            .clients
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_sdk_item(item)))
            .condition_expression(&e.condition)
            .return_consumed_capacity(ReturnConsumedCapacity::None);
        for (k, v) in &e.names {
            req = req.expression_attribute_names(k, v);
        }
        for (k, v) in &e.values {
            req = req.expression_attribute_values(k, to_sdk(v));
        }
        bump(&self.calls.put_item);
        match req.send().await {
            Ok(_) => Ok(Cond::Written),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(Cond::Refused)
            }
            Err(err) => Err(self.clients.error("PutItem", &self.table, err)),
        }
    }

    /// TransactWriteItems of conditional puts (at most
    /// [`PUTS_PER_TRANSACTION`], no two on one key): one request for what
    /// would otherwise be one PutItem each. A refused put's current item
    /// comes back with the cancellation (ALL_OLD), so the caller learns who
    /// holds it without a read.
    pub(crate) async fn put_all_if(&self, puts: &[(Item, Expressions)]) -> Result<Puts, AwsError> {
        let mut req = self.clients.dynamodb.transact_write_items();
        for (item, e) in puts {
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(to_sdk_item(item)))
                .condition_expression(&e.condition)
                .set_expression_attribute_names(
                    (!e.names.is_empty()).then(|| e.names.clone().into_iter().collect()),
                )
                .set_expression_attribute_values((!e.values.is_empty()).then(|| {
                    e.values
                        .iter()
                        .map(|(k, v)| (k.clone(), to_sdk(v)))
                        .collect()
                }))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build()
                .expect("a Put with its table and item set builds");
            req = req.transact_items(TransactWriteItem::builder().put(put).build());
        }
        bump(&self.calls.transact_write_items);
        match req.send().await {
            Ok(_) => Ok(Puts::Written),
            Err(err) => match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                    Ok(Puts::Cancelled(refused_puts(c.cancellation_reasons())))
                }
                _ => Err(self.clients.error("TransactWriteItems", &self.table, err)),
            },
        }
    }

    /// DeleteItem of `pk`/`sk` (a fleet tail's applied buffer chunk).
    pub async fn delete(&self, pk: &str, sk: &str) -> Result<(), AwsError> {
        bump(&self.calls.delete_item);
        crate::aws::item::delete_item(&self.clients, &self.table, &key(pk, sk)).await
    }

    /// UpdateItem of `pk`/`sk` if `e.condition` holds.
    pub(crate) async fn update_if(
        &self,
        pk: &str,
        sk: &str,
        e: &Expressions,
    ) -> Result<Cond, AwsError> {
        bump(&self.calls.update_item);
        Ok(
            match update_item_if(&self.clients, &self.table, &key(pk, sk), e).await? {
                Some(_) => Cond::Written,
                None => Cond::Refused,
            },
        )
    }
}

/// The puts of a cancelled transaction whose own condition failed.
fn refused_puts(reasons: &[CancellationReason]) -> Vec<(usize, Option<Item>)> {
    reasons
        .iter()
        .enumerate()
        .filter(|(_, r)| r.code() == Some("ConditionalCheckFailed"))
        .map(|(i, r)| (i, r.item().cloned().and_then(from_sdk_item)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::AwsOptions;

    #[tokio::test]
    async fn the_control_table_goes_to_its_own_endpoint_names_it_and_counts_its_requests() {
        let data = Clients::connect(&AwsOptions {
            endpoint_url: Some("http://127.0.0.1:9".into()),
            region: Some("eu-west-1".into()),
            static_credentials: Some(("k".into(), "s".into())),
            max_attempts: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
        let same = at_endpoint(&data, Some(" ".into()));
        assert_eq!(same.endpoints.dynamodb, data.endpoints.dynamodb);
        let t = ControlTable::with(at_endpoint(&data, Some("http://127.0.0.1:7".into())), "ctl");
        let clone = t.clone();
        let e = clone.get("MIG#m", "META").await.unwrap_err().to_string();
        assert!(
            e.contains(
                "http://127.0.0.1:7 (from the REKEY_STATE_ENDPOINT_URL environment variable)"
            ),
            "{e}"
        );
        assert!(clone.query("MIG#m").await.is_err());
        let calls = t.calls();
        assert_eq!(
            (calls.get_item, calls.query, calls.total),
            (1, 1, 2),
            "{calls:?}"
        );
    }
}
