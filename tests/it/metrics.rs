// Seconds: 3-5 s for the scrape (a `run` of 20 items to ready-for-cutover, then cutover and
// finish), 3 s for the EMF backfill of 167 items, 2 s for the worker's, at load 9 on 2 cores.
//! `--metrics-listen` and `--metrics emf` (issue 28, item 2), read the way
//! monitoring reads them: a running `rekey run` is scraped over HTTP while it
//! works and once it is ready for cutover, each answer parsed by the
//! reference OpenMetrics parser (Python's `prometheus_client`, installed by
//! scripts/install-deps), and what it says agrees with the run's own `--json`
//! report; a backfill's and a fleet worker's EMF lines parse as CloudWatch's
//! embedded metric format and add up to their reports.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value as Json;

use aws_sdk_dynamodb::types::{StreamSpecification, StreamViewType};

use crate::support::plan::{orders_by_status, tenant_days};
use crate::support::workload::{seed, skewed_order, with_collisions_and_unmatched};
use crate::support::*;

/// The venv's python, beside the moto the tests use.
fn python() -> PathBuf {
    std::env::var_os("REKEY_MOTO_SERVER")
        .map(PathBuf::from)
        .and_then(|m| m.parent().map(|d| d.join("python")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| repo_path(".tools/venv/bin/python"))
}

/// The reference parser, reading an exposition on stdin and writing its
/// samples as JSON; it refuses anything that is not OpenMetrics (no `# EOF`,
/// a counter sample without `_total`, a bad label, a second family of a name).
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    for s in f.samples:
        out.append({"family": f.name, "type": f.type, "unit": f.unit,
                    "name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;

/// One parsed scrape: each sample by its name and labels.
#[derive(Debug)]
struct Scrape {
    samples: Vec<Json>,
}

impl Scrape {
    /// The value of the sample `name` whose labels include `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s["name"] == name && labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .and_then(|s| s["value"].as_f64())
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no {name}{labels:?} in {:#?}", self.samples))
    }

    /// The family's type, as the parser read it.
    fn kind(&self, name: &str) -> &str {
        self.samples
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["type"].as_str())
            .unwrap_or_else(|| panic!("no {name}"))
    }

    fn phase(&self) -> Option<String> {
        self.samples
            .iter()
            .find(|s| s["name"] == "rekey_phase" && s["value"] == 1.0)
            .map(|s| s["labels"]["phase"].as_str().unwrap().to_string())
    }
}

/// `GET /metrics` on `port`: None while nothing listens; the answer's head
/// is checked, its body parsed (a body the parser refuses fails the test).
fn scrape(port: u16) -> Option<Scrape> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: rekey\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        head.lines().any(
            |l| l == "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"
        ),
        "{head}"
    );
    let mut parser = std::process::Command::new(python())
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the venv's python (run scripts/install-deps)");
    parser
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = parser.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the scrape: {}\n{body}",
        stderr(&out)
    );
    let samples: Vec<Json> = serde_json::from_slice(&out.stdout).unwrap();
    Some(Scrape { samples })
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls the endpoint until `ack` holds for a scrape (what the process
/// published: its snapshots, read by each scrape), and returns that scrape.
async fn scrape_until(port: u16, what: &str, ack: impl Fn(&Scrape) -> bool) -> Scrape {
    let start = std::time::Instant::now();
    loop {
        let s = tokio::task::spawn_blocking(move || scrape(port))
            .await
            .unwrap();
        match s {
            Some(s) if ack(&s) => return s,
            _ => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no {what} within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_migration_is_scraped_and_its_metrics_agree_with_its_report() {
    // The source's stream is enabled after its items are in: the tail has
    // nothing to apply, so every write to the target is the backfill's.
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_only()).await;
    env.create_table(&target, &pk_sk()).await;
    env.put(&source, &seed(20)).await;
    env.clients
        .dynamodb
        .update_table()
        .table_name(&source)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("enable the source's stream");
    let (plan_path, _) = orders_by_status(&source, &target).write(&env);
    let state = env.dir.path().join("state");
    let (plan_s, state_s) = (plan_path.to_str().unwrap(), state.to_str().unwrap());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let run = env.spawn(&[
        "run",
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--metrics-listen",
        &listen,
    ]);

    // While it runs: the backfill has published its snapshot.
    let during = scrape_until(port, "a backfill snapshot", |s| {
        s.get("rekey_items_scanned_total", &[]).is_some()
    })
    .await;
    assert_eq!(during.kind("rekey_items_written_total"), "counter");
    assert_eq!(during.kind("rekey_phase"), "gauge");
    assert!(during.phase().is_some(), "one phase is on: {during:?}");
    let reasons: Vec<&str> = during
        .samples
        .iter()
        .filter(|s| s["name"] == "rekey_throttles_total")
        .map(|s| s["labels"]["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    for r in ["key_range", "table", "index", "other"] {
        assert!(reasons.contains(&r), "{r} in {reasons:?}");
    }

    // Ready for cutover: the run tails on, its backfill and verify are done.
    let ready = scrape_until(port, "ready for cutover", |s| {
        s.phase().as_deref() == Some("ready_for_cutover")
    })
    .await;
    let written = ready.value("rekey_items_written_total", &[]);
    assert!(
        written >= during.value("rekey_items_written_total", &[]),
        "a counter only grows"
    );
    assert_eq!(ready.value("rekey_verify_clean", &[]), 1.0);
    assert_eq!(ready.value("rekey_verify_differences", &[]), 0.0);
    assert!(
        ready
            .get("rekey_tail_lag_seconds", &[("direction", "forward")])
            .is_some()
    );
    assert!(
        ready
            .get(
                "rekey_tail_applied_through_timestamp_seconds",
                &[("direction", "forward")]
            )
            .is_some_and(|t| t > 1.7e9),
        "applied_through as epoch seconds: {ready:?}"
    );
    assert!(
        ready
            .get("rekey_tail_shard_lag_seconds", &[("direction", "forward")])
            .is_some(),
        "an open shard's lag: {ready:?}"
    );

    // Cutover and finish; the run ends with its report.
    let out = env.rekey(&["cutover", plan_s, "--state-dir", state_s, "--json"]);
    cut_over(&out);
    let out = env.rekey(&["finish", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "finish: {}", stderr(&out));
    let out = wait_output(run).await;
    assert!(out.status.success(), "run: {}", stderr(&out));
    let r = report(&out);
    let b = &r["backfill"];
    assert_eq!(r["tail"]["puts"], 0, "{r}");
    assert_eq!(written, b["totals"]["written"].as_f64().unwrap(), "{r}");
    assert_eq!(written, 20.0);
    assert_eq!(
        ready.value("rekey_items_rejected_total", &[]),
        b["totals"]["rejected"].as_f64().unwrap()
    );
    assert_eq!(
        ready.value("rekey_items_scanned_total", &[]),
        b["totals"]["scanned"].as_f64().unwrap()
    );
    // The target's write capacity: what the backfill's answers reported (the
    // tail had nothing to write).
    let wcu = ready.value("rekey_consumed_wcu_total", &[("table", &target)]);
    let reported = b["consumed_wcu"].as_f64().unwrap();
    assert!(
        (wcu - reported).abs() < 1e-6 * reported.max(1.0) && reported > 0.0,
        "scraped {wcu} WCU, reported {reported}"
    );
    assert!(ready.value("rekey_consumed_rcu_total", &[("table", &source)]) > 0.0);
    assert_eq!(
        ready.value("rekey_verify_scanned_total", &[("side", "source")]),
        r["verify"]["counts"]["scanned"].as_f64().unwrap(),
        "{r}"
    );
    // The server went with the process.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emf_lines_on_stderr_follow_cloudwatchs_schema_and_add_up_to_the_report() {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    // 150 orders, 5 colliding pairs and 7 unmatched items (167): 12 rejects.
    let items = with_collisions_and_unmatched((0..150).map(skewed_order).collect());
    env.put(&source, &items).await;
    let (plan, _) = tenant_days(&source, &target, "T#{t}").write(&env);
    let state = env.dir.path().join("state");
    let out = env.rekey(&[
        "backfill",
        plan.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--page-size",
        "40",
        "--write-rate",
        "100",
        "--json",
        "--metrics",
        "emf",
        "--metrics-interval",
        "0.2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    let (_, sums) = emf(&out, "backfill", &source, 2);
    // Counters go out as their growth: over the lines, the report's totals.
    let t = &r["totals"];
    assert_eq!(
        sums["ItemsWritten"],
        t["written"].as_f64().unwrap(),
        "{sums:?}"
    );
    assert_eq!(sums["ItemsRejected"], 12.0, "{sums:?}");
    assert_eq!(
        sums["ItemsScanned"],
        t["scanned"].as_f64().unwrap(),
        "{sums:?}"
    );
    let wcu = r["consumed_wcu"].as_f64().unwrap();
    assert!(
        (sums["ConsumedWCU"] - wcu).abs() < 1e-6 * wcu.max(1.0),
        "{sums:?} vs {wcu}"
    );
    // --json's stdout is the report and its events only (`report` checked each line).
    assert_eq!(
        stdout(&out).lines().filter(|l| l.contains("_aws")).count(),
        0
    );
}

/// The EMF lines of `out`'s stderr, each checked against the format's
/// schema, and the sum of each metric over them.
fn emf(
    out: &std::process::Output,
    command: &str,
    table: &str,
    min_lines: usize,
) -> (Vec<Json>, BTreeMap<String, f64>) {
    let err = stderr(out);
    let lines: Vec<Json> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.len() >= min_lines,
        "a line per interval and one at the end: {err}"
    );
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for l in &lines {
        let aws = &l["_aws"];
        assert!(
            aws["Timestamp"]
                .as_i64()
                .is_some_and(|t| t > 1_700_000_000_000),
            "{l}"
        );
        let directives = aws["CloudWatchMetrics"].as_array().expect("directives");
        assert_eq!(directives.len(), 1, "{l}");
        let d = &directives[0];
        assert_eq!(d["Namespace"], "rekey", "{l}");
        for set in d["Dimensions"].as_array().unwrap() {
            for dim in set.as_array().unwrap() {
                let dim = dim.as_str().unwrap();
                assert!(l[dim].is_string(), "dimension {dim} is a member: {l}");
            }
        }
        assert_eq!(l["Command"], command);
        assert_eq!(l["Table"], table);
        for m in d["Metrics"].as_array().unwrap() {
            let name = m["Name"].as_str().unwrap();
            let unit = m["Unit"].as_str().unwrap();
            assert!(["Count", "Seconds"].contains(&unit), "{m}");
            let v = l[name].as_f64().unwrap_or_else(|| panic!("{name} in {l}"));
            *sums.entry(name.to_string()).or_default() += v;
        }
    }
    (lines, sums)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_emf_lines_show_the_fleets_units_and_what_it_scanned() {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_only()).await;
    env.create_table(&target, &pk_sk()).await;
    env.put(&source, &seed(60)).await;
    let (plan, _) = orders_by_status(&source, &target).write(&env);
    let url = format!("dynamodb://{}", env.table_name("ctl"));
    let state = env.dir.path().join("state");
    let out = env.rekey(&[
        "worker",
        plan.to_str().unwrap(),
        "--state",
        &url,
        "--worker-id",
        "w1",
        "--segments",
        "3",
        "--state-dir",
        state.to_str().unwrap(),
        "--json",
        "--metrics",
        "emf",
        "--metrics-interval",
        "0.2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    let (lines, sums) = emf(&out, "worker", &source, 1);
    let last = lines.last().unwrap();
    // The last status the worker reported: every unit done, none held.
    assert_eq!(
        last["FleetUnitsDone"].as_f64(),
        r["segments"].as_f64(),
        "{last} {r}"
    );
    assert_eq!(last["FleetUnitsOpen"], 0.0, "{last}");
    assert_eq!(
        sums["WorkerItemsScanned"],
        r["this_worker"]["scanned"].as_f64().unwrap(),
        "{sums:?} {r}"
    );
    assert_eq!(r["this_worker"]["scanned"], 60, "{r}");
    assert!(sums["ConsumedWCU"] > 0.0, "{sums:?}");
}
