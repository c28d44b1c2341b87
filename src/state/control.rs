//! Live control of a running backfill: pause, resume, change the rates —
//! without a restart.
//!
//! The channel is a small JSON file in the plan's state directory,
//! `control.json`, written atomically (temp file + rename) by
//! `rekey control PLAN …` or by hand, and polled once a second by the running
//! process. A file survives the process: a paused migration that is killed
//! and restarted stays paused, which is what an operator who paused it wants.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::aws::rate::Control;
use crate::state::StateDir;
use crate::state::snapshot::{self, BackfillStatus};

pub const FILE: &str = "control.json";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlFile {
    #[serde(default)]
    pub paused: bool,
    /// RCU/s ceiling for reads; absent: as started.
    pub read_rate: Option<f64>,
    /// WCU/s ceiling for writes; absent: as started.
    pub write_rate: Option<f64>,
}

impl ControlFile {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(FILE)
    }

    pub fn read(state_dir: &Path) -> anyhow::Result<ControlFile> {
        let p = Self::path(state_dir);
        match std::fs::read_to_string(&p) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{} is not a valid control file", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ControlFile::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
        }
    }

    pub fn write(&self, state_dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("cannot create {}", state_dir.display()))?;
        let p = Self::path(state_dir);
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &p).with_context(|| format!("cannot write {}", p.display()))
    }

    pub fn watcher(state_dir: &Path) -> Watcher {
        Watcher {
            dir: state_dir.to_path_buf(),
            seen: None,
            applied: None,
        }
    }
}

/// Applies the control file to a run's [`Control`] whenever the file changes.
pub struct Watcher {
    dir: PathBuf,
    seen: Option<SystemTime>,
    applied: Option<ControlFile>,
}

impl Watcher {
    pub async fn apply(&mut self, control: &Control) {
        let modified = std::fs::metadata(ControlFile::path(&self.dir))
            .and_then(|m| m.modified())
            .ok();
        if modified == self.seen && self.applied.is_some() {
            return;
        }
        self.seen = modified;
        // A half-written or invalid file is ignored until it is fixed: never fatal.
        let Ok(file) = ControlFile::read(&self.dir) else {
            return;
        };
        if self.applied.as_ref() == Some(&file) {
            return;
        }
        control.set_paused(file.paused);
        control.set_ceilings(file.read_rate, file.write_rate).await;
        self.applied = Some(file);
    }
}

/// What `rekey control --pause` found after asking for a pause.
#[derive(Debug, Clone, PartialEq)]
pub enum PauseAck {
    /// The running backfill (this pid) published that it is paused with no
    /// write in flight.
    Quiet { pid: u32 },
    /// No backfill runs: one started now starts paused.
    NoBackfill,
    /// The backfill did not say so in time (it still has writes in flight,
    /// or is not publishing).
    TimedOut { pid: u32 },
}

/// Waits until the backfill running in `dir` has taken a pause asked for at
/// `asked_at`: its snapshot, published after that, says paused with no write
/// in flight. Tests and operators wait on this, never on a sleep.
pub async fn wait_for_pause(
    dir: &StateDir,
    asked_at: chrono::DateTime<chrono::Utc>,
    timeout: std::time::Duration,
) -> anyhow::Result<PauseAck> {
    let started = std::time::Instant::now();
    loop {
        let status: Option<BackfillStatus> = snapshot::read(&dir.backfill_snapshot())?;
        let Some(s) = status.filter(|s| !s.done && !s.stopped && snapshot::alive(s.pid)) else {
            return Ok(PauseAck::NoBackfill);
        };
        if s.updated_at > asked_at && s.paused && s.writes_in_flight == 0 {
            return Ok(PauseAck::Quiet { pid: s.pid });
        }
        if started.elapsed() >= timeout {
            return Ok(PauseAck::TimedOut { pid: s.pid });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_written_file_pauses_and_changes_rates() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::new(Some(100.0), Some(200.0));
        let mut w = ControlFile::watcher(dir.path());
        w.apply(&control).await;
        assert!(!control.is_paused());
        ControlFile {
            paused: true,
            read_rate: None,
            write_rate: Some(50.0),
        }
        .write(dir.path())
        .unwrap();
        w.apply(&control).await;
        assert!(control.is_paused());
        assert_eq!(control.write.rate().await, Some(50.0));
        assert_eq!(control.read.rate().await, Some(100.0));
        std::fs::write(ControlFile::path(dir.path()), "{not json").unwrap();
        w.apply(&control).await;
        assert!(control.is_paused(), "a broken file changes nothing");
        assert!(ControlFile::read(dir.path()).is_err());
    }
}
