//! Endpoints as users of the AWS SDK set them, through the real binary:
//! DynamoDB Streams follows a local `AWS_ENDPOINT_URL_DYNAMODB` (and says so
//! once), and an unreachable Streams or S3 endpoint is named, with its
//! service and where it came from.

mod support;

use support::app::*;
use support::*;

/// A URL nothing listens on: bind a port, take the number, close it.
fn dead_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

/// Run a prepared command off the async workers: the test's proxy serves
/// rekey's requests on them meanwhile.
async fn output(mut cmd: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run rekey"))
        .await
        .unwrap()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_streams_endpoint_is_named_as_streams_with_its_variable() {
    let o = Orders::start(seed(3)).await;
    let dead = dead_endpoint();
    let cmd = o.env.command(
        &[
            "tail",
            o.plan_path.to_str().unwrap(),
            "--state-dir",
            o.state.to_str().unwrap(),
            "--exit-when-idle",
            "1",
        ],
        &[("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", &dead)],
    );
    let out = output(cmd).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&format!(
            "cannot reach DynamoDB Streams at {dead} \
             (from the AWS_ENDPOINT_URL_DYNAMODB_STREAMS environment variable): "
        )),
        "{err}"
    );
    assert!(
        !err.contains("note:"),
        "the variable was set: no note\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_s3_endpoint_is_named_with_its_variable_never_the_flag() {
    let o = Orders::start(seed(3)).await;
    let backfill = |extra: &[(&str, &str)]| {
        o.env.command(
            &[
                "backfill",
                o.plan_path.to_str().unwrap(),
                "--state-dir",
                o.state.to_str().unwrap(),
                "--from-export",
                "s3://exports/team/orders",
                // DynamoDB's only: S3 must not take it.
                "--endpoint-url",
                &o.env.endpoint(),
            ],
            extra,
        )
    };
    for var in ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"] {
        let dead = dead_endpoint();
        let out = output(backfill(&[(var, &dead)])).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(5), "{var}: {err}");
        assert!(
            err.contains(&format!(
                "cannot reach S3 at {dead} (from the {var} environment variable) \
                 (GetObject of s3://exports/team/orders/"
            )),
            "{var}: {err}"
        );
    }
}
