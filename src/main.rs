//! The `rekey` binary: parse the arguments, convert them to a checked
//! configuration, run the command, print any error once.
//!
//! Ctrl-C and SIGTERM go through the process's [`Shutdown`]: a command that
//! took its stop token (a long-running one; see `ops::shutdown`) finishes the
//! work in flight, checkpoints, publishes a stopped status and exits 130
//! (SIGINT) or 143 (SIGTERM); any other command ends at once. A second Ctrl-C
//! exits at once. A closed stdout (`| head`) ends the
//! command quietly with 0.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Parser as _;
use rekey::ops::cli::{Cli, LogFormatArg, exit, exit_code};
use rekey::ops::config::Config;
use rekey::ops::log::{Format, LogOptions};
use rekey::ops::out;
use rekey::ops::shutdown::Shutdown;
use rekey::phase::error::Stopped;

/// mimalloc instead of the system allocator: a backfill builds and drops
/// several small maps and strings per item (SDK types, items, requests), and
/// glibc's malloc/free took a third of its CPU (BENCHMARKS.md (f3)).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`: its index in mimalloc v3's option
/// enum (mimalloc.h), which libmimalloc-sys does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keep freed memory for a second before returning it to the kernel (the
/// default is 10 ms). A Scan page is a ~1 MB response, allocated and freed
/// per page; returned at once, its memory is faulted in and zeroed by the
/// kernel again for the next page: 7 % of a backfill's CPU (BENCHMARKS.md
/// (f3)). Set only if the option at that index holds the documented default,
/// so another mimalloc with another enum is left as it is.
fn tune_allocator() {
    // SAFETY: plain reads and writes of mimalloc's option table, before any
    // thread is started.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 10 {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000);
        }
    }
}

fn main() {
    tune_allocator();
    let cli = Cli::parse();
    let json_log = cli.log_format == LogFormatArg::Json;
    let config = match Config::try_from(cli) {
        Ok(config) => config,
        Err(err) => {
            // Refused arguments: with --log-format json, a JSON line too.
            if json_log {
                rekey::ops::log::install(&LogOptions {
                    verbose: 0,
                    format: Format::Json,
                    command: "rekey",
                    plan: None,
                    show_keys: false,
                    metrics: false,
                });
            }
            fail(&err, exit::BAD_INPUT)
        }
    };
    rekey::ops::log::install(&config.log_options());
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => fail(
            &anyhow::Error::new(e).context("cannot start the async runtime"),
            exit::FAILURE,
        ),
    };
    let signal = Arc::new(AtomicI32::new(0));
    let shutdown = Shutdown::new();
    runtime.spawn(on_signals(shutdown.clone(), signal.clone()));
    let result = runtime.block_on(rekey::ops::commands::run(config, &shutdown));
    let stopped_by = signal.load(Ordering::SeqCst);
    match result {
        Ok(_) if stopped_by != 0 => std::process::exit(128 + stopped_by),
        Ok(code) => std::process::exit(code),
        // The reader of stdout went away (`| head`): nothing left to say.
        Err(err) if out::is_closed(&err) => std::process::exit(exit::OK),
        Err(err) if err.chain().any(|c| c.is::<Stopped>()) => {
            rekey::ops::log::say(&format!("{err:#}"));
            std::process::exit(128 + stopped_by.max(libc::SIGINT));
        }
        Err(err) => fail(&err, exit_code(&err)),
    }
}

/// The error, once, on stderr (a JSON line with `--log-format json`); then
/// exit with `code`.
fn fail(err: &anyhow::Error, code: i32) -> ! {
    rekey::ops::log::error(err);
    std::process::exit(code)
}

/// The first SIGINT or SIGTERM (recorded) stops a command that stops cleanly
/// through `shutdown`, and ends any other at once; a second SIGINT exits at
/// once.
async fn on_signals(shutdown: Shutdown, signal: Arc<AtomicI32>) {
    use tokio::signal::unix::{SignalKind, signal as listen};
    let (Ok(mut int), Ok(mut term)) = (
        listen(SignalKind::interrupt()),
        listen(SignalKind::terminate()),
    ) else {
        return; // no signal handling: the default (terminate) stays
    };
    let first = tokio::select! {
        _ = int.recv() => libc::SIGINT,
        _ = term.recv() => libc::SIGTERM,
    };
    signal.store(first, Ordering::SeqCst);
    if !shutdown.stops_cleanly() {
        std::process::exit(128 + first);
    }
    rekey::ops::log::say("stopping: finishing the work in flight (Ctrl-C again to exit at once)");
    shutdown.stop();
    if int.recv().await.is_some() {
        std::process::exit(128 + libc::SIGINT);
    }
}
