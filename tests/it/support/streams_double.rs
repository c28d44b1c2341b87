//! A DynamoDB Streams double: a small HTTP server speaking DescribeStream,
//! GetShardIterator and GetRecords from a recorded multi-shard scenario,
//! reached by the real SDK through AWS_ENDPOINT_URL_DYNAMODB_STREAMS (the
//! local server keeps one shard per stream). Used by `lineage` (one tail)
//! and `fleet_tail` (shards leased across workers).

use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
pub use serde_json::{Value as Json, json};

/// One recorded shard: its parent, whether it is closed, its records.
pub struct Shard {
    pub id: &'static str,
    pub parent: Option<&'static str>,
    pub closed: bool,
    pub records: Vec<Json>,
}

pub struct Double {
    pub shards: Vec<Shard>,
    /// GetRecords calls that answer ExpiredIteratorException first, per shard.
    pub expire_once: Mutex<Vec<&'static str>>,
    /// Shards whose records were trimmed: GetRecords answers TrimmedDataAccessException.
    pub trimmed: Vec<&'static str>,
    pub calls: Mutex<Vec<String>>,
    /// Records a test appends to a shard while it runs (after its `records`).
    pub appended: Mutex<std::collections::BTreeMap<&'static str, Vec<Json>>>,
}

pub fn record(seq: u64, kind: &str, old: Option<Json>, new: Option<Json>) -> Json {
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

pub fn img(id: u32, status: &str, v: u32) -> Json {
    json!({"PK": {"S": format!("O#{id}")}, "status": {"S": status}, "v": {"N": v.to_string()}})
}

fn error(kind: &str) -> (u16, Json) {
    (
        400,
        json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"), "message": kind}),
    )
}

impl Double {
    /// Appends `record` to shard `id`, readable from the next GetRecords.
    pub fn append(&self, id: &'static str, record: Json) {
        self.appended
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .push(record);
    }

    /// Shard `s`'s records: recorded, then appended.
    fn records_of(&self, s: &Shard) -> Vec<Json> {
        let mut out = s.records.clone();
        out.extend(
            self.appended
                .lock()
                .unwrap()
                .get(s.id)
                .cloned()
                .unwrap_or_default(),
        );
        out
    }

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
                let records = self.records_of(s);
                let pos = match body["ShardIteratorType"].as_str() {
                    Some("AFTER_SEQUENCE_NUMBER") => {
                        let after = body["SequenceNumber"].as_str().unwrap();
                        records
                            .iter()
                            .position(|r| r["dynamodb"]["SequenceNumber"].as_str().unwrap() > after)
                            .unwrap_or(records.len())
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
                let records = self.records_of(s);
                let end = (pos + 2).min(records.len());
                let mut out = json!({"Records": records[pos..end].to_vec()});
                if end < records.len() || !s.closed {
                    out["NextShardIterator"] = json!(format!("{shard}|{end}"));
                }
                (200, out)
            }
            other => panic!("the double does not serve {other}"),
        }
    }
}

/// The action a request names: `GetRecords` of `…_20120810.GetRecords`.
fn action(headers: &hyper::HeaderMap) -> String {
    headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or("")
        .to_string()
}

pub async fn serve(double: Arc<Double>) -> String {
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
                            let target = action(req.headers());
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

/// The shards of the double's scenario beside a real stream: DescribeStream
/// lists the upstream's shards (the local server's one) and then `extra`'s;
/// GetShardIterator and GetRecords of `extra`'s shards are answered here,
/// the rest forwarded to `upstream` (the local server serves Streams on its
/// one endpoint). A migration's records flow through the real shard while
/// the extra ones give the fleet's tail more shards to hold.
pub async fn serve_beside(extra: Arc<Double>, upstream: String) -> String {
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
    let upstream = Arc::new(upstream);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (extra, client, upstream) = (extra.clone(), client.clone(), upstream.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (extra, client, upstream) =
                            (extra.clone(), client.clone(), upstream.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await?.to_bytes();
                            let target = action(&parts.headers);
                            let json: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);
                            let ours = |id: &str| extra.shards.iter().any(|s| s.id == id);
                            let local = match target.as_str() {
                                "GetShardIterator" => ours(json["ShardId"].as_str().unwrap_or("")),
                                "GetRecords" => json["ShardIterator"]
                                    .as_str()
                                    .and_then(|i| i.split_once('|'))
                                    .is_some_and(|(id, _)| ours(id)),
                                _ => false,
                            };
                            let (status, out) = if local {
                                let (status, out) = extra.answer(&target, &json);
                                (status, out.to_string().into_bytes())
                            } else {
                                let mut up = hyper::Request::new(Full::new(body.clone()));
                                *up.method_mut() = parts.method.clone();
                                *up.uri_mut() = format!("{upstream}/").parse().unwrap();
                                *up.headers_mut() = parts.headers.clone();
                                up.headers_mut().remove("host");
                                let resp = client.request(up).await.expect("the local server");
                                let status = resp.status().as_u16();
                                let bytes = resp.into_body().collect().await?.to_bytes();
                                let mut out = bytes.to_vec();
                                if target == "DescribeStream" && status == 200 {
                                    let mut d: Json = serde_json::from_slice(&bytes).unwrap();
                                    let (_, mine) = extra.answer("DescribeStream", &json);
                                    let add = mine["StreamDescription"]["Shards"].clone();
                                    d["StreamDescription"]["Shards"]
                                        .as_array_mut()
                                        .unwrap()
                                        .extend(add.as_array().unwrap().iter().cloned());
                                    out = d.to_string().into_bytes();
                                }
                                (status, out)
                            };
                            let mut resp = hyper::Response::new(Full::new(Bytes::from(out)));
                            *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            resp.headers_mut().insert(
                                "content-type",
                                "application/x-amz-json-1.0".parse().unwrap(),
                            );
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

/// The target holds exactly what `plan` makes of `finals` (the items as the
/// stream and the backfill leave them), else the keys it holds.
pub async fn assert_target_is(
    env: &crate::support::TestEnv,
    plan: &rekey::core::plan::Plan,
    target: &str,
    finals: &[rekey::core::value::Item],
    what: &str,
) {
    let expected = crate::support::expected_target(plan, finals);
    let actual = env.table_map(target, &["PK", "SK"]).await;
    assert!(
        actual == expected,
        "{what}: {:?}",
        actual
            .keys()
            .map(|k| rekey::core::value::decode_key(k))
            .collect::<Vec<_>>()
    );
}

/// A streamed source of orders and a target keyed by status (one target
/// key per status and order), with the plan: (source, target, plan path, plan).
pub async fn status_tables(
    env: &crate::support::TestEnv,
) -> (String, String, std::path::PathBuf, rekey::core::plan::Plan) {
    use crate::support::*;
    let source = env.table_name("src");
    let target = env.table_name("dst");
    env.create_streamed_table(&source, &pk_only()).await;
    env.create_table(&target, &pk_sk()).await;
    let (plan_path, plan) = PlanText::new(&source, &target)
        .rule(Rule::new(
            &[("PK", "O#{id}")],
            &[("PK", "ST#{@status}"), ("SK", "O#{id}")],
        ))
        .write(env);
    (source, target, plan_path, plan)
}
