//! A stand-in for a fast DynamoDB, for benchmarks: an HTTP server that
//! speaks the DynamoDB and DynamoDB Streams JSON 1.0 protocols the AWS SDK
//! sends (`X-Amz-Target: DynamoDB_20120810.<Op>` /
//! `DynamoDBStreams_20120810.<Op>`, no signature check) and answers from
//! generated items instead of storage, so it costs little per item and
//! nothing per item is kept: 10M items take no memory.
//!
//! * **The source table** holds `items` generated orders ([`items`]: the demo's
//!   skewed tenant-day keys, `SK = ORDER#<index>`). `Scan` honours
//!   `Segment`/`TotalSegments` (segment `s` of `T` holds indices
//!   `[s·N/T, (s+1)·N/T)`), `Limit`, `ExclusiveStartKey` (the index is in its
//!   `SK`: resuming is O(1)), the 1 MB page cap, `Count`/`ScannedCount` and
//!   DynamoDB's `ConsumedCapacity` (the page's bytes in 4 KB steps, halved
//!   unless consistent). `BatchGetItem`/`GetItem` regenerate an item from its key.
//! * **The target table** acknowledges `BatchWriteItem`, `PutItem`,
//!   `DeleteItem` and `UpdateItem` at once with DynamoDB's `ConsumedCapacity`
//!   (1 KB steps per item; 1 unit per delete or update, as the proxy
//!   charges), optionally under per-key and per-table limits enforced by
//!   [`crate::limits`] exactly as the proxy enforces them (a throttle with
//!   `ThrottlingReasons`; a batch's refused entries as `UnprocessedItems`).
//!   Writes are counted, not stored: reads of the target (`Scan`,
//!   `BatchGetItem`, `GetItem`) answer with what a correct backfill wrote,
//!   `transform(plan, source item)`, recovering the source item's index from
//!   the key (`ORDER#<index>` in any of its values). `corrupt_every: K`
//!   changes `status` in every K-th target item so that verify finds
//!   differences.
//! * **The source's stream** ([`stream`]): `DescribeTable` names it
//!   (NEW_AND_OLD_IMAGES); `DescribeStream` lists its open shards;
//!   `GetShardIterator` (TRIM_HORIZON, LATEST, AT/AFTER_SEQUENCE_NUMBER) and
//!   `GetRecords` (≤ 1,000 records / 1 MB a call) give its generated records,
//!   then empty reads.
//! * `DescribeTable` (key schema, `ItemCount`, `TableSizeBytes`, on-demand
//!   unless table limits are set), `ListTables`, `ListStreams`.
//! * `GET /stats`: what was served and written, throttles, per 1-second
//!   window, and the process's own CPU time ([`StandinStats`]).
//!
//! Pages and records are written straight into pre-sized buffers; write
//! requests are read with visitors that only add up sizes ([`wire`]). Target
//! reads run rekey's transform per item, as they must.
//!
//! Not modelled: writes do not change what is read, Query, conditions,
//! projections and filters (ignored), tables other than the plan's two.

pub mod items;
pub mod stream;
pub mod wire;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use rekey::core::plan::{KeySchema, Plan};
use rekey::core::transform::{Outcome, transform};
use rekey::core::value::{self, Item, Value};

use crate::limits::{self, Charge, Kind, Limiter, Limits, Refused};
use items::Generator;
use stream::StreamGen;
use wire::Capacity;

const JSON_TYPE: &str = "application/x-amz-json-1.0";
/// DynamoDB's Scan page cap.
pub const MAX_PAGE_BYTES: usize = 1024 * 1024;
const STREAM_LABEL: &str = "2026-01-01T00:00:00.000";
/// 2026-01-01T00:00:00Z: tables' and streams' creation time.
const CREATED: f64 = 1_767_225_600.0;

/// What the stand-in serves.
#[derive(Debug, Clone)]
pub struct StandinOptions {
    /// Items in the source table.
    pub items: u64,
    /// Each item's size by DynamoDB's rules (`pad` fills it up).
    pub item_bytes: usize,
    pub seed: u64,
    /// Gives both tables (names, key schemas) and the target's contents.
    pub plan: Plan,
    /// Every K-th target item differs from transform(source).
    pub corrupt_every: Option<u64>,
    /// Open shards of the source's stream.
    pub shards: u32,
    /// Records in the stream.
    pub stream_records: u64,
    /// Enforced on both tables; None: no limit (and no per-key accounting).
    pub limits: Option<Limits>,
}

impl StandinOptions {
    /// `items` items of 500 bytes, `plans/tenant-day-shard.toml` (tables
    /// `orders` → `orders_by_shard`), 4 shards, no stream records, no limits.
    pub fn new(items: u64) -> StandinOptions {
        let plan = Plan::parse(
            rekey::ops::demo::DEMO_PLAN,
            std::path::Path::new("plans/tenant-day-shard.toml"),
        )
        .expect("the demo plan parses");
        StandinOptions {
            items,
            item_bytes: 500,
            seed: 0x5EED,
            plan,
            corrupt_every: None,
            shards: 4,
            stream_records: 0,
            limits: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Source,
    Target,
}

#[derive(Debug, Clone)]
struct TableDef {
    name: String,
    role: Role,
    key: KeySchema,
}

/// The stand-in's contents, as pure functions of the options.
pub struct Model {
    pub items: Generator,
    pub stream: StreamGen,
    plan: Plan,
    tables: [TableDef; 2],
    corrupt_every: Option<u64>,
    /// The tables' HASH key names, each once (write requests capture these).
    hash_names: Vec<String>,
    /// Each table's HASH key name's place in `hash_names`, in `tables` order.
    hash_of: [usize; 2],
}

impl Model {
    pub fn new(opts: &StandinOptions) -> anyhow::Result<Model> {
        let plan = opts.plan.clone();
        anyhow::ensure!(
            plan.source_table != plan.target_table,
            "the stand-in serves re-keying plans (target ≠ source); `{}` is in place",
            plan.path.display()
        );
        let tables = [
            TableDef {
                name: plan.source_table.clone(),
                role: Role::Source,
                key: plan.source_key.clone(),
            },
            TableDef {
                name: plan.target_table.clone(),
                role: Role::Target,
                key: plan.target_key.clone(),
            },
        ];
        let mut hash_names: Vec<String> = Vec::new();
        let hash_of = tables.clone().map(|t| {
            let name = t.key.partition_key.name;
            match hash_names.iter().position(|h| *h == name) {
                Some(i) => i,
                None => {
                    hash_names.push(name);
                    hash_names.len() - 1
                }
            }
        });
        Ok(Model {
            items: Generator::new(opts.items, opts.item_bytes, opts.seed),
            // The records were all written as the stand-in started: a tail's
            // lag is the time since.
            stream: StreamGen::new(opts.shards, opts.stream_records, opts.items, now_secs()),
            plan,
            tables,
            corrupt_every: opts.corrupt_every.filter(|&k| k > 0),
            hash_names,
            hash_of,
        })
    }

    /// Source item `index`.
    pub fn source_item(&self, index: u64) -> Item {
        self.items.order(index).item()
    }

    /// What the target holds for source item `index`: transform(plan, item),
    /// changed if it is one of the corrupt ones; None if the plan rejects
    /// or skips it.
    pub fn target_item(&self, index: u64) -> Option<Item> {
        match transform(&self.plan, &self.source_item(index)) {
            Outcome::Put { mut item, .. } => {
                if self.corrupt_every.is_some_and(|k| index.is_multiple_of(k)) {
                    item.insert("status".into(), Value::S("CORRUPTED".into()));
                }
                Some(item)
            }
            _ => None,
        }
    }

    pub fn source_table(&self) -> &str {
        &self.tables[0].name
    }

    pub fn target_table(&self) -> &str {
        &self.tables[1].name
    }

    pub fn stream_arn(&self) -> String {
        format!(
            "{}/stream/{STREAM_LABEL}",
            limits::table_arn(self.source_table())
        )
    }

    fn table(&self, name: &str) -> Result<&TableDef, Answer> {
        self.tables
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| not_found(&format!("Table: {name} not found")))
    }

    /// The place of `table`'s HASH key name in `hash_names`.
    fn hash_index(&self, table: &TableDef) -> usize {
        let i = self.tables.iter().position(|t| t.name == table.name);
        self.hash_of[i.unwrap_or_default()]
    }

    /// The item `key` names in `table`, if there is one: its DynamoDB size
    /// and its JSON appended to `out`.
    fn lookup(&self, table: &TableDef, key: &Item, out: &mut Vec<u8>) -> Option<usize> {
        let index = Generator::index_of_key(key)?;
        if index >= self.items.items() {
            return None;
        }
        match table.role {
            Role::Source => {
                let o = self.items.order(index);
                o.has_key(key).then(|| {
                    o.write_json(out);
                    o.size()
                })
            }
            Role::Target => {
                let item = self.target_item(index)?;
                let names = table.key.names();
                let same = key.len() == names.len()
                    && names
                        .iter()
                        .all(|n| item.contains_key(*n) && item.get(*n) == key.get(*n));
                same.then(|| {
                    wire::push_item(out, &item);
                    value::item_size(&item)
                })
            }
        }
    }
}

/// Per 1-second window since the start.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    pub second: u64,
    /// Items (puts, deletes, updates) acknowledged.
    pub written_items: u64,
    pub write_units: f64,
    /// Requests refused whole or in part.
    pub throttled_requests: u64,
    /// Batch entries (or single writes) refused.
    pub throttled_items: u64,
    /// Items returned by Scan, BatchGetItem and GetItem, and stream records.
    pub served_items: u64,
}

/// What the stand-in has done since it started.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StandinStats {
    pub uptime_seconds: f64,
    /// This process's CPU time (getrusage), all threads.
    pub cpu_user_seconds: f64,
    pub cpu_system_seconds: f64,
    pub max_rss_kb: u64,
    /// Requests per operation.
    pub requests: BTreeMap<String, u64>,
    /// Source items returned by Scan.
    pub scanned_items: u64,
    /// Target items returned by Scan.
    pub target_scanned_items: u64,
    /// Items returned by BatchGetItem and GetItem.
    pub got_items: u64,
    pub stream_records: u64,
    pub written_items: u64,
    pub write_units: f64,
    pub read_units: f64,
    pub throttled_requests: u64,
    pub throttled_items: u64,
    pub windows: Vec<Window>,
}

/// What one request adds to the stats.
#[derive(Debug, Default)]
struct Tally {
    scanned: u64,
    target_scanned: u64,
    got: u64,
    records: u64,
    written: u64,
    write_units: f64,
    read_units: f64,
    throttled_request: bool,
    throttled_items: u64,
}

struct Shared {
    model: Model,
    limiter: Option<Mutex<Limiter>>,
    started: Instant,
    stats: Mutex<StandinStats>,
}

/// A running stand-in; dropping it stops it.
pub struct Standin {
    endpoint: String,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Standin {
    /// Binds 127.0.0.1 on a free port and serves in a Tokio task.
    pub async fn start(opts: StandinOptions) -> anyhow::Result<Standin> {
        Standin::bind(SocketAddr::from(([127, 0, 0, 1], 0)), opts).await
    }

    pub async fn bind(addr: SocketAddr, opts: StandinOptions) -> anyhow::Result<Standin> {
        let model = Model::new(&opts)?;
        let listener = TcpListener::bind(addr).await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            model,
            limiter: opts.limits.map(|l| Mutex::new(Limiter::new(l))),
            started: Instant::now(),
            stats: Mutex::new(StandinStats::default()),
        });
        let task = tokio::spawn(serve(listener, Arc::clone(&shared)));
        Ok(Standin {
            endpoint,
            shared,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    pub fn model(&self) -> &Model {
        &self.shared.model
    }

    pub fn stats(&self) -> StandinStats {
        self.shared.stats_now()
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    // Owned by this task: aborting it drops every connection.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let shared = Arc::clone(&shared);
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// An answer other than 200.
enum Answer {
    Error {
        status: StatusCode,
        error_type: &'static str,
        body: String,
    },
    Throttle(Refused),
}

fn not_found(what: &str) -> Answer {
    error(
        StatusCode::BAD_REQUEST,
        "ResourceNotFoundException",
        "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException",
        &format!("Requested resource not found: {what}"),
    )
}

fn validation(message: &str) -> Answer {
    error(
        StatusCode::BAD_REQUEST,
        "ValidationException",
        "com.amazon.coral.validate#ValidationException",
        message,
    )
}

fn bad_json(e: serde_json::Error) -> Answer {
    error(
        StatusCode::BAD_REQUEST,
        "SerializationException",
        "com.amazon.coral.service#SerializationException",
        &e.to_string(),
    )
}

fn error(status: StatusCode, error_type: &'static str, full_type: &str, message: &str) -> Answer {
    Answer::Error {
        status,
        error_type,
        body: json!({ "__type": full_type, "message": message }).to_string(),
    }
}

fn respond(
    status: StatusCode,
    error_type: Option<&'static str>,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON_TYPE));
    headers.insert(
        "x-amzn-requestid",
        HeaderValue::from_static("rekey-standin"),
    );
    if let Some(t) = error_type {
        headers.insert("x-amzn-errortype", HeaderValue::from_static(t));
    }
    resp
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() == Method::GET {
        let body = match req.uri().path() {
            "/stats" => serde_json::to_vec(&shared.stats_now()).unwrap_or_default(),
            _ => b"rekey-standin: POST DynamoDB requests to /, GET /stats\n".to_vec(),
        };
        return Ok(respond(StatusCode::OK, None, body));
    }
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(respond(StatusCode::BAD_REQUEST, None, Vec::new())),
    };
    let op = target
        .strip_prefix("DynamoDB_20120810.")
        .or_else(|| target.strip_prefix("DynamoDBStreams_20120810."))
        .unwrap_or_default();
    let mut tally = Tally::default();
    let answer = shared.dispatch(op, &body, &mut tally);
    shared.count(op, &tally);
    Ok(match answer {
        Ok(body) => respond(StatusCode::OK, None, body),
        Err(Answer::Error {
            status,
            error_type,
            body,
        }) => respond(status, Some(error_type), body.into_bytes()),
        Err(Answer::Throttle(r)) => respond(
            StatusCode::BAD_REQUEST,
            Some("ProvisionedThroughputExceededException"),
            limits::throttle_body(&r).into_bytes(),
        ),
    })
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Answer> {
    serde_json::from_slice(body).map_err(bad_json)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TableReq {
    table_name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ScanReq {
    table_name: String,
    segment: Option<u64>,
    total_segments: Option<u64>,
    limit: Option<u64>,
    exclusive_start_key: Option<Item>,
    consistent_read: Option<bool>,
    return_consumed_capacity: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KeysAndAttributes {
    keys: Vec<Item>,
    consistent_read: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BatchGetReq {
    request_items: BTreeMap<String, KeysAndAttributes>,
    return_consumed_capacity: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetReq {
    table_name: String,
    key: Item,
    consistent_read: Option<bool>,
    return_consumed_capacity: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DescribeStreamReq {
    stream_arn: String,
    limit: Option<usize>,
    exclusive_start_shard_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ShardIteratorReq {
    stream_arn: String,
    shard_id: String,
    shard_iterator_type: String,
    sequence_number: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetRecordsReq {
    shard_iterator: String,
    limit: Option<u64>,
}

impl Shared {
    fn limiter(&self) -> Option<MutexGuard<'_, Limiter>> {
        self.limiter
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn stats_lock(&self) -> MutexGuard<'_, StandinStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, op: &str, t: &Tally) {
        let second = self.started.elapsed().as_secs();
        let mut s = self.stats_lock();
        *s.requests
            .entry(if op.is_empty() { "?" } else { op }.to_string())
            .or_default() += 1;
        s.scanned_items += t.scanned;
        s.target_scanned_items += t.target_scanned;
        s.got_items += t.got;
        s.stream_records += t.records;
        s.written_items += t.written;
        s.write_units += t.write_units;
        s.read_units += t.read_units;
        s.throttled_requests += u64::from(t.throttled_request);
        s.throttled_items += t.throttled_items;
        while s.windows.len() as u64 <= second {
            let n = s.windows.len() as u64;
            s.windows.push(Window {
                second: n,
                ..Window::default()
            });
        }
        let w = &mut s.windows[second as usize];
        w.written_items += t.written;
        w.write_units += t.write_units;
        w.throttled_requests += u64::from(t.throttled_request);
        w.throttled_items += t.throttled_items;
        w.served_items += t.scanned + t.target_scanned + t.got + t.records;
    }

    fn stats_now(&self) -> StandinStats {
        let mut s = self.stats_lock().clone();
        s.uptime_seconds = self.started.elapsed().as_secs_f64();
        let (user, system, rss) = rusage();
        s.cpu_user_seconds = user;
        s.cpu_system_seconds = system;
        s.max_rss_kb = rss;
        s
    }

    fn dispatch(&self, op: &str, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        match op {
            "DescribeTable" => self.describe_table(body),
            "ListTables" => {
                let mut names: Vec<&str> =
                    self.model.tables.iter().map(|t| t.name.as_str()).collect();
                names.sort_unstable();
                Ok(json!({ "TableNames": names }).to_string().into_bytes())
            }
            "Scan" => self.scan(body, t),
            "BatchGetItem" => self.batch_get(body, t),
            "GetItem" => self.get_item(body, t),
            "BatchWriteItem" => self.batch_write(body, t),
            "PutItem" => self.single_write(body, "Item", t),
            "DeleteItem" | "UpdateItem" => self.single_write(body, "Key", t),
            "DescribeStream" => self.describe_stream(body),
            "ListStreams" => Ok(json!({ "Streams": [{
                "StreamArn": self.model.stream_arn(),
                "StreamLabel": STREAM_LABEL,
                "TableName": self.model.source_table(),
            }]})
            .to_string()
            .into_bytes()),
            "GetShardIterator" => self.shard_iterator(body),
            "GetRecords" => self.get_records(body, t),
            _ => Err(error(
                StatusCode::BAD_REQUEST,
                "UnknownOperationException",
                "com.amazon.coral.service#UnknownOperationException",
                &format!("the stand-in does not serve `{op}`"),
            )),
        }
    }

    fn describe_table(&self, body: &[u8]) -> Result<Vec<u8>, Answer> {
        let req: TableReq = parse(body)?;
        let table = self.model.table(&req.table_name)?;
        let attrs: Vec<Json> = table
            .key
            .attrs()
            .map(|a| json!({ "AttributeName": a.name, "AttributeType": a.ty.name() }))
            .collect();
        let mut schema =
            vec![json!({ "AttributeName": table.key.partition_key.name, "KeyType": "HASH" })];
        if let Some(sk) = &table.key.sort_key {
            schema.push(json!({ "AttributeName": sk.name, "KeyType": "RANGE" }));
        }
        let items = self.model.items.items();
        let limits = self.limiter().map(|l| l.limits);
        let provisioned =
            |rate: Option<f64>| rate.filter(|r| r.is_finite()).map_or(0, |r| r as u64);
        let (rcu, wcu) = match limits {
            Some(l) => (provisioned(l.table_read), provisioned(l.table_write)),
            None => (0, 0),
        };
        let billing = if rcu > 0 || wcu > 0 {
            "PROVISIONED"
        } else {
            "PAY_PER_REQUEST"
        };
        let mut t = json!({
            "AttributeDefinitions": attrs,
            "BillingModeSummary": { "BillingMode": billing },
            "CreationDateTime": CREATED,
            "ItemCount": items,
            "KeySchema": schema,
            "ProvisionedThroughput": {
                "NumberOfDecreasesToday": 0,
                "ReadCapacityUnits": rcu,
                "WriteCapacityUnits": wcu,
            },
            "TableArn": limits::table_arn(&table.name),
            "TableId": format!("00000000-0000-0000-0000-00000000000{}", table.role as u8),
            "TableName": table.name,
            "TableSizeBytes": items * self.model.items.item_bytes() as u64,
            "TableStatus": "ACTIVE",
        });
        if table.role == Role::Source {
            t["StreamSpecification"] =
                json!({ "StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES" });
            t["LatestStreamArn"] = json!(self.model.stream_arn());
            t["LatestStreamLabel"] = json!(STREAM_LABEL);
        }
        Ok(json!({ "Table": t }).to_string().into_bytes())
    }

    fn scan(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: ScanReq = parse(body)?;
        let table = self.model.table(&req.table_name)?;
        if let Some(mut l) = self.limiter()
            && let Err(r) = l.scan_allowed(&table.name)
        {
            t.throttled_request = true;
            return Err(Answer::Throttle(r));
        }
        let total = req.total_segments.unwrap_or(1);
        let segment = req.segment.unwrap_or(0);
        if total == 0 || total > 1_000_000 || segment >= total {
            return Err(validation("Segment must be less than TotalSegments"));
        }
        let n = u128::from(self.model.items.items());
        let lo = (n * u128::from(segment) / u128::from(total)) as u64;
        let hi = (n * u128::from(segment + 1) / u128::from(total)) as u64;
        let start = match &req.exclusive_start_key {
            Some(k) => Generator::index_of_key(k)
                .ok_or_else(|| validation("ExclusiveStartKey names no item of this table"))?
                .saturating_add(1)
                .max(lo),
            None => lo,
        };
        let limit = req.limit.unwrap_or(u64::MAX).max(1);
        let consistent = req.consistent_read == Some(true);
        let item_bytes = self.model.items.item_bytes();
        let expected = (hi.saturating_sub(start))
            .min(limit)
            .min((MAX_PAGE_BYTES / item_bytes.max(1) + 1) as u64) as usize;
        // Item JSON is its DynamoDB size plus ~100 bytes of tags and quotes.
        let mut out = Vec::with_capacity(expected * (item_bytes + 160) + 512);
        out.extend_from_slice(br#"{"Items":["#);
        let (mut i, mut count, mut scanned, mut bytes) = (start, 0u64, 0u64, 0usize);
        let mut last: Option<u64> = None;
        let mut last_target_key: Option<Item> = None;
        while i < hi && count < limit {
            let mark = out.len();
            if count > 0 {
                out.push(b',');
            }
            let size = match table.role {
                Role::Source => {
                    let o = self.model.items.order(i);
                    let size = o.size();
                    if count > 0 && bytes + size > MAX_PAGE_BYTES {
                        out.truncate(mark);
                        break;
                    }
                    o.write_json(&mut out);
                    size
                }
                Role::Target => {
                    scanned += 1;
                    let Some(item) = self.model.target_item(i) else {
                        out.truncate(mark);
                        i += 1;
                        continue; // not in the target
                    };
                    let size = value::item_size(&item);
                    if count > 0 && bytes + size > MAX_PAGE_BYTES {
                        out.truncate(mark);
                        scanned -= 1;
                        break;
                    }
                    wire::push_item(&mut out, &item);
                    let names = table.key.names();
                    last_target_key = Some(
                        item.into_iter()
                            .filter(|(k, _)| names.contains(&k.as_str()))
                            .collect(),
                    );
                    size
                }
            };
            bytes += size;
            count += 1;
            last = Some(i);
            i += 1;
        }
        if table.role == Role::Source {
            scanned = count;
            t.scanned = count;
        } else {
            t.target_scanned = count;
        }
        out.extend_from_slice(br#"],"Count":"#);
        wire::push_u64(&mut out, count);
        out.extend_from_slice(br#","ScannedCount":"#);
        wire::push_u64(&mut out, scanned);
        if i < hi
            && let Some(last) = last
        {
            out.extend_from_slice(br#","LastEvaluatedKey":"#);
            match table.role {
                Role::Source => self.model.items.order(last).write_key(&mut out),
                Role::Target => {
                    let _ = serde_json::to_writer(&mut out, &last_target_key.unwrap_or_default());
                }
            }
        }
        let units = wire::read_units(bytes, consistent);
        t.read_units = units;
        if let Some(mut l) = self.limiter() {
            l.charge_scan(&table.name, units);
        }
        let cap = Capacity::from_name(req.return_consumed_capacity.as_deref());
        if cap != Capacity::None {
            out.extend_from_slice(br#","ConsumedCapacity":"#);
            wire::push_capacity(&mut out, &table.name, units, cap);
        }
        out.push(b'}');
        Ok(out)
    }

    fn batch_get(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: BatchGetReq = parse(body)?;
        let cap = Capacity::from_name(req.return_consumed_capacity.as_deref());
        let mut tables = Vec::new();
        for (name, ka) in &req.request_items {
            tables.push((self.model.table(name)?, ka));
        }
        // Which keys are admitted, per table (all of them without limits).
        let mut admitted: Vec<Vec<bool>> = tables
            .iter()
            .map(|(_, ka)| vec![true; ka.keys.len()])
            .collect();
        if let Some(mut l) = self.limiter() {
            let mut first = None;
            for ((table, ka), ok) in tables.iter().zip(admitted.iter_mut()) {
                let hash = table.key.partition_key.name.as_str();
                let charges = ka.keys.iter().map(|k| {
                    Some(Charge {
                        table: table.name.clone(),
                        key: value::encode_key(k, &[hash]),
                        units: 1.0,
                    })
                });
                let (flags, refusal) = l.admit_each(Kind::Read, charges);
                *ok = flags;
                if let Some(r) = refusal {
                    first.get_or_insert(r);
                }
            }
            if let Some(r) = first {
                t.throttled_request = true;
                t.throttled_items = admitted.iter().flatten().filter(|a| !**a).count() as u64;
                if !admitted.iter().flatten().any(|a| *a) {
                    return Err(Answer::Throttle(r));
                }
            }
        }
        let keys: usize = tables.iter().map(|(_, ka)| ka.keys.len()).sum();
        let mut out = Vec::with_capacity(keys * (self.model.items.item_bytes() + 200) + 512);
        let mut capacity = Vec::new();
        out.extend_from_slice(br#"{"Responses":{"#);
        for (n, ((table, ka), ok)) in tables.iter().zip(&admitted).enumerate() {
            if n > 0 {
                out.push(b',');
            }
            wire::push_str(&mut out, &table.name);
            out.extend_from_slice(b":[");
            let consistent = ka.consistent_read == Some(true);
            let mut units = 0.0;
            let mut found = 0;
            for (key, _) in ka.keys.iter().zip(ok).filter(|(_, ok)| **ok) {
                let mark = out.len();
                if found > 0 {
                    out.push(b',');
                }
                match self.model.lookup(table, key, &mut out) {
                    Some(size) => {
                        found += 1;
                        units += wire::read_units(size, consistent);
                    }
                    None => out.truncate(mark),
                }
            }
            out.push(b']');
            t.got += found;
            t.read_units += units;
            if ok.iter().any(|a| *a) {
                capacity.push((table.name.as_str(), units));
            }
        }
        out.extend_from_slice(br#"},"UnprocessedKeys":{"#);
        let mut first = true;
        for ((table, ka), ok) in tables.iter().zip(&admitted) {
            let rest: Vec<&Item> = ka
                .keys
                .iter()
                .zip(ok)
                .filter(|(_, ok)| !**ok)
                .map(|(k, _)| k)
                .collect();
            if rest.is_empty() {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            wire::push_str(&mut out, &table.name);
            out.extend_from_slice(br#":{"Keys":"#);
            let _ = serde_json::to_writer(&mut out, &rest);
            if let Some(c) = ka.consistent_read {
                out.extend_from_slice(if c {
                    br#","ConsistentRead":true"#
                } else {
                    br#","ConsistentRead":false"#
                });
            }
            out.push(b'}');
        }
        out.push(b'}');
        push_capacities(&mut out, &capacity, cap);
        out.push(b'}');
        Ok(out)
    }

    fn get_item(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: GetReq = parse(body)?;
        let table = self.model.table(&req.table_name)?;
        if let Some(mut l) = self.limiter() {
            let hash = table.key.partition_key.name.as_str();
            let charge = Charge {
                table: table.name.clone(),
                key: value::encode_key(&req.key, &[hash]),
                units: 1.0,
            };
            if let Err(r) = l.admit(Kind::Read, &[charge]) {
                t.throttled_request = true;
                t.throttled_items = 1;
                return Err(Answer::Throttle(r));
            }
        }
        let mut out = Vec::with_capacity(self.model.items.item_bytes() + 300);
        out.push(b'{');
        let mut item = Vec::new();
        let size = self.model.lookup(table, &req.key, &mut item);
        if size.is_some() {
            out.extend_from_slice(br#""Item":"#);
            out.extend_from_slice(&item);
            t.got = 1;
        }
        let units = wire::read_units(size.unwrap_or(0), req.consistent_read == Some(true));
        t.read_units = units;
        let cap = Capacity::from_name(req.return_consumed_capacity.as_deref());
        if cap != Capacity::None {
            if size.is_some() {
                out.push(b',');
            }
            out.extend_from_slice(br#""ConsumedCapacity":"#);
            wire::push_capacity(&mut out, &table.name, units, cap);
        }
        out.push(b'}');
        Ok(out)
    }

    /// The HASH key names write requests capture: only when limits need them.
    fn capture(&self) -> Vec<&str> {
        match self.limiter {
            Some(_) => self.model.hash_names.iter().map(String::as_str).collect(),
            None => Vec::new(),
        }
    }

    fn batch_write(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let capture = self.capture();
        let req = wire::parse_batch_write(body, &capture).map_err(bad_json)?;
        let mut tables = Vec::with_capacity(req.tables.len());
        for (name, entries) in &req.tables {
            tables.push((self.model.table(name)?, entries));
        }
        let units_of = |e: &wire::WriteEntry| match e.put {
            true => value::write_units(e.info.size) as f64,
            false => 1.0,
        };
        let mut admitted: Vec<Vec<bool>> =
            tables.iter().map(|(_, e)| vec![true; e.len()]).collect();
        if let Some(mut l) = self.limiter() {
            let mut first = None;
            for ((table, entries), ok) in tables.iter().zip(admitted.iter_mut()) {
                let h = self.model.hash_index(table);
                let charges = entries.iter().map(|e| {
                    Some(Charge {
                        table: table.name.clone(),
                        key: e.info.key(h).map(<[u8]>::to_vec),
                        units: units_of(e),
                    })
                });
                let (flags, refusal) = l.admit_each(Kind::Write, charges);
                *ok = flags;
                if let Some(r) = refusal {
                    first.get_or_insert(r);
                }
            }
            if let Some(r) = first {
                t.throttled_request = true;
                t.throttled_items = admitted.iter().flatten().filter(|a| !**a).count() as u64;
                if !admitted.iter().flatten().any(|a| *a) {
                    return Err(Answer::Throttle(r));
                }
            }
        }
        let mut capacity = Vec::new();
        for ((table, entries), ok) in tables.iter().zip(&admitted) {
            let (mut units, mut n) = (0.0, 0);
            for (e, _) in entries.iter().zip(ok).filter(|(_, ok)| **ok) {
                units += units_of(e);
                n += 1;
            }
            t.written += n;
            t.write_units += units;
            if n > 0 {
                capacity.push((table.name.as_str(), units));
            }
        }
        let mut out = Vec::with_capacity(256);
        out.push(b'{');
        let cap = req.capacity;
        if cap != Capacity::None {
            push_capacities(&mut out, &capacity, cap);
            out.push(b',');
        }
        out.extend_from_slice(br#""UnprocessedItems":"#);
        if t.throttled_items == 0 {
            out.extend_from_slice(b"{}");
        } else {
            // The refused entries, as they were sent (read again: rare).
            let sent: Json = serde_json::from_slice(body).map_err(bad_json)?;
            let mut rest = serde_json::Map::new();
            for ((table, _), ok) in tables.iter().zip(&admitted) {
                let list = sent["RequestItems"][&table.name]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let refused: Vec<Json> = list
                    .into_iter()
                    .zip(ok)
                    .filter(|(_, ok)| !**ok)
                    .map(|(e, _)| e)
                    .collect();
                if !refused.is_empty() {
                    rest.insert(table.name.clone(), Json::Array(refused));
                }
            }
            let _ = serde_json::to_writer(&mut out, &rest);
        }
        out.push(b'}');
        Ok(out)
    }

    fn single_write(
        &self,
        body: &[u8],
        field: &'static str,
        t: &mut Tally,
    ) -> Result<Vec<u8>, Answer> {
        let capture = self.capture();
        let req = wire::parse_single(body, field, &capture).map_err(bad_json)?;
        let table = self.model.table(&req.table)?;
        let info = req
            .item
            .ok_or_else(|| validation(&format!("the request has no `{field}`")))?;
        let units = match field {
            "Item" => value::write_units(info.size) as f64,
            _ => 1.0,
        };
        if let Some(mut l) = self.limiter() {
            let charge = Charge {
                table: table.name.clone(),
                key: info.key(self.model.hash_index(table)).map(<[u8]>::to_vec),
                units,
            };
            if let Err(r) = l.admit(Kind::Write, &[charge]) {
                t.throttled_request = true;
                t.throttled_items = 1;
                return Err(Answer::Throttle(r));
            }
        }
        t.written = 1;
        t.write_units = units;
        let mut out = Vec::with_capacity(128);
        out.push(b'{');
        if req.capacity != Capacity::None {
            out.extend_from_slice(br#""ConsumedCapacity":"#);
            wire::push_capacity(&mut out, &table.name, units, req.capacity);
        }
        out.push(b'}');
        Ok(out)
    }

    fn check_stream(&self, arn: &str) -> Result<(), Answer> {
        match arn == self.model.stream_arn() {
            true => Ok(()),
            false => Err(not_found(&format!("Stream: {arn} not found"))),
        }
    }

    fn describe_stream(&self, body: &[u8]) -> Result<Vec<u8>, Answer> {
        let req: DescribeStreamReq = parse(body)?;
        self.check_stream(&req.stream_arn)?;
        let s = &self.model.stream;
        let first = match &req.exclusive_start_shard_id {
            Some(id) => s.shard_of(id).map_or(s.shards, |i| i + 1),
            None => 0,
        };
        let limit = req.limit.unwrap_or(100).clamp(1, 100) as u32;
        let end = s.shards.min(first.saturating_add(limit));
        let shards: Vec<Json> = (first..end)
            .map(|i| {
                json!({
                    "SequenceNumberRange": { "StartingSequenceNumber": s.first_sequence(i) },
                    "ShardId": StreamGen::shard_id(i),
                })
            })
            .collect();
        let key = &self.model.tables[0].key;
        let mut schema =
            vec![json!({ "AttributeName": key.partition_key.name, "KeyType": "HASH" })];
        if let Some(sk) = &key.sort_key {
            schema.push(json!({ "AttributeName": sk.name, "KeyType": "RANGE" }));
        }
        let mut d = json!({
            "CreationRequestDateTime": CREATED,
            "KeySchema": schema,
            "Shards": shards,
            "StreamArn": self.model.stream_arn(),
            "StreamLabel": STREAM_LABEL,
            "StreamStatus": "ENABLED",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
            "TableName": self.model.source_table(),
        });
        if end < s.shards {
            d["LastEvaluatedShardId"] = json!(StreamGen::shard_id(end - 1));
        }
        Ok(json!({ "StreamDescription": d }).to_string().into_bytes())
    }

    fn shard_iterator(&self, body: &[u8]) -> Result<Vec<u8>, Answer> {
        let req: ShardIteratorReq = parse(body)?;
        self.check_stream(&req.stream_arn)?;
        let s = &self.model.stream;
        let shard = s
            .shard_of(&req.shard_id)
            .ok_or_else(|| not_found(&format!("Shard: {} not found", req.shard_id)))?;
        let at_seq = |after: bool| -> Result<u64, Answer> {
            let seq = req
                .sequence_number
                .as_deref()
                .ok_or_else(|| validation("SequenceNumber is required for this iterator type"))?;
            match s.place_of(seq) {
                Some((sh, k)) if sh == shard => Ok(k + u64::from(after)),
                _ => Err(validation(&format!(
                    "Invalid SequenceNumber {seq} for shard {}",
                    req.shard_id
                ))),
            }
        };
        let k = match req.shard_iterator_type.as_str() {
            "TRIM_HORIZON" => 0,
            "LATEST" => s.shard_len(shard),
            "AT_SEQUENCE_NUMBER" => at_seq(false)?,
            "AFTER_SEQUENCE_NUMBER" => at_seq(true)?,
            other => return Err(validation(&format!("unknown ShardIteratorType {other}"))),
        };
        let k = k.min(s.shard_len(shard));
        Ok(json!({ "ShardIterator": iterator(shard, k) })
            .to_string()
            .into_bytes())
    }

    fn get_records(&self, body: &[u8], t: &mut Tally) -> Result<Vec<u8>, Answer> {
        let req: GetRecordsReq = parse(body)?;
        let s = &self.model.stream;
        let (shard, start) = parse_iterator(&req.shard_iterator)
            .filter(|(shard, _)| *shard < s.shards)
            .ok_or_else(|| validation("Invalid ShardIterator"))?;
        let limit = req
            .limit
            .unwrap_or(stream::MAX_RECORDS)
            .clamp(1, stream::MAX_RECORDS);
        let end = s.shard_len(shard);
        let expected = end.saturating_sub(start).min(limit) as usize;
        let mut out =
            Vec::with_capacity(expected * (2 * self.model.items.item_bytes() + 600) + 256);
        out.extend_from_slice(br#"{"Records":["#);
        let (mut k, mut bytes) = (start, 0usize);
        while k < end && k - start < limit {
            let r = s.record(shard, k);
            let before = out.len();
            if k > start {
                out.push(b',');
            }
            let size = s.write_record(&self.model.items, &r, &mut out);
            if k > start && bytes + size > stream::MAX_BYTES {
                out.truncate(before);
                break;
            }
            bytes += size;
            k += 1;
        }
        t.records = k - start;
        // Open shards always have a next iterator; past the end it reads nothing.
        out.extend_from_slice(br#"],"NextShardIterator":"#);
        wire::push_str(&mut out, &iterator(shard, k));
        out.push(b'}');
        Ok(out)
    }
}

fn push_capacities(out: &mut Vec<u8>, per_table: &[(&str, f64)], cap: Capacity) {
    if cap == Capacity::None {
        return;
    }
    if out.last() != Some(&b'{') && out.last() != Some(&b',') {
        out.push(b',');
    }
    out.extend_from_slice(br#""ConsumedCapacity":["#);
    for (i, (table, units)) in per_table.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        wire::push_capacity(out, table, *units, cap);
    }
    out.push(b']');
}

fn iterator(shard: u32, k: u64) -> String {
    format!("rekey-standin|{shard}|{k}")
}

fn parse_iterator(it: &str) -> Option<(u32, u64)> {
    let mut parts = it.strip_prefix("rekey-standin|")?.split('|');
    let shard = parts.next()?.parse().ok()?;
    let k = parts.next()?.parse().ok()?;
    Some((shard, k))
}

fn now_secs() -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    (now.map_or(0, |d| d.as_millis()) as f64) / 1000.0
}

/// This process's user and system CPU seconds and peak RSS (KB).
fn rusage() -> (f64, f64, u64) {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return (0.0, 0.0, 0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        secs(u.ru_utime),
        secs(u.ru_stime),
        u.ru_maxrss.max(0) as u64,
    )
}
