//! The inverse's unit tests. Which rules are reversible and why not (and the
//! example plans' reports), and which target items are reverse rejects and
//! why, are fixture files with their expected output
//! (`tests/fixtures/inverse/`, read by the two `fixtures_…` tests here);
//! focused cases stay code. The round-trip properties are in `roundtrip`.

mod roundtrip;

use std::path::Path;

use super::*;
use crate::core::fixture;
use crate::core::transform::{Outcome, transform};

/// A plan from `orders` (PK, SK) to `orders_v2` (PK, SK) with these options and rules.
fn plan_with(options: &str, rules: &str) -> Plan {
    let text = format!(
        "[source]\ntable = \"orders\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
         [target]\ntable = \"orders_v2\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
         [options]\n{options}\n{rules}"
    );
    Plan::parse(&text, Path::new("t.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

const ORDER: &str = r#"
[[rule]]
name = "order"
match = { PK = "TENANT#{tenant}#DAY#{day}", SK = "ORDER#{order_id}" }
key = { PK = "TENANT#{tenant}#DAY#{day}#SHARD#{shard(order_id,16):02}", SK = "ORDER#{order_id}" }
set = { GSI1PK = "T#{tenant}#S#{@status}" }
[[rule]]
name = "profile"
match = { PK = "TENANT#{tenant}", SK = "PROFILE" }
key = { PK = "TENANT#{tenant}", SK = "PROFILE" }
"#;

fn orders() -> Plan {
    plan_with("source_key_prefix = \"old_\"", ORDER)
}

fn item(json: &str) -> Item {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn order() -> Item {
    item(
        r#"{"PK":{"S":"TENANT#acme#DAY#2026-07-07"},"SK":{"S":"ORDER#o-42"},"status":{"S":"OPEN"},
           "total":{"N":"12.50"},"tags":{"SS":["a","b"]},"blob":{"B":"AAEC"},"meta":{"M":{"x":{"L":[{"NULL":true}]}}}}"#,
    )
}

fn put(plan: &Plan, source: &Item) -> Item {
    match transform(plan, source) {
        Outcome::Put { item, .. } => item,
        other => panic!("not a put: {other:?}"),
    }
}

#[test]
fn an_order_reverses_to_its_source_item_exactly_with_or_without_the_prefix_copies() {
    let p = orders();
    let target = put(&p, &order());
    assert!(target.contains_key("old_PK") && target.contains_key("GSI1PK"));
    assert_eq!(
        inverse(&p, &target),
        InverseOutcome::Put {
            rule: Some(0),
            item: order()
        }
    );
    // Written by the application after cutover: no `old_` copies.
    let mut app = target.clone();
    app.remove("old_PK");
    app.remove("old_SK");
    assert_eq!(
        inverse(&p, &app),
        InverseOutcome::Put {
            rule: Some(0),
            item: order()
        }
    );
    let profile = item(r#"{"PK":{"S":"TENANT#日本#x"},"SK":{"S":"PROFILE"},"n":{"N":"1"}}"#);
    assert_eq!(
        inverse(&p, &put(&p, &profile)),
        InverseOutcome::Put {
            rule: Some(1),
            item: profile
        }
    );
}

#[test]
fn literal_text_keeps_two_rules_apart_and_in_place_has_nothing_to_reverse() {
    assert!(reversibility(&orders()).iter().all(|r| r.reversible()));
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("plans/status-gsi-in-place.toml"),
    )
    .unwrap();
    let p = Plan::parse(&text, Path::new("p")).unwrap();
    let r = reversibility(&p);
    assert_eq!(r[0].reasons, vec![Irreversible::InPlace]);
    assert!(r[0].reasons[0].fix().contains("rekey undo"));
    assert_eq!(
        inverse(&p, &order()),
        InverseOutcome::Reject(InverseReject {
            rule: None,
            reason: InverseReason::InPlace
        })
    );
}

#[test]
fn copied_items_reverse_to_themselves_and_markers_are_skipped() {
    let copy = plan_with("unmatched = \"copy\"", ORDER);
    let setting = item(r#"{"PK":{"S":"SETTINGS"},"SK":{"S":"X"},"v":{"L":[{"N":"1"}]}}"#);
    assert_eq!(
        inverse(&copy, &setting),
        InverseOutcome::Put {
            rule: None,
            item: setting.clone()
        }
    );
    let marker = item(&format!(
        r#"{{"PK":{{"S":"{}abc"}},"SK":{{"S":"x"}}}}"#,
        crate::core::marker::MARKER_PREFIX
    ));
    assert_eq!(inverse(&orders(), &marker), InverseOutcome::Skip);
}

#[test]
fn an_item_split_two_ways_that_rebuild_one_source_item_is_not_ambiguous() {
    // `tenant` holds the `#DAY#` that follows it: the target key splits two
    // ways, and both render the same source key.
    let p = orders();
    let mut source = order();
    source.insert("PK".into(), Value::S("TENANT#a#DAY#b#DAY#c".into()));
    assert_eq!(
        inverse(&p, &put(&p, &source)),
        InverseOutcome::Put {
            rule: Some(0),
            item: source
        }
    );
}

/// A reject because the rule is not reversible.
fn irreversible(o: InverseOutcome) -> bool {
    matches!(
        o,
        InverseOutcome::Reject(InverseReject {
            reason: InverseReason::Irreversible(_),
            ..
        })
    )
}

#[test]
fn the_keys_inverter_reads_the_source_key_through_a_drop_but_not_through_a_lost_key_part() {
    // `drop` loses an attribute of every item: the full inverse refuses,
    // the keys inverter reads the key back (the item without `debug`).
    let p = plan_with("drop = [\"debug\"]", ORDER);
    let mut source = order();
    source.insert("debug".into(), Value::S("trace".into()));
    let target = put(&p, &source);
    assert!(irreversible(inverse(&p, &target)));
    match Inverter::keys(&p).invert(&target) {
        InverseOutcome::Put { rule, item } => {
            assert_eq!(rule, Some(0));
            assert_eq!(item, order(), "the source item without what drop took");
        }
        other => panic!("{other:?}"),
    }
    // A shard computed from an attribute the plan drops: not read back.
    let computed = plan_with(
        "drop = [\"region\"]",
        r#"[[rule]]
name = "by_region"
match = { PK = "TENANT#{tenant}#DAY#{day}", SK = "ORDER#{order_id}" }
key = { PK = "TENANT#{tenant}#DAY#{day}#R#{shard(@region,4)}", SK = "ORDER#{order_id}" }"#,
    );
    let mut source = order();
    source.insert("region".into(), Value::S("eu".into()));
    let target = put(&computed, &source);
    assert!(irreversible(Inverter::keys(&computed).invert(&target)));
    // A target key without the source's day: no key to read back, either way.
    let lost = plan_with(
        "",
        r#"[[rule]]
name = "no_day"
match = { PK = "TENANT#{tenant}#DAY#{day}", SK = "ORDER#{order_id}" }
key = { PK = "TENANT#{tenant}", SK = "ORDER#{order_id}" }"#,
    );
    let target = put(&lost, &order());
    assert!(irreversible(Inverter::keys(&lost).invert(&target)));
}

/// What `rekey check` knows of a plan's rules: each reversible, or each
/// reason it is not with what to change.
fn reversibility_report(plan: &Plan) -> String {
    let mut out = String::new();
    for r in reversibility(plan) {
        if r.reversible() {
            out += &format!("rule `{}`: reversible\n", r.rule);
        } else {
            out += &format!("rule `{}`: not reversible\n", r.rule);
            for why in &r.reasons {
                out += &format!("  - {why}\n    fix: {}\n", why.fix());
            }
        }
    }
    out
}

/// `tests/fixtures/inverse/reversibility/<case>.toml` (a plan) →
/// `<case>.expected`, and every example plan `plans/<plan>.toml` →
/// `tests/fixtures/inverse/example-plans/<plan>.expected`.
#[test]
fn fixtures_each_plans_reversibility_per_rule_with_reasons_and_fixes() {
    let mut pairs: Vec<(std::path::PathBuf, std::path::PathBuf)> =
        fixture::cases(&fixture::dir("inverse/reversibility"), ".toml")
            .into_iter()
            .map(|c| {
                let e = fixture::sibling(&c, ".toml", ".expected");
                (c, e)
            })
            .collect();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("plans");
    for plan in fixture::cases(&examples, ".toml") {
        let name = plan.file_name().unwrap().to_string_lossy().into_owned();
        let expected = fixture::sibling(
            &fixture::dir("inverse/example-plans").join(&name),
            ".toml",
            ".expected",
        );
        pairs.push((plan, expected));
    }
    let mut failures =
        fixture::strays(&fixture::dir("inverse/reversibility"), ".toml", ".expected");
    failures.extend(
        fixture::strays(&fixture::dir("inverse/example-plans"), ".toml", ".expected")
            .into_iter()
            .filter(|s| {
                // An example plan's expected file names a plan in `plans/`.
                let name = s.split(':').next().unwrap_or_default();
                let stem = Path::new(name)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .replace(".expected", ".toml");
                !examples.join(stem).exists()
            }),
    );
    for (case, expected) in &pairs {
        let plan = Plan::load(case).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        failures.extend(fixture::compare(expected, &reversibility_report(&plan)));
    }
    fixture::finish("reversibility fixtures", pairs.len(), 13 + 5, &failures);
}

/// What `inverse` gives for a target item: a reject's rule, kind, message
/// and reason in full; any other outcome as it is.
fn outcome_text(o: &InverseOutcome) -> String {
    match o {
        InverseOutcome::Reject(r) => format!(
            "reject\nrule: {}\nkind: {}\nmessage: {r}\nreason: {:?}\n",
            r.rule.as_deref().unwrap_or("-"),
            r.reason.kind(),
            r.reason
        ),
        other => format!("{other:#?}\n"),
    }
}

/// `tests/fixtures/inverse/rejects/<case>.toml` (a plan) and
/// `<case>.item.json` (a target item, DynamoDB JSON) → `<case>.expected`.
#[test]
fn fixtures_each_reverse_reject_says_why() {
    let dir = fixture::dir("inverse/rejects");
    let cases = fixture::cases(&dir, ".toml");
    let mut failures = fixture::strays(&dir, ".toml", ".expected");
    failures.extend(fixture::strays(&dir, ".toml", ".item.json"));
    for case in &cases {
        let plan = Plan::load(case).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        let item_file = fixture::sibling(case, ".toml", ".item.json");
        let target = item(
            &std::fs::read_to_string(&item_file)
                .unwrap_or_else(|e| panic!("{}: {e}", item_file.display())),
        );
        let expected = fixture::sibling(case, ".toml", ".expected");
        failures.extend(fixture::compare(
            &expected,
            &outcome_text(&inverse(&plan, &target)),
        ));
    }
    fixture::finish("reverse reject fixtures", cases.len(), 11, &failures);
}
