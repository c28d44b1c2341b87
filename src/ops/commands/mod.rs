//! One small function per command: connect (once, with the endpoint notes),
//! call the phase, redact, print (text, or JSON with `--json`) through
//! [`out`](crate::ops::out), and return the exit code. Every argument was
//! checked and every default applied by [`Config`] before any of this runs.
//!
//! * `offline` — `check`, `status`, `control`, `iam-policy`, `completions`,
//!   `man`: no AWS.
//! * `analyze` — `analyze`.
//! * `suggest` — `suggest`.
//! * `copy` — `backfill` (and `undo`), `tail`.
//! * `fleet` — `worker`, `tail --fleet`, `status --state dynamodb://…`.
//! * `verify` — `verify`, in a new table or in place.
//! * `query` — `query`, the read path of the new design.
//! * `run` — `run`, the whole lifecycle.
//! * `switch` — `drain`, `cutover`, `finish`.
//! * `demo` — `demo`.
//! * `loadtest` — `loadtest`: the cost gate against AWS, the run, the report.
//!
//! The process's stop is handed in ([`Shutdown`]), and [`run`]'s dispatch gives its
//! token ([`Shutdown::stop_cleanly`]) to exactly the commands that stop
//! cleanly: the ones whose phases take it as a parameter. Taking it is what
//! makes a command stop cleanly on Ctrl-C or SIGTERM, and a phase that needs
//! it does not compile without it; every other command ends at the signal
//! (`ops::shutdown`).

mod analyze;
mod copy;
mod demo;
mod fleet;
mod loadtest;
mod offline;
mod query;
mod run;
mod suggest;
mod switch;
mod verify;

use std::io;

use serde::Serialize;

use crate::aws::Clients;
use crate::ops::config::{Command, Common, Config, Format};
use crate::ops::shutdown::Shutdown;
use crate::ops::{metrics, out};
use crate::state::StateDir;

/// Run one command; the result is the process exit code. Its metrics, if
/// asked for, start before its work and end when it returns.
pub async fn run(config: Config, shutdown: &Shutdown) -> anyhow::Result<i32> {
    let Config { command, common } = config;
    let metrics = match common.metrics {
        Some(sink) => Some(
            metrics::start(metrics::Source {
                sink,
                command: command.name(),
                table: command
                    .plan()
                    .map(|p| p.source_table.clone())
                    .unwrap_or_default(),
                state_dir: local_state(&command).cloned(),
            })
            .await?,
        ),
        None => None,
    };
    if let Some(addr) = metrics.as_ref().and_then(|m| m.address)
        && !common.output.quiet
    {
        crate::ops::log::note(&format!("metrics on http://{addr}/metrics"));
    }
    let result = dispatch(command, &common, shutdown).await;
    if let Some(m) = metrics {
        m.finish().await;
    }
    result
}

/// The state directory whose snapshots a command's metrics read: none for
/// a fleet's worker and verify, whose state is the control table.
fn local_state(command: &Command) -> Option<&StateDir> {
    match command {
        Command::Backfill(p) => Some(&p.options.state_dir),
        Command::Tail(p) | Command::TailFleet { tail: p, .. } => Some(&p.options.state_dir),
        Command::Verify(p) => Some(&p.options.state_dir),
        Command::Run(p) => Some(&p.options.state_dir),
        _ => None,
    }
}

/// The command itself. The commands handed `shutdown.stop_cleanly()` are
/// the ones that stop cleanly: this match is the only list of them.
async fn dispatch(command: Command, c: &Common, shutdown: &Shutdown) -> anyhow::Result<i32> {
    let stop = || shutdown.stop_cleanly();
    match command {
        Command::Check(cmd) => offline::check(c, cmd),
        Command::Query(cmd) => query::query(c, cmd).await,
        Command::Status(cmd) => offline::status(c, cmd),
        Command::Control(cmd) => offline::control(c, cmd).await,
        Command::IamPolicy(cmd) => offline::iam_policy(c, cmd),
        Command::Completions(shell) => offline::completions(shell),
        Command::Man => offline::man(),
        Command::Analyze(cmd) => analyze::analyze(c, cmd).await,
        Command::Suggest(cmd) => suggest::suggest(c, cmd).await,
        Command::Backfill(cmd) => copy::backfill(c, cmd, stop()).await,
        Command::Tail(cmd) => copy::tail(c, cmd, stop()).await,
        Command::TailFleet { tail, fleet } => fleet::tail_fleet(c, tail, fleet, stop()).await,
        Command::Worker(cmd) => fleet::worker(c, cmd, stop()).await,
        Command::FleetStatus(cmd) => fleet::status(c, cmd).await,
        Command::Verify(cmd) => verify::verify(c, cmd, stop()).await,
        Command::FleetVerify(cmd) => verify::fleet_verify(c, cmd, stop()).await,
        Command::Run(cmd) => run::run(c, cmd, stop()).await,
        Command::Drain(cmd) => switch::drain(c, cmd).await,
        Command::Cutover(cmd) => switch::cutover(c, cmd).await,
        Command::Rollback(cmd) => switch::rollback(c, cmd).await,
        Command::Finish(cmd) => switch::finish(c, cmd).await,
        Command::Demo(cmd) => demo::demo(c, cmd).await,
        Command::Loadtest(cmd) => loadtest::loadtest(c, cmd, stop()).await,
    }
}

/// The SDK clients; and, once per command, what the operator should know
/// about the endpoints they use (a note, so `-q` silences it).
async fn connect(c: &Common) -> anyhow::Result<Clients> {
    let clients = Clients::connect(&c.aws).await?;
    if !c.output.quiet {
        for note in &clients.endpoints.notes {
            crate::ops::log::note(note);
        }
    }
    Ok(clients)
}

/// The report as a JSON document (`--json`), or as `text` renders it.
fn print<T: Serialize>(c: &Common, report: &T, text: impl FnOnce(&T) -> String) -> io::Result<()> {
    match c.output.format {
        Format::Json => out::json(report),
        Format::Text => out::text(&text(report)),
    }
}

/// The same for a long-running command, whose `--json` output is a stream of
/// events: the report is its last line (`"event": "done"`).
fn print_done<T: Serialize>(
    c: &Common,
    report: &T,
    text: impl FnOnce(&T) -> String,
) -> io::Result<()> {
    match c.output.format {
        Format::Json => out::json_done(report),
        Format::Text => out::text(&text(report)),
    }
}
