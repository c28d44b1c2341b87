//! `rekey cutover` and `rekey finish`: switching the application to the new
//! table on evidence, at a moment the operator chooses.
//!
//! Cutover checks four gates from what the other processes published
//! ([`crate::state::snapshot`]): the backfill is complete, the tail is running with lag
//! under a threshold, a clean verify is recent enough, and no rejects are left
//! unless accepted. While a postpone flag file exists it waits, re-checking,
//! so the operator picks the moment by deleting the file. Then it proves the
//! tail has applied every source write up to now with a drain barrier
//! ([`crate::phase::barrier`]), records the cutover durably (state store and
//! `cutover.json`), and prints the steps for switching the application. The
//! tail keeps running — writes that still reach the old table during the
//! switch are carried over — until `rekey finish`, which drains once more,
//! records the end and tells the tail to stop.
//!
//! With `--state dynamodb://…` the backfill, rejects and verify are the
//! fleet's; so are the tail gate and the drain barrier when the fleet has a
//! tail of its own (`rekey worker --tail`: the lag from its shards' units,
//! the barrier through [`crate::phase::barrier::fleet`]); else they stay
//! this machine's `rekey tail --fleet`. `finish --state` then records the
//! end in the control table, and the fleet's tail stops.
//!
//! Invariant: a cutover is recorded only after every gate held and the drain
//! barrier completed, in that order, with the gates re-checked after the
//! postpone wait.
//!
//! One file per job: the cutover here, [`rollback`] (the same switch the
//! other way), [`finish`], and what they share — the evidence the gates read
//! (`evidence`), the gates themselves (`gates`, pure), and the wait for them
//! and the drain barrier (`switch`).

mod evidence;
mod finish;
mod gates;
mod rollback;
mod switch;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::phase::progress::Progress;
use crate::phase::tail::{Flow, line};
use crate::state::fleet::FleetRef;
use crate::state::snapshot::{CutoverRecord, Gate};
use crate::state::{StateDir, StateStore};

pub use finish::{FinishReport, finish};
pub use rollback::{rollback, rollback_steps};

use switch::{Switch, record, switch, switched};

/// What a cutover or a rollback accepts, and how long it waits.
#[derive(Debug, Clone)]
pub struct CutoverOptions {
    pub state_dir: StateDir,
    /// Largest acceptable tail lag, seconds.
    pub max_lag: f64,
    /// Oldest acceptable clean verify.
    pub max_verify_age: Duration,
    pub accept_rejects: bool,
    /// Wait while this file exists.
    pub postpone_file: PathBuf,
    /// How long to keep re-checking gates that are not met before giving up.
    pub wait: Duration,
    pub drain_timeout: Duration,
    /// `--state dynamodb://…`: the backfill, its rejects and the verify are
    /// the fleet's, read from the control table; so are the tail and the
    /// drain barrier when the fleet tails (`worker --tail`), else they are
    /// this machine's (`rekey tail --fleet` runs here).
    pub fleet: Option<FleetRef>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CutoverReport {
    /// Recorded now or earlier (a rerun after a cutover reports the record).
    pub cut_over: bool,
    pub gates: Vec<Gate>,
    pub record: Option<CutoverRecord>,
    /// Why not, when `cut_over` is false.
    pub blocked: Option<String>,
}

/// `rekey cutover`: once every gate holds and the drain barrier completed,
/// the cutover is recorded (state store, `cutover.json`). A rerun after a
/// cutover reports the record.
pub async fn cutover(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
) -> anyhow::Result<CutoverReport> {
    // One driver per plan: the store's lock refuses a second cutover.
    let store = StateStore::open(&opts.state_dir, plan)?;
    if let Some(recorded) = store.get::<CutoverRecord>("cutover/record")? {
        return Ok(switched(recorded));
    }
    let (gates, barrier) = match switch(clients, plan, opts, progress, Flow::Forward).await? {
        Switch::Blocked(report) => return Ok(report),
        Switch::Drained { gates, barrier } => (gates, barrier),
    };
    // After the drain: from the line on the forward tail is guarded, a read
    // and a write per record, too slow to drain an application still
    // writing the source at full rate within the timeout.
    if opts.fleet.is_none() {
        reverse_line(clients, plan, opts, progress).await?;
    }
    let record = record(plan, gates, barrier);
    store.put("cutover/record", &record)?;
    store.flush()?;
    crate::state::snapshot::publish(&opts.state_dir.cutover_record(), &record)?;
    Ok(switched(record))
}

/// Before a cutover, where a rollback is possible: the reverse tail's start
/// line (crate::phase::tail::line), drawn while only rekey writes the
/// target, so a reverse tail started after the application has moved
/// carries back every write it made and nothing of rekey's.
async fn reverse_line(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
) -> anyhow::Result<()> {
    if opts.state_dir.reverse_line().exists() || line::reversible(clients, plan).await?.is_err() {
        return Ok(());
    }
    progress.note("drawing the reverse tail's start line through the target's stream");
    line::ensure(clients, plan, &opts.state_dir, opts.drain_timeout)
        .await
        .map_err(|e| e.context("the reverse tail's start line (a rollback needs it)"))?;
    Ok(())
}

/// The operator's next steps after a cutover.
pub fn next_steps(plan: &Plan, plan_path: &Path) -> String {
    format!(
        "Next steps:\n\
         1. Point the application's reads and writes at `{target}` (deploy the new key design).\n\
         2. Keep `rekey tail` running meanwhile: writes that still reach `{source}` are carried over.\n\
         3. When no instance writes to `{source}` any more: rekey finish {plan}\n\
         4. Keep `{source}` until you are sure; rekey never deletes it.",
        target = plan.target_table,
        source = plan.source_table,
        plan = plan_path.display()
    )
}
