use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, Value, encode_key};

/// A re-key plan from `orders` (PK, SK strings) with these rules and options.
fn plan(rules: &str, options: &str) -> Plan {
    let text = format!(
        r#"
[source]
table = "orders"
partition_key = "PK"
sort_key = "SK"
[target]
table = "orders_v2"
partition_key = "PK"
sort_key = "SK"
[options]
{options}
{rules}
"#
    );
    Plan::parse(&text, Path::new("t.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn order_rule(pk: &str, sk: &str) -> String {
    format!(
        r#"[[rule]]
name = "order"
match = {{ PK = "TENANT#{{tenant}}#DAY#{{day}}", SK = "ORDER#{{id}}" }}
key = {{ PK = "{pk}", SK = "{sk}" }}
"#
    )
}

const PROFILE: &str = r#"[[rule]]
name = "profile"
match = { PK = "TENANT#{tenant}", SK = "PROFILE" }
key = { PK = "TENANT#{tenant}", SK = "PROFILE" }
"#;

#[test]
fn which_plans_prove_their_target_key_determines_the_source_key() {
    let shard = "TENANT#{tenant}#DAY#{day}#SHARD#{shard(id, 16):02}";
    let cases: &[(&str, String, &str, Result<(), &str>)] = &[
        (
            "shard suffix, padded",
            order_rule(shard, "ORDER#{id}"),
            "",
            Ok(()),
        ),
        (
            "shard suffix and a second rule with other literals",
            order_rule(shard, "ORDER#{id}") + PROFILE,
            "",
            Ok(()),
        ),
        (
            "a fixed prefix and the key whole",
            order_rule("V2#{@PK}", "{@SK}"),
            "",
            Ok(()),
        ),
        (
            "a time bucket in front",
            order_rule(
                "{bucket(day, week)}#TENANT#{tenant}#DAY#{day}",
                "ORDER#{id}",
            ),
            "",
            Ok(()),
        ),
        (
            "the shard unpadded (one or two digits)",
            order_rule(
                "TENANT#{tenant}#DAY#{day}#SHARD#{shard(id, 16)}",
                "ORDER#{id}",
            ),
            "",
            Err("source key `PK`"),
        ),
        (
            "a capture padded",
            order_rule("TENANT#{tenant}#DAY#{day:012}", "ORDER#{id}"),
            "",
            Err("source key `PK`"),
        ),
        (
            "the day dropped from the key",
            order_rule("TENANT#{tenant}", "ORDER#{id}"),
            "",
            Err("source key `PK`"),
        ),
        (
            "captures reordered (maybe injective, not proven)",
            order_rule("DAY#{day}#TENANT#{tenant}", "ORDER#{id}"),
            "",
            Err("source key `PK`"),
        ),
        (
            "an attribute beside the key",
            order_rule("TENANT#{tenant}#DAY#{day}#{@status}", "ORDER#{id}"),
            "",
            Err("source key `PK`"),
        ),
        (
            "unmatched items copied",
            order_rule(shard, "ORDER#{id}"),
            "unmatched = \"copy\"",
            Err("unmatched"),
        ),
        (
            "two rules that can write one key",
            order_rule(shard, "ORDER#{id}")
                + r#"[[rule]]
name = "any"
match = { PK = "X#{x}" }
key = { PK = "{@PK}", SK = "{@SK}" }
"#,
            "",
            Err("rules `order` and `any`"),
        ),
    ];
    for (what, rules, options, want) in cases {
        let got = key_injective(&plan(rules, options));
        match (want, &got) {
            (Ok(()), Ok(())) => {}
            (Err(part), Err(reason)) if reason.contains(part) => {}
            _ => panic!("{what}: want {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn number_keys_and_in_place_plans_are_not_proven() {
    let text = r#"
[source]
table = "events"
partition_key = "id:N"
[target]
table = "events_v2"
partition_key = "id:N"
[[rule]]
name = "all"
key = { id = "{@id}" }
"#;
    let p = Plan::parse(text, Path::new("n.toml")).unwrap();
    assert!(key_injective(&p).unwrap_err().contains("not a string"));
    let in_place = std::fs::read_to_string("plans/status-gsi-in-place.toml").unwrap();
    let p = Plan::parse(&in_place, Path::new("plans/status-gsi-in-place.toml")).unwrap();
    assert!(key_injective(&p).unwrap_err().contains("in place"));
}

#[test]
fn the_shipped_shard_plan_is_proven() {
    let text = std::fs::read_to_string("plans/tenant-day-shard.toml").unwrap();
    let p = Plan::parse(&text, Path::new("plans/tenant-day-shard.toml")).unwrap();
    assert_eq!(key_injective(&p), Ok(()));
}

// ---- property: a proven plan never maps two source keys to one target key ----

/// Source key parts from an alphabet full of the plans' own delimiters, so
/// captures that swallow `#DAY#` or `#SHARD#` are common.
fn part() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "#", "DAY", "SHARD", "TENANT", "a", "1", "0", "ORDER", "-",
        ]),
        1..5,
    )
    .prop_map(|v| v.concat())
}

fn order_item(tenant: &str, day: &str, id: &str) -> Item {
    let mut it = Item::new();
    it.insert("PK".into(), Value::S(format!("TENANT#{tenant}#DAY#{day}")));
    it.insert("SK".into(), Value::S(format!("ORDER#{id}")));
    it.insert("status".into(), Value::S("OPEN".into()));
    it
}

/// Target key → the source keys that map to it.
fn owners(plan: &Plan, items: &[Item]) -> BTreeMap<Vec<u8>, std::collections::BTreeSet<Vec<u8>>> {
    let mut out: BTreeMap<_, std::collections::BTreeSet<_>> = BTreeMap::new();
    for it in items {
        if let Outcome::Put { item, .. } = transform(plan, it) {
            let t = encode_key(&item, &plan.target_key.names()).unwrap();
            let s = encode_key(it, &plan.source_key.names()).unwrap();
            out.entry(t).or_default().insert(s);
        }
    }
    out
}

fn keys() -> impl Strategy<Value = Vec<(String, String, String)>> {
    prop::collection::vec((part(), part(), part()), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn proven_plans_never_map_two_source_keys_to_one_target_key(keys in keys()) {
        let shard = "TENANT#{tenant}#DAY#{day}#SHARD#{shard(id, 16):02}";
        for p in [
            plan(&(order_rule(shard, "ORDER#{id}") + PROFILE), ""),
            plan(&order_rule("V2#{@PK}", "{@SK}"), ""),
        ] {
            prop_assert_eq!(key_injective(&p), Ok(()));
            let items: Vec<Item> = keys.iter().map(|(t, d, i)| order_item(t, d, i)).collect();
            for (target, sources) in owners(&p, &items) {
                prop_assert_eq!(sources.len(), 1, "target key {:?}", target);
            }
        }
    }
}

/// The property can fail: a plan that is not proven (the day dropped from
/// the key) does map two source keys to one target key, and the same check
/// finds it.
#[test]
fn the_property_finds_collisions_in_a_plan_that_is_not_proven() {
    let p = plan(&order_rule("TENANT#{tenant}", "ORDER#{id}"), "");
    assert!(key_injective(&p).is_err());
    let items = [order_item("a", "1", "x"), order_item("a", "2", "x")];
    assert!(owners(&p, &items).values().any(|s| s.len() == 2));
}
