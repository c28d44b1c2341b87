//! Marker items for barriers and probes (crate::phase::barrier): written
//! under many keys, in rounds, because a key reaches one partition and so
//! one open stream shard. Shared by drain, the tail's probes and verify's
//! stream watch, so this knows nothing of either.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::Context as _;

use crate::aws::retry::{backoff, jitter};
use crate::aws::streams::ShardInfo;
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

/// The one id of the tails' probes: their marker keys are the same from
/// probe to probe, so a key once read on a shard reaches that shard again
/// (a key keeps its partition), and a tail that knows one key for each
/// quiet shard writes those alone instead of a K·ln K round
/// ([`ProbeKeys`]). A marker's `started_at`, not its key,
/// says which probe wrote it; two probes writing one key at once leave a
/// record of each, or of the later, and either proves its own start.
pub(crate) const PROBE_KEYS: &str = "probe-keys";

/// Markers for a round over `k` shards: enough random keys that each shard
/// likely gets one (K·(ln K + 1), the coupon collector's bound), capped.
pub(crate) fn round_size(k: usize) -> u32 {
    let k = k.max(1) as f64;
    (k * (k.ln() + 1.0)).ceil().min(1000.0) as u32
}

/// Targeted probes a shard may miss before it gets a full round again. A
/// marker can take seconds to show (records delayed, empty pages in runs)
/// while the next probe is due, so one miss proves nothing.
const MISSES: u32 = 3;

/// Which probe marker reaches which shard, as read.
#[derive(Debug)]
pub(crate) struct ProbeKeys {
    /// Shard → the number of a [`PROBE_KEYS`] marker read on it.
    seen: HashMap<String, u32>,
    /// Shard → targeted probes sent to it since it last showed one.
    misses: HashMap<String, u32>,
    /// Where the next full round's markers start. Each full round takes
    /// keys no earlier one took: the same keys every round would miss the
    /// same shards every round (a partition split off where none of them
    /// hash), and such a shard would never show a marker.
    next: u32,
}

impl Default for ProbeKeys {
    fn default() -> ProbeKeys {
        ProbeKeys {
            seen: HashMap::new(),
            misses: HashMap::new(),
            // A process's rounds start apart from another's (a restarted
            // tail, verify's watch beside the tail).
            next: rand_u32() >> 2,
        }
    }
}

impl ProbeKeys {
    /// The first marker of a full round of `n`, taking keys no earlier
    /// round of this process took.
    pub(crate) fn full_round(&mut self, n: u32) -> u32 {
        let from = match self.next.checked_add(n) {
            Some(_) => self.next,
            None => 0,
        };
        self.next = from + n;
        from
    }

    /// For each shard of `shards` with one, the marker that reaches it: its
    /// own, or that of the parent it alone continues (a rollover keeps the
    /// key range; a split does not). A shard that missed [`MISSES`] targeted
    /// probes has none until it shows a marker again.
    pub(crate) fn keys_for(&self, shards: &[ShardInfo]) -> HashMap<String, u32> {
        let parent: HashMap<&str, &str> = shards
            .iter()
            .filter_map(|s| Some((s.id.as_str(), s.parent.as_deref()?)))
            .collect();
        let mut children: HashMap<&str, usize> = HashMap::new();
        for p in parent.values() {
            *children.entry(p).or_default() += 1;
        }
        let key = |shard: &str| {
            if self.misses.get(shard).is_some_and(|&m| m >= MISSES) {
                return None;
            }
            let mut id = shard;
            loop {
                if let Some(&n) = self.seen.get(id) {
                    return Some(n);
                }
                match parent.get(id) {
                    Some(&p) if children.get(p) == Some(&1) => id = p,
                    _ => return None,
                }
            }
        };
        shards
            .iter()
            .filter_map(|s| Some((s.id.clone(), key(&s.id)?)))
            .collect()
    }

    /// Marker `n` was read on `shard`.
    pub(crate) fn saw(&mut self, shard: &str, n: u32) {
        self.seen.insert(shard.to_string(), n);
        self.misses.remove(shard);
    }

    /// The markers that reach every shard of `quiet` (ids of `shards`), when
    /// a key is known for each ([`ProbeKeys::keys_for`]). None: some shard
    /// needs a full round. Counts a miss for each shard targeted.
    pub(crate) fn targets(&mut self, quiet: &[&str], shards: &[ShardInfo]) -> Option<Vec<u32>> {
        let known = self.keys_for(shards);
        let ns: BTreeSet<u32> = quiet
            .iter()
            .map(|q| known.get(*q).copied())
            .collect::<Option<_>>()?;
        for &q in quiet {
            *self.misses.entry(q.to_string()).or_default() += 1;
        }
        // Shards gone from the listing (trimmed) are not asked about again.
        let listed: std::collections::HashSet<&str> =
            shards.iter().map(|s| s.id.as_str()).collect();
        self.seen.retain(|id, _| listed.contains(id.as_str()));
        self.misses.retain(|id, _| listed.contains(id.as_str()));
        Some(ns.into_iter().collect())
    }
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

    /// Writes (and deletes) the markers numbered `ns` (sorted, not empty);
    /// returns how many. Recorded as the range they span, which a sweep
    /// deletes whole (a delete of a marker never written is harmless).
    pub async fn these(&self, ns: &[u32]) -> anyhow::Result<u32> {
        let (Some(&from), Some(&last)) = (ns.first(), ns.last()) else {
            return Ok(0);
        };
        sweep(self.clients, self.ledger, self.table, self.key).await?;
        let flight = self.ledger.begin(&Round {
            table: self.table.to_string(),
            id: self.id.to_string(),
            from,
            n: last - from + 1,
            pid: std::process::id(),
        })?;
        self.write(ns.iter().copied(), true).await?;
        flight.done()?;
        Ok(ns.len() as u32)
    }

    /// Puts (with `write`) and deletes markers `from..from + n`. A delete of
    /// a marker never written is harmless, so a sweep deletes them all.
    async fn each(&self, from: u32, n: u32, write: bool) -> anyhow::Result<()> {
        self.write(from..from + n, write).await
    }

    async fn write(&self, ns: impl Iterator<Item = u32>, write: bool) -> anyhow::Result<()> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        stream::iter(ns)
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

    fn shard(id: &str, parent: Option<&str>) -> ShardInfo {
        ShardInfo {
            id: id.into(),
            parent: parent.map(Into::into),
            closed: false,
        }
    }

    #[test]
    fn a_key_read_on_a_shard_targets_it_and_its_rollover_child_but_not_a_split() {
        let shards = [
            shard("a", None),
            shard("a1", Some("a")),
            shard("b", None),
            shard("b1", Some("b")),
            shard("b2", Some("b")),
        ];
        let mut k = ProbeKeys::default();
        assert_eq!(k.targets(&["a"], &shards), None, "nothing read yet");
        k.saw("a", 7);
        k.saw("b", 9);
        assert_eq!(k.targets(&["a"], &shards), Some(vec![7]));
        assert_eq!(k.targets(&["a1"], &shards), Some(vec![7]), "a rollover");
        assert_eq!(k.targets(&["b1"], &shards), None, "a split");
        k.saw("b1", 3);
        k.saw("b2", 4);
        assert_eq!(k.targets(&["a1", "b1", "b2"], &shards), Some(vec![3, 4, 7]));
    }

    #[test]
    fn a_shard_that_misses_its_targeted_markers_gets_a_full_round_until_it_shows_one() {
        let shards = [shard("a", None), shard("b", None)];
        let mut k = ProbeKeys::default();
        k.saw("a", 1);
        k.saw("b", 2);
        for _ in 0..MISSES {
            assert_eq!(k.targets(&["a", "b"], &shards), Some(vec![1, 2]));
            k.saw("b", 2);
        }
        assert_eq!(k.targets(&["a", "b"], &shards), None, "a missed {MISSES}");
        assert_eq!(k.targets(&["b"], &shards), Some(vec![2]), "b is fine");
        k.saw("a", 5);
        assert_eq!(k.targets(&["a", "b"], &shards), Some(vec![2, 5]));
    }

    #[test]
    fn each_full_round_takes_keys_no_earlier_round_took() {
        let mut k = ProbeKeys::default();
        let a = k.full_round(100);
        let b = k.full_round(50);
        let c = k.full_round(10);
        assert_eq!((b, c), (a + 100, a + 150));
    }

    #[test]
    fn shards_gone_from_the_listing_are_forgotten() {
        let mut k = ProbeKeys::default();
        k.saw("old", 1);
        k.saw("a", 2);
        assert_eq!(k.targets(&["a"], &[shard("a", None)]), Some(vec![2]));
        assert!(!k.seen.contains_key("old"));
    }
}
