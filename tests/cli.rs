//! The errors people meet, through the real binary: malformed plans, bad
//! sample files, unreachable endpoints — each with a clear message and the
//! documented exit code.

mod support;

use support::*;

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
fn a_malformed_plan_exits_2_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(repo_path("plans/tenant-day-shard.toml"))
        .unwrap()
        .replace("shard(order_id, 16)", "shard(order_id, 0)")
        .replace(
            "key = { PK = \"TENANT#{tenant}\", SK = \"PROFILE\" }",
            "key = { PK = \"TENANT#{tenant}\", SK = \"{nope}\" }",
        );
    std::fs::write(&p, &text).unwrap();
    let out = rekey_with_env(&["check", p.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let line = text
        .lines()
        .position(|l| l.contains("shard(order_id, 0)"))
        .unwrap()
        + 1;
    let col = text.lines().nth(line - 1).unwrap().find("0)").unwrap() + 1;
    assert!(
        err.contains(&format!(
            "bad.toml:{line}:{col}: shard count must be at least 1"
        )),
        "{err}"
    );
    let line2 = text.lines().position(|l| l.contains("{nope}")).unwrap() + 1;
    let col2 = text.lines().nth(line2 - 1).unwrap().find("{nope}").unwrap() + 1;
    assert!(
        err.contains(&format!("bad.toml:{line2}:{col2}: `nope` is not captured by rule `tenant-profile` (it captures `tenant`")),
        "both errors, in file order: {err}"
    );
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

    std::fs::write(&sample, "{\"PK\":{\"S\":\"x\"}}\n{\"PK\":{\"Z\":1}}\n").unwrap();
    let out = rekey_with_env(
        &[
            "check",
            plan.to_str().unwrap(),
            "--sample",
            sample.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unreadable sample line is bad input"
    );
    assert!(
        stdout(&out).contains("sample.jsonl:2: unknown DynamoDB type tag `Z`"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn an_unreachable_endpoint_is_named_with_where_it_came_from() {
    // A port nothing listens on: bind, take the number, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let plan = repo_path("plans/tenant-day-shard.toml");
    let out = rekey_with_env(
        &["analyze", plan.to_str().unwrap(), "--endpoint-url", &url],
        &[],
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "cannot reach DynamoDB at {url} (from --endpoint-url)"
        )),
        "{}",
        stderr(&out)
    );

    let out = rekey_with_env(
        &["analyze", plan.to_str().unwrap()],
        &[("AWS_ENDPOINT_URL", &url)],
    );
    assert_eq!(out.status.code(), Some(5));
    assert!(
        stderr(&out).contains("(from the AWS_ENDPOINT_URL environment variable)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_arguments_exit_2() {
    let out = rekey_with_env(&["analyze"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let out = rekey_with_env(&["check", "/nonexistent/plan.toml"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("/nonexistent/plan.toml: cannot read"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_refuses_an_in_place_plan_before_touching_aws() {
    let plan = repo_path("plans/status-gsi-in-place.toml");
    let dir = tempfile::tempdir().unwrap();
    let out = rekey_with_env(
        &[
            "run",
            plan.to_str().unwrap(),
            "--state-dir",
            dir.path().to_str().unwrap(),
            "--endpoint-url",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`rekey run` drives a re-key into a new table"),
        "{}",
        stderr(&out)
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
