//! Which units this process holds: it takes its share of those not done
//! (free ones first, then those whose lease expired on its own clock),
//! hands one back when another live process holds fewer, and settles each
//! unit's end — done, handed back, lost to another process, or failed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::phase::progress::Progress;
use crate::state::fleet::lease::{self, BEATS_PER_LEASE, FENCE_FRACTION, Judgement, Observer};
use crate::state::fleet::{Lease, Snapshot, Unit, WorkerInfo, live_workers, passing, wall_ms};

use super::{Drive, Leasing, Shared, lost};

/// Takes units while there are some to take, runs each, and ends when every
/// unit is done (true) or on a stop (false). Returns the units this worker
/// finished.
pub(super) async fn schedule(
    shared: &Arc<Shared>,
    drive: &Arc<dyn Drive>,
    opts: &Leasing,
    progress: &Progress,
) -> anyhow::Result<(BTreeSet<u32>, bool)> {
    let stop = &opts.stop;
    let mut observer = Observer::default();
    let mut tasks: JoinSet<(u32, anyhow::Result<bool>)> = JoinSet::new();
    let mut finished = BTreeSet::new();
    let every = shared.units.duration / BEATS_PER_LEASE;
    let result = loop {
        if stop.is_cancelled() {
            break Ok(false);
        }
        match step(shared, drive, opts, progress, &mut observer, &mut tasks).await {
            Ok(true) => break Ok(true),
            Ok(false) => {}
            // Asked again at the next beat; the fence and the leases hold meanwhile.
            Err(e) if passing(&e) => tracing::warn!(error = %e, "control table: trying again"),
            Err(e) => break Err(e),
        }
        let ended = tokio::select! {
            () = stop.cancelled() => None,
            () = tokio::time::sleep(every) => None,
            Some(r) = tasks.join_next() => Some(r),
        };
        if let Some(r) = ended
            && let Err(e) = unit_ended(shared, r, &mut finished).await
        {
            break Err(e);
        }
    };
    // Pages in flight finish and commit; then what is held goes back.
    shared.units.cancel_all();
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = unit_ended(shared, r, &mut finished).await
            && result.is_ok()
        {
            return Err(e);
        }
    }
    shared.units.release_all(&shared.fleet).await;
    result.map(|done| (finished, done))
}

/// One look at the migration: true once every unit is done (and recorded
/// so), else the units this worker should take, taken.
async fn step(
    shared: &Arc<Shared>,
    drive: &Arc<dyn Drive>,
    opts: &Leasing,
    progress: &Progress,
    observer: &mut Observer,
    tasks: &mut JoinSet<(u32, anyhow::Result<bool>)>,
) -> anyhow::Result<bool> {
    let snap = shared.fleet.read().await?;
    report_progress(shared, drive, &snap, progress).await;
    if snap.all_done() {
        drive.all_done().await?;
        return Ok(true);
    }
    take_units(shared, drive, opts, &snap, observer, tasks).await?;
    rebalance(shared, opts, &snap);
    Ok(false)
}

/// Hands one unit back when this worker holds more than its share and
/// another live worker (a heartbeat within a lease) holds fewer
/// ([`lease::hand_back`]): the unit stops after its page in flight commits,
/// then its lease is released ([`unit_ended`]) and the other worker takes it
/// from that checkpoint. The unit handed back is the one with the fewest
/// pages committed: the most work moves.
fn rebalance(shared: &Shared, opts: &Leasing, snap: &Snapshot) {
    if shared.units.handing_back(None) || opts.stop.is_cancelled() {
        return;
    }
    let me = shared.fleet.worker.as_str();
    let held = shared.held_units();
    let open = |u: &&Unit| !u.done;
    let holds = |id: &str| {
        snap.units
            .iter()
            .filter(open)
            .filter(|u| u.owner.as_deref() == Some(id))
            .count()
    };
    let others: Vec<&WorkerInfo> = live_others(snap, me, shared.units.duration).collect();
    let balance = lease::Balance {
        held: held.len(),
        open: snap.units.iter().filter(open).count(),
        live: others.len() + 1,
        fewest_other: others.iter().map(|w| holds(&w.id)).min(),
        free: snap
            .units
            .iter()
            .filter(open)
            .filter(|u| u.owner.is_none())
            .count(),
        max: opts.max_units,
    };
    if !lease::hand_back(balance) {
        return;
    }
    let Some(unit) = snap
        .units
        .iter()
        .filter(|u| held.contains(&u.n) && !u.done)
        .min_by_key(|u| (u.page, std::cmp::Reverse(u.n)))
    else {
        return;
    };
    if shared.units.hand_back(&unit.n) {
        tracing::info!(
            unit = unit.n,
            ?balance,
            "handing the unit back at its next page boundary"
        );
    }
}

/// The fleet's committed items, and this worker's units.
async fn report_progress(
    shared: &Shared,
    drive: &Arc<dyn Drive>,
    snap: &Snapshot,
    progress: &Progress,
) {
    let held = shared.held_units();
    let done = snap.units.iter().filter(|u| u.done).count();
    let mine = drive.scanned().await;
    progress.status(
        format!(
            "fleet: {done}/{} units done; this worker: units {held:?}, {mine} items",
            snap.units.len()
        ),
        serde_json::json!({
            "units": snap.units.len(),
            "units_done": done,
            "held": held,
            "this_worker_scanned": mine,
        }),
    );
    progress.update(snap.totals().scanned, 0.0);
}

/// Units to take now: this worker's share of those not done, free ones
/// first, then those whose lease expired (judged on this worker's clock).
async fn take_units(
    shared: &Arc<Shared>,
    drive: &Arc<dyn Drive>,
    opts: &Leasing,
    snap: &Snapshot,
    observer: &mut Observer,
    tasks: &mut JoinSet<(u32, anyhow::Result<bool>)>,
) -> anyhow::Result<()> {
    let now = shared.now();
    let me = shared.fleet.worker.clone();
    let open = snap.units.iter().filter(|u| !u.done).count();
    let want = lease::share(
        open,
        live_workers(snap, &me, shared.units.duration),
        opts.max_units,
    );
    let mut free = Vec::new();
    let mut expired = Vec::new();
    let held = shared.held_units();
    for u in &snap.units {
        let seen = observer.observe(u, now);
        // A unit this worker let go (its fence closed) is judged as anyone's.
        let who = if held.contains(&u.n) { me.as_str() } else { "" };
        match lease::judge(u, who, &seen, now, shared.units.duration) {
            Judgement::Free { .. } => free.push(u),
            Judgement::Expired { beat, .. } => expired.push((u, beat)),
            _ => {}
        }
    }
    // Workers start at different units so that they rarely race for one.
    let offset = (md5_u64(&me) % snap.units.len().max(1) as u64) as usize;
    free.sort_by_key(|u| (u.n as usize + snap.units.len() - offset) % snap.units.len().max(1));
    let candidates = free
        .into_iter()
        .map(|u| (u, None))
        .chain(expired.into_iter().map(|(u, b)| (u, Some(b))));
    for (u, beat) in candidates {
        if shared.held_units().len() >= want || opts.stop.is_cancelled() {
            break;
        }
        let sent = shared.now();
        let Some(l) = shared
            .fleet
            .take(u, beat, shared.units.duration.mul_f64(FENCE_FRACTION))
            .await?
        else {
            continue; // another worker was first
        };
        tracing::info!(
            unit = u.n,
            lease = l.lease,
            page = u.page,
            taken_over = beat.is_some(),
            "unit taken"
        );
        let token = opts.stop.child_token();
        shared.units.insert(u.n, l.lease, sent, token.clone());
        let (drive, unit) = (drive.clone(), u.clone());
        tasks.spawn(async move { (unit.n, drive.run(unit, l, token).await) }.in_current_span());
    }
    Ok(())
}

fn md5_u64(s: &str) -> u64 {
    use md5::{Digest, Md5};
    let d = Md5::digest(s.as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// A unit's task ended: done, stopped, lost (not an error: another worker
/// goes on from its checkpoint), or failed (the worker stops).
async fn unit_ended(
    shared: &Shared,
    r: Result<(u32, anyhow::Result<bool>), tokio::task::JoinError>,
    finished: &mut BTreeSet<u32>,
) -> anyhow::Result<()> {
    let (unit, r) = match r {
        Ok(x) => x,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => return Ok(()),
    };
    match r {
        Ok(true) => {
            shared.units.remove(&unit);
            finished.insert(unit);
            tracing::info!(unit, "unit done");
            Ok(())
        }
        // Handed back (re-balancing): its page in flight committed, released now.
        Ok(false) if shared.units.handing_back(Some(&unit)) => {
            if let Some(x) = shared.units.remove(&unit) {
                let r = shared
                    .fleet
                    .release(Lease {
                        unit,
                        lease: x.lease,
                    })
                    .await;
                tracing::info!(unit, released = ?r.ok(), "unit handed back");
                if let Ok(mut v) = shared.handed_back.lock() {
                    v.push(unit);
                }
            }
            Ok(())
        }
        // Stopped: still held, released once every unit has stopped.
        Ok(false) => Ok(()),
        Err(e) if lost(&e) || passing(&e) => {
            tracing::warn!(unit, error = %e, "unit given up: its lease is gone, or a call failed");
            // Still ours if only the fence closed: hand it over at once.
            shared.units.give_back(&shared.fleet, &unit).await;
            Ok(())
        }
        Err(e) => Err(e.context(format!("unit {unit}"))),
    }
}

/// The other workers running with a heartbeat younger than `window`.
fn live_others<'a>(
    snap: &'a Snapshot,
    me: &'a str,
    window: Duration,
) -> impl Iterator<Item = &'a WorkerInfo> + 'a {
    let (fresh, now) = (window.as_millis() as i64, wall_ms());
    snap.workers
        .iter()
        .filter(move |w| w.id != me && w.state == "running" && now - w.heartbeat_ms < fresh)
}
