//! `rekey loadtest` (issue 27): the old design of a plan throttles under the
//! application's skewed traffic and the new one does not, measured on the
//! partition model (moto behind the proxy, partitions scaled down fiftyfold so
//! the local server can carry the rate that meets their limits); the
//! command's report checked against the proxy's own counts; scratch tables
//! gone after the run and after a stop; the cost gate against AWS.

use std::time::{Duration, Instant};

use rekey_testkit::partitions::{Mode, PartitionOptions};
use rekey_testkit::proxy::{Proxy, ProxyOptions};
use serde_json::Value as Json;

use crate::support::*;

/// DynamoDB's partitions scaled down fiftyfold (20 WCU/s and 60 RCU/s each)
/// and a table of 64 of them, with half a second of burst instead of 300 s
/// (a run of seconds would otherwise be carried by the burst alone). The
/// margins are wide on both sides, so that the verdict does not depend on
/// how fast this machine sends: the old design's hottest key takes about a
/// third of the writes, about 100/s at the asked 300/s, five times its
/// partition's limit, so it throttles unless the run goes five times
/// slower than asked; the new design's shards spread the same writes over
/// 64 partitions, about 5/s each at the asked rate, a quarter of the limit,
/// and a slower run only spreads them thinner.
fn scaled_partitions() -> PartitionOptions {
    PartitionOptions {
        mode: Mode::OnDemand {
            max_write: None,
            max_read: None,
            warm_write: 64.0 * 20.0,
            warm_read: 64.0 * 60.0,
        },
        partition_write: 20.0,
        partition_read: 60.0,
        burst_seconds: 0.5,
        ..PartitionOptions::default()
    }
}

fn json(out: &std::process::Output) -> Json {
    assert!(
        out.status.success(),
        "rekey loadtest failed: {}\n{}",
        stderr(out),
        stdout(out)
    );
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

fn num(v: &Json) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The tables of the local server.
async fn tables(env: &TestEnv) -> Vec<String> {
    env.clients
        .dynamodb
        .list_tables()
        .send()
        .await
        .unwrap()
        .table_names
        .unwrap_or_default()
}

/// 300 writes/s for 4 s per design on `plans/tenant-day-shard.toml`, on
/// partitions of 20 WCU: the equivalent of 15,000 writes/s on DynamoDB's
/// 1,000. (At the 3,000 writes/s the hottest key, a third of the
/// writes, sits right at its partition's limit, so whether it throttles
/// would depend on how fast this machine sends; five times that leaves a
/// margin on both sides: [`scaled_partitions`].) The pathological tenant's
/// today key is refused with KeyRange reasons; the new design spreads it
/// over 16 shards and is not (or barely) refused. Every refusal the report
/// counts is one the proxy made, and the WCU it counts per table are the
/// proxy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_design_throttles_under_the_skewed_load_and_the_new_one_does_not() {
    let env = TestEnv::start_local().await;
    let proxy = Proxy::start(ProxyOptions {
        partitions: Some(scaled_partitions()),
        ..ProxyOptions::pass_through(env.server())
    })
    .await
    .unwrap();
    let plan = repo_path("plans/tenant-day-shard.toml");
    let endpoint = proxy.endpoint();
    let started = Instant::now();
    let out = output(env.command(
        &[
            "loadtest",
            plan.to_str().unwrap(),
            "--rate",
            "300",
            "--duration",
            "4",
            "--mix",
            "0:1",
            "--concurrency",
            "256",
            "--json",
        ],
        // The SDK would make five attempts of every other call: the measured
        // ones must still be made once, or the proxy counts more refusals.
        &[
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_MAX_ATTEMPTS", "5"),
        ],
    ))
    .await;
    let took = started.elapsed();
    let r = json(&out);
    eprintln!("loadtest took {took:?}: {}", stdout(&out));
    let designs = r["designs"].as_array().unwrap();
    assert_eq!(designs.len(), 2);
    let (old, new) = (&designs[0], &designs[1]);
    assert_eq!(
        (old["design"].as_str(), new["design"].as_str()),
        (Some("old"), Some("new"))
    );
    for d in [old, new] {
        let writes = num(&d["requests"]["writes"]);
        assert!(writes >= 1_100.0, "300/s for 4 s: {d}");
        assert_eq!(num(&d["requests"]["reads"]), 0.0);
        assert_eq!(num(&d["failed"]["writes"]), 0.0, "{d}");
    }
    // The old design: a clear share refused, every refusal a hot key range.
    let old_share = num(&old["throttled_write_share"]);
    assert!(old_share > 0.05, "the old design must throttle: {old}");
    let refused = num(&old["throttled_calls"]);
    assert_eq!(num(&old["throttled"]["writes"]), refused);
    assert_eq!(num(&old["by_reason"]["key_range"]), refused, "{old}");
    let reasons = old["reasons"].as_object().unwrap();
    assert_eq!(
        reasons.keys().collect::<Vec<_>>(),
        ["TableWriteKeyRangeThroughputExceeded"]
    );
    // The hottest key is the most refused one, and it is shown redacted.
    let hottest = old["hottest_write_keys"][0]["key"].as_str().unwrap();
    assert_eq!(old["most_throttled_keys"][0]["key"].as_str(), Some(hottest));
    assert!(
        hottest.starts_with("TENANT#‹") && hottest.contains("#DAY#‹"),
        "{hottest}"
    );
    assert!(
        !stdout(&out).contains("pathological"),
        "key values are redacted"
    );
    assert!(old["verdict"].as_str().unwrap().starts_with("throttles: "));
    // The new design: at most a trace of refusals.
    let new_share = num(&new["throttled_write_share"]);
    assert!(new_share < 0.01, "the new design must not throttle: {new}");
    assert!(
        new_share * 10.0 < old_share,
        "old {old_share} vs new {new_share}"
    );
    assert!(
        new["hottest_write_keys"][0]["key"]
            .as_str()
            .unwrap()
            .contains("#SHARD#"),
        "{new}"
    );
    // The proxy's own counts: every call was made once, so its refusals are the report's.
    let stats = proxy.stats();
    assert_eq!(
        stats.throttled as f64,
        refused + num(&new["throttled_calls"]),
        "{stats:?}"
    );
    for d in [old, new] {
        let table = d["table"].as_str().unwrap();
        let admitted = stats
            .per_table_write_units
            .get(table)
            .copied()
            .unwrap_or(0.0);
        assert!(
            (admitted - num(&d["consumed_wcu"])).abs() < 1e-6,
            "{table}: the proxy admitted {admitted} WCU, the report says {}",
            d["consumed_wcu"]
        );
    }
    // The scratch tables are gone.
    let left = tables(&env).await;
    for d in [old, new] {
        let table = d["table"].as_str().unwrap();
        assert!(!left.iter().any(|t| t == table), "{table} left: {left:?}");
    }
    assert_eq!(r["scratch_tables"], true);
}

/// Ctrl-C mid-run: the run stops, its scratch tables are deleted, the
/// report covers what ran and says it stopped (exit 130).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_run_deletes_the_scratch_tables_and_reports_what_ran() {
    let env = TestEnv::start_local().await;
    let plan = repo_path("plans/tenant-day-shard.toml");
    let before = tables(&env).await;
    let child = env
        .command(
            &[
                "loadtest",
                plan.to_str().unwrap(),
                "--rate",
                "50",
                "--duration",
                "120",
                "--design",
                "old",
                "--json",
            ],
            &[],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Running once its scratch table holds a write: the design has started
    // (a stop between creating the table and the first request would report
    // no design at all).
    poll_until_async(
        "a write in the scratch table",
        Duration::from_secs(60),
        || async {
            let new: Vec<String> = tables(&env)
                .await
                .into_iter()
                .filter(|t| !before.contains(t))
                .collect();
            for t in new {
                if !env.scan_all(&t).await.is_empty() {
                    return true;
                }
            }
            false
        },
    )
    .await;
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let out = wait_output(child).await;
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let r: Json = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(r["stopped"], true);
    let old = &r["designs"][0];
    assert!(num(&old["seconds"]) < 60.0, "{old}");
    assert_eq!(tables(&env).await, before, "the scratch table is deleted");
}

/// `--tables OLD,NEW`: the run writes the given pair (the old design's
/// source items, the new design's shard keys) and keeps them; a table whose
/// key is not the plan's is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_pair_of_tables_is_written_and_kept() {
    let env = TestEnv::start_local().await;
    let (old, new) = (env.table_name("old"), env.table_name("new"));
    env.create_table(&old, &pk_sk()).await;
    env.create_table(&new, &pk_sk()).await;
    let plan = repo_path("plans/tenant-day-shard.toml");
    let pair = format!("{old},{new}");
    let args = [
        "loadtest",
        plan.to_str().unwrap(),
        "--tables",
        &pair,
        "--rate",
        "40",
        "--duration",
        "1",
        "--json",
    ];
    let r = json(&output(env.command(&args, &[])).await);
    assert_eq!(r["scratch_tables"], false);
    assert_eq!(r["designs"][0]["table"].as_str(), Some(old.as_str()));
    assert_eq!(r["designs"][1]["table"].as_str(), Some(new.as_str()));
    let written = |d: &Json| num(&d["requests"]["writes"]) - num(&d["throttled"]["writes"]);
    let (olds, news) = (env.scan_all(&old).await, env.scan_all(&new).await);
    assert_eq!(
        olds.len() as f64,
        written(&r["designs"][0]),
        "every served write is an item"
    );
    assert_eq!(news.len() as f64, written(&r["designs"][1]));
    let pk = |i: &rekey::core::value::Item| match &i["PK"] {
        rekey::core::value::Value::S(s) => s.clone(),
        v => panic!("PK {v:?}"),
    };
    assert!(olds.iter().all(|i| !pk(i).contains("#SHARD#")));
    assert!(news.iter().all(|i| pk(i).contains("#SHARD#")));
    // A table keyed otherwise than the plan says: refused, nothing run.
    let other = env.table_name("pk-only");
    env.create_table(&other, &pk_only()).await;
    let pair = format!("{old},{other}");
    let args = [
        "loadtest",
        plan.to_str().unwrap(),
        "--tables",
        &pair,
        "--duration",
        "1",
    ];
    let out = output(env.command(&args, &[])).await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the plan declares the target key"),
        "{}",
        stderr(&out)
    );
}

/// Against AWS the estimate comes first, and without --yes nothing runs
/// (exit 2, before any call: the endpoint here is AWS's, unreached).
#[test]
fn against_aws_the_cost_is_printed_and_nothing_runs_without_yes() {
    let plan = repo_path("plans/tenant-day-shard.toml");
    let out = rekey_with_env(
        &[
            "loadtest",
            plan.to_str().unwrap(),
            "--endpoint-url",
            "https://dynamodb.eu-west-1.amazonaws.com",
            "--rate",
            "1000",
            "--duration",
            "60",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("loadtest against AWS") && err.contains("about $"),
        "{err}"
    );
    assert!(err.contains("--yes"), "{err}");
    assert!(stdout(&out).is_empty());
}
