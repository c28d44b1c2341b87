//! The operator surface through the real binary, where no AWS is needed: a
//! closed stdout (`rekey status PLAN | head -1`) ends the command quietly,
//! with status 0 — no panic, no `error:` — while real errors still show.

use std::io::{Read as _, pipe};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn plan() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("plans/tenant-day-shard.toml")
}

/// `rekey ARGS` with stdout a pipe whose reading end is closed before the
/// process starts: its first write to stdout fails with a broken pipe.
fn with_stdout_closed(args: &[&str]) -> Output {
    let (reader, writer) = pipe().expect("a pipe");
    drop(reader);
    let mut child = Command::new(env!("CARGO_BIN_EXE_rekey"))
        .args(args)
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rekey");
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

fn assert_quiet_success(args: &[&str]) {
    let out = with_stdout_closed(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    assert!(stderr.is_empty(), "{args:?}: nothing on stderr: {stderr}");
}

#[test]
fn a_closed_stdout_ends_iam_policy_quietly() {
    let plan = plan();
    // --region and --account pinned, so the policy's note about `*` stays away too.
    assert_quiet_success(&[
        "iam-policy",
        plan.to_str().unwrap(),
        "--region",
        "us-east-1",
        "--account",
        "123456789012",
    ]);
}

#[test]
fn a_closed_stdout_ends_check_quietly() {
    let plan = plan();
    assert_quiet_success(&["check", plan.to_str().unwrap()]);
    assert_quiet_success(&["check", plan.to_str().unwrap(), "--json"]);
}

#[test]
fn a_closed_stdout_ends_status_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan();
    assert_quiet_success(&[
        "status",
        plan.to_str().unwrap(),
        "--state-dir",
        dir.path().to_str().unwrap(),
    ]);
}

#[test]
fn a_closed_stdout_does_not_hide_an_error() {
    let out = with_stdout_closed(&["check", "/nonexistent/plan.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("/nonexistent/plan.toml: cannot read"),
        "{stderr}"
    );
}
