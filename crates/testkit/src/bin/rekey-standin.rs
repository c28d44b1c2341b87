//! `rekey-standin`: the stand-in for a fast DynamoDB as a process of its own,
//! so benchmarks measure its CPU apart from rekey's (see
//! `rekey_testkit::standin` and `scripts/bench/standin`).
//!
//! Prints `rekey-standin listening on http://HOST:PORT` once it accepts
//! requests; on SIGTERM or SIGINT prints `rekey-standin stats {JSON}` (the
//! totals of `GET /stats`, without the per-second windows) and exits.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use rekey::core::plan::Plan;
use rekey_testkit::limits::Limits;
use rekey_testkit::standin::{Standin, StandinOptions};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "A stand-in for a fast DynamoDB (and its stream), for rekey's benchmarks"
)]
struct Args {
    /// Address to listen on (port 0: a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Items in the source table.
    #[arg(long, default_value_t = 200_000)]
    items: u64,
    /// Each item's size by DynamoDB's rules, bytes.
    #[arg(long, default_value_t = 500)]
    item_bytes: usize,
    #[arg(long, default_value_t = 0x5EED)]
    seed: u64,
    /// The plan: its source and target tables are served, and the target
    /// reads as transform(plan, source) (default: plans/tenant-day-shard.toml,
    /// built in: tables `orders` and `orders_by_shard`).
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    /// Every K-th target item differs from transform(source) (verify finds them).
    #[arg(long, value_name = "K")]
    corrupt_every: Option<u64>,
    /// Open shards of the source's stream.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Records in the source's stream.
    #[arg(long, default_value_t = 0)]
    stream_records: u64,
    /// Enforce a per-partition-key write limit, WCU/s (DynamoDB: 1000).
    #[arg(long, value_name = "WCU")]
    key_write_units: Option<f64>,
    /// Enforce a per-partition-key read limit, RCU/s (DynamoDB: 3000).
    #[arg(long, value_name = "RCU")]
    key_read_units: Option<f64>,
    /// Enforce a per-table write limit, WCU/s.
    #[arg(long, value_name = "WCU")]
    table_write_units: Option<f64>,
    /// Enforce a per-table read limit, RCU/s.
    #[arg(long, value_name = "RCU")]
    table_read_units: Option<f64>,
    /// Token bucket capacity in seconds of the rate.
    #[arg(long, default_value_t = 1.0)]
    burst_seconds: f64,
    /// Answer this share of DynamoDB requests with HTTP 500 InternalServerError.
    #[arg(long, value_name = "RATIO", default_value_t = 0.0)]
    error_500_ratio: f64,
    /// Worker threads (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = match args.threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut opts = StandinOptions::new(args.items);
    if let Some(path) = &args.plan {
        opts.plan = Plan::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    opts.item_bytes = args.item_bytes;
    opts.seed = args.seed;
    opts.corrupt_every = args.corrupt_every;
    opts.shards = args.shards;
    opts.stream_records = args.stream_records;
    opts.error_500_ratio = args.error_500_ratio;
    let limited = args.key_write_units.is_some()
        || args.key_read_units.is_some()
        || args.table_write_units.is_some()
        || args.table_read_units.is_some();
    opts.limits = limited.then(|| Limits {
        key_write: args.key_write_units.unwrap_or(f64::INFINITY),
        key_read: args.key_read_units.unwrap_or(f64::INFINITY),
        table_write: args.table_write_units,
        table_read: args.table_read_units,
        burst: args.burst_seconds,
    });
    let standin = Standin::bind(args.listen, opts).await?;
    println!(
        "rekey-standin listening on {} (source `{}` with {} items, target `{}`, stream {} records on {} shards)",
        standin.endpoint(),
        standin.model().source_table(),
        args.items,
        standin.model().target_table(),
        args.stream_records,
        args.shards,
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let mut stats = standin.stats();
    stats.windows.clear();
    println!("rekey-standin stats {}", serde_json::to_string(&stats)?);
    Ok(())
}
