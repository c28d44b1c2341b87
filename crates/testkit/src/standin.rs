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
//! * `error_500_ratio`: that share of DynamoDB requests is answered HTTP 500
//!   `InternalServerError` without being looked at (drawn from a SplitMix64
//!   stream seeded by `seed`), as the proxy's faults do.
//!
//! Pages and records are written straight into pre-sized buffers; write
//! requests are read with visitors that only add up sizes ([`wire`]). Target
//! reads run rekey's transform per item, as they must.
//!
//! Not modelled: writes do not change what is read, Query, conditions,
//! projections and filters (ignored), tables other than the plan's two.

mod answer;
pub mod items;
pub mod stream;
pub mod wire;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

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
    /// Share of DynamoDB requests answered HTTP 500 without being looked at.
    pub error_500_ratio: f64,
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
            error_500_ratio: 0.0,
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
    /// Requests answered HTTP 500 (`error_500_ratio`).
    pub errors_500: u64,
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
    error_500: bool,
}

struct Shared {
    model: Model,
    limiter: Option<Mutex<Limiter>>,
    started: Instant,
    stats: Mutex<StandinStats>,
    error_500_ratio: f64,
    /// The fault draws' SplitMix64 state.
    rng: AtomicU64,
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
            error_500_ratio: opts.error_500_ratio,
            rng: AtomicU64::new(opts.seed),
        });
        let service = {
            let shared = Arc::clone(&shared);
            hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req))
        };
        let task = tokio::spawn(crate::http::serve(listener, service));
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
    if shared.error_500_ratio > 0.0 && splitmix(&shared.rng) < shared.error_500_ratio {
        tally.error_500 = true;
        shared.count(op, &tally);
        return Ok(internal_error());
    }
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

fn internal_error() -> Response<Full<Bytes>> {
    let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}"#;
    respond(
        StatusCode::INTERNAL_SERVER_ERROR,
        Some("InternalServerError"),
        body.as_bytes().to_vec(),
    )
}

/// The next uniform draw in [0, 1) of a SplitMix64 stream.
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

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Answer> {
    serde_json::from_slice(body).map_err(bad_json)
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
