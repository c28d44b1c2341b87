//! The operator surface: arguments, the one conversion from arguments to the
//! phases' options, one small function per command, progress on the
//! terminal, redaction of key values, rendering, the IAM policy and the demo.
//!
//! Architecture invariant: only `ops` prints to stdout or redacts
//! (tests/architecture.rs).

pub mod cli;
pub mod commands;
pub mod demo;
pub mod iam;
pub mod progress;
pub mod redact;
pub mod status;
