//! An in-memory table that answers a Query the way DynamoDB does (key
//! condition, order, `Limit`, `ExclusiveStartKey`, `LastEvaluatedKey`), and
//! a page reader over it: what the unit tests and the read-path vectors
//! (`vectors/read-path-vectors.json`, which the reference implementations
//! in `docs/ref/` are checked against) run the merge on.

use std::collections::BTreeMap;

use super::cursor::{Cursor, QueryId};
use super::merge::{Entry, PageRun};
use super::range::{KeyCondition, Order, SkCondition};

/// Partition key → sort key → an item value.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemTable(pub BTreeMap<String, BTreeMap<String, String>>);

/// One Query's answer: the sort keys and values, and the LastEvaluatedKey's sort key.
pub type Answer = (Vec<(String, String)>, Option<String>);

impl MemTable {
    /// Query partition `pk`: like DynamoDB, `limit` items at most, after
    /// `start` (the LastEvaluatedKey of the call before), and a
    /// LastEvaluatedKey when the limit stopped the read.
    pub fn query(
        &self,
        pk: &str,
        cond: &KeyCondition,
        order: Order,
        start: Option<&str>,
        limit: usize,
    ) -> Answer {
        let Some(part) = self.0.get(pk) else {
            return (Vec::new(), None);
        };
        let ok = |sk: &str| match cond {
            KeyCondition::None => true,
            KeyCondition::BeginsWith(p) => sk.starts_with(p.as_str()),
            KeyCondition::Between(a, b) => a.as_str() <= sk && sk <= b.as_str(),
            KeyCondition::Gt(v) => sk > v.as_str(),
            KeyCondition::Ge(v) => sk >= v.as_str(),
            KeyCondition::Lt(v) => sk < v.as_str(),
            KeyCondition::Le(v) => sk <= v.as_str(),
        };
        let after = |sk: &str| match (start, order) {
            (None, _) => true,
            (Some(s), Order::Ascending) => sk > s,
            (Some(s), Order::Descending) => sk < s,
        };
        let matching: Box<dyn Iterator<Item = (&String, &String)>> = match order {
            Order::Ascending => Box::new(part.iter()),
            Order::Descending => Box::new(part.iter().rev()),
        };
        let mut rest = matching.filter(|(sk, _)| ok(sk) && after(sk));
        let items: Vec<(String, String)> = rest
            .by_ref()
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let more = items.len() == limit && rest.next().is_some();
        let lek = if more {
            items.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        (items, lek)
    }

    /// One page of the merged read of `keys`, fetching `fetch_limit()` items
    /// per Query, as `phase::query` does against DynamoDB.
    pub fn page(
        &self,
        read: &Read<'_>,
        cursor: Option<&Cursor>,
    ) -> (Vec<Entry<String>>, Option<Cursor>) {
        let mut run = PageRun::new(read.keys.len(), read.cond, read.order, read.limit, cursor);
        let mut starts: Vec<Option<String>> = vec![None; read.keys.len()];
        loop {
            let wants = run.step();
            if wants.is_empty() {
                return run.finish();
            }
            for k in wants {
                let cond = run.range(k).key_condition();
                let (items, lek) = self.query(
                    &read.keys[k],
                    &cond,
                    read.order,
                    starts[k].as_deref(),
                    run.fetch_limit(),
                );
                let more = lek.is_some();
                starts[k] = lek;
                run.feed(k, items, more);
            }
        }
    }

    /// Every page of a read, each with the cursor text it ended with.
    pub fn pages(
        &self,
        read: &Read<'_>,
        id: &QueryId,
    ) -> Vec<(Vec<Entry<String>>, Option<String>)> {
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let (page, next) = self.page(read, cursor.as_ref());
            let text = next.as_ref().map(|c| c.encode(id));
            out.push((page, text));
            match next {
                Some(c) => cursor = Some(c),
                None => return out,
            }
        }
    }
}

/// What is read: the partition keys, the sort-key condition, order, page size.
#[derive(Debug, Clone, Copy)]
pub struct Read<'a> {
    pub keys: &'a [String],
    pub cond: &'a SkCondition,
    pub order: Order,
    pub limit: usize,
}
