//! `rekey backfill --via-import` and `rekey run --via-import` against the
//! local server: the target is created by ImportTable from gzip DynamoDB JSON
//! objects rekey writes to S3 (moto serves both, and its import reads its
//! own S3), and equals transform(source) item by item; rejects and
//! collisions as in every backfill; kill -9 while objects are written, and
//! after ImportTable was called, converges with nothing duplicated or lost;
//! an existing target and an in-place plan are refused. These run on the
//! local server whatever `REKEY_TEST_ENDPOINT` says: the bucket must be one
//! the endpoint's DynamoDB imports from.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rekey::core::plan::Plan;
use rekey::core::value::{Item, Value};
use serde_json::Value as Json;

use crate::support::plan::{orders_by_status, tenant_days};
use crate::support::workload::*;
use crate::support::*;

const BUCKET: &str = "imports";

/// Orders of every attribute type, five colliding pairs, seven unmatched
/// items, and two items with an index key `tag`: one a string, one a number
/// the plan's index refuses (DynamoDB's import would skip it).
fn workload(n: usize) -> Vec<Item> {
    let mut items = with_collisions_and_unmatched((0..n).map(skewed_order).collect());
    items[1].insert("tag".into(), Value::S("vip".into()));
    items[2].insert("tag".into(), Value::N("7".into()));
    items
}

struct Setup {
    env: TestEnv,
    source: String,
    target: String,
    plan: Plan,
    plan_path: PathBuf,
    state: PathBuf,
    items: Vec<Item>,
    /// `s3://imports/<prefix>`.
    location: String,
    s3: aws_sdk_s3::Client,
}

/// A source with `n` orders and its plan (with an index on `tag`); no
/// target table: the import creates it.
async fn setup(n: usize) -> Setup {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    let items = workload(n);
    env.put(&source, &items).await;
    let (plan_path, plan) = tenant_days(&source, &target, "T#{t}#ST#{@status}")
        .source_key_prefix("src_")
        .index("ByTag", "tag")
        .write(&env);
    let s3 = client::s3(env.server()).await;
    s3.create_bucket()
        .bucket(BUCKET)
        .send()
        .await
        .expect("bucket");
    Setup {
        state: env.dir.path().join("state"),
        location: format!("s3://{BUCKET}/migrations/{target}"),
        env,
        source,
        target,
        plan,
        plan_path,
        items,
        s3,
    }
}

fn args<'a>(s: &'a Setup, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "backfill",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
        "--segments",
        "4",
        "--page-size",
        "50",
        "--via-import",
        &s.location,
        "--import-object-size",
        "16K",
        "--json",
    ];
    v.extend_from_slice(extra);
    v
}

/// The keys of the objects under the import's data folder.
async fn objects(s: &Setup) -> Vec<String> {
    let prefix = format!("migrations/{}/data/", s.target);
    let out =
        s.s3.list_objects_v2()
            .bucket(BUCKET)
            .prefix(&prefix)
            .send()
            .await
            .expect("list");
    out.contents()
        .iter()
        .filter_map(|o| o.key())
        .map(|k| k.strip_prefix(&prefix).unwrap().to_string())
        .collect()
}

/// The target equals transform(source), except that of each colliding pair
/// exactly one source item is there; `refused` (the number `tag`) is not.
async fn assert_target(s: &Setup) {
    let source_now = s.env.scan_all(&s.source).await;
    let refused_sk = s.items[2]["SK"].clone();
    let expected: std::collections::BTreeMap<_, _> = expected_target(&s.plan, &source_now)
        .into_iter()
        .filter(|(_, v)| v["SK"] != refused_sk)
        .collect();
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
}

fn assert_counts(r: &Json, n: u64) {
    let t = &r["totals"];
    assert_eq!(t["scanned"], n + 17, "{r}");
    assert_eq!(
        t["rejected"],
        7 + 5 + 1,
        "unmatched, collisions, refused: {r}"
    );
    assert_eq!(t["collisions"], 5);
    assert_eq!(t["written"], n + 5 - 1);
    let sum: u64 = ["written", "rejected", "skipped"]
        .iter()
        .map(|k| t[k].as_u64().unwrap())
        .sum();
    assert_eq!(
        t["scanned"].as_u64().unwrap(),
        sum,
        "scanned = written + rejected + skipped"
    );
    let i = &r["import"];
    assert_eq!(i["status"], "COMPLETED", "{r}");
    assert_eq!(i["imported_items"], t["written"], "{r}");
    assert_eq!(i["error_count"], 0);
    assert_eq!(r["consumed_wcu"], 0.0, "an import spends no write capacity");
}

fn assert_rejects(s: &Setup) {
    let rejects = std::fs::read_to_string(s.state.join("rejects.jsonl")).unwrap();
    assert_eq!(rejects.lines().count(), 13, "{rejects}");
    assert_eq!(rejects.matches("no rule matched").count(), 7);
    assert_eq!(
        rejects.matches("already belongs to source item C#").count(),
        5
    );
    assert_eq!(
        rejects
            .matches("index `ByTag` key `tag` is N, the index declares S: DynamoDB's import would skip the item")
            .count(),
        1,
        "{rejects}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_via_import_creates_the_target_as_transform_of_source() {
    let s = setup(1200).await;
    let out = s.env.rekey(&args(&s, &[]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    assert_counts(&r, 1200);
    assert_target(&s).await;
    assert_rejects(&s);
    assert!(s.state.join("backfill.done").exists(), "the tail may apply");
    let status = s.env.rekey(&[
        "status",
        s.plan_path.to_str().unwrap(),
        "--state-dir",
        s.state.to_str().unwrap(),
    ]);
    let line = format!(
        "import    {} objects in {}/data/; ImportTable {} COMPLETED",
        r["import"]["objects"],
        s.location,
        r["import"]["import_arn"].as_str().unwrap()
    );
    assert!(stdout(&status).contains(&line), "{}", stdout(&status));

    // Objects: several parts per segment, named by segment and part, all imported.
    let names = objects(&s).await;
    assert_eq!(names.len() as u64, r["import"]["objects"].as_u64().unwrap());
    assert!(names.len() > 8, "parts of 16 KiB: {names:?}");
    for n in &names {
        assert!(
            n.starts_with("seg-000") && n.contains("-part-") && n.ends_with(".json.gz"),
            "{n}"
        );
    }
    // The table has the plan's key and index.
    let t = s
        .env
        .clients
        .dynamodb
        .describe_table()
        .table_name(&s.target)
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    let gsis: Vec<&str> = t
        .global_secondary_indexes()
        .iter()
        .filter_map(|g| g.index_name())
        .collect();
    assert_eq!(gsis, ["ByTag"]);

    // A rerun waits on the recorded import: nothing read, nothing imported again.
    let again = s.env.rekey(&args(&s, &[]));
    assert!(again.status.success(), "{}", stderr(&again));
    let r2 = report(&again);
    assert_eq!(r2["this_run"]["scanned"], 0);
    assert_eq!(r2["totals"], r["totals"]);
    assert_eq!(r2["import"]["import_arn"], r["import"]["import_arn"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_from_an_export_via_import() {
    // Two files of ~760 items: two pages of 500 lines at most each.
    let s = setup(1500).await;
    let dir = s.env.dir.path().join("export");
    rekey_testkit::export::write_export(
        &dir,
        "01700000000000-abcdef12",
        "arn:aws:dynamodb:us-east-1:000000000000:table/src",
        s.items.iter().cloned(),
        2,
        1_700_000_000_000,
    )
    .unwrap();
    let out = s
        .env
        .rekey(&args(&s, &["--from-export", dir.to_str().unwrap()]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    assert_counts(&r, 1500);
    assert_rejects(&s);
    assert_target(&s).await;
    // A part per page of 500 lines (each over 16 KiB), each file a stream of its own.
    let names = objects(&s).await;
    let streams: std::collections::BTreeSet<&str> = names
        .iter()
        .map(|n| n.split("-part-").next().unwrap())
        .collect();
    assert_eq!(streams.len(), 2, "{names:?}");
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("exp-")), "{names:?}");
}

/// `backfill.json`'s import progress.
fn import_status(state: &Path) -> Json {
    let text = std::fs::read_to_string(state.join("backfill.json")).unwrap_or_default();
    serde_json::from_str::<Json>(&text).map_or(Json::Null, |v| v["import"].clone())
}

/// Waits until `backfill.json` satisfies `ok`; panics after `timeout`.
async fn wait_for(state: &Path, what: &str, ok: impl Fn(&Json) -> bool) -> Json {
    let started = Instant::now();
    loop {
        let i = import_status(state);
        if ok(&i) {
            return i;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no {what} within 2 minutes: {i}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_writing_objects_and_after_import_table_then_rerun_converges() {
    let s = setup(1500).await;
    // Slow reads (10 RCU/s): the objects come over seconds.
    let slow = args(&s, &["--read-rate", "10"]);
    let mut child = s.env.spawn(&slow);
    let seen = wait_for(&s.state, "committed objects", |i| {
        i["objects"].as_u64() >= Some(2)
    })
    .await;
    assert!(child.try_wait().unwrap().is_none(), "still reading: {seen}");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen["import_arn"].is_null(), "killed before ImportTable");
    let committed = rekey::state::StateStore::open(&s.state, &s.plan)
        .unwrap()
        .get::<rekey::phase::backfill::Counters>("backfill/counters")
        .unwrap()
        .unwrap();
    assert!(
        committed.scanned > 0 && committed.scanned < 1517,
        "{committed:?}"
    );

    // Its committed pages are objects, not items: going on without the
    // import (into a table made meanwhile) would lose them, and is refused.
    s.env.create_table(&s.target, &pk_sk()).await;
    let plain: Vec<&str> = args(&s, &[])
        .into_iter()
        .filter(|a| !a.starts_with("s3://") && *a != "--via-import")
        .collect();
    let out = s.env.rekey(&plain);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("run it with --via-import {}", s.location)),
        "{}",
        stderr(&out)
    );
    s.env
        .clients
        .dynamodb
        .delete_table()
        .table_name(&s.target)
        .send()
        .await
        .unwrap();

    // Killed again once ImportTable answered (the first DescribeImport comes 2 s later).
    let mut child = s.env.spawn(&args(&s, &[]));
    let started = wait_for(&s.state, "import ARN", |i| i["import_arn"].is_string()).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !s.state.join("backfill.done").exists(),
        "the kill landed while waiting for the import"
    );

    let out = s.env.rekey(&args(&s, &[]));
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    assert_eq!(r["resumed"], true);
    assert_eq!(r["this_run"]["scanned"], 0, "every page was in an object");
    assert_eq!(
        r["import"]["import_arn"], started["import_arn"],
        "ImportTable was not called again"
    );
    assert_counts(&r, 1500);
    assert_rejects(&s);
    assert_target(&s).await;
    let names = objects(&s).await;
    assert_eq!(names.len() as u64, r["import"]["objects"].as_u64().unwrap());
}

/// Someone writes into the data folder while the backfill runs: the import
/// fails on that object, and the error names the table, the import, and
/// DynamoDB's failure code and message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_import_is_an_error_naming_the_table_and_the_import() {
    let s = setup(600).await;
    let child = s.env.spawn(&args(&s, &["--read-rate", "10"]));
    wait_for(&s.state, "a committed object", |i| {
        i["objects"].as_u64() >= Some(1)
    })
    .await;
    s.s3.put_object()
        .bucket(BUCKET)
        .key(format!("migrations/{}/data/zz-not-gzip.json.gz", s.target))
        .body(Vec::from(&b"not gzip"[..]).into())
        .send()
        .await
        .unwrap();
    let out = wait_output(child).await;
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains(&format!(
            "the import into table `{}` ended FAILED: ",
            s.target
        )) && e.contains(&format!(":table/{}/import/", s.target)),
        "{e}"
    );
    assert!(!s.state.join("backfill.done").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_target_a_used_prefix_and_an_in_place_plan_are_refused() {
    let s = setup(20).await;
    s.env.create_table(&s.target, &pk_sk()).await;
    let out = s.env.rekey(&args(&s, &[]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains(&format!(
            "table `{}` exists already (DynamoDB at {}",
            s.target,
            s.env.endpoint()
        )) && e.contains("ImportTable"),
        "{e}"
    );
    assert!(!s.state.join("backfill.done").exists());

    // A data folder that holds something already: the import would load it too.
    let other = s.env.table_name("dst");
    let plan2 = s
        .env
        .file("plan2.toml", &tenant_days(&s.source, &other, "x").text());
    s.s3.put_object()
        .bucket(BUCKET)
        .key("used/data/stray.json.gz")
        .body(Vec::from(&b"x"[..]).into())
        .send()
        .await
        .unwrap();
    let state2 = s.env.dir.path().join("state2");
    let out = s.env.rekey(&[
        "backfill",
        plan2.to_str().unwrap(),
        "--state-dir",
        state2.to_str().unwrap(),
        "--via-import",
        "s3://imports/used",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("s3://imports/used/data/stray.json.gz is in the import's data folder"),
        "{}",
        stderr(&out)
    );

    // In place: the target is the source.
    let in_place = s.env.file(
        "in-place.toml",
        &format!(
            "[source]\ntable = \"{0}\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
             [target]\ntable = \"{0}\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
             [[rule]]\nmatch = {{ PK = \"T#{{t}}\" }}\nset = {{ X = \"{{t}}\" }}\n",
            s.source
        ),
    );
    let state3 = s.env.dir.path().join("state3");
    for cmd in ["backfill", "run"] {
        let out = s.env.rekey(&[
            cmd,
            in_place.to_str().unwrap(),
            "--state-dir",
            state3.to_str().unwrap(),
            "--via-import",
            "s3://imports/x",
        ]);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--via-import creates a new target table")
                || stderr(&out).contains("`rekey run` drives a re-key"),
            "{cmd}: {}",
            stderr(&out)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_via_import_under_live_writes_converges() {
    let env = TestEnv::start_local().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_streamed_table(&source, &pk_only()).await;
    env.put(&source, &seed(1000)).await;
    let (plan_path, plan) = orders_by_status(&source, &target).write(&env);
    let s3 = client::s3(env.server()).await;
    s3.create_bucket()
        .bucket(BUCKET)
        .send()
        .await
        .expect("bucket");
    let state = env.dir.path().join("state");
    let (plan_s, state_s) = (plan_path.to_str().unwrap(), state.to_str().unwrap());
    let location = format!("s3://{BUCKET}/run");

    let stop = std::sync::atomic::AtomicBool::new(false);
    let app = async {
        let mut rng = Rng::from_time();
        let mut ops = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            ops += writer(&env, source.clone(), 1000, 40, rng.next()).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ops
    };
    let operator = async {
        let out = output(env.command(
            &[
                "-q",
                "run",
                plan_s,
                "--state-dir",
                state_s,
                "--skip-analyze",
                "--exit-when-ready",
                "--segments",
                "3",
                "--page-size",
                "50",
                "--read-rate",
                "200",
                "--via-import",
                &location,
                "--import-object-size",
                "8K",
                "--recheck-timeout",
                "60",
                "--json",
            ],
            &[],
        ))
        .await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    };
    let (ops, out) = tokio::join!(app, operator);
    assert!(out.status.success(), "run: {}", stderr(&out));
    let r = report(&out);
    eprintln!("application wrote {ops} changes during the run");
    let b = &r["backfill"];
    assert_eq!(b["import"]["status"], "COMPLETED", "{r}");
    assert!(b["import"]["objects"].as_u64().unwrap() > 3, "{r}");
    assert_eq!(r["verify"]["clean"], true, "{r}");

    // The application has stopped: the tail applies what it wrote last.
    let out = env.rekey(&[
        "tail",
        plan_s,
        "--state-dir",
        state_s,
        "--exit-when-idle",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "tail: {}", stderr(&out));
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "target == transform(source)"
    );
}
