//! The round trip: `inverse(plan, transform(plan, item)) == item` for every
//! reversible rule, over items with attributes of every DynamoDB type and
//! keys with separators and unicode inside captures; a rule reported
//! irreversible rejects instead; and whatever the values, the inverse never
//! answers with an item that is not the source item.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::LazyLock;

use proptest::collection::{btree_map, btree_set, vec};
use proptest::prelude::*;

use super::super::*;
use crate::core::template::{Expr, Part};
use crate::core::transform::{Outcome, transform};

/// Text for captures and attributes: separators and unicode included.
fn text() -> impl Strategy<Value = String> {
    "[a-z0-9#|é日🦀-]{1,8}"
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        (-1000i64..1000).prop_map(|n| n.to_string()),
        (0u32..10_000, 1u32..100).prop_map(|(a, b)| format!("{a}.{b}")),
    ]
}

/// A value of any DynamoDB type, lists and maps nested.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        text().prop_map(Value::S),
        number().prop_map(Value::N),
        vec(any::<u8>(), 0..6).prop_map(Value::B),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
        btree_set(text(), 1..4).prop_map(|s| Value::Ss(s.into_iter().collect())),
        btree_set(-50i32..50, 1..4).prop_map(|s| Value::Ns(s.iter().map(i32::to_string).collect())),
        btree_set(vec(any::<u8>(), 1..4), 1..3).prop_map(|s| Value::Bs(s.into_iter().collect())),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::L),
            btree_map("[a-z]{1,4}", inner, 0..4).prop_map(Value::M),
        ]
    })
}

/// A time a `bucket()` reads: ISO text or epoch seconds, in 2020..2030.
fn time(n: i64, iso: bool) -> Value {
    let secs = 1_577_836_800 + n.rem_euclid(315_360_000);
    if iso {
        let t = chrono::DateTime::from_timestamp(secs, 0).expect("in range");
        Value::S(t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
    } else {
        Value::N(secs.to_string())
    }
}

/// Raw randomness, turned into an item for one rule of one plan by [`source_item`].
#[derive(Debug, Clone)]
struct Draw {
    texts: Vec<String>,
    numbers: Vec<String>,
    times: Vec<(i64, bool)>,
    extras: BTreeMap<String, Value>,
}

fn draw() -> impl Strategy<Value = Draw> {
    (
        vec(text(), 8),
        vec(number(), 4),
        vec((any::<i64>(), any::<bool>()), 4),
        btree_map(
            prop_oneof![
                Just("a"),
                Just("b_2"),
                Just("ünï"),
                Just("x.y"),
                Just("long name"),
                Just("ingest_debug")
            ]
            .prop_map(String::from),
            value(),
            0..6,
        ),
    )
        .prop_map(|(texts, numbers, times, extras)| Draw {
            texts,
            numbers,
            times,
            extras,
        })
}

/// Names whose values reach a `bucket()` in the rule: captures and attributes.
fn timed(rule: &crate::core::plan::Rule) -> BTreeSet<String> {
    fn walk(e: &Expr, inside: bool, out: &mut BTreeSet<String>) {
        match e {
            Expr::Capture(c) if inside => {
                out.insert(c.clone());
            }
            Expr::Attr(a) if inside => {
                out.insert(format!("@{a}"));
            }
            Expr::Bucket { arg, .. } => walk(arg, true, out),
            Expr::Shard { arg, .. } => walk(arg, inside, out),
            Expr::Text(t) => t.parts.iter().for_each(|p| {
                if let Part::Expr { expr, .. } = p {
                    walk(expr, inside, out)
                }
            }),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    let templates = rule
        .key
        .iter()
        .map(|(_, t)| t)
        .chain(rule.set.iter().map(|s| &s.template));
    for t in templates {
        for p in &t.parts {
            if let Part::Expr { expr, .. } = p {
                walk(expr, false, &mut out);
            }
        }
    }
    out
}

/// A source item rule `rule` of `plan` matches (unless its values happen to
/// make an earlier rule match), or, with `rule` out of range, an item no rule
/// matches. `banned` characters stay out of captures.
fn source_item(plan: &Plan, rule: usize, d: &Draw, banned: &[char]) -> Item {
    let mut texts = d.texts.iter().map(|t| t.replace(banned, "_")).cycle();
    let mut times = d.times.iter().cycle();
    let mut item = Item::new();
    let Some(rule) = plan.rules.get(rule) else {
        item.insert(
            plan.source_key.partition_key.name.clone(),
            Value::S(format!("OTHER#{}", d.texts[0])),
        );
        if let Some(sk) = &plan.source_key.sort_key {
            item.insert(sk.name.clone(), Value::S(d.texts[1].clone()));
        }
        return item;
    };
    let timed = timed(rule);
    let mut captures = Vec::new();
    let mut numbers = d.numbers.iter().cycle();
    for (attr, shape) in &rule.matchers {
        let numeric = plan
            .source_key
            .attrs()
            .any(|k| &k.name == attr && k.ty == ScalarType::N);
        for (c, _) in &shape.captures {
            let v = if numeric {
                numbers.next().expect("cycle").clone()
            } else if timed.contains(c) {
                let (n, _) = times.next().expect("cycle");
                time(*n, false).display_text()
            } else {
                texts.next().expect("cycle")
            };
            captures.push((c.clone(), v));
        }
    }
    let scope_item = Item::new();
    for (attr, shape) in &rule.matchers {
        let t = crate::core::template::Template::parse(&shape.text).expect("shape");
        let text = t
            .render(&crate::core::template::Scope {
                captures: &captures
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect::<Vec<_>>(),
                item: &scope_item,
                default_hash: plan.hash,
            })
            .expect("a shape renders from its captures");
        let ty = plan
            .source_key
            .attrs()
            .find(|k| &k.name == attr)
            .map(|k| k.ty);
        let v = match ty {
            Some(ScalarType::N) => Value::N(text),
            Some(ScalarType::B) => Value::B(text.into_bytes()),
            _ => Value::S(text),
        };
        item.insert(attr.clone(), v);
    }
    for (i, k) in plan.source_key.attrs().enumerate() {
        if !item.contains_key(&k.name) {
            let v = match k.ty {
                ScalarType::N => Value::N(d.numbers[i].clone()),
                ScalarType::S => Value::S(texts.next().expect("cycle")),
                ScalarType::B => Value::B(texts.next().expect("cycle").into_bytes()),
            };
            item.insert(k.name.clone(), v);
        }
    }
    let reads = rule.reads().into_iter().chain(
        rule.key
            .iter()
            .flat_map(|(_, t)| t.attributes().into_iter().map(|(a, _)| a)),
    );
    for a in reads.collect::<BTreeSet<_>>() {
        if !item.contains_key(a) {
            let v = if timed.contains(&format!("@{a}")) {
                let (n, iso) = times.next().expect("cycle");
                time(*n, *iso)
            } else {
                Value::S(texts.next().expect("cycle"))
            };
            item.insert(a.to_string(), v);
        }
    }
    // Other attributes, of every type; none of the names the plan writes.
    for (name, v) in &d.extras {
        let written = plan
            .rules
            .iter()
            .any(|r| r.set.iter().any(|s| &s.name == name))
            || plan.target_key.names().contains(&name.as_str());
        if !written && !item.contains_key(name) {
            item.insert(name.clone(), v.clone());
        }
    }
    item
}

/// The round trip of one item, as the plan's reversibility says it must be.
fn check_round_trip(plan: &Plan, source: &Item) -> Result<(), TestCaseError> {
    let report = reversibility(plan);
    // A data reject (a missing attribute, a time that does not parse) writes nothing to reverse.
    let Outcome::Put { rule, item: target } = transform(plan, source) else {
        return Ok(());
    };
    let back = inverse(plan, &target);
    match rule {
        None => prop_assert_eq!(
            back,
            InverseOutcome::Put {
                rule: None,
                item: source.clone()
            }
        ),
        Some(i) if report[i].reversible() => {
            let want = InverseOutcome::Put {
                rule: Some(i),
                item: source.clone(),
            };
            prop_assert_eq!(&back, &want, "target {:?}", target);
            // As the application writes it after cutover: no prefix copies.
            if let Some(p) = &plan.source_key_prefix {
                let mut app = target.clone();
                app.retain(|k, _| !k.starts_with(p.as_str()));
                prop_assert_eq!(inverse(plan, &app), want);
            }
        }
        Some(i) if report[i].reasons.iter().any(Irreversible::every_item) => {
            prop_assert!(
                matches!(&back, InverseOutcome::Reject(r) if matches!(r.reason, InverseReason::Irreversible(_) | InverseReason::InPlace)),
                "{:?}",
                back
            );
        }
        Some(i) => prop_assert!(
            back == InverseOutcome::Put {
                rule: Some(i),
                item: source.clone()
            } || matches!(&back, InverseOutcome::Reject(r) if matches!(r.reason, InverseReason::AmbiguousRule(_) | InverseReason::AmbiguousSource { .. })),
            "{:?}",
            back
        ),
    }
    Ok(())
}

static EXAMPLES: LazyLock<Vec<Plan>> = LazyLock::new(|| {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("plans");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    files.iter().map(|f| Plan::load(f).unwrap()).collect()
});

/// A plan with every kind of part: number and binary keys, a source key
/// carried whole, `shard()`, `bucket()` of a kept attribute, a capture kept by
/// a `set` attribute, a capture kept by a matched attribute, a prefix.
const KITCHEN: &str = r#"
[source]
table = "s"
partition_key = "PK"
sort_key = "SK:N"
[target]
table = "t"
partition_key = "id"
sort_key = "at:B"
[options]
source_key_prefix = "src_"
hash = "murmur3_32"
[[rule]]
name = "event"
match = { PK = "DEV#{dev}#T#{kind}#R#{region}", SK = "{seq}", meta = "O#{owner}" }
key = { id = "E|{kind}|{dev}|{bucket(@ts, day)}|{shard(seq, 32):02}", at = "{seq}|{owner}" }
set = { region = "{region}", G = "{@ts}#{dev}" }
[[rule]]
name = "whole"
match = { PK = "USER#{u}" }
key = { id = "U|{u}", at = "{@SK}" }
"#;

/// The same key schema on both sides: a rule that keeps the key, a rule that
/// re-keys, and copies.
const KEEPING: &str = r#"
[source]
table = "s"
partition_key = "PK"
sort_key = "SK"
[target]
table = "t"
partition_key = "PK"
sort_key = "SK"
[options]
unmatched = "copy"
[[rule]]
name = "tag"
match = { PK = "ITEM#{i}", SK = "TAG#{t}" }
set = { GSI = "{t}#{i}" }
[[rule]]
name = "move"
match = { PK = "OLD#{o}", SK = "{s}" }
key = { PK = "NEW#{o}", SK = "{s}" }
"#;

fn synthetic(text: &str) -> Plan {
    Plan::parse(text, Path::new("synthetic.toml")).unwrap()
}

static SYNTHETIC: LazyLock<Vec<Plan>> =
    LazyLock::new(|| vec![synthetic(KITCHEN), synthetic(KEEPING)]);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every example plan: each rule reversible with the round trip holding,
    /// or reported irreversible and rejecting.
    #[test]
    fn the_example_plans_round_trip_or_say_why_not(plan in 0usize..5, rule in 0usize..4, d in draw()) {
        let plan = &EXAMPLES[plan % EXAMPLES.len()];
        check_round_trip(plan, &source_item(plan, rule, &d, &[]))?;
    }

    /// Reversible plans with every kind of part round-trip exactly, as long as
    /// a capture does not hold the `|` the target key separates it with.
    #[test]
    fn reversible_plans_round_trip_exactly(plan in 0usize..2, rule in 0usize..3, d in draw()) {
        let plan = &SYNTHETIC[plan];
        prop_assert!(reversibility(plan).iter().all(|r| r.reversible()), "{:?}", reversibility(plan));
        check_round_trip(plan, &source_item(plan, rule, &d, &['|']))?;
    }

    /// With `|` inside captures a target key can have two source items: the
    /// inverse then rejects it, and never answers with the wrong one.
    #[test]
    fn the_inverse_is_never_wrong(plan in 0usize..2, rule in 0usize..3, d in draw()) {
        let plan = &SYNTHETIC[plan];
        let source = source_item(plan, rule, &d, &[]);
        if let Outcome::Put { item: target, .. } = transform(plan, &source) {
            let back = inverse(plan, &target);
            prop_assert!(
                matches!(&back, InverseOutcome::Put { item, .. } if *item == source)
                    || matches!(&back, InverseOutcome::Reject(r) if matches!(r.reason, InverseReason::AmbiguousSource { .. })),
                "{:?} from {:?}", back, target
            );
        }
    }
}
