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
//! Records of other shards are ordered only against themselves, and the
//! holders are other machines whose clocks may disagree by any offset. So no
//! worker's clock is compared with another's: each `SHARD#` unit carries a
//! counter, `drains`, that its holder bumps in a fenced commit each time a
//! read of the shard came back empty while live (at its end, everything
//! read before applied). Once drain sees the observation it takes a
//! snapshot: the stream's shard list, described *after* it saw the
//! observation (so after the marker's write: every shard that could hold an
//! earlier write is listed — the fleet's own `SHARD#` items could miss one
//! that no worker has discovered yet, and a shard without a unit counts
//! from 0), and each listed shard's counter as read in the Query that found
//! the observation (a consistent read sent after the marker's write
//! returned). The barrier is complete when every listed shard other than
//! the marker's is done, or its counter is at least two past the snapshot:
//! the commit of the first bump came after the snapshot's read (which saw
//! the value below it), and the read behind the second bump started after
//! that commit — in its holder's order, or after the take of a holder that
//! found it — so after the marker's write, and it found the shard drained
//! with everything applied. One bump is not enough: its read may have
//! started before the marker's write and committed late.
//!
//! A shard whose writes never pause may never read empty. As on one machine,
//! it has also moved past the barrier once it has applied a record created
//! in a later second than the marker: creation times are the stream's own
//! (DynamoDB's), not a worker's, and a shard's records are applied in order.
//!
//! A stopped holder's shard (SIGSTOP, a partition, a crash before its lease
//! expires) moves no counter: the barrier waits until it resumes or another
//! worker takes the shard over and drains it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{DrainReport, new_id};
use crate::aws::streams::{self, ShardInfo};
use crate::aws::{Clients, item};
use crate::core::marker::marker_item_in;
use crate::core::plan::Plan;
use crate::phase::error::InputError;
use crate::phase::tail::{Flow, source_stream};
use crate::state::fleet::shard::ShardUnit;
use crate::state::fleet::{Fleet, FleetRef};

/// How often drain reads the shards' units while it waits.
const POLL: Duration = Duration::from_millis(250);

/// A barrier observed by the fleet's tail, with drain's snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetBarrier {
    /// The shard whose holder applied the marker.
    pub shard: String,
    /// The marker record's creation time (the stream's clock).
    pub marker_at: f64,
    /// Every shard to wait for → its `drains` counter at the snapshot (0:
    /// no unit yet).
    pub counters: BTreeMap<String, u64>,
}

/// Where barrier `id` was observed: (shard, the marker's creation time).
pub fn observed(id: &str, shards: &[ShardUnit]) -> Option<(String, f64)> {
    shards
        .iter()
        .find_map(|u| u.barriers.get(id).map(|at| (u.id.clone(), *at)))
}

/// The snapshot, taken once the observation is seen: the shards `listed`
/// by a DescribeStream made after that, and any unit not done that the list
/// lacks, each with its counter in `shards` (read with the observation).
pub fn snapshot(
    shard: &str,
    marker_at: f64,
    listed: &[ShardInfo],
    shards: &[ShardUnit],
) -> FleetBarrier {
    let counter = |id: &str| {
        shards
            .iter()
            .find(|u| u.id == id)
            .map_or(0, |u| u.cp.drains)
    };
    let mut counters: BTreeMap<String, u64> = listed
        .iter()
        .map(|l| (l.id.clone(), counter(&l.id)))
        .collect();
    for u in shards.iter().filter(|u| !u.cp.done) {
        counters.entry(u.id.clone()).or_insert(u.cp.drains);
    }
    FleetBarrier {
        shard: shard.into(),
        marker_at,
        counters,
    }
}

/// Whether every shard of the snapshot has moved past the barrier (see the
/// module docs): done, drained twice since, or applied a record from a later
/// second than the marker's. A shard without a unit has not.
pub fn fleet_barrier_complete(b: &FleetBarrier, shards: &[ShardUnit]) -> bool {
    b.counters.iter().all(|(id, at)| {
        if *id == b.shard {
            return true;
        }
        let Some(u) = shards.iter().find(|u| u.id == *id) else {
            return false;
        };
        u.cp.done
            || u.cp.drains >= at + 2
            || u.cp
                .record_at
                .is_some_and(|r| r >= b.marker_at.floor() + 1.0)
    })
}

/// Whether the fleet has a tail: a `worker --tail` has created the stream's
/// shard units.
pub async fn fleet_has_tail(clients: &Clients, at: &FleetRef) -> anyhow::Result<bool> {
    let fleet = Fleet::open(clients, at, "drain");
    Ok(!fleet.read_shards().await?.is_empty())
}

/// Writes a marker into the source, deletes it, and waits until the fleet's
/// tail has applied every source write made before it. `complete: false`
/// when `timeout` passed first.
pub async fn drain_fleet(
    clients: &Clients,
    plan: &Plan,
    at: &FleetRef,
    timeout: Duration,
) -> anyhow::Result<DrainReport> {
    let fleet = Fleet::open(clients, at, "drain");
    let info = clients.describe_table(&plan.source_table).await?;
    let stream = source_stream(&info, Flow::Forward)?;
    let id = new_id();
    let marker = marker_item_in(&plan.source_key, &plan.source_table, &id).map_err(InputError)?;
    let started = Instant::now();
    item::put_item(clients, &plan.source_table, &marker)
        .await
        .context("writing the drain marker")?;
    item::delete_item(clients, &plan.source_table, &marker)
        .await
        .context("deleting the drain marker")?;
    let report = |complete: bool| DrainReport {
        direction: "fleet's tail",
        barrier: id.clone(),
        complete,
        waited_seconds: started.elapsed().as_secs_f64(),
    };
    let mut barrier: Option<FleetBarrier> = None;
    loop {
        let shards = fleet.read_shards().await?;
        if barrier.is_none()
            && let Some((shard, marker_at)) = observed(&id, &shards)
        {
            // Described after the observation was seen, so after the marker's write.
            let listed = streams::describe_shards(clients, &stream).await?;
            let b = snapshot(&shard, marker_at, &listed, &shards);
            tracing::info!(barrier = %id, shard = %shard, counters = ?b.counters, "fleet barrier observed");
            barrier = Some(b);
            continue;
        }
        if barrier
            .as_ref()
            .is_some_and(|b| fleet_barrier_complete(b, &shards))
        {
            return Ok(report(true));
        }
        if started.elapsed() >= timeout {
            return Ok(report(false));
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
            barriers: BTreeMap::new(),
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
    fn the_snapshot_covers_listed_shards_without_units_and_units_the_list_lacks() {
        let mut old = unit("old", 4);
        old.cp.done = true;
        let units = [unit("a", 3), unit("b", 7), old, unit("unlisted", 2)];
        let b = snapshot("a", 199.0, &[info("a"), info("b"), info("new")], &units);
        let want: BTreeMap<String, u64> = [("a", 3), ("b", 7), ("new", 0), ("unlisted", 2)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(
            b.counters, want,
            "a done unit off the list is not waited for"
        );
    }

    #[test]
    fn a_barrier_completes_only_when_every_other_shard_drained_twice_since_the_snapshot() {
        let b = snapshot(
            "a",
            199.4,
            &[info("a"), info("b"), info("c")],
            &[unit("a", 3), unit("b", 7), unit("c", 0)],
        );
        // Nothing moved: the marker's shard alone does not complete it.
        let now = [unit("a", 3), unit("b", 7), unit("c", 0)];
        assert!(!fleet_barrier_complete(&b, &now));
        // One drain each is not enough: its read may predate the marker.
        let once = [unit("a", 3), unit("b", 8), unit("c", 1)];
        assert!(!fleet_barrier_complete(&b, &once));
        // b twice, c still once (its holder stopped): not complete.
        let stopped = [unit("a", 3), unit("b", 9), unit("c", 1)];
        assert!(!fleet_barrier_complete(&b, &stopped));
        // Both twice; the marker's own shard need not move.
        let both = [unit("a", 3), unit("b", 9), unit("c", 2)];
        assert!(fleet_barrier_complete(&b, &both));
        // A shard listed but with no unit yet holds it back.
        assert!(!fleet_barrier_complete(&b, &both[..2]));
    }

    #[test]
    fn a_done_shard_or_one_that_applied_a_later_second_has_moved_past_it() {
        let b = snapshot(
            "a",
            199.4,
            &[info("a"), info("b"), info("c")],
            &[unit("a", 0), unit("b", 0), unit("c", 0)],
        );
        let mut done = unit("b", 0);
        done.cp.done = true;
        let mut same_second = unit("c", 0);
        same_second.cp.record_at = Some(199.9);
        assert!(!fleet_barrier_complete(
            &b,
            &[unit("a", 0), done.clone(), same_second]
        ));
        let mut later = unit("c", 0);
        later.cp.record_at = Some(200.0);
        assert!(fleet_barrier_complete(&b, &[unit("a", 0), done, later]));
    }
}
