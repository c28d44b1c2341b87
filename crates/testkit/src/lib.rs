//! rekey's test and benchmark machinery, kept out of the shipped binary
//! (rekey depends on this crate only as a dev-dependency):
//!
//! * [`proxy`] — a throttling, fault-injecting HTTP proxy in front of the
//!   local server that also gives DynamoDB's `ConsumedCapacity` per item.
//! * [`standin`] — a stand-in for a fast DynamoDB (and its stream) that
//!   answers from generated items, for benchmarks the local server would cap
//!   (binary `rekey-standin`).
//! * [`limits`] — DynamoDB's per-key and per-table throughput limits as token
//!   buckets, shared by the proxy and the stand-in.
//! * [`export`] — writes a DynamoDB S3 export (manifests and gzip DynamoDB
//!   JSON) for the export reader's tests and benchmarks.

pub mod export;
mod http;
pub mod limits;
pub mod proxy;
pub mod standin;
