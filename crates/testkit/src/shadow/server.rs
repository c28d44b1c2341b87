//! The validating shadow's process: dynalite (MIT, from npm), started on a
//! free port of 127.0.0.1 and killed with its owner, as the local server is
//! (`rekey::local::child`: it cannot outlive the test process, even on
//! SIGKILL).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rekey::local::child::{self, PortError, Shared};

/// Names dynalite's `cli.js` (scripts/test sets it).
pub const DYNALITE_ENV: &str = "REKEY_DYNALITE";
/// Where scripts/install-deps puts it, under the repository.
const INSTALL_PATH: &str = ".tools/node/node_modules/dynalite/cli.js";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A running dynalite; dropping it kills the process.
pub struct ShadowServer {
    endpoint: String,
    pid: u32,
    shared: Arc<Shared>,
    owner: Option<std::thread::JoinHandle<()>>,
}

impl ShadowServer {
    /// Starts dynalite and waits until it answers a `ListTables`. Tables are
    /// ACTIVE as soon as they are created, as the local server's are, so a
    /// write right after `CreateTable` is validated, not refused as early.
    pub async fn start() -> anyhow::Result<ShadowServer> {
        let cli = find_cli()?;
        let taken = |e: &anyhow::Error| format!("{e:#}").contains("EADDRINUSE");
        match child::start_on_port(None, |port| start_on(&cli, port), taken).await {
            Ok(result) => result,
            Err(PortError::InUse { port, source }) => {
                anyhow::bail!("dynalite: port {port} is taken: {source}")
            }
            Err(PortError::NoFreePort(source)) => anyhow::bail!("dynalite: no free port: {source}"),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for ShadowServer {
    fn drop(&mut self) {
        child::stop(&self.shared, self.pid, &mut self.owner);
    }
}

/// `$REKEY_DYNALITE`, else `.tools/node/…/cli.js` in the current directory
/// or an ancestor, or in the repository this crate was compiled from.
fn find_cli() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(DYNALITE_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        anyhow::ensure!(p.is_file(), "{DYNALITE_ENV}={} names no file", p.display());
        return Ok(p);
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    roots.extend(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(Path::to_path_buf),
    );
    roots
        .iter()
        .map(|r| r.join(INSTALL_PATH))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "dynalite is not installed (looked for {INSTALL_PATH} here and above, and \
                 ${DYNALITE_ENV}); run scripts/install-deps"
            )
        })
}

async fn start_on(cli: &Path, port: u16) -> anyhow::Result<ShadowServer> {
    let mut cmd = Command::new("node");
    cmd.arg(cli)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--createTableMs", "0", "--deleteTableMs", "0"])
        .args(["--updateTableMs", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shared = Arc::new(Shared::default());
    let (pid, owner) = child::spawn_owned(cmd, Arc::clone(&shared), "dynalite")
        .await
        .map_err(|e: io::Error| anyhow::anyhow!("could not run node {}: {e}", cli.display()))?;
    let server = ShadowServer {
        endpoint: format!("http://127.0.0.1:{port}"),
        pid,
        shared,
        owner: Some(owner),
    };
    let started = Instant::now();
    loop {
        if let Some(status) = server.shared.lock().status.clone() {
            anyhow::bail!(
                "dynalite exited before it was ready ({status}); its last output:\n{}",
                server.shared.output()
            );
        }
        if probe(port).await {
            return Ok(server);
        }
        anyhow::ensure!(
            started.elapsed() < READY_TIMEOUT,
            "dynalite at {} did not answer within {READY_TIMEOUT:?}; its last output:\n{}",
            server.endpoint,
            server.shared.output()
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn probe(port: u16) -> bool {
    let body = "{}";
    let request = format!(
        "POST / HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         Authorization: AWS4-HMAC-SHA256 \
         Credential=test/20260101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\n\
         Connection: close\r\n\
         \r\n\
         {body}",
        body.len()
    );
    child::http_probe(port, &request, Duration::from_secs(2)).await
}
