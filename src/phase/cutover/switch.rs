//! The switch both directions share: wait until every gate holds (and no
//! postpone file exists), re-reading the evidence, then prove with a drain
//! barrier that the tail applied every write made until now. What a
//! cutover or a rollback then records is its own.

use std::time::{Duration, Instant};

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::phase::barrier::{self, DrainOptions};
use crate::phase::progress::Progress;
use crate::phase::tail::Flow;
use crate::state::snapshot::{CutoverRecord, Gate};

use super::evidence::Evidence;
use super::gates::gates;
use super::{CutoverOptions, CutoverReport};

/// How far a switch got.
pub(super) enum Switch {
    /// The gates held and the drain barrier completed: record the switch.
    Drained { gates: Vec<Gate>, barrier: String },
    /// Gates not met within the wait, or the drain barrier not reported in time.
    Blocked(CutoverReport),
}

/// The gates once they hold, or as they stood when the wait ran out.
enum Gated {
    /// Every gate held; `fleet_tail`: the fleet's own tail is the one to drain.
    Met {
        gates: Vec<Gate>,
        fleet_tail: bool,
    },
    NotMet(Vec<Gate>),
}

/// Switch the application's table: forwards (cutover) or backwards
/// (rollback), up to the drain barrier.
pub(super) async fn switch(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
    flow: Flow,
) -> anyhow::Result<Switch> {
    let (gates, fleet_tail) = match wait_for_gates(clients, opts, progress, flow).await? {
        Gated::Met { gates, fleet_tail } => (gates, fleet_tail),
        Gated::NotMet(gates) => {
            return Ok(Switch::Blocked(CutoverReport {
                cut_over: false,
                blocked: Some("gates not met".into()),
                gates,
                record: None,
            }));
        }
    };
    for g in &gates {
        progress.note(&format!("gate ok: {} — {}", g.name, g.detail));
    }
    progress.note(&format!(
        "drain barrier: waiting for the {} to apply every {} write made until now",
        match flow {
            Flow::Forward if fleet_tail => "fleet's tail",
            Flow::Forward => "tail",
            Flow::Reverse => "reverse tail",
        },
        flow.read_role()
    ));
    let through = DrainOptions {
        state_dir: opts.state_dir.clone(),
        timeout: opts.drain_timeout,
        flow,
        fleet: opts.fleet.clone().filter(|_| fleet_tail),
    };
    let drain = barrier::drain(clients, plan, &through).await?;
    if !drain.complete {
        return Ok(Switch::Blocked(CutoverReport {
            cut_over: false,
            blocked: Some(format!(
                "the tail did not report drain barrier {} within {:.0} s",
                drain.barrier, drain.waited_seconds
            )),
            gates,
            record: None,
        }));
    }
    Ok(Switch::Drained {
        gates,
        barrier: drain.barrier,
    })
}

/// Re-reads the evidence every half second until every gate holds and no
/// postpone file exists; gives up after `opts.wait` unless postponed.
async fn wait_for_gates(
    clients: &Clients,
    opts: &CutoverOptions,
    progress: &Progress,
    flow: Flow,
) -> anyhow::Result<Gated> {
    let started = Instant::now();
    let mut said_postponed = false;
    loop {
        let evidence = match (&opts.fleet, flow) {
            (Some(at), Flow::Forward) => Evidence::read_fleet(clients, &opts.state_dir, at).await?,
            _ => Evidence::read_for(&opts.state_dir, flow)?,
        };
        let g = gates(&evidence, opts, chrono::Utc::now());
        let all_ok = g.iter().all(|g| g.ok);
        let postponed = opts.postpone_file.exists();
        if all_ok && !postponed {
            let fleet_tail = evidence.fleet.as_ref().is_some_and(|f| f.tail.is_some());
            return Ok(Gated::Met {
                gates: g,
                fleet_tail,
            });
        }
        if postponed {
            if !said_postponed {
                progress.note(&format!(
                    "postponed: waiting while {} exists (delete it to cut over)",
                    opts.postpone_file.display()
                ));
                said_postponed = true;
            }
        } else if started.elapsed() >= opts.wait {
            return Ok(Gated::NotMet(g));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The record of a switch that drained `barrier` with `gates` held.
pub(super) fn record(plan: &Plan, gates: Vec<Gate>, barrier: String) -> CutoverRecord {
    CutoverRecord {
        at: chrono::Utc::now(),
        barrier,
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        gates,
        finished_at: None,
    }
}

/// The report of a switch recorded (now, or by an earlier run).
pub(super) fn switched(record: CutoverRecord) -> CutoverReport {
    CutoverReport {
        cut_over: true,
        gates: record.gates.clone(),
        record: Some(record),
        blocked: None,
    }
}
