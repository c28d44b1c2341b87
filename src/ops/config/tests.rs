//! The conversion, data-driven: argument lists → the options each command
//! runs with (compared whole, as `Debug` shows them), the output mode, or the
//! error message. No AWS; the environment is a fixed table.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser as _;

use super::*;
use crate::aws::rate::Rate;
use crate::ops::cli::{exit, exit_code};

const PLAN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/plans/tenant-day-shard.toml");
/// `PLAN`'s default state directory.
const STATE: &str = ".rekey/tenant-day-shard";
const ENV_ENDPOINT: &str = "http://from-the-environment:8000";

fn env(name: &str) -> Option<String> {
    (name == "AWS_ENDPOINT_URL").then(|| ENV_ENDPOINT.to_string())
}

/// `rekey ARGS` parsed and converted.
fn convert(args: &[&str]) -> anyhow::Result<Config> {
    let cli = Cli::try_parse_from(std::iter::once("rekey").chain(args.iter().copied()))?;
    Config::from_args(cli, &env)
}

/// `line` split into arguments, `PLAN` standing for the plan's path.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .map(|w| if w == "PLAN" { PLAN } else { w })
        .collect()
}

/// The options a command runs with (its plan aside), as `Debug` shows them.
fn options(c: &Command) -> String {
    match c {
        Command::Check(p) => format!("{:?}", p.options),
        Command::Analyze(p) => format!("{:?}", p.options),
        Command::Backfill(p) => format!("{:?}", p.options),
        Command::Tail(p) => format!("{:?}", p.options),
        Command::TailFleet { tail, fleet } => format!("{:?} {fleet:?}", tail.options),
        Command::Worker(p) => format!("{:?}", p.options),
        Command::FleetStatus(p) => format!("{:?}", p.options),
        Command::Verify(p) => format!("{:?}", p.options),
        Command::FleetVerify(p) => format!("{:?}", p.options),
        Command::Run(p) => format!("{:?}", p.options),
        Command::Drain(p) => format!("{:?}", p.options),
        Command::Cutover(p) | Command::Rollback(p) => format!("{:?}", p.options),
        Command::Finish(p) => format!("{:?}", p.options),
        Command::Query(p) => format!("{:?}", p.options),
        Command::Status(p) => format!("{:?}", p.options),
        Command::Control(p) => format!("{:?}", p.options),
        Command::Demo(d) => format!("{d:?}"),
        Command::Suggest(s) => format!("{s:?}"),
        Command::IamPolicy(p) => format!("{:?}", p.options),
        Command::Completions(shell) => format!("{shell:?}"),
        Command::Man => "Man".into(),
    }
}

fn dbg<T: std::fmt::Debug>(v: T) -> String {
    format!("{v:?}")
}

fn state() -> StateDir {
    StateDir::new(STATE)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn rate(s: &str) -> Rate {
    s.parse().unwrap()
}

fn backfill_defaults() -> BackfillOptions {
    BackfillOptions {
        state_dir: state(),
        rejects: state().rejects(),
        segments: None,
        page_limit: None,
        read_rate: None,
        write_rate: Rate::Units(1000.0),
        key_write_rate: 300,
        concurrency: 32,
        max_retries: 10,
        from_export: None,
        export_files_in_parallel: 2,
        undo: false,
        via_import: None,
        import_object_bytes: 32 * 1024 * 1024,
        tail_in_process: false,
    }
}

fn tail_defaults() -> TailOptions {
    TailOptions {
        state_dir: state(),
        rejects: state().tail_rejects(),
        exit_when_idle: None,
        write_rate: None,
        poll_interval: Duration::from_millis(250),
        flow: crate::phase::tail::Flow::Forward,
    }
}

/// Verify as `rekey verify` runs it by default.
fn verify_defaults() -> VerifyOptions {
    VerifyOptions {
        state_dir: state(),
        segments: None,
        page_limit: None,
        read_rate: None,
        target_read_rate: None,
        write_rate: 1000.0,
        recheck_timeout: secs(120),
        stale_after: secs(30),
        restart: false,
        repair: false,
        sample: None,
        reverse: false,
        max_retries: 10,
    }
}

fn run_defaults() -> RunOptions {
    RunOptions {
        state_dir: state(),
        analyze: Some((
            ScanSettings {
                segments: None,
                read_rate: None,
                page_limit: None,
            },
            AnalyzeOptions {
                app_write_rate: Some(1000.0),
                ..AnalyzeOptions::default()
            },
        )),
        allow_hot_keys: false,
        backfill: backfill_defaults(),
        tail: tail_defaults(),
        // Verify inside `run`: no repair, the target read as the source is.
        verify: VerifyOptions {
            write_rate: 0.0,
            ..verify_defaults()
        },
        drain_timeout: secs(600),
        exit_when_ready: false,
        ready: None,
    }
}

fn cutover_defaults() -> CutoverOptions {
    CutoverOptions {
        state_dir: state(),
        max_lag: 5.0,
        max_verify_age: secs(3600),
        accept_rejects: false,
        postpone_file: state().postpone(),
        wait: secs(0),
        drain_timeout: secs(300),
        fleet: None,
    }
}

fn analyze_defaults() -> AnalyzeRun {
    AnalyzeRun {
        scan: ScanSettings {
            segments: None,
            read_rate: None,
            page_limit: None,
        },
        options: AnalyzeOptions::default(),
        rejects: None,
    }
}

fn demo_defaults() -> DemoOptions {
    DemoOptions {
        items: 10_000,
        moto_server: None,
        endpoint_url: Some(ENV_ENDPOINT.into()),
        analyze: AnalyzeOptions {
            app_write_rate: Some(demo::DEMO_APP_WRITE_RATE),
            ..AnalyzeOptions::default()
        },
        writer_rate: demo::DEMO_WRITER_RATE,
    }
}

/// Argument lists and the options their command runs with: the commands
/// that read the source and write the target.
fn copy_cases() -> Vec<(&'static str, String)> {
    vec![
        ("check PLAN", dbg(CheckOptions { sample: None })),
        (
            "check PLAN --sample s.jsonl",
            dbg(CheckOptions {
                sample: Some("s.jsonl".into()),
            }),
        ),
        ("analyze PLAN", dbg(analyze_defaults())),
        (
            "analyze PLAN --segments 8 --read-rate 25% --page-size 10 --write-rate 500 --app-write-rate 40 --top 3 --spill-dir /sp --spill-memory 0 --rejects r.jsonl",
            dbg(AnalyzeRun {
                scan: ScanSettings {
                    segments: Some(8),
                    read_rate: Some(rate("25%")),
                    page_limit: Some(10),
                },
                options: AnalyzeOptions {
                    top: 3,
                    backfill_write_rate: 500.0,
                    app_write_rate: Some(40.0),
                    // At least 1 MiB.
                    spill_memory_bytes: 1024 * 1024,
                    spill_dir: Some("/sp".into()),
                    ..AnalyzeOptions::default()
                },
                rejects: Some("r.jsonl".into()),
            }),
        ),
        ("backfill PLAN", dbg(backfill_defaults())),
        (
            "backfill PLAN --state-dir /s --segments 8 --read-rate 100 --page-size 50 --write-rate 25% --key-write-rate 200 --concurrency 3 --rejects r.jsonl --from-export s3://b/p --export-parallel 4",
            dbg(BackfillOptions {
                state_dir: StateDir::new("/s"),
                rejects: "r.jsonl".into(),
                segments: Some(8),
                page_limit: Some(50),
                read_rate: Some(Rate::Units(100.0)),
                write_rate: rate("25%"),
                key_write_rate: 200,
                concurrency: 3,
                from_export: Some("s3://b/p".into()),
                export_files_in_parallel: 4,
                ..backfill_defaults()
            }),
        ),
        (
            "backfill PLAN --via-import s3://b/imports/orders --import-object-size 512K",
            dbg(BackfillOptions {
                via_import: Some("s3://b/imports/orders".into()),
                import_object_bytes: 512 * 1024,
                ..backfill_defaults()
            }),
        ),
        // Undo keeps rejects of its own, in the state directory given.
        (
            "undo PLAN --state-dir /s",
            dbg(BackfillOptions {
                state_dir: StateDir::new("/s"),
                rejects: PathBuf::from("/s/undo-rejects.jsonl"),
                undo: true,
                ..backfill_defaults()
            }),
        ),
        ("tail PLAN", dbg(tail_defaults())),
        (
            "tail PLAN --exit-when-idle 2.5 --write-rate 50 --rejects t.jsonl",
            dbg(TailOptions {
                rejects: "t.jsonl".into(),
                exit_when_idle: Some(Duration::from_millis(2500)),
                write_rate: Some(50.0),
                ..tail_defaults()
            }),
        ),
        ("verify PLAN", dbg(verify_defaults())),
        (
            "verify PLAN --sample 100 --repair --restart --read-rate 40 --target-read-rate 10% --write-rate 10 --recheck-timeout 0",
            dbg(VerifyOptions {
                read_rate: Some(Rate::Units(40.0)),
                target_read_rate: Some(rate("10%")),
                write_rate: 10.0,
                recheck_timeout: secs(0),
                restart: true,
                repair: true,
                sample: Some(100.0),
                ..verify_defaults()
            }),
        ),
        (
            "verify PLAN --reverse",
            dbg(VerifyOptions {
                reverse: true,
                ..verify_defaults()
            }),
        ),
        ("run PLAN", dbg(run_defaults())),
        (
            "run PLAN --skip-analyze --allow-hot-keys --exit-when-ready --read-rate 50 --drain-timeout 5 --recheck-timeout 7",
            dbg(RunOptions {
                analyze: None,
                allow_hot_keys: true,
                exit_when_ready: true,
                drain_timeout: secs(5),
                backfill: BackfillOptions {
                    read_rate: Some(Rate::Units(50.0)),
                    ..backfill_defaults()
                },
                // Verify reads the target at the source's rate.
                verify: VerifyOptions {
                    read_rate: Some(Rate::Units(50.0)),
                    target_read_rate: Some(Rate::Units(50.0)),
                    write_rate: 0.0,
                    recheck_timeout: secs(7),
                    ..verify_defaults()
                },
                ..run_defaults()
            }),
        ),
    ]
}

/// The same for the commands that switch over, look, control, and the rest.
fn other_cases() -> Vec<(&'static str, String)> {
    vec![
        (
            "drain PLAN",
            dbg(DrainOptions {
                state_dir: state(),
                timeout: secs(300),
                flow: crate::phase::tail::Flow::Forward,
                fleet: None,
            }),
        ),
        (
            "drain PLAN --reverse",
            dbg(DrainOptions {
                state_dir: state(),
                timeout: secs(300),
                flow: crate::phase::tail::Flow::Reverse,
                fleet: None,
            }),
        ),
        ("cutover PLAN", dbg(cutover_defaults())),
        (
            "cutover PLAN --max-lag 1.5 --max-verify-age 60 --accept-rejects --postpone-file /p --wait 10 --drain-timeout 20",
            dbg(CutoverOptions {
                max_lag: 1.5,
                max_verify_age: secs(60),
                accept_rejects: true,
                postpone_file: "/p".into(),
                wait: secs(10),
                drain_timeout: secs(20),
                ..cutover_defaults()
            }),
        ),
        (
            "finish PLAN",
            dbg(FinishOptions {
                state_dir: state(),
                drain_timeout: secs(300),
                fleet: None,
            }),
        ),
        ("status PLAN", dbg(state())),
        ("status PLAN --state-dir /s", dbg(StateDir::new("/s"))),
        (
            "control PLAN --pause --write-rate 250",
            dbg(ControlChange {
                state_dir: state(),
                paused: Some(true),
                read_rate: None,
                write_rate: Some(250.0),
            }),
        ),
        (
            "control PLAN --resume --read-rate 9",
            dbg(ControlChange {
                state_dir: state(),
                paused: Some(false),
                read_rate: Some(9.0),
                write_rate: None,
            }),
        ),
        (
            "control PLAN",
            dbg(ControlChange {
                state_dir: state(),
                paused: None,
                read_rate: None,
                write_rate: None,
            }),
        ),
        // The endpoint from the environment, as for the other commands.
        ("demo", dbg(demo_defaults())),
        (
            "demo --items 5 --writer-rate 7 --endpoint-url http://given --app-write-rate 9 --moto-server /m --show-keys",
            dbg(DemoOptions {
                items: 5,
                moto_server: Some("/m".into()),
                endpoint_url: Some("http://given".into()),
                analyze: AnalyzeOptions {
                    app_write_rate: Some(9.0),
                    ..AnalyzeOptions::default()
                },
                writer_rate: 7.0,
            }),
        ),
        (
            "iam-policy PLAN",
            dbg(PolicyOptions {
                commands: PolicyCommand::MIGRATION.to_vec(),
                ..PolicyOptions::default()
            }),
        ),
        (
            "iam-policy PLAN --command analyze --command tail --export s3://b/p --account 123456789012 --region eu-west-1",
            dbg(PolicyOptions {
                commands: vec![PolicyCommand::Analyze, PolicyCommand::Tail],
                export: Some(ExportLocation::parse("s3://b/p").unwrap()),
                region: Some("eu-west-1".into()),
                account: Some("123456789012".into()),
                ..PolicyOptions::default()
            }),
        ),
        (
            "iam-policy PLAN --command backfill --via-import s3://b/i",
            dbg(PolicyOptions {
                commands: vec![PolicyCommand::Backfill],
                import: Some(ExportLocation::parse("s3://b/i").unwrap()),
                ..PolicyOptions::default()
            }),
        ),
    ]
}

#[test]
fn arguments_become_the_options_each_command_runs_with() {
    for (args, want) in copy_cases().into_iter().chain(other_cases()) {
        let config = convert(&words(args)).unwrap_or_else(|e| panic!("{args}: {e:#}"));
        assert_eq!(options(&config.command), want, "{args}");
    }
}

/// Argument lists and the error they give (clap's or the conversion's).
const ERROR_CASES: &[(&[&str], &str)] = &[
    (
        &["verify", PLAN, "--sample", "0"],
        "--sample 0: give a percentage above 0, at most 100",
    ),
    (
        &["verify", PLAN, "--sample", "100.5"],
        "--sample 100.5: give a percentage above 0, at most 100",
    ),
    (
        &["verify", PLAN, "--recheck-timeout=-1"],
        "--recheck-timeout: give seconds, 0 or more",
    ),
    // The same check for `run`'s verify.
    (
        &["run", PLAN, "--recheck-timeout=-1"],
        "--recheck-timeout: give seconds, 0 or more",
    ),
    (
        &["run", PLAN, "--drain-timeout", "inf"],
        "--drain-timeout: give seconds, 0 or more",
    ),
    (
        &["tail", PLAN, "--exit-when-idle", "NaN"],
        "--exit-when-idle: give seconds, 0 or more",
    ),
    (
        &["drain", PLAN, "--timeout=-3"],
        "--timeout: give seconds, 0 or more",
    ),
    (
        &["cutover", PLAN, "--wait=-1"],
        "--wait: give seconds, 0 or more",
    ),
    (
        &["cutover", PLAN, "--max-verify-age", "1e30"],
        "--max-verify-age: give seconds, 0 or more",
    ),
    (
        &["finish", PLAN, "--drain-timeout=-inf"],
        "--drain-timeout: give seconds, 0 or more",
    ),
    (
        &["iam-policy", PLAN, "--account", "1234"],
        "--account 1234: an AWS account id is 12 digits",
    ),
    (
        &["iam-policy", PLAN, "--export", "ftp://b/p"],
        "only s3:// URLs and local directories are supported",
    ),
    (
        &["check", "/nonexistent/plan.toml"],
        "/nonexistent/plan.toml: cannot read",
    ),
    // The plan is read first: its error comes before the arguments'.
    (
        &["verify", "/nonexistent/plan.toml", "--sample", "0"],
        "/nonexistent/plan.toml: cannot read",
    ),
    // `rekey query`: the key, the condition, the page and the cursor, before any AWS call.
    (
        &["query", PLAN, "--where", "tenant=a,date=d"],
        "no rule's partition key is made of exactly `date`, `tenant`",
    ),
    (
        &["query", PLAN, "--where", "tenant=a,day=d", "--limit", "0"],
        "--limit: give 1 or more",
    ),
    (
        &[
            "query",
            PLAN,
            "--where",
            "tenant=a,day=d",
            "--sk-between",
            "b",
            "a",
        ],
        "the low end sorts after the high end",
    ),
    (
        &[
            "query",
            PLAN,
            "--where",
            "tenant=a,day=d",
            "--cursor",
            "eyJ2IjoxfQ",
        ],
        "--cursor is not a rekey cursor",
    ),
    (
        &[
            "query",
            PLAN,
            "--where",
            "tenant=a,day=d",
            "--from",
            "2026-07-07",
            "--to",
            "2026-07-08",
        ],
        "--from and --to are for a partition key with a time bucket",
    ),
    // clap's own checks.
    (
        &["control", PLAN, "--pause", "--resume"],
        "cannot be used with",
    ),
    (&["analyze"], "required arguments were not provided"),
    (&["suggest", "t"], "--app-write-rate <ITEMS>"),
    (
        &[
            "suggest",
            "t",
            "--app-write-rate",
            "10",
            "--headroom",
            "100%",
        ],
        "give a share from 0 up to",
    ),
    (
        &["suggest", "t", "--app-write-rate", "inf"],
        "--app-write-rate, --app-read-rate: give items per second",
    ),
    (
        &["suggest", "t", "--app-write-rate", "1", "--sample", "0"],
        "--sample: give 1 item or more",
    ),
    (
        &["backfill", PLAN, "--write-rate", "fast"],
        "invalid value 'fast' for '--write-rate",
    ),
];

#[test]
fn bad_arguments_are_refused_with_a_message() {
    for (args, want) in ERROR_CASES {
        match convert(args) {
            Ok(c) => panic!("{args:?}: expected an error, got {:?}", c.command),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(msg.contains(want), "{args:?}: {msg}");
                // The conversion's errors are bad input (exit 2), as clap's are.
                if e.downcast_ref::<clap::Error>().is_none() {
                    assert_eq!(exit_code(&e), exit::BAD_INPUT, "{args:?}: {msg}");
                }
            }
        }
    }
}

#[test]
fn a_malformed_plan_is_refused_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(PLAN)
        .unwrap()
        .replace("shard(order_id, 16)", "shard(order_id, 0)");
    std::fs::write(&bad, &text).unwrap();
    let line = text
        .lines()
        .position(|l| l.contains("shard(order_id, 0)"))
        .unwrap();
    let col = text.lines().nth(line).unwrap().find("0)").unwrap();
    let err = convert(&["status", bad.to_str().unwrap()]).unwrap_err();
    assert!(
        format!("{err:#}").contains(&format!(
            "bad.toml:{}:{}: shard count must be at least 1",
            line + 1,
            col + 1
        )),
        "{err:#}"
    );
    assert_eq!(exit_code(&err), exit::BAD_INPUT);
}

/// Argument lists and how their command prints: format, quiet, progress, --show-keys.
const OUTPUT_CASES: &[(&[&str], Format, bool, ProgressMode, bool)] = {
    use Format::{Json, Text};
    use ProgressMode::{Auto, Json as Events, Quiet};
    &[
        // No progress at all.
        (&["check", PLAN], Text, false, Quiet, false),
        (&["status", PLAN, "--json"], Json, false, Quiet, false),
        (&["drain", PLAN], Text, false, Quiet, false),
        // The policy is JSON, always.
        (&["iam-policy", PLAN], Json, false, Quiet, false),
        // Progress on stderr; none with --json.
        (&["analyze", PLAN], Text, false, Auto, false),
        (&["analyze", PLAN, "--json"], Json, false, Quiet, false),
        (&["cutover", PLAN, "--json"], Json, false, Quiet, false),
        (&["demo", "--json"], Json, false, Quiet, false),
        // Long-running commands stream JSON events with --json.
        (&["backfill", PLAN], Text, false, Auto, false),
        (&["backfill", PLAN, "--json"], Json, false, Events, false),
        (&["run", PLAN, "--json"], Json, false, Events, false),
        (&["verify", PLAN, "--json"], Json, false, Events, false),
        // --quiet silences progress whatever the format.
        (&["tail", PLAN, "--json", "-q"], Json, true, Quiet, false),
        (&["analyze", PLAN, "--quiet"], Text, true, Quiet, false),
        (&["check", PLAN, "--show-keys"], Text, false, Quiet, true),
        // Scripts on stdout, nothing else.
        (&["completions", "zsh"], Text, false, Quiet, false),
        (&["man"], Text, false, Quiet, false),
    ]
};

#[test]
fn each_command_prints_as_its_flags_say() {
    for &(args, format, quiet, progress, show) in OUTPUT_CASES {
        let config = convert(args).unwrap_or_else(|e| panic!("{args:?}: {e:#}"));
        let want = Output {
            format,
            quiet,
            progress,
            redactor: Redactor { show },
        };
        assert_eq!(config.common.output, want, "{args:?}");
    }
}

#[test]
fn the_aws_options_are_the_global_flags() {
    let config = convert(&[
        "status",
        PLAN,
        "--endpoint-url",
        "http://e",
        "--region",
        "r",
        "--profile",
        "p",
    ])
    .unwrap();
    let want = AwsOptions {
        endpoint_url: Some("http://e".into()),
        region: Some("r".into()),
        profile: Some("p".into()),
        ..Default::default()
    };
    assert_eq!(dbg(&config.common.aws), dbg(&want));
    // The global flags go after the command too, and the environment is the SDK's to read.
    let config = convert(&["--region", "r", "status", PLAN]).unwrap();
    assert_eq!(
        dbg(&config.common.aws),
        dbg(AwsOptions {
            region: Some("r".into()),
            ..Default::default()
        })
    );
}

#[test]
fn verbose_counts_its_flags_before_or_after_the_command() {
    let v = |args: &[&str]| convert(args).unwrap().common.verbose;
    assert_eq!(v(&["status", PLAN]), 0);
    assert_eq!(v(&["-v", "status", PLAN]), 1);
    assert_eq!(v(&["status", PLAN, "-vv"]), 2);
    assert_eq!(v(&["status", PLAN, "--verbose", "-v"]), 2);
    assert!(matches!(
        convert(&["completions", "fish"]).unwrap().command,
        Command::Completions(clap_complete::Shell::Fish)
    ));
}

#[test]
fn worker_takes_the_backfills_options_and_the_fleets() {
    let c = convert(&[
        "worker",
        PLAN,
        "--state",
        "dynamodb://ctl/m1",
        "--worker-id",
        "w1",
        "--lease-seconds",
        "5",
        "--segments",
        "64",
        "--write-rate",
        "900",
    ])
    .unwrap();
    let Command::Worker(p) = &c.command else {
        panic!("{:?}", c.command)
    };
    let o = &p.options;
    assert_eq!(
        o.fleet,
        FleetRef {
            table: "ctl".into(),
            migration: "m1".into()
        }
    );
    assert_eq!(
        (o.worker_id.as_str(), o.lease, o.max_units),
        ("w1", secs(5), 8)
    );
    assert_eq!(o.backfill.segments, Some(64));
    assert_eq!(o.backfill.write_rate, rate("900"));
    // This worker's own rejects file, in its state directory.
    assert_eq!(o.backfill.rejects, state().worker_rejects("w1"));
}

#[test]
fn verify_and_cutover_with_state_read_the_fleet_rollback_refuses_it() {
    let cli = Cli::try_parse_from([
        "rekey",
        "verify",
        PLAN,
        "--state",
        "dynamodb://ctl/m1",
        "--worker-id",
        "v1",
        "--lease-seconds",
        "6",
        "--max-units",
        "3",
    ])
    .unwrap();
    let c = Config::from_args(cli, &env).unwrap();
    let Command::FleetVerify(p) = &c.command else {
        panic!("{:?}", c.command)
    };
    let o = &p.options;
    assert_eq!(o.fleet.migration, "m1");
    assert_eq!(
        (o.worker_id.as_str(), o.lease, o.max_units),
        ("v1", secs(6), 3)
    );
    let cli = Cli::try_parse_from(["rekey", "cutover", PLAN, "--state", "dynamodb://ctl"]).unwrap();
    let c = Config::from_args(cli, &env).unwrap();
    let Command::Cutover(p) = &c.command else {
        panic!()
    };
    let at = p.options.fleet.as_ref().unwrap();
    assert_eq!(
        (at.table.as_str(), at.migration.as_str()),
        ("ctl", p.plan.target_table.as_str())
    );
    let cli =
        Cli::try_parse_from(["rekey", "rollback", PLAN, "--state", "dynamodb://ctl"]).unwrap();
    let e = Config::from_args(cli, &env).unwrap_err().to_string();
    assert!(e.contains("drop --state"), "{e}");
}

#[test]
fn a_worker_id_is_made_up_when_not_given_and_fleet_urls_are_checked() {
    let with_host = |name: &str| (name == "HOSTNAME").then(|| "pod-3".to_string());
    let cli = Cli::try_parse_from(["rekey", "worker", PLAN, "--state", "dynamodb://ctl"]).unwrap();
    let c = Config::from_args(cli, &with_host).unwrap();
    let Command::Worker(p) = &c.command else {
        panic!()
    };
    assert!(
        p.options.worker_id.starts_with("pod-3-"),
        "{}",
        p.options.worker_id
    );
    // The migration id defaults to the plan's target table.
    assert_eq!(p.options.fleet.migration, p.plan.target_table);
    for (args, want) in [
        (
            &["worker", PLAN, "--state", "s3://b"][..],
            "give dynamodb://TABLE",
        ),
        (
            &[
                "worker",
                PLAN,
                "--state",
                "dynamodb://ctl",
                "--lease-seconds",
                "0.5",
            ],
            "--lease-seconds: give 1 second or more",
        ),
        (
            &[
                "worker",
                PLAN,
                "--state",
                "dynamodb://ctl",
                "--worker-id",
                "a#b",
            ],
            "--worker-id `a#b`",
        ),
        (
            &["iam-policy", PLAN, "--command", "worker"],
            "--command worker: give",
        ),
        (
            &["reverse", PLAN, "--fleet", "dynamodb://ctl"],
            "the reverse tail follows no backfill",
        ),
    ] {
        let e = convert(args).unwrap_err();
        assert!(format!("{e:#}").contains(want), "{args:?}: {e:#}");
        assert_eq!(exit_code(&e), exit::BAD_INPUT);
    }
    let c = convert(&["tail", PLAN, "--fleet", "dynamodb://ctl/m"]).unwrap();
    assert!(matches!(c.command, Command::TailFleet { ref fleet, .. } if fleet.migration == "m"));
    let c = convert(&["status", PLAN, "--state", "dynamodb://ctl/m"]).unwrap();
    assert!(matches!(c.command, Command::FleetStatus(_)));
}
