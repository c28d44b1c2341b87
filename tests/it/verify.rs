// Slow on purpose: 110 s here (`cargo test --test it verify::`, load 11-12 on 2 cores; 137 s before): every test backfills first; the kill test verifies 2,000 items at 15 reads/s so the kill lands mid-run; re-checks wait for a (fake or real) tail.
//! `rekey verify` against the local server (moto): clean after a backfill; each kind of
//! corruption found (and key values kept off the terminal); `--repair` fixes
//! them; kill -9 resumes; a transient difference while the tail catches up is
//! not counted, a persistent one is, and a stalled tail leaves it unconfirmed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{SecondsFormat, Utc};
use rekey::core::plan::Plan;
use rekey::core::transform::{Outcome, transform};
use rekey::core::value::Item;
use serde_json::Value as Json;

use crate::support::plan::tenant_days;
use crate::support::workload::{even_order as order, with_collisions_and_unmatched};
use crate::support::*;

/// Orders, five colliding pairs (one of each pair is rejected), seven unmatched items.
fn workload(n: usize) -> Vec<Item> {
    with_collisions_and_unmatched((0..n).map(order).collect())
}

pub(crate) struct Setup {
    pub(crate) env: TestEnv,
    source: String,
    pub(crate) target: String,
    plan: Plan,
    pub(crate) plan_s: String,
    state: std::path::PathBuf,
    state_s: String,
    n: usize,
}

/// `n` orders (and the workload's collisions and unmatched items),
/// backfilled on one machine; `prefix`: the plan keeps the source key.
pub(crate) async fn setup(n: usize, prefix: bool) -> Setup {
    setup_plan(n, |plan| match prefix {
        true => plan.source_key_prefix("src_"),
        false => plan,
    })
    .await
}

/// [`setup`] with the plan as `shape` makes it of the tables' plan
/// ([`tenant_days`], dropping `scratch`).
pub(crate) async fn setup_plan(
    n: usize,
    shape: impl FnOnce(crate::support::plan::PlanText) -> crate::support::plan::PlanText,
) -> Setup {
    let env = TestEnv::start().await;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    env.put(&source, &workload(n)).await;
    let plan = shape(tenant_days(&source, &target, "T#{t}#ST#{@status}"));
    let (plan_path, plan) = plan.drop_attrs(&["scratch"]).write(&env);
    let state = env.dir.path().join("state");
    let s = Setup {
        plan_s: plan_path.to_str().unwrap().to_string(),
        state_s: state.to_str().unwrap().to_string(),
        env,
        source,
        target,
        plan,
        state,
        n,
    };
    let out = s.rekey(&["backfill", "--json"]);
    assert!(out.status.success(), "backfill: {}", stderr(&out));
    s
}

impl Setup {
    /// `rekey CMD PLAN --state-dir STATE ARGS…`
    fn rekey(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec![args[0], self.plan_s.as_str(), "--state-dir", &self.state_s];
        all.extend_from_slice(&args[1..]);
        self.env.rekey(&all)
    }

    pub(crate) fn verify_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["verify", self.plan_s.as_str(), "--state-dir", &self.state_s];
        v.extend_from_slice(extra);
        v
    }

    pub(crate) fn target_key(&self, source_item: &Item) -> Item {
        let Outcome::Put { item, .. } = transform(&self.plan, source_item) else {
            panic!("not a put")
        };
        ["PK", "SK"]
            .iter()
            .map(|n| (n.to_string(), item[*n].clone()))
            .collect()
    }

    fn mismatches(&self) -> Vec<Json> {
        std::fs::read_to_string(self.state.join("verify/mismatches.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn counts(r: &Json) -> &Json {
    &r["counts"]
}

fn n(v: &Json, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("no count {k} in {v}"))
}

/// The books balance: scanned = matched + mismatched + rejected + skipped.
fn assert_accounted(r: &Json) {
    let c = counts(r);
    assert_eq!(
        n(c, "scanned"),
        n(c, "matched")
            + n(c, "missing")
            + n(c, "different")
            + n(c, "unconfirmed")
            + n(c, "rejected")
            + n(c, "skipped")
            + n(c, "unsampled"),
        "{c}"
    );
    assert_eq!(n(c, "pending") + n(c, "pending_orphans"), 0, "{c}");
    assert_eq!(
        n(c, "target_scanned"),
        n(c, "target_matched") + n(c, "orphans") + n(c, "unconfirmed_orphans"),
        "{c}"
    );
}

fn all_output(o: &std::process::Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// Corrupts the target: a changed attribute (order 10), a deleted item
/// (order 20), an orphan. The key values the output must not show.
pub(crate) async fn corrupt(s: &Setup, prefix: bool) -> [&'static str; 3] {
    let ddb = &s.env.clients.dynamodb;
    let changed = s.target_key(&order(10));
    ddb.update_item()
        .table_name(&s.target)
        .set_key(Some(rekey::aws::to_sdk_item(&changed)))
        .update_expression("SET #t = :t")
        .expression_attribute_names("#t", "total")
        .expression_attribute_values(":t", AttributeValue::N("10.51".into()))
        .send()
        .await
        .unwrap();
    let deleted = s.target_key(&order(20));
    ddb.delete_item()
        .table_name(&s.target)
        .set_key(Some(rekey::aws::to_sdk_item(&deleted)))
        .send()
        .await
        .unwrap();
    let orphan = if prefix {
        item(
            r#"{"PK":{"S":"ORPHAN#zzz-secret"},"SK":{"S":"O#999999"},"src_PK":{"S":"T#ghost#D#2026-07-01"},"src_SK":{"S":"O#999999"}}"#,
        )
    } else {
        item(r#"{"PK":{"S":"ORPHAN#zzz-secret"},"SK":{"S":"O#999999"}}"#)
    };
    s.env.put(&s.target, &[orphan]).await;
    ["O#000010", "O#000020", "ORPHAN#zzz-secret"]
}

async fn corruptions_are_found_and_repaired(prefix: bool) {
    let s = setup(300, prefix).await;
    let out = s.env.rekey(&s.verify_args(&["--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let r = report(&out);
    assert_accounted(&r);
    let c = counts(&r);
    assert_eq!(n(c, "scanned"), (s.n + 17) as u64);
    assert_eq!(n(c, "matched"), (s.n + 5) as u64);
    assert_eq!((n(c, "rejected"), n(c, "collisions")), (12, 5));
    assert_eq!(n(c, "target_scanned"), (s.n + 5) as u64);
    assert_eq!(r["clean"], true);
    let result: Json =
        serde_json::from_str(&std::fs::read_to_string(s.state.join("verify/result.json")).unwrap())
            .unwrap();
    assert_eq!(result["clean"], true, "{result}");
    assert!(result["finished_at"].as_str().unwrap().ends_with('Z'));

    let secrets = corrupt(&s, prefix).await;

    let out = s.env.rekey(&s.verify_args(&["--json"]));
    assert_eq!(out.status.code(), Some(4), "{}", all_output(&out));
    let r = report(&out);
    assert_accounted(&r);
    let c = counts(&r);
    assert_eq!(
        (n(c, "different"), n(c, "missing"), n(c, "orphans")),
        (1, 1, 1),
        "{c}"
    );
    assert_eq!(r["clean"], false);
    for secret in secrets {
        assert!(
            !all_output(&out).contains(secret),
            "--json output shows a key value: {}",
            all_output(&out)
        );
    }
    let mm = s.mismatches();
    assert_eq!(mm.len(), 3, "{mm:?}");
    let by_kind = |k: &str| mm.iter().find(|m| m["kind"] == k).unwrap().clone();
    let d = by_kind("different");
    assert_eq!(d["source_key"]["SK"]["S"], "O#000010");
    assert_eq!(d["attributes"], serde_json::json!(["total"]));
    assert_eq!(by_kind("missing")["target_key"]["SK"]["S"], "O#000020");
    assert_eq!(
        by_kind("orphan")["target_key"]["PK"]["S"],
        "ORPHAN#zzz-secret"
    );

    // Plain output: labels, not keys; with --show-keys, the keys.
    let out = s.env.rekey(&s.verify_args(&[]));
    assert_eq!(out.status.code(), Some(4));
    let text = all_output(&out);
    assert!(text.contains("‹") && text.contains("DIFFERENCES"), "{text}");
    // Keys are shown as everywhere: the plan's shapes readable, values hashed.
    let tok = rekey::ops::redact::token;
    assert!(text.contains(&format!("O#{}", tok("000010"))), "{text}");
    for secret in secrets {
        assert!(!text.contains(secret), "plain output shows a key: {text}");
    }
    let out = s.env.rekey(&s.verify_args(&["--show-keys"]));
    assert_eq!(out.status.code(), Some(4));
    let text = all_output(&out);
    for secret in secrets {
        assert!(text.contains(secret), "--show-keys hides {secret}: {text}");
    }

    let out = s.env.rekey(&s.verify_args(&["--repair", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let r = report(&out);
    let rep = &r["repair"];
    assert_eq!(
        (
            n(rep, "rewritten"),
            n(rep, "deleted"),
            n(rep, "still_different")
        ),
        (2, 1, 0),
        "{rep}"
    );

    let out = s.env.rekey(&s.verify_args(&["--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let r = report(&out);
    assert_eq!(r["clean"], true);
    assert!(s.mismatches().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruptions_found_and_repaired_with_source_key_prefix() {
    corruptions_are_found_and_repaired(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruptions_found_and_repaired_through_the_expected_key_set() {
    corruptions_are_found_and_repaired(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_verifies_the_same_share_every_run() {
    let s = setup(400, false).await;
    let a = report(&s.env.rekey(&s.verify_args(&["--sample", "25", "--json"])));
    let b = report(&s.env.rekey(&s.verify_args(&["--sample", "25", "--json"])));
    assert_accounted(&a);
    let (ca, cb) = (counts(&a), counts(&b));
    assert_eq!(ca, cb, "the same items each run");
    let picked = n(ca, "scanned") - n(ca, "unsampled");
    assert!((50..170).contains(&picked), "{ca}");
    assert_eq!(n(ca, "target_scanned"), 0, "forward only");
    assert!(a["sample"]["mismatch_rate_upper_95"].as_f64().unwrap() > 0.0);
    let out = s.env.rekey(&s.verify_args(&["--sample", "0"]));
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_verify_resumes_with_the_same_counts() {
    // Half the items at half the read rate: the verify lasts as long (the kill
    // lands mid-run) for half the setup.
    let s = setup(1000, false).await;
    let args = s.verify_args(&[
        "--json",
        "--segments",
        "2",
        "--page-size",
        "50",
        "--read-rate",
        "8",
    ]);
    let mut child = s.env.spawn(&args);
    wait_for_progress(&s.state.join("verify"), Duration::from_secs(60)).await;
    let mut rng = Rng::from_time();
    tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "verify finished before the kill"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    let out = s.env.rekey(&args);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let resumed = report(&out);
    assert_eq!(resumed["resumed"], true);
    let total = n(counts(&resumed), "scanned");
    assert!(
        n(&resumed, "this_run_scanned") < total,
        "the rerun did not start from zero: {resumed}"
    );
    assert_accounted(&resumed);

    let fresh = report(&s.env.rekey(&s.verify_args(&["--json"])));
    assert_eq!(fresh["resumed"], false);
    let strip = |v: &Json| {
        let mut c = counts(v).clone();
        c["resolved"] = 0.into();
        c
    };
    assert_eq!(
        strip(&resumed),
        strip(&fresh),
        "same counts as an unbroken run"
    );
}

/// A fake tail: writes `<state>/tail/status.json` (tmp + rename) every 200 ms,
/// with `applied_through` held in the past until told it has caught up.
struct FakeTail {
    caught_up: Arc<Mutex<bool>>,
    stop: Arc<Mutex<bool>>,
}

impl FakeTail {
    fn start(state: &std::path::Path) -> FakeTail {
        let dir = state.join("tail");
        std::fs::create_dir_all(&dir).unwrap();
        let caught_up = Arc::new(Mutex::new(false));
        let stop = Arc::new(Mutex::new(false));
        let behind_at = Utc::now() - chrono::TimeDelta::seconds(60);
        let (c, st) = (caught_up.clone(), stop.clone());
        let write = move || {
            let now = Utc::now();
            let through = if *c.lock().unwrap() {
                now - chrono::TimeDelta::milliseconds(200)
            } else {
                behind_at
            };
            let f = |t: chrono::DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
            let v = serde_json::json!({"pid": 1, "updated_at": f(now), "applied_through": f(through),
                "lag_seconds": (now - through).as_seconds_f64(), "backfill_done": true, "shards": []});
            std::fs::write(dir.join("status.json.tmp"), v.to_string()).unwrap();
            std::fs::rename(dir.join("status.json.tmp"), dir.join("status.json")).unwrap();
        };
        write();
        std::thread::spawn(move || {
            while !*st.lock().unwrap() {
                write();
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        FakeTail { caught_up, stop }
    }
}

impl Drop for FakeTail {
    fn drop(&mut self) {
        *self.stop.lock().unwrap() = true;
    }
}

/// Wait until the running verify says it is waiting for the tail.
async fn wait_until_waiting_for_tail(state: &std::path::Path) {
    let start = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(state.join("verify/progress.jsonl")).unwrap_or_default();
        if text
            .lines()
            .filter_map(|l| serde_json::from_str::<Json>(l).ok())
            .any(|v| v["waiting_for_tail"] == true)
        {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "verify never waited for the tail"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_difference_is_not_counted_a_persistent_one_is() {
    let s = setup(200, false).await;
    let ddb = &s.env.clients.dynamodb;
    let tail = FakeTail::start(&s.state);

    // The application updates a source item; the (fake) tail has not applied it yet.
    let mut a = order(30);
    a.insert("total".into(), rekey::core::value::Value::N("999".into()));
    s.env.put(&s.source, std::slice::from_ref(&a)).await;
    // Drift the tail will never fix: the target changed behind rekey's back.
    let b = s.target_key(&order(40));
    ddb.update_item()
        .table_name(&s.target)
        .set_key(Some(rekey::aws::to_sdk_item(&b)))
        .update_expression("SET #t = :t")
        .expression_attribute_names("#t", "total")
        .expression_attribute_values(":t", AttributeValue::N("1".into()))
        .send()
        .await
        .unwrap();

    let args = s.verify_args(&["--json", "--recheck-timeout", "60"]);
    let child = s.env.spawn(&args);
    wait_until_waiting_for_tail(&s.state).await;
    // The tail applies the pending change, then reports that it has caught up.
    let Outcome::Put { item: a_target, .. } = transform(&s.plan, &a) else {
        panic!()
    };
    s.env.put(&s.target, &[a_target]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    *tail.caught_up.lock().unwrap() = true;
    let out = wait_output(child).await;
    assert_eq!(out.status.code(), Some(4), "{}", all_output(&out));
    let r = report(&out);
    assert_accounted(&r);
    let c = counts(&r);
    assert_eq!(
        (n(c, "different"), n(c, "missing"), n(c, "unconfirmed")),
        (1, 0, 0),
        "{c}"
    );
    assert!(
        n(c, "resolved") >= 1,
        "the transient one was a candidate: {c}"
    );
    let mm = s.mismatches();
    assert_eq!(mm.len(), 1);
    assert_eq!(mm[0]["source_key"]["SK"]["S"], "O#000040");

    // A tail that stopped updating its status: the difference cannot be settled.
    drop(tail);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let old =
        (Utc::now() - chrono::TimeDelta::seconds(120)).to_rfc3339_opts(SecondsFormat::Millis, true);
    std::fs::write(
        s.state.join("tail/status.json"),
        serde_json::json!({"pid": 1, "updated_at": old, "applied_through": old,
            "lag_seconds": 0.0, "backfill_done": true, "shards": []})
        .to_string(),
    )
    .unwrap();
    let out = s.env.rekey(&s.verify_args(&[]));
    assert_eq!(out.status.code(), Some(4), "{}", all_output(&out));
    let text = all_output(&out);
    assert!(
        text.contains("1 unconfirmed") && text.contains("not running"),
        "{text}"
    );
}

/// The stream watch verify's orphan pass relies on: every write after it
/// starts, mapped to its target key, and nothing from before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_watch_sees_every_write_after_it_starts_and_none_before() {
    use crate::support::workload::{Orders, order, seed};
    let o = Orders::start(seed(3)).await;
    let c = &o.env.clients;
    let mut watch = rekey::phase::watch::Watch::start(c, &o.plan)
        .await
        .unwrap()
        .expect("the source has a stream");
    let writes = [order(0, "PAID", 10), order(7, "SHIPPED", 11)];
    o.env.put(&o.source, &writes).await;
    c.dynamodb
        .delete_item()
        .table_name(&o.source)
        .key("PK", AttributeValue::S("O#1".into()))
        .send()
        .await
        .unwrap();
    let after = Utc::now().timestamp_millis() as f64 / 1000.0;
    let mut seen = Vec::new();
    let started = std::time::Instant::now();
    // Only records prove the watch read past an instant: probe markers, as
    // verify writes them while it waits on the watch.
    let id = rekey::phase::markers::new_probe_id();
    let mut probes = 0;
    let rounds = tempfile::tempdir().unwrap();
    let ledger = rekey::state::markers::Ledger::new(rounds.path());
    while watch.through().is_none_or(|t| t < after) {
        let markers = rekey::phase::markers::Markers {
            clients: c,
            key: &o.plan.source_key,
            table: &o.source,
            id: &id,
            started_at: after,
            ledger: &ledger,
        };
        probes += markers.round(probes, 1).await.unwrap();
        seen.extend(watch.poll().await.unwrap());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the watch did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tnames = o.plan.target_key.names();
    let mut expected: Vec<(Vec<u8>, Item)> = writes
        .iter()
        .map(|w| {
            let Outcome::Put { item, .. } = transform(&o.plan, w) else {
                panic!("{w:?} maps")
            };
            let key: Item = [("PK".to_string(), w["PK"].clone())].into();
            (rekey::core::value::encode_key(&item, &tnames).unwrap(), key)
        })
        .collect();
    let deleted: Item = [("PK".to_string(), s("O#1"))].into();
    assert!(
        seen.iter()
            .any(|t| t.source_key == deleted && t.target_key.is_none()),
        "the delete is seen, mapping to nothing: {seen:?}"
    );
    let mut got: Vec<(Vec<u8>, Item)> = seen
        .into_iter()
        .filter_map(|t| Some((t.target_key?, t.source_key)))
        .collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got, expected,
        "the seed's inserts are from before the watch"
    );
}

/// Regression (a CI failure of the lifecycle test): an order that moved to
/// another status after the orphan pass read it, and back, was reported an
/// orphan — the pass is not a snapshot. Orders here change status all the
/// time under a running tail, often back to what they were; verify must
/// confirm no orphan (and no difference) that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_moving_between_statuses_during_verify_are_not_orphans() {
    use crate::support::workload::{Orders, STATUSES, seed};
    let o = Orders::start(seed(300)).await;
    let (plan, state) = (o.plan_path.to_str().unwrap(), o.state.to_str().unwrap());
    let out = o.env.rekey(&["-q", "backfill", plan, "--state-dir", state]);
    assert!(out.status.success(), "backfill: {}", stderr(&out));
    let mut tail = o.env.spawn(&["-q", "tail", plan, "--state-dir", state]);
    // Without a tail status verify assumes writes have stopped: wait for one.
    let status = rekey::state::StateDir::new(&o.state).tail_snapshot();
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&status).is_ok_and(|t| t.contains("applied_through\": \"")) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the tail never caught up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let stop = std::sync::atomic::AtomicBool::new(false);
    let flipper = async {
        let mut rng = Rng::from_time();
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let id = rng.below(30);
            o.env
                .clients
                .dynamodb
                .update_item()
                .table_name(&o.source)
                .key("PK", AttributeValue::S(format!("O#{id}")))
                // Only the status: an order often reads the same after two
                // writes (A→B→A), which content alone cannot tell from no write.
                .update_expression("SET #s = :s")
                .expression_attribute_names("#s", "status")
                .expression_attribute_values(
                    ":s",
                    AttributeValue::S(STATUSES[rng.below(3) as usize].into()),
                )
                .send()
                .await
                .unwrap();
            n += 1;
            if n.is_multiple_of(5) {
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
        n
    };
    let verify = async {
        let args = [
            "--show-keys",
            "verify",
            plan,
            "--state-dir",
            state,
            "--json",
            "--page-size",
            "25",
            "--recheck-timeout",
            "60",
        ];
        let mut cmd = o.env.command(&args, &[]);
        let out = tokio::task::spawn_blocking(move || {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn rekey")
                .wait_with_output()
                .unwrap()
        })
        .await
        .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    };
    let (flips, out) = tokio::join!(flipper, verify);
    tail.kill().unwrap();
    tail.wait().unwrap();
    let r = report(&out);
    let c = counts(&r);
    eprintln!("{flips} status changes during verify; counts {c}");
    let mismatches = std::fs::read_to_string(o.state.join("verify").join("mismatches.jsonl"))
        .unwrap_or_default();
    for kind in ["orphans", "missing", "different"] {
        assert_eq!(c[kind], 0, "{kind}: {c}\n{mismatches}");
    }
    assert!(
        c["resolved"].as_u64().unwrap() > 0,
        "the status changes must have made candidates for the re-check: {c}"
    );
}
