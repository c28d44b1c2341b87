//! Endpoints as users of the AWS SDK set them, through the real binary:
//! DynamoDB Streams follows a local `AWS_ENDPOINT_URL_DYNAMODB` (and says so
//! once), and an unreachable Streams or S3 endpoint is named, with its
//! service and where it came from.

use crate::support::workload::*;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_only_the_dynamodb_variable_tails_the_local_stream_to_ready() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start_local(seed(40)).await;
    let url = env.endpoint();
    let mut cmd = env.command(
        &[
            "run",
            plan_path.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--exit-when-ready",
            "--json",
        ],
        &[("AWS_ENDPOINT_URL_DYNAMODB", &url)],
    );
    // Only the DynamoDB variable: what the user who reported this had set.
    cmd.env_remove("AWS_ENDPOINT_URL");
    let out = output(cmd).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // The last line of the event stream (notes and progress) is the report.
    let text = stdout(&out);
    let last = text
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let r: serde_json::Value = serde_json::from_str(last).expect("a JSON report");
    assert_eq!(r["event"], "done", "{r}");
    assert_eq!(r["phase"], "ready_for_cutover", "{r}");
    assert_eq!(r["blocked"], serde_json::Value::Null, "{r}");

    let note = format!(
        "note: DynamoDB Streams at {url} (from AWS_ENDPOINT_URL_DYNAMODB; \
         set AWS_ENDPOINT_URL_DYNAMODB_STREAMS to use another)"
    );
    let err = stderr(&out);
    assert_eq!(err.matches(&note).count(), 1, "the note once:\n{err}");
    assert_eq!(
        err.matches("DynamoDB Streams at").count(),
        1,
        "nothing else about it:\n{err}"
    );
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0)
    );
}

/// An endpoint rekey cannot reach: the command, the variable that names
/// the endpoint, and what rekey must say (`{dead}` is the endpoint).
struct Unreachable {
    /// Names the case when it fails: the test it was.
    name: &'static str,
    /// The command (its plan and state directory follow it).
    command: &'static [&'static str],
    var: &'static str,
    says: &'static str,
    /// No `note:` at all (the variable was set).
    no_note: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_named_with_its_service_and_variable() {
    let o = Orders::start(seed(3)).await;
    let dynamodb = o.env.endpoint();
    // The S3 cases: DynamoDB's --endpoint-url, which S3 must not take.
    let from_export = [
        "backfill",
        "--from-export",
        "s3://exports/team/orders",
        "--endpoint-url",
        dynamodb.as_str(),
    ];
    let cases = [
        Unreachable {
            name: "an_unreachable_streams_endpoint_is_named_as_streams_with_its_variable",
            command: &["tail", "--exit-when-idle", "1"],
            var: "AWS_ENDPOINT_URL_DYNAMODB_STREAMS",
            says: "cannot reach DynamoDB Streams at {dead} \
                   (from the AWS_ENDPOINT_URL_DYNAMODB_STREAMS environment variable): ",
            no_note: true,
        },
        Unreachable {
            name: "an_unreachable_s3_endpoint_is_named_with_its_variable_never_the_flag: S3's",
            command: &[],
            var: "AWS_ENDPOINT_URL_S3",
            says: "cannot reach S3 at {dead} (from the AWS_ENDPOINT_URL_S3 environment variable) \
                   (GetObject of s3://exports/team/orders/",
            no_note: false,
        },
        Unreachable {
            name: "an_unreachable_s3_endpoint_is_named_with_its_variable_never_the_flag: all",
            command: &[],
            var: "AWS_ENDPOINT_URL",
            says: "cannot reach S3 at {dead} (from the AWS_ENDPOINT_URL environment variable) \
                   (GetObject of s3://exports/team/orders/",
            no_note: false,
        },
    ];
    let mut failed = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let command = if c.command.is_empty() {
            &from_export[..]
        } else {
            c.command
        };
        let state = o.env.dir.path().join(format!("state-{i}"));
        let mut args = vec![
            command[0],
            o.plan_path.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ];
        args.extend_from_slice(&command[1..]);
        let dead = dead_endpoint();
        let out = output(o.env.command(&args, &[(c.var, &dead)])).await;
        let err = stderr(&out);
        let says = c.says.replace("{dead}", &dead);
        let mut why = Vec::new();
        if out.status.code() != Some(5) {
            why.push(format!("exit {:?}, not 5", out.status.code()));
        }
        if !err.contains(&says) {
            why.push(format!("stderr lacks {says:?}"));
        }
        if c.no_note && err.contains("note:") {
            why.push("a note, though the variable was set".to_string());
        }
        if !why.is_empty() {
            failed.push(format!("case `{}`: {}\n{err}", c.name, why.join("; ")));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
