// Slow on purpose: 106 s here (`cargo test --test it inplace::`, load 10-12 on 2 cores; 92 s before): backfill, tail and 1,200 application writes run together, then verify and an undo under writes; the kill test writes at 150 WCU/s so the kill lands mid-run.
//! In-place mode against the local server (moto): a bucketed status GSI added to a live
//! table (plans/status-gsi-in-place.toml) while the application keeps
//! changing statuses and writing whole items without the new attributes.
//! Backfill and tail together leave every item's computed attributes right,
//! the tail never follows its own writes (its writes are bounded by the
//! application's), the GSI answers per bucket, and undo takes the attributes
//! away again without touching what the application wrote.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, ScalarAttributeType, Select, StreamSpecification,
    StreamViewType,
};
use rekey::core::plan::Plan;
use rekey::core::transform::{Outcome, transform};
use rekey::core::value::{Item, Value};
use rekey::phase::inplace::check_item;

use crate::support::*;

const STATUSES: [&str; 3] = ["OPEN", "WAITING", "DONE"];
const TENANTS: u64 = 3;

/// The table with its stream and the GSI on the new attributes, as the
/// operator would create the index before the backfill.
async fn create_tasks_table(env: &TestEnv, table: &str) {
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
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(def("PK"))
        .attribute_definitions(def("SK"))
        .attribute_definitions(def("GSI2PK"))
        .attribute_definitions(def("GSI2SK"))
        .key_schema(key("PK", KeyType::Hash))
        .key_schema(key("SK", KeyType::Range))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name("GSI2")
                .key_schema(key("GSI2PK", KeyType::Hash))
                .key_schema(key("GSI2SK", KeyType::Range))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .unwrap(),
        )
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {table}: {}", rekey::aws::error_chain(&e)));
}

/// plans/status-gsi-in-place.toml, on `table`.
fn tasks_plan(table: &str) -> String {
    std::fs::read_to_string(repo_path("plans/status-gsi-in-place.toml"))
        .unwrap()
        .replace("table = \"tasks\"", &format!("table = \"{table}\""))
}

fn task(id: u64, status: &str) -> Item {
    item(&format!(
        r#"{{"PK":{{"S":"TENANT#t{}"}},"SK":{{"S":"TASK#{id}"}},"status":{{"S":"{status}"}},"created_at":{{"S":"2026-0{}-1{}T10:00:00Z"}},"title":{{"S":"task {id}"}}}}"#,
        id % TENANTS,
        1 + id % 6,
        id % 10
    ))
}

fn note(id: u64) -> Item {
    item(&format!(
        r#"{{"PK":{{"S":"TENANT#t{}"}},"SK":{{"S":"NOTE#{id}"}},"text":{{"S":"not a task"}}}}"#,
        id % TENANTS
    ))
}

/// The application: status changes of existing tasks, and whole items put
/// without the new attributes (new tasks and overwrites). Returns its writes.
async fn app(env: &TestEnv, table: &str, ids: u64, ops: usize, seed: u64) -> u64 {
    let mut rng = Rng(seed);
    let c = &env.clients.dynamodb;
    let mut writes = 0;
    for n in 0..ops {
        let id = rng.below(ids + ids / 5);
        let status = STATUSES[rng.below(3) as usize];
        if rng.below(10) < 7 {
            let t = task(id, status);
            let r = c
                .update_item()
                .table_name(table)
                .key("PK", rekey::aws::to_sdk(&t["PK"]))
                .key("SK", rekey::aws::to_sdk(&t["SK"]))
                .update_expression("SET #s = :s")
                .condition_expression("attribute_exists(PK)")
                .expression_attribute_names("#s", "status")
                .expression_attribute_values(":s", AttributeValue::S(status.into()))
                .send()
                .await;
            match r {
                Ok(_) => writes += 1,
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_conditional_check_failed_exception()) => {}
                Err(e) => panic!("app update: {}", rekey::aws::error_chain(&e)),
            }
        } else {
            c.put_item()
                .table_name(table)
                .set_item(Some(rekey::aws::to_sdk_item(&task(id, status))))
                .send()
                .await
                .unwrap_or_else(|e| panic!("app put: {}", rekey::aws::error_chain(&e)));
            writes += 1;
        }
        if n % 25 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    writes
}

fn computed(plan: &Plan, it: &Item) -> Option<Item> {
    match transform(plan, it) {
        Outcome::Put { item, .. } => Some(item),
        _ => None,
    }
}

async fn gsi_count(env: &TestEnv, table: &str, pk: &str) -> u64 {
    let mut n = 0;
    let mut start = None;
    loop {
        let out = env
            .clients
            .dynamodb
            .query()
            .table_name(table)
            .index_name("GSI2")
            .key_condition_expression("GSI2PK = :p")
            .expression_attribute_values(":p", AttributeValue::S(pk.into()))
            .select(Select::Count)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap_or_else(|e| panic!("query GSI2: {}", rekey::aws::error_chain(&e)));
        n += out.count as u64;
        match out.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return n,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_backfill_tail_and_undo_under_live_writes() {
    let env = TestEnv::start().await;
    let table = env.table_name("tasks");
    create_tasks_table(&env, &table).await;
    let ids = 600;
    let mut seed: Vec<Item> = (0..ids)
        .map(|i| task(i, STATUSES[(i % 3) as usize]))
        .collect();
    seed.extend((0..30).map(note));
    env.put(&table, &seed).await;

    let text = tasks_plan(&table);
    let plan_path = env.file("plan.toml", &text);
    let plan = Plan::parse(&text, &plan_path).unwrap();
    let state = env.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());

    // The tail first, then the backfill, while the application writes.
    let tail = env.spawn(&[
        "tail",
        plan_s,
        "--state-dir",
        state_s,
        "--exit-when-idle",
        "4",
        "--json",
    ]);
    let writes = app(&env, &table, ids, 1200, Rng::from_time().next());
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
            "50",
            "--concurrency",
            "8",
        ];
        let child = env.spawn(&args);
        wait_output(child).await
    };
    let (writes, out) = tokio::join!(writes, backfill);
    assert!(out.status.success(), "backfill: {}", stderr(&out));
    let b = report(&out);
    eprintln!("application: {writes} writes; backfill: {}", b["totals"]);
    let t = &b["totals"];
    assert_eq!(
        t["scanned"].as_u64(),
        Some(
            t["written"].as_u64().unwrap()
                + t["rejected"].as_u64().unwrap()
                + t["skipped"].as_u64().unwrap()
        )
    );
    assert_eq!(t["rejected"].as_u64(), Some(0), "{b}");
    assert!(
        t["skipped"].as_u64().unwrap() >= 30,
        "the notes are skipped"
    );

    let out = wait_output(tail).await;
    assert!(out.status.success(), "tail: {}", stderr(&out));
    let r = report(&out);
    eprintln!("tail: {r}");
    let updates = r["updates"].as_u64().unwrap();
    assert!(
        updates <= writes,
        "no loop: {updates} tail writes for {writes} application writes"
    );
    assert_eq!(r["puts"].as_u64(), Some(0));
    assert_eq!(r["deletes"].as_u64(), Some(0));

    // Every item holds exactly what the plan computes from it.
    let items = env.scan_all(&table).await;
    let mut wrong = Vec::new();
    let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
    for it in &items {
        if let Some(d) = check_item(&plan, it) {
            wrong.push(d);
        }
        if let Some(c) = computed(&plan, it) {
            assert_eq!(&c, it, "the item is its own transform");
            let Some(Value::S(pk)) = c.get("GSI2PK") else {
                panic!()
            };
            *per_key.entry(pk.clone()).or_default() += 1;
        } else {
            assert!(!it.contains_key("GSI2PK"), "{it:?}");
        }
    }
    assert!(
        wrong.is_empty(),
        "{} items differ: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
    assert!(per_key.len() > 20, "buckets: {}", per_key.len());

    // The GSI per bucket: what the items say.
    for (pk, n) in &per_key {
        assert_eq!(gsi_count(&env, &table, pk).await, *n, "GSI2PK = {pk}");
    }

    // `rekey verify` on the in-place plan agrees, then finds a computed
    // attribute gone wrong (the tail is stopped, so nothing would fix it).
    let verify = |env: &TestEnv| env.rekey(&["verify", plan_s, "--state-dir", state_s, "--json"]);
    let out = verify(&env);
    assert!(
        out.status.success(),
        "in-place verify clean: {}",
        stdout(&out)
    );
    let r = report(&out);
    assert_eq!(
        r["counts"]["scanned"].as_u64(),
        Some(items.len() as u64),
        "{r}"
    );
    let victim = items
        .iter()
        .find(|i| i.contains_key("GSI2PK"))
        .cloned()
        .unwrap();
    let mut broken = victim.clone();
    broken.insert("GSI2PK".into(), Value::S("WRONG".into()));
    env.put(&table, &[broken]).await;
    let out = verify(&env);
    assert_eq!(out.status.code(), Some(4), "{}", stdout(&out));
    let r = report(&out);
    assert_eq!(r["counts"]["different"].as_u64(), Some(1), "{r}");
    env.put(&table, &[victim]).await;

    // Undo, the tail stopped. The application first sets its own GSI2SK on a
    // few tasks: undo must leave those alone, and whatever the application
    // writes during the undo too.
    let c = &env.clients.dynamodb;
    let mut own = BTreeMap::new();
    for id in (0..ids).step_by(50) {
        let t = task(id, "OPEN");
        let v = format!("APP#{id}");
        c.update_item()
            .table_name(&table)
            .key("PK", rekey::aws::to_sdk(&t["PK"]))
            .key("SK", rekey::aws::to_sdk(&t["SK"]))
            .update_expression("SET GSI2SK = :v")
            .expression_attribute_values(":v", AttributeValue::S(v.clone()))
            .send()
            .await
            .unwrap();
        own.insert(id, v);
    }
    let before: BTreeMap<Vec<u8>, Item> = env.table_map(&table, &["PK", "SK"]).await;
    let touch = async {
        // Application writes to a non-input attribute while the undo runs.
        let mut touched = BTreeMap::new();
        for id in (1..ids).step_by(7) {
            let t = task(id, "OPEN");
            let v = format!("seen {id}");
            c.update_item()
                .table_name(&table)
                .key("PK", rekey::aws::to_sdk(&t["PK"]))
                .key("SK", rekey::aws::to_sdk(&t["SK"]))
                .update_expression("SET seen = :v")
                .expression_attribute_values(":v", AttributeValue::S(v.clone()))
                .send()
                .await
                .unwrap();
            touched.insert(
                rekey::core::value::encode_key(&t, &["PK", "SK"]).unwrap(),
                v,
            );
        }
        touched
    };
    let undo = async {
        let args = [
            "undo",
            plan_s,
            "--state-dir",
            state_s,
            "--json",
            "--segments",
            "2",
            "--page-size",
            "50",
        ];
        let child = env.spawn(&args);
        wait_output(child).await
    };
    let (touched, out) = tokio::join!(touch, undo);
    assert!(out.status.success(), "undo: {}", stderr(&out));
    let u = report(&out);
    eprintln!("undo: {}", u["totals"]);
    assert!(u["totals"]["written"].as_u64().unwrap() >= ids - 20);

    let after = env.table_map(&table, &["PK", "SK"]).await;
    assert_eq!(after.len(), before.len(), "undo deletes nothing");
    for (k, was) in &before {
        let mut expected = was.clone();
        if let Some(c) = computed(&plan, was) {
            for a in ["GSI2PK", "GSI2SK"] {
                if was.get(a) == c.get(a) {
                    expected.remove(a);
                }
            }
        }
        if let Some(v) = touched.get(k) {
            expected.insert("seen".into(), Value::S(v.clone()));
        }
        assert_eq!(after.get(k), Some(&expected));
    }
    for (id, v) in &own {
        let k = rekey::core::value::encode_key(&task(*id, "OPEN"), &["PK", "SK"]).unwrap();
        assert_eq!(
            after[&k].get("GSI2SK"),
            Some(&Value::S(v.clone())),
            "the application's own value stays"
        );
    }
    assert_eq!(
        gsi_count(&env, &table, per_key.keys().next().unwrap()).await,
        0
    );

    // An undo of a re-key plan is refused.
    let rekey_plan = env.file(
        "rekey.toml",
        &text.replace(
            &format!("[target]\ntable = \"{table}\""),
            "[target]\ntable = \"other\"",
        ),
    );
    let out = env.rekey(&[
        "undo",
        rekey_plan.to_str().unwrap(),
        "--state-dir",
        env.dir.path().join("s2").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("undo removes what an in-place plan added"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_backfill_resumes_after_kill_9() {
    let env = TestEnv::start().await;
    let table = env.table_name("tasks");
    create_tasks_table(&env, &table).await;
    let ids = 1500;
    let mut seed: Vec<Item> = (0..ids)
        .map(|i| task(i, STATUSES[(i % 3) as usize]))
        .collect();
    seed.extend((0..20).map(note));
    env.put(&table, &seed).await;
    let text = tasks_plan(&table);
    let plan_path = env.file("plan.toml", &text);
    let plan = Plan::parse(&text, &plan_path).unwrap();
    let state = env.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    let args = [
        "backfill",
        plan_s,
        "--state-dir",
        state_s,
        "--json",
        "--segments",
        "2",
        "--page-size",
        "50",
        "--write-rate",
        "150",
    ];
    let mut child = env.spawn(&args);
    wait_for_progress(&state, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running when killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let partly = env
        .scan_all(&table)
        .await
        .iter()
        .filter(|i| i.contains_key("GSI2PK"))
        .count();
    assert!(
        partly > 0 && partly < ids as usize,
        "killed mid-run: {partly}"
    );

    let out = env.rekey(&args[..args.len() - 2]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    let t = &r["totals"];
    eprintln!("resumed: {r}");
    assert_eq!(r["resumed"], true);
    let (scanned, written, skipped) = (
        t["scanned"].as_u64().unwrap(),
        t["written"].as_u64().unwrap(),
        t["skipped"].as_u64().unwrap(),
    );
    assert_eq!(t["rejected"].as_u64(), Some(0));
    assert_eq!(scanned, written + skipped);
    // Pages in flight at the kill are scanned again: their items are then right (skipped).
    assert!(scanned >= ids + 20);
    assert!(
        written <= ids && written >= ids - partly as u64,
        "{written}"
    );
    let items = env.scan_all(&table).await;
    assert!(items.iter().all(|i| check_item(&plan, i).is_none()));
    assert_eq!(
        items.iter().filter(|i| i.contains_key("GSI2PK")).count(),
        ids as usize
    );
}

/// The conditional write itself: a decision computed from an image the
/// application has since changed is not applied as computed — rekey re-reads
/// and writes what the current item needs; an item deleted meanwhile stays
/// deleted; a write that is no longer needed is not made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_decision_is_recomputed_and_a_deleted_item_stays_deleted() {
    use rekey::aws::rate::Control;
    use rekey::phase::inplace::{Applied, Decision, Direction, apply, plan_update};
    let env = TestEnv::start().await;
    let table = env.table_name("tasks");
    create_tasks_table(&env, &table).await;
    let plan = Plan::parse(&tasks_plan(&table), std::path::Path::new("plan.toml")).unwrap();
    let control = Control::new(None, None);
    let key = |t: &Item| rekey::core::value::encode_key(t, &["PK", "SK"]).unwrap();

    // Read as OPEN; the application makes it DONE before rekey writes.
    let read = task(1, "OPEN");
    env.put(&table, std::slice::from_ref(&read)).await;
    let stale = plan_update(&plan, &read);
    assert!(matches!(stale, Decision::Write(_)));
    env.put(&table, &[task(1, "DONE")]).await;
    let r = apply(&env.clients, &plan, &control, Direction::Forward, stale, 3)
        .await
        .unwrap();
    assert!(matches!(r, Applied::Written { .. }), "{r:?}");
    let now = env.table_map(&table, &["PK", "SK"]).await;
    let it = &now[&key(&read)];
    assert_eq!(it["status"], s("DONE"), "the application's write stands");
    assert!(
        check_item(&plan, it).is_none(),
        "computed from DONE: {it:?}"
    );
    assert!(matches!(&it["GSI2PK"], Value::S(v) if v.contains("#STATUS#DONE#")));

    // Read, then deleted by the application: not resurrected.
    let gone = task(2, "OPEN");
    env.put(&table, std::slice::from_ref(&gone)).await;
    let d = plan_update(&plan, &gone);
    env.clients
        .dynamodb
        .delete_item()
        .table_name(&table)
        .set_key(Some(rekey::aws::to_sdk_item(
            &["PK", "SK"]
                .iter()
                .map(|k| (k.to_string(), gone[*k].clone()))
                .collect(),
        )))
        .send()
        .await
        .unwrap();
    let r = apply(&env.clients, &plan, &control, Direction::Forward, d, 3)
        .await
        .unwrap();
    assert!(matches!(r, Applied::Skipped { .. }), "{r:?}");
    assert!(
        !env.table_map(&table, &["PK", "SK"])
            .await
            .contains_key(&key(&gone))
    );

    // Made right by someone else meanwhile: no second write.
    let third = task(3, "OPEN");
    env.put(&table, std::slice::from_ref(&third)).await;
    let d = plan_update(&plan, &third);
    env.put(&table, &[computed(&plan, &third).unwrap()]).await;
    let r = apply(&env.clients, &plan, &control, Direction::Forward, d, 3)
        .await
        .unwrap();
    assert!(matches!(r, Applied::Skipped { .. }), "{r:?}");
}

/// An in-place verify stops on SIGTERM (issue 26: it is handed the stop
/// token like every verify, and before it kept scanning to the end): the
/// scan reads no new page, nothing is published, exit 143 within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_verify_stops_at_sigterm_and_publishes_nothing() {
    let env = TestEnv::start().await;
    let table = env.table_name("tasks");
    create_tasks_table(&env, &table).await;
    let seed: Vec<Item> = (0..600)
        .map(|i| task(i, STATUSES[(i % 3) as usize]))
        .collect();
    env.put(&table, &seed).await;
    let plan_path = env.file("plan.toml", &tasks_plan(&table));
    let state = env.dir.path().join("state");
    let (state_s, plan_s) = (state.to_str().unwrap(), plan_path.to_str().unwrap());
    // Pages of 10 items at 1 RCU/s: a minute of scanning.
    let child = env.spawn(&[
        "verify",
        plan_s,
        "--state-dir",
        state_s,
        "--segments",
        "1",
        "--page-size",
        "10",
        "--read-rate",
        "1",
        "--json",
    ]);
    let dir = rekey::state::StateDir::new(&state);
    poll_until(
        "the verify's candidates file",
        Duration::from_secs(60),
        || dir.in_place_candidates().exists(),
    )
    .await;
    // SAFETY: plain syscall on our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let signalled = std::time::Instant::now();
    let out = wait_output(child).await;
    let took = signalled.elapsed();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(stderr(&out).contains("stopping"), "{}", stderr(&out));
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM"
    );
    assert!(
        !dir.verify_snapshot().exists(),
        "a stopped verify publishes no verdict"
    );
}
