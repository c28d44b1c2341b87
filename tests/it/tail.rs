// Slow on purpose: 56 s here (`cargo test --test it tail::`, alone on 2 cores): 1,000 application writes per test against the local server while backfill and tail run, five kill -9 rounds of each, and a tail that exits only after 4 s idle.
//! Backfill and tail together against the local server (moto) while an application
//! keeps writing: inserts, updates that move an item to another target key,
//! deletes, re-inserts of deleted keys. When the writer stops and the tail has
//! caught up, target == transform(source) exactly.

use std::time::Duration;

use rekey::core::value::Item;

use crate::support::plan::orders_by_status;
use crate::support::workload::*;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_and_tail_converge_under_live_writes() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start(seed(1200)).await;
    let state_s = state.to_str().unwrap();
    let plan_s = plan_path.to_str().unwrap();

    // The tail captures first: from before the backfill reads anything.
    let tail = env.spawn(&[
        "tail",
        plan_s,
        "--state-dir",
        state_s,
        "--exit-when-idle",
        "4",
        "--json",
    ]);
    let app = writer(&env, source.clone(), 1200, 1000, Rng::from_time().next());
    let backfill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let args = [
            "backfill",
            plan_s,
            "--state-dir",
            state_s,
            "--json",
            "--segments",
            "3",
            "--page-size",
            "100",
            "--write-rate",
            "800",
        ];
        let mut child = env.spawn(&args);
        tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap()
    };
    let (ops, status) = tokio::join!(app, backfill);
    assert!(status.success(), "backfill failed");
    eprintln!("application wrote {ops} changes during the backfill");
    let out = wait_output(tail).await;
    assert!(
        out.status.success(),
        "tail failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    eprintln!("tail: {r}");
    assert!(
        r["buffered"].as_u64().unwrap() > 0,
        "changes during the backfill were buffered, then applied"
    );

    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "nothing lost, nothing left under an old key or resurrected, nothing stale"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_tail_and_backfill_at_random_points_still_converges() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start(seed(1500)).await;
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    let mut rng = Rng::from_time();
    let tail_args = ["tail", plan_s, "--state-dir", state_s, "--json"];
    let backfill_args = [
        "backfill",
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--segments",
        "3",
        "--page-size",
        "100",
        "--write-rate",
        "200",
    ];

    // Five kill points each, interleaved with the application's writes.
    let first_tail = env.spawn(&tail_args);
    let app = writer(&env, source.clone(), 1500, 1000, rng.next());
    let kills = async {
        let mut tail = first_tail;
        let mut killed = (0, 0);
        for round in 0..5 {
            let mut backfill = env.spawn(&backfill_args);
            tokio::time::sleep(Duration::from_millis(600 + rng.below(1200))).await;
            if backfill.try_wait().unwrap().is_none() {
                backfill.kill().unwrap();
                killed.1 += 1;
            }
            backfill.wait().unwrap();
            tokio::time::sleep(Duration::from_millis(200 + rng.below(800))).await;
            tail.kill().unwrap();
            tail.wait().unwrap();
            killed.0 += 1;
            eprintln!(
                "round {round}: tail killed, backfill killed {} times so far",
                killed.1
            );
            tail = env.spawn(&tail_args);
        }
        tail.kill().unwrap();
        tail.wait().unwrap();
        killed
    };
    let (ops, (tail_kills, backfill_kills)) = tokio::join!(app, kills);
    eprintln!(
        "application wrote {ops} changes; tail killed {tail_kills}×, backfill {backfill_kills}×"
    );
    assert!(
        tail_kills >= 5 && backfill_kills >= 5,
        "five kill points each"
    );

    // The writer has stopped: finish the backfill, then let the tail catch up.
    let out = env.rekey(&backfill_args);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.rekey(&[
        "tail",
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--exit-when-idle",
        "4",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "converged after kills"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_barrier_proves_every_earlier_write_is_applied_and_status_shows_lag() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start(seed(300)).await;
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    let drain = ["drain", plan_s, "--state-dir", state_s, "--json"];

    // No tail running: the barrier cannot be met, and says so with exit 3.
    let out = env.rekey(&[&drain[..], &["--timeout", "1"]].concat());
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["complete"], false);

    let mut tail = env.spawn(&["tail", plan_s, "--state-dir", state_s, "--json"]);
    let out = env.rekey(&["backfill", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let mut rng = Rng::from_time();
    for round in 0..3 {
        // A burst of acknowledged writes to ids below 1000…
        writer(&env, source.clone(), 300, 150, rng.next()).await;
        // …then, while another writer keeps going on ids from 5000, the barrier.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let side = side_writer(&env, &source, 5000, &stop);
        let barrier = async {
            let cmd = env.command(&drain, &[]);
            let out = output(cmd).await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            out
        };
        let (side_writes, out) = tokio::join!(side, barrier);
        assert!(out.status.success(), "drain: {}", stderr(&out));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["complete"], true);
        eprintln!(
            "round {round}: drained in {} s while {side_writes} other writes went on",
            r["waited_seconds"]
        );

        // Every write made before the barrier is in the target now, exactly.
        // Keys that are not orders' (the tail's probe markers, which come and
        // go in the source as the application would see them) are not low ids.
        let low = |k: &str| {
            k.strip_prefix("O#")
                .is_some_and(|n| n.parse::<u64>().unwrap() < 1000)
        };
        let source_now: Vec<Item> = env
            .scan_all(&source)
            .await
            .into_iter()
            .filter(|i| matches!(&i["PK"], rekey::core::value::Value::S(s) if low(s)))
            .collect();
        let expected = expected_target(&plan, &source_now);
        let actual: std::collections::BTreeMap<_, _> = env
            .table_map(&target, &["PK", "SK"])
            .await
            .into_iter()
            .filter(|(_, v)| matches!(&v["SK"], rekey::core::value::Value::S(s) if low(s)))
            .collect();
        assert_eq!(
            actual.len(),
            expected.len(),
            "round {round}: no low id missing or left behind"
        );
        assert!(
            expected.iter().all(|(k, v)| actual.get(k) == Some(v)),
            "round {round}: every low id current"
        );
    }

    // The status the tail publishes: applied, lag per shard, the barriers complete.
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("tail/status.json")).unwrap()).unwrap();
    tail.kill().unwrap();
    tail.wait().unwrap();
    assert_eq!(status["backfill_done"], true);
    assert!(status["applied_through"].is_string(), "{status}");
    assert!(status["lag_seconds"].as_f64().is_some(), "{status}");
    let shards = status["shards"].as_array().unwrap();
    assert!(!shards.is_empty() && shards.iter().all(|s| s["shard_id"].is_string()));
    // Three drains, and the first one's marker (written while no tail ran),
    // which the tail observed once it started: all complete.
    let barriers = status["barriers"].as_object().unwrap();
    assert!(barriers.len() >= 3, "{status}");
    assert!(
        barriers.values().all(|b| b["complete_at"].is_number()),
        "{status}"
    );
    // Markers are never copied into the target.
    assert!(
        env.scan_all(&target)
            .await
            .iter()
            .all(|i| !format!("{:?}", i).contains("__rekey__")),
        "no marker in the target"
    );

    // A round cut short by a process that is gone left markers in the source
    // (as the tail just killed may have): the next round written from this
    // state directory, here a drain's, sweeps them and forgets the round.
    let cut = rekey::state::markers::Round {
        table: source.clone(),
        id: "20260101T000000.000Z-0badc0de".into(),
        from: 0,
        n: 3,
        pid: i32::MAX as u32, // past Linux's pid_max: a process that is gone
    };
    let left: Vec<Item> = (0..cut.n)
        .map(|n| {
            let m = rekey::core::marker::Marker {
                barrier: cut.id.clone(),
                n,
                started_at: Some(1.0),
            };
            rekey::core::marker::marker_item_in(&plan.source_key, &source, &m).unwrap()
        })
        .collect();
    env.put(&source, &left).await;
    let rounds = state.join("markers");
    std::fs::create_dir_all(&rounds).unwrap();
    std::fs::write(rounds.join("cut-0.json"), serde_json::to_vec(&cut).unwrap()).unwrap();
    let out = env.rekey(&[&drain[..], &["--timeout", "1"]].concat());
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let markers: Vec<Item> = env
        .scan_all(&source)
        .await
        .into_iter()
        .filter(|i| format!("{i:?}").contains("__rekey__"))
        .collect();
    assert!(
        markers.is_empty(),
        "markers left in the source: {markers:?}"
    );
    let files: Vec<_> = std::fs::read_dir(&rounds).unwrap().collect();
    assert!(files.is_empty(), "rounds not forgotten: {files:?}");
}

/// Regression: `rekey run` whose in-process tail could not run (here: the
/// source has no stream) went on to the catch-up and waited for the drain
/// barrier until its timeout (exit 3). It now stops with the tail's own error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_with_the_tails_error_when_the_tail_cannot_run() {
    let env = TestEnv::start().await;
    let (source, target) = (env.table_name("src"), env.table_name("dst"));
    env.create_table(&source, &pk_only()).await; // no stream
    env.create_table(&target, &pk_sk()).await;
    env.put(&source, &seed(50)).await;
    let (plan, _) = orders_by_status(&source, &target).write(&env);
    let state = env.dir.path().join("state");
    let out = env.rekey(&[
        "-q",
        "run",
        plan.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--skip-analyze",
        "--drain-timeout",
        "30",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the tail stopped") && stderr(&out).contains("has no stream"),
        "{}",
        stderr(&out)
    );
}

/// The tail status `rekey status` reads, once it exists.
async fn tail_status(state: &std::path::Path) -> serde_json::Value {
    let path = rekey::state::StateDir::new(state).tail_snapshot();
    let started = std::time::Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no tail status at {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn signal(child: &std::process::Child, sig: libc::c_int) {
    // SAFETY: plain syscall on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Regression for "run aborts its tail task, so the tail's stopped status is
/// never published": SIGTERM to `rekey tail` and Ctrl-C (SIGINT) to `rekey
/// run` each stop the tail cleanly: exit 143 / 130, and the tail's status
/// says it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_stops_the_tail_cleanly_alone_and_inside_run() {
    let o = Orders::start(seed(300)).await;
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());

    let tail = o
        .env
        .spawn(&["tail", plan_s, "--state-dir", state_s, "--json"]);
    assert_eq!(tail_status(&o.state).await["stopped"], false);
    signal(&tail, libc::SIGTERM);
    let out = tail.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(tail_status(&o.state).await["stopped"], true);

    // `run` starts its own tail (the status file is rewritten as it starts).
    std::fs::remove_file(rekey::state::StateDir::new(&o.state).tail_snapshot()).unwrap();
    let run = o.env.spawn(&[
        "run",
        plan_s,
        "--state-dir",
        state_s,
        "--skip-analyze",
        "--write-rate",
        "50",
        "--json",
    ]);
    assert_eq!(tail_status(&o.state).await["stopped"], false);
    signal(&run, libc::SIGINT);
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(
        tail_status(&o.state).await["stopped"],
        true,
        "run's tail said it stopped"
    );
}

/// The tail's writes go out in BatchWriteItems, each item's records reduced to
/// the last write per target key: one response holding inserts, key-changing
/// updates, deletes, inserts deleted again, and one order the target refuses
/// (an empty string where the target has an index key; the source has no
/// index and takes it): the batch that holds it fails validation, is narrowed
/// down request by request, the order is rejected and everything else lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_target_refuses_is_rejected_and_the_rest_of_its_batch_lands() {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
        Projection, ProjectionType, ScalarAttributeType,
    };
    use rekey::core::value::Value;
    let env = TestEnv::start().await;
    let (source, target) = (env.table_name("src"), env.table_name("dst"));
    env.create_streamed_table(&source, &pk_only()).await;
    let def = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let key = |n: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .unwrap()
    };
    env.clients
        .dynamodb
        .create_table()
        .table_name(&target)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(def("PK"))
        .attribute_definitions(def("SK"))
        .attribute_definitions(def("note"))
        .key_schema(key("PK", KeyType::Hash))
        .key_schema(key("SK", KeyType::Range))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name("ByNote")
                .key_schema(key("note", KeyType::Hash))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {target}: {}", rekey::aws::error_chain(&e)));
    env.put(&source, &seed(60)).await;
    let (plan_path, plan) = orders_by_status(&source, &target).write(&env);
    let state = env.dir.path().join("state");
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    let out = env.rekey(&["backfill", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let mut bad = order(300, "OPEN", 1);
    bad.insert("note".into(), Value::S(String::new()));
    let mut puts: Vec<Item> = (100..140).map(|i| order(i, "OPEN", i)).collect();
    puts.push(bad.clone());
    // A new status: a new target key.
    puts.extend((0..20).map(|i| order(i, STATUSES[((i + 1) % 3) as usize], i + 1000)));
    puts.extend((200..210).map(|i| order(i, "PAID", i)));
    env.put(&source, &puts).await;
    for id in (20..30).chain(200..210) {
        let key: Item = [("PK".to_string(), Value::S(format!("O#{id}")))].into();
        rekey::aws::item::delete_item(&env.clients, &source, &key)
            .await
            .unwrap();
    }

    let out = env.rekey(&[
        "tail",
        plan_s,
        "--state-dir",
        state_s,
        "--exit-when-idle",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    // 60 seed inserts, 41 + 20 + 10 puts, 20 deletes.
    assert_eq!(r["records"], 151, "{r}");
    assert_eq!(r["rejected"], 1, "{r}");
    // The records' actions, the refused put aside: puts of 60 seed orders,
    // 40 new ones, 20 moved, 10 inserted again; deletes of the 20 moved ones'
    // old keys, 10 removed, 10 inserted and removed.
    assert_eq!(
        (r["puts"].as_u64(), r["deletes"].as_u64()),
        (Some(130), Some(40)),
        "{r}"
    );
    let rejects = std::fs::read_to_string(state.join("tail-rejects.jsonl")).unwrap();
    assert_eq!(rejects.lines().count(), 1, "{rejects}");
    assert!(
        rejects.contains("DynamoDB refused the item") && rejects.contains("O#300"),
        "{rejects}"
    );
    let kept: Vec<Item> = env
        .scan_all(&source)
        .await
        .into_iter()
        .filter(|i| i["PK"] != bad["PK"])
        .collect();
    assert_eq!(
        kept.len(),
        60 + 40 - 10,
        "the source: {:?}",
        kept.iter().map(|i| &i["PK"]).collect::<Vec<_>>()
    );
    let expected = expected_target(&plan, &kept);
    let actual = env.table_map(&target, &["PK", "SK"]).await;
    assert!(
        actual == expected,
        "target == transform(source), the refused order aside"
    );
}
