//! Rollback by reverse replication (issue 13) against the local server: the
//! reverse tail (`rekey reverse`) follows the target's stream and writes the
//! plan's inverse back to the source, under a live writer on the target and
//! kill -9; and both tails at once, with writers on both tables, write no
//! echo (tail writes bounded by application writes, both go idle) and leave
//! target == transform(source), i.e. source == inverse(target).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rekey::core::plan::Plan;
use rekey::core::transform::{Outcome, transform};
use rekey::core::value::Item;

use crate::support::plan::orders_by_status;
use crate::support::workload::*;
use crate::support::*;

/// Both tables streamed, the source seeded, backfilled and tailed until the
/// target equals transform(source).
async fn migrated(n: u64) -> Orders {
    let env = TestEnv::start().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_streamed_table(&source, &pk_only()).await;
    env.create_streamed_table(&target, &pk_sk()).await;
    env.put(&source, &seed(n)).await;
    let (plan_path, plan) = orders_by_status(&source, &target).write(&env);
    let state = env.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let o = Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    };
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let out = o
        .env
        .rekey(&["backfill", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = o.env.rekey(&[
        "tail",
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--exit-when-idle",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(exact(&o).await, (0, 0, 0), "migrated");
    o
}

/// (missing, extra, stale) of the target against transform(source): zero
/// both ways means target == transform(source) and source == inverse(target).
async fn exact(o: &Orders) -> (usize, usize, usize) {
    let d = target_vs_transform(&o.env, &o.plan, &o.source, &o.target).await;
    if d != (0, 0, 0) {
        let expected = expected_target(&o.plan, &o.env.scan_all(&o.source).await);
        let names = o.plan.target_key.names();
        let actual = o.env.table_map(&o.target, &names).await;
        for (k, v) in &expected {
            if actual.get(k) != Some(v) {
                eprintln!("expected {v:?}, target holds {:?}", actual.get(k));
            }
        }
        for (k, v) in &actual {
            if !expected.contains_key(k) {
                eprintln!("extra in the target: {v:?}");
            }
        }
    }
    let count = |items: Vec<Item>| items.iter().filter(|i| !is_marker(i)).count();
    let sources = count(o.env.scan_all(&o.source).await);
    let targets = count(o.env.scan_all(&o.target).await);
    assert_eq!(
        (d, sources),
        (d, targets),
        "every source item has exactly one target item"
    );
    d
}

/// The application after cutover: `ops` writes to the target for order ids
/// `first..first + ids`, each order at the target key its status gives (a
/// status change deletes the old key, then puts the new). `held` is what the
/// target holds of these ids when it starts (id → status). Returns the
/// writes made. With `live`, it stops early when told and counts its writes
/// there as it goes.
#[allow(clippy::too_many_arguments)]
async fn target_writer(
    env: &TestEnv,
    plan: &Plan,
    table: &str,
    (first, ids): (u64, u64),
    mut held: HashMap<u64, &'static str>,
    ops: usize,
    seed: u64,
    live: Option<&Live>,
) -> usize {
    let mut rng = Rng(seed);
    let c = &env.clients.dynamodb;
    let target_of = |id: u64, status: &str, v: u64| -> Item {
        match transform(plan, &order(id, status, v)) {
            Outcome::Put { item, .. } => item,
            o => panic!("{o:?}"),
        }
    };
    let key_of = |item: &Item| -> Item {
        item.iter()
            .filter(|(k, _)| *k == "PK" || *k == "SK")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut writes = 0;
    for n in 0..ops {
        if let Some(live) = live {
            if live.stop.load(Ordering::Relaxed) {
                break;
            }
            live.written.store(writes, Ordering::Relaxed);
        }
        let id = first + rng.below(ids);
        let status = STATUSES[rng.below(3) as usize];
        let old = held.get(&id).map(|s| target_of(id, s, 0));
        if rng.below(5) == 0
            && let Some(old) = &old
        {
            c.delete_item()
                .table_name(table)
                .set_key(Some(rekey::aws::to_sdk_item(&key_of(old))))
                .send()
                .await
                .unwrap_or_else(|e| panic!("target writer: {}", rekey::aws::error_chain(&e)));
            held.remove(&id);
            writes += 1;
            continue;
        }
        let new = target_of(id, status, 1_000_000 + n as u64);
        if let Some(old) = &old
            && key_of(old) != key_of(&new)
        {
            c.delete_item()
                .table_name(table)
                .set_key(Some(rekey::aws::to_sdk_item(&key_of(old))))
                .send()
                .await
                .unwrap_or_else(|e| panic!("target writer: {}", rekey::aws::error_chain(&e)));
            writes += 1;
        }
        c.put_item()
            .table_name(table)
            .set_item(Some(rekey::aws::to_sdk_item(&new)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("target writer: {}", rekey::aws::error_chain(&e)));
        held.insert(id, status);
        writes += 1;
        if n % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // An application that runs for as long as it is needed writes at an
        // application's pace (~25 writes/s, each order every ~15 s).
        if live.is_some() {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    writes
}

/// A writer that runs until told to stop, and says how far it got.
#[derive(Default)]
struct Live {
    stop: AtomicBool,
    written: AtomicUsize,
}

/// The statuses `seed(n)` gives orders `0..n`.
fn seeded(n: u64) -> HashMap<u64, &'static str> {
    (0..n).map(|i| (i, STATUSES[(i % 3) as usize])).collect()
}

/// Puts + deletes of a tail's `--json` report.
fn tail_writes(out: &std::process::Output) -> u64 {
    assert!(out.status.success(), "{}", stderr(out));
    let r = report(out);
    eprintln!("{r}");
    r["puts"].as_u64().unwrap() + r["deletes"].as_u64().unwrap()
}

/// The status a direction's tail publishes, once it exists.
async fn wait_for_status(path: std::path::PathBuf) {
    let what = format!("status at {}", path.display());
    poll_until(&what, Duration::from_secs(60), || path.exists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_tail_under_a_live_target_writer_survives_kill_9_and_converges() {
    let o = migrated(400).await;
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let reverse = ["reverse", plan_s, "--state-dir", state_s, "--json"];
    let mut rng = Rng::from_time();
    // The reverse tail draws its start line before the application moves
    // (as a cutover would: `phase::tail::line`).
    let mut tail = o.env.spawn(&reverse);
    wait_for_status(rekey::state::StateDir::new(&o.state).reverse_snapshot()).await;
    // The application has moved to the target: moves, updates, deletes and
    // new orders (ids 400..500 are new), while the reverse tail is killed
    // three times at random points.
    let app = target_writer(
        &o.env,
        &o.plan,
        &o.target,
        (0, 500),
        seeded(400),
        800,
        rng.next(),
        None,
    );
    let kills = async {
        for round in 0..3 {
            wait_for_status(rekey::state::StateDir::new(&o.state).reverse_snapshot()).await;
            tokio::time::sleep(Duration::from_millis(300 + rng.below(900))).await;
            tail.kill().unwrap();
            tail.wait().unwrap();
            eprintln!("round {round}: reverse tail killed");
            tail = o.env.spawn(&reverse);
        }
        tail.kill().unwrap();
        tail.wait().unwrap();
    };
    let (writes, ()) = tokio::join!(app, kills);
    eprintln!("the application wrote {writes} changes to the target");
    let out = o.env.rekey(&[
        "reverse",
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--exit-when-idle",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        exact(&o).await,
        (0, 0, 0),
        "source == inverse(target) after kills"
    );
    // status shows both directions.
    let out = o.env.rekey(&["status", plan_s, "--state-dir", state_s]);
    let text = stdout(&out);
    assert!(
        text.contains("tail      ") && text.contains("reverse   "),
        "{text}"
    );

    // verify --reverse: clean now; then a source item changed behind the
    // tails' back, and one whose target item is gone, are reported.
    let reverse_verify = [
        "verify",
        plan_s,
        "--state-dir",
        state_s,
        "--reverse",
        "--json",
    ];
    let out = o.env.rekey(&reverse_verify);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let sources = o.env.scan_all(&o.source).await;
    let mut changed = sources[0].clone();
    changed.insert("v".into(), rekey::core::value::Value::N("-1".into()));
    o.env.put(&o.source, &[changed]).await;
    let gone = match transform(&o.plan, &sources[1]) {
        Outcome::Put { item, .. } => item,
        other => panic!("{other:?}"),
    };
    let key = rekey::aws::to_sdk_item(&gone);
    o.env
        .clients
        .dynamodb
        .delete_item()
        .table_name(&o.target)
        .key("PK", key["PK"].clone())
        .key("SK", key["SK"].clone())
        .send()
        .await
        .unwrap();
    let out = o.env.rekey(&reverse_verify);
    assert_eq!(out.status.code(), Some(4), "{}", stdout(&out));
    let r = report(&out);
    assert_eq!(
        (
            r["counts"]["different"].as_u64(),
            r["counts"]["orphans"].as_u64()
        ),
        (Some(1), Some(1)),
        "{r}"
    );
}

/// `rekey CMD` (tail or reverse) on the migration, exiting once idle for `secs`.
fn idle_tail(o: &Orders, cmd: &str, secs: &str) -> std::process::Child {
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    o.env.spawn(&[
        cmd,
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--exit-when-idle",
        secs,
    ])
}

/// Both tails, (forward, reverse): the reverse one first, so the forward tail
/// guards from its first write.
async fn both_tails(o: &Orders, secs: &str) -> (std::process::Child, std::process::Child) {
    let reverse = idle_tail(o, "reverse", secs);
    wait_for_status(rekey::state::StateDir::new(&o.state).reverse_snapshot()).await;
    (idle_tail(o, "tail", secs), reverse)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_tails_with_disjoint_writers_write_no_echo_and_both_tables_converge() {
    let o = migrated(300).await;
    let (forward, reverse) = both_tails(&o, "5").await;
    let mut rng = Rng::from_time();
    // Old instances write orders 0..375 to the source, new ones orders
    // 10000..10100 to the target: disjoint items.
    let (source_writes, target_writes) = tokio::join!(
        writer(&o.env, o.source.clone(), 300, 600, rng.next()),
        target_writer(
            &o.env,
            &o.plan,
            &o.target,
            (10_000, 100),
            HashMap::new(),
            600,
            rng.next(),
            None,
        ),
    );
    let (forward, reverse) = tokio::join!(wait_output(forward), wait_output(reverse));
    let mut tail = tail_writes(&forward) + tail_writes(&reverse);
    // A tail that went idle while its writer paused: once more, both at once.
    let (f, r) = tokio::join!(
        wait_output(idle_tail(&o, "tail", "5")),
        wait_output(idle_tail(&o, "reverse", "5"))
    );
    tail += tail_writes(&f) + tail_writes(&r);
    let app = (source_writes + target_writes) as u64;
    eprintln!("application writes {app}, tail writes {tail}");
    // An application write is one item; its replica at most a delete of the
    // old key and a put of the new. An echo would add more, and never stop.
    assert!(
        tail <= 2 * app,
        "tail writes {tail} > 2 × application writes {app}"
    );
    assert_eq!(exact(&o).await, (0, 0, 0), "both tables exact");
}

/// Regression (CI: `both_tails_with_disjoint_writers…` lost an order): the
/// reverse tail read the target's stream from its oldest record, so it took
/// the backfill's and the forward tail's writes for the application's. An
/// order the application had deleted from the source, and the forward tail
/// not yet from the target, was written back into the source; the forward
/// tail then took that write for the reverse tail's echo, and the order
/// stayed in the source only. The reverse tail starts at a line drawn
/// through the target's stream (`phase::tail::line`): nothing rekey wrote
/// before it is written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_tail_never_writes_back_what_rekey_wrote_to_the_target_before_it_started() {
    let o = migrated(30).await;
    // The application deletes one order and changes another while no
    // forward tail runs: the target still holds both as rekey wrote them.
    o.env
        .clients
        .dynamodb
        .delete_item()
        .table_name(&o.source)
        .set_key(Some(rekey::aws::to_sdk_item(&item(
            r#"{"PK":{"S":"O#1"}}"#,
        ))))
        .send()
        .await
        .unwrap_or_else(|e| panic!("delete: {}", rekey::aws::error_chain(&e)));
    o.env.put(&o.source, &[order(2, "OPEN", 2000)]).await;
    let reverse = wait_output(idle_tail(&o, "reverse", "2")).await;
    assert_eq!(
        tail_writes(&reverse),
        0,
        "the reverse tail wrote rekey's writes back"
    );
    let held = statuses(&o.env, &o.source).await;
    assert_eq!((held.get(&1), held.get(&2)), (None, Some(&"OPEN")));
    // The forward tail carries both over; both tables exact.
    tail_writes(&wait_output(idle_tail(&o, "tail", "2")).await);
    assert_eq!(exact(&o).await, (0, 0, 0), "both tables exact");
}

/// Order id → status of every order in `table` (the source), for the target
/// writer to start from. The forward tail's probes come and go in the source
/// as the application would see them: they are not orders.
async fn statuses(env: &TestEnv, table: &str) -> HashMap<u64, &'static str> {
    env.scan_all(table)
        .await
        .iter()
        .filter(|i| !is_marker(i))
        .map(|i| {
            let Some(rekey::core::value::Value::S(pk)) = i.get("PK") else {
                panic!("{i:?}")
            };
            let Some(rekey::core::value::Value::S(st)) = i.get("status") else {
                panic!("{i:?}")
            };
            let status = STATUSES.iter().find(|s| *s == st).unwrap();
            (pk.trim_start_matches("O#").parse().unwrap(), *status)
        })
        .collect()
}

/// kill -9 of a long-running tail at a random point while `writes` run, and
/// a new one started in its place.
async fn kill_during<F: std::future::Future>(
    env: &TestEnv,
    tail: &mut std::process::Child,
    args: &[&str],
    rng: &mut Rng,
    writes: F,
) -> F::Output {
    let kill = async {
        tokio::time::sleep(Duration::from_millis(500 + rng.below(1500))).await;
        tail.kill().unwrap();
        tail.wait().unwrap();
        *tail = env.spawn(args);
    };
    let (out, ()) = tokio::join!(writes, kill);
    out
}

/// Runs a switching command: its exit code and output.
fn switch(o: &Orders, cmd: &str) -> (i32, String) {
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let out = o.env.rekey(&[
        cmd,
        plan_s,
        "--state-dir",
        state_s,
        "--wait",
        "60",
        "--drain-timeout",
        "60",
    ]);
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", stdout(&out), stderr(&out)),
    )
}

/// `rekey verify` (with `--reverse`: the source against inverse(target)) is clean.
fn verify_clean(o: &Orders, extra: &[&str]) {
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let mut args = vec!["verify", plan_s, "--state-dir", state_s, "--json"];
    args.extend(extra);
    let out = o.env.rekey(&args);
    assert!(out.status.success(), "verify {extra:?}: {}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_over_roll_back_and_cut_over_again_under_live_writes_and_kill_9() {
    let o = migrated(300).await;
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let forward_args = ["tail", plan_s, "--state-dir", state_s, "--json"];
    let reverse_args = ["reverse", plan_s, "--state-dir", state_s, "--json"];
    let mut rng = Rng::from_time();
    let mut reverse = o.env.spawn(&reverse_args);
    wait_for_status(rekey::state::StateDir::new(&o.state).reverse_snapshot()).await;
    let mut forward = o.env.spawn(&forward_args);
    verify_clean(&o, &[]);

    // 1. The application writes the source; the forward tail is killed once.
    let seed1 = rng.next();
    let n = kill_during(
        &o.env,
        &mut forward,
        &forward_args,
        &mut rng,
        writer(&o.env, o.source.clone(), 300, 400, seed1),
    )
    .await;
    eprintln!("source writes: {n}");
    let (code, text) = switch(&o, "cutover");
    assert_eq!(code, 0, "cutover: {text}");
    assert_eq!(exact(&o).await, (0, 0, 0), "exact after the cutover");

    // 2. The application moves to the target; the reverse tail is killed once.
    let held = statuses(&o.env, &o.source).await;
    let seed2 = rng.next();
    let n = kill_during(
        &o.env,
        &mut reverse,
        &reverse_args,
        &mut rng,
        target_writer(&o.env, &o.plan, &o.target, (0, 375), held, 400, seed2, None),
    )
    .await;
    eprintln!("target writes: {n}");
    verify_clean(&o, &["--reverse"]);
    let (code, text) = switch(&o, "rollback");
    assert_eq!(code, 0, "rollback: {text}");
    assert!(text.contains("Rolled back at"), "{text}");
    assert_eq!(exact(&o).await, (0, 0, 0), "exact after the rollback");

    // 3. Back on the source; the forward tail is killed again; cut over again.
    let seed3 = rng.next();
    let n = kill_during(
        &o.env,
        &mut forward,
        &forward_args,
        &mut rng,
        writer(&o.env, o.source.clone(), 300, 400, seed3),
    )
    .await;
    eprintln!("source writes: {n}");
    verify_clean(&o, &[]);
    let (code, text) = switch(&o, "cutover");
    assert_eq!(code, 0, "cutover again: {text}");
    assert_eq!(exact(&o).await, (0, 0, 0), "exact after the second cutover");

    // `finish` ends both directions.
    let out = o.env.rekey(&["finish", plan_s, "--state-dir", state_s]);
    assert!(out.status.success(), "finish: {}", stdout(&out));
    let (f, r) = tokio::join!(wait_output(forward), wait_output(reverse));
    assert!(f.status.success() && r.status.success(), "both tails end");
    assert_eq!(exact(&o).await, (0, 0, 0), "exact at the end");
    assert_no_markers(&o.env, &o.source).await;
    assert_no_markers(&o.env, &o.target).await;
}

/// Regression (issue 24): `verify --reverse` re-checked a candidate with a
/// BatchGetItem whose key was the whole transformed item — refused by
/// DynamoDB ("The provided key element does not match the schema"), and on
/// the local server a false difference under live target writes (one read of
/// each side, the target read after the source). So `rekey rollback` refused
/// for as long as the application wrote the target: exactly when a rollback
/// is needed. Now: clean while the application writes, and the rollback's
/// gates pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reverse_is_clean_and_rollback_passes_its_gates_while_the_application_writes_the_target()
 {
    let o = migrated(300).await;
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let reverse = o
        .env
        .spawn(&["reverse", plan_s, "--state-dir", state_s, "--json"]);
    wait_for_status(rekey::state::StateDir::new(&o.state).reverse_snapshot()).await;
    let forward = o
        .env
        .spawn(&["tail", plan_s, "--state-dir", state_s, "--json"]);
    verify_clean(&o, &[]);
    let (code, text) = switch(&o, "cutover");
    assert_eq!(code, 0, "cutover: {text}");

    let held = statuses(&o.env, &o.source).await;
    let live = Live::default();
    let app = target_writer(
        &o.env,
        &o.plan,
        &o.target,
        (0, 375),
        held,
        usize::MAX,
        Rng::from_time().next(),
        Some(&live),
    );
    let checks = async {
        poll_until("the application's writes", Duration::from_secs(60), || {
            live.written.load(Ordering::Relaxed) > 50
        })
        .await;
        let mut verifies = Vec::new();
        for round in 0..3 {
            let cmd = o.env.command(
                &[
                    "verify",
                    plan_s,
                    "--state-dir",
                    state_s,
                    "--reverse",
                    "--json",
                    "--show-keys",
                ],
                &[],
            );
            let out = output(cmd).await;
            let r = report(&out);
            eprintln!(
                "round {round}, {} writes so far: {r}",
                live.written.load(Ordering::Relaxed)
            );
            verifies.push((out.status.code(), r));
        }
        let cmd = o.env.command(
            &[
                "rollback",
                plan_s,
                "--state-dir",
                state_s,
                "--wait",
                "60",
                "--drain-timeout",
                "60",
            ],
            &[],
        );
        let out = output(cmd).await;
        live.stop.store(true, Ordering::Relaxed);
        (verifies, out)
    };
    let (writes, (verifies, out)) = tokio::join!(app, checks);
    eprintln!("the application wrote {writes} changes to the target");
    // Both tables as they end once the tails have applied everything.
    let out_drain = o
        .env
        .rekey(&["drain", plan_s, "--state-dir", state_s, "--reverse"]);
    eprintln!(
        "drain --reverse: {}{}",
        stdout(&out_drain),
        stderr(&out_drain)
    );
    let ended = exact(&o).await;
    for (code, r) in &verifies {
        assert_eq!(*code, Some(0), "{r}");
        for k in ["missing", "different", "orphans", "unconfirmed"] {
            assert_eq!(r["counts"][k], 0, "{k}: {r}");
        }
    }
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "rollback: {text}");
    assert!(text.contains("Rolled back at"), "{text}");
    assert_eq!(ended, (0, 0, 0), "both tables exact at the end");
    for mut child in [forward, reverse] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// The phase `rekey status --json` reports.
fn phase(o: &Orders) -> serde_json::Value {
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let out = o
        .env
        .rekey(&["status", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "status: {}", stderr(&out));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["phase"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_starts_the_reverse_tail_after_cutover_and_finish_ends_both() {
    let env = TestEnv::start().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_streamed_table(&source, &pk_only()).await;
    env.create_streamed_table(&target, &pk_sk()).await;
    env.put(&source, &seed(200)).await;
    let (plan_path, plan) = orders_by_status(&source, &target).write(&env);
    let state = env.dir.path().join("state");
    let o = Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    };
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let run = o.env.spawn(&[
        "run",
        plan_s,
        "--state-dir",
        state_s,
        "--skip-analyze",
        "--json",
    ]);
    poll_until("ready_for_cutover", Duration::from_secs(120), || {
        phase(&o) == "ready_for_cutover"
    })
    .await;
    let reverse = rekey::state::StateDir::new(&o.state).reverse_snapshot();
    assert!(!reverse.exists(), "no reverse tail before the cutover");
    let (code, text) = switch(&o, "cutover");
    assert_eq!(code, 0, "cutover: {text}");
    wait_for_status(reverse).await;

    // The application writes the target; the run's reverse tail carries it back.
    let held = statuses(&o.env, &o.source).await;
    let seed = Rng::from_time().next();
    target_writer(&o.env, &o.plan, &o.target, (0, 250), held, 200, seed, None).await;
    // The run's verify predates the cutover: a rollback wants one of the source read back.
    let out = o
        .env
        .rekey(&["rollback", plan_s, "--state-dir", state_s, "--wait", "0"]);
    assert!(
        !out.status.success(),
        "a rollback on the run's forward verify"
    );
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("rekey verify --reverse"), "{text}");
    verify_clean(&o, &["--reverse"]);
    let (code, text) = switch(&o, "rollback");
    assert_eq!(code, 0, "rollback: {text}");
    assert_eq!(exact(&o).await, (0, 0, 0), "exact after the rollback");
    let out = o.env.rekey(&["status", plan_s, "--state-dir", state_s]);
    assert!(stdout(&out).contains("reverse   "), "{}", stdout(&out));

    // `finish` needs a cutover: cut over again, then finish ends both, and run exits 0.
    verify_clean(&o, &[]);
    let (code, text) = switch(&o, "cutover");
    assert_eq!(code, 0, "cutover again: {text}");
    let out = o.env.rekey(&["finish", plan_s, "--state-dir", state_s]);
    assert!(out.status.success(), "finish: {}", stdout(&out));
    let out = wait_output(run).await;
    assert!(out.status.success(), "run: {}", stderr(&out));
    assert_eq!(exact(&o).await, (0, 0, 0), "exact at the end");
    assert_no_markers(&o.env, &o.source).await;
    assert_no_markers(&o.env, &o.target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_refuses_a_plan_that_does_not_read_back_with_exit_2() {
    let env = TestEnv::start().await;
    // The order id is in no target attribute: the target item cannot say
    // which order it came from.
    let text = crate::support::plan::PlanText::new("orders", "orders_by_status").rule(
        crate::support::plan::Rule::new(
            &[("PK", "O#{id}")],
            &[("PK", "ST#{@status}"), ("SK", "{@status}")],
        ),
    );
    let (plan_path, _) = text.write(&env);
    let state = env.dir.path().join("state");
    let out = env.rekey(&[
        "reverse",
        plan_path.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be replicated back"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_items_written_on_both_sides_converge_to_one_write_on_both() {
    let o = migrated(60).await;
    let (forward, reverse) = both_tails(&o, "4").await;
    let (plan_s, state_s) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    // Orders 0..60 written at once on both sides, each side its own value
    // (same status: same target key).
    let status = |id: u64| STATUSES[(id % 3) as usize];
    let on_source = async {
        for id in 0..60 {
            o.env
                .put(&o.source, &[order(id, status(id), 100_000 + id)])
                .await;
        }
    };
    let on_target = async {
        for id in 0..60 {
            let Outcome::Put { item, .. } =
                transform(&o.plan, &order(id, status(id), 200_000 + id))
            else {
                panic!()
            };
            o.env.put(&o.target, &[item]).await;
        }
    };
    tokio::join!(on_source, on_target);
    // No ping-pong: both tails go idle and exit.
    let (f, r) = tokio::join!(wait_output(forward), wait_output(reverse));
    let tail = tail_writes(&f) + tail_writes(&r);
    assert!(
        tail <= 2 * 120,
        "tail writes {tail} for 120 application writes"
    );

    // Each order ends as one of the two writes, the same on both sides
    // (the source's, unless the target's reached the source first), and
    // verify, both ways, finds nothing.
    let v_of = |i: &Item| match i.get("v") {
        Some(rekey::core::value::Value::N(n)) => n.parse::<u64>().unwrap(),
        other => panic!("{other:?}"),
    };
    let by_id = |items: Vec<Item>| -> HashMap<u64, u64> {
        items.iter().map(|i| (v_of(i) % 100_000, v_of(i))).collect()
    };
    let source = by_id(o.env.scan_all(&o.source).await);
    let target = by_id(o.env.scan_all(&o.target).await);
    let from_source = (0..60).filter(|id| source[id] == 100_000 + id).count();
    eprintln!("{from_source} of 60 orders ended as the source's write");
    for id in 0..60 {
        assert!([100_000 + id, 200_000 + id].contains(&source[&id]));
        assert_eq!(source[&id], target[&id], "order {id}");
    }
    assert_eq!(exact(&o).await, (0, 0, 0));
    let out = o
        .env
        .rekey(&["verify", plan_s, "--state-dir", state_s, "--json"]);
    assert!(out.status.success(), "{}", stdout(&out));
}
