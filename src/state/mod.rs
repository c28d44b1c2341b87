//! Local progress state: the one module that owns sled.
//!
//! One state directory per plan (default `.rekey/<plan file stem>/`), readable
//! by its owner only. It holds the plan's fingerprint — a resume under a
//! changed plan is refused — and every checkpoint. A checkpoint and the
//! counters it covers are written in one atomic batch and flushed to disk
//! before the next page is read, so after kill -9 a rerun repeats at most the
//! pages that were in flight.
//!
//! sled takes an exclusive file lock: a second process driving the same plan
//! gets [`StateError::Locked`] instead of corrupting the first one's progress.

pub(crate) mod claims;
pub(crate) mod control;
pub(crate) mod dir;
pub(crate) mod echoes;
pub mod fleet;
pub(crate) mod itemfile;
pub mod markers;
pub(crate) mod rejects;
pub(crate) mod snapshot;
pub(crate) mod spill;

pub use dir::StateDir;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::core::plan::Plan;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "the plan changed since this migration started (fingerprint {stored}, now {current}); \
         resuming would mix two plans' items. Restore the plan, or start over with a new --state-dir"
    )]
    PlanChanged { stored: String, current: String },
    #[error("another rekey process is driving this plan (state directory {dir} is locked{owner})")]
    Locked { dir: PathBuf, owner: String },
    #[error("state directory {dir}: {detail}")]
    Store { dir: PathBuf, detail: String },
}

/// A backfill's counters, committed with each checkpoint: in the sled store
/// on one machine, in a unit's item of the control table for a fleet.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counters {
    pub scanned: u64,
    pub written: u64,
    pub rejected: u64,
    pub skipped: u64,
    /// Rejects that were collisions: another source item holds the target key.
    pub collisions: u64,
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.scanned += o.scanned;
        self.written += o.written;
        self.rejected += o.rejected;
        self.skipped += o.skipped;
        self.collisions += o.collisions;
    }
}

/// sled's page cache. The store holds checkpoints and counters — a few keys
/// per segment or export file — so a small cache is plenty.
const CACHE_BYTES: u64 = 8 * 1024 * 1024;

pub struct StateStore {
    db: sled::Db,
    dir: PathBuf,
}

/// ", by pid N: rekey …" from the owner file the lock holder wrote, if any.
fn owner_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("owner"))
        .map(|t| format!(", by {}", t.trim()))
        .unwrap_or_default()
}

/// sled's lock is a file lock held until every handle of a closed store is
/// gone, and its flusher thread lets go of its handle only at its next tick
/// (at most 500 ms). So a store this very process just closed can look
/// locked for a moment: only then (the owner file names this process) is
/// the open tried again, for up to 2 s. Another process's lock is answered
/// at once.
fn open_sled(dir: &Path) -> Result<sled::Db, StateError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match try_open_sled(dir) {
            Err(StateError::Locked { owner, .. })
                if owner.contains(&format!("pid {}:", std::process::id()))
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn try_open_sled(dir: &Path) -> Result<sled::Db, StateError> {
    // sled caches up to 1 GiB by default. Nothing per item lives here (the
    // claim index is in claims.rs, on redb), so the cache stays small.
    sled::Config::new()
        .path(dir.join("db"))
        .cache_capacity(CACHE_BYTES)
        .open()
        .map_err(|e| {
            let text = e.to_string();
            if text.contains("lock")
                || text.contains("WouldBlock")
                || text.contains("temporarily unavailable")
            {
                StateError::Locked {
                    dir: dir.to_path_buf(),
                    owner: owner_of(dir),
                }
            } else {
                StateError::Store {
                    dir: dir.to_path_buf(),
                    detail: text,
                }
            }
        })
}

impl StateStore {
    pub fn open(dir: &Path, plan: &Plan) -> Result<StateStore, StateError> {
        let store_err = |detail: String| StateError::Store {
            dir: dir.to_path_buf(),
            detail,
        };
        std::fs::create_dir_all(dir).map_err(|e| store_err(format!("cannot create: {e}")))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| store_err(format!("cannot restrict permissions: {e}")))?;
        }
        let db = open_sled(dir)?;
        let store = StateStore {
            db,
            dir: dir.to_path_buf(),
        };
        // Who holds the lock, for the error a second process gets.
        let me: Vec<String> = std::env::args().collect();
        let _ = std::fs::write(
            dir.join("owner"),
            format!("pid {}: {}\n", std::process::id(), me.join(" ")),
        );
        match store.get::<String>("meta/fingerprint")? {
            Some(stored) if stored != plan.fingerprint => {
                return Err(StateError::PlanChanged {
                    stored,
                    current: plan.fingerprint.clone(),
                });
            }
            Some(_) => {}
            None => {
                store.put("meta/fingerprint", &plan.fingerprint)?;
                store.put("meta/plan", &plan.path.display().to_string())?;
                store.flush()?;
            }
        }
        Ok(store)
    }

    fn err(&self, e: impl std::fmt::Display) -> StateError {
        StateError::Store {
            dir: self.dir.clone(),
            detail: e.to_string(),
        }
    }

    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StateError> {
        match self.db.get(key).map_err(|e| self.err(e))? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| self.err(format!("`{key}` is corrupt: {e}"))),
        }
    }

    pub fn put<T: Serialize + ?Sized>(&self, key: &str, value: &T) -> Result<(), StateError> {
        let bytes = serde_json::to_vec(value).map_err(|e| self.err(e))?;
        self.db.insert(key, bytes).map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn remove(&self, key: &str) -> Result<(), StateError> {
        self.db.remove(key).map(|_| ()).map_err(|e| self.err(e))
    }

    /// Write several keys atomically: all or none survive a crash.
    pub(crate) fn put_batch(
        &self,
        entries: &[(&str, serde_json::Value)],
    ) -> Result<(), StateError> {
        let mut batch = sled::Batch::default();
        for (k, v) in entries {
            batch.insert(
                k.as_bytes(),
                serde_json::to_vec(v).map_err(|e| self.err(e))?,
            );
        }
        self.db.apply_batch(batch).map_err(|e| self.err(e))
    }

    /// Make everything written so far durable.
    pub fn flush(&self) -> Result<(), StateError> {
        self.db.flush().map(|_| ()).map_err(|e| self.err(e))
    }

    /// The first `limit` keys under `prefix`, in key order, with their values.
    pub(crate) fn scan_prefix_limit<T: DeserializeOwned>(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(String, T)>, StateError> {
        let mut out = Vec::new();
        for kv in self.db.scan_prefix(prefix).take(limit) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let val = serde_json::from_slice(&v)
                .map_err(|e| self.err(format!("`{key}` is corrupt: {e}")))?;
            out.push((key, val));
        }
        Ok(out)
    }

    /// Every key under `prefix`, with its value.
    pub(crate) fn scan_prefix<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, StateError> {
        self.scan_prefix_limit(prefix, usize::MAX)
    }
}

/// Several writes and removals applied together: all or none survive a crash.
#[derive(Default)]
pub struct StoreBatch {
    batch: sled::Batch,
}

impl StoreBatch {
    pub fn put<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> serde_json::Result<()> {
        self.batch
            .insert(key.as_bytes(), serde_json::to_vec(value)?);
        Ok(())
    }

    pub fn remove(&mut self, key: &str) {
        self.batch.remove(key.as_bytes());
    }
}

impl StateStore {
    /// Apply a [`StoreBatch`] atomically (not yet flushed).
    pub fn apply(&self, batch: StoreBatch) -> Result<(), StateError> {
        self.db.apply_batch(batch.batch).map_err(|e| self.err(e))
    }

    pub fn contains(&self, key: &str) -> Result<bool, StateError> {
        self.db.contains_key(key).map_err(|e| self.err(e))
    }

    /// Keys under `prefix` with their values, in ascending key order, streamed
    /// from disk (for sets larger than memory).
    pub(crate) fn iter_prefix<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> impl Iterator<Item = Result<(String, T), StateError>> + '_ {
        self.db.scan_prefix(prefix).map(move |kv| {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let val = serde_json::from_slice(&v)
                .map_err(|e| self.err(format!("`{key}` is corrupt: {e}")))?;
            Ok((key, val))
        })
    }

    /// Up to `limit` keys under `prefix` that sort after `after`, with their
    /// values: for walking a large set a chunk at a time without holding it.
    pub(crate) fn chunk_after<T: DeserializeOwned>(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, T)>, StateError> {
        use std::ops::Bound;
        let range = (
            Bound::Excluded(after.as_bytes().to_vec()),
            Bound::Unbounded::<Vec<u8>>,
        );
        let mut out = Vec::new();
        for kv in self.db.range(range) {
            let (k, v) = kv.map_err(|e| self.err(e))?;
            if !k.starts_with(prefix.as_bytes()) || out.len() >= limit {
                break;
            }
            let key = String::from_utf8_lossy(&k).into_owned();
            let val = serde_json::from_slice(&v)
                .map_err(|e| self.err(format!("`{key}` is corrupt: {e}")))?;
            out.push((key, val));
        }
        Ok(out)
    }

    /// Remove every key under `prefix`; returns how many.
    pub(crate) fn remove_prefix(&self, prefix: &str) -> Result<u64, StateError> {
        let mut n = 0;
        let mut batch = sled::Batch::default();
        for kv in self.db.scan_prefix(prefix).keys() {
            batch.remove(kv.map_err(|e| self.err(e))?);
            n += 1;
            if n % 10_000 == 0 {
                self.db
                    .apply_batch(std::mem::take(&mut batch))
                    .map_err(|e| self.err(e))?;
            }
        }
        self.db.apply_batch(batch).map_err(|e| self.err(e))?;
        Ok(n)
    }
}

/// Where a backfill (or an undo) is, kept in its store for resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BackfillStage {
    Backfilling,
    BackfillDone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(extra: &str) -> Plan {
        let text = format!(
            "[source]\ntable = \"a\"\npartition_key = \"PK\"\n[target]\ntable = \"b\"\npartition_key = \"PK\"\n[[rule]]\n{extra}"
        );
        Plan::parse(&text, Path::new("p.toml")).unwrap()
    }

    #[test]
    fn checkpoints_survive_reopen_and_a_changed_plan_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = plan("name = \"x\"");
        {
            let s = StateStore::open(dir.path(), &p).unwrap();
            s.put_batch(&[
                ("seg/0", serde_json::json!({"after": 1})),
                ("counters", serde_json::json!(5)),
            ])
            .unwrap();
            s.flush().unwrap();
        }
        let s = StateStore::open(dir.path(), &p).unwrap();
        assert_eq!(
            s.get::<serde_json::Value>("seg/0").unwrap(),
            Some(serde_json::json!({"after": 1}))
        );
        assert_eq!(s.scan_prefix::<serde_json::Value>("seg/").unwrap().len(), 1);
        drop(s);
        let other = plan("name = \"y\"");
        let e = StateStore::open(dir.path(), &other).err().unwrap();
        assert!(matches!(e, StateError::PlanChanged { .. }), "{e}");
        assert!(e.to_string().contains("the plan changed"));
    }

    #[test]
    fn a_second_opener_is_told_the_plan_is_being_driven() {
        let dir = tempfile::tempdir().unwrap();
        let p = plan("name = \"x\"");
        let _first = StateStore::open(dir.path(), &p).unwrap();
        // sled's lock is per process on some platforms; a child process is the honest test,
        // made in tests/backfill.rs. Here: the directory is owner-only.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }
}
