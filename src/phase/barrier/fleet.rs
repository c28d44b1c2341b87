//! The drain barrier through the fleet's tail (`rekey worker --tail`):
//! `rekey drain --state dynamodb://…`, and the barriers of `cutover --state`
//! and `finish --state`.
//!
//! The marker travels the stream as on one machine ([`super`]). Its shard's
//! holder applies it and records the *observation* in the same fenced commit
//! that moves the shard's cursor past it (`barrier:<id>` on the `SHARD#`
//! item, [`crate::state::fleet::shard`]): conditional on the holder's lease
//! like every other write, and true once written, since that commit follows
//! the acknowledgement of every write of the shard up to the marker.
//!
//! As on one machine ([`super`]), the barrier writes markers under many
//! keys, in rounds, until every shard has applied a record from after its
//! start: each shard's holder commits the newest proof it applied
//! (`record_at`, [`crate::aws::streams::evidence`]) in the same fenced
//! commit as its cursor, and the barrier is complete once the fleet's
//! proven instant ([`crate::aws::streams::through`] over the shards listed
//! after the barrier began and every unit) reaches the barrier's start. An
//! empty read proves nothing. No worker's clock is compared with another's:
//! a marker carries the start as drain's clock wrote it.
//!
//! A stopped holder's shard (SIGSTOP, a partition, a crash before its lease
//! expires) proves nothing new: the barrier waits until it resumes or another
//! worker takes the shard over.

use std::time::{Duration, Instant};

use super::{DrainReport, Markers, ROUND_EVERY, new_id, round_size};
use crate::aws::Clients;
use crate::aws::streams::{self, ShardInfo, ShardThrough, now_secs, through};
use crate::core::plan::Plan;
use crate::phase::tail::{Flow, source_stream};
use crate::state::fleet::shard::ShardUnit;
use crate::state::fleet::{Fleet, FleetRef};

/// How often drain reads the shards' units while it waits.
const POLL: Duration = Duration::from_millis(250);

/// A barrier in the fleet: its start, and the shards listed after it began.
#[derive(Debug, Clone)]
pub struct FleetBarrier {
    pub started_at: f64,
    pub listed: Vec<ShardInfo>,
}

/// Where barrier `id` was observed: (shard, the marker's creation time).
#[cfg(test)]
pub(crate) fn observed(id: &str, shards: &[ShardUnit]) -> Option<(String, f64)> {
    shards
        .iter()
        .find_map(|u| u.barriers.get(id).map(|at| (u.id.clone(), *at)))
}

/// The shards barrier `b` still waits for: a listed shard no worker has
/// taken yet, or a leaf whose proof (or its nearest ancestor's) is older
/// than the barrier's start. Empty: complete.
pub fn fleet_barrier_waits_on(b: &FleetBarrier, shards: &[ShardUnit]) -> Vec<String> {
    let mut waits: Vec<String> = b
        .listed
        .iter()
        .filter(|l| !shards.iter().any(|u| u.id == l.id))
        .map(|l| l.id.clone())
        .collect();
    let view: Vec<ShardThrough> = shards
        .iter()
        .map(|u| ShardThrough {
            id: &u.id,
            parent: u.parent.as_deref(),
            record_at: u.cp.record_at,
        })
        .collect();
    let parents: std::collections::HashSet<&str> =
        shards.iter().filter_map(|u| u.parent.as_deref()).collect();
    for u in shards.iter().filter(|u| !parents.contains(u.id.as_str())) {
        let one: Vec<ShardThrough> = view
            .iter()
            .filter(|v| v.id == u.id || is_ancestor(shards, v.id, &u.id))
            .cloned()
            .collect();
        if through(&one).is_none_or(|t| t < b.started_at) {
            waits.push(u.id.clone());
        }
    }
    waits
}

/// Whether `a` is an ancestor of `id` among the units.
fn is_ancestor(shards: &[ShardUnit], a: &str, id: &str) -> bool {
    let mut cur = shards
        .iter()
        .find(|u| u.id == id)
        .and_then(|u| u.parent.as_deref());
    let mut hops = 0;
    while let Some(p) = cur {
        if p == a {
            return true;
        }
        cur = shards
            .iter()
            .find(|u| u.id == p)
            .and_then(|u| u.parent.as_deref());
        hops += 1;
        if hops > 10_000 {
            break;
        }
    }
    false
}

/// Whether the fleet has a tail: a `worker --tail` has created the stream's
/// shard units.
pub async fn fleet_has_tail(clients: &Clients, at: &FleetRef) -> anyhow::Result<bool> {
    let fleet = Fleet::open(clients, at, "drain");
    Ok(!fleet.read_shards().await?.is_empty())
}

/// Writes markers into the source, in rounds, until the fleet's tail has
/// applied every source write made before the barrier began. `complete:
/// false` when `timeout` passed first (the report names the shards waited on).
pub async fn drain_fleet(
    clients: &Clients,
    plan: &Plan,
    at: &FleetRef,
    opts: &super::DrainOptions,
) -> anyhow::Result<DrainReport> {
    let timeout = opts.timeout;
    let ledger = opts.state_dir.markers();
    let fleet = Fleet::open(clients, at, "drain");
    let info = clients.describe_table(&plan.source_table).await?;
    let stream = source_stream(&info, Flow::Forward)?;
    let id = new_id();
    let started = Instant::now();
    let started_at = now_secs();
    let listed = streams::describe_shards(clients, &stream).await?;
    let open = listed.iter().filter(|s| !s.closed).count();
    let markers = Markers {
        clients,
        key: &plan.source_key,
        table: &plan.source_table,
        id: &id,
        started_at,
        ledger: &ledger,
    };
    let mut written = markers.round(0, round_size(open)).await?;
    let mut round_at = Instant::now();
    let b = FleetBarrier { started_at, listed };
    loop {
        let shards = fleet.read_shards().await?;
        let waits = fleet_barrier_waits_on(&b, &shards);
        let report = |complete: bool| DrainReport {
            direction: "fleet's tail",
            barrier: id.clone(),
            complete,
            waited_seconds: started.elapsed().as_secs_f64(),
            waiting_on: waits.clone(),
        };
        if waits.is_empty() {
            return Ok(report(true));
        }
        if started.elapsed() >= timeout {
            return Ok(report(false));
        }
        if round_at.elapsed() >= ROUND_EVERY {
            written += markers
                .round(written, round_size(waits.len().max(open)))
                .await?;
            round_at = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fleet::shard::ShardCheckpoint;

    fn unit(id: &str, drains: u64) -> ShardUnit {
        ShardUnit {
            id: id.into(),
            parent: None,
            owner: Some("w".into()),
            lease: 1,
            beat: 0,
            page: 0,
            cp: ShardCheckpoint {
                live: true,
                drains,
                ..Default::default()
            },
            first_apply_ms: None,
            done_ms: None,
            grants: vec![],
            barriers: std::collections::BTreeMap::new(),
            rejected: 0,
        }
    }

    fn info(id: &str) -> ShardInfo {
        ShardInfo {
            id: id.into(),
            parent: None,
            closed: false,
        }
    }

    #[test]
    fn the_observation_is_found_in_the_unit_of_the_shard_that_applied_the_marker() {
        let mut a = unit("a", 0);
        a.barriers.insert("x".into(), 199.0);
        let units = [unit("b", 0), a];
        assert_eq!(observed("x", &units), Some(("a".into(), 199.0)));
        assert_eq!(observed("y", &units), None);
    }

    #[test]
    fn a_barrier_waits_for_a_listed_shard_without_a_unit_and_each_leaf_without_a_proof_after_its_start()
     {
        let b = FleetBarrier {
            started_at: 200.0,
            listed: vec![info("a"), info("b"), info("new")],
        };
        let at = |id: &str, t: Option<f64>| {
            let mut u = unit(id, 0);
            u.cp.record_at = t;
            u
        };
        // Empty reads (drains) prove nothing; b's proof is older than the start.
        let mut quiet = at("b", Some(150.0));
        quiet.cp.drains = 9;
        assert_eq!(
            fleet_barrier_waits_on(&b, &[at("a", Some(200.5)), quiet]),
            vec!["new".to_string(), "b".to_string()]
        );
        // A child inherits its closed parent's proof until it has its own.
        let mut child = at("c", None);
        child.parent = Some("b".into());
        let units = [
            at("a", Some(200.5)),
            at("b", Some(201.0)),
            child,
            at("new", Some(202.0)),
        ];
        assert!(fleet_barrier_waits_on(&b, &units).is_empty());
    }
}
