//! The process's stop, handed to the command that runs rather than carried
//! in its options (issue 26), as mini-redis hands `server::run(listener,
//! shutdown)` its shutdown signal.
//!
//! `main` creates one [`Shutdown`] and passes it to
//! [`commands::run`](crate::ops::commands::run). Every long-running phase
//! (backfill, undo, worker, tail, reverse, tail --fleet, verify, verify
//! --state, run) takes its stop token as a parameter, and the only way to get
//! that token is [`Shutdown::stop_cleanly`], which also records that this
//! command stops cleanly. So the knowledge "this command stops cleanly" is
//! the command dispatch itself, checked by the compiler:
//!
//! * a command that drives a long-running phase cannot forget the token (the
//!   phase's `run` does not compile without it), and getting it is what makes
//!   the command one that stops cleanly;
//! * a command that never asks for it cannot see a stop, so the first signal
//!   ends it at once (exit 128 + signal), as it should.
//!
//! There is no placeholder token in the configuration to overwrite, and no
//! second list of clean-stopping commands to keep in step with the first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

/// The stop of one process run: its token, and whether the command running
/// asked for it. Clones share both (the signal handler holds one).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
    /// Set by [`Shutdown::stop_cleanly`]; read by the signal handler.
    clean: Arc<AtomicBool>,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// The stop token, for a command whose phases finish their work in
    /// flight, checkpoint and return `Stopped` once it is cancelled: from
    /// this call on, the first signal cancels the token instead of ending
    /// the process. Called before the command does any work, so a signal
    /// that comes earlier ends a process that has nothing in flight.
    pub(crate) fn stop_cleanly(&self) -> CancellationToken {
        self.clean.store(true, Ordering::SeqCst);
        self.token.clone()
    }

    /// Whether the command running asked for the stop token.
    pub fn stops_cleanly(&self) -> bool {
        self.clean.load(Ordering::SeqCst)
    }

    /// A signal came: cancel the token if the command stops cleanly (true);
    /// false if it does not, and the caller ends the process.
    pub fn stop(&self) -> bool {
        if !self.stops_cleanly() {
            return false;
        }
        self.token.cancel();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_never_asks_for_the_token_does_not_stop_cleanly() {
        let s = Shutdown::new();
        assert!(!s.stops_cleanly());
        assert!(!s.stop(), "no clean stop: the caller exits at once");
    }

    #[test]
    fn asking_for_the_token_makes_the_stop_clean_and_a_signal_cancels_it() {
        let s = Shutdown::new();
        let handler = s.clone();
        let token = s.stop_cleanly();
        assert!(handler.stops_cleanly(), "clones share the flag");
        assert!(!token.is_cancelled());
        assert!(handler.stop());
        assert!(token.is_cancelled());
    }

    /// `check` runs to its end without the token: a signal would end it at once.
    #[tokio::test]
    async fn the_dispatch_hands_check_no_token() {
        use clap::Parser as _;
        let plan = concat!(env!("CARGO_MANIFEST_DIR"), "/plans/tenant-day-shard.toml");
        let cli = crate::ops::cli::Cli::try_parse_from(["rekey", "-q", "check", plan]).unwrap();
        let config = crate::ops::config::Config::from_args(cli, &|_| None).unwrap();
        let shutdown = Shutdown::new();
        crate::ops::commands::run(config, &shutdown).await.unwrap();
        assert!(!shutdown.stops_cleanly());
    }
}
