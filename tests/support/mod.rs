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

#![allow(dead_code)]

pub mod app;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rekey::aws::{AwsOptions, Clients};
use rekey::core::plan::KeySchema;
use rekey::core::value::Item;
use rekey::local::{LocalOptions, LocalServer};
use rekey_testkit::proxy::{Proxy, ProxyOptions};

/// Names the endpoint the integration tests run against instead of a local server.
pub const ENDPOINT_ENV: &str = "REKEY_TEST_ENDPOINT";

/// Where a test's DynamoDB is.
enum Backend {
    /// The local server, and the pass-through proxy in front of it.
    Local { server: LocalServer, proxy: Proxy },
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
        let server = match LocalServer::start(&LocalOptions::default()).await {
            Ok(d) => d,
            Err(e) => panic!("the local server did not start (run scripts/install-deps): {e}"),
        };
        let proxy = Proxy::start(ProxyOptions::pass_through(server.endpoint()))
            .await
            .unwrap_or_else(|e| panic!("the capacity proxy did not start: {e:#}"));
        TestEnv::with(Backend::Local { server, proxy }).await
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

    pub async fn create_table(&self, name: &str, key: &KeySchema) {
        self.clients
            .create_table(name, key, false)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }

    pub async fn put(&self, table: &str, items: &[Item]) {
        rekey::aws::write::put_all(&self.clients, table, items, 4)
            .await
            .unwrap_or_else(|e| panic!("put into {table}: {e}"));
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

impl TestEnv {
    /// Every item of a table, through a plain Scan.
    pub async fn scan_all(&self, table: &str) -> Vec<Item> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .clients
                .dynamodb
                .scan()
                .table_name(table)
                .set_exclusive_start_key(start)
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "scan {table}: {}",
                        aws_smithy_types::error::display::DisplayErrorContext(&e)
                    )
                });
            for it in page.items.unwrap_or_default() {
                out.push(rekey::aws::from_sdk_item(it).expect("known types"));
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return out,
            }
        }
    }

    /// The target as a map from its key to the item.
    pub async fn table_map(
        &self,
        table: &str,
        key: &[&str],
    ) -> std::collections::BTreeMap<Vec<u8>, Item> {
        self.scan_all(table)
            .await
            .into_iter()
            .map(|i| {
                (
                    rekey::core::value::encode_key(&i, key).expect("key attributes"),
                    i,
                )
            })
            .collect()
    }
}

/// What the target must hold: transform(source), keyed by target key.
pub fn expected_target(
    plan: &rekey::core::plan::Plan,
    source: &[Item],
) -> std::collections::BTreeMap<Vec<u8>, Item> {
    let names = plan.target_key.names();
    source
        .iter()
        .filter_map(|i| match rekey::core::transform::transform(plan, i) {
            rekey::core::transform::Outcome::Put { item, .. } => {
                Some((rekey::core::value::encode_key(&item, &names).unwrap(), item))
            }
            _ => None,
        })
        .collect()
}

/// A cheap reproducible random sequence for kill points and workloads.
/// (missing, extra, stale): how the target differs from transform(source),
/// compared independently of rekey's own verify.
pub async fn target_vs_transform(
    env: &TestEnv,
    plan: &rekey::core::plan::Plan,
    source: &str,
    target: &str,
) -> (usize, usize, usize) {
    let expected = expected_target(plan, &env.scan_all(source).await);
    let names = plan.target_key.names();
    let actual = env.table_map(target, &names).await;
    let missing = expected.keys().filter(|k| !actual.contains_key(*k)).count();
    let extra = actual.keys().filter(|k| !expected.contains_key(*k)).count();
    let stale = expected
        .iter()
        .filter(|(k, v)| actual.get(*k).is_some_and(|a| a != *v))
        .count();
    (missing, extra, stale)
}

pub struct Rng(pub u64);
impl Rng {
    pub fn from_time() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        eprintln!("random seed {seed}");
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The report of a `--json` run: the last line of its event stream, with
/// every earlier line a progress event.
pub fn report(o: &Output) -> serde_json::Value {
    let text = stdout(o);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let (last, events) = lines
        .split_last()
        .unwrap_or_else(|| panic!("no output; stderr: {}", stderr(o)));
    for e in events {
        let v: serde_json::Value =
            serde_json::from_str(e).unwrap_or_else(|err| panic!("event line {e}: {err}"));
        assert_eq!(v["event"], "progress", "{e}");
    }
    let v: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|err| panic!("report line {last}: {err}"));
    assert_eq!(v["event"], "done");
    v
}

/// Wait until a running backfill has committed progress (its once-a-second
/// `progress.jsonl` sample shows scanned items), so a kill lands mid-run
/// however slow the machine. Panics after `timeout`.
pub async fn wait_for_progress(state_dir: &Path, timeout: std::time::Duration) {
    let start = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(state_dir.join("progress.jsonl")).unwrap_or_default();
        if text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["scanned"].as_u64() > Some(0))
        {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "no backfill progress within {timeout:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The key schema most tests use: `PK` (S) and `SK` (S).
pub fn pk_sk() -> KeySchema {
    use rekey::core::plan::KeyAttr;
    use rekey::core::value::ScalarType;
    KeySchema {
        partition_key: KeyAttr {
            name: "PK".into(),
            ty: ScalarType::S,
        },
        sort_key: Some(KeyAttr {
            name: "SK".into(),
            ty: ScalarType::S,
        }),
    }
}
