//! `rekey suggest TABLE` on the local server: on the demo's own data it
//! proposes the tenant-day-shard design with the shard count its printed
//! numbers justify; on tables shaped like the other example plans it
//! proposes rules that match the same shapes; every plan it writes passes
//! `rekey check`, and `rekey analyze` at the same rate finds no key over the
//! limit. Unusual tables get a clear answer and no plan. A suggested plan
//! migrates the demo's table, and `rekey query` reads a tenant's day back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rekey::core::plan::{KeyAttr, KeySchema, Plan};
use rekey::core::value::{Item, ScalarType, Value};
use serde_json::Value as Json;

use crate::support::*;

/// A shape with its capture names (and functions) blanked: `TENANT#{}#DAY#{}`.
fn blank(template: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in template.chars() {
        match c {
            '{' => {
                if depth == 0 {
                    out.push_str("{}");
                }
                depth += 1;
            }
            '}' => depth -= 1,
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// A rule's (match PK, match SK) and new PK, blanked.
type BlankRule = (String, String, String);

/// A plan file's rules, blanked, in order.
fn plan_rules(path: &Path) -> Vec<BlankRule> {
    let text = std::fs::read_to_string(path).unwrap();
    Plan::parse(&text, path).unwrap_or_else(|e| panic!("{e}"));
    let doc: toml::Value = toml::from_str(&text).unwrap();
    let get = |r: &toml::Value, table: &str, attr: &str| {
        blank(
            r.get(table)
                .and_then(|t| t.get(attr))
                .and_then(|v| v.as_str())
                .unwrap_or(""),
        )
    };
    doc["rule"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                get(r, "match", "PK"),
                get(r, "match", "SK"),
                get(r, "key", "PK"),
            )
        })
        .collect()
}

fn example_plan(name: &str) -> std::path::PathBuf {
    repo_path(&format!("plans/{name}"))
}

/// `rekey suggest` with `-o`, its JSON report and the plan it wrote.
fn suggest(env: &TestEnv, table: &str, rate: &str, extra: &[&str]) -> (Json, std::path::PathBuf) {
    let out_path = env.dir.path().join(format!("{table}.toml"));
    let mut args = vec![
        "suggest",
        table,
        "--json",
        "--app-write-rate",
        rate,
        "-o",
        out_path.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = env.rekey(&args);
    assert!(
        out.status.success(),
        "suggest failed: {}\n{}",
        stderr(&out),
        stdout(&out)
    );
    let r: Json = serde_json::from_str(&stdout(&out)).expect("suggest --json prints JSON");
    (r, out_path)
}

/// The written plan passes `rekey check`, and analyze at `rate` finds keys
/// over the limit in the old design and none in the new one.
fn check_and_analyze(env: &TestEnv, plan: &Path, rate: &str) {
    let p = plan.to_str().unwrap();
    let out = env.rekey(&["check", p]);
    assert!(
        out.status.success(),
        "check: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = env.rekey(&["analyze", p, "--json", "--app-write-rate", rate]);
    assert!(out.status.success(), "analyze: {}", stderr(&out));
    let a: Json = serde_json::from_str(&stdout(&out)).expect("analyze --json prints JSON");
    assert_eq!(a["old"]["load"][1]["scenario"], "application");
    assert!(
        a["old"]["load"][1]["keys_over_limit"].as_u64().unwrap() > 0,
        "{}",
        a["old"]["load"]
    );
    assert_eq!(
        a["new"]["load"][1]["keys_over_limit"], 0,
        "{}",
        a["new"]["load"]
    );
    assert_eq!(a["rejected"], 0);
    assert_eq!(a["collisions"]["target_keys"], 0);
}

/// The shard count a shape's printed numbers justify: the smallest power of
/// two at or over load / budget, where load = rate × the hottest key's share.
fn justified_shards(r: &Json, shape: &Json) -> u64 {
    let load = r["write_rate"].as_f64().unwrap() * shape["hottest_write_share"].as_f64().unwrap();
    assert!((load - shape["write_load"].as_f64().unwrap()).abs() < 1e-6);
    let needed = load / r["write_budget"].as_f64().unwrap();
    assert!((needed - shape["needed"].as_f64().unwrap()).abs() < 1e-9);
    let n = (needed.ceil() as u64).next_power_of_two();
    assert!(n as f64 >= needed && (n == 1 || ((n / 2) as f64) < needed));
    n
}

fn sorted(mut v: Vec<BlankRule>) -> Vec<BlankRule> {
    v.sort();
    v
}

fn suggested_rules(r: &Json) -> Vec<BlankRule> {
    r["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["action"]["kind"] == "shard")
        .map(|s| {
            let rule = &s["rule"];
            let b = |v: &Json| blank(v.as_str().unwrap_or(""));
            (
                b(&rule["match_pk"]),
                b(&rule["match_sk"]),
                b(&rule["key_pk"]),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_demo_table_suggest_proposes_the_tenant_day_shard_plan() {
    let env = TestEnv::start().await;
    let table = env.table_name("orders");
    env.create_table(&table, &pk_sk()).await;
    // The demo's own data: 100 tenant profiles and skewed orders.
    let items = rekey::ops::demo::generate(2000);
    env.put(&table, &items).await;

    let (r, plan_path) = suggest(&env, &table, "20000", &["--segments", "3"]);
    assert_eq!(r["verdict"]["kind"], "plan", "{r:#}");
    assert_eq!(r["sampled"], 2100);
    assert_eq!(r["whole_table"], true);
    assert_eq!(r["write_budget"], 500.0, "1,000 WCU/s less 50 % headroom");
    let order = &r["shapes"][0];
    assert_eq!(order["pk"], "TENANT#{tenant}#DAY#{day}");
    assert_eq!(order["sk"], "ORDER#{order}");
    // The numbers printed justify the count, and at this rate it is the example's 16.
    let n = justified_shards(&r, order);
    assert_eq!(order["action"]["shards"], n);
    assert_eq!(n, 16, "{order:#}");
    assert!(
        order["notes"].to_string().contains("becomes 16 queries"),
        "the read cost is printed: {}",
        order["notes"]
    );
    // The hot key is redacted: its literals stay, its captures are hashed.
    let hot = order["hottest_key"].as_str().unwrap();
    assert!(
        hot.starts_with("TENANT#‹") && hot.contains("#DAY#‹"),
        "{hot}"
    );
    // The table's hottest keys, hottest first: the same key, under its shape.
    assert_eq!(r["hot_keys"][0]["key"], hot);
    assert_eq!(r["hot_keys"][0]["shape"], order["pk"]);
    assert_eq!(r["hot_keys"].as_array().unwrap().len(), 5);
    let profile = &r["shapes"][1];
    assert_eq!(
        (profile["pk"].as_str(), profile["sk"].as_str()),
        (Some("TENANT#{tenant}"), Some("PROFILE"))
    );
    assert_eq!(profile["action"]["kind"], "no_rule");

    // The same design as plans/tenant-day-shard.toml: the order rule's shapes
    // and new key, and the profiles unchanged (there an identity rule, here copied).
    let example = plan_rules(&example_plan("tenant-day-shard.toml"));
    assert_eq!(suggested_rules(&r), vec![example[0].clone()]);
    assert_eq!(example[1].0, blank("TENANT#{tenant}"));
    assert_eq!(
        example[1].0, example[1].2,
        "the example keeps profiles as they are"
    );
    assert_eq!(plan_rules(&plan_path), vec![example[0].clone()]);
    let text = std::fs::read_to_string(&plan_path).unwrap();
    assert!(text.contains("no rule needed"), "{text}");
    assert!(text.contains("{shard(order, 16):02}"), "{text}");
    check_and_analyze(&env, &plan_path, "20000");
    migrate_and_query_back(&env, &table, &items, &plan_path).await;

    // The text report prints the numbers behind the count.
    let out = env.rekey(&["suggest", &table, "--app-write-rate", "20000", "-q"]);
    let text = stdout(&out);
    assert!(
        text.contains("shards needed → 16 (the next power of two)"),
        "{text}"
    );
    assert!(!text.contains("pathological"), "no raw key value: {text}");

    // A sample: the Scan stops once it holds 500 items, and says it read a sample.
    let (r, _) = suggest(
        &env,
        &table,
        "20000",
        &["--sample", "500", "--page-size", "25", "--segments", "2"],
    );
    assert_eq!(r["sampled"], 500, "{r:#}");
    assert_eq!(r["whole_table"], false);
    assert_eq!(r["shapes"][0]["pk"], "TENANT#{tenant}#DAY#{day}");
}

/// The newcomer's path the README walks, after suggest wrote `plan_path`
/// from `items` in `table`: a backfill with the plan, then the demo's
/// hottest tenant-day paged back through every shard with `rekey query`.
async fn migrate_and_query_back(env: &TestEnv, table: &str, items: &[Item], plan_path: &Path) {
    env.create_table(&format!("{table}_rekeyed"), &pk_sk())
        .await;
    let p = plan_path.to_str().unwrap();
    let state = env.dir.path().join("state");
    let out = env.rekey(&["backfill", p, "--state-dir", state.to_str().unwrap()]);
    assert!(out.status.success(), "backfill: {}", stderr(&out));

    // The demo's hottest tenant-day, and its orders in sort-key order.
    let mut days: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for i in items {
        if let (Some(Value::S(pk)), Some(Value::S(sk))) = (i.get("PK"), i.get("SK"))
            && sk.starts_with("ORDER#")
        {
            days.entry(pk.clone()).or_default().insert(sk.clone());
        }
    }
    let (pk, want) = days.into_iter().max_by_key(|(_, v)| v.len()).unwrap();
    let parts: Vec<&str> = pk.split('#').collect();
    assert_eq!((parts[0], parts[2]), ("TENANT", "DAY"), "{pk}");
    let where_ = format!("tenant={},day={}", parts[1], parts[3]);
    let mut got = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = vec![
            "--show-keys",
            "query",
            p,
            "--where",
            &where_,
            "--limit",
            "100",
            "--json",
        ];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let out = env.rekey(&args);
        assert!(out.status.success(), "query: {}", stderr(&out));
        let lines: Vec<Json> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (summary, page) = lines.split_last().unwrap();
        assert!(page.len() <= 100);
        pages += 1;
        got.extend(
            page.iter()
                .map(|i| i["SK"]["S"].as_str().unwrap().to_string()),
        );
        match summary["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert!(pages > 1, "{} orders came in one page", got.len());
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
}

fn kv(pk: &str, sk: &str) -> Item {
    let mut i = Item::new();
    i.insert("PK".into(), s(pk));
    i.insert("SK".into(), s(sk));
    i
}

/// Readings keyed by day alone (device-day.toml's source): today is hot.
fn readings() -> Vec<Item> {
    let mut v = Vec::new();
    for n in 0..900u64 {
        let day = match n % 9 {
            0 => "2026-07-05",
            1 => "2026-07-06",
            _ => "2026-07-07",
        };
        v.push(kv(
            &format!("DATE#{day}"),
            &format!("device-{:03}#{}", n % 97, 1_783_400_000 + n),
        ));
    }
    v
}

/// Events keyed by source (event-hour-shard.toml's source): one source is hot.
fn events() -> Vec<Item> {
    (0..900u64)
        .map(|n| {
            let src = if n % 3 == 0 {
                format!("s{}", n % 30)
            } else {
                "billing".into()
            };
            kv(
                &format!("SOURCE#{src}"),
                &format!("EVENT#{}#evt-{n:05}", 1_783_400_000_000 + n * 997),
            )
        })
        .collect()
}

/// A single-table case design (single-table-case.toml's source): one tenant is hot.
fn cases() -> Vec<Item> {
    let mut v = Vec::new();
    for c in 0..300u64 {
        let t = if c % 3 == 0 {
            format!("t{}", c % 20)
        } else {
            "bigco".into()
        };
        let pk = format!("TENANT#{t}");
        v.push(kv(&pk, &format!("CASE#c{c:04}")));
        v.push(kv(&pk, &format!("CASE#c{c:04}#TASK#k{c:05}")));
        v.push(kv(
            &pk,
            &format!(
                "CASE#c{c:04}#EVENT#2026-07-07T{:02}:{:02}:00Z",
                c % 24,
                c % 60
            ),
        ));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_tables_shaped_like_the_other_plans_suggest_proposes_matching_rules() {
    let env = TestEnv::start().await;
    for (prefix, items, example, rate) in [
        ("readings", readings(), "device-day.toml", "3000"),
        ("events", events(), "event-hour-shard.toml", "3000"),
        ("cases", cases(), "single-table-case.toml", "3000"),
    ] {
        let table = env.table_name(prefix);
        env.create_table(&table, &pk_sk()).await;
        env.put(&table, &items).await;
        let (r, plan_path) = suggest(&env, &table, rate, &[]);
        assert_eq!(r["verdict"]["kind"], "plan", "{prefix}: {r:#}");
        // The same source shapes as the example's rules, each justified by its numbers.
        let matches = |rules: Vec<BlankRule>| {
            sorted(
                rules
                    .into_iter()
                    .map(|(pk, sk, _)| (pk, sk, String::new()))
                    .collect(),
            )
        };
        let want = matches(plan_rules(&example_plan(example)));
        assert_eq!(matches(suggested_rules(&r)), want, "{prefix}: {r:#}");
        for shape in r["shapes"].as_array().unwrap() {
            if shape["action"]["kind"] == "shard" {
                assert_eq!(
                    shape["action"]["shards"],
                    justified_shards(&r, shape),
                    "{prefix}: {shape:#}"
                );
            }
        }
        assert_eq!(matches(plan_rules(&plan_path)), want);
        check_and_analyze(&env, &plan_path, rate);
        if prefix == "events" {
            // A time in the sort key and none in the partition key: an hour bucket with the shards,
            // the example's design.
            let ex = plan_rules(&example_plan(example));
            assert_eq!(suggested_rules(&r)[0].2, ex[0].2, "{r:#}");
            let shape = &r["shapes"][0];
            assert_eq!(shape["bucket"], "HOUR#{bucket(event, hour)}");
            assert_eq!(shape["action"]["capture"], "evt_id");
        }
    }
}

/// A single-table design whose shapes use each of the delimiters, each hot
/// on one key but the users: `TENANT#`, `{day}|STORE|` (its sort key in
/// `|`), `DEVICE:` with ISO times (their own `:`s) in `READING:`, and
/// `CATALOG/`.
fn four_delimiters() -> Vec<Item> {
    let mut v = Vec::new();
    let hex = |n: u32| format!("{:08x}", n.wrapping_mul(2_654_435_761));
    for n in 0..800u32 {
        let t = if n % 2 == 0 { 0 } else { 1 + n % 20 };
        v.push(kv(
            &format!("TENANT#t-{t:02}"),
            &format!("ORDER#{}", hex(n)),
        ));
    }
    for n in 0..600u32 {
        let (day, store) = if n % 2 == 0 {
            ("2026-07-07", 0)
        } else {
            (["2026-07-06", "2026-07-07"][n as usize / 2 % 2], 1 + n % 10)
        };
        v.push(kv(
            &format!("{day}|STORE|s-{store:02}"),
            &format!("SALE|{}", hex(n)),
        ));
    }
    for n in 0..500u32 {
        let d = if n % 2 == 0 { 0 } else { 1 + n % 25 };
        v.push(kv(
            &format!("DEVICE:d-{d:02}"),
            &format!("READING:2026-07-07T{:02}:{:02}:00Z", n / 60 % 24, n % 60),
        ));
    }
    for n in 0..400u32 {
        let c = if n % 2 == 0 { 0 } else { 1 + n % 20 };
        v.push(kv(
            &format!("CATALOG/c-{c:02}"),
            &format!("ITEM/sku-{n:05}"),
        ));
    }
    for u in 0..20 {
        v.push(kv(&format!("USER:u-{u:02}"), "PROFILE"));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suggest_finds_each_shape_of_a_single_table_mixing_delimiters() {
    let env = TestEnv::start().await;
    let table = env.table_name("mixed");
    env.create_table(&table, &pk_sk()).await;
    env.put(&table, &four_delimiters()).await;
    let (r, plan_path) = suggest(&env, &table, "6000", &[]);
    assert_eq!(r["verdict"]["kind"], "plan", "{r:#}");
    assert_eq!(r["sampled"], 2320);
    let shapes: BTreeMap<(String, String), &Json> = r["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let text = |v: &Json| v.as_str().unwrap_or("").to_string();
            ((text(&s["pk"]), text(&s["sk"])), s)
        })
        .collect();
    // Each hot shape is sharded by its id, as its numbers justify, and its new
    // key (the bucket too) is joined by the partition key's own delimiter.
    let hot = [
        ("TENANT#{tenant}", "ORDER#{order}", "TENANT#{tenant}#SHARD#"),
        (
            "{day}|STORE|{store}",
            "SALE|{sale}",
            "{day}|STORE|{store}|SHARD|",
        ),
        (
            "DEVICE:{device}",
            "READING:{reading}",
            "DEVICE:{device}:HOUR:{bucket(reading, hour)}:SHARD:",
        ),
        (
            "CATALOG/{catalog}",
            "ITEM/{item}",
            "CATALOG/{catalog}/SHARD/",
        ),
    ];
    for (pk, sk, new_pk) in hot {
        let shape = shapes
            .get(&(pk.to_string(), sk.to_string()))
            .unwrap_or_else(|| panic!("no shape {pk} / {sk}: {:?}", shapes.keys()));
        assert_eq!(shape["action"]["kind"], "shard", "{shape:#}");
        let n = justified_shards(&r, shape);
        assert!(n > 1, "{shape:#}");
        assert_eq!(shape["action"]["shards"], n, "{shape:#}");
        let capture = shape["action"]["capture"].as_str().unwrap();
        assert_eq!(
            shape["rule"]["key_pk"],
            format!("{new_pk}{{shard({capture}, {n})}}"),
            "{shape:#}"
        );
        let lit = pk.split('{').next().unwrap();
        let redacted = shape["hottest_key"].as_str().unwrap();
        assert!(redacted.starts_with(&format!("{lit}‹")), "{redacted}");
    }
    let user = &shapes[&("USER:{user}".to_string(), "PROFILE".to_string())];
    assert_eq!(user["action"]["kind"], "no_rule", "{user:#}");
    assert_eq!(shapes.len(), 5, "{:?}", shapes.keys());

    // The plan holds exactly those four rules, and passes check and analyze.
    assert_eq!(sorted(plan_rules(&plan_path)), sorted(suggested_rules(&r)));
    assert_eq!(suggested_rules(&r).len(), hot.len());
    check_and_analyze(&env, &plan_path, "6000");
}

fn numeric_key() -> KeySchema {
    KeySchema {
        partition_key: KeyAttr {
            name: "id".into(),
            ty: ScalarType::N,
        },
        sort_key: None,
    }
}

/// `rekey suggest` without `--json`: exit 0, its text, and no plan file.
fn answer(env: &TestEnv, table: &str, rate: &str) -> String {
    let plan = env.dir.path().join("never.toml");
    let out = env.rekey(&[
        "suggest",
        table,
        "--app-write-rate",
        rate,
        "-o",
        plan.to_str().unwrap(),
        "-q",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!plan.exists(), "no plan is written: {}", stdout(&out));
    stdout(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_tables_get_a_clear_answer_and_no_plan() {
    let env = TestEnv::start().await;
    // No such table: the AWS error, exit 5.
    let out = env.rekey(&["suggest", "no-such-table", "--app-write-rate", "1"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("table `no-such-table` does not exist"),
        "{}",
        stderr(&out)
    );

    let empty = env.table_name("empty");
    env.create_table(&empty, &pk_sk()).await;
    let text = answer(&env, &empty, "1000");
    assert!(text.contains("the table is empty"), "{text}");

    let numeric = env.table_name("numeric");
    env.create_table(&numeric, &numeric_key()).await;
    let items: Vec<Item> = (0..20)
        .map(|i| Item::from([("id".to_string(), Value::N(i.to_string()))]))
        .collect();
    env.put(&numeric, &items).await;
    let text = answer(&env, &numeric, "1000");
    assert!(text.contains("`id` is numeric"), "{text}");

    let flat = env.table_name("flat");
    env.create_table(&flat, &pk_sk()).await;
    let items: Vec<Item> = (0..60)
        .map(|i| kv(&format!("user{}", i % 4), &format!("{i}")))
        .collect();
    env.put(&flat, &items).await;
    let text = answer(&env, &flat, "100000");
    assert!(text.contains("no key value holds a delimiter"), "{text}");

    // A shaped table at a rate every key takes: no rule is needed, and it says so.
    let calm = env.table_name("calm");
    env.create_table(&calm, &pk_sk()).await;
    env.put(&calm, &events()).await;
    let text = answer(&env, &calm, "10");
    assert!(text.contains("no rule needed"), "{text}");
    assert!(
        text.contains("SOURCE#{source} / EVENT#{event}#{evt_id}"),
        "{text}"
    );
    // The bucket is offered all the same.
    assert!(text.contains("a time bucket"), "{text}");

    // One shape per item.
    let ragged = env.table_name("ragged");
    env.create_table(&ragged, &pk_sk()).await;
    let items: Vec<Item> = (1..30)
        .map(|i| kv(&vec!["x1"; i].join("#"), "a#1"))
        .collect();
    env.put(&ragged, &items).await;
    let text = answer(&env, &ragged, "1000");
    assert!(text.contains("about one per item"), "{text}");
}
