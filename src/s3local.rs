//! Start a real S3 server (moto's `moto_server`) on this machine.
//!
//! The export reader's tests need a real S3 endpoint: a mock of the SDK would
//! not catch signing, path-style addressing, streaming bodies or error codes.
//! moto (<https://github.com/getmoto/moto>) implements S3's HTTP API in
//! Python; `pip install 'moto[server]'` provides `moto_server`. It keeps
//! everything in memory and accepts any credentials. A client for it needs
//! path-style addressing: see the example in [`crate::export`]'s docs.
//!
//! [`S3Local::start`] runs one instance on a free port of 127.0.0.1
//! (`moto_server -H 127.0.0.1 -p PORT`) and waits until it answers a
//! `ListBuckets`; dropping the value kills it. Like DynamoDB Local in
//! `local.rs`, the server can never outlive the process that started it, not
//! even when that process is killed with SIGKILL: see [`spawn_owned`].

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::{self, PortError, Shared, spawn_owned};

/// Environment variable naming the `moto_server` executable.
pub const SERVER_ENV: &str = "REKEY_MOTO_SERVER";
/// Where the project's install puts it, relative to the repository root.
const INSTALL_PATH: &str = ".tools/venv/bin/moto_server";
const PROGRAM: &str = "moto_server";

/// How long [`S3Local::start`] waits for the server to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to start the server.
#[derive(Debug, Clone, Default)]
pub struct S3LocalOptions {
    /// The `moto_server` executable; `None` searches for it, see
    /// [`S3Local::find_server`].
    pub server: Option<PathBuf>,
    /// Port to listen on (on 127.0.0.1); `None` picks a free one.
    pub port: Option<u16>,
}

/// Why the server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum S3LocalError {
    #[error(
        "moto_server is not installed: not found at {}; install it with \
         `python3 -m venv .tools/venv && .tools/venv/bin/pip install 'moto[server]'` \
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

/// A running moto S3 server; dropping it kills the server.
pub struct S3Local {
    endpoint: String,
    port: u16,
    pid: u32,
    shared: Arc<Shared>,
    owner: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for S3Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Local")
            .field("endpoint", &self.endpoint)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl S3Local {
    /// Finds `moto_server`. In order: `explicit`; else the environment
    /// variable `REKEY_MOTO_SERVER`; else `.tools/venv/bin/moto_server` in
    /// the current directory or one of its ancestors (nearest first), then
    /// in the directory this crate was compiled from or its ancestors; else
    /// `moto_server` on `PATH`. An explicit path or the environment variable
    /// that names no file is an error, not a reason to look elsewhere.
    pub fn find_server(explicit: Option<&Path>) -> Result<PathBuf, S3LocalError> {
        let check = |p: &Path| {
            if is_executable(p) {
                Ok(p.to_path_buf())
            } else {
                Err(S3LocalError::NotInstalled {
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

    /// Starts a server on 127.0.0.1 with default options.
    pub async fn start() -> Result<S3Local, S3LocalError> {
        Self::start_with(&S3LocalOptions::default()).await
    }

    /// Starts a server and waits (up to 60 s) until it answers `ListBuckets`.
    /// Needs a Tokio runtime with `net` and `time`; the server is not tied to
    /// the runtime and the value may be dropped anywhere.
    pub async fn start_with(opts: &S3LocalOptions) -> Result<S3Local, S3LocalError> {
        let program = Self::find_server(opts.server.as_deref())?;
        let taken = |e: &S3LocalError| matches!(e, S3LocalError::Exited { output, .. } if output.contains("Address already in use"));
        match child::start_on_port(opts.port, |port| start_on(&program, port), taken).await {
            Ok(result) => result,
            Err(PortError::InUse { port, source }) => Err(S3LocalError::PortInUse { port, source }),
            Err(PortError::NoFreePort(source)) => Err(S3LocalError::Spawn {
                program: program.clone(),
                source,
            }),
        }
    }

    /// `http://127.0.0.1:PORT`, for the SDK's `endpoint_url`.
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

impl Drop for S3Local {
    fn drop(&mut self) {
        child::stop(&self.shared, self.pid, &mut self.owner);
    }
}

fn is_executable(p: &Path) -> bool {
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn search(roots: &[PathBuf], path_var: Option<OsString>) -> Result<PathBuf, S3LocalError> {
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
    Err(S3LocalError::NotInstalled { searched })
}

async fn start_on(program: &Path, port: u16) -> Result<S3Local, S3LocalError> {
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(program);
    cmd.arg("-H")
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
        .map_err(|source| S3LocalError::Spawn {
            program: program.to_path_buf(),
            source,
        })?;
    // From here on, dropping `local` kills the server, whatever happens.
    let local = S3Local {
        endpoint,
        port,
        pid,
        shared,
        owner: Some(owner),
    };

    let started = Instant::now();
    let mut exited_at: Option<Instant> = None;
    loop {
        if let Some(status) = local.shared.lock().status.clone() {
            let since = *exited_at.get_or_insert_with(Instant::now);
            if local.shared.lock().open_readers == 0 || since.elapsed() > Duration::from_secs(1) {
                return Err(S3LocalError::Exited {
                    status,
                    output: local.shared.output(),
                });
            }
        } else if probe(port).await {
            return Ok(local);
        } else if started.elapsed() >= READY_TIMEOUT {
            return Err(S3LocalError::NotReady {
                endpoint: local.endpoint.clone(),
                waited: started.elapsed(),
                output: local.shared.output(),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// One readiness probe: an anonymous `GET /` (S3 ListBuckets) gets an HTTP
/// answer that is not a server error. moto accepts unsigned requests.
async fn probe(port: u16) -> bool {
    let request = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    child::http_probe(port, &request, PROBE_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_prefers_the_nearest_install_then_path() {
        let base = tempfile::tempdir().unwrap();
        let (near, far, bin) = (
            base.path().join("a/b"),
            base.path().join("a"),
            base.path().join("bin"),
        );
        let install = |root: &Path| {
            let p = root.join(INSTALL_PATH);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let far_install = install(&far);
        std::fs::create_dir_all(&near).unwrap();
        assert_eq!(
            search(&[near.clone(), far.clone()], None).unwrap(),
            far_install
        );
        let near_install = install(&near);
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
}
