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
//!
//! The parts: `workload` (the skewed table and the orders, from a fixed
//! seed), `writer` (the application), `check` (the final comparison) and
//! `summary` (the before/after and its rendering); this module runs them.

mod check;
mod summary;
mod workload;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::aws::rate::Rate;
use crate::aws::{AwsOptions, Clients};
use crate::core::plan::Plan;
use crate::core::value::Item;
use crate::local::{LocalOptions, LocalServer};
use crate::phase::analyze::{self, AnalyzeOptions, Report, ScanSettings};
use crate::phase::backfill::BackfillOptions;
use crate::phase::cutover::{self, CutoverOptions};
use crate::phase::error::GateNotMet;
use crate::phase::lifecycle::{self, AnalyzeVerdict, PhaseTime, RunOptions};
use crate::phase::progress::Progress;
use crate::phase::tail::TailOptions;
use crate::phase::verify::VerifyOptions;
use crate::state::StateDir;
use crate::state::snapshot::show_time;

pub(crate) use summary::{Hottest, Summary, render};
pub use workload::generate;
pub(crate) use writer::WriterReport;

use check::final_check;
use workload::{OrderKey, order_key};
use writer::{Writer, WriterOptions};

pub const DEMO_PLAN: &str = include_str!("../../../plans/tenant-day-shard.toml");
/// Items/s of application writes for analyze's load estimate: a production
/// rate, at which the hot tenant-day key crosses 1,000 WCU/s in the old
/// design. (The demo's own writer runs far slower: the local server is the
/// bottleneck, and the estimate is per rate anyway.)
pub(crate) const DEMO_APP_WRITE_RATE: f64 = 3000.0;
/// Writes/s of the demo's application while the migration runs: steady live
/// traffic for the tail to carry and verify to re-check. Each write costs the
/// local server (moto: one request at a time) about as much as ~3 items of a
/// batch, twice over (the source, then the tail's write to the target), so a
/// higher rate would slow the migration it shows.
pub(crate) const DEMO_WRITER_RATE: f64 = 50.0;

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
}

/// The DynamoDB endpoint the environment names (AWS_ENDPOINT_URL_DYNAMODB,
/// then AWS_ENDPOINT_URL; `env` looks a variable up), as for the other
/// commands: the demo runs there instead of starting its own server.
pub(crate) fn endpoint_from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"]
        .iter()
        .find_map(|v| env(v).filter(|u| !u.is_empty()))
}

/// A demo with its tables loaded and analyzed, ready to migrate.
pub(crate) struct Demo {
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
            via_import: None,
            import_object_bytes: crate::core::import::DEFAULT_OBJECT_BYTES,
            tail_in_process: true,
        },
        tail: TailOptions {
            rejects: state_dir.tail_rejects(),
            state_dir: state_dir.clone(),
            exit_when_idle: None,
            write_rate: None,
            poll_interval: Duration::from_millis(250),
            flow: crate::phase::tail::Flow::Forward,
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
            reverse: false,
            max_retries: 10,
        },
        drain_timeout: WAIT,
        exit_when_ready: false,
        ready: Some(ready),
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
        fleet: None,
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
    let fin = cutover::finish(clients, plan, state_dir, WAIT, None).await?;
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
    pub(crate) async fn migrate(self, progress: &Progress) -> anyhow::Result<Summary> {
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
        // The demo's state is a temporary directory: Ctrl-C ends it
        // outright (the demo never takes the process's stop), so its run's
        // stop is never cancelled.
        let never = tokio_util::sync::CancellationToken::new();
        let run = lifecycle::run(&clients, &plan, &run_opts, progress, &never);
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
