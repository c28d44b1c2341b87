// Seconds: 4-5 s each at load 7-9 on 2 cores, most of it the local server's start: backfills of
// 167 items (one behind a proxy that throttles the target's writes), a `run` of 20.
//! `--log-format json` (issue 28, item 3), read the way a log pipeline reads
//! it: every line of a run's stderr must parse as one JSON object with its
//! time, level, command, phase and table; each AWS request attempt is an
//! event with its request id, attempt, latency, consumed capacity and
//! whether (and why) it was throttled, and what the events add up to agrees
//! with the run's own report; the key values of rejected items appear only
//! redacted, as on the terminal, unless `--show-keys`.

use std::collections::BTreeMap;

use rekey::core::value::{Item, Value};
use rekey_testkit::proxy::{Faults, Proxy, ProxyOptions};
use serde_json::Value as Json;

use crate::support::plan::tenant_days;
use crate::support::workload::{skewed_order, with_collisions_and_unmatched};
use crate::support::*;

/// Every line of `err`, each parsed as a JSON object (a line that does not
/// parse fails the test, naming it) with the fields every line has.
fn lines(err: &str, command: &str) -> Vec<Json> {
    let lines: Vec<Json> = err
        .lines()
        .map(|l| {
            let v: Json = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v.is_object(), "{l}");
            v
        })
        .collect();
    assert!(!lines.is_empty(), "no log");
    for l in &lines {
        let time = l["time"].as_str().unwrap_or_else(|| panic!("no time: {l}"));
        chrono::DateTime::parse_from_rfc3339(time).unwrap_or_else(|e| panic!("{time}: {e}"));
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&l["level"].as_str().unwrap()),
            "{l}"
        );
        assert_eq!(l["command"], command, "{l}");
        assert!(l["phase"].is_string(), "{l}");
        assert!(l["message"].is_string(), "{l}");
        assert!(l["fields"].is_object(), "{l}");
    }
    lines
}

/// The AWS request events among `lines`.
fn requests(lines: &[Json]) -> Vec<&Json> {
    lines
        .iter()
        .filter(|l| l["target"] == "rekey::aws::trace")
        .collect()
}

/// The string key values of `items` long enough to be recognised in text.
fn key_values(items: &[Item]) -> Vec<String> {
    let mut values: Vec<String> = items
        .iter()
        .flat_map(|i| ["PK", "SK"].map(|k| i.get(k).cloned()))
        .filter_map(|v| match v {
            Some(Value::S(s)) if s.len() >= 3 => Some(s),
            _ => None,
        })
        .collect();
    values.sort();
    values.dedup();
    values
}

struct Setup {
    env: TestEnv,
    source: String,
    target: String,
    plan: std::path::PathBuf,
    items: Vec<Item>,
}

async fn setup() -> Setup {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    // 150 orders, 5 colliding pairs and 7 unmatched items (167): 12 rejects.
    let items = with_collisions_and_unmatched((0..150).map(skewed_order).collect());
    env.put(&source, &items).await;
    let (plan, _) = tenant_days(&source, &target, "T#{t}").write(&env);
    Setup {
        env,
        source,
        target,
        plan,
        items,
    }
}

/// `rekey backfill --json --log-format json -vv` through `endpoint`: the
/// report and the log's lines.
fn backfill(s: &Setup, endpoint: &str, state: &str, extra: &[&str]) -> (Json, Vec<Json>) {
    let state = s.env.dir.path().join(state);
    let mut args = vec![
        "backfill",
        s.plan.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--segments",
        "2",
        "--page-size",
        "40",
        "--json",
        "--log-format",
        "json",
        "-vv",
    ];
    args.extend_from_slice(extra);
    let out = rekey_with_env(&args, &[("AWS_ENDPOINT_URL", endpoint), ("RUST_LOG", "")]);
    assert!(out.status.success(), "{}", stderr(&out));
    (report(&out), lines(&stderr(&out), "backfill"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_backfill_logs_each_request_as_json_with_ids_capacity_and_throttles() {
    let s = setup().await;
    // The target takes 100 WCU/s with half a second of burst; rekey is asked for 1,000.
    let proxy = Proxy::start(ProxyOptions {
        upstream: s.env.server().to_string(),
        key_write_units: 1000.0,
        key_read_units: 3000.0,
        table_write_units: Some(100.0),
        table_read_units: None,
        burst_seconds: 0.5,
        faults: Faults::default(),
        shadow: s.env.shadow(),
        partitions: None,
    })
    .await
    .unwrap();
    let (report, lines) = backfill(&s, &proxy.endpoint(), "state", &["--write-rate", "1000"]);
    assert_eq!(report["totals"]["written"], 150 + 5, "{report}");

    let requests = requests(&lines);
    let mut by_operation: BTreeMap<&str, Vec<&Json>> = BTreeMap::new();
    for r in &requests {
        let f = &r["fields"];
        assert_eq!(r["phase"], "backfill", "{r}");
        assert!(
            f["request_id"].as_str().is_some_and(|id| !id.is_empty()),
            "{r}"
        );
        assert!(f["attempt"].as_u64().is_some_and(|a| a >= 1), "{r}");
        assert!(f["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{r}");
        assert!(f["throttled"].is_boolean(), "{r}");
        assert_eq!(
            f["throttled"] == true,
            f["throttle_reason"].is_string(),
            "{r}"
        );
        by_operation
            .entry(f["operation"].as_str().unwrap())
            .or_default()
            .push(r);
    }
    // Reads name the source, writes the target; each with the capacity its answer reported.
    let scans = &by_operation["Scan"];
    assert!(
        scans.iter().all(|r| r["table"] == s.source.as_str()),
        "{scans:?}"
    );
    assert!(
        scans
            .iter()
            .all(|r| r["fields"]["consumed_capacity"].is_number()),
        "{scans:?}"
    );
    let writes = &by_operation["BatchWriteItem"];
    assert!(
        writes.iter().all(|r| r["table"] == s.target.as_str()),
        "{writes:?}"
    );

    // Throttled: events at info with DynamoDB's reason, as many as the report counts.
    let throttled: Vec<_> = requests
        .iter()
        .filter(|r| r["fields"]["throttled"] == true)
        .collect();
    assert!(
        !throttled.is_empty(),
        "the proxy throttled: {}",
        report["throttles"]
    );
    eprintln!(
        "a Scan: {}\na throttled request: {}",
        scans[0], throttled[0]
    );
    for t in &throttled {
        assert_eq!(t["level"], "INFO", "{t}");
        assert_eq!(
            t["table"],
            s.target.as_str(),
            "only the target is limited: {t}"
        );
        let reason = t["fields"]["throttle_reason"].as_str().unwrap();
        assert!(
            [
                "TableWriteProvisionedThroughputExceeded",
                "UnprocessedItems"
            ]
            .contains(&reason),
            "{t}"
        );
    }
    let counted = ["write_throttles", "read_throttles"]
        .iter()
        .map(|k| report["throttles"][k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(
        throttled.len() as u64,
        counted,
        "throttled requests in the log vs the report's {}",
        report["throttles"]
    );
    // The write capacity the answers reported is what the report consumed.
    let logged: f64 = requests
        .iter()
        .filter(|r| r["table"] == s.target.as_str())
        .filter_map(|r| r["fields"]["consumed_capacity"].as_f64())
        .sum();
    let reported = report["consumed_wcu"].as_f64().unwrap();
    assert!(
        (logged - reported).abs() < 1e-6 * reported.max(1.0),
        "logged {logged} WCU, reported {reported}"
    );

    // The rejects: one event each, their keys redacted; no key value anywhere.
    let rejects: Vec<_> = lines
        .iter()
        .filter(|l| l["message"].as_str().unwrap().starts_with("item rejected"))
        .collect();
    assert_eq!(
        rejects.len() as u64,
        report["totals"]["rejected"].as_u64().unwrap()
    );
    let unmatched = rejects
        .iter()
        .find(|r| r["fields"]["source_key"].is_string())
        .expect("an unmatched item's reject");
    let key = unmatched["fields"]["source_key"].as_str().unwrap();
    assert!(key.contains('‹'), "redacted: {key}");
    let text = lines
        .iter()
        .map(Json::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for v in key_values(&s.items) {
        assert!(!text.contains(&v), "key value {v} in the log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_keys_shows_the_keys_of_rejected_items_in_the_json_log() {
    let s = setup().await;
    let endpoint = s.env.endpoint();
    let (report, lines) = backfill(&s, &endpoint, "state", &["--show-keys"]);
    assert_eq!(report["totals"]["rejected"], 12, "{report}");
    let keys: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["fields"]["source_key"].as_str())
        .collect();
    // The seven unmatched items, `X#{i}` / `?`, as they are.
    for i in 0..7 {
        let want = format!("X#{i} / ?");
        assert!(keys.contains(&want.as_str()), "{want} in {keys:?}");
    }
    // Each request still says where it went, with its id.
    let requests = requests(&lines);
    assert!(
        requests
            .iter()
            .any(|r| r["fields"]["operation"] == "DescribeTable" && r["table"] == s.target.as_str()),
        "{requests:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_log_redacts_the_keys_of_rejected_items_too() {
    let s = setup().await;
    let state = s.env.dir.path().join("state");
    let out = s.env.rekey_with(
        &[
            "backfill",
            s.plan.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--json",
            "-vv",
        ],
        &[("RUST_LOG", "")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let rejects: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("item rejected"))
        .collect();
    assert_eq!(rejects.len(), 12, "{err}");
    // An unmatched item fits no shape: its key is hashed whole.
    assert!(
        rejects.iter().any(|l| l.contains("source_key=‹")),
        "{rejects:?}"
    );
    for v in key_values(&s.items) {
        assert!(!err.contains(&v), "key value {v} in: {err}");
    }
    // And each request, at -vv, with its id.
    assert!(
        err.contains("aws request") && err.contains("request_id="),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_each_phase_under_its_name_and_its_streams_requests_too() {
    use crate::support::workload::{Orders, seed};
    let Orders {
        env,
        plan_path,
        state,
        ..
    } = Orders::start_local(seed(20)).await;
    let out = env.rekey_with(
        &[
            "run",
            plan_path.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--exit-when-ready",
            "--log-format",
            "json",
            "-vv",
        ],
        &[("RUST_LOG", "")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Without --json, the notes and progress are log lines too: every line parses.
    let lines = lines(&stderr(&out), "run");
    let phase_of = |operation: &str| -> Vec<&str> {
        let mut phases: Vec<&str> = requests(&lines)
            .into_iter()
            .filter(|r| r["fields"]["operation"] == operation)
            .map(|r| r["phase"].as_str().unwrap())
            .collect();
        phases.sort_unstable();
        phases.dedup();
        phases
    };
    let seen: BTreeMap<&str, Vec<&str>> = ["GetRecords", "BatchWriteItem", "Scan"]
        .into_iter()
        .map(|op| (op, phase_of(op)))
        .collect();
    // The tail reads the stream; the backfill writes; verify reads both tables.
    assert_eq!(seen["GetRecords"], ["tail"], "{seen:?}");
    assert!(seen["BatchWriteItem"].contains(&"backfill"), "{seen:?}");
    assert!(seen["Scan"].contains(&"verify"), "{seen:?}");
    let streams = requests(&lines)
        .into_iter()
        .find(|r| r["fields"]["operation"] == "GetRecords")
        .unwrap();
    assert_eq!(streams["fields"]["service"], "dynamodbstreams", "{streams}");
    assert!(streams["fields"]["request_id"].is_string(), "{streams}");
    assert!(
        lines.iter().any(|l| l["target"] == "rekey::progress"),
        "the notes between phases are lines of the log: {lines:?}"
    );
}
