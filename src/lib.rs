//! rekey re-keys live DynamoDB tables online: it copies every item into a new
//! key design while the application keeps writing.
//!
//! # Layers
//!
//! The folders are the layers; ARCHITECTURE.md states what each may not know,
//! and `tests/it/architecture.rs` checks it against these sources.
//!
//! * [`core`] — pure: the item model and DynamoDB JSON, `shard()` hashes and
//!   time buckets, key templates, plans (errors at `file:line:col`), the
//!   transform, the marker rule. No I/O, no clock; imports only `core`.
//! * [`aws`] — the only code that calls the AWS SDK: clients and endpoints,
//!   errors that name what to fix, retry and rate budgets, Scan, batch and
//!   single-item writes and reads, conditional updates, DynamoDB Streams (one
//!   GetRecords for every reader), the S3 export reader.
//! * [`state`] — what a migration keeps on this machine: the state directory
//!   ([`state::StateDir`] names every path once), the sled store, the claim
//!   index, spill files, the control file, rejects, and the typed snapshots
//!   other processes read. Never imports `phase`.
//! * [`phase`] — the phases: analyze, check, backfill, in place, tail, the
//!   stream watch, drain barriers, verify, cutover, and `run`'s lifecycle.
//!   They report through [`phase::progress`] and stop through a cancellation
//!   token; never import `ops`.
//! * [`ops`] — the operator surface, the only code that prints to stdout or
//!   redacts: arguments, the one conversion to a checked config, one function
//!   per command, progress on the terminal, rendering, the IAM policy, the demo.
//! * [`local`] — the local AWS (moto) that tests and the demo start.

// Every import names what it takes: a file's imports are its dependencies,
// and the architecture test reads them (test modules may `use super::*`).
#![deny(clippy::wildcard_imports)]

pub mod aws;
pub mod core;
pub mod local;
pub mod ops;
pub mod phase;
pub mod state;
