//! The fleet's tail (issue 15, item 2): `rekey worker --tail` processes that
//! backfill and tail one migration together, stream shards leased like Scan
//! segments, records buffered in the control table until the fleet's
//! backfill is done, kill -9 of a holder mid-buffer and mid-apply. On the
//! local server (one shard per stream) under a live writer, and against the
//! multi-shard stream double (`support::streams_double`) for lineage across
//! workers.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};

use rekey::core::value::{Item, Value};
use rekey::state::fleet::Snapshot;
use rekey::state::fleet::shard::ShardUnit;

use crate::fleet::{LEASE_SECONDS, control_table, kill_9, snapshot, wait_for};
use crate::support::streams_double::*;
use crate::support::workload::*;
use crate::support::*;

/// `rekey worker --tail` with the test's lease, exiting when the fleet's
/// tail has been caught up and quiet for 6 s.
fn worker_args(plan: &str, url: &str, w: &str, dir: &Path, extra: &[&str]) -> Vec<String> {
    let local = dir.join(format!("state-{w}"));
    let mut a: Vec<String> = [
        "worker",
        plan,
        "--state",
        url,
        "--worker-id",
        w,
        "--segments",
        "6",
        "--page-size",
        "40",
        "--lease-seconds",
        LEASE_SECONDS,
        "--tail",
        "--exit-when-idle",
        "6",
        "--json",
        "--state-dir",
        local.to_str().unwrap(),
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

fn shard<'a>(s: &'a Snapshot, id: &str) -> Option<&'a ShardUnit> {
    s.shards.iter().find(|u| u.id == id)
}

/// The control table's `BUF#` items: (pk, chunk number).
async fn chunks_left(env: &TestEnv, ctl: &str) -> Vec<(String, u64)> {
    env.scan_all(ctl)
        .await
        .into_iter()
        .filter_map(|it| match (it.get("pk"), it.get("sk")) {
            (Some(Value::S(pk)), Some(Value::S(sk))) if pk.starts_with("BUF#") => {
                Some((pk.clone(), sk.parse().unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// Every chunk still in the table is below its shard's apply cursor
/// (applied, its delete lost to a kill), never one still to apply.
async fn check_buffers_applied(env: &TestEnv, ctl: &str, s: &Snapshot) {
    for (pk, n) in chunks_left(env, ctl).await {
        let id = pk.rsplit('#').next().unwrap();
        let u = shard(s, id).unwrap_or_else(|| panic!("chunk of an unknown shard {pk}"));
        assert!(n < u.applied, "{pk} chunk {n} not applied: {u:?}");
    }
}

fn victim_of(s: &Snapshot, ready: impl Fn(&ShardUnit) -> bool) -> Option<String> {
    s.shards
        .iter()
        .find(|u| ready(u) && u.owner.is_some())
        .and_then(|u| u.owner.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_backfill_and_tail_one_killed_while_buffering_the_target_is_exact() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        ..
    } = Orders::start(seed(1500)).await;
    let (fleet, url, ctl) = control_table(&env, "tail1");
    let plan_s = plan_path.to_str().unwrap();
    let dir = env.dir.path().to_path_buf();
    // A slow backfill (a 300 WCU/s budget shared by three): the stream's
    // records are buffered for seconds before they may be applied.
    let start = |w: &str| {
        let a = worker_args(plan_s, &url, w, &dir, &["--write-rate", "300"]);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        env.spawn(&a)
    };
    let mut workers: BTreeMap<String, Child> = ["a", "b", "c"]
        .into_iter()
        .map(|w| (w.to_string(), start(w)))
        .collect();
    let app = writer(&env, source.clone(), 1500, 1000, Rng::from_time().next());
    let kill = async {
        // The shard's holder, once it has committed a chunk and while the
        // backfill is not done: mid-buffer.
        wait_for(&fleet, "a buffer chunk committed during the backfill", |s| {
            let backfilling = s.meta.as_ref().is_some_and(|m| m.done_ms.is_none());
            backfilling && victim_of(s, |u| u.chunks >= 1 && !u.live).is_some()
        })
        .await;
        let s = snapshot(&fleet).await;
        let victim = victim_of(&s, |u| u.chunks >= 1 && !u.live).unwrap();
        assert!(
            s.meta.as_ref().unwrap().done_ms.is_none(),
            "still backfilling when killed"
        );
        kill_9(workers.get_mut(&victim).unwrap());
        eprintln!("{victim} killed while holding the shard mid-buffer");
        victim
    };
    let (ops, victim) = tokio::join!(app, kill);
    eprintln!("application wrote {ops} changes");
    workers.remove(&victim);
    for (id, child) in workers {
        let out = wait_output(child).await;
        assert!(out.status.success(), "{id}: {}", stderr(&out));
        let r = report(&out);
        assert_eq!(r["backfill_done"], true, "{id}: {r}");
        assert!(r["tail"].is_object(), "{id}: {r}");
    }

    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "nothing lost, nothing extra, nothing stale"
    );

    let s = snapshot(&fleet).await;
    assert_eq!(s.shards.len(), 1, "the local server keeps one shard");
    let u = &s.shards[0];
    assert!(u.live && u.applied == u.chunks && u.chunks >= 1, "{u:?}");
    let mut grants = u.grants.clone();
    grants.sort_by_key(|g| g.lease);
    assert!(
        grants
            .iter()
            .any(|g| g.owner == victim && !g.released && g.lease < u.lease),
        "the killed worker's lease was taken over: {grants:?}"
    );
    for pair in grants.windows(2) {
        assert!(
            pair[1].granted_ms >= pair[0].until_ms,
            "no two leases of the shard overlap: {grants:?}"
        );
    }
    check_buffers_applied(&env, &ctl, &s).await;

    // status shows the fleet's tail: the shard, its cursor, applied_through.
    let out = env.rekey(&["status", plan_s, "--state", &url, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tail = &st["tail"];
    assert_eq!(tail["shards"].as_array().unwrap().len(), 1, "{st}");
    assert!(tail["applied_through"].is_string(), "{st}");
    assert_eq!(tail["shards"][0]["live"], true, "{st}");
}
