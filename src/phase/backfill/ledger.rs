//! A backfill's books: counters, the rejects file and resume points,
//! committed together, one page at a time.

use super::*;

/// Shared state of a run: counters, rejects file, checkpoint commits.
pub(super) struct Ledger {
    pub(super) keys: Keys,
    pub(super) store: StateStore,
    /// None when the plan proves a target key has one source key
    /// ([`crate::core::inverse::key_injective`]): nothing to claim.
    pub(super) claims: Option<Claims>,
    pub(super) totals: Counters,
    pub(super) this_run: Counters,
    pub(super) rejects: RejectsFile,
}

impl Ledger {
    /// Commit one page: its rejects, counters and resume point, atomically.
    pub(super) fn commit(
        &mut self,
        key: &str,
        state: &serde_json::Value,
        page: &Counters,
        rejects: &[(Item, String)],
    ) -> anyhow::Result<()> {
        self.commit_with(key, state, page, rejects, &[])
    }

    /// [`Ledger::commit`], with `extra` entries in the same batch (an
    /// import's next part number).
    pub(super) fn commit_with(
        &mut self,
        key: &str,
        state: &serde_json::Value,
        page: &Counters,
        rejects: &[(Item, String)],
        extra: &[(&str, serde_json::Value)],
    ) -> anyhow::Result<()> {
        for (item, reason) in rejects {
            self.rejects.write(item, reason)?;
        }
        let len = self.rejects.flush_len()?;
        self.totals.add(page);
        self.this_run.add(page);
        let (counters, rejects_len) = (self.keys.counters(), self.keys.rejects_len());
        let mut entries = vec![
            (key, state.clone()),
            (counters.as_str(), serde_json::to_value(self.totals)?),
            (rejects_len.as_str(), serde_json::to_value(len)?),
        ];
        entries.extend(extra.iter().cloned());
        self.store.put_batch(&entries)?;
        self.store.flush()?;
        // The resume point itself holds key values: only its name and the counts.
        tracing::info!(
            checkpoint = key,
            scanned = page.scanned,
            written = page.written,
            rejected = page.rejected,
            skipped = page.skipped,
            total_scanned = self.totals.scanned,
            "checkpoint committed"
        );
        Ok(())
    }
}
