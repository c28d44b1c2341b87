//! The pure core: the item model, the functions plans use (`shard()`'s
//! hashes, time buckets), key templates, plans and the transform. No I/O, no
//! clock, no randomness: everything here is a plain function of its inputs,
//! tested as such (the load test's workload is a seeded sequence: a function
//! of its seed). `inverse` reads a plan backwards: target item → source item.
//!
//! Architecture invariant: `core` imports only `core` (tests/architecture.rs).

pub(crate) mod bucket;
#[cfg(test)]
pub(crate) mod fixture;
pub mod hash;
pub(crate) mod import;
pub mod inverse;
pub mod itemline;
pub(crate) mod loadtest;
pub mod marker;
pub mod plan;
pub mod query;
pub(crate) mod suggest;
pub(crate) mod template;
pub mod transform;
pub mod value;
