//! `rekey analyze` on a real DynamoDB: a seeded table whose collisions,
//! unmatched items and hottest key are known by construction, and whose new
//! key distribution is checked against an in-memory oracle.

use std::collections::{HashMap, HashSet};

use rekey::core::plan::{KeyAttr, KeySchema};
use rekey::core::transform::{Outcome, transform};
use rekey::core::value::{Item, ScalarType};
use rekey::ops::redact::{PlanRedactor, Redactor};
use serde_json::Value as Json;

use crate::support::plan::tenant_days;
use crate::support::workload::{colliding, unmatched};
use crate::support::*;

/// Orders sharded per tenant-day with a status index, and collisions.
fn orders_plan(source: &str, target: &str) -> PlanText {
    tenant_days(source, target, "STATUS#{@status}").index("GSI1", "GSI1PK")
}

fn order(t: &str, id: usize, status: Option<&str>) -> Item {
    let mut i = Item::new();
    i.insert("PK".into(), s(&format!("T#{t}#D#2026-07-07")));
    i.insert("SK".into(), s(&format!("O#{id}")));
    if let Some(st) = status {
        i.insert("status".into(), s(st));
    }
    i.insert(
        "total".into(),
        rekey::core::value::Value::N(format!("{id}.5")),
    );
    i
}

fn seed() -> Vec<Item> {
    let mut items = Vec::new();
    // The hot key: 600 orders of one tenant-day, 5 of them without a status.
    for id in 0..600 {
        items.push(order(
            "big",
            id,
            if id < 5 {
                None
            } else {
                Some(if id % 3 == 0 { "OPEN" } else { "DONE" })
            },
        ));
    }
    // 40 ordinary tenants with 10 orders each.
    for t in 0..40 {
        for id in 0..10 {
            items.push(order(&format!("t{t}"), 1000 + id, Some("DONE")));
        }
    }
    // Collisions: C#a's 4 items and C#b's 2 items each map to one target key; C#c is alone.
    items.extend(colliding(&[("a", 4), ("b", 2), ("c", 1)]));
    items.extend(unmatched(9));
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_reports_exact_counts_on_a_seeded_table() {
    let env = TestEnv::start().await;
    let table = env.table_name("orders");
    env.create_table(&table, &pk_sk()).await;
    let items = seed();
    env.put(&table, &items).await;

    let (plan_path, plan) = orders_plan(&table, "orders_v2").write(&env);
    let rejects = env.dir.path().join("rejects.jsonl");
    // Small pages and several segments: pagination and parallelism are exercised.
    let out = env.rekey(&[
        "analyze",
        plan_path.to_str().unwrap(),
        "--json",
        "--segments",
        "3",
        "--page-size",
        "50",
        "--top",
        "3",
        "--app-write-rate",
        "2000",
        "--spill-memory",
        "1",
        "--rejects",
        rejects.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "analyze failed: {}", stderr(&out));
    let r: Json = serde_json::from_str(&stdout(&out)).expect("analyze --json prints JSON");

    // Known by construction.
    assert_eq!(r["scanned"], 1016);
    assert_eq!(r["matched"][0]["rule"], "order");
    assert_eq!(r["matched"][0]["items"], 995);
    assert_eq!(r["matched"][1]["items"], 7);
    assert_eq!(r["rejected"], 14);
    assert_eq!(r["skipped"], 0);
    let reasons: HashMap<String, u64> = r["reject_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["reason"].as_str().unwrap().to_string(),
                x["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(reasons["no rule matched"], 9);
    assert_eq!(reasons["`GSI1PK`: attribute `status` is missing"], 5);
    assert_eq!(r["collisions"]["target_keys"], 2);
    assert_eq!(r["collisions"]["source_items"], 6);
    assert_eq!(r["old"]["cardinality"], 1 + 40 + 3 + 9);
    // Keys are redacted by default: the plan's shape stays, captured values are hashed.
    let tok = rekey::ops::redact::token;
    assert_eq!(
        r["old"]["hottest_by_items"][0]["key"],
        format!("T#{}#D#{}", tok("big"), tok("2026-07-07"))
    );
    assert!(!stdout(&out).contains("T#big"), "no raw key in the output");
    assert_eq!(r["old"]["hottest_by_items"][0]["items"], 600);
    // 600 of 1016 items at 2000 items/s: 1181 WCU/s on one key, over the limit.
    assert_eq!(r["old"]["load"][1]["keys_over_limit"], 1);
    assert_eq!(r["new"]["load"][1]["keys_over_limit"], 0);
    let rejected_lines = std::fs::read_to_string(&rejects).unwrap().lines().count();
    assert_eq!(rejected_lines, 14, "every reject is in the rejects file");

    // The new distribution against an in-memory oracle over the same items.
    let mut per_key: HashMap<String, u64> = HashMap::new();
    let mut statuses = HashSet::new();
    let mut puts = 0;
    for it in &items {
        if let Outcome::Put { item: out, .. } = transform(&plan, it) {
            puts += 1;
            *per_key.entry(out["PK"].display_text()).or_default() += 1;
            if let Some(v) = out.get("GSI1PK") {
                statuses.insert(v.display_text());
            }
        }
    }
    assert_eq!(r["new"]["items"], puts);
    assert_eq!(r["new"]["cardinality"], per_key.len() as u64);
    let (hot_key, hot_n) = per_key
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .unwrap();
    let redactor = PlanRedactor::new(&plan, Redactor { show: false });
    assert_eq!(
        r["new"]["hottest_by_items"][0]["key"],
        redactor.target_value("PK", hot_key)
    );
    // The new design's shard stays readable: only captured values are hashed.
    let (tenant_day, shard) = hot_key.rsplit_once("#S#").unwrap();
    let (tenant, day) = tenant_day
        .strip_prefix("T#")
        .unwrap()
        .split_once("#D#")
        .unwrap();
    assert_eq!(
        r["new"]["hottest_by_items"][0]["key"],
        format!("T#{}#D#{}#S#{shard}", tok(tenant), tok(day))
    );
    assert_eq!(r["new"]["hottest_by_items"][0]["items"], *hot_n);
    assert_eq!(
        r["indexes"][0]["distribution"]["cardinality"],
        statuses.len() as u64
    );
    assert_eq!(
        r["indexes"][0]["items_without_key"], 7,
        "the collide rule sets no index key"
    );

    // --show-keys shows them as they are.
    let out = env.rekey(&[
        "analyze",
        plan_path.to_str().unwrap(),
        "--show-keys",
        "--top",
        "1",
    ]);
    assert!(out.status.success(), "analyze failed: {}", stderr(&out));
    assert!(
        stdout(&out).contains("T#big#D#2026-07-07"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains(hot_key.as_str()), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_names_a_missing_table_and_its_region() {
    let env = TestEnv::start().await;
    let (plan, _) = orders_plan("no-such-table", "t2").write(&env);
    let out = env.rekey(&["analyze", plan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("table `no-such-table` does not exist in region us-east-1"),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "printed once: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_refuses_a_plan_whose_key_is_not_the_tables() {
    let env = TestEnv::start().await;
    let table = env.table_name("orders");
    env.create_table(
        &table,
        &KeySchema {
            partition_key: KeyAttr {
                name: "id".into(),
                ty: ScalarType::N,
            },
            sort_key: None,
        },
    )
    .await;
    let (plan, _) = orders_plan(&table, "t2").write(&env);
    let out = env.rekey(&["analyze", plan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the table's key is id (N)"),
        "{}",
        stderr(&out)
    );
}
