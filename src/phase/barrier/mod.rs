//! The drain barrier: proof that the tail has applied every change made to
//! the source before a chosen moment — what a cutover waits for.
//!
//! `rekey drain` notes its start, then writes marker items into the source
//! table (partition key `__rekey__#barrier#<id>#<n>`, each carrying the
//! start) and deletes each at once. Markers travel the stream like any
//! write; the transform skips them everywhere (`core::marker`), so none is
//! ever copied.
//!
//! On DynamoDB a table has one open stream shard per partition, each shard
//! orders only its own records, and an open shard may answer GetRecords
//! with empty pages while records sit further on. So an empty page proves
//! nothing. What proves a shard read past the start is a record from after
//! it, applied: a marker (it carries the start), or any record created a
//! clock margin after it ([`crate::aws::streams::evidence`]). A key reaches
//! one partition, so markers go under many keys, about K·ln K for K shards,
//! in rounds every second until every shard has shown one. The tail
//! publishes `applied_through`, the least proof over the leaf shards (a
//! child inherits its parent's: it holds only later writes), and the
//! barrier is complete once that reaches its start. A shard no marker key
//! reaches (a partition split by sort-key range under one hot key) proves
//! itself by its own traffic or by closing; else the timeout names it.
//!
//! The tail publishes barriers in `<state dir>/tail/status.json`; `drain`
//! polls that file, so the two can be separate processes. The fleet's tail
//! (`rekey worker --tail`) records its proofs in the control table instead
//! ([`fleet`]). The tail probes the same way on its own when its proof is
//! old (an idle table): so its lag and `applied_through`, which cutover's
//! gate and verify wait on, never rest on an empty page either.
//!
//! Invariant: a barrier is complete only after every change written to the
//! source before its start has been applied to the target.

pub(crate) mod fleet;

use std::time::Duration;

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::phase::markers::PROBE_KEYS;
pub(crate) use crate::phase::markers::{Markers, ROUND_EVERY, new_id, round_size};
use crate::phase::tail::Flow;
use crate::state::StateDir;
use crate::state::snapshot::{self, ShardPhase, TailStatus};

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
    /// Shards that had not shown a record from after the barrier's start
    /// when the report was made (empty once complete).
    pub waiting_on: Vec<String>,
}

/// Write markers into the source, in rounds, and wait until the tail reports
/// the barrier complete. `complete: false` when the timeout passed first.
/// With `opts.fleet`, through the fleet's tail ([`fleet::drain_fleet`]).
///
/// Backwards (`opts.flow`), the markers go into the target, in its key
/// schema, and the reverse tail reports them.
pub async fn drain(
    clients: &Clients,
    plan: &Plan,
    opts: &DrainOptions,
) -> anyhow::Result<DrainReport> {
    if let Some(at) = &opts.fleet {
        return fleet::drain_fleet(clients, plan, at, opts).await;
    }
    let flow = opts.flow;
    let id = new_id();
    let table = flow.read_table(plan);
    let started = std::time::Instant::now();
    let ledger = opts.state_dir.markers();
    let markers = Markers {
        clients,
        key: flow.read_key(plan),
        table,
        id: &id,
        started_at: crate::aws::streams::now_secs(),
        ledger: &ledger,
    };
    let status = flow.snapshot(&opts.state_dir);
    let shards = |s: Option<&TailStatus>| {
        s.map_or(1, |s| {
            s.shards
                .iter()
                .filter(|x| x.state != ShardPhase::Finished)
                .count()
        })
    };
    let last = snapshot::read::<TailStatus>(&status)?;
    let mut written = markers.round(0, round_size(shards(last.as_ref()))).await?;
    let mut round_at = std::time::Instant::now();
    loop {
        let s = snapshot::read::<TailStatus>(&status)?;
        let b = s.as_ref().and_then(|s| s.barriers.get(&id));
        let report = |complete: bool| DrainReport {
            direction: flow.tail_name(),
            barrier: id.clone(),
            complete,
            waited_seconds: started.elapsed().as_secs_f64(),
            waiting_on: b.map(|b| b.waiting_on.clone()).unwrap_or_default(),
        };
        if b.is_some_and(|b| b.complete_at.is_some()) {
            return Ok(report(true));
        }
        if started.elapsed() >= opts.timeout {
            return Ok(report(false));
        }
        if round_at.elapsed() >= ROUND_EVERY {
            match b
                .zip(s.as_ref())
                .and_then(|(b, s)| targeted(&b.waiting_on, s))
            {
                // The tail knows a key for each shard it waits on: those
                // alone, carrying this barrier's start.
                Some(ns) => {
                    Markers {
                        id: PROBE_KEYS,
                        ..markers
                    }
                    .these(&ns)
                    .await?;
                }
                None => {
                    let n = b.map_or(shards(s.as_ref()), |b| b.waiting_on.len().max(1));
                    // Keys land uniformly: to reach `n` particular shards of
                    // all, a round is sized by all of them.
                    let n = round_size(shards(s.as_ref()).max(n));
                    written += markers.round(written, n).await?;
                }
            }
            round_at = std::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The tail's probe markers ([`PROBE_KEYS`]) that reach every shard of
/// `waiting` (the barrier's, as the tail published it), when the tail knows
/// one for each; None: a full round. A marker of any id proves a shard read
/// past the start it carries, so these do for this barrier what its own
/// would, at one marker a shard instead of K·ln K for all.
fn targeted(waiting: &[String], status: &TailStatus) -> Option<Vec<u32>> {
    if waiting.is_empty() {
        return None;
    }
    let keys: std::collections::HashMap<&str, u32> = status
        .shards
        .iter()
        .filter_map(|s| Some((s.shard_id.as_str(), s.probe_key?)))
        .collect();
    let ns: std::collections::BTreeSet<u32> = waiting
        .iter()
        .map(|w| keys.get(w.as_str()).copied())
        .collect::<Option<_>>()?;
    Some(ns.into_iter().collect())
}

/// Whether a status file exists at all: `drain` says so when no tail runs.
pub fn tail_has_run(state_dir: &StateDir, flow: Flow) -> bool {
    flow.snapshot(state_dir).exists()
}
