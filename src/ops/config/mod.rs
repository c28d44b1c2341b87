//! Arguments → a validated [`Config`], in one fallible conversion.
//!
//! Every default that is not clap's and every argument check lives here,
//! once: the plan is loaded (its errors keep their `file:line:col`), the state
//! directory resolved, seconds checked and turned into durations, and each
//! command's arguments become the options struct of the phase that does the
//! work. The commands (`ops::commands`) then only connect, call the phase and
//! print. Nothing here touches AWS; the one environment lookup (the demo's
//! endpoint) goes through a function the caller passes, so the conversion is
//! tested as a plain function.
//!
//! The stop is not configuration: it is a signal of one process run, handed
//! to the commands that stop cleanly by `ops::commands::run` (`ops::shutdown`).

use std::path::PathBuf;
use std::time::Duration;

use crate::aws::AwsOptions;
use crate::aws::export::ExportLocation;
use crate::core::plan::Plan;
use crate::core::suggest::{ShardRounding, SuggestOptions};
use crate::ops::cli::{
    self, AwsArgs, Cli, InputError, LogFormatArg, MetricsFormatArg, PolicyCommandArg, ReportArgs,
    ScanArgs,
};
use crate::ops::demo::{self, DemoOptions};
use crate::ops::iam::{PolicyCommand, PolicyOptions};
use crate::ops::log::{self, LogOptions};
use crate::ops::metrics::MetricsSink;
use crate::ops::progress::ProgressMode;
use crate::ops::redact::Redactor;
use crate::phase::analyze::{AnalyzeOptions, ScanSettings};
use crate::phase::backfill::BackfillOptions;
use crate::phase::backfill::fleet::WorkerOptions;
use crate::phase::barrier::DrainOptions;
use crate::phase::cutover::CutoverOptions;
use crate::phase::lifecycle::RunOptions;
use crate::phase::query::QueryOptions;
use crate::phase::suggest::{self, SuggestRun};
use crate::phase::tail::fleet::FleetTailOptions;
use crate::phase::tail::{Flow, TailOptions};
use crate::phase::verify::VerifyOptions;
use crate::phase::verify::fleet::FleetVerifyOptions;
use crate::state::StateDir;
use crate::state::fleet::FleetRef;

mod loadtest;
mod query;

pub use loadtest::LoadtestRun;

/// Consecutive non-throttle failures of one write before a run stops.
const MAX_RETRIES: u32 = 10;
/// A tail status older than this means the tail is not running (verify).
const STALE_AFTER: Duration = Duration::from_secs(30);
/// How often the tail polls a shard that returned nothing.
const TAIL_POLL: Duration = Duration::from_millis(250);

/// One command, ready to run.
#[derive(Debug)]
pub struct Config {
    pub command: Command,
    pub common: Common,
}

/// What every command shares: how to reach AWS and how to print.
#[derive(Debug, Clone)]
pub struct Common {
    pub aws: AwsOptions,
    pub output: Output,
    /// How many `-v`: what `ops::log` shows on stderr (`RUST_LOG` overrides).
    pub verbose: u8,
    /// `--log-format`: the log's lines as text or JSON.
    pub log_format: log::Format,
    /// `--metrics-listen` or `--metrics emf` (long-running commands only).
    pub metrics: Option<MetricsSink>,
}

/// How a command prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Output {
    /// The result on stdout: for people, or `--json`.
    pub format: Format,
    /// `--quiet`: no notes and no progress on stderr.
    pub quiet: bool,
    /// Progress while the command runs: on stderr, JSON events on stdout
    /// (long-running commands with `--json`), or none.
    pub progress: ProgressMode,
    /// Key values hashed unless `--show-keys`.
    pub redactor: Redactor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// A loaded plan and the options of the phase that runs it.
#[derive(Debug)]
pub struct Planned<O> {
    pub plan: Plan,
    pub options: O,
}

#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "one per process, moved once")]
pub enum Command {
    Check(Planned<CheckOptions>),
    Analyze(Planned<AnalyzeRun>),
    Suggest(SuggestCommand),
    /// `backfill`, and `undo` (`options.undo`).
    Backfill(Planned<BackfillOptions>),
    Tail(Planned<TailOptions>),
    /// `rekey worker`: one of a fleet.
    Worker(Planned<WorkerOptions>),
    /// `rekey tail --fleet`: the tail, released by the fleet's "backfill done".
    TailFleet {
        tail: Planned<TailOptions>,
        fleet: FleetRef,
    },
    /// `rekey status --state dynamodb://…`: the fleet's control table.
    FleetStatus(Planned<FleetRef>),
    Verify(Planned<VerifyOptions>),
    /// `rekey verify --state dynamodb://…`: one of the fleet's verify processes.
    FleetVerify(Planned<FleetVerifyOptions>),
    Run(Planned<RunOptions>),
    Drain(Planned<DrainOptions>),
    Cutover(Planned<CutoverOptions>),
    Rollback(Planned<CutoverOptions>),
    Finish(Planned<FinishOptions>),
    Query(Planned<QueryOptions>),
    Status(Planned<StateDir>),
    Control(Planned<ControlChange>),
    Demo(DemoOptions),
    Loadtest(Planned<LoadtestRun>),
    IamPolicy(Planned<PolicyOptions>),
    /// `rekey completions SHELL`.
    Completions(clap_complete::Shell),
    /// `rekey man`.
    Man,
}

/// `rekey check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    /// Sample items to show before and after.
    pub sample: Option<PathBuf>,
}

/// `rekey analyze`.
#[derive(Debug, Clone)]
pub struct AnalyzeRun {
    pub scan: ScanSettings,
    pub options: AnalyzeOptions,
    /// Every rejected item goes to this file.
    pub rejects: Option<PathBuf>,
}

/// `rekey suggest`.
#[derive(Debug, Clone)]
pub struct SuggestCommand {
    pub run: SuggestRun,
    /// Where the plan goes (None: printed only).
    pub output: Option<PathBuf>,
}

/// `rekey finish`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishOptions {
    pub state_dir: StateDir,
    pub drain_timeout: Duration,
    /// `--state dynamodb://…`: the fleet's migration.
    pub fleet: Option<FleetRef>,
}

/// `rekey control`: what changes in the control file (None: as it is).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlChange {
    pub state_dir: StateDir,
    pub paused: Option<bool>,
    pub read_rate: Option<f64>,
    pub write_rate: Option<f64>,
}

impl Config {
    /// What `ops::log` needs to install the subscriber for this command.
    pub fn log_options(&self) -> LogOptions<'_> {
        LogOptions {
            verbose: self.common.verbose,
            format: self.common.log_format,
            command: self.command.name(),
            plan: self.command.plan(),
            show_keys: self.common.output.redactor.show,
            metrics: self.common.metrics.is_some(),
        }
    }
}

impl Command {
    /// The command's name, as the log names it (`undo` is a backfill's, the
    /// fleet's forms their command's).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Check(_) => "check",
            Command::Analyze(_) => "analyze",
            Command::Suggest(_) => "suggest",
            Command::Backfill(p) if p.options.undo => "undo",
            Command::Backfill(_) => "backfill",
            Command::Tail(p) | Command::TailFleet { tail: p, .. } => match p.options.flow {
                Flow::Forward => "tail",
                Flow::Reverse => "reverse",
            },
            Command::Worker(_) => "worker",
            Command::FleetStatus(_) | Command::Status(_) => "status",
            Command::Verify(_) | Command::FleetVerify(_) => "verify",
            Command::Run(_) => "run",
            Command::Drain(_) => "drain",
            Command::Cutover(_) => "cutover",
            Command::Rollback(_) => "rollback",
            Command::Finish(_) => "finish",
            Command::Query(_) => "query",
            Command::Loadtest(_) => "loadtest",
            Command::Control(_) => "control",
            Command::Demo(_) => "demo",
            Command::IamPolicy(_) => "iam-policy",
            Command::Completions(_) => "completions",
            Command::Man => "man",
        }
    }

    /// The command's plan, if it has one.
    pub fn plan(&self) -> Option<&Plan> {
        Some(match self {
            Command::Check(p) => &p.plan,
            Command::Analyze(p) => &p.plan,
            Command::Backfill(p) => &p.plan,
            Command::Tail(p) | Command::TailFleet { tail: p, .. } => &p.plan,
            Command::Worker(p) => &p.plan,
            Command::FleetStatus(p) => &p.plan,
            Command::Verify(p) => &p.plan,
            Command::FleetVerify(p) => &p.plan,
            Command::Run(p) => &p.plan,
            Command::Drain(p) => &p.plan,
            Command::Cutover(p) | Command::Rollback(p) => &p.plan,
            Command::Finish(p) => &p.plan,
            Command::Query(p) => &p.plan,
            Command::Loadtest(p) => &p.plan,
            Command::Status(p) => &p.plan,
            Command::Control(p) => &p.plan,
            Command::IamPolicy(p) => &p.plan,
            Command::Suggest(_) | Command::Demo(_) | Command::Completions(_) | Command::Man => {
                return None;
            }
        })
    }
}

impl TryFrom<Cli> for Config {
    type Error = anyhow::Error;

    /// With the process environment (the demo's endpoint).
    fn try_from(cli: Cli) -> anyhow::Result<Config> {
        Config::from_args(cli, &|name| std::env::var(name).ok())
    }
}

impl Config {
    /// The conversion, with `env` for environment lookups.
    pub(crate) fn from_args(
        cli: Cli,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Config> {
        let Cli {
            aws,
            quiet,
            verbose,
            log_format,
            show_keys,
            command,
        } = cli;
        let metrics = metrics(&command)?;
        let (command, output) = command_and_output(command, &aws, env)?;
        let log_format = match log_format {
            LogFormatArg::Text => log::Format::Text,
            LogFormatArg::Json => log::Format::Json,
        };
        Ok(Config {
            command,
            common: Common {
                verbose,
                log_format,
                metrics,
                aws: aws_options(&aws),
                output: Output {
                    quiet,
                    // --quiet silences progress whatever the format; with JSON
                    // log lines, the progress stderr would show is such lines.
                    progress: match (quiet, output.progress, log_format) {
                        (true, _, _) => ProgressMode::Quiet,
                        (false, ProgressMode::Auto, log::Format::Json) => ProgressMode::Log,
                        (false, progress, _) => progress,
                    },
                    redactor: Redactor { show: show_keys },
                    ..output
                },
            },
        })
    }
}

/// The output of a command: `json` its `--json`; `streams` whether it runs
/// long and, with `--json`, shows its progress as JSON events on stdout.
/// (`--quiet` and `--show-keys` are applied by the caller.)
fn output(json: bool, streams: bool) -> Output {
    Output {
        format: if json { Format::Json } else { Format::Text },
        quiet: false,
        progress: match (json, streams) {
            (true, true) => ProgressMode::Json,
            (true, false) => ProgressMode::Quiet,
            (false, _) => ProgressMode::Auto,
        },
        redactor: Redactor::default(),
    }
}

/// The commands that show no progress at all.
fn no_progress(json: bool) -> Output {
    Output {
        progress: ProgressMode::Quiet,
        ..output(json, false)
    }
}

fn command_and_output(
    command: cli::Command,
    aws: &AwsArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(Command, Output)> {
    use cli::Command as C;
    Ok(match command {
        C::Check(a) => (check(&a)?, no_progress(a.json)),
        C::Analyze(a) => (analyze(&a)?, output(a.json, false)),
        C::Suggest(a) => (suggest(&a)?, output(a.json, false)),
        C::Backfill(a) => (backfill(&a, false)?, output(a.json, true)),
        C::Undo(a) => (backfill(&a, true)?, output(a.json, true)),
        C::Tail(a) => (tail(&a, Flow::Forward)?, output(a.json, true)),
        C::Worker(a) => (worker(&a, env)?, output(a.json, true)),
        C::Reverse(a) => (tail(&a, Flow::Reverse)?, output(a.json, true)),
        C::Verify(a) => (verify(&a, env)?, output(a.json, true)),
        C::Run(a) => (run(&a)?, output(a.json, true)),
        C::Drain(a) => (drain(&a)?, no_progress(a.json)),
        C::Cutover(a) => (cutover(&a)?, output(a.json, false)),
        C::Rollback(a) => (rollback(&a)?, output(a.json, false)),
        C::Finish(a) => (finish(&a)?, no_progress(a.json)),
        C::Query(a) => (query::query(&a)?, no_progress(a.json)),
        C::Status(a) => (status(&a)?, no_progress(a.json)),
        C::Control(a) => (control(&a)?, no_progress(a.json)),
        C::Loadtest(a) => (loadtest::loadtest(&a)?, output(a.json, false)),
        C::Demo(a) => {
            let out = output(a.json, false);
            (demo(a, aws, env), out)
        }
        // The policy is a JSON document, always.
        C::IamPolicy(a) => (iam_policy(&a, aws)?, no_progress(true)),
        C::Completions(a) => (Command::Completions(a.shell), no_progress(false)),
        C::Man => (Command::Man, no_progress(false)),
    })
}

/// The metrics' sink of a long-running command: `--metrics-listen ADDR` or
/// `--metrics emf` (clap refuses both at once), or none.
fn metrics(command: &cli::Command) -> anyhow::Result<Option<MetricsSink>> {
    use cli::Command as C;
    let m = match command {
        C::Backfill(a) | C::Undo(a) => &a.metrics,
        C::Run(a) => &a.metrics,
        C::Worker(a) => &a.metrics,
        C::Tail(a) | C::Reverse(a) => &a.metrics,
        C::Verify(a) => &a.metrics,
        _ => return Ok(None),
    };
    Ok(match (m.metrics_listen, m.metrics) {
        (Some(addr), _) => Some(MetricsSink::Listen(addr)),
        (None, Some(MetricsFormatArg::Emf)) => {
            let interval = seconds("--metrics-interval", m.metrics_interval)?;
            if interval < Duration::from_millis(100) {
                return Err(
                    InputError("--metrics-interval: give 0.1 seconds or more".into()).into(),
                );
            }
            Some(MetricsSink::Emf { interval })
        }
        (None, None) => None,
    })
}

fn aws_options(a: &AwsArgs) -> AwsOptions {
    AwsOptions {
        endpoint_url: a.endpoint_url.clone(),
        region: a.region.clone(),
        profile: a.profile.clone(),
        ..Default::default()
    }
}

/// `--state-dir`, or the plan's default.
fn state_dir(plan: &std::path::Path, s: &cli::StateArgs) -> StateDir {
    s.state_dir
        .clone()
        .map_or_else(|| StateDir::for_plan(plan), StateDir::new)
}

/// A duration in seconds from `flag`: finite, 0 or more.
fn seconds(flag: &str, s: f64) -> Result<Duration, InputError> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| InputError(format!("{flag}: give seconds, 0 or more")))
}

fn scan_settings(s: &ScanArgs) -> ScanSettings {
    ScanSettings {
        segments: s.segments,
        read_rate: s.read_rate,
        page_limit: s.page_size,
    }
}

fn analyze_options(r: &ReportArgs) -> AnalyzeOptions {
    AnalyzeOptions {
        top: r.top,
        backfill_write_rate: r.write_rate,
        app_write_rate: r.app_write_rate,
        spill_memory_bytes: r.spill_memory.max(1) * 1024 * 1024,
        spill_dir: r.spill_dir.clone(),
        ..AnalyzeOptions::default()
    }
}

fn backfill_options(c: &cli::CopyArgs, state_dir: StateDir, undo: bool) -> BackfillOptions {
    let default_rejects = if undo {
        state_dir.undo_rejects()
    } else {
        state_dir.rejects()
    };
    BackfillOptions {
        rejects: c.rejects.clone().unwrap_or(default_rejects),
        state_dir,
        segments: c.scan.segments,
        page_limit: c.scan.page_size,
        read_rate: c.scan.read_rate,
        write_rate: c.write_rate,
        key_write_rate: c.key_write_rate,
        concurrency: c.concurrency,
        max_retries: MAX_RETRIES,
        from_export: c.from_export.clone(),
        export_files_in_parallel: c.export_parallel,
        undo,
        via_import: c.via_import.clone(),
        import_object_bytes: c.import_object_size.0,
        tail_in_process: false,
    }
}

/// The tail as `rekey run` starts it; `rekey tail` sets the rest.
fn tail_options(state_dir: &StateDir) -> TailOptions {
    TailOptions {
        rejects: state_dir.tail_rejects(),
        state_dir: state_dir.clone(),
        exit_when_idle: None,
        write_rate: None,
        poll_interval: TAIL_POLL,
        flow: Flow::Forward,
    }
}

/// Verify as `rekey run` runs it: both ways, the target read as fast as the
/// source, no repair; `rekey verify` sets the rest.
fn verify_options(
    state_dir: &StateDir,
    scan: &ScanArgs,
    recheck_timeout: f64,
) -> anyhow::Result<VerifyOptions> {
    Ok(VerifyOptions {
        state_dir: state_dir.clone(),
        segments: scan.segments,
        page_limit: scan.page_size,
        read_rate: scan.read_rate,
        target_read_rate: scan.read_rate,
        write_rate: 0.0,
        recheck_timeout: seconds("--recheck-timeout", recheck_timeout)?,
        stale_after: STALE_AFTER,
        restart: false,
        repair: false,
        sample: None,
        reverse: false,
        max_retries: MAX_RETRIES,
    })
}

fn check(a: &cli::CheckArgs) -> anyhow::Result<Command> {
    Ok(Command::Check(Planned {
        plan: Plan::load(&a.plan)?,
        options: CheckOptions {
            sample: a.sample.clone(),
        },
    }))
}

fn analyze(a: &cli::AnalyzeArgs) -> anyhow::Result<Command> {
    Ok(Command::Analyze(Planned {
        plan: Plan::load(&a.plan)?,
        options: AnalyzeRun {
            scan: scan_settings(&a.scan),
            options: analyze_options(&a.report),
            rejects: a.rejects.clone(),
        },
    }))
}

fn suggest(a: &cli::SuggestArgs) -> anyhow::Result<Command> {
    let rate_ok = |r: f64| r.is_finite() && r >= 0.0;
    if !rate_ok(a.app_write_rate) || !a.app_read_rate.is_none_or(rate_ok) {
        return Err(InputError(
            "--app-write-rate, --app-read-rate: give items per second, 0 or more".into(),
        )
        .into());
    }
    if a.sample == 0 {
        return Err(InputError("--sample: give 1 item or more".into()).into());
    }
    Ok(Command::Suggest(SuggestCommand {
        run: SuggestRun {
            table: a.table.clone(),
            scan: scan_settings(&a.scan),
            sample: a.sample,
            options: SuggestOptions {
                write_rate: a.app_write_rate,
                read_rate: a.app_read_rate,
                headroom: a.headroom.0,
                rounding: if a.any_shard_count {
                    ShardRounding::Exact
                } else {
                    ShardRounding::PowerOfTwo
                },
                limits: suggest::LIMITS,
                target_table: a.target_table.clone(),
            },
        },
        output: a.output.clone(),
    }))
}

fn backfill(a: &cli::BackfillArgs, undo: bool) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let options = backfill_options(&a.copy, state_dir(&a.plan, &a.state), undo);
    Ok(Command::Backfill(Planned { plan, options }))
}

/// `rekey tail` (forwards) and `rekey reverse` (backwards).
fn tail(a: &cli::TailArgs, flow: Flow) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let state_dir = state_dir(&a.plan, &a.state);
    let exit_when_idle = a
        .exit_when_idle
        .map(|s| seconds("--exit-when-idle", s))
        .transpose()?;
    let options = TailOptions {
        rejects: a.rejects.clone().unwrap_or_else(|| match flow {
            Flow::Forward => state_dir.tail_rejects(),
            Flow::Reverse => state_dir.reverse_rejects(),
        }),
        exit_when_idle,
        write_rate: a.write_rate,
        flow,
        ..tail_options(&state_dir)
    };
    match &a.fleet {
        None => Ok(Command::Tail(Planned { plan, options })),
        Some(_) if flow == Flow::Reverse => {
            Err(InputError("--fleet: the reverse tail follows no backfill".into()).into())
        }
        Some(url) => {
            let fleet = fleet_ref(url, &plan)?;
            Ok(Command::TailFleet {
                tail: Planned { plan, options },
                fleet,
            })
        }
    }
}

fn verify(a: &cli::VerifyArgs, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    if let Some(p) = a.sample
        && !(p > 0.0 && p <= 100.0)
    {
        return Err(InputError(format!(
            "--sample {p}: give a percentage above 0, at most 100"
        ))
        .into());
    }
    let state_dir = state_dir(&a.plan, &a.state);
    let options = VerifyOptions {
        target_read_rate: a.target_read_rate,
        write_rate: a.write_rate,
        restart: a.restart,
        repair: a.repair,
        sample: a.sample,
        reverse: a.reverse,
        ..verify_options(&state_dir, &a.scan, a.recheck_timeout)?
    };
    if let Some(url) = &a.fleet {
        let (worker_id, lease, max_units) = fleet_process(&a.process, env)?;
        let options = FleetVerifyOptions {
            verify: options,
            fleet: fleet_ref(url, &plan)?,
            worker_id,
            lease,
            max_units,
        };
        return Ok(Command::FleetVerify(Planned { plan, options }));
    }
    if a.reverse && plan.mode == crate::core::plan::Mode::InPlace {
        return Err(InputError(
            "--reverse: an in-place plan has no second table to read back".into(),
        )
        .into());
    }
    if a.reverse && (a.repair || a.sample.is_some()) {
        return Err(InputError(
            "--reverse checks every item and repairs nothing: drop --repair and --sample".into(),
        )
        .into());
    }
    Ok(Command::Verify(Planned { plan, options }))
}

fn run(a: &cli::RunArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let state_dir = state_dir(&a.plan, &a.state);
    let analyze = (!a.skip_analyze).then(|| {
        let options = AnalyzeOptions {
            app_write_rate: Some(a.app_write_rate),
            ..AnalyzeOptions::default()
        };
        (scan_settings(&a.copy.scan), options)
    });
    let options = RunOptions {
        analyze,
        allow_hot_keys: a.allow_hot_keys,
        backfill: backfill_options(&a.copy, state_dir.clone(), false),
        tail: tail_options(&state_dir),
        verify: verify_options(&state_dir, &a.copy.scan, a.recheck_timeout)?,
        drain_timeout: seconds("--drain-timeout", a.drain_timeout)?,
        exit_when_ready: a.exit_when_ready,
        ready: None,
        state_dir,
    };
    Ok(Command::Run(Planned { plan, options }))
}

fn drain(a: &cli::DrainArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let options = DrainOptions {
        state_dir: state_dir(&a.plan, &a.state),
        timeout: seconds("--timeout", a.timeout)?,
        flow: if a.reverse {
            Flow::Reverse
        } else {
            Flow::Forward
        },
        fleet: a
            .fleet
            .as_deref()
            .map(|u| fleet_ref(u, &plan))
            .transpose()?,
    };
    Ok(Command::Drain(Planned { plan, options }))
}

fn cutover(a: &cli::CutoverArgs) -> anyhow::Result<Command> {
    let mut planned = switch_options(a)?;
    if let Some(url) = &a.fleet {
        planned.options.fleet = Some(fleet_ref(url, &planned.plan)?);
    }
    Ok(Command::Cutover(planned))
}

/// A rollback reads this machine's reverse tail and its evidence only.
fn rollback(a: &cli::CutoverArgs) -> anyhow::Result<Command> {
    if a.fleet.is_some() {
        return Err(InputError(
            "rekey rollback --state: a rollback reads this machine's reverse tail and verify; drop --state"
                .into(),
        )
        .into());
    }
    Ok(Command::Rollback(switch_options(a)?))
}

/// `cutover` and `rollback` take the same options.
fn switch_options(a: &cli::CutoverArgs) -> anyhow::Result<Planned<CutoverOptions>> {
    let plan = Plan::load(&a.plan)?;
    let state_dir = state_dir(&a.plan, &a.state);
    let options = CutoverOptions {
        postpone_file: a
            .postpone_file
            .clone()
            .unwrap_or_else(|| state_dir.postpone()),
        state_dir,
        max_lag: a.max_lag,
        max_verify_age: seconds("--max-verify-age", a.max_verify_age)?,
        accept_rejects: a.accept_rejects,
        wait: seconds("--wait", a.wait)?,
        drain_timeout: seconds("--drain-timeout", a.drain_timeout)?,
        fleet: None,
    };
    Ok(Planned { plan, options })
}

fn finish(a: &cli::FinishArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let options = FinishOptions {
        state_dir: state_dir(&a.plan, &a.state),
        drain_timeout: seconds("--drain-timeout", a.drain_timeout)?,
        fleet: a
            .fleet
            .as_deref()
            .map(|u| fleet_ref(u, &plan))
            .transpose()?,
    };
    Ok(Command::Finish(Planned { plan, options }))
}

/// The plan must load, and the state directory is the plan's.
fn status(a: &cli::StatusArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    if let Some(url) = &a.fleet {
        let options = fleet_ref(url, &plan)?;
        return Ok(Command::FleetStatus(Planned { plan, options }));
    }
    let options = state_dir(&a.plan, &a.state);
    Ok(Command::Status(Planned { plan, options }))
}

/// `dynamodb://TABLE[/MIGRATION]`; the migration id defaults to the plan's
/// target table.
fn fleet_ref(url: &str, plan: &Plan) -> Result<FleetRef, InputError> {
    FleetRef::parse(url, &plan.target_table).map_err(InputError)
}

/// `rekey worker`: a backfill's options, the fleet's, and this worker's id.
fn worker(a: &cli::WorkerArgs, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let fleet = fleet_ref(&a.fleet, &plan)?;
    let (worker_id, lease, max_units) = fleet_process(&a.process, env)?;
    let state_dir = state_dir(&a.plan, &a.state);
    let mut backfill = backfill_options(&a.copy, state_dir.clone(), false);
    if a.copy.rejects.is_none() {
        backfill.rejects = state_dir.worker_rejects(&worker_id);
    }
    let tail = match a.tail {
        false => None,
        true => Some(FleetTailOptions {
            max_shards: max_units,
            exit_when_idle: a
                .exit_when_idle
                .map(|s| seconds("--exit-when-idle", s))
                .transpose()?,
            poll: tail_options(&state_dir).poll_interval,
            rejects: state_dir.worker_tail_rejects(&worker_id),
            markers: state_dir.markers(),
        }),
    };
    let options = WorkerOptions {
        backfill,
        fleet,
        worker_id,
        lease,
        max_units,
        tail,
    };
    Ok(Command::Worker(Planned { plan, options }))
}

/// One process of a fleet: its id, its lease duration, its units at most.
fn fleet_process(
    a: &cli::FleetProcessArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<(String, Duration, usize)> {
    let lease = seconds("--lease-seconds", a.lease_seconds)?;
    if lease < Duration::from_secs(1) {
        return Err(InputError("--lease-seconds: give 1 second or more".into()).into());
    }
    if a.max_units == 0 {
        return Err(InputError("--max-units: give 1 or more".into()).into());
    }
    let worker_id = match &a.worker_id {
        Some(id) if !id.is_empty() && !id.contains(['#', ',', '/']) => id.clone(),
        Some(id) => {
            return Err(InputError(format!(
                "--worker-id `{id}`: give a non-empty id without #, comma or /"
            ))
            .into());
        }
        None => default_worker_id(env),
    };
    Ok((worker_id, lease, a.max_units))
}

/// `$HOSTNAME` (a pod's name under Kubernetes), the process id, and a
/// suffix from the clock: a restarted worker is a new worker.
fn default_worker_id(env: &dyn Fn(&str) -> Option<String>) -> String {
    let host: String = env("HOSTNAME")
        .unwrap_or_else(|| "worker".into())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}-{}-{:04x}", std::process::id(), nanos & 0xffff)
}

/// The plan must load: controlling a migration of a broken plan is a mistake.
fn control(a: &cli::ControlArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let paused = if a.pause {
        Some(true)
    } else if a.resume {
        Some(false)
    } else {
        None
    };
    let options = ControlChange {
        state_dir: state_dir(&a.plan, &a.state),
        paused,
        read_rate: a.read_rate,
        write_rate: a.write_rate,
    };
    Ok(Command::Control(Planned { plan, options }))
}

fn demo(a: cli::DemoArgs, aws: &AwsArgs, env: &dyn Fn(&str) -> Option<String>) -> Command {
    let analyze = AnalyzeOptions {
        // The demo's point is the hot key under application load.
        app_write_rate: a.report.app_write_rate.or(Some(demo::DEMO_APP_WRITE_RATE)),
        ..analyze_options(&a.report)
    };
    Command::Demo(DemoOptions {
        items: a.items,
        moto_server: a.moto_server,
        endpoint_url: aws
            .endpoint_url
            .clone()
            .or_else(|| demo::endpoint_from_env(env)),
        analyze,
        writer_rate: a.writer_rate,
    })
}

fn iam_policy(a: &cli::IamPolicyArgs, aws: &AwsArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    let mut commands = Vec::new();
    for c in &a.command {
        use PolicyCommand as P;
        match c {
            PolicyCommandArg::Analyze => commands.push(P::Analyze),
            PolicyCommandArg::Backfill => commands.push(P::Backfill),
            PolicyCommandArg::Tail => commands.push(P::Tail),
            PolicyCommandArg::Verify => commands.push(P::Verify),
            PolicyCommandArg::Drain => commands.push(P::Drain),
            PolicyCommandArg::Cutover => commands.push(P::Cutover),
            PolicyCommandArg::Query => commands.push(P::Query),
            PolicyCommandArg::Reverse => commands.push(P::Reverse),
            PolicyCommandArg::Rollback => commands.push(P::Rollback),
            PolicyCommandArg::Worker => commands.push(P::Worker),
            PolicyCommandArg::Loadtest => commands.push(P::Loadtest),
            PolicyCommandArg::All => commands.extend(P::MIGRATION),
        }
    }
    if let Some(acct) = &a.account
        && (acct.len() != 12 || !acct.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(InputError(format!("--account {acct}: an AWS account id is 12 digits")).into());
    }
    let export = a
        .export
        .as_deref()
        .map(ExportLocation::parse)
        .transpose()
        .map_err(|e| InputError(e.to_string()))?;
    let import = match a.via_import.as_deref().map(ExportLocation::parse) {
        None => None,
        Some(Ok(loc @ ExportLocation::S3 { .. })) => Some(loc),
        Some(Ok(ExportLocation::Local(p))) => {
            return Err(InputError(format!(
                "--via-import {}: give an s3://bucket/prefix (DynamoDB imports from S3)",
                p.display()
            ))
            .into());
        }
        Some(Err(e)) => return Err(InputError(e.to_string()).into()),
    };
    let control_table = match &a.fleet {
        Some(url) => Some(fleet_ref(url, &plan)?.table),
        None if commands.contains(&PolicyCommand::Worker) => {
            return Err(InputError(
                "--command worker: give the fleet's --state dynamodb://TABLE[/MIGRATION]".into(),
            )
            .into());
        }
        None => None,
    };
    let options = PolicyOptions {
        commands,
        export,
        import,
        region: aws.region.clone(),
        account: a.account.clone(),
        control_table,
    };
    Ok(Command::IamPolicy(Planned { plan, options }))
}

#[cfg(test)]
mod tests;
