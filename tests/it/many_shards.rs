//! Issue 25: the drain barrier and `applied_through` on a stream served as
//! DynamoDB serves it — one open shard per partition, records readable
//! after each shard's own delay, empty pages while records sit further on
//! (`rekey_testkit::streams`, in front of the local server). On moto's one
//! prompt shard, "an empty page means drained" passes every test; here a
//! barrier that trusted it completed while acknowledged writes sat unread
//! in other shards.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rekey_testkit::streams::{StreamsFront, StreamsOptions};

use crate::support::workload::*;
use crate::support::*;

/// The tail's published `applied_through`, if any.
fn applied_through(state: &std::path::Path) -> Option<chrono::DateTime<chrono::Utc>> {
    let text = std::fs::read(state.join("tail/status.json")).ok()?;
    let s: serde_json::Value = serde_json::from_slice(&text).ok()?;
    s["applied_through"].as_str()?.parse().ok()
}

/// Regression (issue 25): a drain on a 16-shard stream with late records and
/// empty pages returned while writes acknowledged before it were not yet in
/// the target. Every barrier (drain; cutover and finish wait on the same)
/// now covers every write acknowledged before it began, and so does
/// `applied_through` (what the lag gate and verify's wait read) once it
/// passes an instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sixteen_shards_with_late_records_and_empty_pages_barriers_and_applied_through_cover_every_acknowledged_write()
 {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start(seed(200)).await;
    let front = StreamsFront::start(StreamsOptions {
        upstream: env.endpoint(),
        partitions: 16,
        delay_max: Duration::from_secs(4),
        empty_run_ratio: 0.3,
        empty_run_max: 6,
        seed: 25,
        ..Default::default()
    })
    .await
    .expect("the stream front starts");
    let streams = front.endpoint();
    let extra = [("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", streams.as_str())];
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    let mut tail = env
        .command(&["tail", plan_s, "--state-dir", state_s], &extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = env.rekey(&["backfill", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let drain = || {
        env.command(
            &[
                "drain",
                plan_s,
                "--state-dir",
                state_s,
                "--json",
                "--timeout",
                "180",
            ],
            &extra,
        )
    };

    let stop = AtomicBool::new(false);
    let acked = Mutex::new(BTreeMap::new());
    let application = app(&env, &source, 400, &stop, &acked);
    let test = async {
        poll_until(
            "the application's first writes",
            Duration::from_secs(60),
            || acked.lock().unwrap().len() >= 50,
        )
        .await;
        for round in 0..3 {
            let before = acked.lock().unwrap().clone();
            let out = output(drain()).await;
            assert!(out.status.success(), "round {round}: {}", stderr(&out));
            check_covered(&env, &target, &before).await;

            let t0 = chrono::Utc::now();
            let before = acked.lock().unwrap().clone();
            poll_until(
                "applied_through past the writes acknowledged",
                Duration::from_secs(180),
                || applied_through(&state).is_some_and(|t| t >= t0),
            )
            .await;
            check_covered(&env, &target, &before).await;
        }
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(application, test);

    let out = output(drain()).await;
    assert!(out.status.success(), "{}", stderr(&out));
    tail.kill().unwrap();
    tail.wait().unwrap();
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "nothing lost, nothing extra, nothing stale"
    );
    // The adversity happened: records spread over the shards, empty pages
    // served while records were pending or readable further on.
    let s = front.stats();
    assert!(s.per_shard.len() >= 16, "{s:?}");
    assert!(s.empty_pages_pending + s.empty_pages_forced > 0, "{s:?}");
}
