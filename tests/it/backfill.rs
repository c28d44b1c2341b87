// Slow on purpose: 126 s here (`cargo test --test it backfill::`, load 10 on 2 cores; 66 s as two binaries at load 4-7): the kill tests write at 150-300 WCU/s so that every kill -9 lands mid-run, and pause is watched for 4.5 s.
//! `rekey backfill` against the local server (moto): the result is exactly
//! transform(source); kill -9 anywhere and rerun converges without starting
//! over; a second driver is refused; pause holds the writes. And
//! `rekey backfill --from-export`: a DynamoDB S3 export (real layout: manifest
//! summary, manifest files, gzip DynamoDB JSON) into the target, from a local
//! directory and from S3 (the local server), with a malformed line and a
//! kill -9 on the way.

use std::cell::RefCell;
use std::time::Duration;

use rekey::core::plan::Plan;
use rekey::core::value::{Item, Value, encode_key};
use rekey_testkit::export::write_export;
use serde_json::Value as Json;

use crate::support;
use crate::support::plan::{tenant_days, tenant_shards};
use crate::support::workload::{skewed_order, with_collisions_and_unmatched};
use crate::support::*;

/// Orders of every attribute type, a hot tenant-day, collisions and unmatched items.
fn workload(n: usize) -> Vec<Item> {
    with_collisions_and_unmatched((0..n).map(skewed_order).collect())
}

struct Setup {
    env: TestEnv,
    source: String,
    target: String,
    plan: Plan,
    plan_path: std::path::PathBuf,
    state: std::path::PathBuf,
    items: Vec<Item>,
}

async fn setup(n: usize) -> Setup {
    let env = TestEnv::start().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    let items = workload(n);
    env.put(&source, &items).await;
    let (plan_path, plan) = tenant_days(&source, &target, "T#{t}#ST#{@status}")
        .source_key_prefix("src_")
        .drop_attrs(&["scratch"])
        .write(&env);
    let state = env.dir.path().join("state");
    Setup {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
        items,
    }
}

/// The target equals transform(source), except that of each colliding pair
/// exactly one source item won (whichever was written first).
async fn assert_exact(s: &Setup) {
    let source_now = s.env.scan_all(&s.source).await;
    let expected = expected_target(&s.plan, &source_now);
    let actual = s.env.table_map(&s.target, &["PK", "SK"]).await;
    let collide = |k: &Vec<u8>| rekey::core::value::decode_key(k)[0] == "C";
    let exp: Vec<_> = expected.iter().filter(|(k, _)| !collide(k)).collect();
    let act: Vec<_> = actual.iter().filter(|(k, _)| !collide(k)).collect();
    assert_eq!(act.len(), exp.len(), "item count");
    for ((ka, va), (ke, ve)) in act.iter().zip(&exp) {
        assert_eq!(ka, ke, "keys");
        assert_eq!(va, ve, "item {:?}", rekey::core::value::decode_key(ka));
    }
    let winners: Vec<_> = actual.iter().filter(|(k, _)| collide(k)).collect();
    assert_eq!(winners.len(), 5, "one winner per colliding target key");
    for (_, w) in winners {
        let Value::S(src) = &w["src_PK"] else {
            panic!("winner keeps its source key")
        };
        assert!(src.starts_with("C#"));
    }
}

fn backfill_args<'a>(s: &'a Setup, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "backfill",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
        "--segments",
        "4",
        "--page-size",
        "100",
        "--json",
    ];
    v.extend_from_slice(extra);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_from_scan_equals_transform_of_source() {
    let s = setup(1500).await;
    let out = s.env.rekey(&backfill_args(&s, &["--write-rate", "100000"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    let t = &r["totals"];
    eprintln!("backfill took {} s", r["elapsed_seconds"]);
    assert_eq!(t["scanned"], s.items.len() as u64);
    assert_eq!(t["rejected"], 7 + 5, "7 unmatched + 5 collisions");
    assert_eq!(t["collisions"], 5);
    assert_eq!(t["written"], 1500 + 5);
    let sum = ["written", "rejected", "skipped"]
        .iter()
        .map(|k| t[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(
        t["scanned"].as_u64().unwrap(),
        sum,
        "scanned = written + rejected + skipped"
    );
    assert!(
        r["consumed_wcu"].as_f64().unwrap() >= 1505.0,
        "accounted from ConsumedCapacity: {}",
        r["consumed_wcu"]
    );
    assert_exact(&s).await;

    // Every reject is in the rejects file, with its reason.
    let rejects = std::fs::read_to_string(s.state.join("rejects.jsonl")).unwrap();
    assert_eq!(rejects.lines().count(), 12);
    assert_eq!(rejects.matches("no rule matched").count(), 7);
    assert_eq!(
        rejects.matches("already belongs to source item C#").count(),
        5
    );

    // A rerun of a finished backfill writes nothing and changes nothing.
    let again = s.env.rekey(&backfill_args(&s, &[]));
    assert!(again.status.success(), "{}", stderr(&again));
    let r2: Json = report(&again);
    assert_eq!(r2["this_run"]["scanned"], 0);
    assert_eq!(r2["totals"], r["totals"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_then_rerun_converges_without_starting_over() {
    let s = setup(2500).await;
    let mut rng = Rng::from_time();
    // Slow enough (150 WCU/s ≈ 17 s of writes) that every kill lands mid-run.
    let args = backfill_args(&s, &["--write-rate", "150", "--concurrency", "8"]);
    let mut progress = Vec::new();
    let mut kills = 0;
    for kill in 0..6 {
        let mut child = s.env.spawn(&args);
        if kill == 0 {
            // However slow the machine, the first kill lands after a commit.
            wait_for_progress(&s.state, Duration::from_secs(120)).await;
        }
        let wait = 700 + rng.below(1500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
        let store_counts = committed_scanned(&s);
        eprintln!("kill {kill} after {wait} ms: {store_counts} items committed");
        progress.push(store_counts);
    }
    assert!(kills >= 5, "at least five kill points, got {kills}");
    assert!(
        progress.windows(2).all(|w| w[0] <= w[1]),
        "checkpoints only move forward: {progress:?}"
    );
    let before_final = *progress.last().unwrap_or(&0);
    assert!(before_final > 0, "the killed runs committed progress");
    let out = s.env.rekey(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    assert_eq!(r["resumed"], true);
    assert!(
        r["this_run"]["scanned"].as_u64().unwrap() < s.items.len() as u64,
        "the final run did not start from zero: {}",
        r["this_run"]
    );
    // Counters move with their checkpoints: every item counted exactly once.
    assert_eq!(r["totals"]["scanned"], s.items.len() as u64);
    assert_eq!(r["totals"]["rejected"], 12);
    let rejects = std::fs::read_to_string(s.state.join("rejects.jsonl")).unwrap();
    assert_eq!(
        rejects.lines().count(),
        12,
        "no duplicate rejects after crashes"
    );
    assert_exact(&s).await;
}

/// Items committed so far, read from the state store the way a resume does.
fn committed_scanned(s: &Setup) -> u64 {
    let store = rekey::state::StateStore::open(&s.state, &s.plan).expect("state store");
    store
        .get::<rekey::phase::backfill::Counters>("backfill/counters")
        .unwrap()
        .map_or(0, |c| c.scanned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_driver_is_refused_and_pause_holds_writes() {
    // 1,500 items at 150 WCU/s: ten seconds of writes, as long as the pause needs.
    let s = setup(1500).await;
    let args = backfill_args(&s, &["--write-rate", "150", "--concurrency", "4"]);
    let mut first = s.env.spawn(&args);
    // Committed progress: the first driver holds the store's lock.
    wait_for_progress(&s.state, Duration::from_secs(60)).await;
    let second = s.env.rekey(&args);
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("another rekey process is driving this plan"),
        "{}",
        stderr(&second)
    );
    // …and names the one that is.
    assert!(
        stderr(&second).contains(&format!("by pid {}: ", first.id()))
            && stderr(&second).contains("backfill"),
        "{}",
        stderr(&second)
    );

    let control = |flag: &str| {
        let out = s.env.rekey(&[
            "control",
            s.plan_path.to_str().unwrap(),
            "--state-dir",
            s.state.to_str().unwrap(),
            flag,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    // `--pause` returns once the backfill says it is paused with no write in
    // flight: from then on the target does not change (watched for 2.5 s).
    let said = control("--pause");
    assert!(
        said.contains(&format!(
            "paused: the backfill (pid {}) has no write in flight",
            first.id()
        )),
        "{said}"
    );
    let a = s.env.scan_all(&s.target).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b = s.env.scan_all(&s.target).await.len();
    assert_eq!(a, b, "no writes while paused");
    assert!(first.try_wait().unwrap().is_none(), "still running, paused");
    control("--resume");
    let out = s.env.rekey(&[
        "control",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
        "--write-rate",
        "100000",
    ]);
    assert!(out.status.success());
    let status = first.wait().unwrap();
    assert!(status.success());
    assert_exact(&s).await;
}

/// Regression for "no Ctrl-C handling": SIGTERM in the middle of a backfill
/// finishes the pages in flight, checkpoints them and says it stopped (exit
/// 143, status `stopped`); the rerun repeats none of the checkpointed pages
/// (kill -9 repeats the pages in flight: this must not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_backfill_checkpoints_and_the_rerun_repeats_no_checkpointed_page() {
    let s = setup(3000).await;
    let args = backfill_args(&s, &["--write-rate", "300"]);
    let first = s.env.spawn(&args);
    wait_for_progress(&s.state, Duration::from_secs(60)).await;
    // SAFETY: plain syscall on our own child.
    unsafe {
        libc::kill(first.id() as libc::pid_t, libc::SIGTERM);
    }
    let out = first.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(stderr(&out).contains("stopped"), "{}", stderr(&out));

    let status = s.env.rekey(&[
        "status",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
        "--json",
    ]);
    let status: Json = serde_json::from_slice(&status.stdout).unwrap();
    let b = &status["backfill"];
    assert_eq!(b["stopped"], true, "{status}");
    let checkpointed = b["scanned"].as_u64().unwrap();
    assert!(
        checkpointed > 0 && checkpointed < s.items.len() as u64,
        "stopped mid-run: {checkpointed} of {}",
        s.items.len()
    );
    let text = s.env.rekey(&[
        "status",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
    ]);
    assert!(
        stdout(&text).contains("backfill  stopped"),
        "{}",
        stdout(&text)
    );

    let out = s.env.rekey(&backfill_args(&s, &["--write-rate", "100000"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    assert_eq!(r["resumed"], true);
    assert_eq!(
        checkpointed + r["this_run"]["scanned"].as_u64().unwrap(),
        s.items.len() as u64,
        "every item scanned once over both runs: no checkpointed page repeated"
    );
    assert_exact(&s).await;
}

// `rekey backfill --from-export`.

const EXPORT_ID: &str = "01700000000000-abcdef12";

pub(crate) fn export_orders(n: usize) -> Vec<Item> {
    (0..n)
        .map(|i| {
            item(&format!(
                r#"{{"PK":{{"S":"T#t{}"}},"SK":{{"S":"O#{i:05}"}},"v":{{"N":"{i}.25"}},"b":{{"B":"AQID"}},"m":{{"M":{{"l":{{"L":[{{"S":"x"}}]}}}}}}}}"#,
                i % 13
            ))
        })
        .collect()
}

/// An export of `items` with one line replaced by garbage; returns the export
/// dir and the item that line held.
fn export_with_a_bad_line(dir: &std::path::Path, items: &[Item]) -> Item {
    let m = write_export(
        dir,
        EXPORT_ID,
        "arn:aws:dynamodb:us-east-1:000000000000:table/src",
        items.iter().cloned(),
        4,
        1_700_000_000_000,
    )
    .unwrap();
    let lost = RefCell::new(None);
    support::export::rewrite_data_file(dir, EXPORT_ID, &m.files[1].key, |line, text| {
        if line == 7 {
            *lost.borrow_mut() = Some(text);
            "{\"Item\": not json".to_string()
        } else {
            text
        }
    });
    let text = lost.into_inner().expect("file 1 has a line 7");
    rekey::core::itemline::parse_line(&text).unwrap()
}

/// `rekey backfill PLAN --from-export DIR` at 300 WCU/s (argument 8, the
/// rate, is for the caller to raise for a rerun).
fn export_backfill_args<'a>(
    plan: &'a std::path::Path,
    state: &'a std::path::Path,
    dir: &'a std::path::Path,
) -> Vec<&'a str> {
    vec![
        "backfill",
        plan.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--from-export",
        dir.to_str().unwrap(),
        "--json",
        "--write-rate",
        "300",
    ]
}

/// The source of the test: a source table is still needed (its key schema is
/// checked, and the tail reads its stream).
pub(crate) async fn export_setup(env: &TestEnv) -> (String, Plan, std::path::PathBuf) {
    let target = env.table_name("dst");
    // The plan names the source table "src".
    env.clients.create_table("src", &pk_sk(), false).await.ok();
    env.create_table(&target, &pk_sk()).await;
    let (plan_path, plan) = tenant_shards("src", &target).write(env);
    (target, plan, plan_path)
}

async fn assert_export_target(
    env: &TestEnv,
    target: &str,
    plan: &Plan,
    items: &[Item],
    lost: &[&Item],
) {
    let names = plan.source_key.names();
    let lost_keys: Vec<_> = lost.iter().map(|l| encode_key(l, &names)).collect();
    let kept: Vec<Item> = items
        .iter()
        .filter(|i| !lost_keys.contains(&encode_key(i, &names)))
        .cloned()
        .collect();
    let expected = expected_target(plan, &kept);
    let actual = env.table_map(target, &["PK", "SK"]).await;
    assert_eq!(actual.len(), items.len() - lost.len());
    assert!(actual == expected, "target == transform(export)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_from_a_local_export_with_a_bad_line_and_a_kill() {
    let env = TestEnv::start().await;
    let (target, plan, plan_path) = export_setup(&env).await;
    let mut items = export_orders(2400);
    // A number DynamoDB refuses (magnitude over 10^125): the batch fails
    // validation, the item is isolated and rejected, the rest of its batch lands.
    items[100].insert("v".into(), rekey::core::value::Value::N("1E+200".into()));
    let refused = items[100].clone();
    let dir = env.dir.path().join("export");
    let lost = export_with_a_bad_line(&dir, &items);
    let state = env.dir.path().join("state");
    let args_slow = export_backfill_args(&plan_path, &state, &dir);
    let mut child = env.spawn(&args_slow);
    wait_for_progress(&state, Duration::from_secs(120)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running when killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    let mut args = args_slow.to_vec();
    args[8] = "100000";
    let out = env.rekey(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    assert_eq!(r["resumed"], true);
    assert!(
        r["this_run"]["scanned"].as_u64().unwrap() < 2400,
        "resumed, not restarted: {}",
        r["this_run"]
    );
    assert_eq!(r["totals"]["scanned"], 2400);
    assert_eq!(r["totals"]["written"], 2398);
    assert_eq!(r["totals"]["rejected"], 2);
    let rejects = std::fs::read_to_string(state.join("rejects.jsonl")).unwrap();
    assert_eq!(rejects.lines().count(), 2);
    assert!(rejects.contains("DynamoDB refused the item"), "{rejects}");
    assert!(
        rejects.contains("/data/") && rejects.contains(".json.gz:7: "),
        "file and line: {rejects}"
    );
    assert_export_target(&env, &target, &plan, &items, &[&lost, &refused]).await;
    // Refused as DynamoDB refuses it, and nothing else was.
    let refusals = env.proxy().take_refusals();
    assert!(
        !refusals.is_empty() && refusals.iter().all(|r| r.error.contains("Number overflow")),
        "{refusals:?}"
    );
}

/// Regression: a stop in the middle of an export's data file waited forever
/// on the file's reader, which was blocked on a full channel that the
/// stopped consumer still held (in the fleet: a lease lost or a unit handed
/// back mid-file left a worker renewing its lease and reading nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_export_file_stops_rather_than_waiting_on_the_files_reader() {
    let env = TestEnv::start().await;
    let (target, plan, plan_path) = export_setup(&env).await;
    // One file of 3,000 lines: more than the reader's channel holds, so the
    // reader is blocked on it when the stop comes.
    let items = export_orders(3000);
    let dir = env.dir.path().join("export");
    write_export(
        &dir,
        EXPORT_ID,
        "arn:aws:dynamodb:us-east-1:000000000000:table/src",
        items.iter().cloned(),
        1,
        1_700_000_000_000,
    )
    .unwrap();
    let state = env.dir.path().join("state");
    let mut args = export_backfill_args(&plan_path, &state, &dir);
    let mut child = env.spawn(&args);
    wait_for_progress(&state, Duration::from_secs(120)).await;
    // SAFETY: plain syscall on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let mut code = None;
    poll_until(
        "an exit after SIGTERM (a hang is the regression)",
        Duration::from_secs(60),
        || {
            code = child.try_wait().unwrap().map(|s| s.code());
            code.is_some()
        },
    )
    .await;
    assert_eq!(code, Some(Some(143)), "stopped, checkpointed");

    args[8] = "100000";
    let out = env.rekey(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    assert_eq!(r["resumed"], true);
    assert_eq!(r["totals"]["scanned"], 3000);
    assert_export_target(&env, &target, &plan, &items, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_from_an_s3_export() {
    let env = TestEnv::start().await;
    let (target, plan, plan_path) = export_setup(&env).await;
    let items = export_orders(900);
    let dir = env.dir.path().join("export");
    let lost = export_with_a_bad_line(&dir, &items);
    let s3 = support::export::bucket("exports").await;
    support::export::upload_dir(&s3, "exports", "team/orders", &dir).await;
    let state = env.dir.path().join("state");
    let moto = shared_server().await.endpoint().to_string();
    let out = rekey_with_env(
        &[
            "backfill",
            plan_path.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--from-export",
            "s3://exports/team/orders",
            "--json",
        ],
        &[
            ("AWS_ENDPOINT_URL_DYNAMODB", &env.endpoint()),
            ("AWS_ENDPOINT_URL_S3", moto.as_str()),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Json = report(&out);
    assert_eq!(r["totals"]["scanned"], 900);
    assert_eq!(r["totals"]["rejected"], 1);
    assert_export_target(&env, &target, &plan, &items, &[&lost]).await;
}
