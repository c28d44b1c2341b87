//! `rekey tail --fleet` publishes its progress in the control table (the
//! `TAIL` item: `applied_through_ms`, `updated_ms`), so that processes on
//! other machines — the fleet's verify re-checks — can wait on it: they
//! cannot read the tail's local `status.json`. A sharded fleet tail writes
//! the same item.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::aws::{AwsError, Clients};
use crate::state::StateDir;
use crate::state::fleet::{Fleet, FleetError, FleetRef, TailMark};
use crate::state::snapshot::{self, TailStatus};

/// The mark of the tail's status file, if it has written one.
fn mark_of(state_dir: &StateDir) -> anyhow::Result<Option<TailMark>> {
    let status: Option<TailStatus> = snapshot::read(&state_dir.tail_snapshot())?;
    Ok(status.map(|s| TailMark {
        applied_through_ms: s.applied_through.map(|t| t.timestamp_millis()),
        updated_ms: s.updated_at.timestamp_millis(),
        stopped: s.stopped,
    }))
}

/// Publishes the tail's status file as the fleet's `TAIL` item whenever it
/// changes (the tail rewrites it about once a second), until `stop`.
pub async fn publish_tail(
    clients: &Clients,
    fleet: &FleetRef,
    state_dir: &StateDir,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let f = Fleet::open(clients, fleet, "tail");
    let mut last = None;
    loop {
        publish_changed(&f, state_dir, &mut last).await?;
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// One look at the status file: published if it moved since `last`.
pub async fn publish_changed(
    f: &Fleet,
    state_dir: &StateDir,
    last: &mut Option<TailMark>,
) -> anyhow::Result<()> {
    let mark = mark_of(state_dir)?;
    if let Some(m) = mark
        && mark != *last
    {
        match f.publish_tail(&m).await {
            Ok(()) => *last = mark,
            // The first worker creates the table: publish again once it exists.
            Err(FleetError::Aws(AwsError::NotFound { .. })) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The last publication, once the tail has ended (its final status, stopped).
pub async fn publish_final(
    clients: &Clients,
    fleet: &FleetRef,
    state_dir: &StateDir,
) -> anyhow::Result<()> {
    let f = Fleet::open(clients, fleet, "tail");
    publish_changed(&f, state_dir, &mut None).await
}
