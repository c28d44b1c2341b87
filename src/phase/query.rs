//! `rekey query`: read one logical key of the new design — every partition
//! key the plan spread it over — as one stream in sort-key order, a page at
//! a time, with a cursor that resumes exactly where the page ended.
//!
//! The algorithm is pure and lives in `core::query` (keys, ranges, the
//! merge, the cursor); this drives it with parallel Query calls under a
//! read budget: each step of the merge names the keys it must see more of,
//! those are read at once (at most [`PARALLEL`] calls in flight), and their
//! answers fed back until the page is complete. `docs/read-path.md` has
//! the design and why paging neither repeats nor skips an item.

use std::collections::BTreeMap;

use futures::stream::{self, StreamExt};
use serde::Serialize;

use crate::aws::Clients;
use crate::aws::query::{QueryCall, QueryPage, query};
use crate::aws::rate::Control;
use crate::core::plan::Plan;
use crate::core::query::keys::{self, LogicalKey, TimeRange};
use crate::core::query::{Cursor, Order, PageRun, QueryId, SkCondition};
use crate::core::value::{Item, ScalarType, Value};
use crate::phase::error::InputError;

/// Query calls in flight at once for one page.
const PARALLEL: usize = 32;

#[derive(Debug, Clone)]
pub struct QueryOptions {
    /// The rule whose key is read (default: the one `where_` fits).
    pub rule: Option<String>,
    /// The values of the key's captures and attributes (`--where`).
    pub where_: BTreeMap<String, String>,
    /// For a key with a `bucket()`: the time range (`--from`, `--to`).
    pub time: Option<TimeRange>,
    pub condition: SkCondition,
    pub order: Order,
    /// Items per page, at least 1.
    pub limit: usize,
    /// Where the previous page ended (`--cursor`).
    pub cursor: Option<String>,
    /// Read budget, RCU per second (None: unlimited).
    pub read_rate: Option<f64>,
    pub consistent_read: bool,
}

/// What the read is, checked before any call: the keys, the query id the
/// cursor must carry, and the position to resume after.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub key: LogicalKey,
    pub id: QueryId,
    pub after: Option<Cursor>,
}

/// The keys and the cursor, from the plan and the options alone (no AWS):
/// every error is bad input.
pub fn prepare(plan: &Plan, o: &QueryOptions) -> Result<Prepared, InputError> {
    let bad = |e: &dyn std::fmt::Display| InputError(e.to_string());
    if let Some(sk) = &plan.target_key.sort_key
        && sk.ty != ScalarType::S
    {
        return Err(InputError(format!(
            "the target's sort key `{}` is {}: query reads string (S) sort keys",
            sk.name, sk.ty
        )));
    }
    let rule = keys::pick_rule(plan, o.rule.as_deref(), &o.where_).map_err(|e| bad(&e))?;
    let key = keys::render(plan, rule, &o.where_, o.time.as_ref()).map_err(|e| bad(&e))?;
    let id = QueryId::of(&key, &o.condition, o.order);
    let after = o
        .cursor
        .as_deref()
        .map(|c| Cursor::decode(c, &id, key.keys.len(), &o.condition))
        .transpose()
        .map_err(|e| bad(&e))?;
    Ok(Prepared { key, id, after })
}

#[derive(Debug, Clone, Serialize)]
pub struct QueryReport {
    pub table: String,
    pub rule: String,
    /// Partition keys read.
    pub keys: usize,
    pub items: Vec<Item>,
    /// Give it to `--cursor` for the next page; None: this was the last page.
    pub next_cursor: Option<String>,
    pub queries: u64,
    pub consumed_rcu: f64,
    /// Items whose attribute types this SDK does not know (not returned).
    #[serde(skip_serializing_if = "is_zero")]
    pub unreadable: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Read one page.
pub async fn run(clients: &Clients, plan: &Plan, o: &QueryOptions) -> anyhow::Result<QueryReport> {
    let p = prepare(plan, o)?;
    let control = Control::new(o.read_rate, None);
    let key = &p.key;
    let mut page: PageRun<Item> = PageRun::new(
        key.keys.len(),
        &o.condition,
        o.order,
        o.limit,
        p.after.as_ref(),
    );
    // Each key's LastEvaluatedKey within this page.
    let mut starts: Vec<Option<Item>> = vec![None; key.keys.len()];
    let (mut queries, mut consumed, mut unreadable) = (0u64, 0.0, 0u64);
    loop {
        let wants = page.step();
        if wants.is_empty() {
            break;
        }
        let limit = i32::try_from(page.fetch_limit()).unwrap_or(i32::MAX);
        let conditions: Vec<_> = wants
            .iter()
            .map(|&k| page.range(k).key_condition())
            .collect();
        let answers: Vec<(usize, anyhow::Result<QueryPage>)> =
            stream::iter(wants.iter().zip(&conditions))
                .map(|(&k, condition)| {
                    let call = QueryCall {
                        table: &key.table,
                        partition_key: &key.partition_key,
                        sort_key: &key.sort_key,
                        key: &key.keys[k],
                        condition,
                        ascending: o.order == Order::Ascending,
                        start: starts[k].as_ref(),
                        limit,
                        consistent_read: o.consistent_read,
                    };
                    let control = &control;
                    async move { (k, query(clients, control, &call).await) }
                })
                .buffer_unordered(PARALLEL)
                .collect()
                .await;
        for (k, answer) in answers {
            let answer = answer?;
            queries += 1;
            consumed += answer.consumed;
            unreadable += answer.unreadable;
            let items = answer
                .items
                .into_iter()
                .map(|item| Ok((sort_key(&item, &key.sort_key)?, item)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            page.feed(k, items, answer.next.is_some());
            starts[k] = answer.next;
        }
    }
    let (entries, next) = page.finish();
    Ok(QueryReport {
        table: key.table.clone(),
        rule: key.rule.clone(),
        keys: key.keys.len(),
        items: entries.into_iter().map(|e| e.item).collect(),
        next_cursor: next.map(|c| c.encode(&p.id)),
        queries,
        consumed_rcu: consumed,
        unreadable,
    })
}

/// An item's sort key, which the table's schema makes a string.
fn sort_key(item: &Item, name: &str) -> anyhow::Result<String> {
    match item.get(name) {
        Some(Value::S(s)) => Ok(s.clone()),
        other => anyhow::bail!(
            "an item's sort key `{name}` is {}, not a string",
            other.map_or("missing", Value::type_name)
        ),
    }
}
