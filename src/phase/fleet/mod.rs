//! The fleet's scheduler: how N processes share one migration's units
//! through a DynamoDB control table ([`crate::state::fleet`]). The backfill's
//! workers (`phase::backfill::fleet`) and the fleet's verify
//! (`phase::verify::fleet`) lease their units the same way — conditional
//! takes (the KCL's lease pattern), renewals on a heartbeat, a fence on each
//! process's own clock, re-balancing, release — and differ only in what a
//! unit does ([`Drive`]); so the scheduler is neither's, and both use it.
//!
//! The budgets are the table's: each process takes its share (÷ live
//! processes), re-read on every heartbeat.

mod lead;
mod schedule;
mod segment;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::state::fleet::held::Holdings;
use crate::state::fleet::shard::ShardKey;
use crate::state::fleet::{Fleet, Lease, Unit};

pub(crate) use lead::{Beside, lead};
pub(crate) use segment::{UnitScan, scan_unit};

/// What runs the units a fleet process leases: the backfill's pages
/// (`phase::backfill::fleet`) or the verify's (`phase::verify::fleet`). The
/// leases, the heartbeat, the fence, the re-balancing and the release are
/// the same ([`lead`]).
pub(crate) trait Drive: Send + Sync + 'static {
    /// Runs `unit` under lease `l` until it is done (true), `stop` is
    /// cancelled (false: the page in flight committed), or the lease is
    /// lost ([`LeaseLost`]).
    fn run(
        self: Arc<Self>,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> futures::future::BoxFuture<'static, anyhow::Result<bool>>;
    /// Items this process has committed (its progress line).
    fn scanned(&self) -> futures::future::BoxFuture<'_, u64>;
    /// Every unit is done: record it (the backfill's "done", the verify's verdict).
    fn all_done(&self) -> futures::future::BoxFuture<'_, anyhow::Result<()>>;
}

/// How a fleet process leases units.
#[derive(Debug, Clone)]
pub(crate) struct Leasing {
    /// Units held at once, at most.
    pub max_units: usize,
    pub stop: CancellationToken,
}

/// What a fleet process's tasks share.
pub(crate) struct Shared {
    pub(crate) fleet: Fleet,
    /// The units held.
    units: Holdings<u32>,
    /// The stream shards held (`rekey worker --tail`): renewed by the same heartbeat.
    pub(crate) shards: Arc<Holdings<ShardKey>>,
    /// Units this worker handed back (re-balancing), in order.
    handed_back: std::sync::Mutex<Vec<u32>>,
}

impl Shared {
    pub(crate) fn new(fleet: Fleet, lease: Duration) -> Arc<Shared> {
        let started = Instant::now();
        Arc::new(Shared {
            fleet,
            units: Holdings::new(started, lease),
            shards: Arc::new(Holdings::new(started, lease)),
            handed_back: std::sync::Mutex::default(),
        })
    }

    fn now(&self) -> Duration {
        self.units.now()
    }

    /// The fence: may this worker still write for `unit`?
    pub(crate) fn may_write(&self, unit: u32, l: Lease) -> bool {
        self.units.may_write(&unit, l.lease)
    }

    fn held_units(&self) -> Vec<u32> {
        self.units.keys()
    }

    /// The units this process handed back (re-balancing), in order.
    pub(crate) fn handed_back(&self) -> Vec<u32> {
        self.handed_back
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }
}

/// The table's budgets, resolved; each worker takes its share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budgets {
    pub read: Option<f64>,
    pub write: Option<f64>,
}

fn share_of(total: Option<f64>, live: usize) -> Option<f64> {
    total.map(|t| t / live.max(1) as f64)
}

/// The lease on a unit is gone (its commit was refused, or the fence
/// closed): the unit stops at once, and another worker goes on from its
/// last committed checkpoint.
#[derive(Debug, thiserror::Error)]
#[error("unit {unit}: lease {lease} is no longer this worker's")]
pub struct LeaseLost {
    pub unit: u32,
    pub lease: u64,
}

/// A fenced write stopped: the writer may no longer write for its unit.
#[derive(Debug, thiserror::Error)]
#[error("the lease on this unit may be gone: no more writes for it")]
pub(crate) struct Fenced;

/// Whether `e` means the unit's lease is gone (not a failure of the worker).
pub(crate) fn lost(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<LeaseLost>() || c.is::<Fenced>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::AwsError;
    use crate::state::fleet::{FleetError, Snapshot, WorkerInfo, live_workers, passing, wall_ms};

    fn worker(id: &str, state: &str, age_ms: i64) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            heartbeat_ms: wall_ms() - age_ms,
            units: vec![],
            write_rate: 0.0,
            read_rate: 0.0,
            state: state.into(),
        }
    }

    #[test]
    fn the_budget_is_shared_by_the_workers_with_a_fresh_heartbeat() {
        let snap = Snapshot {
            workers: vec![
                worker("me", "running", 0),
                worker("b", "running", 1_000),
                worker("c", "running", 100_000),
                worker("d", "stopped", 0),
                worker("e", "done", 0),
            ],
            ..Default::default()
        };
        let live = live_workers(&snap, "me", Duration::from_secs(10));
        assert_eq!(live, 2, "me and b; c is silent, d and e left");
        assert_eq!(share_of(Some(1000.0), live), Some(500.0));
        assert_eq!(share_of(None, live), None);
        assert_eq!(
            live_workers(&Snapshot::default(), "me", Duration::from_secs(10)),
            1
        );
    }

    #[test]
    fn throttles_and_transient_failures_pass_a_lost_lease_is_its_own_case() {
        let endpoint = Arc::new(crate::aws::Endpoint {
            service: crate::aws::Service::DynamoDb,
            url: "http://x".into(),
            source: crate::aws::Source::Flag,
        });
        let transient = AwsError::Unreachable {
            endpoint,
            detail: "reset".into(),
        };
        let e = anyhow::Error::new(FleetError::Aws(transient)).context("commit");
        assert!(passing(&e));
        let schema = AwsError::Schema {
            table: "t".into(),
            detail: "x".into(),
        };
        assert!(!passing(&anyhow::Error::new(FleetError::Aws(schema))));
        let gone = anyhow::Error::new(LeaseLost { unit: 1, lease: 2 });
        assert!(lost(&gone) && !passing(&gone));
        assert!(lost(&anyhow::Error::new(Fenced).context("write")));
    }
}
