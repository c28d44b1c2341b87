//! rekey's test and benchmark machinery, kept out of the shipped binary
//! (rekey depends on this crate only as a dev-dependency):
//!
//! * [`proxy`] — a throttling, fault-injecting HTTP proxy in front of the
//!   local server that also gives DynamoDB's `ConsumedCapacity` per item.
//! * [`shadow`] — strict request validation: dynalite as a validating shadow
//!   the proxy asks first, so a request DynamoDB refuses fails the test.
//! * [`standin`] — a stand-in for a fast DynamoDB (and its stream) that
//!   answers from generated items, for benchmarks the local server would cap
//!   (binary `rekey-standin`).
//! * [`limits`] — DynamoDB's per-key and per-table throughput limits as token
//!   buckets, shared by the proxy and the stand-in.
//! * [`streams`] — a stream front: DynamoDB Streams as DynamoDB serves
//!   them (a shard per partition, rollovers and splits, records readable
//!   late, empty pages, expiring iterators, trimming) in front of the local
//!   server's one-shard stream.
//! * [`partitions`] — DynamoDB's throughput per partition: burst, adaptive
//!   capacity, split for heat, GSIs; the proxy's alternative to [`limits`].
//! * [`keyspace`] — where DynamoDB keeps an item: the hash ring and its
//!   partitions' ranges.
//! * [`export`] — writes a DynamoDB S3 export (manifests and gzip DynamoDB
//!   JSON) for the export reader's tests and benchmarks.

pub mod export;
mod http;
pub mod keyspace;
pub mod limits;
pub mod partitions;
pub mod proxy;
pub mod shadow;
pub mod standin;
pub mod streams;
