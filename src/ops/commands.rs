//! Dispatch: each command turns its arguments into options, runs, and prints
//! its result — as text, or as JSON with `--json`. Notes about how the AWS
//! endpoints were chosen are printed here, once, on stderr.

use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::ops::cli::{AwsArgs, Cli, Command, InputError, PolicyCommandArg, ReportArgs, exit};
use crate::ops::progress::{self, ProgressMode};
use crate::ops::redact::{PlanRedactor, Redactor};
use crate::phase::analyze::{self, AnalyzeOptions, ScanSettings};
use crate::phase::backfill::{self, BackfillOptions};
use crate::phase::tail::{self, TailOptions};
use crate::phase::verify::{self, VerifyOptions};
use crate::state::StateDir;
use crate::state::control::{self, ControlFile, PauseAck};
use crate::state::rejects::RejectsFile;
use crate::{
    ops::demo, ops::iam, phase::barrier, phase::check, phase::cutover, phase::lifecycle,
    state::snapshot,
};

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

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Long-running commands stream JSON progress events with `--json`.
fn stream_mode(quiet: bool, json: bool) -> ProgressMode {
    match (quiet, json) {
        (true, _) => ProgressMode::Quiet,
        (false, true) => ProgressMode::Json,
        (false, false) => ProgressMode::Auto,
    }
}

/// The last line of a `--json` event stream: the report, marked `"event": "done"`.
fn print_done<T: serde::Serialize>(report: &T) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(report)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("event".into(), "done".into());
    }
    println!("{v}");
    Ok(())
}

/// `--state-dir`, or the plan's default.
fn state_dir_of(plan: &std::path::Path, s: &crate::ops::cli::StateArgs) -> StateDir {
    s.state_dir
        .clone()
        .map_or_else(|| StateDir::for_plan(plan), StateDir::new)
}

fn backfill_options(
    c: &crate::ops::cli::CopyArgs,
    state_dir: StateDir,
    undo: bool,
    stop: CancellationToken,
) -> BackfillOptions {
    BackfillOptions {
        rejects: c.rejects.clone().unwrap_or_else(|| {
            if undo {
                state_dir.undo_rejects()
            } else {
                state_dir.rejects()
            }
        }),
        state_dir,
        segments: c.scan.segments,
        page_limit: c.scan.page_size,
        read_rate: c.scan.read_rate,
        write_rate: c.write_rate,
        key_write_rate: c.key_write_rate,
        concurrency: c.concurrency,
        max_retries: 10,
        from_export: c.from_export.clone(),
        export_files_in_parallel: c.export_parallel,
        undo,
        stop,
    }
}

fn tail_options(
    state_dir: &StateDir,
    rejects: Option<std::path::PathBuf>,
    exit_when_idle: Option<std::time::Duration>,
    write_rate: Option<f64>,
    stop: &CancellationToken,
) -> TailOptions {
    TailOptions {
        rejects: rejects.unwrap_or_else(|| state_dir.tail_rejects()),
        state_dir: state_dir.clone(),
        exit_when_idle,
        write_rate,
        poll_interval: std::time::Duration::from_millis(250),
        stop: stop.clone(),
    }
}

/// The SDK clients; and, once per command, what the operator should know
/// about the endpoints they use (a note, so `-q` silences it).
async fn connect(aws: &AwsArgs, quiet: bool) -> anyhow::Result<Clients> {
    let clients = Clients::connect(&aws.options()).await?;
    if !quiet {
        for note in &clients.endpoints.notes {
            eprintln!("note: {note}");
        }
    }
    Ok(clients)
}

fn secs(s: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(s.max(0.0))
}

/// Run one command; the result is the process exit code.
/// `stop` is cancelled on Ctrl-C or SIGTERM: the long-running commands
/// finish the work in flight, checkpoint, and return `Stopped`.
pub async fn run(cli: Cli, stop: CancellationToken) -> anyhow::Result<i32> {
    let quiet = cli.quiet;
    let redactor = Redactor {
        show: cli.show_keys,
    };
    let mode = |json: bool| {
        if quiet || json {
            ProgressMode::Quiet
        } else {
            ProgressMode::Auto
        }
    };
    let undo = matches!(cli.command, Command::Undo(_));
    match cli.command {
        Command::Check(a) => {
            let plan = Plan::load(&a.plan)?;
            let mut report = check::run(&plan, a.sample.as_deref())?;
            PlanRedactor::new(&plan, redactor).check(&mut report);
            if a.json {
                print_json(&report)?;
            } else {
                print!("{}", check::render(&plan, &report));
            }
            // Sample lines that are not items are bad input; rejects are the plan working.
            Ok(if report.unreadable > 0 {
                exit::BAD_INPUT
            } else {
                exit::OK
            })
        }
        Command::Analyze(a) => {
            let plan = Plan::load(&a.plan)?;
            let clients = connect(&cli.aws, quiet).await?;
            let rejects = a.rejects.as_deref().map(RejectsFile::open).transpose()?;
            let progress = progress::new(mode(a.json));
            let settings = ScanSettings {
                segments: a.scan.segments,
                read_rate: a.scan.read_rate,
                page_limit: a.scan.page_size,
            };
            let mut report = analyze::run(
                &clients,
                &plan,
                &settings,
                analyze_options(&a.report),
                rejects,
                &progress,
            )
            .await?;
            PlanRedactor::new(&plan, redactor).analyze(&mut report);
            if a.json {
                print_json(&report)?;
            } else {
                print!("{}", analyze::render::render(&report));
            }
            Ok(exit::OK)
        }
        Command::Backfill(a) | Command::Undo(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            let opts = backfill_options(&a.copy, state_dir, undo, stop.clone());
            let clients = connect(&cli.aws, quiet).await?;
            let progress = progress::new(stream_mode(quiet, a.json));
            let report = backfill::run(&clients, &plan, &opts, &progress).await?;
            if a.json {
                print_done(&report)?;
            } else {
                let t = &report.totals;
                println!(
                    "{} {} → {}: done. {} scanned = {} written + {} rejected + {} skipped{}",
                    if undo { "undo" } else { "backfill" },
                    report.source_table,
                    report.target_table,
                    t.scanned,
                    t.written,
                    t.rejected,
                    t.skipped,
                    if report.resumed {
                        format!(" (this run: {} scanned)", report.this_run.scanned)
                    } else {
                        String::new()
                    }
                );
                if t.rejected > 0 {
                    println!(
                        "  rejects ({} collisions) are in {}",
                        t.collisions, report.rejects_file
                    );
                }
                println!(
                    "  {:.0} RCU, {:.0} WCU consumed in {:.1} s; {} write and {} read throttles {:?}",
                    report.consumed_rcu,
                    report.consumed_wcu,
                    report.elapsed_seconds,
                    report.throttles.write_throttles,
                    report.throttles.read_throttles,
                    report.throttles.reasons
                );
            }
            Ok(exit::OK)
        }
        Command::Tail(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            let opts = tail_options(
                &state_dir,
                a.rejects.clone(),
                a.exit_when_idle.map(secs),
                a.write_rate,
                &stop,
            );
            let clients = connect(&cli.aws, quiet).await?;
            let progress = progress::new(stream_mode(quiet, a.json));
            let report = tail::run(&clients, &plan, &opts, &progress).await?;
            if a.json {
                print_done(&report)?;
            } else {
                println!(
                    "tail: {} records ({} buffered until the backfill finished): {} puts, {} deletes, {} in-place updates, {} rejected; last lag {:.1} s",
                    report.records,
                    report.buffered,
                    report.puts,
                    report.deletes,
                    report.updates,
                    report.rejected,
                    report.last_lag_seconds
                );
            }
            Ok(exit::OK)
        }
        Command::Verify(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            if let Some(p) = a.sample
                && !(p > 0.0 && p <= 100.0)
            {
                return Err(InputError(format!(
                    "--sample {p}: give a percentage above 0, at most 100"
                ))
                .into());
            }
            if !(a.recheck_timeout >= 0.0 && a.recheck_timeout.is_finite()) {
                return Err(InputError("--recheck-timeout: give seconds, 0 or more".into()).into());
            }
            let opts = VerifyOptions {
                state_dir,
                segments: a.scan.segments,
                page_limit: a.scan.page_size,
                read_rate: a.scan.read_rate,
                target_read_rate: a.target_read_rate,
                write_rate: a.write_rate,
                recheck_timeout: std::time::Duration::from_secs_f64(a.recheck_timeout),
                stale_after: std::time::Duration::from_secs(30),
                restart: a.restart,
                repair: a.repair,
                sample: a.sample,
                max_retries: 10,
                stop: stop.clone(),
            };
            let clients = connect(&cli.aws, quiet).await?;
            let progress = progress::new(stream_mode(quiet, a.json));
            if plan.mode == crate::core::plan::Mode::InPlace {
                let report =
                    crate::phase::verify::inplace::run(&clients, &plan, &opts, &progress).await?;
                if a.json {
                    print_done(&report)?;
                } else {
                    let c = &report.result.counts;
                    println!(
                        "verify in place `{}`: {} scanned = {} matched ({} came right during the verify) + {} different + {} unconfirmed; {}",
                        report.result.source_table,
                        c.scanned,
                        c.matched,
                        report.resolved,
                        c.different,
                        c.unconfirmed,
                        if report.result.clean {
                            "clean".to_string()
                        } else {
                            format!("DIFFERENCES in {}", report.mismatches_file)
                        }
                    );
                    for n in &report.notes {
                        println!("note: {n}");
                    }
                }
                return Ok(if report.result.clean {
                    exit::OK
                } else {
                    exit::DIFFERENCES
                });
            }
            let mut report = verify::run(&clients, &plan, &opts, &progress).await?;
            PlanRedactor::new(&plan, redactor).verify(&mut report);
            if a.json {
                print_done(&report)?;
            } else {
                print!("{}", verify::render(&report));
            }
            Ok(if report.ok() {
                exit::OK
            } else {
                exit::DIFFERENCES
            })
        }
        Command::Run(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            let analyze = (!a.skip_analyze).then(|| {
                (
                    ScanSettings {
                        segments: a.copy.scan.segments,
                        read_rate: a.copy.scan.read_rate,
                        page_limit: a.copy.scan.page_size,
                    },
                    AnalyzeOptions {
                        app_write_rate: Some(a.app_write_rate),
                        ..AnalyzeOptions::default()
                    },
                )
            });
            let opts = lifecycle::RunOptions {
                analyze,
                allow_hot_keys: a.allow_hot_keys,
                backfill: backfill_options(&a.copy, state_dir.clone(), false, stop.clone()),
                tail: tail_options(&state_dir, None, None, None, &stop),
                verify: VerifyOptions {
                    state_dir: state_dir.clone(),
                    segments: a.copy.scan.segments,
                    page_limit: a.copy.scan.page_size,
                    read_rate: a.copy.scan.read_rate,
                    target_read_rate: a.copy.scan.read_rate,
                    write_rate: 0.0,
                    recheck_timeout: secs(a.recheck_timeout),
                    stale_after: std::time::Duration::from_secs(30),
                    restart: false,
                    repair: false,
                    sample: None,
                    max_retries: 10,
                    stop: stop.clone(),
                },
                drain_timeout: secs(a.drain_timeout),
                exit_when_ready: a.exit_when_ready,
                ready: None,
                stop: stop.clone(),
                state_dir,
            };
            let clients = connect(&cli.aws, quiet).await?;
            let progress = progress::new(stream_mode(quiet, a.json));
            let report = lifecycle::run(&clients, &plan, &opts, &progress).await?;
            if a.json {
                print_done(&report)?;
            } else {
                match &report.blocked {
                    Some(why) => println!("stopped: {why}"),
                    None => println!("phase: {:?}", report.phase),
                }
            }
            Ok(if report.blocked.is_some() {
                exit::DIFFERENCES
            } else {
                exit::OK
            })
        }
        Command::Drain(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            if !barrier::tail_has_run(&state_dir) {
                eprintln!(
                    "note: no tail has published status under {} yet; waiting for one to start",
                    state_dir.display()
                );
            }
            let clients = connect(&cli.aws, quiet).await?;
            let opts = barrier::DrainOptions {
                state_dir,
                timeout: std::time::Duration::from_secs_f64(a.timeout.max(0.0)),
            };
            let report = barrier::drain(&clients, &plan, &opts).await?;
            if a.json {
                print_json(&report)?;
            } else if report.complete {
                println!(
                    "drained: the tail applied every source write made before barrier {} ({:.1} s)",
                    report.barrier, report.waited_seconds
                );
            } else {
                println!(
                    "not drained: the tail did not report barrier {} within {:.0} s — is `rekey tail` running and keeping up?",
                    report.barrier, report.waited_seconds
                );
            }
            Ok(if report.complete {
                exit::OK
            } else {
                exit::GATE
            })
        }
        Command::Cutover(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            let opts = cutover::CutoverOptions {
                postpone_file: a
                    .postpone_file
                    .clone()
                    .unwrap_or_else(|| state_dir.postpone()),
                state_dir,
                max_lag: a.max_lag,
                max_verify_age: secs(a.max_verify_age),
                accept_rejects: a.accept_rejects,
                wait: secs(a.wait),
                drain_timeout: secs(a.drain_timeout),
            };
            let clients = connect(&cli.aws, quiet).await?;
            let progress = progress::new(mode(a.json));
            let report = cutover::cutover(&clients, &plan, &opts, &progress).await?;
            if a.json {
                print_json(&report)?;
            } else {
                for g in &report.gates {
                    println!(
                        "[{}] {}: {}",
                        if g.ok { "ok" } else { "  " },
                        g.name,
                        g.detail
                    );
                }
                match (&report.record, &report.blocked) {
                    (Some(r), _) => {
                        println!(
                            "\nCut over at {} (drain barrier {}): every write to `{}` until then is in `{}`.\n",
                            crate::state::snapshot::show_time(&r.at),
                            r.barrier,
                            r.source_table,
                            r.target_table
                        );
                        println!("{}", cutover::next_steps(&plan, &a.plan));
                    }
                    (None, Some(why)) => println!("\nnot cut over: {why}"),
                    (None, None) => {}
                }
            }
            Ok(if report.cut_over {
                exit::OK
            } else {
                exit::GATE
            })
        }
        Command::Finish(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = state_dir_of(&a.plan, &a.state);
            let clients = connect(&cli.aws, quiet).await?;
            let report =
                cutover::finish(&clients, &plan, &state_dir, secs(a.drain_timeout)).await?;
            if a.json {
                print_json(&report)?;
            } else if report.finished {
                println!(
                    "finished: the last writes to `{}` are in `{}`; the tail stops now. `{}` is kept.",
                    plan.source_table, plan.target_table, plan.source_table
                );
            } else {
                println!(
                    "not finished: the tail did not report drain barrier {} in time — is it running?",
                    report.barrier
                );
            }
            Ok(if report.finished {
                exit::OK
            } else {
                exit::GATE
            })
        }
        Command::Status(a) => {
            // The plan must load, and the state directory is the plan's.
            Plan::load(&a.plan)?;
            let report = snapshot::gather(&state_dir_of(&a.plan, &a.state))?;
            if a.json {
                print_json(&report)?;
            } else {
                print!("{}", crate::ops::status::render(&report));
            }
            Ok(exit::OK)
        }
        Command::Control(a) => {
            // The plan must load: controlling a migration of a broken plan is a mistake.
            Plan::load(&a.plan)?;
            let dir = state_dir_of(&a.plan, &a.state);
            let mut file = ControlFile::read(&dir)?;
            if a.pause {
                file.paused = true;
            }
            if a.resume {
                file.paused = false;
            }
            if a.read_rate.is_some() {
                file.read_rate = a.read_rate;
            }
            if a.write_rate.is_some() {
                file.write_rate = a.write_rate;
            }
            let asked_at = chrono::Utc::now();
            file.write(&dir)?;
            // A pause has taken effect when the backfill says so: paused,
            // with no write in flight.
            let ack = match a.pause {
                true => Some(
                    control::wait_for_pause(&dir, asked_at, std::time::Duration::from_secs(60))
                        .await?,
                ),
                false => None,
            };
            if a.json {
                print_json(&file)?;
            } else {
                println!(
                    "{}: {}",
                    ControlFile::path(&dir).display(),
                    serde_json::to_string(&file)?
                );
                match &ack {
                    Some(PauseAck::Quiet { pid }) => {
                        println!("paused: the backfill (pid {pid}) has no write in flight")
                    }
                    Some(PauseAck::NoBackfill) => {
                        println!("no backfill is running; one started now starts paused")
                    }
                    _ => {}
                }
            }
            if let Some(PauseAck::TimedOut { pid }) = ack {
                anyhow::bail!(crate::phase::error::GateNotMet(format!(
                    "the backfill (pid {pid}) did not report the pause within 60 s (writes still in flight?)"
                )));
            }
            Ok(exit::OK)
        }
        Command::Demo(a) => {
            let progress = progress::new(mode(a.json));
            let opts = demo::DemoOptions {
                items: a.items,
                moto_server: a.moto_server,
                endpoint_url: cli
                    .aws
                    .endpoint_url
                    .clone()
                    .or_else(demo::endpoint_from_env),
                analyze: AnalyzeOptions {
                    // The demo's point is the hot key under application load.
                    app_write_rate: a.report.app_write_rate.or(Some(demo::DEMO_APP_WRITE_RATE)),
                    ..analyze_options(&a.report)
                },
                writer_rate: a.writer_rate,
                show_keys: cli.show_keys,
            };
            let mut demo = demo::Demo::prepare(&opts, &progress).await?;
            PlanRedactor::new(&demo.plan, redactor).analyze(&mut demo.report);
            if !a.json {
                println!("Plan ({}):\n", demo.plan.path.display());
                for line in demo::DEMO_PLAN
                    .lines()
                    .filter(|l| !l.starts_with('#') && !l.is_empty())
                {
                    println!("    {line}");
                }
                println!();
                print!("{}", analyze::render::short(&demo.report));
                println!();
            }
            let summary = demo.migrate(&progress).await?;
            if a.json {
                print_json(&summary)?;
            } else {
                print!("{}", demo::render(&summary));
            }
            Ok(if summary.completed {
                exit::OK
            } else {
                exit::DIFFERENCES
            })
        }
        Command::IamPolicy(a) => {
            let plan = Plan::load(&a.plan)?;
            let mut commands = Vec::new();
            for c in &a.command {
                use iam::PolicyCommand as P;
                match c {
                    PolicyCommandArg::Analyze => commands.push(P::Analyze),
                    PolicyCommandArg::Backfill => commands.push(P::Backfill),
                    PolicyCommandArg::Tail => commands.push(P::Tail),
                    PolicyCommandArg::Verify => commands.push(P::Verify),
                    PolicyCommandArg::Drain => commands.push(P::Drain),
                    PolicyCommandArg::Cutover => commands.push(P::Cutover),
                    PolicyCommandArg::All => commands.extend(P::MIGRATION),
                }
            }
            if let Some(acct) = &a.account
                && (acct.len() != 12 || !acct.bytes().all(|b| b.is_ascii_digit()))
            {
                anyhow::bail!(InputError(format!(
                    "--account {acct}: an AWS account id is 12 digits"
                )));
            }
            let export = a
                .export
                .as_deref()
                .map(crate::aws::export::ExportLocation::parse)
                .transpose()
                .map_err(|e| InputError(e.to_string()))?;
            let opts = iam::PolicyOptions {
                commands,
                export,
                region: cli.aws.region.clone(),
                account: a.account.clone(),
            };
            if !quiet && (opts.region.is_none() || opts.account.is_none()) {
                eprintln!(
                    "note: `*` stands for the region and account in the ARNs: pass --region and --account to pin them"
                );
            }
            print_json(&iam::document(&plan, &opts))?;
            Ok(exit::OK)
        }
    }
}
