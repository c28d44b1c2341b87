//! The integration-test environment, in the manner of mini-redis's
//! `start_server`: every test calls [`TestEnv::start`] and gets a DynamoDB to
//! itself — the local server (moto) behind the project's proxy, which gives
//! DynamoDB's capacity per item — random table names, and the `rekey` binary
//! pointed at it through the standard AWS environment variables, the way an
//! operator runs it.
//!
//! `REKEY_TEST_ENDPOINT` runs the same tests against another endpoint: a URL
//! (an emulator of your choice; `AWS_ENDPOINT_URL` for everything) or `aws`
//! (AWS itself, credentials and region from the standard chain). The tables a
//! test creates there are deleted when it ends. Tests that need the local
//! server itself (their own throttling proxy) call [`TestEnv::start_local`].
//!
//! A server that cannot start fails the test loudly; nothing is skipped.
//!
//! Beside the environment, one of each thing the tests share:
//! - [`plan`]: the plan builder ([`PlanText`]) and the plan shapes several
//!   areas use;
//! - [`workload`]: the application writer and the seeded item generators;
//! - [`client`]: SDK clients, table creation, puts, scans, and the
//!   independent comparison of a target with transform(source);
//! - [`export`]: DynamoDB exports in S3 (the shared local server) and on disk;
//! - [`shared_server`], [`rerun_alone`], [`dead_endpoint`] and the helpers
//!   that read rekey's output.

pub mod client;
pub mod export;
pub mod plan;
pub mod streams_double;
pub mod workload;

pub use client::{
    assert_no_markers, expected_target, is_marker, pk_only, pk_sk, target_vs_transform,
};
pub use plan::{PlanText, Rule};
pub use workload::Rng;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rekey::aws::{AwsOptions, Clients};
use rekey::core::value::Item;
use rekey::local::{LocalOptions, LocalServer};
use rekey_testkit::proxy::{Proxy, ProxyOptions};
use rekey_testkit::shadow::server::ShadowServer;
use tokio::sync::OnceCell;

/// Names the endpoint the integration tests run against instead of a local server.
pub const ENDPOINT_ENV: &str = "REKEY_TEST_ENDPOINT";

/// Where a test's DynamoDB is.
enum Backend {
    /// The local server, and the pass-through proxy in front of it, which
    /// validates every request against the shadow first.
    Local {
        server: LocalServer,
        shadow: ShadowServer,
        proxy: Proxy,
    },
    /// `REKEY_TEST_ENDPOINT=URL`.
    Url(String),
    /// `REKEY_TEST_ENDPOINT=aws`: AWS's own endpoints for the region.
    Aws { region: String },
}

pub struct TestEnv {
    backend: Backend,
    pub clients: Clients,
    pub dir: tempfile::TempDir,
    /// Tables handed out by [`TestEnv::table_name`]: deleted at the end on
    /// an endpoint that outlives the test.
    tables: Mutex<Vec<String>>,
}

impl TestEnv {
    /// The local server, or the endpoint `REKEY_TEST_ENDPOINT` names.
    pub async fn start() -> TestEnv {
        match std::env::var(ENDPOINT_ENV).ok().filter(|v| !v.is_empty()) {
            None => TestEnv::start_local().await,
            Some(v) if v == "aws" => {
                let region = std::env::var("AWS_REGION")
                    .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
                    .unwrap_or_else(|_| "us-east-1".into());
                TestEnv::with(Backend::Aws { region }).await
            }
            Some(url) => TestEnv::with(Backend::Url(url)).await,
        }
    }

    /// Always the local server, whatever `REKEY_TEST_ENDPOINT` says: for tests
    /// that put their own proxy in front of it ([`TestEnv::server`]).
    pub async fn start_local() -> TestEnv {
        let local = LocalOptions::default();
        let (server, shadow) = tokio::join!(LocalServer::start(&local), ShadowServer::start());
        let server = server.unwrap_or_else(|e| {
            panic!("the local server did not start (run scripts/install-deps): {e}")
        });
        let shadow = shadow.unwrap_or_else(|e| {
            panic!("the validating shadow did not start (run scripts/install-deps): {e:#}")
        });
        let proxy = Proxy::start(ProxyOptions {
            shadow: Some(shadow.endpoint().to_string()),
            ..ProxyOptions::pass_through(server.endpoint())
        })
        .await
        .unwrap_or_else(|e| panic!("the capacity proxy did not start: {e:#}"));
        TestEnv::with(Backend::Local {
            server,
            shadow,
            proxy,
        })
        .await
    }

    async fn with(backend: Backend) -> TestEnv {
        let (endpoint_url, static_credentials, region) = match &backend {
            Backend::Local { proxy, .. } => (
                Some(proxy.endpoint()),
                Some(("test".to_string(), "test".to_string())),
                "us-east-1".to_string(),
            ),
            Backend::Url(url) => {
                let fake = std::env::var_os("AWS_ACCESS_KEY_ID").is_none();
                let creds = fake.then(|| ("test".to_string(), "test".to_string()));
                (Some(url.clone()), creds, region_from_env())
            }
            Backend::Aws { region } => (None, None, region.clone()),
        };
        let clients = Clients::connect(&AwsOptions {
            endpoint_url,
            region: Some(region),
            static_credentials,
            ..Default::default()
        })
        .await
        .expect("SDK clients");
        TestEnv {
            backend,
            clients,
            dir: tempfile::tempdir().expect("temp dir"),
            tables: Mutex::new(Vec::new()),
        }
    }

    /// True on the local server (moto behind the proxy).
    pub fn is_local(&self) -> bool {
        matches!(self.backend, Backend::Local { .. })
    }

    /// The DynamoDB endpoint rekey and the test's clients use.
    pub fn endpoint(&self) -> String {
        match &self.backend {
            Backend::Local { proxy, .. } => proxy.endpoint(),
            Backend::Url(url) => url.clone(),
            Backend::Aws { region } => format!("https://dynamodb.{region}.amazonaws.com"),
        }
    }

    /// The local server itself (no proxy), for a test's own proxy in front
    /// of it. Only for [`TestEnv::start_local`] environments.
    pub fn server(&self) -> &str {
        match &self.backend {
            Backend::Local { server, .. } => server.endpoint(),
            _ => panic!("TestEnv::server needs TestEnv::start_local"),
        }
    }

    /// The validating shadow, for a test's own proxy in front of
    /// [`TestEnv::server`]: its requests are checked as the environment's are.
    pub fn shadow(&self) -> Option<String> {
        match &self.backend {
            Backend::Local { shadow, .. } => Some(shadow.endpoint().to_string()),
            _ => panic!("TestEnv::shadow needs TestEnv::start_local"),
        }
    }

    /// The environment's own proxy (local server only): what strict
    /// validation saw, refusals a test expects.
    pub fn proxy(&self) -> &Proxy {
        match &self.backend {
            Backend::Local { proxy, .. } => proxy,
            _ => panic!("TestEnv::proxy needs TestEnv::start_local"),
        }
    }

    /// A table name no other test uses.
    pub fn table_name(&self, prefix: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{prefix}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            random_suffix()
        );
        self.tables.lock().unwrap().push(name.clone());
        name
    }

    /// Write a file into the test's temp dir.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write test file");
        p
    }

    /// `rekey ARGS` against this environment's DynamoDB, configured through
    /// the environment as an operator would.
    pub fn rekey(&self, args: &[&str]) -> Output {
        self.rekey_with(args, &[])
    }

    /// `rekey ARGS` with `extra` environment variables on top (later ones win).
    pub fn rekey_with(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        self.command(args, extra).output().expect("run rekey")
    }

    /// `rekey ARGS` as a child process (stdout and stderr piped), to be killed.
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.command(args, &[])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn rekey")
    }

    /// The command [`TestEnv::rekey_with`] runs, for a test that runs it
    /// elsewhere (a blocking task, with its own stdio).
    pub fn command(&self, args: &[&str], extra: &[(&str, &str)]) -> Command {
        let mut cmd = base_command(args);
        match &self.backend {
            Backend::Local { proxy, .. } => {
                fake_credentials(&mut cmd);
                cmd.env("AWS_ENDPOINT_URL", proxy.endpoint());
            }
            Backend::Url(url) => {
                // An emulator takes any credentials; the caller's win if set.
                if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
                    fake_credentials(&mut cmd);
                }
                cmd.env("AWS_REGION", region_from_env())
                    .env("AWS_ENDPOINT_URL", url);
            }
            Backend::Aws { region } => {
                cmd.env("AWS_REGION", region);
            }
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd
    }
}

impl Drop for TestEnv {
    /// On an endpoint that outlives the test, deletes the tables it was
    /// given (those never created are "not found": ignored).
    fn drop(&mut self) {
        if self.is_local() {
            return; // the server dies with the test
        }
        let tables = std::mem::take(&mut *self.tables.lock().unwrap());
        let clients = self.clients.clone();
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime for cleanup");
            rt.block_on(async {
                for t in tables {
                    let _ = clients.dynamodb.delete_table().table_name(&t).send().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

fn region_from_env() -> String {
    std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".into())
}

/// Eight hex digits from the clock: names stay unique across test runs on an
/// endpoint that outlives them.
fn random_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!("{:08x}", Rng(nanos).next() as u32)
}

/// `rekey ARGS` with no endpoint, profile or attempts setting of the
/// caller's environment.
fn base_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rekey"));
    cmd.args(args)
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_DYNAMODB")
        .env_remove("AWS_ENDPOINT_URL_DYNAMODB_STREAMS")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    cmd
}

fn fake_credentials(cmd: &mut Command) {
    cmd.env_remove("AWS_PROFILE")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1");
}

/// `rekey ARGS` with fake credentials, a region, one attempt per request, and
/// `env`: for commands that need no DynamoDB, or a test's own endpoint.
pub fn rekey_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = base_command(args);
    fake_credentials(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run rekey")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An item from DynamoDB JSON text.
pub fn item(json: &str) -> Item {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("bad test item {json}: {e}"))
}

pub fn s(text: &str) -> rekey::core::value::Value {
    rekey::core::value::Value::S(text.to_string())
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The report of `rekey cutover --json` that cut over: exit 0, every gate met.
pub fn cut_over(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "cutover: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(out)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["cut_over"], true, "{r}");
    let gates = r["gates"].as_array().unwrap();
    assert!(gates.iter().all(|g| g["ok"] == true), "{r}");
    r
}

/// The report of a `--json` run: the last line of its event stream, with
/// every earlier line a progress event or a note.
pub fn report(o: &Output) -> serde_json::Value {
    let text = stdout(o);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let (last, events) = lines
        .split_last()
        .unwrap_or_else(|| panic!("no output; stderr: {}", stderr(o)));
    for e in events {
        let v: serde_json::Value =
            serde_json::from_str(e).unwrap_or_else(|err| panic!("event line {e}: {err}"));
        assert!(v["event"] == "progress" || v["event"] == "note", "{e}");
    }
    let v: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|err| panic!("report line {last}: {err}"));
    assert_eq!(v["event"], "done");
    v
}

/// Polls `ack` every 100 ms until it holds: what a running process
/// published (a status file, a phase, a progress sample). Panics naming
/// `what` after `timeout`, a bound far above what a slow machine needs.
pub async fn poll_until(what: &str, timeout: std::time::Duration, mut ack: impl FnMut() -> bool) {
    poll_until_async(what, timeout, || std::future::ready(ack())).await;
}

/// [`poll_until`] with an acknowledgement that must be read over the
/// network (a control table, a status endpoint): every 250 ms, since each
/// read is work for the same server the process under test is using.
pub async fn poll_until_async<F: std::future::Future<Output = bool>>(
    what: &str,
    timeout: std::time::Duration,
    mut ack: impl FnMut() -> F,
) {
    let start = std::time::Instant::now();
    while !ack().await {
        assert!(start.elapsed() < timeout, "no {what} within {timeout:?}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Wait until a running backfill has committed progress (its once-a-second
/// `progress.jsonl` sample shows scanned items), so a kill lands mid-run
/// however slow the machine. Panics after `timeout`.
pub async fn wait_for_progress(state_dir: &Path, timeout: std::time::Duration) {
    poll_until("backfill progress", timeout, || {
        std::fs::read_to_string(state_dir.join("progress.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["scanned"].as_u64() > Some(0))
    })
    .await;
}

/// One local server for the whole test binary, for tests that need no
/// DynamoDB of their own (the proxy's tests, each with its own tables; the
/// export tests, each with its own bucket). It starts in about a second;
/// never dropped, it dies with the process (PR_SET_PDEATHSIG on a thread that
/// lives as long as it does). The test fails if it cannot start.
pub async fn shared_server() -> &'static LocalServer {
    static SERVER: OnceCell<LocalServer> = OnceCell::const_new();
    SERVER
        .get_or_init(|| async {
            let started = std::time::Instant::now();
            let server = LocalServer::start(&LocalOptions::default())
                .await
                .unwrap_or_else(|e| {
                    panic!("the local server did not start (run scripts/install-deps): {e}")
                });
            eprintln!(
                "shared local server at {} ready in {:?}",
                server.endpoint(),
                started.elapsed()
            );
            server
        })
        .await
}

/// One validating shadow for the whole test binary, beside
/// [`shared_server`], for the proxies tests start in front of it.
pub async fn shared_shadow() -> String {
    static SHADOW: OnceCell<ShadowServer> = OnceCell::const_new();
    SHADOW
        .get_or_init(|| async {
            ShadowServer::start().await.unwrap_or_else(|e| {
                panic!("the validating shadow did not start (run scripts/install-deps): {e:#}")
            })
        })
        .await
        .endpoint()
        .to_string()
}

/// Names the test that [`rerun_alone`] runs in a process of its own.
const ALONE_ENV: &str = "REKEY_IT_ALONE";

/// For a test that must be alone in its process (it measures the process):
/// false in that process, where the test's body runs; anywhere else, runs
/// the test `path` (its full name in this binary, `module::test`) again in a
/// process of its own, passes on its output, asserts that it ran and passed,
/// and returns true (the caller returns at once).
pub fn rerun_alone(path: &str) -> bool {
    if std::env::var(ALONE_ENV).is_ok_and(|v| v == path) {
        return false;
    }
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", path, "--nocapture", "--test-threads=1"])
        .env(ALONE_ENV, path)
        .output()
        .expect("run the test binary");
    let (o, e) = (stdout(&out), stderr(&out));
    eprintln!("{path}, alone in process:\n{o}{e}");
    assert!(out.status.success(), "{path} failed in its own process");
    assert!(
        o.contains("test result: ok. 1 passed"),
        "{path} did not run in its own process: {o}"
    );
    true
}

/// A URL nothing listens on: bind a port, take the number, close it.
pub fn dead_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

/// Runs a prepared command off the async workers (a proxy of the test may
/// serve rekey's requests on them meanwhile).
pub async fn output(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run rekey"))
        .await
        .unwrap()
}

/// Waits for a spawned rekey off the async workers: its whole output.
pub async fn wait_output(child: std::process::Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}
