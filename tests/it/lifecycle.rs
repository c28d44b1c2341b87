// Slow on purpose: 88 s here (`cargo test --test it lifecycle::`, load 10 on 2 cores; 88 s before): `rekey run` killed at ten random points (0.7-3.2 s apart), then run to ready-for-cutover, three verifies, cutover and finish, all under live writes.
//! The whole migration as an operator runs it, against the local server, while an
//! application keeps writing: `rekey run` (killed with kill -9 at ten random
//! points across its phases) to ready-for-cutover; a verify that finds, and
//! `--repair` fixes, deliberately corrupted target items; `rekey cutover`
//! through the postpone flag; `rekey finish`; then an independent comparison
//! of the target with transform(source).

use std::time::{Duration, Instant};

use rekey::core::value::{Item, Value};

use crate::support::workload::*;
use crate::support::*;

fn status(env: &TestEnv, plan: &str, state: &str) -> serde_json::Value {
    let out = env.rekey(&["status", plan, "--state-dir", state, "--json"]);
    assert!(out.status.success(), "status: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Orders the application never touches (ids from 9000): safe to corrupt.
fn untouched(n: u64) -> Vec<Item> {
    (9000..9000 + n).map(|i| order(i, "OPEN", i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_to_cutover_under_live_writes_with_kills_corruptions_and_postpone() {
    // Skewed: most orders are OPEN, the status the old design would key on.
    let mut seed: Vec<Item> = (0..1200)
        .map(|i| {
            order(
                i,
                STATUSES[usize::from(i % 10 >= 7) + usize::from(i % 10 == 9)],
                i,
            )
        })
        .collect();
    seed.extend(untouched(10));
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start(seed).await;
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    let run_args = [
        "-q",
        "--show-keys",
        "run",
        plan_s,
        "--state-dir",
        state_s,
        "--app-write-rate",
        "200",
        "--segments",
        "3",
        "--page-size",
        "50",
        "--read-rate",
        "300",
        "--write-rate",
        "300",
        "--recheck-timeout",
        "60",
    ];

    let stop = std::sync::atomic::AtomicBool::new(false);
    // The application acknowledges that it stopped: its last write is done.
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let app = async {
        let mut rng = Rng::from_time();
        let mut ops = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            ops += writer(&env, source.clone(), 1200, 40, rng.next()).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stopped_tx.send(());
        ops
    };
    let operator = async {
        // Ten kill -9 points across the phases, each after a random time.
        let mut rng = Rng::from_time();
        let mut phases_killed = Vec::new();
        for _ in 0..10 {
            let mut run = env.spawn(&run_args);
            tokio::time::sleep(Duration::from_millis(700 + rng.below(2500))).await;
            let phase = status(&env, plan_s, state_s)["phase"].clone();
            if run.try_wait().unwrap().is_none() {
                run.kill().unwrap();
            }
            let exit = run.wait().unwrap();
            phases_killed.push((phase, exit.code()));
        }
        eprintln!("kill points (phase, exit): {phases_killed:?}");

        // The last run reaches ready-for-cutover and keeps tailing.
        let mut run = env.spawn(&run_args);
        let started = Instant::now();
        loop {
            let s = status(&env, plan_s, state_s);
            if s["phase"] == "ready_for_cutover" {
                eprintln!("ready after {:?}: {}", started.elapsed(), s["verify"]);
                let text = env.rekey(&["status", plan_s, "--state-dir", state_s]);
                eprintln!("rekey status:\n{}", stdout(&text));
                break;
            }
            if let Some(code) = run.try_wait().unwrap() {
                let out = run.wait_with_output().unwrap();
                let mismatches =
                    std::fs::read_to_string(state.join("verify").join("mismatches.jsonl"))
                        .unwrap_or_default();
                panic!(
                    "run exited {code:?} before ready: {}{}\nstatus: {s}\nmismatches:\n{mismatches}",
                    stdout(&out),
                    stderr(&out)
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "not ready in 10 min: {s}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // Corrupt three target items the application never touches.
        let target_items = env.table_map(&target, &["PK", "SK"]).await;
        let of = |id: u64| {
            target_items
                .iter()
                .find(|(_, v)| v["SK"] == Value::S(format!("O#{id}")))
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let mut changed = of(9001);
        changed.insert("v".into(), Value::N("-1".into()));
        env.put(&target, &[changed]).await;
        let missing = of(9002);
        env.clients
            .dynamodb
            .delete_item()
            .table_name(&target)
            .set_key(Some(rekey::aws::to_sdk_item(
                &missing
                    .iter()
                    .filter(|(k, _)| *k == "PK" || *k == "SK")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )))
            .send()
            .await
            .unwrap();
        let mut orphan = of(9003);
        orphan.insert("SK".into(), Value::S("O#77777".into()));
        env.put(&target, &[orphan]).await;

        let verify = |extra: &[&str]| {
            let mut args = vec![
                "verify",
                plan_s,
                "--state-dir",
                state_s,
                "--json",
                "--restart",
            ];
            args.extend_from_slice(extra);
            env.rekey(&args)
        };
        // One verify finds and repairs (its counts are what it found; the
        // verify tests check the exit code of one that only finds).
        let out = verify(&["--repair"]);
        assert!(out.status.success(), "repair: {}", stderr(&out));
        let r = report(&out);
        let c = &r["counts"];
        assert_eq!(
            (
                c["missing"].as_u64(),
                c["different"].as_u64(),
                c["orphans"].as_u64()
            ),
            (Some(1), Some(1), Some(1)),
            "exactly the three corruptions, no false alarm from live writes: {r}"
        );
        assert_eq!(
            (
                r["repair"]["rewritten"].as_u64(),
                r["repair"]["deleted"].as_u64()
            ),
            (Some(2), Some(1)),
            "the missing and the different item rewritten, the orphan deleted: {r}"
        );
        let out = verify(&[]);
        assert!(out.status.success(), "clean after repair: {}", stderr(&out));

        // Cutover, at the moment the operator chooses: postponed by the flag file.
        std::fs::write(state.join("postpone"), b"").unwrap();
        let mut cut = env.spawn(&[
            "cutover",
            plan_s,
            "--state-dir",
            state_s,
            "--json",
            "--max-lag",
            "30",
        ]);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            cut.try_wait().unwrap().is_none(),
            "cutover waits while postponed"
        );
        assert!(!state.join("cutover.json").exists());
        std::fs::remove_file(state.join("postpone")).unwrap();
        let out = wait_output(cut).await;
        cut_over(&out);
        assert_eq!(status(&env, plan_s, state_s)["phase"], "cut_over");

        // The application has switched: no more writes to the source once it
        // says its last one is done (a write after finish's barrier is the
        // application's bug, not rekey's).
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        stopped_rx.await.expect("the application stops");
        let out = env.rekey(&["finish", plan_s, "--state-dir", state_s, "--json"]);
        assert!(out.status.success(), "finish: {}", stderr(&out));
        let exit = tokio::task::spawn_blocking(move || run.wait().unwrap())
            .await
            .unwrap();
        assert!(exit.success(), "run stops cleanly after finish");
        assert_eq!(status(&env, plan_s, state_s)["phase"], "finished");
    };
    let (ops, ()) = tokio::join!(app, operator);
    eprintln!("application wrote {ops} changes during the migration");

    // Independent comparison: target == transform(source), exactly.
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "target == transform(source)"
    );
}
