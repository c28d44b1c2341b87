//! `rekey backfill --from-export`: a DynamoDB S3 export (real layout: manifest
//! summary, manifest files, gzip DynamoDB JSON) into the target, from a local
//! directory and from S3 (moto), with a malformed line and a kill -9 on the way.

mod export_support;
mod support;

use std::cell::RefCell;
use std::time::Duration;

use rekey::core::plan::Plan;
use rekey::core::value::{Item, encode_key};
use rekey_testkit::export::write_export;
use serde_json::Value as Json;
use support::*;

const EXPORT_ID: &str = "01700000000000-abcdef12";

fn plan_text(target: &str) -> String {
    format!(
        r#"
[source]
table = "src"
partition_key = "PK"
sort_key = "SK"
[target]
table = "{target}"
partition_key = "PK"
sort_key = "SK"
[[rule]]
match = {{ PK = "T#{{t}}", SK = "O#{{id}}" }}
key = {{ PK = "T#{{t}}#S#{{shard(id, 8)}}", SK = "O#{{id}}" }}
"#
    )
}

fn orders(n: usize) -> Vec<Item> {
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
    export_support::rewrite_data_file(dir, EXPORT_ID, &m.files[1].key, |line, text| {
        if line == 7 {
            *lost.borrow_mut() = Some(text);
            "{\"Item\": not json".to_string()
        } else {
            text
        }
    });
    let text = lost.into_inner().expect("file 1 has a line 7");
    rekey::state::itemfile::parse_line(&text).unwrap()
}

/// The source of the test: a source table is still needed (its key schema is
/// checked, and the tail reads its stream).
async fn setup(env: &TestEnv) -> (String, Plan, std::path::PathBuf) {
    let target = env.table_name("dst");
    // The plan names the source table "src".
    env.clients.create_table("src", &pk_sk(), false).await.ok();
    env.create_table(&target, &pk_sk()).await;
    let text = plan_text(&target);
    let plan_path = env.file("plan.toml", &text);
    (target, Plan::parse(&text, &plan_path).unwrap(), plan_path)
}

async fn assert_target(env: &TestEnv, target: &str, plan: &Plan, items: &[Item], lost: &[&Item]) {
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
    let (target, plan, plan_path) = setup(&env).await;
    let mut items = orders(2400);
    // A number DynamoDB refuses (magnitude over 10^125): the batch fails
    // validation, the item is isolated and rejected, the rest of its batch lands.
    items[100].insert("v".into(), rekey::core::value::Value::N("1E+200".into()));
    let refused = items[100].clone();
    let dir = env.dir.path().join("export");
    let lost = export_with_a_bad_line(&dir, &items);
    let state = env.dir.path().join("state");
    let args_slow = [
        "backfill",
        plan_path.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--from-export",
        dir.to_str().unwrap(),
        "--json",
        "--write-rate",
        "300",
    ];
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
    assert_target(&env, &target, &plan, &items, &[&lost, &refused]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_from_an_s3_export() {
    let env = TestEnv::start().await;
    let (target, plan, plan_path) = setup(&env).await;
    let items = orders(900);
    let dir = env.dir.path().join("export");
    let lost = export_with_a_bad_line(&dir, &items);
    let s3 = export_support::bucket("exports").await;
    export_support::upload_dir(&s3, "exports", "team/orders", &dir).await;
    let state = env.dir.path().join("state");
    let moto = export_support::moto().await.endpoint().to_string();
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
    assert_target(&env, &target, &plan, &items, &[&lost]).await;
}
