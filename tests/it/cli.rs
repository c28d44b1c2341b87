//! The errors people meet, through the real binary: malformed plans, bad
//! sample files, unreachable endpoints — each with a clear message and the
//! documented exit code. The failures are one table of cases
//! ([`the_errors_people_meet_exit_with_their_code_and_say_why`]), each named.

use std::path::Path;

use crate::support::*;

#[test]
fn every_example_plan_passes_check() {
    let dir = repo_path("plans");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "toml") {
            let out = rekey_with_env(&["check", p.to_str().unwrap()], &[]);
            assert!(out.status.success(), "{}: {}", p.display(), stderr(&out));
            assert!(stdout(&out).contains(": OK"), "{}", stdout(&out));
            let first = std::fs::read_to_string(&p).unwrap();
            assert!(
                first.starts_with("# Access pattern fixed:"),
                "{} opens with its access pattern",
                p.display()
            );
            n += 1;
        }
    }
    assert!(n >= 5, "at least five example plans, found {n}");
}

#[test]
fn check_shows_sample_items_before_and_after_and_why_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let sample = dir.path().join("sample.jsonl");
    std::fs::write(
        &sample,
        concat!(
            r#"{"Item":{"PK":{"S":"TENANT#acme#DAY#2026-07-07"},"SK":{"S":"ORDER#o-1"},"total":{"N":"12.50"}}}"#,
            "\n",
            r#"{"PK":{"S":"USER#1"},"SK":{"S":"PROFILE"}}"#,
            "\n",
        ),
    )
    .unwrap();
    let plan = repo_path("plans/tenant-day-shard.toml");
    let out = rekey_with_env(
        &[
            "check",
            plan.to_str().unwrap(),
            "--sample",
            sample.to_str().unwrap(),
            "--show-keys",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let shard = rekey::core::hash::shard(rekey::core::hash::HashFn::Fnv1a32, "o-1", 16);
    assert!(
        text.contains(&format!("TENANT#acme#DAY#2026-07-07#SHARD#{shard:02}")),
        "{text}"
    );
    assert!(
        text.contains(r#""total":{"N":"12.50"}"#),
        "numbers keep their text: {text}"
    );
    assert!(
        text.contains("line 2: REJECT — no rule matched the item"),
        "{text}"
    );
    assert!(text.contains("2 items: 1 put, 1 rejected"), "{text}");

    // By default key values are hashed; the plan's shapes, the shard and other attributes stay.
    let out = rekey_with_env(
        &[
            "check",
            plan.to_str().unwrap(),
            "--sample",
            sample.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let tok = rekey::ops::redact::token;
    assert!(
        text.contains(&format!(
            "TENANT#{}#DAY#{}#SHARD#{shard:02}",
            tok("acme"),
            tok("2026-07-07"),
        )),
        "{text}"
    );
    assert!(!text.contains("acme") && !text.contains("o-1"), "{text}");
    assert!(text.contains(r#""total":{"N":"12.50"}"#), "{text}");
}

#[test]
fn check_says_per_rule_whether_a_rollback_can_map_target_items_back() {
    let check = |plan: &str, extra: &[&str]| {
        let path = repo_path(plan);
        let mut args = vec!["check", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = rekey_with_env(&args, &[]);
        // Irreversible is something to know, not a failure of the plan.
        assert!(out.status.success(), "{plan}: {}", stderr(&out));
        stdout(&out)
    };
    let text = check("plans/tenant-day-shard.toml", &[]);
    assert!(
        text.contains("  rule order: reversible\n  rule tenant-profile: reversible\n"),
        "{text}"
    );
    let text = check("plans/event-hour-shard.toml", &[]);
    assert!(
        text.contains(concat!(
            "  rule event: not reversible\n",
            "    - `ingest_debug` is removed by `[options] drop`, so the target does not hold it\n",
            "      change: keep it: take `ingest_debug` out of `[options] drop`\n"
        )),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&check("plans/single-table-case.toml", &["--json"])).unwrap();
    let rules = v["reversibility"].as_array().unwrap();
    let verdicts: Vec<(&str, bool)> = rules
        .iter()
        .map(|r| {
            (
                r["rule"].as_str().unwrap(),
                r["reversible"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [("task", true), ("event", false), ("case", true)],
        "{v}"
    );
    let why = &rules[1]["reasons"][0];
    assert!(
        why["reason"].as_str().unwrap().contains("capture `tenant`"),
        "{why}"
    );
    assert!(
        why["fix"]
            .as_str()
            .unwrap()
            .contains("set = { tenant = \"{tenant}\" }"),
        "{why}"
    );
    assert!(
        v["reverse_notes"][0]
            .as_str()
            .unwrap()
            .contains("unmatched = \"copy\""),
        "{v}"
    );

    // Two rules whose target keys can be equal: each names the other.
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("overlap.toml");
    let text = std::fs::read_to_string(repo_path("plans/tenant-day-shard.toml"))
        .unwrap()
        .replace(
            "key = { PK = \"TENANT#{tenant}\", SK = \"PROFILE\" }",
            "key = { PK = \"TENANT#{tenant}\", SK = \"ORDER#PROFILE\" }",
        );
    std::fs::write(&plan, text).unwrap();
    let text = check(plan.to_str().unwrap(), &[]);
    assert!(
        text.contains("  rule order: not reversible\n    - its target keys can take the same values as rule `tenant-profile`'s"),
        "{text}"
    );
    assert!(
        text.contains("can take the same values as rule `order`'s"),
        "{text}"
    );
}

#[test]
fn control_writes_the_control_file_and_says_so_in_json() {
    let plan = repo_path("plans/tenant-day-shard.toml");
    let dir = tempfile::tempdir().unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "control",
            plan.to_str().unwrap(),
            "--state-dir",
            dir.path().to_str().unwrap(),
            "--json",
        ];
        a.extend_from_slice(extra);
        rekey_with_env(&a, &[])
    };
    let out = args(&["--pause", "--write-rate", "250"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["paused"].clone(), v["write_rate"].clone()),
        (true.into(), 250.0.into())
    );
    let out = args(&["--resume"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["paused"], false);
    assert_eq!(v["write_rate"], 250.0, "kept from the earlier call");
}

/// A command that must fail: what it runs, its exit code, and what it says.
struct Case {
    /// Names the case when it fails: the test it was, where it was one.
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    code: i32,
    /// Each of these is in stderr.
    stderr: Vec<String>,
    /// Each of these is in stdout.
    stdout: Vec<String>,
}

impl Case {
    fn new(name: &'static str, args: &[&str], code: i32) -> Case {
        Case {
            name,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
            code,
            stderr: Vec::new(),
            stdout: Vec::new(),
        }
    }
    fn env(mut self, k: &'static str, v: &str) -> Case {
        self.env.push((k, v.to_string()));
        self
    }
    fn stderr(mut self, text: impl Into<String>) -> Case {
        self.stderr.push(text.into());
        self
    }
    fn stdout(mut self, text: impl Into<String>) -> Case {
        self.stdout.push(text.into());
        self
    }
}

/// Runs every case (`rekey ARGS` with fake credentials and no endpoint of
/// the caller's), then fails naming each case that did not hold and why.
fn check(cases: &[Case]) {
    let mut failed = Vec::new();
    for c in cases {
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = c.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = rekey_with_env(&args, &env);
        let (o, e) = (stdout(&out), stderr(&out));
        let mut why = Vec::new();
        if out.status.code() != Some(c.code) {
            why.push(format!("exit {:?}, not {}", out.status.code(), c.code));
        }
        why.extend(
            c.stderr
                .iter()
                .filter(|t| !e.contains(t.as_str()))
                .map(|t| format!("stderr lacks {t:?}")),
        );
        why.extend(
            c.stdout
                .iter()
                .filter(|t| !o.contains(t.as_str()))
                .map(|t| format!("stdout lacks {t:?}")),
        );
        if !why.is_empty() {
            failed.push(format!(
                "case `{}` (rekey {}): {}\n--- stdout:\n{o}--- stderr:\n{e}",
                c.name,
                args.join(" "),
                why.join("; ")
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

/// A copy of plans/tenant-day-shard.toml with two errors: its text.
fn malformed_plan(p: &Path) -> String {
    let text = std::fs::read_to_string(repo_path("plans/tenant-day-shard.toml"))
        .unwrap()
        .replace("shard(order_id, 16)", "shard(order_id, 0)")
        .replace(
            "key = { PK = \"TENANT#{tenant}\", SK = \"PROFILE\" }",
            "key = { PK = \"TENANT#{tenant}\", SK = \"{nope}\" }",
        );
    std::fs::write(p, &text).unwrap();
    text
}

/// `line:column` (from 1) of the first `what` on the first line holding `line_has`.
fn position(text: &str, line_has: &str, what: &str) -> String {
    let line = text.lines().position(|l| l.contains(line_has)).unwrap() + 1;
    let col = text.lines().nth(line - 1).unwrap().find(what).unwrap() + 1;
    format!("{line}:{col}")
}

#[test]
fn the_errors_people_meet_exit_with_their_code_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let example = repo_path("plans/tenant-day-shard.toml");
    let example = example.to_str().unwrap();
    let in_place = repo_path("plans/status-gsi-in-place.toml");

    let bad = path("bad.toml");
    let text = malformed_plan(Path::new(&bad));
    let sample = path("sample.jsonl");
    std::fs::write(&sample, "{\"PK\":{\"S\":\"x\"}}\n{\"PK\":{\"Z\":1}}\n").unwrap();
    // A port nothing listens on.
    let url = dead_endpoint();

    check(&[
        Case::new("bad_arguments_exit_2: no plan", &["analyze"], 2),
        Case::new(
            "bad_arguments_exit_2: a plan that cannot be read",
            &["check", "/nonexistent/plan.toml"],
            2,
        )
        .stderr("/nonexistent/plan.toml: cannot read"),
        Case::new(
            "a_malformed_plan_exits_2_with_file_line_and_column",
            &["check", &bad],
            2,
        )
        .stderr(format!(
            "bad.toml:{}: shard count must be at least 1",
            position(&text, "shard(order_id, 0)", "0)")
        ))
        // Both errors, in file order.
        .stderr(format!(
            "bad.toml:{}: `nope` is not captured by rule `tenant-profile` (it captures `tenant`",
            position(&text, "{nope}", "{nope}")
        )),
        Case::new(
            "an unreadable sample line is bad input",
            &["check", example, "--sample", &sample],
            2,
        )
        .stdout("sample.jsonl:2: unknown DynamoDB type tag `Z`"),
        Case::new(
            "an_unreachable_endpoint_is_named_with_where_it_came_from: --endpoint-url",
            &["analyze", example, "--endpoint-url", &url],
            5,
        )
        .stderr(format!(
            "cannot reach DynamoDB at {url} (from --endpoint-url)"
        )),
        Case::new(
            "an_unreachable_endpoint_is_named_with_where_it_came_from: AWS_ENDPOINT_URL",
            &["analyze", example],
            5,
        )
        .env("AWS_ENDPOINT_URL", &url)
        .stderr("(from the AWS_ENDPOINT_URL environment variable)"),
        Case::new(
            "run_refuses_an_in_place_plan_before_touching_aws",
            &[
                "run",
                in_place.to_str().unwrap(),
                "--state-dir",
                &path("state"),
                "--endpoint-url",
                "http://127.0.0.1:9",
            ],
            2,
        )
        .stderr("`rekey run` drives a re-key into a new table"),
    ]);
}

/// Every subcommand's name, from the argument definition itself (so a new
/// one missing from a script fails the test).
fn subcommands() -> Vec<String> {
    use clap::CommandFactory as _;
    let names: Vec<String> = rekey::ops::cli::Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_string())
        .collect();
    assert!(names.len() >= 16, "{names:?}");
    names
}

#[test]
fn completions_name_every_subcommand_in_every_shell() {
    let names = subcommands();
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let out = rekey_with_env(&["completions", shell], &[]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(!script.trim().is_empty(), "{shell}: empty script");
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !script.contains(n.as_str()))
            .collect();
        assert!(missing.is_empty(), "{shell} lacks {missing:?}");
        assert!(stderr(&out).is_empty(), "{shell}: {}", stderr(&out));
    }
    // Through a closed pipe: not an error.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rekey"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));

    check(&[
        Case::new("an unknown shell is bad input", &["completions", "tcsh"], 2)
            .stderr("invalid value 'tcsh'")
            .stderr("possible values: bash"),
    ]);
}

#[test]
fn the_man_page_is_roff_naming_every_subcommand() {
    let out = rekey_with_env(&["man"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    let th = page.lines().find(|l| l.starts_with(".TH ")).expect(".TH");
    assert!(th.starts_with(".TH rekey 1"), "{th}");
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(page.lines().any(|l| l == section), "no {section}:\n{page}");
    }
    // roff: requests are `.` + name; no stray control characters; roff
    // escapes the hyphens of flags (`\-\-verbose`).
    for (n, line) in page.lines().enumerate() {
        assert!(
            !line.chars().any(|c| c.is_control() && c != '\t'),
            "line {}: control character: {line:?}",
            n + 1
        );
        if let Some(req) = line.strip_prefix('.') {
            assert!(
                req.starts_with(|c: char| c.is_ascii_alphabetic()),
                "line {}: not a request: {line:?}",
                n + 1
            );
        }
    }
    assert!(page.contains(r"\fB\-\-verbose\fR"), "{page}");
    // Each command has its section, with its synopsis and options.
    let missing: Vec<String> = subcommands()
        .into_iter()
        .filter(|n| {
            let heading = format!(".SH \"REKEY {}\"", n.to_uppercase().replace('-', "\\-"));
            let synopsis = format!("\\fBrekey {}\\fR", n.replace('-', "\\-"));
            !page.contains(&heading) || !page.contains(&synopsis)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the man page lacks {missing:?}:\n{page}"
    );
    // groff, where installed, reads it without a warning (-k: UTF-8 input, as man does).
    let groff = std::process::Command::new("groff")
        .args(["-k", "-man", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    if let Ok(mut groff) = groff {
        use std::io::Write as _;
        groff
            .stdin
            .take()
            .unwrap()
            .write_all(page.as_bytes())
            .unwrap();
        let out = groff.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "groff: {}",
            stderr(&out)
        );
    }
}

/// `-v` logs, on stderr, the endpoint and where it came from and each
/// checkpoint committed (its name and counts, never key values); without it
/// stderr has none of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_logs_endpoints_and_checkpoints_on_stderr_and_only_then() {
    use crate::support::plan::tenant_days;
    use crate::support::workload::skewed_order;
    let env = TestEnv::start().await;
    let (source, target) = (env.table_name("src"), env.table_name("dst"));
    env.create_table(&source, &pk_sk()).await;
    env.create_table(&target, &pk_sk()).await;
    let items: Vec<_> = (0..40).map(skewed_order).collect();
    env.put(&source, &items).await;
    let (plan, _) = tenant_days(&source, &target, "T#{t}#ST#{@status}")
        .source_key_prefix("src_")
        .write(&env);
    let run = |state: &str, extra: &[&str]| {
        let state = env.dir.path().join(state);
        let mut args = vec![
            "backfill",
            plan.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--segments",
            "2",
            "--page-size",
            "10",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = env.rekey_with(&args, &[("RUST_LOG", "")]);
        assert!(out.status.success(), "{}", stderr(&out));
        (stdout(&out), stderr(&out))
    };

    let (quiet_out, quiet_err) = run("state-quiet", &[]);
    for absent in ["endpoint", "checkpoint", "INFO", "DEBUG"] {
        assert!(!quiet_err.contains(absent), "without -v: {quiet_err}");
    }

    let (out, err) = run("state-v", &["-v"]);
    let endpoint = env.endpoint();
    assert!(
        err.contains(&format!("DynamoDB endpoint: {endpoint} (from ")),
        "{err}"
    );
    assert!(err.contains("checkpoint committed"), "{err}");
    assert!(err.contains("checkpoint=\"backfill/seg/0000"), "{err}");
    assert!(!err.contains("DEBUG"), "-v is info: {err}");
    // The log is on stderr only: stdout is the same JSON events either way.
    for o in [&out, &quiet_out] {
        assert!(o.lines().all(|l| l.starts_with('{')), "{o}");
        assert!(
            o.lines().last().unwrap().contains(r#""event":"done""#),
            "{o}"
        );
    }
    // No key value reaches the log.
    for item in &items {
        if let Some(rekey::core::value::Value::S(pk)) = item.get("PK") {
            assert!(!err.contains(pk.as_str()), "key value {pk} in: {err}");
        }
    }

    let (_, err) = run("state-vv", &["-vv"]);
    assert!(err.contains("DEBUG"), "-vv is debug: {err}");
    // Each request: its operation and its table.
    assert!(
        err.contains(r#"rpc.method="Scan""#),
        "-vv names each request: {err}"
    );
    assert!(err.contains(&source), "-vv names the table: {err}");
}
