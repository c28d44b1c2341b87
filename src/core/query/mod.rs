//! The read path of a re-keyed design, as pure functions: what `rekey query`
//! (and an application, through the references in `docs/ref/`) does to read
//! one logical key that the plan spread over several partition keys.
//!
//! * [`keys`] renders the partition keys of a logical key: the rule's key
//!   template with the `--where` values, one key per `shard()` value and per
//!   `bucket()` label in a time range;
//! * [`range`] is the sort-key condition of the read, narrowed by where a
//!   previous page ended, and the one DynamoDB key condition that fetches it;
//! * [`merge`] merges the keys' streams by sort key, a page at a time;
//! * [`cursor`] is the versioned, opaque position a page ends at.
//!
//! Nothing here calls DynamoDB: `phase::query` drives a [`merge::PageRun`]
//! with Query calls, the tests drive it with an in-memory table. The design,
//! and why paging neither repeats nor skips an item while the table changes,
//! is in `docs/read-path.md`.

pub(crate) mod cursor;
pub(crate) mod keys;
#[cfg(test)]
mod memory;
pub(crate) mod merge;
pub(crate) mod range;

#[cfg(test)]
mod tests;

pub use cursor::{Cursor, CursorError, QueryId};
pub use keys::{LogicalKey, TimeRange};
pub(crate) use merge::PageRun;
pub(crate) use range::KeyCondition;
pub use range::{Order, SkCondition};
