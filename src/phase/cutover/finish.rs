//! `rekey finish`: after the switch, the last drain barrier in each
//! direction that runs, the end recorded, and the tails told to stop — the
//! fleet's too, through its control table, when its workers tail.

use std::time::Duration;

use serde::Serialize;

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::phase::barrier::{self, DrainOptions};
use crate::phase::tail::Flow;
use crate::state::fleet::{Fleet, FleetRef};
use crate::state::snapshot::{self, CutoverRecord, TailStatus};
use crate::state::{StateDir, StateStore};

#[derive(Debug, Clone, Serialize)]
pub struct FinishReport {
    pub finished: bool,
    pub barrier: String,
    pub record: Option<CutoverRecord>,
}

/// After the switch: drain once more (each direction that runs), record
/// the end, stop the tails. With `fleet` (`--state dynamodb://…`) whose
/// workers tail, the last barrier goes through the fleet's tail and the end
/// is recorded in the control table too, where its holders see it and stop.
pub async fn finish(
    clients: &Clients,
    plan: &Plan,
    state_dir: &StateDir,
    drain_timeout: Duration,
    fleet: Option<&FleetRef>,
) -> anyhow::Result<FinishReport> {
    let store = StateStore::open(state_dir, plan)?;
    let Some(mut record) = store.get::<CutoverRecord>("cutover/record")? else {
        anyhow::bail!(crate::phase::error::InputError(
            "no cutover is recorded for this plan; run `rekey cutover` first".into()
        ));
    };
    let fleet_tail = match fleet {
        Some(at) if barrier::fleet::fleet_has_tail(clients, at).await? => Some(at),
        _ => None,
    };
    let through = DrainOptions {
        state_dir: state_dir.clone(),
        timeout: drain_timeout,
        flow: Flow::Forward,
        fleet: fleet_tail.cloned(),
    };
    let drain = barrier::drain(clients, plan, &through).await?;
    if !drain.complete {
        return Ok(FinishReport {
            finished: false,
            barrier: drain.barrier,
            record: Some(record),
        });
    }
    // A reverse tail still running is drained too: both directions end.
    let reverse: Option<TailStatus> = snapshot::read(&state_dir.reverse_snapshot())?;
    if reverse.is_some_and(|r| !r.stopped && snapshot::alive(r.pid)) {
        let back = barrier::drain(
            clients,
            plan,
            &DrainOptions {
                state_dir: state_dir.clone(),
                timeout: drain_timeout,
                flow: Flow::Reverse,
                fleet: None,
            },
        )
        .await?;
        if !back.complete {
            return Ok(FinishReport {
                finished: false,
                barrier: back.barrier,
                record: Some(record),
            });
        }
    }
    record.finished_at = Some(chrono::Utc::now());
    store.put("cutover/record", &record)?;
    store.flush()?;
    snapshot::publish(&state_dir.cutover_record(), &record)?;
    std::fs::write(state_dir.finished(), b"finished\n")?;
    if let Some(at) = fleet_tail {
        Fleet::open(clients, at, "finish").mark_finished().await?;
    }
    Ok(FinishReport {
        finished: true,
        barrier: drain.barrier,
        record: Some(record),
    })
}
