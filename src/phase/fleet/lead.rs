//! One fleet process's run: the heartbeat that keeps its leases and its
//! rate share, beside the scheduler that takes and gives back its units,
//! and the last record of how it ended.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::aws::rate::Control;
use crate::phase::progress::Progress;
use crate::state::fleet::lease::BEATS_PER_LEASE;
use crate::state::fleet::live_workers;

use super::schedule::schedule;
use super::{Budgets, Drive, Leasing, Shared, share_of};

/// Leads this process's share of the fleet's units through `drive`: the
/// heartbeat (renewals, this process's record, the rate shares on
/// `control`), the scheduler (take, re-balance, release), and the last
/// record (done, stopped or failed). The units this process finished, and
/// whether every unit is done.
pub(crate) async fn lead<T>(
    shared: &Arc<Shared>,
    drive: Arc<dyn Drive>,
    leasing: &Leasing,
    control: Arc<Control>,
    budgets: Budgets,
    progress: &Progress,
    beside: Option<Beside<impl Future<Output = T>>>,
) -> (anyhow::Result<(BTreeSet<u32>, bool)>, Option<T>) {
    let beat_stop = CancellationToken::new();
    let beats = tokio::spawn(heartbeat(
        shared.clone(),
        control,
        budgets,
        beat_stop.clone(),
    ));
    let (outcome, beside) = match beside {
        None => (schedule(shared, &drive, leasing, progress).await, None),
        Some(b) => {
            let units = async {
                let r = schedule(shared, &drive, leasing, progress).await;
                if r.is_err() {
                    b.stop.cancel();
                }
                r
            };
            let (r, t) = tokio::join!(units, b.run);
            (r, Some(t))
        }
    };
    beat_stop.cancel();
    let _ = beats.await;
    // After the last heartbeat, which would say "running" again.
    let state = match &outcome {
        Ok((_, true)) => "done",
        Ok((_, false)) => "stopped",
        Err(_) => "failed",
    };
    if let Err(e) = shared.fleet.report_worker(&[], 0.0, 0.0, state).await {
        tracing::warn!(error = %e, "cannot report this worker");
    }
    (outcome, beside)
}

/// Work that runs beside a process's units under the same heartbeat (the
/// worker's `--tail`), and outlives them: stopped with `stop` if the units fail.
pub(crate) struct Beside<F> {
    pub run: F,
    pub stop: CancellationToken,
}

/// Renews every lease held, then reports this worker and re-reads the
/// number of live workers for the rate shares; every lease duration ÷
/// [`BEATS_PER_LEASE`].
async fn heartbeat(
    shared: Arc<Shared>,
    control: Arc<Control>,
    budgets: Budgets,
    stop: CancellationToken,
) {
    // A fixed beat: the time the renewals take is not added to the wait
    // before the next ones (under load it was, and holders fenced themselves).
    let mut beat = tokio::time::interval(shared.units.duration / BEATS_PER_LEASE);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut live_before = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = beat.tick() => {}
        }
        renew_all(&shared).await;
        let me = shared.fleet.worker.clone();
        let live = match shared.fleet.read_workers().await {
            Ok(snap) => live_workers(&snap, &me, shared.units.duration),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the control table");
                live_before.max(1)
            }
        };
        if live != live_before {
            // A new share: the table's budget over the workers alive now.
            control
                .set_ceilings(share_of(budgets.read, live), share_of(budgets.write, live))
                .await;
            tracing::info!(live, "rate share set");
            live_before = live;
        }
        let (w, r) = (
            share_of(budgets.write, live).unwrap_or(0.0),
            share_of(budgets.read, live).unwrap_or(0.0),
        );
        if let Err(e) = shared
            .fleet
            .report_worker(&shared.held_units(), w, r, "running")
            .await
        {
            tracing::warn!(error = %e, "cannot report this worker");
        }
    }
}

/// One renewal of each lease held, units and shards. A refused renewal
/// means the lease is gone: its unit (or shard) stops at once.
async fn renew_all(shared: &Shared) {
    futures::future::join(
        shared.units.renew_all(&shared.fleet),
        shared.shards.renew_all(&shared.fleet),
    )
    .await;
}
