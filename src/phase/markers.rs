//! Marker items for barriers and probes (crate::phase::barrier): written
//! under many keys, in rounds, because a key reaches one partition and so
//! one open stream shard. Shared by drain, the tail's probes and verify's
//! stream watch, so this knows nothing of either.

use std::time::Duration;

use anyhow::Context as _;

use crate::aws::retry::{backoff, jitter};
use crate::aws::{AwsError, Clients, item};
use crate::core::marker::{Marker, marker_item_in};
use crate::phase::error::InputError;
use crate::state::markers::{Ledger, Round};

/// Markers travel in rounds this far apart while a barrier waits.
pub(crate) const ROUND_EVERY: Duration = Duration::from_secs(1);

/// Barrier ids of the tail's own probes start with this; nobody waits on them.
const PROBE: &str = "probe-";

/// Whether barrier `id` is a tail's probe.
pub(crate) fn is_probe(id: &str) -> bool {
    id.starts_with(PROBE)
}

/// A new probe's id.
pub fn new_probe_id() -> String {
    format!("{PROBE}{}", new_id())
}

/// Markers for a round over `k` shards: enough random keys that each shard
/// likely gets one (K·(ln K + 1), the coupon collector's bound), capped.
pub(crate) fn round_size(k: usize) -> u32 {
    let k = k.max(1) as f64;
    (k * (k.ln() + 1.0)).ceil().min(1000.0) as u32
}

/// The markers of one barrier, in one table.
pub struct Markers<'a> {
    pub clients: &'a Clients,
    pub key: &'a crate::core::plan::KeySchema,
    pub table: &'a str,
    pub id: &'a str,
    pub started_at: f64,
    /// Where rounds in flight are recorded, so a cut-short one is swept.
    pub ledger: &'a Ledger,
}

impl Markers<'_> {
    /// Writes (and deletes) markers `from..from + n`; returns `n`. First
    /// sweeps what earlier rounds cut short left in the table.
    pub async fn round(&self, from: u32, n: u32) -> anyhow::Result<u32> {
        sweep(self.clients, self.ledger, self.table, self.key).await?;
        let flight = self.ledger.begin(&Round {
            table: self.table.to_string(),
            id: self.id.to_string(),
            from,
            n,
            pid: std::process::id(),
        })?;
        self.each(from, n, true).await?;
        flight.done()?;
        Ok(n)
    }

    /// Puts (with `write`) and deletes markers `from..from + n`. A delete of
    /// a marker never written is harmless, so a sweep deletes them all.
    async fn each(&self, from: u32, n: u32, write: bool) -> anyhow::Result<()> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        stream::iter(from..from + n)
            .map(|i| async move {
                let m = Marker {
                    barrier: self.id.to_string(),
                    n: i,
                    started_at: Some(self.started_at),
                };
                if write {
                    let item = marker_item_in(self.key, self.table, &m).map_err(InputError)?;
                    retried(|| item::put_item(self.clients, self.table, &item))
                        .await
                        .with_context(|| {
                            format!("writing drain marker {i} into `{}`", self.table)
                        })?;
                }
                // The key alone: DynamoDB refuses a key with other attributes.
                let key = marker_item_in(
                    self.key,
                    self.table,
                    &Marker {
                        started_at: None,
                        ..m
                    },
                )
                .map_err(InputError)?;
                retried(|| item::delete_item(self.clients, self.table, &key))
                    .await
                    .with_context(|| format!("deleting drain marker {i} from `{}`", self.table))?;
                anyhow::Ok(())
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// Throttles of one marker write before the round fails: retried here, as
/// rekey's own loops retry its other writes (transient failures are retried
/// by crate::aws::item itself).
const MARKER_ATTEMPTS: u32 = 10;

async fn retried<F, Fut>(mut call: F) -> Result<(), AwsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), AwsError>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(e) if e.is_throttle() && attempt + 1 < MARKER_ATTEMPTS => {
                tracing::info!(error = %e, attempt, "a marker write throttled");
                tokio::time::sleep(backoff(attempt, jitter())).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Deletes the markers of every round in `table` that a kill -9 or a stop
/// cut short (crate::state::markers), and forgets those rounds.
pub(crate) async fn sweep(
    clients: &Clients,
    ledger: &Ledger,
    table: &str,
    key: &crate::core::plan::KeySchema,
) -> anyhow::Result<()> {
    for (path, round) in ledger.abandoned(table)? {
        let markers = Markers {
            clients,
            key,
            table,
            id: &round.id,
            started_at: 0.0,
            ledger,
        };
        markers.each(round.from, round.n, false).await?;
        tracing::debug!(barrier = %round.id, markers = round.n, "swept a cut-short round");
        Ledger::forget(&path)?;
    }
    Ok(())
}

/// A new barrier's id: when, and a random part.
pub(crate) fn new_id() -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_covers_k_shards_about_k_ln_k_times_and_is_capped() {
        assert_eq!(round_size(0), 1);
        assert_eq!(round_size(1), 1);
        assert_eq!(round_size(16), 61);
        assert_eq!(round_size(64), 331);
        assert_eq!(round_size(100_000), 1000);
        assert!(is_probe(&new_probe_id()) && !is_probe(&new_id()));
    }
}
