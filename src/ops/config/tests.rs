//! The conversion's tests. Argument lines and the options each command runs
//! with (compared whole, as `Debug` shows them), the output mode, or the
//! refusal's message are fixture files with their expected output
//! (`tests/fixtures/config/`, read by the three `fixtures_…` tests here);
//! what a line of arguments cannot say stays code: a plan written for the
//! test, another environment, the global flags and counted flags. No AWS;
//! the environment is a fixed table.

use clap::Parser as _;

use super::*;
use crate::core::fixture;
use crate::ops::cli::{exit, exit_code};

const PLAN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/plans/tenant-day-shard.toml");
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
        Command::Check(p) => format!("{:#?}", p.options),
        Command::Analyze(p) => format!("{:#?}", p.options),
        Command::Backfill(p) => format!("{:#?}", p.options),
        Command::Tail(p) => format!("{:#?}", p.options),
        Command::TailFleet { tail, fleet } => format!("{:#?}\n{fleet:#?}", tail.options),
        Command::Worker(p) => format!("{:#?}", p.options),
        Command::FleetStatus(p) => format!("{:#?}", p.options),
        Command::Verify(p) => format!("{:#?}", p.options),
        Command::FleetVerify(p) => format!("{:#?}", p.options),
        Command::Run(p) => format!("{:#?}", p.options),
        Command::Drain(p) => format!("{:#?}", p.options),
        Command::Cutover(p) | Command::Rollback(p) => format!("{:#?}", p.options),
        Command::Finish(p) => format!("{:#?}", p.options),
        Command::Query(p) => format!("{:#?}", p.options),
        Command::Status(p) => format!("{:#?}", p.options),
        Command::Control(p) => format!("{:#?}", p.options),
        Command::Demo(d) => format!("{d:#?}"),
        Command::Loadtest(p) => format!("{:#?}", p.options),
        Command::Suggest(s) => format!("{s:#?}"),
        Command::IamPolicy(p) => format!("{:#?}", p.options),
        Command::Completions(shell) => format!("{shell:?}"),
        Command::Man => "Man".into(),
    }
}

fn dbg<T: std::fmt::Debug>(v: T) -> String {
    format!("{v:?}")
}

/// What a fixture case shows of its conversion: `Ok(text)` for the expected
/// file, or `Err(why)` when the case is not what its folder says (accepted
/// where refusals are expected, or the other way round): a failure that
/// `REKEY_BLESS=1` does not write away.
type Show = fn(anyhow::Result<Config>) -> Result<String, String>;

/// Every case of `tests/fixtures/config/<folder>/<group>.args` against
/// `<group>.expected`. An `.args` file is one argument line per case (after
/// `rekey`; `PLAN` stands for `plans/tenant-day-shard.toml`), and comment
/// (`#`) lines, copied to the expected file; each case there is `$ rekey ARGS`
/// and what `show` gives, the plan's path written `PLAN` again.
fn check_fixtures(folder: &str, at_least: usize, show: Show) {
    let dir = fixture::dir(&format!("config/{folder}"));
    let groups = fixture::cases(&dir, ".args");
    let mut failures = fixture::strays(&dir, ".args", ".expected");
    let mut checked = 0;
    for group in &groups {
        let text = std::fs::read_to_string(group).unwrap();
        let mut got = String::new();
        for line in text.lines() {
            let args = line.trim();
            if args.is_empty() || args.starts_with('#') {
                got += &format!("{line}\n");
                continue;
            }
            checked += 1;
            let shown = show(convert(&words(args))).unwrap_or_else(|why| {
                failures.push(format!("{}: `rekey {args}`: {why}", group.display()));
                format!("! {why}")
            });
            got += &format!(
                "$ rekey {args}\n{}\n\n",
                shown.replace(PLAN, "PLAN").trim_end()
            );
        }
        failures.extend(fixture::compare(
            &fixture::sibling(group, ".args", ".expected"),
            &format!("{}\n", got.trim_end()),
        ));
    }
    fixture::finish(
        &format!("config fixtures ({folder}/)"),
        checked,
        at_least,
        &failures,
    );
}

/// `tests/fixtures/config/options/`: argument lines → the options their
/// command runs with, whole.
#[test]
fn fixtures_arguments_become_the_options_each_command_runs_with() {
    check_fixtures("options", 35, |r| {
        r.map(|c| match c.common.metrics {
            Some(m) => format!("{}\nmetrics: {m:?}", options(&c.command)),
            None => options(&c.command),
        })
        .map_err(|e| format!("refused, where this folder's cases are accepted: {e:#}"))
    });
}

/// `tests/fixtures/config/refused/`: argument lines → the message they are
/// refused with: clap's own message, or the conversion's, which is bad input
/// (exit 2), as clap's is.
#[test]
fn fixtures_bad_arguments_are_refused_with_a_message() {
    check_fixtures("refused", 32, |r| match r {
        Ok(c) => Err(format!(
            "accepted, where this folder's cases are refused: {}",
            options(&c.command)
        )),
        Err(e) if e.downcast_ref::<clap::Error>().is_some() => Ok(format!("refused by clap:\n{e}")),
        Err(e) if exit_code(&e) == exit::BAD_INPUT => {
            Ok(format!("bad input (exit {}): {e:#}", exit::BAD_INPUT))
        }
        Err(e) => Err(format!(
            "exit {}, where bad input is exit {}: {e:#}",
            exit_code(&e),
            exit::BAD_INPUT
        )),
    });
}

/// `tests/fixtures/config/output/`: argument lines → how their command
/// prints (format, --quiet, progress, --show-keys).
#[test]
fn fixtures_each_command_prints_as_its_flags_say() {
    check_fixtures("output", 17, |r| {
        r.map(|c| format!("{:?}", c.common.output))
            .map_err(|e| format!("refused, where this folder's cases are accepted: {e:#}"))
    });
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
fn the_log_format_is_global_and_the_log_knows_the_command_and_its_plan() {
    let c = convert(&["backfill", PLAN]).unwrap();
    assert_eq!(c.common.log_format, log::Format::Text);
    let c = convert(&["--log-format", "json", "undo", PLAN, "-v"]).unwrap();
    assert_eq!(c.common.log_format, log::Format::Json);
    let o = c.log_options();
    assert_eq!(
        (o.command, o.verbose, o.format),
        ("undo", 1, log::Format::Json)
    );
    assert_eq!(o.plan.map(|p| p.source_table.as_str()), Some("orders"));
    assert!(!o.show_keys);
    let c = convert(&["reverse", PLAN, "--log-format", "json", "--show-keys"]).unwrap();
    assert_eq!(c.command.name(), "reverse");
    assert!(c.log_options().show_keys);
    let c = convert(&["completions", "bash", "--log-format", "json"]).unwrap();
    assert!(c.log_options().plan.is_none());
}

#[test]
fn a_worker_id_is_made_up_from_the_host_when_not_given() {
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
}
