//! One Query call: a page of one partition key, over a sort-key condition,
//! under the read budget. The read path (`phase::query`) decides which key
//! to read next and from where; this only turns that into the SDK call and
//! rides out throttles and transient failures as the Scan does; `query_once`
//! (the load test's measured read) makes the call once and hands every
//! failure back.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use crate::aws::rate::Control;
use crate::aws::retry::single_attempt;
use crate::aws::scan::{ReadPage, read_page, retry_read};
use crate::aws::{AwsError, Clients, from_sdk_item, to_sdk_item};
use crate::core::query::KeyCondition;
use crate::core::value::Item;

#[derive(Debug, Clone)]
pub struct QueryCall<'a> {
    pub table: &'a str,
    pub partition_key: &'a str,
    pub sort_key: &'a str,
    /// The partition key's value (a string).
    pub key: &'a str,
    pub condition: &'a KeyCondition,
    pub ascending: bool,
    /// The LastEvaluatedKey of the call before, for the next page of the same key.
    pub start: Option<&'a Item>,
    pub limit: i32,
    pub consistent_read: bool,
}

#[derive(Debug)]
pub struct QueryPage {
    pub items: Vec<Item>,
    /// Items whose attribute types this SDK does not know: counted, never dropped silently.
    pub unreadable: u64,
    /// DynamoDB's LastEvaluatedKey: there may be more after `items`.
    pub next: Option<Item>,
    pub consumed: f64,
}

/// The key condition expression and its values for `call`.
fn expression(call: &QueryCall<'_>) -> (String, HashMap<String, AttributeValue>) {
    let s = |v: &str| AttributeValue::S(v.to_string());
    let mut values = HashMap::from([(":pk".to_string(), s(call.key))]);
    let mut one = |op: &str, v: &str| {
        values.insert(":a".to_string(), s(v));
        format!(" AND #sk {op} :a")
    };
    let sk = match call.condition {
        KeyCondition::None => String::new(),
        KeyCondition::BeginsWith(p) => {
            values.insert(":a".to_string(), s(p));
            " AND begins_with(#sk, :a)".to_string()
        }
        KeyCondition::Between(a, b) => {
            values.insert(":a".to_string(), s(a));
            values.insert(":b".to_string(), s(b));
            " AND #sk BETWEEN :a AND :b".to_string()
        }
        KeyCondition::Gt(v) => one(">", v),
        KeyCondition::Ge(v) => one(">=", v),
        KeyCondition::Lt(v) => one("<", v),
        KeyCondition::Le(v) => one("<=", v),
    };
    (format!("#pk = :pk{sk}"), values)
}

/// One page of `call.key`, made once: no budget, no retry by the SDK or by
/// rekey, so a throttle reaches the caller as a throttle (`rekey loadtest`).
pub(crate) async fn query_once(
    clients: &Clients,
    call: &QueryCall<'_>,
) -> Result<QueryPage, AwsError> {
    let (expr, values) = expression(call);
    let mut names = HashMap::from([("#pk".to_string(), call.partition_key.to_string())]);
    if !matches!(call.condition, KeyCondition::None) {
        names.insert("#sk".to_string(), call.sort_key.to_string());
    }
    let out = clients
        .dynamodb
        .query()
        .table_name(call.table)
        .key_condition_expression(&expr)
        .set_expression_attribute_names(Some(names))
        .set_expression_attribute_values(Some(values))
        .scan_index_forward(call.ascending)
        .limit(call.limit.max(1))
        .consistent_read(call.consistent_read)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .set_exclusive_start_key(call.start.map(to_sdk_item))
        .customize()
        .config_override(single_attempt())
        .send()
        .await
        .map_err(|e| clients.error("Query", call.table, e))?;
    let consumed = out
        .consumed_capacity()
        .and_then(|c| c.capacity_units())
        .unwrap_or(0.0);
    let raw = out.items.unwrap_or_default();
    let total = raw.len() as u64;
    let items: Vec<Item> = raw.into_iter().filter_map(from_sdk_item).collect();
    Ok(QueryPage {
        unreadable: total - items.len() as u64,
        items,
        next: out.last_evaluated_key.and_then(from_sdk_item),
        consumed,
    })
}

/// Read one page of `call.key`, waiting for the read budget first.
pub async fn query(
    clients: &Clients,
    control: &Control,
    call: &QueryCall<'_>,
) -> anyhow::Result<QueryPage> {
    let (expr, values) = expression(call);
    let mut names = HashMap::from([("#pk".to_string(), call.partition_key.to_string())]);
    if !matches!(call.condition, KeyCondition::None) {
        names.insert("#sk".to_string(), call.sort_key.to_string());
    }
    let mut failures = 0;
    loop {
        control.wait_read().await;
        let out = clients
            .dynamodb
            .query()
            .table_name(call.table)
            .key_condition_expression(&expr)
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values.clone()))
            .scan_index_forward(call.ascending)
            .limit(call.limit.max(1))
            .consistent_read(call.consistent_read)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .set_exclusive_start_key(call.start.map(to_sdk_item))
            .send()
            .await
            .map_err(|e| clients.error("Query", call.table, e));
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                retry_read(control, e, "Query", call.table, &mut failures).await?;
                continue;
            }
        };
        let consumed = out
            .consumed_capacity()
            .and_then(|c| c.capacity_units())
            .unwrap_or(0.0);
        control.read.spend(consumed).await;
        let ReadPage {
            items,
            unreadable,
            next,
        } = read_page(
            out.items.unwrap_or_default(),
            out.last_evaluated_key,
            "Query",
            call.table,
        )?;
        return Ok(QueryPage {
            items,
            unreadable,
            next,
            consumed,
        });
    }
}
