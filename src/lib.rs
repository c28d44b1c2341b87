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
//!   They report through `phase::progress` and stop through a cancellation
//!   token; never import `ops`.
//! * [`ops`] — the operator surface, the only code that prints to stdout or
//!   redacts: arguments, the one conversion to a checked config, one function
//!   per command, progress on the terminal, rendering, the IAM policy, the demo.
//! * [`local`] — the local AWS (moto) that tests and the demo start.
//!
//! # The public surface
//!
//! The library has three users outside it: `src/main.rs` (the binary), the
//! integration tests (`tests/it`, and the `bench_export` example), and the
//! dev-only crate `crates/testkit` (the stand-in, proxy and export writer the
//! tests run against). Only the modules those name are `pub`, at the paths
//! they already use (`rekey::core::value::Item`, `rekey::ops::cli::Cli`, …),
//! and within them only the items they name; everything else is `pub(crate)`
//! or private, so that the compiler's `dead_code` lint sees code nothing
//! calls. Code only unit tests call is `#[cfg(test)]`. The list of public
//! modules, each with the user that needs it, is in `tests/it/architecture.rs`
//! (`architecture_invariant_only_listed_modules_are_public`): a new `pub mod`
//! fails there until it is listed with its reason, or made `pub(crate)`.

// Every import names what it takes: a file's imports are its dependencies,
// and the architecture test reads them (test modules may `use super::*`).
#![deny(clippy::wildcard_imports)]
// A function is read whole: none in the shipped code is over 150 lines
// (clippy.toml); tests, which read as scripts, may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod aws;
pub mod core;
pub mod local;
pub mod ops;
pub mod phase;
pub mod state;
