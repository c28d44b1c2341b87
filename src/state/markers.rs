//! Marker rounds in flight (crate::phase::markers). A round is recorded here
//! before its first marker is written and forgotten once its last is
//! deleted, so that a round cut short — kill -9, or a stop that dropped it
//! mid-way — is found by the next round written from this state directory
//! and swept, instead of leaving a `__rekey__#barrier#…` item in the
//! application's table for good.
//!
//! A round belongs to a live writer while its process is alive and, within
//! this process, while its [`Flight`] is held: only rounds of neither are
//! abandoned.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::state::snapshot;

/// One round: markers `from..from + n` of barrier `id` in `table`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub table: String,
    pub id: String,
    pub from: u32,
    pub n: u32,
    pub pid: u32,
}

/// The rounds in flight, one file each, under `<state dir>/markers`.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
}

/// A round being written by this process. Dropped without [`Flight::done`]
/// (a stop cancelled it, or it failed), its round is abandoned.
pub(crate) struct Flight {
    path: PathBuf,
}

/// This process's rounds in flight, by file.
fn in_flight() -> &'static Mutex<HashSet<PathBuf>> {
    static LIVE: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

impl Ledger {
    pub fn new(dir: impl Into<PathBuf>) -> Ledger {
        Ledger { dir: dir.into() }
    }

    /// Records `round` before its first marker is written.
    pub(crate) fn begin(&self, round: &Round) -> anyhow::Result<Flight> {
        // Unique per round: the tails' probes reuse one id and its keys
        // (crate::phase::markers::PROBE_KEYS), and one process may run two
        // tails, so neither the id nor the range names a round.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!(
            "{}-{}-{}-{seq}.json",
            round.id,
            round.from,
            std::process::id()
        ));
        in_flight()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.clone());
        snapshot::publish(&path, round)?;
        Ok(Flight { path })
    }

    /// Rounds in `table` that no live writer holds.
    pub fn abandoned(&self, table: &str) -> anyhow::Result<Vec<(PathBuf, Round)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.dir.display())),
        };
        let mine = std::process::id();
        let live = in_flight()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Some(round) = snapshot::read::<Round>(&path)? else {
                continue;
            };
            let held = if round.pid == mine {
                live.contains(&path)
            } else {
                snapshot::alive(round.pid)
            };
            if round.table == table && !held {
                out.push((path, round));
            }
        }
        Ok(out)
    }

    /// Forgets a round whose every marker is gone.
    pub fn forget(path: &Path) -> anyhow::Result<()> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
        }
    }
}

impl Flight {
    /// The round's markers are all deleted.
    pub fn done(self) -> anyhow::Result<()> {
        Ledger::forget(&self.path)
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        in_flight()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(table: &str, id: &str, pid: u32) -> Round {
        Round {
            table: table.into(),
            id: id.into(),
            from: 0,
            n: 3,
            pid,
        }
    }

    #[test]
    fn a_round_is_abandoned_once_dropped_undone_or_its_process_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        let held = ledger.begin(&round("t", "a", std::process::id())).unwrap();
        let cut = ledger.begin(&round("t", "b", std::process::id())).unwrap();
        let finished = ledger.begin(&round("t", "c", std::process::id())).unwrap();
        let _other_table = ledger.begin(&round("u", "d", std::process::id())).unwrap();
        // A process that is gone: no pid is ever i32::MAX (Linux's pid_max is 2^22).
        let gone = i32::MAX as u32;
        snapshot::publish(&dir.path().join("e-0.json"), &round("t", "e", gone)).unwrap();
        drop(cut);
        finished.done().unwrap();
        let mut ids: Vec<String> = ledger
            .abandoned("t")
            .unwrap()
            .into_iter()
            .map(|(_, r)| r.id)
            .collect();
        ids.sort();
        assert_eq!(ids, ["b", "e"]);
        drop(held);
        assert_eq!(ledger.abandoned("t").unwrap().len(), 3);
        assert!(
            Ledger::new(dir.path().join("none"))
                .abandoned("t")
                .unwrap()
                .is_empty()
        );
    }
}
