//! Child processes that cannot outlive rekey: the local server tests and the
//! demo start (moto). See [`spawn_owned`] for how, and why
//! the spawning thread matters.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Output lines kept for error messages.
pub(crate) const OUTPUT_LINES: usize = 40;
/// Longest output line kept.
pub(crate) const MAX_LINE: usize = 1000;

/// Spawns `cmd` so that it dies with this process, even on SIGKILL, and
/// returns its pid and the thread that owns it.
///
/// The child is spawned with `PR_SET_PDEATHSIG = SIGKILL`: the kernel kills
/// it when its parent goes away. That "parent" is not the process but the
/// THREAD that called fork: if that thread exits (a Tokio worker or blocking
/// thread is retired after a while, a scoped thread ends...), the child is
/// killed although the process lives on. So the child is spawned from a
/// dedicated thread that then blocks waiting for the child, and so lives
/// exactly as long as the child does. When the whole process dies, however
/// it dies (SIGKILL, `exit` without destructors, a panic with
/// `panic = "abort"`), that thread dies with it and the kernel kills the child.
///
/// The thread waits in two steps: first without reaping (`WNOWAIT`), then it
/// records that the child is gone and reaps it. Until it is reaped the pid
/// cannot be reused, so [`Shared::kill`], which checks the record under the
/// same lock, never signals an unrelated process.
///
/// It also drains the child's stdout and stderr into the shared ring buffer,
/// from two more threads (a full pipe would block the child).
pub async fn spawn_owned(
    mut cmd: Command,
    shared: Arc<Shared>,
    name: &str,
) -> io::Result<(u32, std::thread::JoinHandle<()>)> {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // If we died between fork and prctl, no signal will come: the
            // child has already been handed to another parent. Give up.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }

    let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel::<io::Result<u32>>();
    let owner = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let mut child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = spawned_tx.send(Err(e));
                    return;
                }
            };
            let pid = child.id();
            let mut readers = 0;
            if let Some(out) = child.stdout.take() {
                readers += spawn_reader(out, &shared);
            }
            if let Some(err) = child.stderr.take() {
                readers += spawn_reader(err, &shared);
            }
            shared.lock().open_readers += readers;
            if spawned_tx.send(Ok(pid)).is_err() {
                // `start` was cancelled while we spawned: nobody will own
                // this child. Not yet reaped, so the pid is still the child's.
                // SAFETY: plain syscall.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }

            wait_exited_no_reap(pid);
            shared.lock().exited = true;
            let status = match child.wait() {
                Ok(status) => status.to_string(),
                Err(e) => format!("could not wait for it: {e}"),
            };
            let mut state = shared.lock();
            state.status = Some(status);
            drop(state);
            shared.cond.notify_all();
        })?;

    match spawned_rx.await {
        Ok(Ok(pid)) => Ok((pid, owner)),
        Ok(Err(e)) => {
            let _ = owner.join();
            Err(e)
        }
        Err(_) => {
            let _ = owner.join();
            Err(io::Error::other(format!(
                "the thread spawning {name} panicked"
            )))
        }
    }
}

/// Blocks until child `pid` has exited, without reaping it.
pub(crate) fn wait_exited_no_reap(pid: u32) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Copies lines from `pipe` into the ring buffer until EOF; returns 1 if the
/// reader thread was started.
fn spawn_reader(pipe: impl Read + Send + 'static, shared: &Arc<Shared>) -> usize {
    let shared_for_thread = Arc::clone(shared);
    let reader = move || {
        let shared = shared_for_thread;
        let mut pipe = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match pipe.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => shared.push_line(&line),
            }
        }
        shared.lock().open_readers -= 1;
    };
    match std::thread::Builder::new()
        .name("child-output".into())
        .spawn(reader)
    {
        Ok(_) => 1,
        Err(_) => 0,
    }
}

/// State shared between the owner of a child process and the threads serving it.
#[derive(Default)]
pub struct Shared {
    state: Mutex<State>,
    /// Notified when `status` is set.
    cond: Condvar,
}

#[derive(Default)]
pub struct State {
    /// The child has exited (it may not be reaped yet): never signal its pid.
    pub exited: bool,
    /// How it ended, set once it has been reaped.
    pub status: Option<String>,
    /// Its last output lines.
    pub output: VecDeque<String>,
    /// Threads still reading its stdout or stderr.
    pub open_readers: usize,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves no broken invariant here.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push_line(&self, line: &[u8]) {
        let mut line = String::from_utf8_lossy(line).trim_end().to_string();
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str(" […]");
        }
        let mut state = self.lock();
        if state.output.len() == OUTPUT_LINES {
            state.output.pop_front();
        }
        state.output.push_back(line);
    }

    pub fn output(&self) -> String {
        let state = self.lock();
        if state.output.is_empty() {
            return "(no output)".to_string();
        }
        let lines: Vec<&str> = state.output.iter().map(String::as_str).collect();
        lines.join("\n")
    }

    /// SIGKILLs `pid` unless it has already exited.
    pub fn kill(&self, pid: u32) {
        let state = self.lock();
        if !state.exited {
            // SAFETY: plain syscall. The pid is still ours: it has not been
            // reaped, as `exited` is set (under this lock) before reaping.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }

    /// Waits until the child has been reaped; false on timeout.
    pub(crate) fn wait_reaped(&self, timeout: Duration) -> bool {
        let state = self.lock();
        let result = self
            .cond
            .wait_timeout_while(state, timeout, |s| s.status.is_none());
        match result {
            Ok((state, _)) => state.status.is_some(),
            Err(poisoned) => poisoned.into_inner().0.status.is_some(),
        }
    }
}

/// Why no port could be had for a local server.
#[derive(Debug)]
pub enum PortError {
    /// The port asked for is taken.
    InUse { port: u16, source: io::Error },
    /// No free port could be found.
    NoFreePort(io::Error),
}

/// Starts a local server with `start(port)`: on the port asked for, or on a
/// free one. A free port found by binding port 0 may be taken by someone else
/// before the server binds it, so then it tries up to three times while
/// `taken` says the start failed for that reason.
pub async fn start_on_port<T, E, Fut>(
    port: Option<u16>,
    start: impl Fn(u16) -> Fut,
    taken: impl Fn(&E) -> bool,
) -> Result<Result<T, E>, PortError>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let attempts = if port.is_some() { 1 } else { 3 };
    let mut attempt = 1;
    loop {
        let port = match port {
            Some(port) => {
                if let Err(source) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                    return Err(PortError::InUse { port, source });
                }
                port
            }
            None => free_port().map_err(PortError::NoFreePort)?,
        };
        match start(port).await {
            Err(e) if attempt < attempts && taken(&e) => attempt += 1,
            result => return Ok(result),
        }
    }
}

fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// How long dropping a server waits for its owner thread to reap it.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// Kills the child and waits (a bounded time) for its owner thread to reap
/// it, so its pid and port are free on return. True when it was reaped; on a
/// timeout the thread is left to reap it whenever it dies.
pub fn stop(shared: &Shared, pid: u32, owner: &mut Option<std::thread::JoinHandle<()>>) -> bool {
    shared.kill(pid);
    if shared.wait_reaped(REAP_TIMEOUT)
        && let Some(owner) = owner.take()
    {
        let _ = owner.join();
        return true;
    }
    false
}

/// One readiness probe of a local HTTP server: send `request` to the port and
/// read the status line. Any answer that is not a server error (1xx–4xx) means
/// its request handler is up — a port that accepts connections is not enough.
pub async fn http_probe(port: u16, request: &str, timeout: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(request.as_bytes()).await?;
        // "HTTP/1.1 200" is 12 bytes.
        let mut head = Vec::with_capacity(12);
        let mut buf = [0u8; 64];
        while head.len() < 12 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        io::Result::Ok(head)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(head)) => {
            head.starts_with(b"HTTP/1.") && head.len() >= 12 && matches!(head[9], b'1'..=b'4')
        }
        _ => false,
    }
}
