//! The backfill behind the project's throttling proxy: DynamoDB's real
//! throttling answers (per partition-key value and per table), 500s and
//! connection resets. It must finish exactly, settle near the allowed rate,
//! and never push one target key past its limit.

use rekey::core::plan::Plan;
use rekey::core::value::Item;
use rekey_testkit::proxy::{Faults, Proxy, ProxyOptions};
use serde_json::Value as Json;

use crate::support::plan::tenant_shards;
use crate::support::*;

/// `n` orders; `hot_share` of them under one old partition key.
fn orders(n: usize, hot_share: f64) -> Vec<Item> {
    let hot = (n as f64 * hot_share) as usize;
    (0..n)
        .map(|i| {
            let t = if i < hot {
                "hot".to_string()
            } else {
                format!("t{}", i % 97)
            };
            item(&format!(
                r#"{{"PK":{{"S":"T#{t}"}},"SK":{{"S":"O#{i:06}"}},"v":{{"N":"{i}"}}}}"#
            ))
        })
        .collect()
}

struct Run {
    env: TestEnv,
    source: String,
    target: String,
    plan: Plan,
    plan_path: std::path::PathBuf,
}

async fn prepare(items: &[Item]) -> Run {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    env.put(&source, items).await;
    let (plan_path, plan) = tenant_shards(&source, &target).write(&env);
    Run {
        env,
        source,
        target,
        plan,
        plan_path,
    }
}

fn backfill(r: &Run, proxy: &Proxy, extra: &[&str]) -> Json {
    let state = r.env.dir.path().join("state");
    let mut args = vec![
        "backfill",
        r.plan_path.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let endpoint = proxy.endpoint();
    // The SDK's default of 3 attempts, as an operator runs it: rekey's own loops
    // see throttles either way, and DescribeTable at start-up survives a reset.
    let out = rekey_with_env(
        &args,
        &[
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_MAX_ATTEMPTS", "3"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    report(&out)
}

async fn assert_exact(r: &Run) {
    let expected = expected_target(&r.plan, &r.env.scan_all(&r.source).await);
    let actual = r.env.table_map(&r.target, &["PK", "SK"]).await;
    assert_eq!(actual.len(), expected.len());
    assert!(actual == expected, "target == transform(source)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_table_throttling_it_finishes_exactly_and_settles_near_the_limit() {
    let items = orders(3000, 0.0);
    let r = prepare(&items).await;
    let proxy = Proxy::start(ProxyOptions {
        upstream: r.env.server().to_string(),
        key_write_units: 1000.0,
        key_read_units: 3000.0,
        table_write_units: Some(250.0),
        table_read_units: None,
        burst_seconds: 1.0,
        faults: Faults::default(),
        shadow: r.env.shadow(),
        partitions: None,
    })
    .await
    .unwrap();
    // Ask for four times what the table allows: the rate must come down to it.
    let rep = backfill(&r, &proxy, &["--write-rate", "1000", "--segments", "4"]);
    assert_eq!(rep["totals"]["written"], 3000);
    let throttles = rep["throttles"]["write_throttles"].as_u64().unwrap();
    assert!(throttles > 0, "the proxy throttled: {}", rep["throttles"]);
    let reasons = rep["throttles"]["reasons"].as_object().unwrap();
    assert!(
        reasons.contains_key("TableWriteProvisionedThroughputExceeded")
            || reasons.contains_key("UnprocessedItems"),
        "{reasons:?}"
    );
    // Achieved rate: what the proxy admitted over the run. Generous bounds: the
    // point is "near the limit, not the 1,000 asked for, not collapsed".
    let rate = rep["consumed_wcu"].as_f64().unwrap() / rep["elapsed_seconds"].as_f64().unwrap();
    eprintln!(
        "achieved {rate:.0} WCU/s against a 250 WCU/s table limit; proxy {:?}",
        proxy.stats()
    );
    assert!((100.0..=330.0).contains(&rate), "achieved {rate:.0} WCU/s");
    assert_exact(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_old_key_with_30_percent_of_items_never_overloads_a_target_key() {
    let items = orders(2000, 0.3);
    let r = prepare(&items).await;
    let proxy = Proxy::start(ProxyOptions {
        upstream: r.env.server().to_string(),
        // The per-partition ceiling, scaled down from 1,000 WCU/s.
        key_write_units: 100.0,
        key_read_units: 3000.0,
        table_write_units: None,
        table_read_units: None,
        burst_seconds: 1.0,
        faults: Faults::default(),
        shadow: r.env.shadow(),
        partitions: None,
    })
    .await
    .unwrap();
    let rep = backfill(
        &r,
        &proxy,
        &[
            "--write-rate",
            "100000",
            "--key-write-rate",
            "40",
            "--segments",
            "2",
        ],
    );
    assert_eq!(rep["totals"]["written"], 2000);
    let stats = proxy.stats();
    eprintln!("proxy: {stats:?}; rekey throttles {}", rep["throttles"]);
    assert!(
        stats.max_key_write_units_per_sec <= 100.0,
        "a target key received {} WCU in one second, over the 100 limit",
        stats.max_key_write_units_per_sec
    );
    assert_eq!(
        stats.throttled, 0,
        "pacing per key means the proxy never had to throttle"
    );
    assert_exact(&r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_connection_resets_are_retried_to_an_exact_result() {
    let items = orders(1500, 0.1);
    let r = prepare(&items).await;
    let proxy = Proxy::start(ProxyOptions {
        upstream: r.env.server().to_string(),
        key_write_units: 1000.0,
        key_read_units: 3000.0,
        table_write_units: None,
        table_read_units: None,
        burst_seconds: 1.0,
        faults: Faults {
            error_500_ratio: 0.1,
            reset_ratio: 0.05,
            latency: std::time::Duration::from_millis(2),
            seed: 7,
        },
        shadow: r.env.shadow(),
        partitions: None,
    })
    .await
    .unwrap();
    let rep = backfill(
        &r,
        &proxy,
        &[
            "--write-rate",
            "100000",
            "--segments",
            "3",
            "--page-size",
            "200",
        ],
    );
    assert_eq!(rep["totals"]["written"], 1500);
    let stats = proxy.stats();
    assert!(
        stats.errors_500 > 0 && stats.resets > 0,
        "faults were injected: {stats:?}"
    );
    assert_exact(&r).await;
}
