//! The local AWS that tests and `rekey demo` run against: one `moto_server`
//! (moto, Apache-2.0) serving DynamoDB, DynamoDB Streams and S3 on one port.
//!
//! rekey needs a real server to talk to: mocks would not catch wire format,
//! pagination, conditional writes, Streams or signing. `scripts/install-deps`
//! installs a pinned `moto[server]` into `<repo>/.tools/venv`. moto keeps
//! everything in memory, accepts any credentials and region, and is not
//! DynamoDB: docs/test-backend.md lists where it differs and
//! what gives the tests DynamoDB's behaviour there (the throttling proxy for
//! capacity per item, the multi-shard stream double for shard lineage). One
//! difference is fixed here, for everyone: moto handles requests on parallel
//! threads without a lock, so this module runs moto's server through
//! `serve.py`, which takes one request at a time (see that file for why).
//!
//! [`LocalServer::start`] runs one instance on a free port of 127.0.0.1 and
//! waits until DynamoDB answers there; dropping the value kills it. The server
//! can never outlive the process that started it, not even one killed with
//! SIGKILL: see [`child::spawn_owned`].

pub mod child;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use child::{PortError, Shared, spawn_owned};

/// Environment variable naming the `moto_server` executable.
pub(crate) const SERVER_ENV: &str = "REKEY_MOTO_SERVER";
/// Where `scripts/install-deps` puts it, relative to the repository root.
const INSTALL_PATH: &str = ".tools/venv/bin/moto_server";
const PROGRAM: &str = "moto_server";
/// moto's server with one lock around every request.
const SERVE_PY: &str = include_str!("serve.py");

/// How long [`LocalServer::start`] waits for the server to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to start the server.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// The `moto_server` executable; `None` searches for it, see
    /// [`LocalServer::find_server`].
    pub server: Option<PathBuf>,
    /// Port to listen on (on 127.0.0.1); `None` picks a free one.
    pub port: Option<u16>,
}

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(
        "moto_server is not installed: not found at {}; run scripts/install-deps \
         (or set {SERVER_ENV} to its path)",
        .searched.join(", ")
    )]
    NotInstalled { searched: Vec<String> },
    #[error("could not run {}: {source}", .program.display())]
    Spawn { program: PathBuf, source: io::Error },
    #[error("cannot start moto_server on port {port} of 127.0.0.1: {source}")]
    PortInUse { port: u16, source: io::Error },
    #[error(
        "moto_server at {endpoint} did not answer within {waited:?}; its last output:\n{output}"
    )]
    NotReady {
        endpoint: String,
        waited: Duration,
        output: String,
    },
    #[error("moto_server exited before it was ready ({status}); its last output:\n{output}")]
    Exited { status: String, output: String },
}

/// A running local server; dropping it kills the server.
pub struct LocalServer {
    endpoint: String,
    port: u16,
    pid: u32,
    shared: Arc<Shared>,
    owner: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for LocalServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalServer")
            .field("endpoint", &self.endpoint)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl LocalServer {
    /// Finds `moto_server`. In order: `explicit`; else the environment
    /// variable `REKEY_MOTO_SERVER`; else `.tools/venv/bin/moto_server` in
    /// the current directory or one of its ancestors (nearest first), then
    /// in the directory this crate was compiled from or its ancestors; else
    /// `moto_server` on `PATH`. An explicit path or the environment variable
    /// that names no file is an error, not a reason to look elsewhere.
    pub fn find_server(explicit: Option<&Path>) -> Result<PathBuf, LocalError> {
        let check = |p: &Path| {
            if is_executable(p) {
                Ok(p.to_path_buf())
            } else {
                Err(LocalError::NotInstalled {
                    searched: vec![p.display().to_string()],
                })
            }
        };
        if let Some(p) = explicit {
            return check(p);
        }
        if let Some(p) = std::env::var_os(SERVER_ENV).filter(|p| !p.is_empty()) {
            return check(Path::new(&p));
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
        search(&roots, std::env::var_os("PATH"))
    }

    /// Starts a server on 127.0.0.1 and waits (up to 60 s) until DynamoDB
    /// answers a `ListTables` there. Needs a Tokio runtime with `net` and
    /// `time`; the server is not tied to the runtime and the value may be
    /// dropped anywhere.
    pub async fn start(opts: &LocalOptions) -> Result<LocalServer, LocalError> {
        let program = Self::find_server(opts.server.as_deref())?;
        let python = interpreter_of(&program)?;
        let taken = |e: &LocalError| matches!(e, LocalError::Exited { output, .. } if output.contains("Address already in use"));
        match child::start_on_port(opts.port, |port| start_on(&python, port), taken).await {
            Ok(result) => result,
            Err(PortError::InUse { port, source }) => Err(LocalError::PortInUse { port, source }),
            Err(PortError::NoFreePort(source)) => Err(LocalError::Spawn {
                program: program.clone(),
                source,
            }),
        }
    }

    /// `http://127.0.0.1:PORT`, for the SDK's `endpoint_url` (DynamoDB,
    /// Streams and S3 alike; S3 needs path-style addressing).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        child::stop(&self.shared, self.pid, &mut self.owner);
    }
}

fn is_executable(p: &Path) -> bool {
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn search(roots: &[PathBuf], path_var: Option<OsString>) -> Result<PathBuf, LocalError> {
    let mut searched: Vec<String> = Vec::new();
    for root in roots {
        let candidate = root.join(INSTALL_PATH);
        let shown = candidate.display().to_string();
        if searched.contains(&shown) {
            continue;
        }
        searched.push(shown);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    if let Some(path_var) = path_var {
        for dir in std::env::split_paths(&path_var) {
            let candidate = dir.join(PROGRAM);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    searched.push(format!("{PROGRAM} on PATH"));
    Err(LocalError::NotInstalled { searched })
}

/// The Python that runs `moto_server`: the interpreter on its `#!` line (pip
/// writes one into every console script), else a `python3` beside it (pip's
/// `/bin/sh` trampoline for long paths, or a venv).
fn interpreter_of(program: &Path) -> Result<PathBuf, LocalError> {
    let head = std::fs::read(program)
        .map(|b| String::from_utf8_lossy(&b[..b.len().min(512)]).into_owned())
        .unwrap_or_default();
    let shebang = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .and_then(|l| l.split_whitespace().next())
        .map(PathBuf::from);
    let named_python = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python"))
    };
    if let Some(p) = shebang.filter(|p| named_python(p) && is_executable(p)) {
        return Ok(p);
    }
    let dir = program.parent().unwrap_or(Path::new("."));
    ["python3", "python"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| is_executable(p))
        .ok_or_else(|| LocalError::NotInstalled {
            searched: vec![format!(
                "the Python interpreter of {} (its #! line, or python3 beside it)",
                program.display()
            )],
        })
}

async fn start_on(python: &Path, port: u16) -> Result<LocalServer, LocalError> {
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(SERVE_PY)
        .arg("-H")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    let shared = Arc::new(Shared::default());
    let (pid, owner) = spawn_owned(cmd, Arc::clone(&shared), "moto-server")
        .await
        .map_err(|source| LocalError::Spawn {
            program: python.to_path_buf(),
            source,
        })?;
    // From here on, dropping `local` kills the server, whatever happens.
    let local = LocalServer {
        endpoint,
        port,
        pid,
        shared,
        owner: Some(owner),
    };

    let started = Instant::now();
    let mut exited_at: Option<Instant> = None;
    loop {
        let (status, open_readers) = {
            let state = local.shared.lock();
            (state.status.clone(), state.open_readers)
        };
        if let Some(status) = status {
            // Give the output readers a moment to drain the pipes, so that
            // the error shows the server's last words.
            let since = *exited_at.get_or_insert_with(Instant::now);
            if open_readers == 0 || since.elapsed() > Duration::from_secs(1) {
                return Err(LocalError::Exited {
                    status,
                    output: local.shared.output(),
                });
            }
        } else if probe(port).await {
            return Ok(local);
        } else if started.elapsed() >= READY_TIMEOUT {
            return Err(LocalError::NotReady {
                endpoint: local.endpoint.clone(),
                waited: started.elapsed(),
                output: local.shared.output(),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// One readiness probe: a DynamoDB `ListTables` gets an HTTP answer that is
/// not a server error. (moto loads a service on its first request; probing
/// DynamoDB means the first test's request is not the slow one.) moto does
/// not check signatures, but routes on the credential scope's service name.
async fn probe(port: u16) -> bool {
    let body = "{}";
    let request = format!(
        "POST / HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         Authorization: AWS4-HMAC-SHA256 \
         Credential=local/20240101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\n\
         Connection: close\r\n\
         \r\n\
         {body}",
        body.len()
    );
    child::http_probe(port, &request, PROBE_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use child::{MAX_LINE, OUTPUT_LINES};

    fn install(root: &Path, rel: &str, text: &str) -> PathBuf {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn search_prefers_the_nearest_install_then_path() {
        let base = tempfile::tempdir().unwrap();
        let (near, far, bin) = (
            base.path().join("a/b"),
            base.path().join("a"),
            base.path().join("bin"),
        );
        let far_install = install(&far, INSTALL_PATH, "#!/bin/sh\n");
        std::fs::create_dir_all(&near).unwrap();
        assert_eq!(
            search(&[near.clone(), far.clone()], None).unwrap(),
            far_install
        );
        let near_install = install(&near, INSTALL_PATH, "#!/bin/sh\n");
        assert_eq!(search(&[near.clone(), far], None).unwrap(), near_install);

        std::fs::create_dir_all(&bin).unwrap();
        let on_path = bin.join(PROGRAM);
        std::fs::write(&on_path, "#!/bin/sh\n").unwrap();
        // Not executable: skipped.
        let path_var = std::env::join_paths([&bin]).unwrap();
        let err = search(&[base.path().join("none")], Some(path_var.clone())).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("moto_server on PATH") && msg.contains(".tools/venv/bin/moto_server"),
            "{msg}"
        );
        std::fs::set_permissions(&on_path, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            search(&[base.path().join("none")], Some(path_var)).unwrap(),
            on_path
        );
    }

    #[test]
    fn the_interpreter_is_the_shebang_or_a_python_beside_the_script() {
        let base = tempfile::tempdir().unwrap();
        let python = install(base.path(), "py/bin/python3.11", "");
        let script = install(
            base.path(),
            "tools/moto_server",
            &format!("#!{} -s\nimport moto\n", python.display()),
        );
        assert_eq!(interpreter_of(&script).unwrap(), python);

        // pip's trampoline for long paths: `#!/bin/sh` then `exec` python.
        let venv_script = install(
            base.path(),
            "venv/bin/moto_server",
            "#!/bin/sh\n'''exec' x\n",
        );
        let err = interpreter_of(&venv_script).unwrap_err().to_string();
        assert!(err.contains("python3 beside it"), "{err}");
        let beside = install(base.path(), "venv/bin/python3", "");
        assert_eq!(interpreter_of(&venv_script).unwrap(), beside);
    }

    #[test]
    fn output_ring_keeps_the_last_lines() {
        let shared = Shared::default();
        for i in 0..100 {
            shared.push_line(format!("line {i}\n").as_bytes());
        }
        shared.push_line("é".repeat(MAX_LINE).as_bytes());
        let output = shared.output();
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines.len(), OUTPUT_LINES);
        assert_eq!(lines[0], "line 61");
        assert!(lines[OUTPUT_LINES - 1].ends_with(" […]"));
    }
}
