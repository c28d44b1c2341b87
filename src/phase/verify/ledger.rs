//! The verify store's books: checkpoints, counters, candidates and what the
//! stream watch recorded, committed together so a kill -9 cannot lose one.

use std::collections::HashMap;

use crate::core::value::{Item, encode_key};
use crate::phase::watch::Touch;
use crate::state::snapshot::Counts;
use crate::state::{StateStore, StoreBatch};

use super::{CAND, KEY_COUNTS, KEY_RUN, OCAND, OWNER, RunMeta, Step, TOUCHED, WRITES, hex};

pub(super) fn seg_key(pass: &str, n: u32) -> String {
    format!("verify/{pass}/{n:05}")
}

pub(super) struct Ledger {
    pub(super) store: StateStore,
    /// The expected target keys (target key → source key), for the orphan
    /// pass without a source_key_prefix: on redb, flat in memory (claims.rs).
    pub(super) expected: crate::state::claims::Claims,
    pub(super) counts: Counts,
}

impl Ledger {
    /// Counters move only with their page's checkpoint: one atomic, flushed batch.
    pub(super) fn commit(&mut self, mut batch: StoreBatch, delta: &Counts) -> anyhow::Result<()> {
        let mut next = self.counts;
        next.add(delta);
        debug_assert!(next.accounted(), "{next:?}");
        batch.put(KEY_COUNTS, &next)?;
        self.store.apply(batch)?;
        self.store.flush()?;
        self.counts = next;
        Ok(())
    }

    /// What the stream watch saw, kept only where a re-check will ask: the
    /// items that mapped to an orphan candidate's key (they become its owners),
    /// and a count of writes to every owner and forward candidate.
    pub(super) fn record_touches(&self, touches: &[Touch], sn: &[&str]) -> anyhow::Result<()> {
        let mut b = StoreBatch::default();
        let mut writes: HashMap<String, u64> = HashMap::new();
        let mut owners = std::collections::HashSet::new();
        for t in touches {
            let sk = encode_key(&t.source_key, sn).unwrap_or_default();
            let owner = format!("{OWNER}{}", hex(&sk));
            if let Some(tk) = &t.target_key
                && self.store.contains(&format!("{OCAND}{}", hex(tk)))?
            {
                b.put(&touch_key(tk, &sk), &t.source_key)?;
                b.put(&owner, &true)?;
                owners.insert(owner.clone());
            }
            let counted = owners.contains(&owner)
                || self.store.contains(&owner)?
                || self.store.contains(&format!("{CAND}{}", hex(&sk)))?;
            if counted {
                let key = format!("{WRITES}{}", hex(&sk));
                let n = match writes.get(&key) {
                    Some(n) => *n,
                    None => self.store.get::<u64>(&key)?.unwrap_or(0),
                };
                writes.insert(key, n + 1);
            }
        }
        for (k, n) in &writes {
            b.put(k, n)?;
        }
        Ok(self.store.apply(b)?)
    }

    /// Writes the watch has recorded to each item (see `record_touches`).
    pub(super) fn writes(&self, source_keys: &[Item], sn: &[&str]) -> anyhow::Result<Vec<u64>> {
        source_keys
            .iter()
            .map(|k| {
                let sk = encode_key(k, sn).unwrap_or_default();
                Ok(self
                    .store
                    .get::<u64>(&format!("{WRITES}{}", hex(&sk)))?
                    .unwrap_or(0))
            })
            .collect()
    }

    pub(super) fn set_phase(&mut self, meta: &mut RunMeta, phase: Step) -> anyhow::Result<()> {
        meta.phase = phase;
        self.store.put(KEY_RUN, meta)?;
        self.store.flush()?;
        Ok(())
    }
}

/// The store key that records a source item the stream watch saw map to a
/// target key during the orphan pass ([`TOUCHED`]).
fn touch_key(target_key: &[u8], source_key: &[u8]) -> String {
    format!("{TOUCHED}{}/{}", hex(target_key), hex(source_key))
}
