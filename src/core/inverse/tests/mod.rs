//! The inverse's unit tests: one table of cases per question — which rules
//! are reversible and why not, which target items are reverse rejects and
//! why — then the example plans. The round-trip properties are in `roundtrip`.

mod roundtrip;

use std::path::Path;

use super::*;
use crate::core::hash::{HashFn, shard};
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

fn reasons(plan: &Plan, rule: &str) -> Vec<Irreversible> {
    reversibility(plan)
        .into_iter()
        .find(|r| r.rule == rule)
        .unwrap_or_else(|| panic!("no rule {rule}"))
        .reasons
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

/// (case, options, rules, rule, what `reversibility` says: None = reversible,
/// else a piece of the reason, and a piece of the fix).
type Case = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
);

#[test]
fn each_reason_a_rule_is_not_reversible_and_what_to_change() {
    let cases: &[Case] = &[
        (
            "a capture no target key carries",
            "",
            r#"[[rule]]
name = "case"
match = { PK = "TENANT#{tenant}", SK = "CASE#{case_id}" }
key = { PK = "CASE#{case_id}", SK = "CASE" }"#,
            "case",
            Some((
                "capture `tenant` (from PK = \"TENANT#{tenant}\") is in no target key and no kept attribute",
                "set = { tenant = \"{tenant}\" }",
            )),
        ),
        (
            "the same capture, kept by a set attribute",
            "",
            r#"[[rule]]
name = "case"
match = { PK = "TENANT#{tenant}", SK = "CASE#{case_id}" }
key = { PK = "CASE#{case_id}", SK = "CASE" }
set = { tenant = "{tenant}" }"#,
            "case",
            None,
        ),
        (
            "a capture kept only padded",
            "",
            r#"[[rule]]
name = "n"
match = { PK = "A#{id}", SK = "B" }
key = { PK = "A#{id:05}", SK = "B" }"#,
            "n",
            Some((
                "`PK` has it only padded (`{id:05}`)",
                "put `{id}` (unpadded)",
            )),
        ),
        (
            "a capture carried by a matched attribute the target keeps",
            "",
            r#"[[rule]]
name = "k"
match = { PK = "A#{a}", SK = "B#{b}", kind = "K#{k}" }
key = { PK = "A#{a}", SK = "B#{b}#{k}" }"#,
            "k",
            None,
        ),
        (
            "a source key attribute with no shape, not carried",
            "",
            r#"[[rule]]
name = "k"
match = { PK = "A#{a}" }
key = { PK = "A#{a}", SK = "X" }"#,
            "k",
            Some((
                "source key attribute `SK` has no shape",
                "`{@SK}` in a target key",
            )),
        ),
        (
            "a source key attribute carried whole",
            "",
            r#"[[rule]]
name = "k"
match = { PK = "A#{a}" }
key = { PK = "A#{a}", SK = "S#{@SK}" }"#,
            "k",
            None,
        ),
        (
            "an attribute options.drop removes",
            "drop = [\"debug\"]",
            ORDER,
            "order",
            Some((
                "`debug` is removed by `[options] drop`",
                "take `debug` out of `[options] drop`",
            )),
        ),
        (
            "an attribute the rule removes",
            "",
            r#"[[rule]]
name = "r"
match = { PK = "A#{a}", SK = "B#{b}" }
key = { PK = "B#{b}", SK = "A#{a}" }
remove = ["tmp"]"#,
            "r",
            Some((
                "`tmp` is removed by the rule's `remove`",
                "take `tmp` out of the rule's `remove`",
            )),
        ),
        (
            "an attribute the rule reads and overwrites",
            "",
            r#"[[rule]]
name = "w"
match = { PK = "A#{a}", SK = "B#{b}" }
key = { PK = "B#{b}", SK = "A#{a}" }
set = { status = "{a}", G = "{@status}" }"#,
            "w",
            Some((
                "reads `status`, but the rule's `set` writes over it",
                "another name than `status`",
            )),
        ),
        (
            "two captures side by side",
            "",
            r#"[[rule]]
name = "adj"
match = { PK = "A#{a}#{b}", SK = "X" }
key = { PK = "{a}{b}", SK = "X" }"#,
            "adj",
            Some((
                "`PK`'s template puts `{a}` and `{b}` side by side",
                "`{a}#{b}`",
            )),
        ),
        (
            "an unpadded shard next to a capture",
            "",
            r#"[[rule]]
name = "adj"
match = { PK = "A#{a}", SK = "X" }
key = { PK = "{shard(a, 16)}{a}", SK = "X" }"#,
            "adj",
            Some((
                "puts `{shard(a, 16)}` and `{a}` side by side",
                "literal text",
            )),
        ),
        (
            "a padded shard next to a capture is fixed width",
            "",
            r#"[[rule]]
name = "adj"
match = { PK = "A#{a}", SK = "X" }
key = { PK = "{shard(a, 16):02}{a}", SK = "X" }"#,
            "adj",
            None,
        ),
        (
            "two rules whose target keys overlap",
            "",
            r#"[[rule]]
name = "one"
match = { PK = "A#{a}", SK = "B#{b}" }
key = { PK = "X#{a}", SK = "{b}" }
[[rule]]
name = "two"
match = { PK = "C#{c}", SK = "Y" }
key = { PK = "{c}", SK = "Y" }"#,
            "two",
            Some((
                "can take the same values as rule `one`'s",
                "a prefix such as `ORDER#`",
            )),
        ),
    ];
    for (name, options, rules, rule, want) in cases {
        let p = plan_with(options, rules);
        let got = reasons(&p, rule);
        match want {
            None => assert!(got.is_empty(), "{name}: {got:?}"),
            Some((reason, fix)) => {
                assert!(
                    got.iter().any(|r| r.to_string().contains(reason)),
                    "{name}: {:?}",
                    got.iter().map(ToString::to_string).collect::<Vec<_>>()
                );
                assert!(
                    got.iter().any(|r| r.fix().contains(fix)),
                    "{name}: {:?}",
                    got.iter().map(Irreversible::fix).collect::<Vec<_>>()
                );
            }
        }
    }
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

const AMBIGUOUS: &str = r#"[[rule]]
name = "one"
match = { PK = "A#{a}", SK = "B#{b}" }
key = { PK = "X#{a}", SK = "{b}" }
[[rule]]
name = "two"
match = { PK = "C#{c}", SK = "Y" }
key = { PK = "{c}", SK = "Y" }"#;

const SEPARATORS: &str = r#"[[rule]]
name = "sep"
match = { PK = "A#{a}#B#{b}", SK = "X" }
key = { PK = "{a}#{b}", SK = "X" }"#;

const CASES: &str = r#"[[rule]]
name = "task"
match = { PK = "TENANT#{tenant}", SK = "CASE#{case_id}#TASK#{task_id}" }
key = { PK = "CASE#{case_id}#TASKS", SK = "TASK#{task_id}" }
set = { tenant = "{tenant}" }
[[rule]]
name = "case"
match = { PK = "TENANT#{tenant}", SK = "CASE#{case_id}" }
key = { PK = "CASE#{case_id}", SK = "CASE" }
set = { tenant = "{tenant}" }
[[rule]]
name = "lost"
match = { PK = "TENANT#{tenant}", SK = "NOTE#{n}" }
key = { PK = "NOTE#{n}", SK = "NOTE" }
[[rule]]
name = "due"
match = { PK = "DUE#{d}", SK = "X" }
key = { PK = "DUE#{d}#{bucket(@due, day)}", SK = "X" }"#;

/// A predicate on the reason of a reverse reject.
type Want = fn(&InverseReason) -> bool;

#[test]
fn each_reverse_reject_says_why() {
    let p = orders();
    let target = put(&p, &order());
    let right = shard(HashFn::Fnv1a32, "o-42", 16);
    let wrong_shard = {
        let mut t = target.clone();
        let pk = format!("TENANT#acme#DAY#2026-07-07#SHARD#{:02}", (right + 1) % 16);
        t.insert("PK".into(), Value::S(pk));
        t
    };
    let wrong_prefix = {
        let mut t = target.clone();
        t.insert("old_SK".into(), Value::S("ORDER#o-41".into()));
        t
    };
    let copy = plan_with("unmatched = \"copy\"", ORDER);
    let cases: Vec<(&str, Plan, Item, Option<&str>, Want)> = vec![
        (
            "a shard that is not the order id's",
            p.clone(),
            wrong_shard,
            Some("order"),
            |r| matches!(r, InverseReason::ComputedMismatch { attr, part, .. } if attr == "PK" && part == "{shard(order_id, 16):02}"),
        ),
        (
            "a prefix copy naming another source item",
            p.clone(),
            wrong_prefix,
            Some("order"),
            |r| matches!(r, InverseReason::PrefixMismatch { attr, held, rebuilt } if attr == "old_SK" && held == "ORDER#o-41" && rebuilt == "ORDER#o-42"),
        ),
        (
            "two rules' target shapes",
            plan_with("", AMBIGUOUS),
            item(r#"{"PK":{"S":"X#1"},"SK":{"S":"Y"}}"#),
            None,
            |r| *r == InverseReason::AmbiguousRule(vec!["one".into(), "two".into()]),
        ),
        (
            "two source items for one target key",
            plan_with("", SEPARATORS),
            item(r#"{"PK":{"S":"x#y#z"},"SK":{"S":"X"}}"#),
            Some("sep"),
            |r| matches!(r, InverseReason::AmbiguousSource { keys } if keys == &["PK=A#x#B#y#z SK=X", "PK=A#x#y#B#z SK=X"]),
        ),
        (
            "a rule that loses a capture",
            plan_with("", CASES),
            item(r#"{"PK":{"S":"NOTE#1"},"SK":{"S":"NOTE"}}"#),
            Some("lost"),
            |r| matches!(r, InverseReason::Irreversible(why) if matches!(&why[0], Irreversible::LostCapture { capture, .. } if capture == "tenant")),
        ),
        (
            "the set attribute carrying a capture is missing",
            plan_with("", CASES),
            item(r#"{"PK":{"S":"CASE#1"},"SK":{"S":"CASE"}}"#),
            Some("case"),
            |r| {
                *r == InverseReason::Carrier {
                    attr: "tenant".into(),
                }
            },
        ),
        (
            "a key read back as an earlier rule's source item",
            plan_with("", CASES),
            item(r#"{"PK":{"S":"CASE#1#TASK#2"},"SK":{"S":"CASE"},"tenant":{"S":"t"}}"#),
            Some("case"),
            |r| {
                *r == InverseReason::NotAPreimage {
                    why: "would be re-keyed by rule `task`".into(),
                }
            },
        ),
        (
            "a kept attribute a key part needs is missing",
            plan_with("", CASES),
            item(r#"{"PK":{"S":"DUE#1#2026-07-07"},"SK":{"S":"X"}}"#),
            Some("due"),
            |r| matches!(r, InverseReason::Render { attr, error: RenderError::MissingAttribute(a) } if attr == "PK" && a == "due"),
        ),
        (
            "no rule's target shapes",
            p.clone(),
            item(r#"{"PK":{"S":"USER#1"},"SK":{"S":"X"}}"#),
            None,
            |r| *r == InverseReason::NoRuleMatched,
        ),
        (
            "copy, but a rule would re-key it",
            copy.clone(),
            item(r#"{"PK":{"S":"TENANT#a#DAY#d"},"SK":{"S":"ORDER#1"}}"#),
            None,
            |r| {
                *r == InverseReason::NotACopy {
                    rule: "order".into(),
                }
            },
        ),
        (
            "no target key",
            p.clone(),
            item(r#"{"PK":{"S":"TENANT#a"}}"#),
            None,
            |r| *r == InverseReason::MissingTargetKey("SK".into()),
        ),
    ];
    for (name, plan, target, rule, want) in cases {
        match inverse(&plan, &target) {
            InverseOutcome::Reject(r) => {
                assert!(want(&r.reason), "{name}: {:?} — {r}", r.reason);
                assert_eq!(r.rule.as_deref(), rule, "{name}");
                assert!(!r.to_string().is_empty() && !r.reason.kind().is_empty());
            }
            other => panic!("{name}: {other:?}"),
        }
    }
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

/// A rule's name and, if it is not reversible, a piece of its one reason.
type Expected = &'static [(&'static str, Option<&'static str>)];

/// What each example plan's rules report.
#[test]
fn the_example_plans_report_per_rule() {
    let want: &[(&str, Expected)] = &[
        ("device-day.toml", &[("reading", None)]),
        (
            "event-hour-shard.toml",
            &[(
                "event",
                Some("`ingest_debug` is removed by `[options] drop`"),
            )],
        ),
        (
            "single-table-case.toml",
            &[
                ("task", None),
                ("event", Some("capture `tenant`")),
                ("case", None),
            ],
        ),
        ("status-gsi-in-place.toml", &[("task", Some("in place"))]),
        (
            "tenant-day-shard.toml",
            &[("order", None), ("tenant-profile", None)],
        ),
    ];
    for (file, rules) in want {
        let p = Plan::load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("plans")
                .join(file),
        )
        .unwrap();
        let got = reversibility(&p);
        assert_eq!(got.len(), rules.len(), "{file}");
        for (r, (name, reason)) in got.iter().zip(rules.iter()) {
            assert_eq!(r.rule, *name, "{file}");
            match reason {
                None => assert!(r.reversible(), "{file} {name}: {:?}", r.reasons),
                Some(why) => assert!(
                    r.reasons.len() == 1 && r.reasons[0].to_string().contains(why),
                    "{file} {name}: {:?}",
                    r.reasons
                ),
            }
        }
    }
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
