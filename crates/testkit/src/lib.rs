//! rekey's test and benchmark machinery, kept out of the shipped binary
//! (rekey depends on this crate only as a dev-dependency):
//!
//! * [`proxy`] — a throttling, fault-injecting HTTP proxy in front of the
//!   local server that also gives DynamoDB's `ConsumedCapacity` per item.
//! * [`export`] — writes a DynamoDB S3 export (manifests and gzip DynamoDB
//!   JSON) for the export reader's tests and benchmarks.

pub mod export;
pub mod proxy;
