//! Shard lineage, expired iterators and trimmed data. The local server (moto) keeps one
//! shard per stream, so these run against a stream test double: a small HTTP
//! server speaking the DynamoDB Streams API (DescribeStream, GetShardIterator,
//! GetRecords) from a recorded multi-shard scenario, reached by the real SDK
//! through AWS_ENDPOINT_URL_DYNAMODB_STREAMS. The source table and the target
//! are on the real local server.

use std::sync::{Arc, Mutex};

use rekey::core::plan::Plan;
use rekey::core::value::Item;

use crate::support::streams_double::*;
use crate::support::*;

async fn setup(env: &TestEnv) -> (String, Plan, std::path::PathBuf, std::path::PathBuf) {
    let (_, target, plan_path, plan) = status_tables(env).await;
    let state = env.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // No backfill in these tests: the tail applies as it reads.
    rekey::state::StateDir::new(&state)
        .mark_backfill_done()
        .unwrap();
    (target, plan, plan_path, state)
}

fn run_tail(
    env: &TestEnv,
    streams: &str,
    plan: &std::path::Path,
    state: &std::path::Path,
) -> std::process::Output {
    rekey_with_env(
        &[
            "tail",
            plan.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--json",
            "--exit-when-idle",
            "2",
        ],
        &[
            ("AWS_ENDPOINT_URL_DYNAMODB", &env.endpoint()),
            ("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", streams),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_after_parents_across_a_split_with_an_expired_iterator() {
    let env = TestEnv::start().await;
    let (target, plan, plan_path, state) = setup(&env).await;
    // O#1 is created in the parent and moved twice in the children: applied out
    // of lineage order, the target would end with a stale image or a leftover key.
    let double = Arc::new(Double {
        shards: vec![
            Shard {
                id: "shard-b",
                parent: Some("shard-a"),
                closed: true,
                records: vec![
                    record(
                        20,
                        "MODIFY",
                        Some(img(1, "OPEN", 1)),
                        Some(img(1, "PAID", 2)),
                    ),
                    record(21, "INSERT", None, Some(img(3, "OPEN", 1))),
                    record(22, "REMOVE", Some(img(2, "OPEN", 1)), None),
                ],
            },
            Shard {
                id: "shard-c",
                parent: Some("shard-b"),
                closed: false,
                records: vec![
                    record(
                        30,
                        "MODIFY",
                        Some(img(1, "PAID", 2)),
                        Some(img(1, "SHIPPED", 3)),
                    ),
                    record(
                        31,
                        "MODIFY",
                        Some(img(3, "OPEN", 1)),
                        Some(img(3, "OPEN", 2)),
                    ),
                ],
            },
            Shard {
                id: "shard-a",
                parent: None,
                closed: true,
                records: vec![
                    record(10, "INSERT", None, Some(img(1, "OPEN", 1))),
                    record(11, "INSERT", None, Some(img(2, "OPEN", 1))),
                    record(
                        12,
                        "MODIFY",
                        Some(img(2, "OPEN", 1)),
                        Some(img(2, "OPEN", 1)),
                    ),
                ],
            },
            // Its parent was trimmed long ago: readable at once.
            Shard {
                id: "shard-z",
                parent: Some("shard-gone"),
                closed: true,
                records: vec![record(5, "INSERT", None, Some(img(9, "OPEN", 7)))],
            },
        ],
        expire_once: Mutex::new(vec!["shard-c"]),
        trimmed: vec![],
        calls: Mutex::new(Vec::new()),
        appended: Default::default(),
    });
    let streams = serve(double.clone()).await;
    let out = run_tail(&env, &streams, &plan_path, &state);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&out);
    assert_eq!(r["records"], 9, "{r}");

    let items: Vec<Item> = vec![
        item(&img(1, "SHIPPED", 3).to_string()),
        item(&img(3, "OPEN", 2).to_string()),
        item(&img(9, "OPEN", 7).to_string()),
    ];
    assert_target_is(&env, &plan, &target, &items, "lineage order").await;
    assert!(
        double.expire_once.lock().unwrap().is_empty(),
        "the expired iterator was met, and re-got from the checkpoint"
    );

    // A rerun resumes from the checkpoints: nothing is read again from the closed shards.
    let out = run_tail(&env, &streams, &plan_path, &state);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(report(&out)["records"], 0);
    assert_target_is(&env, &plan, &target, &items, "after the rerun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimmed_records_stop_the_tail_and_say_a_new_backfill_is_needed() {
    let env = TestEnv::start().await;
    let (_target, _plan, plan_path, state) = setup(&env).await;
    let double = Arc::new(Double {
        shards: vec![Shard {
            id: "shard-a",
            parent: None,
            closed: false,
            records: vec![record(10, "INSERT", None, Some(img(1, "OPEN", 1)))],
        }],
        expire_once: Mutex::new(vec![]),
        trimmed: vec!["shard-a"],
        calls: Mutex::new(Vec::new()),
        appended: Default::default(),
    });
    let streams = serve(double).await;
    let out = run_tail(&env, &streams, &plan_path, &state);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("records were trimmed") && err.contains("a new backfill is needed"),
        "{err}"
    );
}
