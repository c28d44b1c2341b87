//! Shard lineage, expired iterators and trimmed data. The local server (moto) keeps one
//! shard per stream, so these run against a stream test double: a small HTTP
//! server speaking the DynamoDB Streams API (DescribeStream, GetShardIterator,
//! GetRecords) from a recorded multi-shard scenario, reached by the real SDK
//! through AWS_ENDPOINT_URL_DYNAMODB_STREAMS. The source table and the target
//! are on the real local server.

use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rekey::core::plan::Plan;
use rekey::core::value::Item;
use serde_json::{Value as Json, json};

use crate::support::*;

/// One recorded shard: its parent, whether it is closed, its records.
struct Shard {
    id: &'static str,
    parent: Option<&'static str>,
    closed: bool,
    records: Vec<Json>,
}

struct Double {
    shards: Vec<Shard>,
    /// GetRecords calls that answer ExpiredIteratorException first, per shard.
    expire_once: Mutex<Vec<&'static str>>,
    /// Shards whose records were trimmed: GetRecords answers TrimmedDataAccessException.
    trimmed: Vec<&'static str>,
    calls: Mutex<Vec<String>>,
}

fn record(seq: u64, kind: &str, old: Option<Json>, new: Option<Json>) -> Json {
    let mut d = json!({"SequenceNumber": format!("{seq:021}"), "SizeBytes": 10, "StreamViewType": "NEW_AND_OLD_IMAGES",
        "ApproximateCreationDateTime": 1.7e9, "Keys": {"PK": (new.as_ref().or(old.as_ref()).unwrap())["PK"].clone()}});
    if let Some(o) = old {
        d["OldImage"] = o;
    }
    if let Some(n) = new {
        d["NewImage"] = n;
    }
    json!({"eventID": format!("e{seq}"), "eventName": kind, "eventVersion": "1.1", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1", "dynamodb": d})
}

fn img(id: u32, status: &str, v: u32) -> Json {
    json!({"PK": {"S": format!("O#{id}")}, "status": {"S": status}, "v": {"N": v.to_string()}})
}

fn error(kind: &str) -> (u16, Json) {
    (
        400,
        json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"), "message": kind}),
    )
}

impl Double {
    fn answer(&self, target: &str, body: &Json) -> (u16, Json) {
        self.calls.lock().unwrap().push(target.to_string());
        match target {
            "DescribeStream" => {
                let shards: Vec<Json> = self
                    .shards
                    .iter()
                    .map(|s| {
                        let first = s.records.first().map_or("0".to_string(), |r| {
                            r["dynamodb"]["SequenceNumber"]
                                .as_str()
                                .unwrap()
                                .to_string()
                        });
                        let mut range = json!({"StartingSequenceNumber": first});
                        if s.closed {
                            range["EndingSequenceNumber"] = json!("999999999999999999999");
                        }
                        let mut j = json!({"ShardId": s.id, "SequenceNumberRange": range});
                        if let Some(p) = s.parent {
                            j["ParentShardId"] = json!(p);
                        }
                        j
                    })
                    .collect();
                (
                    200,
                    json!({"StreamDescription": {"StreamArn": body["StreamArn"], "StreamStatus": "ENABLED",
                    "StreamViewType": "NEW_AND_OLD_IMAGES", "Shards": shards}}),
                )
            }
            "GetShardIterator" => {
                let shard = body["ShardId"].as_str().unwrap();
                let Some(s) = self.shards.iter().find(|s| s.id == shard) else {
                    return error("ResourceNotFoundException");
                };
                let pos = match body["ShardIteratorType"].as_str() {
                    Some("AFTER_SEQUENCE_NUMBER") => {
                        let after = body["SequenceNumber"].as_str().unwrap();
                        s.records
                            .iter()
                            .position(|r| r["dynamodb"]["SequenceNumber"].as_str().unwrap() > after)
                            .unwrap_or(s.records.len())
                    }
                    _ => 0,
                };
                (200, json!({"ShardIterator": format!("{shard}|{pos}")}))
            }
            "GetRecords" => {
                let it = body["ShardIterator"].as_str().unwrap();
                let (shard, pos) = it.split_once('|').unwrap();
                if self.trimmed.contains(&shard) {
                    return error("TrimmedDataAccessException");
                }
                {
                    let mut expire = self.expire_once.lock().unwrap();
                    if let Some(i) = expire.iter().position(|s| *s == shard) {
                        expire.remove(i);
                        return error("ExpiredIteratorException");
                    }
                }
                let s = self.shards.iter().find(|s| s.id == shard).unwrap();
                let pos: usize = pos.parse().unwrap();
                // Two records a call, so pages and checkpoints happen mid-shard.
                let end = (pos + 2).min(s.records.len());
                let mut out = json!({"Records": s.records[pos..end].to_vec()});
                if end < s.records.len() || !s.closed {
                    out["NextShardIterator"] = json!(format!("{shard}|{end}"));
                }
                (200, out)
            }
            other => panic!("the double does not serve {other}"),
        }
    }
}

async fn serve(double: Arc<Double>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let double = double.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let double = double.clone();
                        async move {
                            let target = req
                                .headers()
                                .get("x-amz-target")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .rsplit('.')
                                .next()
                                .unwrap_or("")
                                .to_string();
                            let body = req.into_body().collect().await?.to_bytes();
                            let json: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);
                            let (status, out) = double.answer(&target, &json);
                            let mut resp =
                                hyper::Response::new(Full::new(Bytes::from(out.to_string())));
                            *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            resp.headers_mut().insert(
                                "content-type",
                                "application/x-amz-json-1.0".parse().unwrap(),
                            );
                            if status != 200 {
                                let kind = out["__type"]
                                    .as_str()
                                    .unwrap()
                                    .rsplit('#')
                                    .next()
                                    .unwrap()
                                    .to_string();
                                resp.headers_mut()
                                    .insert("x-amzn-errortype", kind.parse().unwrap());
                            }
                            Ok::<_, hyper::Error>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

async fn setup(env: &TestEnv) -> (String, Plan, std::path::PathBuf, std::path::PathBuf) {
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_streamed_table(&source, &pk_only()).await;
    env.create_table(&target, &pk_sk()).await;
    // Orders keyed by status (one target key per status and order).
    let (plan_path, plan) = PlanText::new(&source, &target)
        .rule(Rule::new(
            &[("PK", "O#{id}")],
            &[("PK", "ST#{@status}"), ("SK", "O#{id}")],
        ))
        .write(env);
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
    let expected = expected_target(&plan, &items);
    let actual = env.table_map(&target, &["PK", "SK"]).await;
    assert!(
        actual == expected,
        "lineage order: {:?}",
        actual
            .keys()
            .map(|k| rekey::core::value::decode_key(k))
            .collect::<Vec<_>>()
    );
    assert!(
        double.expire_once.lock().unwrap().is_empty(),
        "the expired iterator was met, and re-got from the checkpoint"
    );

    // A rerun resumes from the checkpoints: nothing is read again from the closed shards.
    let out = run_tail(&env, &streams, &plan_path, &state);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(report(&out)["records"], 0);
    let again = env.table_map(&target, &["PK", "SK"]).await;
    assert!(again == expected);
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
