//! Dispatch: each command turns its arguments into options, runs, and prints
//! its result — as text, or as JSON with `--json`.

use crate::analyze::{self, AnalyzeOptions, ScanSettings};
use crate::aws::Clients;
use crate::backfill::{self, BackfillOptions};
use crate::cli::{Cli, Command, InputError, PolicyCommandArg, ReportArgs, exit};
use crate::control::ControlFile;
use crate::plan::Plan;
use crate::progress::{Progress, ProgressMode};
use crate::redact::{PlanRedactor, Redactor};
use crate::rejects::RejectsFile;
use crate::tail::{self, TailOptions};
use crate::{barrier, check, demo, iam, state};

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

/// Run one command; the result is the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
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
            let clients = Clients::connect(&cli.aws.options()).await?;
            let rejects = a.rejects.as_deref().map(RejectsFile::open).transpose()?;
            let progress = Progress::new(mode(a.json));
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
            let state_dir = a
                .state
                .state_dir
                .clone()
                .unwrap_or_else(|| state::default_dir(&a.plan));
            let opts = BackfillOptions {
                rejects: a.rejects.clone().unwrap_or_else(|| {
                    state_dir.join(if undo {
                        "undo-rejects.jsonl"
                    } else {
                        "rejects.jsonl"
                    })
                }),
                state_dir,
                segments: a.scan.segments,
                page_limit: a.scan.page_size,
                read_rate: a.scan.read_rate,
                write_rate: a.write_rate,
                key_write_rate: a.key_write_rate,
                concurrency: a.concurrency,
                max_retries: 10,
                from_export: a.from_export.clone(),
                export_files_in_parallel: a.export_parallel,
                undo,
            };
            let clients = Clients::connect(&cli.aws.options()).await?;
            let progress = Progress::new(stream_mode(quiet, a.json));
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
            let state_dir = a
                .state
                .state_dir
                .clone()
                .unwrap_or_else(|| state::default_dir(&a.plan));
            let opts = TailOptions {
                rejects: a
                    .rejects
                    .clone()
                    .unwrap_or_else(|| state_dir.join("tail-rejects.jsonl")),
                state_dir,
                exit_when_idle: a.exit_when_idle.map(std::time::Duration::from_secs_f64),
                write_rate: a.write_rate,
                poll_interval: std::time::Duration::from_millis(250),
            };
            let clients = Clients::connect(&cli.aws.options()).await?;
            let progress = Progress::new(stream_mode(quiet, a.json));
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
        Command::Drain(a) => {
            let plan = Plan::load(&a.plan)?;
            let state_dir = a
                .state
                .state_dir
                .clone()
                .unwrap_or_else(|| state::default_dir(&a.plan));
            if !barrier::tail_has_run(&state_dir) {
                eprintln!(
                    "note: no tail has published status under {} yet; waiting for one to start",
                    state_dir.display()
                );
            }
            let clients = Clients::connect(&cli.aws.options()).await?;
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
        Command::Control(a) => {
            // The plan must load: controlling a migration of a broken plan is a mistake.
            Plan::load(&a.plan)?;
            let dir = a
                .state
                .state_dir
                .clone()
                .unwrap_or_else(|| state::default_dir(&a.plan));
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
            file.write(&dir)?;
            println!(
                "{}: {}",
                ControlFile::path(&dir).display(),
                serde_json::to_string(&file)?
            );
            Ok(exit::OK)
        }
        Command::Demo(a) => {
            let progress = Progress::new(mode(a.json));
            let opts = demo::DemoOptions {
                items: a.items,
                dynamodb_local: a.dynamodb_local,
                endpoint_url: cli.aws.endpoint_url.clone(),
                analyze: AnalyzeOptions {
                    // The demo's point is the hot key under application load.
                    app_write_rate: a.report.app_write_rate.or(Some(demo::DEMO_APP_WRITE_RATE)),
                    ..analyze_options(&a.report)
                },
            };
            let mut run = demo::run(&opts, &progress).await?;
            PlanRedactor::new(&run.plan, redactor).analyze(&mut run.report);
            if a.json {
                print_json(&run.report)?;
            } else {
                println!("Plan ({}):\n", run.plan.path.display());
                for line in demo::DEMO_PLAN
                    .lines()
                    .filter(|l| !l.starts_with('#') && !l.is_empty())
                {
                    println!("    {line}");
                }
                println!();
                print!("{}", analyze::render::render(&run.report));
            }
            Ok(exit::OK)
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
                .map(crate::export::ExportLocation::parse)
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
