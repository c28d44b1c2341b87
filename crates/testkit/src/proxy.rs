//! A throttling, fault-injecting HTTP proxy in front of the local server (moto).
//!
//! The local server never throttles: it accepts any request rate, so rekey's
//! rate limiting, retry and `UnprocessedItems` handling cannot be tested
//! against it alone. Real DynamoDB refuses writes beyond ~1000 WCU/s and reads
//! beyond ~3000 RCU/s per partition key value, and beyond the provisioned
//! throughput per table. This proxy sits between the AWS SDK and the local
//! server and gives those answers itself, byte for byte as DynamoDB does:
//!
//! * single-item writes and reads that do not fit answer
//!   `ProvisionedThroughputExceededException` with a `ThrottlingReasons`
//!   entry naming the per-key (`…KeyRangeThroughputExceeded`) or per-table
//!   (`…ProvisionedThroughputExceeded`) limit, without reaching the server;
//! * `BatchWriteItem` / `BatchGetItem` forward the part that fits and return
//!   the rest as `UnprocessedItems` / `UnprocessedKeys`;
//! * `Scan` is charged after the fact to the table's read bucket; the next
//!   scan is refused while the bucket is in debt.
//!
//! * `ConsumedCapacity` in answers is DynamoDB's, computed from the items
//!   (1 KB write steps per item, 4 KB read steps, halved for eventually
//!   consistent reads, doubled in transactions): the local server (moto)
//!   charges one unit per request whatever its size and count.
//!
//! Limits are token buckets (refill at the rate, capacity rate × burst
//! seconds, starting full), in [`crate::limits`], which the stand-in shares,
//! so both answer the same. With [`ProxyOptions::partitions`] the proxy
//! limits per partition instead, as DynamoDB does ([`crate::partitions`]:
//! keys sharing a partition share its limit, adaptive capacity, split for
//! heat, GSI partitions, `ThrottlingException` at an on-demand maximum). It also injects faults (HTTP 500s, connections
//! dropped without an answer, latency) from a deterministic SplitMix64 stream.
//!
//! Requests are forwarded with their bytes and headers unchanged (the local
//! server does not check SigV4 signatures, so neither the original `Host` nor
//! a rewritten batch body is a problem); anything the proxy cannot parse —
//! DynamoDB Streams and S3 requests among them — is forwarded untouched and
//! not accounted.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use rekey::core::value::{self, Item, Value};

use crate::keyspace::key_hash;
use crate::limits::{Charge, Kind, Limiter, Limits};
use crate::partitions::{self, PartitionModel, PartitionOptions, Split, Throttle};
use crate::shadow::{Audit, Validator, Verdict};

const TARGET_PREFIX: &str = "DynamoDB_20120810.";
const JSON_TYPE: &str = "application/x-amz-json-1.0";
/// The local server routes on the credential scope but does not check the signature.
const DUMMY_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0";
/// Headers that describe one hop, not the message (`expect`: the proxy has
/// already read the body).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "expect",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

type Body = BoxBody<Bytes, hyper::Error>;

/// How the proxy limits and disturbs traffic.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// `http://127.0.0.1:PORT` of the local server.
    pub upstream: String,
    /// Per partition-key value (table + hash key value), WCU/s (DynamoDB: 1000).
    pub key_write_units: f64,
    /// Per partition-key value, RCU/s (DynamoDB: 3000).
    pub key_read_units: f64,
    /// Per table, WCU/s; `None` = unlimited.
    pub table_write_units: Option<f64>,
    /// Per table, RCU/s; `None` = unlimited.
    pub table_read_units: Option<f64>,
    /// Bucket capacity = rate × burst_seconds (DynamoDB keeps ~300 s).
    pub burst_seconds: f64,
    pub faults: Faults,
    /// `http://127.0.0.1:PORT` of a validating shadow ([`crate::shadow`]):
    /// every DynamoDB request is checked there first, and one DynamoDB
    /// refuses is answered with DynamoDB's error and recorded.
    pub shadow: Option<String>,
    /// Limit per partition ([`crate::partitions`]) instead of per key value:
    /// the key and table rates above are then unused. `None`: per key.
    pub partitions: Option<PartitionOptions>,
}

/// Injected faults, drawn per request from a SplitMix64 stream seeded by `seed`.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Probability of answering HTTP 500 `InternalServerError` without forwarding.
    pub error_500_ratio: f64,
    /// Probability of closing the connection without answering.
    pub reset_ratio: f64,
    /// Delay added before each request is handled.
    pub latency: Duration,
    pub seed: u64,
}

/// What the proxy has seen so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ProxyStats {
    /// Every request received, faults included.
    pub requests: u64,
    /// Requests refused in whole (throttle error) or in part (unprocessed items/keys).
    pub throttled: u64,
    pub errors_500: u64,
    pub resets: u64,
    /// WCU admitted (forwarded).
    pub write_units: f64,
    /// RCU admitted, plus what scans consumed.
    pub read_units: f64,
    /// The most WCU any single partition key value was sent in any 1-second
    /// (sliding) window, counting every write the proxy received for it,
    /// throttled ones included: a measure of the client's pacing. What is
    /// admitted never exceeds rate × (1 + burst_seconds) in a window.
    pub max_key_write_units_per_sec: f64,
    /// Requests waiting now behind [`Proxy::hold`].
    pub held: u64,
    /// WCU admitted per table.
    pub per_table_write_units: BTreeMap<String, f64>,
}

/// A running proxy; dropping it stops it and closes its connections.
pub struct Proxy {
    endpoint: String,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl ProxyOptions {
    /// No limits and no faults: DynamoDB's answers (capacity per item) and
    /// nothing else.
    pub fn pass_through(upstream: &str) -> ProxyOptions {
        ProxyOptions {
            upstream: upstream.to_string(),
            key_write_units: f64::INFINITY,
            key_read_units: f64::INFINITY,
            table_write_units: None,
            table_read_units: None,
            burst_seconds: 1.0,
            faults: Faults::default(),
            shadow: None,
            partitions: None,
        }
    }
}

impl Proxy {
    /// Binds 127.0.0.1 on a free port and serves in a Tokio task.
    pub async fn start(opts: ProxyOptions) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let validator = opts
            .shadow
            .as_deref()
            .map(|shadow| Validator::new(shadow, &opts.upstream));
        let shared = Arc::new(Shared {
            validator,
            upstream: opts.upstream.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build(connector),
            rng: AtomicU64::new(opts.faults.seed),
            faults: opts.faults,
            schemas: Mutex::new(HashMap::new()),
            hold: tokio::sync::watch::Sender::new(None),
            state: Mutex::new(State {
                limiter: Limiter::new(Limits {
                    key_write: opts.key_write_units,
                    key_read: opts.key_read_units,
                    table_write: opts.table_write_units,
                    table_read: opts.table_read_units,
                    burst: opts.burst_seconds,
                }),
                partitions: opts.partitions.map(PartitionModel::new),
                stats: ProxyStats::default(),
            }),
        });
        let service = {
            let shared = Arc::clone(&shared);
            hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req))
        };
        let task = tokio::spawn(crate::http::serve(listener, service));
        Ok(Proxy {
            endpoint,
            shared,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    pub fn stats(&self) -> ProxyStats {
        let state = self.shared.state();
        let units = match &state.partitions {
            Some(model) => &model.stats,
            None => &state.limiter.stats,
        };
        ProxyStats {
            write_units: units.write_units,
            read_units: units.read_units,
            max_key_write_units_per_sec: units.max_key_write_units_per_sec,
            per_table_write_units: units.per_table_write_units.clone(),
            ..state.stats.clone()
        }
    }

    /// The partition splits so far (none without the partition model).
    pub fn splits(&self) -> Vec<Split> {
        let state = self.shared.state();
        state
            .partitions
            .as_ref()
            .map(|m| m.splits().to_vec())
            .unwrap_or_default()
    }

    /// The ranges of a table's (or GSI's) partitions, once it has been used
    /// (none without the partition model).
    pub fn partitions(&self, table: &str, index: Option<&str>) -> Vec<partitions::Range> {
        let state = self.shared.state();
        state
            .partitions
            .as_ref()
            .map(|m| m.partitions(table, index))
            .unwrap_or_default()
    }

    /// What strict validation saw: `None` without a shadow.
    pub fn audit(&self) -> Option<Audit> {
        self.shared.validator.as_ref().map(Validator::audit)
    }

    /// The refusals so far, taken: a test that sends invalid requests on
    /// purpose takes them so they do not fail it.
    pub fn take_refusals(&self) -> Vec<crate::shadow::Refusal> {
        self.shared
            .validator
            .as_ref()
            .map(Validator::take_refusals)
            .unwrap_or_default()
    }

    /// Holds every request for `action` (e.g. `BatchWriteItem`) until
    /// [`Proxy::release`]: a test's barrier on a client's progress, which it
    /// sees taken in [`ProxyStats::held`]. Other actions pass.
    pub fn hold(&self, action: &str) {
        self.shared.hold.send_replace(Some(action.to_string()));
    }

    /// Lets the held requests and every later one through.
    pub fn release(&self) {
        self.shared.hold.send_replace(None);
    }

    /// Changes the write limits while running; buckets keep their tokens
    /// (capped to the new capacity).
    pub fn set_limits(&self, key_write_units: f64, table_write_units: Option<f64>) {
        let mut state = self.shared.state();
        state.limiter.limits.key_write = key_write_units;
        state.limiter.limits.table_write = table_write_units;
    }
}

impl Drop for Proxy {
    /// Fails the test whose requests DynamoDB would have refused (unless it
    /// took them with [`Proxy::take_refusals`], or is failing already).
    fn drop(&mut self) {
        self.task.abort();
        let Some(v) = &self.shared.validator else {
            return;
        };
        // Reported here, by failing the test: the audit counts them apart.
        let refused = v.report_refusals();
        if refused.is_empty() || std::thread::panicking() {
            return;
        }
        let list: Vec<String> = refused
            .iter()
            .map(|r| format!("- {}: {}\n  request: {}", r.action, r.error, r.request))
            .collect();
        panic!(
            "{} request(s) DynamoDB would refuse (strict validation):\n{}",
            refused.len(),
            list.join("\n")
        );
    }
}

/// Returned by the service to make hyper drop the connection unanswered.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by the proxy")]
struct Reset;

struct Shared {
    validator: Option<Validator>,
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    faults: Faults,
    rng: AtomicU64,
    /// Table name → its key attributes.
    schemas: Mutex<HashMap<String, Schema>>,
    state: Mutex<State>,
    /// The action held back ([`Proxy::hold`]), if any.
    hold: tokio::sync::watch::Sender<Option<String>>,
}

/// What the proxy needs of a table's key schema.
#[derive(Debug, Clone)]
struct Schema {
    /// The HASH key attribute.
    hash: String,
    /// Each GSI's name and HASH key attribute.
    indexes: Vec<(String, String)>,
}

struct State {
    limiter: Limiter,
    /// Replaces the limiter's per-key buckets when set.
    partitions: Option<PartitionModel>,
    /// The proxy's own counters (the limiter keeps the units).
    stats: ProxyStats,
}

impl State {
    /// Charges what a Scan read, to whichever limiter runs.
    fn charge_scan(&mut self, table: &str, units: f64) {
        match &mut self.partitions {
            Some(model) => model.charge_scan(table, units, Instant::now()),
            None => self.limiter.charge_scan(table, units),
        }
    }
}

/// What to do with one parsed request.
enum Plan {
    Forward,
    Throttle(Throttle),
    /// Forward `body` (the admitted part) and add `rest` to the answer's `field`.
    Partial {
        body: Vec<u8>,
        field: &'static str,
        rest: Map<String, Json>,
    },
    /// Forward, then charge what the scan read.
    Scan {
        table: String,
        consistent: bool,
    },
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Reset> {
    shared.state().stats.requests += 1;
    let f = &shared.faults;
    if f.reset_ratio > 0.0 || f.error_500_ratio > 0.0 {
        let draw = splitmix(&shared.rng);
        if draw < f.reset_ratio {
            shared.state().stats.resets += 1;
            return Err(Reset);
        }
        if draw < f.reset_ratio + f.error_500_ratio {
            shared.state().stats.errors_500 += 1;
            return Ok(internal_error());
        }
    }
    if !f.latency.is_zero() {
        tokio::time::sleep(f.latency).await;
    }

    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Reset)?.to_bytes();
    let op = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix(TARGET_PREFIX))
        .unwrap_or_default()
        .to_string();
    shared.wait_if_held(&op).await;
    let request = serde_json::from_slice::<Json>(&body)
        .ok()
        .filter(Json::is_object);
    // DynamoDB validates a request before it throttles it.
    if let (Some(validator), Some(json)) = (&shared.validator, &request)
        && !op.is_empty()
        && let Verdict::Refused { status, body } = validator.check(&op, &body, json).await
    {
        return Ok(refusal(status, body));
    }
    let plan = match &request {
        Some(json) => shared.plan(&op, json).await,
        None => Plan::Forward,
    };
    let wants_capacity = request.as_ref().and_then(|r| capacity::wanted(&op, r));

    match plan {
        Plan::Forward if wants_capacity.is_some() => {
            let resp = shared.forward(&parts, body).await?;
            let (head, bytes) = collect(resp).await?;
            let rewritten = (head.status == StatusCode::OK)
                .then(|| capacity::rewrite(&op, request.as_ref()?, &bytes))
                .flatten();
            Ok(rebuild(head, rewritten.map_or(bytes, Bytes::from)))
        }
        Plan::Forward => shared.forward(&parts, body).await.map(stream),
        Plan::Throttle(refused) => {
            shared.state().stats.throttled += 1;
            Ok(throttle_error(&refused))
        }
        Plan::Partial { body, field, rest } => {
            shared.state().stats.throttled += 1;
            let forwarded: Option<Json> = serde_json::from_slice(&body).ok();
            let resp = shared.forward(&parts, body.into()).await?;
            let (head, bytes) = collect(resp).await?;
            let merged = (head.status == StatusCode::OK)
                .then(|| {
                    let bytes = match (&wants_capacity, &forwarded) {
                        (Some(_), Some(sent)) => capacity::rewrite(&op, sent, &bytes)?,
                        _ => bytes.to_vec(),
                    };
                    merge_unprocessed(&bytes, field, rest)
                })
                .flatten();
            Ok(rebuild(head, merged.map_or(bytes, Bytes::from)))
        }
        Plan::Scan { table, consistent } => {
            let resp = shared.forward(&parts, body).await?;
            let (head, bytes) = collect(resp).await?;
            if head.status != StatusCode::OK {
                return Ok(rebuild(head, bytes));
            }
            if let (Some(_), Some(req)) = (&shared.validator, &request) {
                crate::shadow::scan_answered(req, &bytes);
            }
            let units = capacity::scan_units(&bytes, consistent);
            shared.state().charge_scan(&table, units);
            let rewritten =
                wants_capacity.and_then(|_| capacity::rewrite(&op, request.as_ref()?, &bytes));
            Ok(rebuild(head, rewritten.map_or(bytes, Bytes::from)))
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits while `op` is the action held ([`Proxy::hold`]).
    async fn wait_if_held(&self, op: &str) {
        let mut rx = self.hold.subscribe();
        if rx.borrow().as_deref() != Some(op) {
            return;
        }
        self.state().stats.held += 1;
        let _ = rx.wait_for(|h| h.as_deref() != Some(op)).await;
        self.state().stats.held -= 1;
    }

    async fn plan(&self, op: &str, req: &Json) -> Plan {
        if self.state().partitions.is_some() {
            return self.plan_partitioned(op, req).await;
        }
        let table = req
            .get("TableName")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let single = |kind, charge: Option<Charge>| match charge {
            Some(c) => match self.state().limiter.admit(kind, &[c]) {
                Ok(()) => Plan::Forward,
                Err(r) => Plan::Throttle(r.into()),
            },
            None => Plan::Forward,
        };
        match op {
            "PutItem" | "UpdateItem" | "DeleteItem" | "GetItem" | "Query" if !table.is_empty() => {
                let hash = self.hash_key(table).await;
                let hash = hash.as_deref();
                match op {
                    "PutItem" => single(Kind::Write, charge(table, hash, req.get("Item"), None)),
                    "GetItem" => single(Kind::Read, charge(table, hash, req.get("Key"), Some(1.0))),
                    "Query" => {
                        // An index's partitions are not the table's.
                        let hash = hash.filter(|_| req.get("IndexName").is_none());
                        let value = hash.and_then(|h| query_hash_value(req, h));
                        let key = hash.zip(value).and_then(|(h, v)| key_bytes(h, v));
                        single(
                            Kind::Read,
                            Some(Charge {
                                table: table.to_string(),
                                key,
                                units: 1.0,
                            }),
                        )
                    }
                    _ => single(Kind::Write, charge(table, hash, req.get("Key"), Some(1.0))),
                }
            }
            "TransactWriteItems" => {
                let mut charges = Vec::new();
                for (t, item, units) in transact_writes(req) {
                    let hash = self.hash_key(t).await;
                    if let Some(mut c) = charge(t, hash.as_deref(), item, units) {
                        c.units *= 2.0; // a transaction writes twice
                        charges.push(c);
                    }
                }
                if charges.is_empty() {
                    return Plan::Forward;
                }
                match self.state().limiter.admit(Kind::Write, &charges) {
                    Ok(()) => Plan::Forward,
                    Err(r) => Plan::Throttle(r.into()),
                }
            }
            "BatchWriteItem" => self.plan_batch(req, Kind::Write).await,
            "BatchGetItem" => self.plan_batch(req, Kind::Read).await,
            "Scan" if !table.is_empty() => {
                if let Err(r) = self.state().limiter.scan_allowed(table) {
                    return Plan::Throttle(r.into());
                }
                let consistent = req.get("ConsistentRead").and_then(Json::as_bool) == Some(true);
                Plan::Scan {
                    table: table.to_string(),
                    consistent,
                }
            }
            "DeleteTable" => {
                // It may come back with another key schema.
                self.schemas
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(table);
                Plan::Forward
            }
            _ => Plan::Forward,
        }
    }

    /// [`Self::plan`] with the partition model: the same requests charged,
    /// placed by their partition key's ring position, puts also charged to
    /// the GSIs that hold the item.
    async fn plan_partitioned(&self, op: &str, req: &Json) -> Plan {
        let table = req
            .get("TableName")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let (kind, charges) = match op {
            "PutItem" | "UpdateItem" | "DeleteItem" | "GetItem" | "Query" if !table.is_empty() => {
                let schema = self.schema(table).await;
                let schema = schema.as_ref();
                let charge = match op {
                    "PutItem" => partition_charge(table, schema, req.get("Item"), None),
                    "Query" => Some(query_charge(table, schema, req)),
                    _ => partition_charge(table, schema, req.get("Key"), Some(1.0)),
                };
                let kind = match op {
                    "GetItem" | "Query" => Kind::Read,
                    _ => Kind::Write,
                };
                (kind, charge.into_iter().collect())
            }
            "TransactWriteItems" => {
                let mut charges = Vec::new();
                for (t, item, units) in transact_writes(req) {
                    let schema = self.schema(t).await;
                    if let Some(mut c) = partition_charge(t, schema.as_ref(), item, units) {
                        c.units *= 2.0; // a transaction writes twice
                        charges.push(c);
                    }
                }
                (Kind::Write, charges)
            }
            "BatchWriteItem" => return self.plan_batch(req, Kind::Write).await,
            "BatchGetItem" => return self.plan_batch(req, Kind::Read).await,
            "Scan" if !table.is_empty() => {
                let mut state = self.state();
                let model = state.partitions.as_mut().expect("the partition model");
                if let Err(t) = model.scan_allowed(table, Instant::now()) {
                    return Plan::Throttle(t);
                }
                let consistent = req.get("ConsistentRead").and_then(Json::as_bool) == Some(true);
                return Plan::Scan {
                    table: table.to_string(),
                    consistent,
                };
            }
            "DeleteTable" => {
                // It may come back with another key schema and fresh partitions.
                self.schemas
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(table);
                if let Some(model) = self.state().partitions.as_mut() {
                    model.forget(table);
                }
                return Plan::Forward;
            }
            _ => return Plan::Forward,
        };
        if charges.is_empty() {
            return Plan::Forward;
        }
        let mut state = self.state();
        let model = state.partitions.as_mut().expect("the partition model");
        match model.admit(kind, &charges, Instant::now()) {
            Ok(()) => Plan::Forward,
            Err(t) => Plan::Throttle(t),
        }
    }

    /// Admits batch entries one by one while they fit; the rest is returned
    /// unprocessed, as DynamoDB does.
    async fn plan_batch(&self, req: &Json, kind: Kind) -> Plan {
        let Some(tables) = req.get("RequestItems").and_then(Json::as_object) else {
            return Plan::Forward;
        };
        let mut schemas = HashMap::new();
        for table in tables.keys() {
            schemas.insert(table.clone(), self.schema(table).await);
        }
        let mut admitted = Map::new();
        let mut rest = Map::new();
        let mut first_refusal = None;
        let mut state = self.state();
        for (table, entries) in tables {
            let schema = schemas.get(table).and_then(Option::as_ref);
            let hash = schema.map(|s| s.hash.as_str());
            // BatchWriteItem: [{PutRequest|DeleteRequest}]; BatchGetItem: {Keys: [..], ..}.
            let list = match kind {
                Kind::Write => entries.as_array(),
                Kind::Read => entries.get("Keys").and_then(Json::as_array),
            };
            let Some(list) = list else {
                return Plan::Forward;
            };
            let (admitted_entries, refusal) = match &mut state.partitions {
                Some(model) => {
                    let charges = list.iter().map(|entry| {
                        batch_entry(kind, entry, |item, units| {
                            partition_charge(table, schema, item, units)
                        })
                    });
                    model.admit_each(kind, charges, Instant::now())
                }
                None => {
                    let charges = list.iter().map(|entry| {
                        batch_entry(kind, entry, |item, units| charge(table, hash, item, units))
                    });
                    let (admitted, refusal) = state.limiter.admit_each(kind, charges);
                    (admitted, refusal.map(Throttle::from))
                }
            };
            if let Some(r) = refusal {
                first_refusal.get_or_insert(r);
            }
            let (mut ok, mut no) = (Vec::new(), Vec::new());
            for (entry, admitted) in list.iter().zip(admitted_entries) {
                match admitted {
                    true => ok.push(entry.clone()),
                    false => no.push(entry.clone()),
                }
            }
            let wrap = |list: Vec<Json>| match kind {
                Kind::Write => Json::Array(list),
                Kind::Read => {
                    let mut e = entries.clone();
                    e["Keys"] = Json::Array(list);
                    e
                }
            };
            if !ok.is_empty() {
                admitted.insert(table.clone(), wrap(ok));
            }
            if !no.is_empty() {
                rest.insert(table.clone(), wrap(no));
            }
        }
        drop(state);
        match first_refusal {
            None => Plan::Forward,
            Some(r) if admitted.is_empty() => Plan::Throttle(r),
            Some(_) => {
                let mut body = req.clone();
                body["RequestItems"] = Json::Object(admitted);
                let Ok(body) = serde_json::to_vec(&body) else {
                    return Plan::Forward;
                };
                let field = match kind {
                    Kind::Write => "UnprocessedItems",
                    Kind::Read => "UnprocessedKeys",
                };
                Plan::Partial { body, field, rest }
            }
        }
    }

    /// The table's HASH key name.
    async fn hash_key(&self, table: &str) -> Option<String> {
        self.schema(table).await.map(|s| s.hash)
    }

    /// The table's key attributes, from the cache or a DescribeTable of our own.
    async fn schema(&self, table: &str) -> Option<Schema> {
        if let Some(h) = self
            .schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(table)
        {
            return Some(h.clone());
        }
        let body = serde_json::to_vec(&json!({ "TableName": table })).ok()?;
        let req = Request::post(format!("{}/", self.upstream))
            .header(CONTENT_TYPE, JSON_TYPE)
            .header("x-amz-target", format!("{TARGET_PREFIX}DescribeTable"))
            .header("x-amz-date", "20260101T000000Z")
            .header("authorization", DUMMY_AUTH)
            .body(Full::new(Bytes::from(body)))
            .ok()?;
        let resp = self.client.request(req).await.ok()?;
        if resp.status() != StatusCode::OK {
            return None; // no such table (yet): not cached
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        let desc: Json = serde_json::from_slice(&bytes).ok()?;
        let hash_of = |key_schema: &Json| {
            let hash = key_schema
                .as_array()?
                .iter()
                .find(|k| k["KeyType"] == "HASH")?;
            Some(hash["AttributeName"].as_str()?.to_string())
        };
        let gsis = desc["Table"]["GlobalSecondaryIndexes"].as_array();
        let schema = Schema {
            hash: hash_of(&desc["Table"]["KeySchema"])?,
            indexes: gsis
                .into_iter()
                .flatten()
                .filter_map(|g| {
                    Some((
                        g["IndexName"].as_str()?.to_string(),
                        hash_of(&g["KeySchema"])?,
                    ))
                })
                .collect(),
        };
        let mut schemas = self.schemas.lock().unwrap_or_else(|e| e.into_inner());
        schemas.insert(table.to_string(), schema.clone());
        Some(schema)
    }

    /// Sends the request upstream with its headers unchanged (Host included).
    async fn forward(&self, parts: &Parts, body: Bytes) -> Result<Response<Incoming>, Reset> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::new(Full::new(body.clone()));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = format!("{}{path}", self.upstream)
            .parse()
            .map_err(|_| Reset)?;
        *req.headers_mut() = parts.headers.clone();
        strip_hop_by_hop(req.headers_mut());
        // Only changes when a batch was cut down.
        req.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        // An unanswered request stays unanswered: the client sees a dropped
        // connection. Said on stderr (a test's captured output), as the
        // client cannot tell why.
        self.client.request(req).await.map_err(|e| {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                why.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("proxy: {path} to {} failed: {why}", self.upstream);
            Reset
        })
    }
}

/// A `BatchWriteItem` entry (`PutRequest` item, `DeleteRequest` key) or a
/// `BatchGetItem` key, charged by `charge(item or key, units)`.
fn batch_entry<C>(
    kind: Kind,
    entry: &Json,
    charge: impl Fn(Option<&Json>, Option<f64>) -> Option<C>,
) -> Option<C> {
    match kind {
        Kind::Write => match (entry.get("PutRequest"), entry.get("DeleteRequest")) {
            (Some(p), _) => charge(p.get("Item"), None),
            (_, Some(d)) => charge(d.get("Key"), Some(1.0)),
            _ => None,
        },
        Kind::Read => charge(Some(entry), Some(1.0)),
    }
}

/// The partition model's charge of one item or key: `units`, or (None) a
/// put of the whole item, its size in WCU, which also writes every GSI
/// that holds the item (the ones whose key attribute it has).
fn partition_charge(
    table: &str,
    schema: Option<&Schema>,
    item: Option<&Json>,
    units: Option<f64>,
) -> Option<partitions::Charge> {
    let item = item?;
    let put_units = || {
        let size = value::item_size(&Item::deserialize(item).ok()?);
        Some(value::write_units(size) as f64)
    };
    let (units, put) = match units {
        Some(units) => (units, false),
        None => (put_units()?, true),
    };
    let hash = schema.and_then(|s| item.get(&s.hash)).map(key_hash);
    let mut charge = partitions::Charge::table(table, hash, units);
    for (index, attr) in schema.map(|s| s.indexes.as_slice()).unwrap_or_default() {
        if let Some(v) = item.get(attr).filter(|_| put) {
            charge = charge.and_index(index, key_hash(v));
        }
    }
    Some(charge)
}

/// The charge of one item or key: `units`, or (None) the item's size in WCU.
/// The writes of a TransactWriteItems: (table, item or key, units: None to
/// size the item). A ConditionCheck is a read, not charged.
fn transact_writes(req: &Json) -> Vec<(&str, Option<&Json>, Option<f64>)> {
    let items = req.get("TransactItems").and_then(Json::as_array);
    items
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let (kind, body) = ["Put", "Update", "Delete"]
                .into_iter()
                .find_map(|k| Some((k, entry.get(k)?)))?;
            let t = body.get("TableName").and_then(Json::as_str)?;
            Some(match kind {
                "Put" => (t, body.get("Item"), None),
                _ => (t, body.get("Key"), Some(1.0)),
            })
        })
        .collect()
}

fn charge(
    table: &str,
    hash: Option<&str>,
    item: Option<&Json>,
    units: Option<f64>,
) -> Option<Charge> {
    let item = Item::deserialize(item?).ok()?;
    Some(Charge {
        table: table.to_string(),
        key: hash.and_then(|h| value::encode_key(&item, &[h])),
        units: units.unwrap_or_else(|| value::write_units(value::item_size(&item)) as f64),
    })
}

/// A Query's read (one unit before the fact), placed by the partition key
/// value it asks for: the table's, or with `IndexName` the index's.
fn query_charge(table: &str, schema: Option<&Schema>, req: &Json) -> partitions::Charge {
    let index = req.get("IndexName").and_then(Json::as_str);
    let attr = match index {
        Some(name) => schema.and_then(|s| s.indexes.iter().find(|(n, _)| n == name)),
        None => None,
    }
    .map(|(_, attr)| attr.as_str());
    let attr = attr.or_else(|| schema.filter(|_| index.is_none()).map(|s| s.hash.as_str()));
    let hash = attr.and_then(|a| query_hash_value(req, a)).map(key_hash);
    match index {
        Some(name) => partitions::Charge::index(table, name, hash, 1.0),
        None => partitions::Charge::table(table, hash, 1.0),
    }
}

fn key_bytes(hash: &str, value: &Json) -> Option<Vec<u8>> {
    let item = Item::from([(hash.to_string(), Value::deserialize(value).ok()?)]);
    value::encode_key(&item, &[hash])
}

/// The partition key value a Query asks for: `KeyConditions`, or the
/// `<hash> = :v` term of `KeyConditionExpression`.
fn query_hash_value<'a>(req: &'a Json, hash: &str) -> Option<&'a Json> {
    if let Some(v) = req.pointer(&format!("/KeyConditions/{hash}/AttributeValueList/0")) {
        return Some(v);
    }
    let expr = req.get("KeyConditionExpression")?.as_str()?;
    let names = req.get("ExpressionAttributeNames");
    let values = req.get("ExpressionAttributeValues")?;
    let resolve = |t: &str| match t.starts_with('#') {
        true => names.and_then(|n| n.get(t)).and_then(Json::as_str) == Some(hash),
        false => t == hash,
    };
    let not_ident = |c: char| !(c.is_alphanumeric() || "_#:.-".contains(c));
    for (i, _) in expr.match_indices('=') {
        if expr[..i].ends_with(['<', '>', '!']) {
            continue;
        }
        let left = expr[..i]
            .trim_end()
            .rsplit(not_ident)
            .next()
            .unwrap_or_default();
        let right = expr[i + 1..]
            .trim_start()
            .split(not_ident)
            .next()
            .unwrap_or_default();
        for (name, val) in [(left, right), (right, left)] {
            if val.starts_with(':') && resolve(name) {
                return values.get(val);
            }
        }
    }
    None
}

/// Adds what the proxy kept back to the answer's `UnprocessedItems`/`Keys`.
fn merge_unprocessed(body: &[u8], field: &str, rest: Map<String, Json>) -> Option<Vec<u8>> {
    let mut answer: Json = serde_json::from_slice(body).ok()?;
    let slot = answer
        .as_object_mut()?
        .entry(field)
        .or_insert_with(|| json!({}));
    let tables = slot.as_object_mut()?;
    for (table, ours) in rest {
        match (tables.get_mut(&table), ours) {
            (Some(Json::Array(theirs)), Json::Array(ours)) => theirs.extend(ours),
            (Some(theirs), Json::Object(ours)) if theirs["Keys"].is_array() => {
                if let (Some(Json::Array(keys)), Some(Json::Array(more))) =
                    (theirs.get_mut("Keys"), ours.get("Keys"))
                {
                    keys.extend(more.iter().cloned());
                }
            }
            (_, ours) => {
                tables.insert(table, ours);
            }
        }
    }
    serde_json::to_vec(&answer).ok()
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Streams the upstream answer back.
fn stream(resp: Response<Incoming>) -> Response<Body> {
    let mut resp = resp.map(BodyExt::boxed);
    strip_hop_by_hop(resp.headers_mut());
    resp
}

async fn collect(resp: Response<Incoming>) -> Result<(hyper::http::response::Parts, Bytes), Reset> {
    let (head, body) = resp.into_parts();
    let bytes = body.collect().await.map_err(|_| Reset)?.to_bytes();
    Ok((head, bytes))
}

/// The upstream head with a (possibly rewritten) body.
fn rebuild(mut head: hyper::http::response::Parts, body: Bytes) -> Response<Body> {
    strip_hop_by_hop(&mut head.headers);
    head.headers
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    // The upstream's checksum would no longer match.
    head.headers.remove("x-amz-crc32");
    Response::from_parts(head, full(body))
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// SplitMix64 over an atomic state, as a float in [0, 1).
fn splitmix(state: &AtomicU64) -> f64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut z = state
        .fetch_add(GAMMA, Ordering::Relaxed)
        .wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// A DynamoDB error answer; `body` is JSON.
fn error_answer(status: StatusCode, error_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON_TYPE));
    headers.insert("x-amzn-errortype", HeaderValue::from_static(error_type));
    headers.insert("x-amzn-requestid", HeaderValue::from_static("rekey-proxy"));
    resp
}

/// DynamoDB's throttle answer.
/// DynamoDB's refusal of an invalid request, as the shadow answered it.
fn refusal(status: StatusCode, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, JSON_TYPE)
        .body(full(body))
        .expect("static response parts")
}

fn throttle_error(t: &Throttle) -> Response<Body> {
    error_answer(StatusCode::BAD_REQUEST, t.exception, t.body())
}

fn internal_error() -> Response<Body> {
    let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}"#;
    error_answer(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalServerError",
        body.into(),
    )
}

mod capacity;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_key_condition_is_found() {
        let req = json!({
            "KeyConditionExpression": "#p = :v AND begins_with(SK, :s)",
            "ExpressionAttributeNames": {"#p": "PK"},
            "ExpressionAttributeValues": {":v": {"S": "a"}, ":s": {"S": "b"}},
        });
        assert_eq!(query_hash_value(&req, "PK"), Some(&json!({"S": "a"})));
        let req = json!({"KeyConditionExpression": "SK >= :s and :v=PK",
            "ExpressionAttributeValues": {":v": {"N": "1"}, ":s": {"S": "b"}}});
        assert_eq!(query_hash_value(&req, "PK"), Some(&json!({"N": "1"})));
    }

    #[test]
    fn splitmix_is_deterministic_and_uniform_enough() {
        let (a, b) = (AtomicU64::new(7), AtomicU64::new(7));
        let xs: Vec<f64> = (0..1000).map(|_| splitmix(&a)).collect();
        assert!(
            xs.iter()
                .all(|&x| x == splitmix(&b) && (0.0..1.0).contains(&x))
        );
        let below = xs.iter().filter(|&&x| x < 0.5).count();
        assert!((400..600).contains(&below), "{below}");
    }
}
