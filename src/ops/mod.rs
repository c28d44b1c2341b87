//! The operator surface: arguments ([`cli`]), the one conversion from
//! arguments to the phases' options ([`config`]), one small function per
//! command ([`commands`]), stdout ([`out`]: every byte printed there), progress
//! on the terminal, the log subscriber ([`log`]: `-v`, `RUST_LOG`), redaction
//! of key values, rendering, the IAM policy and the demo; the process's stop
//! ([`shutdown`]), handed to the commands that stop cleanly; the metrics a
//! long-running command serves or writes ([`metrics`]).
//!
//! Architecture invariant: only `ops` prints to stdout or redacts
//! (tests/architecture.rs).

pub mod cli;
pub mod commands;
pub mod config;
pub mod demo;
pub(crate) mod iam;
pub mod log;
pub(crate) mod metrics;
pub mod out;
pub(crate) mod progress;
pub mod redact;
pub mod shutdown;
pub(crate) mod status;
