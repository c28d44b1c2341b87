//! The drain barrier: proof that the tail has applied every change made to
//! the source before a chosen moment — what a cutover waits for.
//!
//! `rekey drain` writes a marker item into the source table (partition key
//! `__rekey__#barrier#<id>`) and deletes it at once. The marker travels the
//! stream like any write. The tail recognises it (`core::marker`; the transform
//! skips such items everywhere, so a marker is never copied), and marks the
//! barrier *observed* when it applies the marker — every earlier record of
//! that shard is applied by then, since a shard is applied in order. Records
//! of other shards are ordered only against themselves, so the barrier is
//! *complete* once each other open shard has also been read to its end after
//! the observation. On a one-shard stream (moto's), observation is
//! completion.
//!
//! The tail publishes barriers in `<state dir>/tail/status.json`; `drain`
//! polls that file, so the two can be separate processes. The fleet's tail
//! (`rekey worker --tail`) records them in the control table instead
//! ([`fleet`]).
//!
//! Invariant: a barrier is complete only after every change written to the
//! source before the marker's write has been applied to the target.

pub mod fleet;

use std::time::Duration;

use anyhow::Context as _;

use crate::aws::{Clients, item};
use crate::core::marker::marker_item_in;
use crate::core::plan::Plan;
use crate::phase::error::InputError;
use crate::phase::tail::Flow;
use crate::state::StateDir;
use crate::state::snapshot::{self, TailStatus};

#[derive(Debug, Clone)]
pub struct DrainOptions {
    pub state_dir: StateDir,
    pub timeout: Duration,
    /// Through the source's stream and the forward tail (`drain`, cutover),
    /// or the target's and the reverse tail (`drain --reverse`, rollback).
    pub flow: Flow,
    /// `drain --state dynamodb://…`: through the fleet's own tail
    /// (`rekey worker --tail`, [`fleet`]); forwards only.
    pub fleet: Option<crate::state::fleet::FleetRef>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainReport {
    /// "tail" or "reverse tail": whose barrier.
    pub direction: &'static str,
    pub barrier: String,
    pub complete: bool,
    pub waited_seconds: f64,
}

/// Write a marker into the source, delete it, and wait until the tail reports
/// the barrier complete. `complete: false` when the timeout passed first.
/// With `opts.fleet`, through the fleet's tail ([`fleet::drain_fleet`]).
///
/// Backwards (`opts.flow`), the marker goes into the target, in its key
/// schema, and the reverse tail reports it.
pub async fn drain(
    clients: &Clients,
    plan: &Plan,
    opts: &DrainOptions,
) -> anyhow::Result<DrainReport> {
    if let Some(at) = &opts.fleet {
        return fleet::drain_fleet(clients, plan, at, opts.timeout).await;
    }
    let flow = opts.flow;
    let id = new_id();
    let table = flow.read_table(plan);
    let marker = marker_item_in(flow.read_key(plan), table, &id).map_err(InputError)?;
    let started = std::time::Instant::now();
    item::put_item(clients, table, &marker)
        .await
        .context("writing the drain marker")?;
    item::delete_item(clients, table, &marker)
        .await
        .context("deleting the drain marker")?;
    let status = flow.snapshot(&opts.state_dir);
    loop {
        if let Some(s) = snapshot::read::<TailStatus>(&status)?
            && s.barriers.get(&id).is_some_and(|b| b.complete_at.is_some())
        {
            return Ok(DrainReport {
                direction: flow.tail_name(),
                barrier: id,
                complete: true,
                waited_seconds: started.elapsed().as_secs_f64(),
            });
        }
        if started.elapsed() >= opts.timeout {
            return Ok(DrainReport {
                direction: flow.tail_name(),
                barrier: id,
                complete: false,
                waited_seconds: started.elapsed().as_secs_f64(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A new barrier's id: when, and a random part.
fn new_id() -> String {
    format!(
        "{}-{:08x}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ"),
        rand_u32()
    )
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos()));
    h.finish() as u32
}

/// Whether a status file exists at all: `drain` says so when no tail runs.
pub fn tail_has_run(state_dir: &StateDir, flow: Flow) -> bool {
    flow.snapshot(state_dir).exists()
}
