//! `rekey rollback`: the cutover's mirror, for when the new table must be
//! left again. Its gates and drain barrier are the cutover's, the other way
//! (`switch` with [`Flow::Reverse`]); what is its own is when it may run at
//! all and what it records: the rollback first, then the cutover set aside.

use std::path::Path;

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::phase::error::InputError;
use crate::phase::progress::Progress;
use crate::phase::tail::Flow;
use crate::state::snapshot::{self, CutoverRecord};
use crate::state::{StateDir, StateStore};

use super::switch::{Switch, record, switch, switched};
use super::{CutoverOptions, CutoverReport};

/// `rekey rollback`: the mirror of a cutover. The gates read the reverse
/// tail (caught up, lag under the threshold), a clean verify within the age
/// limit and the reverse rejects; the postpone file is honoured; the drain
/// barrier goes through the target's stream; then the rollback is recorded
/// (`rollback.json`) and the cutover record set aside, so the forward tail —
/// which never stopped — carries on and a later `rekey cutover` can switch
/// again. `cut_over` in the report means "rolled back".
pub async fn rollback(
    clients: &Clients,
    plan: &Plan,
    opts: &CutoverOptions,
    progress: &Progress,
) -> anyhow::Result<CutoverReport> {
    // One driver per plan: the store's lock refuses a second one.
    let store = StateStore::open(&opts.state_dir, plan)?;
    match store.get::<CutoverRecord>("cutover/record")? {
        None => anyhow::bail!(InputError(
            "no cutover is recorded for this plan: there is nothing to roll back".into()
        )),
        Some(r) if r.finished_at.is_some() => anyhow::bail!(InputError(
            "the migration is finished (`rekey finish` ran): the tails have stopped, so it cannot be rolled back".into()
        )),
        Some(_) => {}
    }
    let (gates, barrier) = match switch(clients, plan, opts, progress, Flow::Reverse).await? {
        Switch::Blocked(report) => return Ok(report),
        Switch::Drained { gates, barrier } => (gates, barrier),
    };
    let record = record(plan, gates, barrier);
    record_rollback(&store, &opts.state_dir, &record)?;
    Ok(switched(record))
}

/// The rollback first, then the cutover set aside: a crash in between
/// leaves a rollback recorded and a rerun says so.
fn record_rollback(
    store: &StateStore,
    state_dir: &StateDir,
    record: &CutoverRecord,
) -> anyhow::Result<()> {
    store.put("rollback/record", record)?;
    store.flush()?;
    snapshot::publish(&state_dir.rollback_record(), record)?;
    store.remove("cutover/record")?;
    store.flush()?;
    match std::fs::remove_file(state_dir.cutover_record()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::Error::new(e).context("cannot remove cutover.json"))
        }
        _ => Ok(()),
    }
}

/// The operator's next steps after a rollback.
pub fn rollback_steps(plan: &Plan, plan_path: &Path) -> String {
    format!(
        "Next steps:\n\
         1. Point the application's reads and writes back at `{source}` (deploy the old key design).\n\
         2. Keep `rekey reverse` running meanwhile: writes that still reach `{target}` are carried back.\n\
         3. The forward tail never stopped: `{target}` stays current, so you can cut over again later\n\
            (rekey verify {plan}, then rekey cutover {plan}).\n\
         4. To end the migration instead: stop both tails (rekey finish {plan} after a cutover).",
        target = plan.target_table,
        source = plan.source_table,
        plan = plan_path.display()
    )
}
