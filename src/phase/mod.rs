//! The phases of a migration, each the body of one command: analyze, check,
//! backfill, in-place updates, tail, the stream watch, drain barriers,
//! verify, cutover and the lifecycle that runs them in order; and the load
//! test that measures a plan's two designs under the application's traffic. A phase reads
//! and writes AWS only through `aws`, keeps its checkpoints through `state`,
//! and reports through the progress handle it is given.
//!
//! Architecture invariant: `phase` never imports `ops` (tests/architecture.rs).

pub(crate) mod analyze;
pub mod backfill;
pub(crate) mod barrier;
pub(crate) mod check;
pub(crate) mod cutover;
pub mod error;
pub(crate) mod fleet;
pub mod inplace;
pub(crate) mod lifecycle;
pub(crate) mod loadtest;
pub mod markers;
pub(crate) mod progress;
pub mod query;
pub(crate) mod suggest;
pub(crate) mod tail;
pub mod verify;
pub mod watch;
