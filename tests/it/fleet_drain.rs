//! Drain barriers and the cutover through the fleet's own tail (issue 15):
//! `rekey worker --tail` processes hold the source's stream shards — the
//! local server's one, and beside it a quiet shard of the stream double
//! (`support::streams_double::serve_beside`) — and `rekey drain --state`,
//! `cutover --state` and `finish --state` go through them. A barrier must
//! wait for every shard's holder, so one is stopped (SIGSTOP) while the
//! marker is applied in the other shard. No marker key reaches the double's
//! shard, and its empty pages prove nothing (issue 25), so a heartbeat
//! writes a record into it each second, as an application's traffic would.

use std::collections::BTreeMap;
use std::process::{Child, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rekey::state::StateDir;
use rekey::state::fleet::Snapshot;

use crate::fleet::{LEASE_SECONDS, control_table, snapshot, wait_for};
use crate::support::plan::orders_by_status;
use crate::support::streams_double::*;
use crate::support::workload::*;
use crate::support::*;

/// The double's shard beside the local server's: open, written only by the
/// heartbeat ([`heartbeat`]).
const QUIET: &str = "shard-quiet";

fn quiet_shard() -> Double {
    Double {
        shards: vec![Shard {
            id: QUIET,
            parent: None,
            closed: false,
            records: vec![],
        }],
        expire_once: Mutex::new(vec![]),
        trimmed: vec![],
        calls: Mutex::new(Vec::new()),
        appended: Default::default(),
    }
}

/// Appends a record to the quiet shard each second until `stop`: an item
/// no plan maps (a probe marker's key), created now.
async fn heartbeat(double: &Double, stop: &AtomicBool) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = json!({"PK": {"S": format!("__rekey__#barrier#probe-heartbeat#{n}")}});
        let mut r = record(n, "INSERT", None, Some(key));
        r["dynamodb"]["ApproximateCreationDateTime"] = json!(
            std::time::UNIX_EPOCH
                .elapsed()
                .unwrap()
                .as_secs_f64()
                .floor()
        );
        double.append(QUIET, r);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The heartbeat as a task, stopped when dropped (a failed assertion too).
struct Beat(Arc<AtomicBool>, tokio::task::JoinHandle<()>);

impl Beat {
    fn start(double: Arc<Double>) -> Beat {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        Beat(
            stop,
            tokio::spawn(async move { heartbeat(&double, &s).await }),
        )
    }
}

impl Drop for Beat {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        self.1.abort();
    }
}

/// The worker processes of a test: on drop (a failed assertion too), each
/// one is continued and killed, so that none is left stopped.
struct Workers(BTreeMap<String, Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in self.0.values_mut() {
            signal(child, libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// The streams endpoint the processes are given.
const STREAMS: &str = "AWS_ENDPOINT_URL_DYNAMODB_STREAMS";

/// `rekey worker --tail` with the test's lease, its output in `log-W` (a
/// pipe nobody reads could fill and stop it).
fn spawn_tailing(
    env: &TestEnv,
    plan: &str,
    url: &str,
    w: &str,
    streams: &str,
    extra: &[&str],
) -> Child {
    let dir = env.dir.path();
    let local = dir.join(format!("state-{w}"));
    let mut args = vec![
        "worker",
        plan,
        "--state",
        url,
        "--worker-id",
        w,
        "--segments",
        "4",
        "--page-size",
        "50",
        "--lease-seconds",
        LEASE_SECONDS,
        "--tail",
        "--json",
        "--state-dir",
        local.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let log = std::fs::File::create(dir.join(format!("log-{w}"))).unwrap();
    env.command(&args, &[(STREAMS, streams)])
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

/// `rekey CMD PLAN ARGS…` with the streams endpoint, off the async workers
/// (the double serves on them).
async fn run(env: &TestEnv, streams: &str, args: &[&str]) -> Output {
    output(env.command(args, &[(STREAMS, streams)])).await
}

/// The fleet's backfill done and both shards live, under two holders.
fn two_live_holders(s: &Snapshot) -> bool {
    let done = s.meta.as_ref().is_some_and(|m| m.done_ms.is_some());
    let owners: std::collections::BTreeSet<_> = s
        .shards
        .iter()
        .filter(|u| u.cp.live)
        .filter_map(|u| u.owner.clone())
        .collect();
    done && s.shards.len() == 2 && s.shards.iter().all(|u| u.cp.live) && owners.len() == 2
}

/// A command's `--json` report (one document).
fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", stdout(out), stderr(out)))
}

/// The end of worker `w`'s log, for a failure's message.
fn log_of(env: &TestEnv, w: &str) -> String {
    let text = std::fs::read_to_string(env.dir.path().join(format!("log-{w}"))).unwrap_or_default();
    text.chars()
        .rev()
        .take(4000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_drain_waits_for_a_stopped_shard_holder_then_covers_every_acknowledged_write() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        ..
    } = Orders::start(seed(200)).await;
    let (fleet, url, _) = control_table(&env, "fdrain");
    let double = Arc::new(quiet_shard());
    let streams = serve_beside(double.clone(), env.endpoint()).await;
    let _beat = Beat::start(double);
    let plan_s = plan_path.to_str().unwrap();
    // One shard a worker: the stopped one's shard is not taken over.
    let workers = Workers(
        ["a", "b"]
            .into_iter()
            .map(|w| {
                let child = spawn_tailing(&env, plan_s, &url, w, &streams, &["--max-units", "1"]);
                (w.to_string(), child)
            })
            .collect(),
    );
    wait_for(
        &fleet,
        "both shards live under two holders",
        two_live_holders,
    )
    .await;
    let drain = |timeout: &'static str| {
        let (env, streams, url) = (&env, streams.clone(), url.clone());
        async move {
            run(
                env,
                &streams,
                &[
                    "drain",
                    plan_s,
                    "--state",
                    &url,
                    "--timeout",
                    timeout,
                    "--json",
                ],
            )
            .await
        }
    };

    let stop = AtomicBool::new(false);
    let acked = Mutex::new(BTreeMap::new());
    let application = app(&env, &source, 40, &stop, &acked);
    let test = async {
        poll_until(
            "the application's first writes",
            Duration::from_secs(60),
            || acked.lock().unwrap().len() >= 10,
        )
        .await;
        let s = snapshot(&fleet).await;
        let holder = s
            .shards
            .iter()
            .find(|u| u.id == QUIET)
            .unwrap()
            .owner
            .clone()
            .unwrap();
        signal(&workers.0[&holder], libc::SIGSTOP);
        eprintln!("{holder}, the quiet shard's holder, stopped");

        let out = drain("15").await;
        let r = json(&out);
        assert_eq!(out.status.code(), Some(3), "{r} {}", stderr(&out));
        assert_eq!(r["complete"], false, "{r}");
        // The marker was applied and observed in the live shard: only the
        // stopped holder's shard held the barrier back.
        let id = r["barrier"].as_str().unwrap();
        let s = snapshot(&fleet).await;
        let live = s.shards.iter().find(|u| u.id != QUIET).unwrap();
        assert!(
            live.barriers.contains_key(id),
            "{id} not observed: {:?}",
            s.shards
        );

        signal(&workers.0[&holder], libc::SIGCONT);
        eprintln!("{holder} continued");
        let before = acked.lock().unwrap().clone();
        let out = drain("120").await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{} {}\n{holder}: {}",
            stdout(&out),
            stderr(&out),
            log_of(&env, &holder)
        );
        assert_eq!(json(&out)["complete"], true);
        check_covered(&env, &target, &before).await;
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(application, test);

    // One more barrier after the application's last write: the target is exact.
    let out = drain("120").await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "nothing lost, nothing extra, nothing stale"
    );
}

/// Waits for a worker's exit, off the async workers (a worker that never
/// exits fails the test after three minutes rather than hanging it).
async fn exit_of(mut child: Child) -> std::process::ExitStatus {
    let pid = child.id() as libc::pid_t;
    let wait = tokio::task::spawn_blocking(move || child.wait().unwrap());
    match tokio::time::timeout(Duration::from_secs(180), wait).await {
        Ok(status) => status.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on a child this test spawned, not reaped yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the worker did not exit after finish");
        }
    }
}

/// `rekey cutover --state` with the fleet's tail end to end: the workers
/// backfill and tail (a writer during the backfill), a fleet verify, the
/// cutover's tail gate and barrier through the fleet's shards, the target
/// exact; then `finish --state`, after which the workers exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_cutover_and_finish_go_through_the_fleets_own_tail() {
    let Orders {
        env,
        source,
        target,
        state,
        ..
    } = Orders::start(seed(300)).await;
    // A key prefix: what verify --state splits the source by.
    let (plan_path, plan) = orders_by_status(&source, &target)
        .source_key_prefix("src_")
        .write(&env);
    let plan_s = plan_path.to_str().unwrap();
    let state_s = state.to_str().unwrap();
    let (fleet, url, _) = control_table(&env, "fcut");
    let double = Arc::new(quiet_shard());
    let streams = serve_beside(double.clone(), env.endpoint()).await;
    let _beat = Beat::start(double);
    let mut workers = Workers(
        ["a", "b"]
            .into_iter()
            .map(|w| {
                (
                    w.to_string(),
                    spawn_tailing(&env, plan_s, &url, w, &streams, &[]),
                )
            })
            .collect(),
    );
    let ops = writer(&env, source.clone(), 300, 300, Rng::from_time().next()).await;
    eprintln!("application wrote {ops} changes");
    wait_for(&fleet, "the backfill done, every shard live", |s| {
        s.meta.as_ref().is_some_and(|m| m.done_ms.is_some())
            && s.shards.len() == 2
            && s.shards.iter().all(|u| u.cp.live && u.owner.is_some())
    })
    .await;

    let verify_dir = env.dir.path().join("state-verify");
    let out = run(
        &env,
        &streams,
        &[
            "verify",
            plan_s,
            "--state",
            &url,
            "--worker-id",
            "v1",
            "--lease-seconds",
            LEASE_SECONDS,
            "--state-dir",
            verify_dir.to_str().unwrap(),
            "--json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = run(
        &env,
        &streams,
        &[
            "cutover",
            plan_s,
            "--state-dir",
            state_s,
            "--state",
            &url,
            "--wait",
            "60",
            "--json",
        ],
    )
    .await;
    let r = cut_over(&out);
    let tail_gate = r["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "tail caught up")
        .unwrap()
        .clone();
    assert!(
        tail_gate["detail"]
            .as_str()
            .unwrap()
            .contains("the fleet's tail")
            && tail_gate["detail"]
                .as_str()
                .unwrap()
                .contains("over 2 shards"),
        "{r}"
    );
    let barrier = r["record"]["barrier"].as_str().unwrap().to_string();
    let s = snapshot(&fleet).await;
    assert!(
        s.shards.iter().any(|u| u.barriers.contains_key(&barrier)),
        "the cutover's barrier went through the fleet's tail: {:?}",
        s.shards
    );
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0)
    );

    let out = run(
        &env,
        &streams,
        &[
            "finish",
            plan_s,
            "--state-dir",
            state_s,
            "--state",
            &url,
            "--json",
        ],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{} {}",
        stdout(&out),
        stderr(&out)
    );
    let meta = snapshot(&fleet).await.meta.unwrap();
    assert!(meta.finished_ms.is_some(), "{meta:?}");
    for (w, child) in std::mem::take(&mut workers.0) {
        let status = exit_of(child).await;
        assert!(status.success(), "{w}: {status:?}\n{}", log_of(&env, &w));
    }
    assert!(StateDir::new(&state).cutover_record().exists());
}
