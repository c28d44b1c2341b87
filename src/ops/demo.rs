//! `rekey demo`: the job rekey exists for, start to finish, in one command on
//! a fresh machine.
//!
//! On the local server (or `--endpoint-url`), [`Demo::prepare`] loads an
//! orders table with the tenant skew the load testing advice calls for — 70 %
//! normal tenants, 20 % large, 9 % enterprise, 1 % pathological — keyed
//! `TENANT#t#DAY#d`, enables its NEW_AND_OLD_IMAGES stream, creates the target
//! with `plans/tenant-day-shard.toml`'s key, and analyzes the source: the hot
//! tenant-day key before, the spread after. [`Demo::migrate`] then re-keys it
//! while a built-in application ([`Writer`]) keeps writing new orders, status
//! changes and deletes to the source: the lifecycle of `rekey run` (tail,
//! backfill, catch-up, verify, ready for cutover) with its progress display,
//! then `rekey cutover` (the application moves to the new table: it stops
//! writing to the old one once the cutover is recorded) and `rekey finish`
//! (which drains the writes made until then). A last, independent check scans
//! both tables and compares the target with the plan applied to the source.
//! [`Summary`] is the before/after: the hottest key's share and predicted load
//! in each design, what the backfill copied and the tail carried, verify, and
//! the time of each phase.
//!
//! The table is generated from a fixed seed, so every run starts from the same
//! data and analyze shows the same numbers; the application's writes race the
//! migration, so their counts vary a little between runs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use crate::aws::item::{self, Expressions};
use crate::aws::rate::{Control, Rate};
use crate::aws::scan::{self, ScanOptions};
use crate::aws::{AwsOptions, Clients};
use crate::core::plan::Plan;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, Value, encode_key};
use crate::local::{LocalOptions, LocalServer};
use crate::phase::analyze::{self, AnalyzeOptions, Distribution, Report, ScanSettings};
use crate::phase::backfill::{BackfillOptions, Counters};
use crate::phase::cutover::{self, CutoverOptions};
use crate::phase::error::GateNotMet;
use crate::phase::lifecycle::{self, AnalyzeVerdict, PhaseTime, RunOptions};
use crate::phase::progress::Progress;
use crate::phase::tail::{TailOptions, TailReport};
use crate::phase::verify::VerifyOptions;
use crate::state::StateDir;
use crate::state::snapshot::{VerifyResult, show_time};

pub const DEMO_PLAN: &str = include_str!("../../plans/tenant-day-shard.toml");
/// Items/s of application writes for analyze's load estimate: a production
/// rate, at which the hot tenant-day key crosses 1,000 WCU/s in the old
/// design. (The demo's own writer runs far slower: the local server is the
/// bottleneck, and the estimate is per rate anyway.)
pub const DEMO_APP_WRITE_RATE: f64 = 3000.0;
/// Writes/s of the demo's application while the migration runs: steady live
/// traffic for the tail to carry and verify to re-check. Each write costs the
/// local server (moto: one request at a time) about as much as ~3 items of a
/// batch, twice over (the source, then the tail's write to the target), so a
/// higher rate would slow the migration it shows.
pub const DEMO_WRITER_RATE: f64 = 50.0;

/// How long the demo waits for a drain barrier, or for cutover's gates.
const WAIT: Duration = Duration::from_secs(120);
/// Scan segments and writes in flight: the local server serves one request
/// at a time, so more only queue.
const SEGMENTS: u32 = 4;

#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Orders in the demo table (plus one profile per tenant).
    pub items: u64,
    pub moto_server: Option<PathBuf>,
    /// Use this DynamoDB instead of starting the local server.
    pub endpoint_url: Option<String>,
    pub analyze: AnalyzeOptions,
    /// Writes per second of the demo's application during the migration.
    pub writer_rate: f64,
    /// Real keys in verify's mismatch examples.
    pub show_keys: bool,
}

/// The DynamoDB endpoint the environment names (AWS_ENDPOINT_URL_DYNAMODB,
/// then AWS_ENDPOINT_URL), as for the other commands: the demo runs there
/// instead of starting its own server.
pub fn endpoint_from_env() -> Option<String> {
    ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
}

/// A tenant class of the skewed workload: how many tenants, and how heavily
/// each writes relative to a normal tenant.
struct Class {
    name: &'static str,
    tenants: u32,
    weight: u32,
}

/// 100 tenants: 70 / 20 / 9 / 1, each class writing far more per tenant.
const CLASSES: [Class; 4] = [
    Class {
        name: "normal",
        tenants: 70,
        weight: 1,
    },
    Class {
        name: "large",
        tenants: 20,
        weight: 5,
    },
    Class {
        name: "enterprise",
        tenants: 9,
        weight: 25,
    },
    Class {
        name: "pathological",
        tenants: 1,
        weight: 400,
    },
];

/// Three days; most orders are today's, as in any live system.
const DAYS: [(&str, u32); 3] = [("2026-07-05", 1), ("2026-07-06", 2), ("2026-07-07", 7)];

const TABLE_SEED: u64 = 0x5EED;
const WRITER_SEED: u64 = 0xA99;

/// SplitMix64: a fixed, dependency-free sequence so the demo is reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut r = self.next() % total;
        for (i, &w) in weights.iter().enumerate() {
            if r < u64::from(w) {
                return i;
            }
            r -= u64::from(w);
        }
        weights.len() - 1
    }
}

/// The skewed tenants and days, and a random sequence to draw orders from.
struct Workload {
    /// (name, class)
    tenants: Vec<(String, &'static str)>,
    weights: Vec<u32>,
    day_weights: Vec<u32>,
    rng: Rng,
}

impl Workload {
    fn new(seed: u64) -> Workload {
        let mut tenants = Vec::new();
        let mut weights = Vec::new();
        for c in &CLASSES {
            for i in 0..c.tenants {
                tenants.push((format!("{}-{:02}", c.name, i), c.name));
                weights.push(c.weight);
            }
        }
        Workload {
            tenants,
            weights,
            day_weights: DAYS.iter().map(|d| d.1).collect(),
            rng: Rng(seed),
        }
    }

    /// One profile item per tenant.
    fn profiles(&self) -> Vec<Item> {
        self.tenants
            .iter()
            .map(|(name, class)| {
                let mut it = Item::new();
                it.insert("PK".into(), Value::S(format!("TENANT#{name}")));
                it.insert("SK".into(), Value::S("PROFILE".into()));
                it.insert("class".into(), Value::S((*class).into()));
                it
            })
            .collect()
    }

    /// Order number `n`: a distinct order id for every `n` below 2^32, its
    /// tenant and day drawn by weight.
    fn order(&mut self, n: u64) -> Item {
        let rng = &mut self.rng;
        let t = &self.tenants[rng.pick(&self.weights)].0;
        let day = DAYS[rng.pick(&self.day_weights)].0;
        let mut it = Item::new();
        it.insert("PK".into(), Value::S(format!("TENANT#{t}#DAY#{day}")));
        it.insert(
            "SK".into(),
            // Multiplying by an odd number is a bijection mod 2^32.
            Value::S(format!(
                "ORDER#{:08x}",
                n.wrapping_mul(2_654_435_761) % (1 << 32)
            )),
        );
        let status = if rng.next().is_multiple_of(5) {
            "OPEN"
        } else {
            "SHIPPED"
        };
        it.insert("status".into(), Value::S(status.into()));
        let (units, cents) = (rng.next() % 500, rng.next() % 100);
        it.insert("total".into(), Value::N(format!("{units}.{cents:02}")));
        it.insert("lines".into(), Value::N((1 + rng.next() % 9).to_string()));
        it
    }
}

/// The demo's items: one profile per tenant, then `orders` orders.
pub fn generate(orders: u64) -> Vec<Item> {
    let mut w = Workload::new(TABLE_SEED);
    let mut items = w.profiles();
    items.reserve(orders as usize);
    for n in 0..orders {
        items.push(w.order(n));
    }
    items
}

/// An order's key: (PK, SK).
type OrderKey = (String, String);

fn order_key(item: &Item) -> Option<OrderKey> {
    match (item.get("PK"), item.get("SK")) {
        (Some(Value::S(pk)), Some(Value::S(sk))) if sk.starts_with("ORDER#") => {
            Some((pk.clone(), sk.clone()))
        }
        _ => None,
    }
}

/// What the demo's application wrote to the source during the migration.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WriterReport {
    /// The rate it was asked for, writes/s.
    pub rate: f64,
    pub inserts: u64,
    pub updates: u64,
    pub deletes: u64,
    pub seconds: f64,
    pub writes_per_second: f64,
}

struct WriterOptions {
    clients: Clients,
    table: String,
    /// The orders in the table: the ones to change and delete.
    keys: Vec<OrderKey>,
    /// The number of the first new order.
    first_order: u64,
    rate: f64,
}

/// The demo's application: writes to the source at a steady rate until
/// stopped — half new orders, a third status changes, the rest deletes.
struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<WriterReport>>,
}

impl Writer {
    fn start(opts: WriterOptions) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(write_loop(opts, stop.clone()));
        Writer { stop, task }
    }

    /// Stop after the write in flight; what it wrote.
    async fn stop(mut self) -> anyhow::Result<WriterReport> {
        self.stop.store(true, Ordering::Relaxed);
        (&mut self.task)
            .await
            .context("the demo's application failed")?
    }
}

impl Drop for Writer {
    /// A demo that fails stops its application too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

enum Write {
    Insert(Item),
    Status(OrderKey, &'static str),
    Delete(OrderKey),
}

/// Writes the application has in flight at most: enough to keep its rate
/// while the local server, which serves one request at a time, also serves
/// the backfill's and verify's.
const WRITES_IN_FLIGHT: usize = 16;

async fn write_loop(opts: WriterOptions, stop: Arc<AtomicBool>) -> anyhow::Result<WriterReport> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let WriterOptions {
        clients,
        table,
        mut keys,
        first_order,
        rate,
    } = opts;
    let mut workload = Workload::new(WRITER_SEED);
    let mut next = first_order;
    let mut report = WriterReport {
        rate,
        ..WriterReport::default()
    };
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
    // Behind (slow responses): carry on at the rate, no burst to catch up.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            Some(w) = in_flight.next() => record(w?, &mut report, &mut keys),
            _ = tick.tick(), if in_flight.len() < WRITES_IN_FLIGHT => {
                let write = next_write(&mut workload, &mut keys, &mut next);
                in_flight.push(apply(&clients, &table, write));
            }
        }
    }
    while let Some(w) = in_flight.next().await {
        record(w?, &mut report, &mut keys);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.writes_per_second =
        (report.inserts + report.updates + report.deletes) as f64 / report.seconds.max(0.001);
    Ok(report)
}

fn record(write: Write, report: &mut WriterReport, keys: &mut Vec<OrderKey>) {
    match write {
        Write::Insert(item) => {
            report.inserts += 1;
            // Changed or deleted only once it exists.
            keys.extend(order_key(&item));
        }
        Write::Status(..) => report.updates += 1,
        Write::Delete(_) => report.deletes += 1,
    }
}

/// Half new orders, a third status changes, the rest deletes. A deleted
/// order leaves `keys` at once, so no later write picks it.
fn next_write(workload: &mut Workload, keys: &mut Vec<OrderKey>, next: &mut u64) -> Write {
    const STATUSES: [&str; 4] = ["OPEN", "PAID", "SHIPPED", "DELIVERED"];
    let roll = workload.rng.next() % 20;
    let at = (workload.rng.next() % keys.len().max(1) as u64) as usize;
    match roll {
        _ if keys.is_empty() || roll < 10 => {
            *next += 1;
            Write::Insert(workload.order(*next - 1))
        }
        10..17 => {
            let status = STATUSES[(workload.rng.next() % 4) as usize];
            Write::Status(keys[at].clone(), status)
        }
        _ => Write::Delete(keys.swap_remove(at)),
    }
}

/// One write; a status change of an order deleted meanwhile (by a delete
/// still in flight) is dropped rather than recreating part of it.
async fn apply(clients: &Clients, table: &str, write: Write) -> anyhow::Result<Write> {
    let key = |(pk, sk): &OrderKey| -> Item {
        [
            ("PK".to_string(), Value::S(pk.clone())),
            ("SK".to_string(), Value::S(sk.clone())),
        ]
        .into()
    };
    let context = "the demo's application writing to the source";
    match &write {
        Write::Insert(item) => item::put_item(clients, table, item)
            .await
            .context(context)?,
        Write::Status(k, status) => {
            let set_status = Expressions {
                update: "SET #s = :s".into(),
                condition: "attribute_exists(PK)".into(),
                names: [("#s".to_string(), "status".to_string())].into(),
                values: [(":s".to_string(), Value::S((*status).into()))].into(),
            };
            // None: the order was deleted meanwhile; nothing to do.
            item::update_item_if(clients, table, &key(k), &set_status)
                .await
                .context(context)?;
        }
        Write::Delete(k) => item::delete_item(clients, table, &key(k))
            .await
            .context(context)?,
    }
    Ok(write)
}

/// A demo with its tables loaded and analyzed, ready to migrate.
pub struct Demo {
    pub plan: Plan,
    /// Analyze on the loaded source, before the migration (the command
    /// layer redacts it before showing it; the summary reuses it).
    pub report: Report,
    pub items_loaded: u64,
    opts: DemoOptions,
    clients: Clients,
    keys: Vec<OrderKey>,
    state: tempfile::TempDir,
    timings: Vec<PhaseTime>,
    started: Instant,
    /// Keeps the local server alive until the demo is done.
    _local: Option<LocalServer>,
}

impl Demo {
    /// Start the server, create and load the tables, analyze the source.
    pub async fn prepare(opts: &DemoOptions, progress: &Progress) -> anyhow::Result<Demo> {
        let started = Instant::now();
        let mut timings = Vec::new();
        let (local, endpoint) = match &opts.endpoint_url {
            Some(url) => (None, url.clone()),
            None => {
                let l = LocalServer::start(&LocalOptions {
                    server: opts.moto_server.clone(),
                    port: None,
                })
                .await?;
                let e = l.endpoint().to_string();
                timings.push(PhaseTime::since("start the local server", started));
                (Some(l), e)
            }
        };
        let clients = Clients::connect(&AwsOptions {
            endpoint_url: Some(endpoint),
            region: Some("us-east-1".into()),
            static_credentials: Some(("demo".into(), "demo".into())),
            ..Default::default()
        })
        .await?;
        let mut plan = Plan::parse(DEMO_PLAN, Path::new("plans/tenant-day-shard.toml"))?;
        // Fresh names, so the demo also runs against a DynamoDB that has tables.
        plan.source_table = format!("rekey-demo-orders-{}", std::process::id());
        plan.target_table = format!("rekey-demo-orders-by-shard-{}", std::process::id());

        let t = Instant::now();
        let items = load(&clients, &plan, opts.items, progress).await?;
        timings.push(PhaseTime::since("load", t));

        let t = Instant::now();
        let report = analyze::run(
            &clients,
            &plan,
            &scan_settings(),
            opts.analyze.clone(),
            None,
            progress,
        )
        .await?;
        timings.push(PhaseTime::since("analyze", t));
        let state = tempfile::Builder::new()
            .prefix("rekey-demo-")
            .tempdir()
            .context("cannot create the demo's state directory")?;
        // `run`'s analyze gate takes this verdict instead of scanning again.
        crate::state::snapshot::publish(
            &StateDir::new(state.path()).analyze_verdict(),
            &AnalyzeVerdict::of(&report),
        )?;
        Ok(Demo {
            plan,
            report,
            items_loaded: items.len() as u64,
            opts: opts.clone(),
            clients,
            keys: items.iter().filter_map(order_key).collect(),
            state,
            timings,
            started,
            _local: local,
        })
    }
}

fn scan_settings() -> ScanSettings {
    ScanSettings {
        segments: Some(SEGMENTS),
        read_rate: None,
        page_limit: None,
    }
}

/// Create both tables and load the source; its stream is enabled after the
/// load, as on a production table whose months of items are older than its
/// stream's 24 hours: the tail then carries the application's writes only.
async fn load(
    clients: &Clients,
    plan: &Plan,
    orders: u64,
    progress: &Progress,
) -> anyhow::Result<Vec<Item>> {
    clients
        .create_table(&plan.source_table, &plan.source_key, false)
        .await?;
    clients
        .create_table(&plan.target_table, &plan.target_key, false)
        .await?;
    let items = generate(orders);
    progress.start("loading", Some(items.len() as u64));
    let mut loaded = 0;
    for chunk in items.chunks(2_000) {
        let wcu = crate::aws::write::put_all(clients, &plan.source_table, chunk, SEGMENTS as usize)
            .await?;
        loaded += chunk.len() as u64;
        progress.update(loaded, wcu);
    }
    progress.finish();
    clients.enable_stream(&plan.source_table).await?;
    Ok(items)
}

/// The demo's `rekey run`: the recorded analyze verdict, then tail, backfill,
/// catch-up and verify; it tells `ready` when ready for cutover and goes on
/// tailing until `finish`.
fn run_options(state_dir: &StateDir, ready: Arc<tokio::sync::Notify>) -> RunOptions {
    let state_dir = state_dir.clone();
    // The demo's state is a temporary directory: Ctrl-C ends it outright.
    let stop = tokio_util::sync::CancellationToken::new();
    RunOptions {
        analyze: Some((scan_settings(), AnalyzeOptions::default())),
        allow_hot_keys: false,
        backfill: BackfillOptions {
            rejects: state_dir.rejects(),
            state_dir: state_dir.clone(),
            segments: Some(SEGMENTS),
            page_limit: None,
            read_rate: None,
            write_rate: Rate::Units(1000.0),
            key_write_rate: 300,
            concurrency: 2 * SEGMENTS as usize,
            max_retries: 10,
            from_export: None,
            export_files_in_parallel: 1,
            undo: false,
            stop: stop.clone(),
        },
        tail: TailOptions {
            rejects: state_dir.tail_rejects(),
            state_dir: state_dir.clone(),
            exit_when_idle: None,
            write_rate: None,
            poll_interval: Duration::from_millis(250),
            stop: stop.clone(),
        },
        verify: VerifyOptions {
            state_dir: state_dir.clone(),
            segments: Some(SEGMENTS),
            page_limit: None,
            read_rate: None,
            target_read_rate: None,
            write_rate: 0.0,
            recheck_timeout: WAIT,
            stale_after: Duration::from_secs(30),
            restart: false,
            repair: false,
            sample: None,
            max_retries: 10,
            stop: stop.clone(),
        },
        drain_timeout: WAIT,
        exit_when_ready: false,
        ready: Some(ready),
        stop,
        state_dir,
    }
}

/// What cutover and finish recorded, and what the application wrote.
struct Switched {
    cut_over_at: String,
    finished_at: String,
    application: WriterReport,
    timings: Vec<PhaseTime>,
}

/// `rekey cutover` while the application writes; the application then moves
/// to the new table (stops writing to the old one); `rekey finish` drains the
/// writes it made until then and stops the tail.
async fn switch(
    clients: &Clients,
    plan: &Plan,
    state_dir: &StateDir,
    writer: Writer,
    progress: &Progress,
) -> anyhow::Result<Switched> {
    let t = Instant::now();
    progress
        .note("cutover: checking the gates, then a drain barrier, while the application writes");
    let opts = CutoverOptions {
        state_dir: state_dir.clone(),
        max_lag: 10.0,
        max_verify_age: Duration::from_secs(3600),
        accept_rejects: false,
        postpone_file: state_dir.postpone(),
        wait: WAIT,
        drain_timeout: WAIT,
    };
    let cut = cutover::cutover(clients, plan, &opts, progress).await?;
    let Some(record) = cut.record.filter(|_| cut.cut_over) else {
        let failing: Vec<String> = cut
            .gates
            .iter()
            .filter(|g| !g.ok)
            .map(|g| format!("{}: {}", g.name, g.detail))
            .collect();
        anyhow::bail!(GateNotMet(format!(
            "cutover: {} ({})",
            cut.blocked.unwrap_or_default(),
            failing.join("; ")
        )));
    };
    let mut timings = vec![PhaseTime::since("cutover", t)];
    let application = writer.stop().await?;
    progress.note(&format!(
        "cut over at {}: the application moves to `{}` and stops writing to `{}`",
        record.at, plan.target_table, plan.source_table
    ));
    let t = Instant::now();
    progress
        .note("finish: a last drain barrier for the writes made until the switch; the tail stops");
    let fin = cutover::finish(clients, plan, state_dir, WAIT).await?;
    let finished_at = fin.record.as_ref().and_then(|r| r.finished_at);
    let Some(finished_at) = finished_at.filter(|_| fin.finished) else {
        anyhow::bail!(GateNotMet(format!(
            "finish: the tail did not report drain barrier {} within {:.0} s",
            fin.barrier,
            WAIT.as_secs_f64()
        )));
    };
    timings.push(PhaseTime::since("finish", t));
    Ok(Switched {
        cut_over_at: show_time(&record.at),
        finished_at: show_time(&finished_at),
        application,
        timings,
    })
}

impl Demo {
    /// The migration under live writes, cutover, finish, and the final check.
    pub async fn migrate(self, progress: &Progress) -> anyhow::Result<Summary> {
        let Demo {
            plan,
            report,
            items_loaded,
            opts,
            clients,
            keys,
            state,
            mut timings,
            started,
            _local,
        } = self;
        let writer = Writer::start(WriterOptions {
            clients: clients.clone(),
            table: plan.source_table.clone(),
            keys,
            first_order: opts.items,
            rate: opts.writer_rate,
        });
        progress.note(&format!(
            "the application writes to `{}`: about {:.0} writes/s (new orders, status changes, deletes)",
            plan.source_table, opts.writer_rate
        ));
        let ready = Arc::new(tokio::sync::Notify::new());
        let state_dir = StateDir::new(state.path());
        let run_opts = run_options(&state_dir, ready.clone());
        let run = lifecycle::run(&clients, &plan, &run_opts, progress);
        tokio::pin!(run);
        tokio::select! {
            r = &mut run => {
                let why = r?.blocked.unwrap_or_else(|| "no reason given".into());
                anyhow::bail!(GateNotMet(format!("the migration stopped before cutover: {why}")));
            }
            () = ready.notified() => {}
        }
        // As an operator runs `rekey cutover` and `rekey finish` beside
        // `rekey run`, which goes on tailing until finish stops its tail.
        let (switched, run) = tokio::try_join!(
            switch(&clients, &plan, &state_dir, writer, progress),
            &mut run
        )?;
        timings.extend(
            run.timings
                .into_iter()
                .filter(|t| t.phase != lifecycle::TAILING),
        );
        timings.extend(switched.timings);

        let t = Instant::now();
        let check = final_check(&clients, &plan, progress).await?;
        timings.push(PhaseTime::since("final check", t));
        let verify = run.verify;
        let verify_clean = verify.as_ref().is_some_and(|v| v.clean);
        Ok(Summary {
            completed: verify_clean && check.equal,
            source_table: plan.source_table.clone(),
            target_table: plan.target_table.clone(),
            items_loaded,
            hottest: Hottest::of(&report, opts.analyze.app_write_rate),
            application: switched.application,
            backfill: run.backfill.map(|b| b.totals).unwrap_or_default(),
            tail: run.tail.unwrap_or_default(),
            verify_clean,
            verify,
            cut_over_at: switched.cut_over_at,
            finished_at: switched.finished_at,
            check,
            phases: timings,
            total_seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// The demo's before/after, printed by `rekey demo` (as JSON with `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Cut over and finished (or the demo fails), verify clean, and the
    /// target equal to the plan applied to the source.
    pub completed: bool,
    pub source_table: String,
    pub target_table: String,
    /// Orders and tenant profiles, before the migration.
    pub items_loaded: u64,
    pub hottest: Hottest,
    /// What the application wrote to the source during the migration.
    pub application: WriterReport,
    /// The backfill's totals: `scanned = written + rejected + skipped`.
    pub backfill: Counters,
    /// The application's writes the tail carried into the target.
    pub tail: TailReport,
    pub verify_clean: bool,
    /// `rekey run`'s verify result (counts, times).
    pub verify: Option<VerifyResult>,
    pub cut_over_at: String,
    pub finished_at: String,
    pub check: FinalCheck,
    pub phases: Vec<PhaseTime>,
    pub total_seconds: f64,
}

/// The hottest partition key of each design, from analyze's report.
#[derive(Debug, Clone, Serialize)]
pub struct Hottest {
    /// Application writes/s of the estimate, spread as the items are.
    pub app_write_rate: Option<f64>,
    pub old: HotSide,
    pub new: HotSide,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct HotSide {
    /// Redacted unless `--show-keys`.
    pub key: String,
    pub item_share: f64,
    /// WCU/s this key would take at `app_write_rate`.
    pub predicted_wcu: Option<f64>,
    /// Keys over 1,000 WCU/s at that rate.
    pub keys_over_limit: Option<u64>,
}

impl Hottest {
    fn of(r: &Report, app_write_rate: Option<f64>) -> Hottest {
        let side = |d: &Distribution| {
            let app = d.load.iter().position(|l| l.scenario == "application");
            d.hottest_by_items
                .first()
                .map(|h| HotSide {
                    key: h.key.clone(),
                    item_share: h.item_share,
                    predicted_wcu: app.and_then(|i| h.predicted_wcu.get(i).copied()),
                    keys_over_limit: app.map(|i| d.load[i].keys_over_limit),
                })
                .unwrap_or_default()
        };
        Hottest {
            app_write_rate,
            old: side(&r.old),
            new: side(&r.new),
        }
    }
}

/// Both tables scanned after `finish`, compared independently of verify.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FinalCheck {
    pub source_items: u64,
    /// Source items the plan puts in the target (the rest it rejects or skips).
    pub expected: u64,
    pub target_items: u64,
    /// Expected but not in the target.
    pub missing: u64,
    /// In the target but not expected.
    pub extra: u64,
    /// In both, with other attributes.
    pub different: u64,
    /// The target is exactly the plan applied to the source.
    pub equal: bool,
    /// The hottest partition key's share of the items, measured in each table.
    pub source_hottest_share: f64,
    pub target_hottest_share: f64,
}

async fn final_check(
    clients: &Clients,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<FinalCheck> {
    let source = scan_all(clients, &plan.source_table, "check old", progress).await?;
    let target = scan_all(clients, &plan.target_table, "check new", progress).await?;
    Ok(compare(plan, &source, &target))
}

/// The target against transform(source), item by item.
pub fn compare(plan: &Plan, source: &[Item], target: &[Item]) -> FinalCheck {
    use std::collections::BTreeMap;
    let names = plan.target_key.names();
    let expected: BTreeMap<Vec<u8>, Item> = source
        .iter()
        .filter_map(|i| match transform(plan, i) {
            Outcome::Put { item, .. } => Some((encode_key(&item, &names)?, item)),
            _ => None,
        })
        .collect();
    let actual: BTreeMap<Vec<u8>, &Item> = target
        .iter()
        .filter_map(|i| Some((encode_key(i, &names)?, i)))
        .collect();
    let missing = expected.keys().filter(|k| !actual.contains_key(*k)).count() as u64;
    let extra = actual.keys().filter(|k| !expected.contains_key(*k)).count() as u64;
    let different = expected
        .iter()
        .filter(|(k, v)| actual.get(*k).is_some_and(|a| a != v))
        .count() as u64;
    FinalCheck {
        source_items: source.len() as u64,
        expected: expected.len() as u64,
        target_items: target.len() as u64,
        missing,
        extra,
        different,
        // Items without the key attributes would be neither expected nor actual.
        equal: missing + extra + different == 0 && actual.len() == target.len(),
        source_hottest_share: hottest_share(source, &plan.source_key.partition_key.name),
        target_hottest_share: hottest_share(target, &plan.target_key.partition_key.name),
    }
}

fn hottest_share(items: &[Item], partition_key: &str) -> f64 {
    let mut counts: std::collections::HashMap<Vec<u8>, u64> = std::collections::HashMap::new();
    for key in items.iter().filter_map(|i| encode_key(i, &[partition_key])) {
        *counts.entry(key).or_default() += 1;
    }
    let max = counts.values().copied().max().unwrap_or(0);
    max as f64 / items.len().max(1) as f64
}

/// Every item of `table`, through a parallel Scan.
async fn scan_all(
    clients: &Clients,
    table: &str,
    label: &str,
    progress: &Progress,
) -> anyhow::Result<Vec<Item>> {
    let items = Arc::new(Mutex::new(Vec::new()));
    progress.start(label, None);
    let opts = ScanOptions {
        table: table.to_string(),
        segments: SEGMENTS,
        page_limit: None,
        consistent_read: true,
        stop: tokio_util::sync::CancellationToken::new(),
    };
    let (sink, shown) = (items.clone(), progress.clone());
    scan::scan(
        clients,
        &opts,
        Vec::new(),
        Arc::new(Control::new(None, None)),
        move |page| {
            let mut all = sink.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(page.items);
            shown.update(all.len() as u64, page.consumed);
            async { anyhow::Ok(()) }
        },
    )
    .await
    .with_context(|| format!("scanning `{table}` for the final check"))?;
    progress.finish();
    let mut items = items.lock().unwrap_or_else(|e| e.into_inner());
    Ok(std::mem::take(&mut *items))
}

/// The summary for people: before/after, the migration, the time it took.
pub fn render(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(w, "\nBefore and after");
    render_hottest(w, &s.hottest);
    let a = &s.application;
    let _ = writeln!(
        w,
        "\nThe migration of `{}` into `{}`, while the application wrote:",
        s.source_table, s.target_table
    );
    let b = &s.backfill;
    let row = |w: &mut String, label: &str, text: String| {
        let _ = writeln!(w, "  {label:<13}{text}");
    };
    // Both rates: the local server serves one request at a time, and writes
    // wait while a Scan page holds it, so fewer get through than asked.
    row(
        w,
        "application",
        format!(
            "{} writes in {:.0} s ({:.0}/s of {:.0}/s asked): {} new orders, {} status changes, {} deletes",
            a.inserts + a.updates + a.deletes,
            a.seconds,
            a.writes_per_second,
            a.rate,
            a.inserts,
            a.updates,
            a.deletes
        ),
    );
    row(
        w,
        "backfill",
        format!(
            "{} items copied (scanned {} = written {} + rejected {} + skipped {})",
            b.written, b.scanned, b.written, b.rejected, b.skipped
        ),
    );
    let t = &s.tail;
    row(
        w,
        "tail",
        format!(
            "{} stream records read; applied to the target: {} puts, {} deletes ({} rejected)",
            t.records, t.puts, t.deletes, t.rejected
        ),
    );
    let c = s.verify.as_ref().map(|v| v.counts).unwrap_or_default();
    row(
        w,
        "verify",
        format!(
            "{}: {} source items matched, {} target items mapped back; {} changed under it, settled by re-checks",
            if s.verify_clean {
                "clean"
            } else {
                "DIFFERENCES"
            },
            c.matched,
            c.target_matched,
            c.resolved
        ),
    );
    row(
        w,
        "cutover",
        format!("at {} (gates held, drain barrier complete)", s.cut_over_at),
    );
    row(
        w,
        "finish",
        format!("at {}; the tail stopped", s.finished_at),
    );
    let c = &s.check;
    let check = if c.equal {
        format!("target == plan(source): {} items", c.target_items)
    } else {
        format!(
            "target != plan(source): {} missing, {} extra, {} different ({} expected, {} in the target)",
            c.missing, c.extra, c.different, c.expected, c.target_items
        )
    };
    row(w, "check", check);
    let _ = writeln!(w, "\nTime");
    for p in &s.phases {
        let _ = writeln!(w, "  {:<24}{:>8.1} s", p.phase, p.seconds);
    }
    let _ = writeln!(w, "  {:<24}{:>8.1} s", "total", s.total_seconds);
    o
}

fn render_hottest(w: &mut String, h: &Hottest) {
    use std::fmt::Write as _;
    let row = |w: &mut String, label: &str, old: String, new: String| {
        let _ = writeln!(w, "  {label:<28}{old:>16}{new:>16}");
    };
    row(w, "", "old design".into(), "new design".into());
    row(
        w,
        "hottest key's share of items",
        format!("{:.2}%", h.old.item_share * 100.0),
        format!("{:.2}%", h.new.item_share * 100.0),
    );
    if let Some(rate) = h.app_write_rate {
        let wcu = |s: &HotSide| {
            s.predicted_wcu.map_or("-".into(), |v| {
                let over = if v > analyze::PARTITION_WCU {
                    " THROTTLE"
                } else {
                    ""
                };
                format!("{v:.0}{over}")
            })
        };
        row(
            w,
            &format!("its WCU/s at {rate:.0} writes/s"),
            wcu(&h.old),
            wcu(&h.new),
        );
        let over = |s: &HotSide| s.keys_over_limit.map_or("-".into(), |n| n.to_string());
        row(w, "keys over 1,000 WCU/s", over(&h.old), over(&h.new));
    }
    let _ = writeln!(w, "  hottest key, old design    {}", h.old.key);
    let _ = writeln!(w, "  hottest key, new design    {}", h.new.key);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_skewed_and_reproducible() {
        let a = generate(10_000);
        assert_eq!(a.len(), 10_100);
        let b = generate(10_000);
        assert!(a == b);
        let hot = a
            .iter()
            .filter(|i| matches!(&i["PK"], Value::S(s) if s.starts_with("TENANT#pathological-00#DAY#2026-07-07")))
            .count();
        // 400 of 745 weight units, 70 % of them today: about 38 % of all orders on one key.
        assert!((3_300..4_200).contains(&hot), "{hot}");
    }

    #[test]
    fn the_application_never_writes_an_order_it_deleted() {
        let items = generate(200);
        let mut keys: Vec<OrderKey> = items.iter().filter_map(order_key).collect();
        assert_eq!(
            keys.len(),
            200,
            "profiles are not the application's to change"
        );
        let (mut workload, mut next) = (Workload::new(WRITER_SEED), 200);
        let mut deleted = std::collections::HashSet::new();
        let (mut inserts, mut updates) = (0, 0);
        for _ in 0..2_000 {
            match next_write(&mut workload, &mut keys, &mut next) {
                Write::Insert(item) => {
                    inserts += 1;
                    let k = order_key(&item).unwrap();
                    assert!(!keys.contains(&k), "order ids are new");
                    keys.push(k);
                }
                Write::Status(k, _) => {
                    updates += 1;
                    assert!(!deleted.contains(&k));
                }
                Write::Delete(k) => {
                    assert!(deleted.insert(k.clone()), "deleted twice");
                    assert!(!keys.contains(&k));
                }
            }
        }
        let deletes = deleted.len();
        assert!(inserts > updates && updates > deletes && deletes > 0);
    }

    #[test]
    fn the_final_check_finds_each_kind_of_difference() {
        let plan = Plan::parse(DEMO_PLAN, Path::new("demo.toml")).unwrap();
        let source = generate(100);
        let target: Vec<Item> = source
            .iter()
            .map(|i| match transform(&plan, i) {
                Outcome::Put { item, .. } => item,
                other => panic!("{other:?}"),
            })
            .collect();
        let c = compare(&plan, &source, &target);
        assert!(c.equal, "{c:?}");
        assert_eq!(
            (c.source_items, c.expected, c.target_items),
            (200, 200, 200)
        );
        assert!(c.source_hottest_share > c.target_hottest_share, "{c:?}");

        let mut damaged = target[1..].to_vec(); // one missing
        damaged[0].insert("status".into(), Value::S("LOST".into())); // one different
        let mut extra = target[2].clone();
        extra.insert("SK".into(), Value::S("ORDER#ffffffff".into()));
        damaged.push(extra); // one extra
        let c = compare(&plan, &source, &damaged);
        assert_eq!((c.missing, c.different, c.extra, c.equal), (1, 1, 1, false));
    }
}
