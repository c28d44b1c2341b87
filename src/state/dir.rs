//! One migration's state directory, and every path and marker file in it,
//! named once. Everything a migration keeps on this machine lives here
//! (mode 0700: it holds real key values):
//!
//! ```text
//! <dir>/db, owner                 the backfill's sled store and its lock holder
//! <dir>/tail/                     the tail's store; tail/status.json its snapshot
//! <dir>/reverse/                  the reverse tail's store (target → source); reverse/status.json
//! <dir>/{tail,reverse}/written.jsonl  each direction's echo ledger (`state::echoes`)
//! <dir>/verify/                   verify's store, result.json, mismatches.jsonl, …
//! <dir>/backfill.json             the backfill's snapshot
//! <dir>/cutover.json              the cutover record
//! <dir>/rollback.json             the last rollback's record
//! <dir>/analyze.json              `rekey run`'s analyze verdict
//! <dir>/backfill.done             marker: the backfill is complete (the tail applies)
//! <dir>/finished                  marker: `rekey finish` ran (the tail stops)
//! <dir>/postpone                  flag the operator creates: cutover waits
//! <dir>/control.json              pause, resume, rates of a running backfill
//! <dir>/rejects.jsonl, tail-rejects.jsonl, reverse-rejects.jsonl, progress.jsonl, claims.redb
//! ```

use std::ops::Deref;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir(PathBuf);

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir(root.into())
    }

    /// `.rekey/<plan file stem>`: the directory a plan uses unless told otherwise.
    pub(crate) fn for_plan(plan: &Path) -> StateDir {
        let stem = plan
            .file_stem()
            .map_or_else(|| "plan".into(), |s| s.to_string_lossy().into_owned());
        StateDir(PathBuf::from(".rekey").join(stem))
    }

    pub fn root(&self) -> &Path {
        &self.0
    }

    // ---- stores ----

    pub(crate) fn tail_store(&self) -> PathBuf {
        self.0.join("tail")
    }

    /// The reverse tail's store: the target's stream applied to the source.
    pub(crate) fn reverse_store(&self) -> PathBuf {
        self.0.join("reverse")
    }

    /// Marker rounds in flight (crate::state::markers).
    pub fn markers(&self) -> crate::state::markers::Ledger {
        crate::state::markers::Ledger::new(self.0.join("markers"))
    }

    pub(crate) fn verify_store(&self) -> PathBuf {
        self.0.join("verify")
    }

    // ---- snapshots ----

    pub(crate) fn backfill_snapshot(&self) -> PathBuf {
        self.0.join("backfill.json")
    }

    pub fn tail_snapshot(&self) -> PathBuf {
        self.tail_store().join("status.json")
    }

    /// The forward tail's echo ledger (`state::echoes`).
    pub(crate) fn tail_ledger(&self) -> PathBuf {
        self.tail_store().join("written.jsonl")
    }

    /// The reverse tail's echo ledger.
    pub(crate) fn reverse_ledger(&self) -> PathBuf {
        self.reverse_store().join("written.jsonl")
    }

    /// Where the reverse tail starts (crate::phase::tail::line).
    pub(crate) fn reverse_line(&self) -> PathBuf {
        self.reverse_store().join("line.json")
    }

    pub fn reverse_snapshot(&self) -> PathBuf {
        self.reverse_store().join("status.json")
    }

    pub fn verify_snapshot(&self) -> PathBuf {
        self.verify_store().join("result.json")
    }

    pub fn cutover_record(&self) -> PathBuf {
        self.0.join("cutover.json")
    }

    /// The last rollback's record (`rekey rollback`).
    pub(crate) fn rollback_record(&self) -> PathBuf {
        self.0.join("rollback.json")
    }

    pub(crate) fn analyze_verdict(&self) -> PathBuf {
        self.0.join("analyze.json")
    }

    // ---- markers and flags ----

    pub fn backfill_done(&self) -> PathBuf {
        self.0.join("backfill.done")
    }

    pub(crate) fn is_backfill_done(&self) -> bool {
        self.backfill_done().exists()
    }

    /// Marks the backfill complete, atomically (the tail starts applying).
    pub fn mark_backfill_done(&self) -> anyhow::Result<()> {
        let done = self.backfill_done();
        let tmp = done.with_extension("done.tmp");
        std::fs::write(&tmp, b"done\n")
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &done).with_context(|| format!("cannot write {}", done.display()))
    }

    pub fn finished(&self) -> PathBuf {
        self.0.join("finished")
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished().exists()
    }

    pub fn postpone(&self) -> PathBuf {
        self.0.join("postpone")
    }

    pub fn control(&self) -> PathBuf {
        self.0.join("control.json")
    }

    // ---- files ----

    pub fn rejects(&self) -> PathBuf {
        self.0.join("rejects.jsonl")
    }

    /// A fleet worker's own rejects (`rekey worker`): one file per worker,
    /// each line tagged with the unit, lease and page it came from.
    pub(crate) fn worker_rejects(&self, worker: &str) -> PathBuf {
        self.0.join(format!("rejects-{worker}.jsonl"))
    }

    /// A fleet worker's own tail rejects (`rekey worker --tail`).
    pub(crate) fn worker_tail_rejects(&self, worker: &str) -> PathBuf {
        self.0.join(format!("tail-rejects-{worker}.jsonl"))
    }

    /// Items `rekey undo` could not compute its undo for.
    pub(crate) fn undo_rejects(&self) -> PathBuf {
        self.0.join("undo-rejects.jsonl")
    }

    pub(crate) fn tail_rejects(&self) -> PathBuf {
        self.0.join("tail-rejects.jsonl")
    }

    /// Target items the reverse tail could not write back to the source.
    pub(crate) fn reverse_rejects(&self) -> PathBuf {
        self.0.join("reverse-rejects.jsonl")
    }

    /// One progress sample a second, of the backfill.
    pub(crate) fn progress_log(&self) -> PathBuf {
        self.0.join("progress.jsonl")
    }

    pub fn claims(&self) -> PathBuf {
        self.0.join("claims.redb")
    }

    pub fn verify_progress_log(&self) -> PathBuf {
        self.verify_store().join("progress.jsonl")
    }

    pub(crate) fn expected_keys(&self) -> PathBuf {
        self.verify_store().join("expected.redb")
    }

    pub fn mismatches(&self) -> PathBuf {
        self.verify_store().join("mismatches.jsonl")
    }

    pub fn in_place_candidates(&self) -> PathBuf {
        self.verify_store().join("in-place-candidates.jsonl")
    }
}

/// A state directory is a path: `display()`, `exists()` and friends work.
impl Deref for StateDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for StateDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
