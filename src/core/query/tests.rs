//! The read path end to end over the in-memory table: keys from real plans,
//! paging against a model, paging while the table changes, and the shared
//! vectors the reference implementations are checked against.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proptest::prelude::*;

use super::cursor::{Cursor, CursorError, QueryId};
use super::keys::{self, KeyError, LogicalKey, TimeRange};
use super::memory::{MemTable, Read};
use super::range::{Order, SkCondition, SkRange};
use crate::core::plan::Plan;

fn plan(file: &str, text: &str) -> Plan {
    Plan::parse(text, Path::new(file)).unwrap()
}

fn given(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const TENANT_DAY: &str = include_str!("../../../plans/tenant-day-shard.toml");
const EVENT_HOUR: &str = include_str!("../../../plans/event-hour-shard.toml");

#[test]
fn the_shard_keys_of_a_tenant_day_are_rendered_from_the_plan() {
    let p = plan("tenant-day-shard.toml", TENANT_DAY);
    let w = given(&[("tenant", "acme"), ("day", "2026-07-07")]);
    let rule = keys::pick_rule(&p, None, &w).unwrap();
    assert_eq!(rule.name, "order");
    let k = keys::render(&p, rule, &w, None).unwrap();
    assert_eq!(k.keys.len(), 16);
    assert_eq!(k.keys[0], "TENANT#acme#DAY#2026-07-07#SHARD#00");
    assert_eq!(k.keys[15], "TENANT#acme#DAY#2026-07-07#SHARD#15");
    assert_eq!(
        (k.table.as_str(), k.sort_key.as_str()),
        ("orders_by_shard", "SK")
    );

    let profile = keys::pick_rule(&p, None, &given(&[("tenant", "acme")])).unwrap();
    let k = keys::render(&p, profile, &given(&[("tenant", "acme")]), None).unwrap();
    assert_eq!(k.keys, ["TENANT#acme"]);
}

#[test]
fn a_bucketed_key_needs_a_time_range_and_fans_out_over_it() {
    let p = plan("event-hour-shard.toml", EVENT_HOUR);
    let w = given(&[("source", "pos")]);
    let rule = keys::pick_rule(&p, None, &w).unwrap();
    assert_eq!(
        keys::render(&p, rule, &w, None),
        Err(KeyError::NoTimeRange("event".into()))
    );
    let range = TimeRange {
        from: "2026-07-07T10:59:00Z".into(),
        to: "2026-07-07T11:00:00Z".into(),
    };
    let k = keys::render(&p, rule, &w, Some(&range)).unwrap();
    assert_eq!(k.keys.len(), 16, "2 hours × 8 shards");
    assert_eq!(k.keys[0], "SOURCE#pos#HOUR#2026-07-07T10#SHARD#0");
    assert_eq!(k.keys[8], "SOURCE#pos#HOUR#2026-07-07T11#SHARD#0");
    let backwards = TimeRange {
        from: "2026-07-07T11:00:00Z".into(),
        to: "2026-07-07T10:00:00Z".into(),
    };
    let e = keys::render(&p, rule, &w, Some(&backwards)).unwrap_err();
    assert!(e.to_string().contains("is before --from"), "{e}");
    let year = TimeRange {
        from: "2026-01-01".into(),
        to: "2026-12-31".into(),
    };
    let e = keys::render(&p, rule, &w, Some(&year)).unwrap_err();
    // 8,737 hours from midnight to midnight, 8 shards each.
    assert!(matches!(e, KeyError::TooMany { keys: 69_896, .. }), "{e}");
    let bad = TimeRange {
        from: "yesterday".into(),
        to: "2026-07-07".into(),
    };
    assert!(matches!(
        keys::render(&p, rule, &w, Some(&bad)),
        Err(KeyError::BadTime(_))
    ));
}

#[test]
fn where_must_name_exactly_what_the_key_reads() {
    let p = plan("tenant-day-shard.toml", TENANT_DAY);
    let e = keys::pick_rule(&p, None, &given(&[("tenant", "a"), ("date", "x")])).unwrap_err();
    assert!(
        e.to_string().contains("`day`, `tenant` for rule `order`"),
        "{e}"
    );
    let order = &p.rules[0];
    let e = keys::render(&p, order, &given(&[("tenant", "a")]), None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rule `order`: its partition key needs `day` in --where"
    );
    let w = given(&[("tenant", "a"), ("day", "d"), ("x", "1")]);
    let e = keys::render(&p, order, &w, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rule `order`: its partition key does not use `x`"
    );
    assert_eq!(
        keys::pick_rule(&p, Some("nope"), &w).unwrap_err(),
        KeyError::UnknownRule("nope".into())
    );
    let range = TimeRange {
        from: "2026-07-07".into(),
        to: "2026-07-07".into(),
    };
    let w = given(&[("tenant", "a"), ("day", "d")]);
    assert_eq!(
        keys::render(&p, order, &w, Some(&range)),
        Err(KeyError::TimeRangeUnused("order".into()))
    );
}

// ---- paging over the in-memory table ----------------------------------------

const KEYS: usize = 3;

fn key_names() -> Vec<String> {
    (0..KEYS).map(|i| format!("K#{i}")).collect()
}

fn table_of(items: &BTreeSet<(usize, String)>) -> MemTable {
    let mut t = MemTable::default();
    for (k, sk) in items {
        t.0.entry(format!("K#{k}"))
            .or_default()
            .insert(sk.clone(), format!("{k}/{sk}"));
    }
    t
}

/// Everything the read must return, in its order: (sort key, key index) ascending, or sort key descending then key index.
fn model(
    items: &BTreeSet<(usize, String)>,
    cond: &SkCondition,
    order: Order,
) -> Vec<(usize, String)> {
    let range = SkRange::of(cond);
    let mut v: Vec<(usize, String)> = items
        .iter()
        .filter(|(_, sk)| range.contains(sk))
        .cloned()
        .collect();
    v.sort_by(|(i, a), (j, b)| match order {
        Order::Ascending => a.cmp(b).then(i.cmp(j)),
        Order::Descending => b.cmp(a).then(i.cmp(j)),
    });
    v
}

fn sort_key() -> impl Strategy<Value = String> {
    // A small alphabet: equal sort keys in several keys, prefixes of each other.
    "[ab]{0,3}"
}

fn condition() -> impl Strategy<Value = SkCondition> {
    prop_oneof![
        Just(SkCondition::Any),
        "[ab]{0,2}".prop_map(SkCondition::BeginsWith),
        ("[ab]{0,2}", "[ab]{0,3}").prop_map(|(a, b)| SkCondition::Between(a, b)),
    ]
}

fn order() -> impl Strategy<Value = Order> {
    prop_oneof![Just(Order::Ascending), Just(Order::Descending)]
}

fn query_id(cond: &SkCondition, order: Order) -> QueryId {
    QueryId::of(&logical(), cond, order)
}

fn logical() -> LogicalKey {
    LogicalKey {
        rule: "r".into(),
        table: "t".into(),
        partition_key: "PK".into(),
        sort_key: "SK".into(),
        keys: key_names(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Paging with any page size returns exactly the model, in order, and
    /// every page but the last is full.
    #[test]
    fn pages_concatenate_to_the_sorted_items(
        items in proptest::collection::btree_set((0..KEYS, sort_key()), 0..25),
        cond in condition(),
        order in order(),
        limit in 1usize..9,
    ) {
        let names = key_names();
        let read = Read { keys: &names, cond: &cond, order, limit };
        let id = query_id(&cond, order);
        let pages = table_of(&items).pages(&read, &id);
        let got: Vec<(usize, String)> = pages.iter().flat_map(|(p, _)| p.iter().map(|e| (e.key, e.sk.clone()))).collect();
        prop_assert_eq!(&got, &model(&items, &cond, order));
        for (i, (page, cursor)) in pages.iter().enumerate() {
            let last = i + 1 == pages.len();
            prop_assert_eq!(cursor.is_none(), last);
            if !last {
                prop_assert_eq!(page.len(), limit);
                // The cursor decodes to the page's last item.
                let c = Cursor::decode(cursor.as_ref().unwrap(), &id, KEYS, &cond).unwrap();
                prop_assert_eq!((c.key, c.sk.clone()), (page[limit - 1].key, page[limit - 1].sk.clone()));
            }
            prop_assert!(last && got.is_empty() || !page.is_empty());
        }
    }

    /// Inserts and deletes between pages: no item twice, the order never
    /// goes back, and every item that existed throughout is returned.
    #[test]
    fn paging_while_the_table_changes_repeats_and_misses_nothing_that_stayed(
        items in proptest::collection::btree_set((0..KEYS, sort_key()), 0..25),
        changes in proptest::collection::vec(proptest::collection::vec((any::<bool>(), 0..KEYS, sort_key()), 0..4), 0..12),
        cond in condition(),
        order in order(),
        limit in 1usize..5,
    ) {
        let names = key_names();
        let read = Read { keys: &names, cond: &cond, order, limit };
        let mut table = items.clone();
        let mut stayed = items.clone();
        let mut got: Vec<(usize, String)> = Vec::new();
        let mut cursor = None;
        let mut changes = changes.into_iter();
        loop {
            let (page, next) = table_of(&table).page(&read, cursor.as_ref());
            got.extend(page.iter().map(|e| (e.key, e.sk.clone())));
            let Some(next) = next else { break };
            cursor = Some(next);
            for (insert, k, sk) in changes.next().unwrap_or_default() {
                if insert {
                    table.insert((k, sk));
                } else {
                    table.remove(&(k, sk.clone()));
                    stayed.remove(&(k, sk));
                }
            }
        }
        let distinct: BTreeSet<&(usize, String)> = got.iter().collect();
        prop_assert_eq!(distinct.len(), got.len(), "an item came twice: {:?}", got);
        let all: BTreeSet<(usize, String)> = got.iter().cloned().collect();
        let in_order = model(&all, &SkCondition::Any, order);
        prop_assert_eq!(&got, &in_order, "the merge order went back");
        for want in model(&stayed, &cond, order) {
            prop_assert!(all.contains(&want), "{:?} existed throughout and was missed", want);
        }
    }
}

#[test]
fn a_cursor_of_another_query_is_refused() {
    let names = key_names();
    let items: BTreeSet<(usize, String)> = (0..5).map(|i| (i % KEYS, format!("a{i}"))).collect();
    let read = Read {
        keys: &names,
        cond: &SkCondition::Any,
        order: Order::Ascending,
        limit: 2,
    };
    let id = query_id(&SkCondition::Any, Order::Ascending);
    let pages = table_of(&items).pages(&read, &id);
    let text = pages[0].1.clone().unwrap();
    let other = query_id(&SkCondition::BeginsWith("a".into()), Order::Ascending);
    assert_eq!(
        Cursor::decode(&text, &other, KEYS, &SkCondition::BeginsWith("a".into())),
        Err(CursorError::Foreign)
    );
}

// ---- the shared vectors ------------------------------------------------------

mod vectors;
