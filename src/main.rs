//! The `rekey` binary: parse arguments, run the command, print any error once.
//!
//! Ctrl-C and SIGTERM cancel the run's stop token: a long-running command
//! finishes the work in flight, checkpoints, publishes a stopped status and
//! exits 130 (SIGINT) or 143 (SIGTERM). A second Ctrl-C exits at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Parser as _;
use rekey::ops::cli::{Cli, exit, exit_code};
use rekey::phase::error::Stopped;
use tokio_util::sync::CancellationToken;

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(exit::FAILURE);
        }
    };
    let stop = CancellationToken::new();
    let signal = Arc::new(AtomicI32::new(0));
    let clean = cli.command.stops_cleanly();
    runtime.spawn(on_signals(stop.clone(), signal.clone(), clean));
    let result = runtime.block_on(rekey::ops::commands::run(cli, stop));
    let stopped_by = signal.load(Ordering::SeqCst);
    match result {
        Ok(_) if stopped_by != 0 => std::process::exit(128 + stopped_by),
        Ok(code) => std::process::exit(code),
        Err(err) if err.chain().any(|c| c.is::<Stopped>()) => {
            eprintln!("{err:#}");
            std::process::exit(128 + stopped_by.max(libc::SIGINT));
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(exit_code(&err));
        }
    }
}

/// The first SIGINT or SIGTERM cancels `stop` (and records which) for a
/// command that stops cleanly, and ends any other at once; a second SIGINT
/// exits at once.
async fn on_signals(stop: CancellationToken, signal: Arc<AtomicI32>, clean: bool) {
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
    if !clean {
        std::process::exit(128 + first);
    }
    eprintln!("stopping: finishing the work in flight (Ctrl-C again to exit at once)");
    stop.cancel();
    if int.recv().await.is_some() {
        std::process::exit(128 + libc::SIGINT);
    }
}
