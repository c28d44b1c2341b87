//! rekey's integration tests: one test binary (the AWS SDK is linked once), a
//! module per area, over one support module (`support`: the test environment,
//! the plan builder, the workload, the client helpers).
//!
//! Run one area with `cargo test --test it backfill::`, one test with
//! `cargo test --test it -- --exact backfill::backfill_from_scan_equals_transform_of_source`.
//! Tests that must be alone in their process re-run themselves from this
//! binary (`support::rerun_alone`, `local::owner_process_helper`).

mod support;

mod analyze;
mod architecture;
mod backfill;
mod cli;
mod demo;
mod endpoints;
mod export;
mod fleet;
mod fleet_drain;
mod fleet_export;
mod fleet_tail;
mod image;
mod import;
mod inplace;
mod lifecycle;
mod lineage;
mod loadtest;
mod local;
mod logs;
mod many_shards;
mod metrics;
mod ops;
mod proxy;
mod query;
mod rollback;
mod soak;
mod stop;
mod suggest;
mod tail;
mod throttle;
mod verify;
