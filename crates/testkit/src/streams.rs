//! A stream front: DynamoDB Streams as DynamoDB serves them, in front of the
//! local server (moto).
//!
//! moto keeps one shard per stream that never splits, never rolls over and
//! answers every GetRecords with whatever it has. DynamoDB does not: a table
//! has one open shard per partition; shards roll over (about every 4 h) and
//! split with their partition (parent closes, children list it as
//! `ParentShardId`, and show in DescribeStream late); a record becomes
//! readable some time after its write; GetRecords may answer empty pages
//! before records that exist further on; pages are cut at 1,000 records or
//! 1 MB; iterators expire after 15 minutes; records are trimmed after 24 h;
//! `ApproximateCreationDateTime` is whole seconds. A reader that is right on
//! moto can be wrong on DynamoDB (an empty page from an open shard is not
//! its end), so the tests read through this front.
//!
//! The front speaks the Streams JSON 1.0 protocol on a free port of
//! 127.0.0.1 (`AWS_ENDPOINT_URL_DYNAMODB_STREAMS`). Stream ARNs are moto's,
//! so a client takes the ARN from DescribeTable as usual. The first time the
//! front is asked about a stream it starts modelling it ([`model`]) and
//! feeds it from moto's shard: a background pump polls moto, and every
//! GetRecords (and LATEST iterator) first catches up with moto, so a write
//! moto acknowledged is in the model before the answer is computed; with the
//! delay knobs off the front is then as fresh as moto itself.
//!
//! Every knob is in [`StreamsOptions`]; its `Default` is a faithful front:
//! one partition, no delays, no forced empty pages, no rollovers. Time is the
//! front's own clock, which [`StreamsFront::advance`] moves forward so tests
//! reach iterator expiry and trimming without waiting.

mod model;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value as Json, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::keyspace::key_hash;
use model::{ApiError, Model, Ms};

const STREAMS_PREFIX: &str = "DynamoDBStreams_20120810.";
const DYNAMODB_PREFIX: &str = "DynamoDB_20120810.";
const JSON_TYPE: &str = "application/x-amz-json-1.0";
/// The local server routes on the credential scope but does not check the signature.
const DUMMY_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0";
/// The local server's GetRecords page (and DynamoDB's).
const UPSTREAM_PAGE: usize = 1000;

/// How the front models DynamoDB Streams. `Default` is a faithful front with
/// nothing disturbed (set `upstream`).
#[derive(Debug, Clone)]
pub struct StreamsOptions {
    /// `http://127.0.0.1:PORT` of the local server.
    pub upstream: String,
    /// Partitions per table, each with one open shard (hash ranges of
    /// [`crate::keyspace`]).
    pub partitions: u32,
    /// Each shard draws a delay in `[delay_min, delay_max]`: its records are
    /// readable that long after the pump took them, in order.
    pub delay_min: Duration,
    pub delay_max: Duration,
    /// Probability that GetRecords at a position with readable records
    /// starts a run of empty pages there…
    pub empty_run_ratio: f64,
    /// …of 1 to this many consecutive calls (0 = never).
    pub empty_run_max: u32,
    /// Each open shard rolls over (closes, one child over the same range)
    /// this long after it opened, jittered by ±25 %.
    pub rollover_every: Option<Duration>,
    /// A new shard is listed by DescribeStream only this long after it opened.
    pub describe_delay: Duration,
    /// Shard iterators expire this long after issue (DynamoDB: 15 min).
    pub iterator_ttl: Duration,
    /// Records are trimmed this long after they arrived (DynamoDB: 24 h).
    pub retention: Duration,
    /// How often the background pump polls the local server.
    pub pump_interval: Duration,
    pub seed: u64,
}

impl Default for StreamsOptions {
    fn default() -> StreamsOptions {
        StreamsOptions {
            upstream: String::new(),
            partitions: 1,
            delay_min: Duration::ZERO,
            delay_max: Duration::ZERO,
            empty_run_ratio: 0.0,
            empty_run_max: 0,
            rollover_every: None,
            describe_delay: Duration::ZERO,
            iterator_ttl: Duration::from_secs(15 * 60),
            retention: Duration::from_secs(24 * 3600),
            pump_interval: Duration::from_millis(20),
            seed: 0,
        }
    }
}

/// What the front has done so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StreamsStats {
    /// Records taken from the local server.
    pub records_pumped: u64,
    /// Records per shard id.
    pub per_shard: std::collections::BTreeMap<String, u64>,
    /// Empty pages served although records were readable (empty runs).
    pub empty_pages_forced: u64,
    /// Empty pages served while the shard had records not yet readable.
    pub empty_pages_pending: u64,
    /// Empty pages served with nothing after the position.
    pub empty_pages_idle: u64,
    pub rollovers: u64,
    pub splits: u64,
    pub isolations: u64,
    pub expired_iterators: u64,
    pub trimmed_answers: u64,
}

/// A running front; dropping it stops its server and pump.
pub struct StreamsFront {
    endpoint: String,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
    pump: JoinHandle<()>,
}

/// Where the pump is in one stream's upstream shard.
struct Feed {
    arn: String,
    /// The local server's iterator (they never expire there).
    upstream_iterator: Option<String>,
    /// When the last sync that completed began: a caller that asked before
    /// then has every record it needs, and need not ask the local server
    /// again ([`Shared::sync`]).
    synced_from: Option<Instant>,
}

/// A REMOVE record to tag as a TTL deletion when the pump sees it.
struct TtlTag {
    table: String,
    keys: Json,
}

struct Shared {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    started: Instant,
    skew_ms: AtomicU64,
    model: Mutex<Model>,
    /// Per stream ARN; the map's lock is held while a stream is registered.
    feeds: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Feed>>>>,
    /// The upstream's stream descriptions (without shards).
    descriptions: Mutex<HashMap<String, Json>>,
    ttl_tags: Mutex<Vec<TtlTag>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamsFront {
    /// Binds 127.0.0.1 on a free port and serves in Tokio tasks.
    pub async fn start(opts: StreamsOptions) -> anyhow::Result<StreamsFront> {
        if opts.upstream.is_empty() {
            bail!("StreamsOptions::upstream is not set (the local server's endpoint)");
        }
        if opts.delay_min > opts.delay_max {
            bail!("StreamsOptions: delay_min is above delay_max");
        }
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let shared = Arc::new(Shared {
            upstream: opts.upstream.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build(connector),
            started: Instant::now(),
            skew_ms: AtomicU64::new(0),
            model: Mutex::new(Model::new(&opts)),
            feeds: tokio::sync::Mutex::new(HashMap::new()),
            descriptions: Mutex::new(HashMap::new()),
            ttl_tags: Mutex::new(Vec::new()),
        });
        let service = {
            let shared = Arc::clone(&shared);
            hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req))
        };
        let server = tokio::spawn(crate::http::serve(listener, service));
        let pump = tokio::spawn(pump(Arc::clone(&shared), opts.pump_interval));
        Ok(StreamsFront {
            endpoint,
            shared,
            server,
            pump,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Starts modelling `arn` now (otherwise the first request about it does).
    pub async fn watch(&self, arn: &str) -> anyhow::Result<()> {
        self.shared
            .register(arn)
            .await
            .map_err(|(status, body)| anyhow::anyhow!("DescribeStream {arn}: {status} {body}"))
    }

    /// Splits the `partition`-th open partition (in ring order) of every
    /// stream the front models: its shard closes, two children over the two
    /// halves of its range open. Returns how many streams were split.
    pub fn split(&self, partition: usize) -> usize {
        let now = self.shared.now();
        let mut m = lock(&self.shared.model);
        m.arns()
            .iter()
            .filter(|arn| m.split(arn, partition, now))
            .count()
    }

    /// Gives the partition key value `pk` (a wire AttributeValue such as
    /// `{"S": "hot"}`) a partition of its own in every stream the front
    /// models, as DynamoDB does when it splits a hot key's partition by sort
    /// key: the shard holding `pk` closes and up to three children open
    /// (the hashes below `pk`'s, exactly `pk`'s, the hashes above), so no
    /// other key ever reaches the middle one. Returns how many streams
    /// changed.
    pub fn isolate(&self, pk: &Json) -> usize {
        let now = self.shared.now();
        let hash = key_hash(pk);
        let mut m = lock(&self.shared.model);
        m.arns()
            .iter()
            .filter(|arn| m.isolate(arn, hash, now))
            .count()
    }

    /// Deletes the item `key` (wire AttributeValues by attribute name) of
    /// `table` upstream, and tags its REMOVE record as DynamoDB tags a
    /// deletion by Time to Live: `userIdentity` `{"Type": "Service",
    /// "PrincipalId": "dynamodb.amazonaws.com"}` (moto has no TTL deletions).
    /// Returns whether an item was deleted.
    pub async fn ttl_delete(&self, table: &str, key: &Json) -> anyhow::Result<bool> {
        lock(&self.shared.ttl_tags).push(TtlTag {
            table: table.to_string(),
            keys: key.clone(),
        });
        let body = json!({"TableName": table, "Key": key, "ReturnValues": "ALL_OLD"});
        let answer = self
            .shared
            .call(&format!("{DYNAMODB_PREFIX}DeleteItem"), &body)
            .await;
        let deleted =
            matches!(&answer, Ok((StatusCode::OK, out)) if out.get("Attributes").is_some());
        if !deleted {
            lock(&self.shared.ttl_tags).retain(|t| !(t.table == table && t.keys == *key));
        }
        match answer {
            Ok((StatusCode::OK, _)) => Ok(deleted),
            Ok((status, out)) => bail!("DeleteItem on {table}: {status} {out}"),
            Err(e) => Err(e),
        }
    }

    /// Moves the front's clock forward (iterator expiry, trimming, rollovers
    /// and readable times all follow it).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.shared.skew_ms.fetch_add(by, Ordering::Relaxed);
    }

    /// Catches up with the local server now: every write it acknowledged is
    /// then in the model.
    pub async fn sync(&self) -> anyhow::Result<()> {
        let feeds: Vec<_> = self.shared.feeds.lock().await.values().cloned().collect();
        for feed in feeds {
            self.shared.sync(&feed, Instant::now()).await?;
        }
        Ok(())
    }

    pub fn stats(&self) -> StreamsStats {
        let m = lock(&self.shared.model);
        let c = &m.counters;
        StreamsStats {
            records_pumped: c.records,
            per_shard: c.per_shard.clone(),
            empty_pages_forced: c.empty_forced,
            empty_pages_pending: c.empty_pending,
            empty_pages_idle: c.empty_idle,
            rollovers: c.rollovers,
            splits: c.splits,
            isolations: c.isolations,
            expired_iterators: c.expired,
            trimmed_answers: c.trimmed,
        }
    }
}

impl Drop for StreamsFront {
    fn drop(&mut self) {
        self.server.abort();
        self.pump.abort();
    }
}

/// Polls the local server for every modelled stream, and ticks the model
/// (rollovers happen on time even when nobody asks).
async fn pump(shared: Arc<Shared>, every: Duration) {
    let mut ticker = tokio::time::interval(every.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let feeds: Vec<_> = shared.feeds.lock().await.values().cloned().collect();
        for feed in feeds {
            if let Err(e) = shared.sync(&feed, Instant::now()).await {
                eprintln!("stream front: pump: {e:#}");
            }
        }
        let now = shared.now();
        lock(&shared.model).tick(now);
    }
}

impl Shared {
    fn now(&self) -> Ms {
        let real = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        real + self.skew_ms.load(Ordering::Relaxed)
    }

    /// One JSON 1.0 call to the local server: its status and JSON answer.
    async fn call(&self, target: &str, body: &Json) -> anyhow::Result<(StatusCode, Json)> {
        let req = Request::post(format!("{}/", self.upstream))
            .header(CONTENT_TYPE, JSON_TYPE)
            .header("x-amz-target", target)
            .header("x-amz-date", "20260101T000000Z")
            .header("authorization", DUMMY_AUTH)
            .body(Full::new(Bytes::from(body.to_string())))?;
        let resp = self
            .client
            .request(req)
            .await
            .with_context(|| format!("{target} to {}", self.upstream))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(Json::Null);
        Ok((status, json))
    }

    /// Starts modelling `arn` if it is new: its description and hash key
    /// from the local server, then a first catch-up. An upstream refusal
    /// (no such stream) is returned as its status and body.
    async fn register(&self, arn: &str) -> Result<(), (StatusCode, Json)> {
        let mut feeds = self.feeds.lock().await;
        if feeds.contains_key(arn) {
            return Ok(());
        }
        let target = format!("{STREAMS_PREFIX}DescribeStream");
        let (status, out) = self
            .call(&target, &json!({ "StreamArn": arn }))
            .await
            .map_err(|e| {
                (
                    StatusCode::BAD_GATEWAY,
                    json!({"message": format!("{e:#}")}),
                )
            })?;
        if status != StatusCode::OK {
            return Err((status, out));
        }
        let mut desc = out["StreamDescription"].clone();
        let hash_key = desc["KeySchema"]
            .as_array()
            .and_then(|ks| ks.iter().find(|k| k["KeyType"] == "HASH"))
            .and_then(|k| k["AttributeName"].as_str())
            .unwrap_or_default()
            .to_string();
        if let Some(d) = desc.as_object_mut() {
            d.remove("Shards");
            d.remove("LastEvaluatedShardId");
        }
        lock(&self.descriptions).insert(arn.to_string(), desc);
        let now = self.now();
        lock(&self.model).add_stream(arn, &hash_key, now);
        let feed = Arc::new(tokio::sync::Mutex::new(Feed {
            arn: arn.to_string(),
            upstream_iterator: None,
            synced_from: None,
        }));
        feeds.insert(arn.to_string(), Arc::clone(&feed));
        drop(feeds);
        self.sync(&feed, Instant::now()).await.map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                json!({"message": format!("{e:#}")}),
            )
        })
    }

    /// Takes every record the local server had past the feed's position at
    /// `asked`, at the latest. Calls at once share one sync: a caller that
    /// waited for the lock while another's sync ran, which began after it
    /// asked, has what it needs (16 GetRecords at once were 16 sync calls one
    /// after another, seconds per turn of a reader over many shards).
    async fn sync(&self, feed: &tokio::sync::Mutex<Feed>, asked: Instant) -> anyhow::Result<()> {
        let mut feed = feed.lock().await;
        if feed.synced_from.is_some_and(|from| from >= asked) {
            return Ok(());
        }
        let began = Instant::now();
        // The position moves only together with the records ingested up to
        // it, with no await in between: a sync dropped mid-way (its caller's
        // connection closed, as when a reader is killed with -9) resumes
        // where it stopped. (It once took the position out for the call;
        // dropped there, the next sync started again from the stream's
        // oldest record and served the whole history a second time.)
        let mut it = match feed.upstream_iterator.clone() {
            Some(it) => it,
            None => {
                let first = self.first_iterator(&feed.arn).await?;
                feed.upstream_iterator = Some(first.clone());
                first
            }
        };
        loop {
            let body = json!({"ShardIterator": it, "Limit": UPSTREAM_PAGE});
            let (status, out) = self
                .call(&format!("{STREAMS_PREFIX}GetRecords"), &body)
                .await?;
            if status != StatusCode::OK {
                // Retried from the same position next time.
                bail!("GetRecords upstream: {status} {out}");
            }
            let Some(next) = out["NextShardIterator"].as_str().map(str::to_string) else {
                bail!("GetRecords upstream gave no NextShardIterator: {out}");
            };
            let records = out["Records"].as_array().cloned().unwrap_or_default();
            let now = self.now();
            let table = table_of(&feed.arn);
            {
                let mut m = lock(&self.model);
                for mut r in records.iter().cloned() {
                    self.tag_ttl(table, &mut r);
                    m.ingest(&feed.arn, r, now);
                }
            }
            feed.upstream_iterator = Some(next.clone());
            if records.len() < UPSTREAM_PAGE {
                feed.synced_from = Some(began);
                break;
            }
            it = next;
        }
        Ok(())
    }

    async fn first_iterator(&self, arn: &str) -> anyhow::Result<String> {
        let (status, out) = self
            .call(
                &format!("{STREAMS_PREFIX}DescribeStream"),
                &json!({ "StreamArn": arn }),
            )
            .await?;
        let shard = out["StreamDescription"]["Shards"][0]["ShardId"].as_str();
        let Some(shard) = shard.filter(|_| status == StatusCode::OK) else {
            bail!("DescribeStream upstream {arn}: {status} {out}");
        };
        let body = json!({"StreamArn": arn, "ShardId": shard, "ShardIteratorType": "TRIM_HORIZON"});
        let (status, out) = self
            .call(&format!("{STREAMS_PREFIX}GetShardIterator"), &body)
            .await?;
        match out["ShardIterator"].as_str() {
            Some(it) if status == StatusCode::OK => Ok(it.to_string()),
            _ => bail!("GetShardIterator upstream {arn}: {status} {out}"),
        }
    }

    fn tag_ttl(&self, table: &str, record: &mut Json) {
        if record["eventName"] != "REMOVE" {
            return;
        }
        let mut tags = lock(&self.ttl_tags);
        let keys = &record["dynamodb"]["Keys"];
        if let Some(i) = tags
            .iter()
            .position(|t| t.table == table && t.keys == *keys)
        {
            tags.remove(i);
            record["userIdentity"] =
                json!({"Type": "Service", "PrincipalId": "dynamodb.amazonaws.com"});
        }
    }

    /// The answer to one Streams request.
    async fn answer(&self, op: &str, req: &Json) -> Result<Json, Answer> {
        let arn = |field: &str| req[field].as_str().unwrap_or_default().to_string();
        match op {
            "ListStreams" => {
                let target = format!("{STREAMS_PREFIX}ListStreams");
                let (status, out) = self.call(&target, req).await.map_err(Answer::upstream)?;
                if status != StatusCode::OK {
                    return Err(Answer::Upstream(status, out));
                }
                Ok(out)
            }
            "DescribeStream" => {
                let arn = arn("StreamArn");
                self.register(&arn).await.map_err(Answer::passed)?;
                let now = self.now();
                let (shards, last) = lock(&self.model).describe(
                    &arn,
                    req["ExclusiveStartShardId"].as_str(),
                    req["Limit"].as_u64(),
                    now,
                )?;
                let mut desc = lock(&self.descriptions)
                    .get(&arn)
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                desc["Shards"] = json!(shards);
                if let Some(last) = last {
                    desc["LastEvaluatedShardId"] = json!(last);
                }
                Ok(json!({ "StreamDescription": desc }))
            }
            "GetShardIterator" => {
                let arn = arn("StreamArn");
                self.register(&arn).await.map_err(Answer::passed)?;
                let kind = req["ShardIteratorType"].as_str().unwrap_or_default();
                if kind == "LATEST" {
                    self.sync_arn(&arn).await?;
                }
                let now = self.now();
                let it = lock(&self.model).shard_iterator(
                    &arn,
                    req["ShardId"].as_str().unwrap_or_default(),
                    kind,
                    req["SequenceNumber"].as_str(),
                    now,
                )?;
                Ok(json!({ "ShardIterator": it }))
            }
            "GetRecords" => {
                let it = req["ShardIterator"].as_str().unwrap_or_default();
                if let Some(arn) = model::iterator_arn(it) {
                    self.sync_arn(&arn).await?;
                }
                let now = self.now();
                Ok(lock(&self.model).get_records(it, req["Limit"].as_u64(), now)?)
            }
            other => Err(Answer::Api(ApiError {
                kind: "UnknownOperationException",
                message: format!("the stream front does not serve {other}"),
            })),
        }
    }

    async fn sync_arn(&self, arn: &str) -> Result<(), Answer> {
        let feed = self.feeds.lock().await.get(arn).cloned();
        if let Some(feed) = feed {
            self.sync(&feed, Instant::now())
                .await
                .map_err(Answer::upstream)?;
        }
        Ok(())
    }
}

/// The table name in a stream ARN (`…:table/NAME/stream/LABEL`).
fn table_of(arn: &str) -> &str {
    arn.split_once(":table/")
        .map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""))
}

/// A request's non-200 answer.
enum Answer {
    Api(ApiError),
    /// The local server's refusal, passed on as it was.
    Upstream(StatusCode, Json),
}

impl Answer {
    fn upstream(e: anyhow::Error) -> Answer {
        Answer::Api(ApiError {
            kind: "InternalServerError",
            message: format!("{e:#}"),
        })
    }

    fn passed((status, body): (StatusCode, Json)) -> Answer {
        Answer::Upstream(status, body)
    }
}

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Answer {
        Answer::Api(e)
    }
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let op = target.strip_prefix(STREAMS_PREFIX).unwrap_or(&target);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let parsed: Json = serde_json::from_slice(&body).unwrap_or_else(|_| json!({}));
    let (status, out, kind) = match shared.answer(op, &parsed).await {
        Ok(out) => (StatusCode::OK, out, None),
        Err(Answer::Api(e)) => {
            let status = if e.kind == "InternalServerError" {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::BAD_REQUEST
            };
            let body = json!({
                "__type": format!("com.amazonaws.dynamodb.v20120810#{}", e.kind),
                "message": e.message,
            });
            (status, body, Some(e.kind.to_string()))
        }
        Err(Answer::Upstream(status, out)) => {
            let kind = out["__type"]
                .as_str()
                .map(|t| t.rsplit('#').next().unwrap_or(t).to_string());
            (status, out, kind)
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(out.to_string())));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON_TYPE));
    headers.insert(
        "x-amzn-requestid",
        HeaderValue::from_static("rekey-streams"),
    );
    if let Some(kind) = kind.and_then(|k| HeaderValue::from_str(&k).ok()) {
        headers.insert("x-amzn-errortype", kind);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rekey::local::{LocalOptions, LocalServer};

    /// One call to the local server that must succeed.
    async fn must(front: &StreamsFront, op: &str, body: Json) -> Json {
        let (status, out) = front
            .shared
            .call(&format!("{DYNAMODB_PREFIX}{op}"), &body)
            .await
            .unwrap_or_else(|e| panic!("{op}: {e:#}"));
        assert_eq!(status, StatusCode::OK, "{op}: {out}");
        out
    }

    async fn put(front: &StreamsFront, i: u32) {
        let item = json!({"PK": {"S": format!("P#{i}")}, "v": {"N": "1"}});
        must(front, "PutItem", json!({"TableName": "t", "Item": item})).await;
    }

    /// Regression: a GetRecords whose connection closed while the front was
    /// catching up with the local server (a reader killed with -9) dropped
    /// the sync after it had taken the upstream position out; the next sync
    /// began again at the oldest record, and every record of the stream was
    /// served a second time, as new writes (the soak's seed 25 lost 63
    /// application writes to the replays).
    #[tokio::test]
    async fn a_sync_dropped_mid_way_never_takes_a_record_twice() {
        let server = LocalServer::start(&LocalOptions::default())
            .await
            .unwrap_or_else(|e| panic!("start the local server: {e:#}"));
        let front = StreamsFront::start(StreamsOptions {
            upstream: server.endpoint().to_string(),
            // Only this test's syncs: the pump stays out of the way.
            pump_interval: Duration::from_secs(3600),
            ..StreamsOptions::default()
        })
        .await
        .unwrap();
        let created = must(
            &front,
            "CreateTable",
            json!({
                "TableName": "t",
                "AttributeDefinitions": [{"AttributeName": "PK", "AttributeType": "S"}],
                "KeySchema": [{"AttributeName": "PK", "KeyType": "HASH"}],
                "BillingMode": "PAY_PER_REQUEST",
                "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES"}
            }),
        )
        .await;
        let arn = created["TableDescription"]["LatestStreamArn"]
            .as_str()
            .expect("a stream")
            .to_string();
        for i in 0..5 {
            put(&front, i).await;
        }
        let shared = &front.shared;
        shared.register(&arn).await.expect("register");
        assert_eq!(front.stats().records_pumped, 5);
        for i in 5..8 {
            put(&front, i).await;
        }
        let feed = shared.feeds.lock().await.get(&arn).cloned().unwrap();
        {
            // Polled once: it holds the feed and waits on the local server.
            let mut sync = std::pin::pin!(shared.sync(&feed, Instant::now()));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(sync.as_mut().poll(&mut cx).is_pending());
        } // dropped there, as hyper drops a closed connection's request
        shared.sync(&feed, Instant::now()).await.expect("sync");
        assert_eq!(front.stats().records_pumped, 8, "{:?}", front.stats());
    }
}
