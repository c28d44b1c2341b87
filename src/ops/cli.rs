//! Command-line arguments (clap) and the mapping from errors to exit codes.
//!
//! Arguments are low-level; `ops::config` turns them into the options struct
//! of the module that does the work, checked, in one conversion, so no other
//! module sees clap.

use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::aws::AwsError;
use crate::aws::export::ExportError;
use crate::aws::import::ImportFailed;
use crate::aws::rate::Rate;
use crate::core::plan::PlanErrors;
use crate::state::fleet::FleetError;

/// Exit codes, documented in the README.
pub mod exit {
    pub const OK: i32 = 0;
    /// Anything not listed below.
    pub const FAILURE: i32 = 1;
    /// Bad input: a malformed plan, sample file or argument.
    pub const BAD_INPUT: i32 = 2;
    /// A gate was not met in time: the drain barrier (and later cutover's gates).
    pub(crate) const GATE: i32 = 3;
    /// `verify` found differences, or could not settle some (the tail is behind).
    pub const DIFFERENCES: i32 = 4;
    /// An AWS call failed: unreachable endpoint, missing table, missing permission.
    pub const AWS: i32 = 5;
}

pub(crate) use crate::phase::error::GateNotMet;
pub use crate::phase::error::InputError;

pub fn exit_code(err: &anyhow::Error) -> i32 {
    for cause in err.chain() {
        if cause.is::<GateNotMet>() {
            return exit::GATE;
        }
        if cause.is::<PlanErrors>() || cause.is::<InputError>() {
            return exit::BAD_INPUT;
        }
        if cause.is::<AwsError>()
            || matches!(cause.downcast_ref::<FleetError>(), Some(FleetError::Aws(_)))
            || cause.is::<ImportFailed>()
            || cause
                .downcast_ref::<ExportError>()
                .is_some_and(ExportError::is_s3_call)
        {
            return exit::AWS;
        }
    }
    exit::FAILURE
}

#[derive(Debug, Parser)]
#[command(
    name = "rekey",
    version,
    about = "Re-key live DynamoDB tables online",
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    pub aws: AwsArgs,
    /// No progress output on stderr.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Log what rekey does on stderr: -v its own events (endpoints, retries, throttles,
    /// checkpoints, pauses), -vv also debug events and each AWS request. RUST_LOG overrides.
    #[arg(long, short, global = true, action = ArgAction::Count)]
    pub verbose: u8,
    /// The log's format on stderr: text, or json (one object a line: time, level, command,
    /// phase, table, message, fields, each AWS request with its id, capacity, attempt, latency
    /// and throttle; key values hashed unless --show-keys). json logs at -v's level at least.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormatArg,
    /// Show key values in terminal and --json output (default: a stable hash, ‹3f9a1c2e›).
    /// Files in the state directory always hold the real values.
    #[arg(long, global = true)]
    pub show_keys: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct AwsArgs {
    /// DynamoDB endpoint (otherwise AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, or AWS's);
    /// a local one serves Streams too, unless AWS_ENDPOINT_URL_DYNAMODB_STREAMS is set.
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// AWS region (otherwise AWS_REGION or the profile's).
    #[arg(long, global = true)]
    pub region: Option<String>,
    /// Named profile from the shared AWS config files.
    #[arg(long, global = true)]
    pub profile: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a plan; with --sample, show each sample item before and after.
    Check(CheckArgs),
    /// Dry run on the source table: unmatched items, collisions, old vs new key distribution.
    Analyze(AnalyzeArgs),
    /// Infer a table's key shapes and hot keys from a sample, and suggest a plan that
    /// shards what is hot at the given rates (`-o plan.toml` writes it).
    Suggest(SuggestArgs),
    /// Copy every source item into the target in the new shape: rate-limited, checkpointed, resumable.
    Backfill(BackfillArgs),
    /// The whole lifecycle: analyze gate, tail, backfill, catch-up, verify, ready for cutover;
    /// then keeps tailing until `rekey finish`. Resumable in any phase.
    Run(RunArgs),
    /// In place only: remove the attributes the plan added, where they still hold
    /// the plan's value (checkpointed and resumable like backfill). Stop the tail first.
    Undo(BackfillArgs),
    /// One of N identical workers sharing one migration's backfill through a DynamoDB control
    /// table (--state dynamodb://TABLE[/MIGRATION]): takes Scan segments (with --from-export,
    /// the export's data files) under leases, exits 0 once every unit is done.
    Worker(WorkerArgs),
    /// Keep the target current from the source table's stream (buffered until the backfill is done).
    Tail(TailArgs),
    /// Rollback's replication: keep the source current from the target table's stream
    /// (NEW_AND_OLD_IMAGES), by the plan's inverse, without echoing the forward tail's writes.
    Reverse(TailArgs),
    /// Check both ways that the target is exactly transform(source); checkpointed (exit 4: differences).
    Verify(VerifyArgs),
    /// Prove the tail has applied every source write made before now: write a
    /// marker item into the source and wait until the running tail reports it.
    Drain(DrainArgs),
    /// Switch on evidence: check the gates, wait while the postpone file exists,
    /// drain, record the cutover and print the next steps.
    Cutover(CutoverArgs),
    /// The mirror of cutover (needs `rekey reverse` running): check the reverse tail and a
    /// clean verify, wait while the postpone file exists, drain through the target's stream,
    /// record the rollback and print the next steps. The forward tail carries on.
    Rollback(CutoverArgs),
    /// After the application has switched: drain once more, record the end, stop the tail.
    Finish(FinishArgs),
    /// Read one logical key of the new design: every partition key the plan spread it over,
    /// queried in parallel and merged by sort key, a page at a time (--cursor goes on).
    Query(QueryArgs),
    /// The migration's phase and progress, from what its processes publish (works while they run).
    Status(StatusArgs),
    /// Pause, resume or change the rates of a running backfill (through its state directory).
    Control(ControlArgs),
    /// Re-key a skewed table on the local server while an application writes: analyze, run, cutover, finish.
    Demo(DemoArgs),
    /// Run the application's skewed traffic against the plan's old design, its new one (keys
    /// through the plan, reads through the read path), or both, on scratch tables: throttles by
    /// reason, the hottest keys, latency and a verdict per design.
    Loadtest(LoadtestArgs),
    /// Print the least-privilege IAM policy (JSON) the plan's commands need.
    IamPolicy(IamPolicyArgs),
    /// Print the shell completion script for SHELL
    /// (e.g. `rekey completions bash > /etc/bash_completion.d/rekey`).
    Completions(CompletionsArgs),
    /// Print the man page, roff (e.g. `rekey man > /usr/local/share/man/man1/rekey.1`).
    Man,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell the script is for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `iam-policy --command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyCommandArg {
    Analyze,
    Backfill,
    Tail,
    Verify,
    Drain,
    Cutover,
    Query,
    /// `rekey reverse`, the rollback's reverse tail.
    Reverse,
    /// `rekey rollback`.
    Rollback,
    /// `rekey worker`: backfill by Scan, plus the control table (--state).
    Worker,
    /// `rekey loadtest`: its scratch tables (<source>-loadtest-old-*, <target>-loadtest-new-*).
    Loadtest,
    /// backfill, tail, verify, drain and cutover.
    All,
}

#[derive(Debug, Args)]
pub struct IamPolicyArgs {
    pub plan: PathBuf,
    /// The commands to cover (repeatable).
    #[arg(long, value_enum, default_value = "all")]
    pub command: Vec<PolicyCommandArg>,
    /// The backfill reads this export (s3://bucket/prefix, or a local directory) instead of scanning.
    #[arg(long, value_name = "LOCATION")]
    pub export: Option<String>,
    /// The backfill creates the target with ImportTable from objects it writes here
    /// (s3://bucket/prefix; `backfill --via-import`).
    #[arg(long, value_name = "S3_URL")]
    pub via_import: Option<String>,
    /// AWS account id for the ARNs (default: `*`). The region comes from --region (default: `*`).
    #[arg(long, value_name = "ID")]
    pub account: Option<String>,
    /// The fleet's control table (dynamodb://TABLE[/MIGRATION]): needed with --command worker.
    #[arg(long = "state", value_name = "URL")]
    pub fleet: Option<String>,
}

#[derive(Debug, Args)]
pub struct StateArgs {
    /// Where checkpoints live (default: .rekey/<plan file stem>).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Metrics of a long-running command (`backfill`, `undo`, `run`, `worker`, `tail`, `reverse`,
/// `verify`).
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Serve OpenMetrics at http://ADDR/metrics while the command runs (e.g. 0.0.0.0:9464;
    /// port 0 picks a free one, noted on stderr).
    #[arg(long, value_name = "ADDR", conflicts_with = "metrics")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// emf: write CloudWatch embedded-metric-format lines on stderr instead (namespace
    /// rekey), every --metrics-interval and when the command ends.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub metrics: Option<MetricsFormatArg>,
    /// Seconds between two EMF lines.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60.0,
        requires = "metrics"
    )]
    pub metrics_interval: f64,
}

/// `--metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricsFormatArg {
    /// CloudWatch embedded metric format, one JSON object a line on stderr.
    Emf,
}

#[derive(Debug, Args)]
pub struct BackfillArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub copy: CopyArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Print the final report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How the backfill copies: shared by `backfill` and `run`.
#[derive(Debug, Args)]
pub struct CopyArgs {
    #[command(flatten)]
    pub scan: ScanArgs,
    /// Write budget for the target: WCU per second, or a share of its provisioned write capacity (25%).
    #[arg(long, value_name = "WCU|N%", default_value = "1000")]
    pub write_rate: Rate,
    /// Write limit for any one target partition-key value, WCU per second (a partition takes 1,000).
    #[arg(long, value_name = "WCU", default_value_t = 300)]
    pub key_write_rate: u32,
    /// Write requests in flight at once, across all segments (BatchWriteItem, or UpdateItem in place).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Rejected items, with reasons, as JSON lines (default: <state dir>/rejects.jsonl).
    #[arg(long, value_name = "FILE")]
    pub rejects: Option<PathBuf>,
    /// Read a DynamoDB S3 export instead of scanning: s3://bucket/prefix, or a local
    /// directory holding a downloaded export. S3 endpoint: AWS_ENDPOINT_URL_S3, else
    /// AWS_ENDPOINT_URL, else AWS's (never --endpoint-url, which is DynamoDB's).
    #[arg(long, value_name = "LOCATION")]
    pub from_export: Option<String>,
    /// Export data files read at once.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub export_parallel: usize,
    /// The target does not exist yet: write its items as gzip DynamoDB JSON objects
    /// under s3://bucket/prefix/data/ and create it with DynamoDB's ImportTable (billed
    /// per GB, no write capacity). The S3 endpoint is resolved as for --from-export.
    #[arg(long, value_name = "S3_URL")]
    pub via_import: Option<String>,
    /// With --via-import: uncompressed size of each object (an import takes at most
    /// 50,000): bytes, or with K, M, G (KiB, MiB, GiB).
    #[arg(long, value_name = "SIZE", default_value = "32M")]
    pub import_object_size: ByteSize,
}

/// A size in bytes: `1048576`, `512K`, `32M`, `1G` (binary units; `KiB`, `MiB`,
/// `GiB` and a trailing `B` are accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let upper = t.to_ascii_uppercase();
        let digits = upper.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = match upper[digits.len()..]
            .trim_end_matches('B')
            .trim_end_matches('I')
        {
            "" => 1,
            "K" => 1 << 10,
            "M" => 1 << 20,
            "G" => 1 << 30,
            _ => return Err(format!("`{t}`: give bytes, or a number with K, M or G")),
        };
        match digits.trim().parse::<u64>() {
            Ok(n) if n > 0 => n
                .checked_mul(unit)
                .map(ByteSize)
                .ok_or_else(|| format!("`{t}` is too large")),
            _ => Err(format!(
                "`{t}`: give a size above 0, in bytes or with K, M or G"
            )),
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub copy: CopyArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Skip the analyze gate (a full Scan that refuses a plan whose new keys would still be hot).
    #[arg(long)]
    pub skip_analyze: bool,
    /// Go on although analyze predicts new keys over the per-partition limit.
    #[arg(long)]
    pub allow_hot_keys: bool,
    /// Application writes per second the analyze gate assumes for its load estimate.
    #[arg(long, value_name = "WRITES", default_value_t = 1000.0)]
    pub app_write_rate: f64,
    /// Give up on the catch-up drain barrier after this long (exit 3).
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub drain_timeout: f64,
    /// How long verify's re-check of a difference waits for the tail.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub recheck_timeout: f64,
    /// Exit once ready for cutover instead of tailing until `rekey finish`.
    #[arg(long)]
    pub exit_when_ready: bool,
    #[arg(long)]
    pub json: bool,
}

/// One process of a fleet sharing units through a control table (`rekey
/// worker`, `rekey verify --state dynamodb://…`).
#[derive(Debug, Args)]
pub struct FleetProcessArgs {
    /// This process's id (default: $HOSTNAME, the process id and a random suffix).
    #[arg(long, value_name = "ID")]
    pub worker_id: Option<String>,
    /// How long a lease lives without renewal; a dead process's units are taken over after it.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    pub lease_seconds: f64,
    /// Units (Scan segments, export data files) held at once, at most.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_units: usize,
}

/// `rekey worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    pub plan: PathBuf,
    /// The control table the fleet shares: dynamodb://TABLE[/MIGRATION] (created on demand,
    /// on-demand billing; the migration id defaults to the plan's target table).
    #[arg(long = "state", value_name = "URL")]
    pub fleet: String,
    #[command(flatten)]
    pub process: FleetProcessArgs,
    /// Also tail the source's stream as a fleet: stream shards leased like Scan segments,
    /// buffered in the control table until the fleet's backfill is done, then applied;
    /// the worker runs on after the backfill (until stopped, or --exit-when-idle).
    #[arg(long)]
    pub tail: bool,
    /// With --tail: exit once the fleet's backfill is done, every shard's buffer applied and
    /// no shard has moved for this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "tail")]
    pub exit_when_idle: Option<f64>,
    /// Where this worker's local files go (default: .rekey/<plan file stem>).
    #[command(flatten)]
    pub state: StateArgs,
    /// The table-wide budgets (--write-rate, --read-rate) are shared by the live workers;
    /// --segments fixes the unit count when this worker creates the migration (default 32;
    /// with --from-export the units are the export's data files, and every worker of the
    /// migration must give the same --from-export);
    /// --rejects is this worker's own file (default: <state dir>/rejects-<worker id>.jsonl).
    #[command(flatten)]
    pub copy: CopyArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    /// The backfill is a fleet's (`rekey worker`): wait for its "backfill done" record in
    /// this control table (dynamodb://TABLE[/MIGRATION]) instead of a local backfill.
    #[arg(long, value_name = "URL")]
    pub fleet: Option<String>,
    /// Write budget for the table written (the target; `reverse`: the source), WCU per second (default: unlimited).
    #[arg(long, value_name = "WCU")]
    pub write_rate: Option<f64>,
    /// Catch-up mode: exit once the backfill is done, the buffer applied, and
    /// no record has arrived for this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub exit_when_idle: Option<f64>,
    /// Rejected items (default: <state dir>/tail-rejects.jsonl; `reverse`: reverse-rejects.jsonl).
    #[arg(long, value_name = "FILE")]
    pub rejects: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub scan: ScanArgs,
    #[command(flatten)]
    pub state: StateArgs,
    /// Read budget for the target: RCU per second, or a share of its provisioned read capacity. Default: unlimited.
    #[arg(long, value_name = "RCU|N%")]
    pub target_read_rate: Option<Rate>,
    /// How long a re-check waits for the tail to apply past a difference, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub recheck_timeout: f64,
    /// Discard an unfinished verify and start a new one.
    #[arg(long)]
    pub restart: bool,
    /// Rewrite missing and different items, delete orphans, then re-verify those keys.
    #[arg(long)]
    pub repair: bool,
    /// Write budget for --repair, WCU per second.
    #[arg(long, value_name = "WCU", default_value_t = 1000.0)]
    pub write_rate: f64,
    /// Verify a random P% of source items (the same ones every run), forward only.
    #[arg(long, value_name = "P")]
    pub sample: Option<f64>,
    /// The rollback's check: the source against inverse(target) — every target item read back
    /// by the plan's inverse is exactly in the source, every source item is read back from one.
    #[arg(long)]
    pub reverse: bool,
    /// Run as one of N verify processes sharing the work through the fleet's control table:
    /// dynamodb://TABLE[/MIGRATION] (as `rekey worker`); the re-checks wait on `rekey tail --fleet`.
    #[arg(long = "state", value_name = "URL")]
    pub fleet: Option<String>,
    #[command(flatten)]
    pub process: FleetProcessArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    /// Give up (exit 3) after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub timeout: f64,
    /// Through the target's stream and the reverse tail (`rekey reverse`): every write made
    /// to the target before now is in the source.
    #[arg(long, conflicts_with = "fleet")]
    pub reverse: bool,
    /// A fleet's migration (dynamodb://TABLE[/MIGRATION]): the barrier goes through the
    /// fleet's own tail (`rekey worker --tail`), observed in the control table.
    #[arg(long = "state", value_name = "URL")]
    pub fleet: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CutoverArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    /// Largest acceptable tail lag, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub max_lag: f64,
    /// Oldest acceptable clean verify, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0)]
    pub max_verify_age: f64,
    /// Cut over even though rejects files are not empty.
    #[arg(long)]
    pub accept_rejects: bool,
    /// Wait while this file exists (default: <state dir>/postpone).
    #[arg(long, value_name = "FILE")]
    pub postpone_file: Option<PathBuf>,
    /// Keep re-checking gates that are not met for this long before exiting 3.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    pub wait: f64,
    /// Give up on the drain barrier after this long (exit 3).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub drain_timeout: f64,
    /// A fleet's migration (dynamodb://TABLE[/MIGRATION]): the backfill, its rejects and the
    /// verify are read from the control table; so are the tail gate and the drain barrier
    /// when the workers tail (`rekey worker --tail`), else the tail is this machine's
    /// (`rekey tail --fleet`).
    #[arg(long = "state", value_name = "URL")]
    pub fleet: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FinishArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub drain_timeout: f64,
    /// A fleet's migration (dynamodb://TABLE[/MIGRATION]): when its workers tail
    /// (`rekey worker --tail`), the last barrier goes through them and the end is recorded in
    /// the control table, where they see it and exit 0.
    #[arg(long = "state", value_name = "URL")]
    pub fleet: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    pub plan: PathBuf,
    /// The key's values: `tenant=acme,day=2026-07-07` (repeatable); exactly the captures
    /// and attributes its partition key template reads outside shard() and bucket().
    #[arg(long = "where", value_name = "NAME=VALUE,…", required = true)]
    pub where_: Vec<String>,
    /// The rule whose key is read (default: the one rule whose key --where fits).
    #[arg(long)]
    pub rule: Option<String>,
    /// For a key with bucket(): the first time to read (ISO-8601, or epoch seconds/ms).
    #[arg(long, value_name = "TIME", requires = "to")]
    pub from: Option<String>,
    /// For a key with bucket(): the last time to read; every bucket from --from's to this one's.
    #[arg(long, value_name = "TIME", requires = "from")]
    pub to: Option<String>,
    /// Only sort keys that begin with PREFIX.
    #[arg(long, value_name = "PREFIX", conflicts_with = "sk_between")]
    pub sk_begins_with: Option<String>,
    /// Only sort keys from LOW to HIGH, both included.
    #[arg(long, num_args = 2, value_names = ["LOW", "HIGH"])]
    pub sk_between: Option<Vec<String>>,
    /// Descending sort-key order.
    #[arg(long)]
    pub desc: bool,
    /// Items per page.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// Where the previous page ended (printed with it); the same arguments must be given.
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
    /// Read budget for the parallel queries, RCU per second (default: unlimited).
    #[arg(long, value_name = "RCU")]
    pub read_rate: Option<f64>,
    /// Strongly consistent reads (twice the read units).
    #[arg(long)]
    pub consistent: bool,
    /// One JSON line per item (DynamoDB JSON), then one with the next cursor.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    /// A fleet's status, from its control table (dynamodb://TABLE[/MIGRATION]): per worker
    /// units held, rates and last heartbeat; per unit owner, progress and done.
    #[arg(long = "state", value_name = "URL")]
    pub fleet: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub state: StateArgs,
    /// Hold all reads and writes until --resume.
    #[arg(long, conflicts_with = "resume")]
    pub pause: bool,
    #[arg(long)]
    pub resume: bool,
    /// New read ceiling, RCU per second.
    #[arg(long, value_name = "RCU")]
    pub read_rate: Option<f64>,
    /// New write ceiling, WCU per second.
    #[arg(long, value_name = "WCU")]
    pub write_rate: Option<f64>,
    /// Print the control file's new contents as JSON only.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    pub plan: PathBuf,
    /// DynamoDB JSON items, one per line (export form), or `aws dynamodb scan` output.
    #[arg(long, value_name = "FILE")]
    pub sample: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    pub plan: PathBuf,
    #[command(flatten)]
    pub scan: ScanArgs,
    #[command(flatten)]
    pub report: ReportArgs,
    /// Write every rejected item, with its reason, to this file (JSON lines).
    #[arg(long, value_name = "FILE")]
    pub rejects: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SuggestArgs {
    /// The table to sample.
    pub table: String,
    #[command(flatten)]
    pub scan: ScanArgs,
    /// Items to read at most: the Scan stops once the sample is full.
    #[arg(long, value_name = "ITEMS", default_value_t = 100_000)]
    pub sample: usize,
    /// The application's writes per second, spread as the items are.
    #[arg(long, value_name = "ITEMS")]
    pub app_write_rate: f64,
    /// The application's reads per second (items), spread as the items are.
    #[arg(long, value_name = "ITEMS")]
    pub app_read_rate: Option<f64>,
    /// Share of each partition's limits (1,000 WCU/s, 3,000 RCU/s) kept free: `50%` or `0.5`.
    #[arg(long, value_name = "P%", default_value = "50%")]
    pub headroom: Share,
    /// Any shard count, not only powers of two.
    #[arg(long)]
    pub any_shard_count: bool,
    /// The target table the plan names (default: <table>_rekeyed).
    #[arg(long, value_name = "NAME")]
    pub target_table: Option<String>,
    /// Write the suggested plan (commented TOML) here.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// A share from 0 to 1 (exclusive): `50%` or `0.5`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share(pub f64);

impl std::str::FromStr for Share {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let v = match t.strip_suffix('%') {
            Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
            None => t.parse::<f64>(),
        };
        match v {
            Ok(v) if (0.0..1.0).contains(&v) => Ok(Share(v)),
            _ => Err(format!(
                "`{t}`: give a share from 0 up to (not including) 100 %, as `50%` or `0.5`"
            )),
        }
    }
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Parallel Scan segments (default: from the table's size, at least 4).
    #[arg(long)]
    pub segments: Option<u32>,
    /// Read budget: RCU per second, or a share of the provisioned read capacity (25%). Default: unlimited.
    #[arg(long, value_name = "RCU|N%")]
    pub read_rate: Option<Rate>,
    /// Items per Scan page (default: DynamoDB's 1 MB pages); for `rekey worker --from-export`,
    /// lines per page of a data file (default 500).
    #[arg(long, value_name = "N")]
    pub page_size: Option<i32>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Backfill write rate, WCU per second, for the load estimate.
    #[arg(long, value_name = "WCU", default_value_t = 1000.0)]
    pub write_rate: f64,
    /// Application write rate, items per second, spread as the items are.
    #[arg(long, value_name = "ITEMS")]
    pub app_write_rate: Option<f64>,
    /// How many hottest keys to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Directory for spill files (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    /// Memory per spill aggregate before spilling, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub spill_memory: usize,
}

/// `loadtest --design`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DesignArg {
    /// The plan's source key shape.
    Old,
    /// The plan's target key shape.
    New,
    /// Old, then new, with the same requests.
    Both,
}

#[derive(Debug, Args)]
pub struct LoadtestArgs {
    pub plan: PathBuf,
    /// Which designs to run, one after the other.
    #[arg(long, value_enum, default_value = "both")]
    pub design: DesignArg,
    /// Requests per second, reads and writes together.
    #[arg(long, value_name = "REQUESTS", default_value_t = 100.0)]
    pub rate: f64,
    /// Seconds each design runs.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub duration: f64,
    /// Reads to writes, READS:WRITES (`1:4`; `0:1` writes only). Default: the preset's.
    #[arg(long, value_name = "READS:WRITES")]
    pub mix: Option<String>,
    /// The scenario: skewed (the default), hot-case, bulk-upload, deadline-scheduler,
    /// status-churn, dashboard, replay, lambda-spike, gsi-backfill.
    #[arg(long, value_name = "NAME", default_value = "skewed")]
    pub preset: String,
    /// The rule whose keys are drawn (default: the first whose new key has shard() or bucket()).
    #[arg(long)]
    pub rule: Option<String>,
    /// Existing tables to run against, OLD,NEW (kept afterwards), instead of scratch tables.
    #[arg(long, value_name = "OLD,NEW")]
    pub tables: Option<String>,
    /// Requests in flight at most.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub concurrency: usize,
    /// Seed of the request sequence: the same seed makes the same requests.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Items per read (one page).
    #[arg(long, value_name = "ITEMS", default_value_t = 25)]
    pub page: usize,
    /// How many keys each hottest-keys list shows.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub top: usize,
    /// Against AWS: run, after printing the estimated cost (without it, the estimate only).
    #[arg(long)]
    pub yes: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Orders in the demo table (plus 100 tenant profiles). The default takes
    /// about two minutes on a 2-core machine, the local server being the bottleneck.
    #[arg(long, default_value_t = 10_000)]
    pub items: u64,
    /// Writes per second of the demo's application while the migration runs.
    #[arg(long, value_name = "WRITES", default_value_t = crate::ops::demo::DEMO_WRITER_RATE)]
    pub writer_rate: f64,
    /// The moto_server executable (default: .tools/venv/bin/moto_server, see scripts/install-deps).
    #[arg(long, value_name = "PATH")]
    pub moto_server: Option<PathBuf>,
    #[command(flatten)]
    pub report: ReportArgs,
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_take_binary_units() {
        let size = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(size("1048576"), Ok(1 << 20));
        assert_eq!(size("512K"), Ok(512 << 10));
        assert_eq!(size("32MiB"), Ok(32 << 20));
        assert_eq!(size("1gb"), Ok(1 << 30));
        for bad in ["", "0", "12X", "-1M", "M"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shares_take_percent_or_fraction() {
        let share = |s: &str| s.parse::<Share>().map(|b| b.0);
        assert_eq!(share("50%"), Ok(0.5));
        assert_eq!(share("0.25"), Ok(0.25));
        assert_eq!(share("0"), Ok(0.0));
        for bad in ["", "100%", "1", "-5%", "x"] {
            assert!(share(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exit_codes_follow_the_error_type() {
        let plan = anyhow::Error::new(PlanErrors(vec![])).context("loading");
        assert_eq!(exit_code(&plan), exit::BAD_INPUT);
        let other = anyhow::anyhow!("boom");
        assert_eq!(exit_code(&other), exit::FAILURE);
    }

    #[test]
    fn a_control_table_call_that_failed_is_an_aws_error() {
        let aws = AwsError::Schema {
            table: "ctl".into(),
            detail: "no".into(),
        };
        let e = anyhow::Error::new(FleetError::Aws(aws)).context("unit 3");
        assert_eq!(exit_code(&e), exit::AWS);
        let changed = anyhow::Error::new(FleetError::PlanChanged {
            migration: "m".into(),
            stored: "a".into(),
            current: "b".into(),
        });
        assert_eq!(exit_code(&changed), exit::FAILURE);
    }
}
