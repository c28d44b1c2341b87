//! `rekey backfill` against DynamoDB Local: the result is exactly
//! transform(source); kill -9 anywhere and rerun converges without starting
//! over; a second driver is refused; pause holds the writes.

mod support;

use std::time::Duration;

use rekey::core::plan::Plan;
use rekey::core::value::{Item, Value};
use serde_json::Value as Json;
use support::*;

fn plan_text(source: &str, target: &str) -> String {
    format!(
        r#"
[source]
table = "{source}"
partition_key = "PK"
sort_key = "SK"

[target]
table = "{target}"
partition_key = "PK"
sort_key = "SK"

[options]
source_key_prefix = "src_"
drop = ["scratch"]

[[rule]]
name = "order"
match = {{ PK = "T#{{t}}#D#{{d}}", SK = "O#{{id}}" }}
key = {{ PK = "T#{{t}}#D#{{d}}#S#{{shard(id, 8)}}", SK = "O#{{id}}" }}
set = {{ GSI1PK = "T#{{t}}#ST#{{@status}}" }}

[[rule]]
name = "collide"
match = {{ PK = "C#{{x}}", SK = "{{y}}" }}
key = {{ PK = "C", SK = "SAME#{{x}}" }}
"#
    )
}

/// Orders of every attribute type, a hot tenant-day, collisions and unmatched items.
fn workload(n: usize) -> Vec<Item> {
    let mut items = Vec::with_capacity(n + 20);
    for i in 0..n {
        let tenant = if i % 3 == 0 {
            "hot".to_string()
        } else {
            format!("t{}", i % 50)
        };
        let text = format!(
            r#"{{"PK":{{"S":"T#{tenant}#D#2026-07-0{}"}},"SK":{{"S":"O#{i:06}"}},"status":{{"S":"{}"}},
                "total":{{"N":"{}.{:02}"}},"big":{{"N":"123456789012345678901234567890.{i}"}},
                "tags":{{"SS":["a","b{}"]}},"ns":{{"NS":["-1","{i}"]}},"raw":{{"B":"AAECAw=="}},
                "nested":{{"M":{{"l":{{"L":[{{"BOOL":true}},{{"NULL":true}},{{"S":"ü"}}]}}}}}},
                "scratch":{{"S":"dropped"}}}}"#,
            1 + i % 3,
            if i % 4 == 0 { "OPEN" } else { "DONE" },
            i,
            i % 100,
            i % 7
        );
        items.push(item(&text.replace('\n', "")));
    }
    // Two source items per target key: collisions, rejected, never overwritten.
    for x in 0..5 {
        for y in 0..2 {
            items.push(item(&format!(
                r#"{{"PK":{{"S":"C#{x}"}},"SK":{{"S":"{y}"}}}}"#
            )));
        }
    }
    for i in 0..7 {
        items.push(item(&format!(
            r#"{{"PK":{{"S":"X#{i}"}},"SK":{{"S":"?"}}}}"#
        )));
    }
    items
}

struct Setup {
    env: TestEnv,
    source: String,
    target: String,
    plan: Plan,
    plan_path: std::path::PathBuf,
    state: std::path::PathBuf,
    items: Vec<Item>,
}

async fn setup(n: usize) -> Setup {
    let env = TestEnv::start().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    let items = workload(n);
    env.put(&source, &items).await;
    let text = plan_text(&source, &target);
    let plan_path = env.file("plan.toml", &text);
    let plan = Plan::parse(&text, &plan_path).unwrap();
    let state = env.dir.path().join("state");
    Setup {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
        items,
    }
}

/// The target equals transform(source), except that of each colliding pair
/// exactly one source item won (whichever was written first).
async fn assert_exact(s: &Setup) {
    let source_now = s.env.scan_all(&s.source).await;
    let expected = expected_target(&s.plan, &source_now);
    let actual = s.env.table_map(&s.target, &["PK", "SK"]).await;
    let collide = |k: &Vec<u8>| rekey::core::value::decode_key(k)[0] == "C";
    let exp: Vec<_> = expected.iter().filter(|(k, _)| !collide(k)).collect();
    let act: Vec<_> = actual.iter().filter(|(k, _)| !collide(k)).collect();
    assert_eq!(act.len(), exp.len(), "item count");
    for ((ka, va), (ke, ve)) in act.iter().zip(&exp) {
        assert_eq!(ka, ke, "keys");
        assert_eq!(va, ve, "item {:?}", rekey::core::value::decode_key(ka));
    }
    let winners: Vec<_> = actual.iter().filter(|(k, _)| collide(k)).collect();
    assert_eq!(winners.len(), 5, "one winner per colliding target key");
    for (_, w) in winners {
        let Value::S(src) = &w["src_PK"] else {
            panic!("winner keeps its source key")
        };
        assert!(src.starts_with("C#"));
    }
}

fn backfill_args<'a>(s: &'a Setup, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "backfill",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
        "--segments",
        "4",
        "--page-size",
        "100",
        "--json",
    ];
    v.extend_from_slice(extra);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_from_scan_equals_transform_of_source() {
    let s = setup(1500).await;
    let out = s.env.rekey(&backfill_args(&s, &["--write-rate", "100000"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    let t = &r["totals"];
    eprintln!("backfill took {} s", r["elapsed_seconds"]);
    assert_eq!(t["scanned"], s.items.len() as u64);
    assert_eq!(t["rejected"], 7 + 5, "7 unmatched + 5 collisions");
    assert_eq!(t["collisions"], 5);
    assert_eq!(t["written"], 1500 + 5);
    let sum = ["written", "rejected", "skipped"]
        .iter()
        .map(|k| t[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(
        t["scanned"].as_u64().unwrap(),
        sum,
        "scanned = written + rejected + skipped"
    );
    assert!(
        r["consumed_wcu"].as_f64().unwrap() >= 1505.0,
        "accounted from ConsumedCapacity: {}",
        r["consumed_wcu"]
    );
    assert_exact(&s).await;

    // Every reject is in the rejects file, with its reason.
    let rejects = std::fs::read_to_string(s.state.join("rejects.jsonl")).unwrap();
    assert_eq!(rejects.lines().count(), 12);
    assert_eq!(rejects.matches("no rule matched").count(), 7);
    assert_eq!(
        rejects.matches("already belongs to source item C#").count(),
        5
    );

    // A rerun of a finished backfill writes nothing and changes nothing.
    let again = s.env.rekey(&backfill_args(&s, &[]));
    assert!(again.status.success(), "{}", stderr(&again));
    let r2: Json = report(&again);
    assert_eq!(r2["this_run"]["scanned"], 0);
    assert_eq!(r2["totals"], r["totals"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_then_rerun_converges_without_starting_over() {
    let s = setup(2500).await;
    let mut rng = Rng::from_time();
    // Slow enough (150 WCU/s ≈ 17 s of writes) that every kill lands mid-run.
    let args = backfill_args(&s, &["--write-rate", "150", "--concurrency", "8"]);
    let mut progress = Vec::new();
    let mut kills = 0;
    for kill in 0..6 {
        let mut child = s.env.spawn(&args);
        if kill == 0 {
            // However slow the machine, the first kill lands after a commit.
            wait_for_progress(&s.state, Duration::from_secs(120)).await;
        }
        let wait = 700 + rng.below(1500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
        let store_counts = committed_scanned(&s);
        eprintln!("kill {kill} after {wait} ms: {store_counts} items committed");
        progress.push(store_counts);
    }
    assert!(kills >= 5, "at least five kill points, got {kills}");
    assert!(
        progress.windows(2).all(|w| w[0] <= w[1]),
        "checkpoints only move forward: {progress:?}"
    );
    let before_final = *progress.last().unwrap_or(&0);
    assert!(before_final > 0, "the killed runs committed progress");
    let out = s.env.rekey(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    assert_eq!(r["resumed"], true);
    assert!(
        r["this_run"]["scanned"].as_u64().unwrap() < s.items.len() as u64,
        "the final run did not start from zero: {}",
        r["this_run"]
    );
    // Counters move with their checkpoints: every item counted exactly once.
    assert_eq!(r["totals"]["scanned"], s.items.len() as u64);
    assert_eq!(r["totals"]["rejected"], 12);
    let rejects = std::fs::read_to_string(s.state.join("rejects.jsonl")).unwrap();
    assert_eq!(
        rejects.lines().count(),
        12,
        "no duplicate rejects after crashes"
    );
    assert_exact(&s).await;
}

/// Items committed so far, read from the state store the way a resume does.
fn committed_scanned(s: &Setup) -> u64 {
    let store = rekey::state::StateStore::open(&s.state, &s.plan).expect("state store");
    store
        .get::<rekey::phase::backfill::Counters>("backfill/counters")
        .unwrap()
        .map_or(0, |c| c.scanned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_driver_is_refused_and_pause_holds_writes() {
    let s = setup(3000).await;
    let args = backfill_args(&s, &["--write-rate", "300", "--concurrency", "4"]);
    let mut first = s.env.spawn(&args);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = s.env.rekey(&args);
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("another rekey process is driving this plan"),
        "{}",
        stderr(&second)
    );
    // …and names the one that is.
    assert!(
        stderr(&second).contains(&format!("by pid {}: ", first.id()))
            && stderr(&second).contains("backfill"),
        "{}",
        stderr(&second)
    );

    let control = |flag: &str| {
        let out = s.env.rekey(&[
            "control",
            s.plan_path.to_str().unwrap(),
            "--state-dir",
            s.state.to_str().unwrap(),
            flag,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    control("--pause");
    tokio::time::sleep(Duration::from_millis(2000)).await; // the poll interval plus in-flight writes
    let a = s.env.scan_all(&s.target).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b = s.env.scan_all(&s.target).await.len();
    assert_eq!(a, b, "no writes while paused");
    assert!(first.try_wait().unwrap().is_none(), "still running, paused");
    control("--resume");
    let out = s.env.rekey(&[
        "control",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
        "--write-rate",
        "100000",
    ]);
    assert!(out.status.success());
    let status = first.wait().unwrap();
    assert!(status.success());
    assert_exact(&s).await;
}
