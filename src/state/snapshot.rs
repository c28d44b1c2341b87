//! Status snapshots: how the processes of one migration see each other.
//!
//! Each long-running command owns a sled store that only one process can open
//! at a time (that lock is what makes "one driver per plan" true). So that
//! `rekey status`, `drain`, `verify` and `cutover` can read a migration while
//! another process drives it, each driver also publishes a small JSON snapshot
//! in the state directory, replaced atomically (write, then rename) about once
//! a second: `backfill.json`, `tail/status.json`, `verify/result.json`,
//! `cutover.json`. Readers never take a lock and never see half a file.
//!
//! `rekey status` gathers them into one report with the migration's phase.

use std::collections::BTreeMap;
use std::path::Path;

use crate::state::StateDir;

use anyhow::Context as _;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Replace `path` with `value` as JSON, atomically.
pub fn publish<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// A published snapshot, or None if its process never ran.
pub fn read<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{} is corrupt", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Whether a process with this id is alive (on this machine).
pub fn alive(pid: u32) -> bool {
    // Signal 0 checks existence and permission without delivering anything.
    pid != 0 && unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
}

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// What a backfill publishes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackfillStatus {
    pub pid: u32,
    pub updated_at: String,
    pub done: bool,
    pub paused: bool,
    /// The source's approximate item count (DescribeTable), for progress.
    pub expected_items: u64,
    pub scanned: u64,
    pub written: u64,
    pub rejected: u64,
    pub skipped: u64,
    pub collisions: u64,
    pub rcu_per_sec: f64,
    pub wcu_per_sec: f64,
    pub write_limit: f64,
    pub throttles: u64,
}

/// What the tail publishes about itself (`<state dir>/tail/status.json`).
/// Readers take missing fields as their defaults, so a reader and a tail of
/// neighbouring versions still understand each other.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TailStatus {
    pub pid: u32,
    pub updated_at: String,
    /// Every source write made before this instant is applied to the target
    /// (None while the backfill runs and changes are only buffered).
    pub applied_through: Option<String>,
    /// The largest shard lag: age of the oldest change not yet applied.
    pub lag_seconds: Option<f64>,
    pub backfill_done: bool,
    pub records: u64,
    pub buffered: u64,
    pub puts: u64,
    pub deletes: u64,
    /// In place: conditional UpdateItems written.
    #[serde(default)]
    pub updates: u64,
    pub rejected: u64,
    pub shards: Vec<ShardStatus>,
    pub barriers: BTreeMap<String, BarrierState>,
    /// The tail exited cleanly (idle, or `rekey finish`): nothing is applied
    /// any more, and readers treat it as not running rather than behind.
    #[serde(default)]
    pub stopped: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ShardStatus {
    pub shard_id: String,
    /// waiting (for its parent), open, closed (still being read) or finished.
    pub state: String,
    pub last_sequence: Option<String>,
    /// Creation time of the last record applied or buffered (RFC 3339).
    pub last_record_at: Option<String>,
    pub lag_seconds: Option<f64>,
}

/// A barrier as the tail publishes it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BarrierState {
    /// When the tail applied the marker (epoch seconds, the tail's clock).
    pub observed_at: f64,
    /// When every other open shard had been read to its end after that.
    pub complete_at: Option<f64>,
}

/// The migration's phase, from what its processes have published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    NotStarted,
    Backfilling,
    CatchingUp,
    Verifying,
    ReadyForCutover,
    CutOver,
    Finished,
}

#[derive(Debug, Clone, Serialize)]
pub struct Driver {
    pub component: &'static str,
    pub pid: u32,
    pub running: bool,
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub state_dir: String,
    pub phase: Phase,
    pub drivers: Vec<Driver>,
    pub backfill: Option<BackfillStatus>,
    pub tail: Option<TailStatus>,
    pub verify: Option<serde_json::Value>,
    pub cutover: Option<serde_json::Value>,
    pub rejects: Rejects,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Rejects {
    pub backfill: u64,
    pub tail: u64,
}

/// Lines in a rejects file (0 if there is none).
pub fn count_lines(path: &Path) -> anyhow::Result<u64> {
    use std::io::BufRead as _;
    match std::fs::File::open(path) {
        Ok(f) => {
            let mut n = 0;
            for line in std::io::BufReader::new(f).lines() {
                line.with_context(|| format!("cannot read {}", path.display()))?;
                n += 1;
            }
            Ok(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Whether a verify summary says the run finished clean.
pub fn verify_clean(v: &serde_json::Value) -> bool {
    v.get("clean").and_then(|c| c.as_bool()) == Some(true)
}

/// The phase, from the snapshots (pure).
pub fn phase(
    backfill: Option<&BackfillStatus>,
    backfill_done: bool,
    tail: Option<&TailStatus>,
    verify: Option<&serde_json::Value>,
    cutover: Option<&serde_json::Value>,
) -> Phase {
    if let Some(c) = cutover {
        return if c.get("finished_at").is_some_and(|f| !f.is_null()) {
            Phase::Finished
        } else {
            Phase::CutOver
        };
    }
    if !backfill_done {
        return if backfill.is_some() {
            Phase::Backfilling
        } else {
            Phase::NotStarted
        };
    }
    let tail_applying = tail.is_some_and(|t| t.applied_through.is_some());
    if !tail_applying {
        return Phase::CatchingUp;
    }
    match verify {
        Some(v) if verify_clean(v) => Phase::ReadyForCutover,
        _ => Phase::Verifying,
    }
}

pub fn gather(state_dir: &StateDir) -> anyhow::Result<StatusReport> {
    let backfill: Option<BackfillStatus> = read(&state_dir.backfill_snapshot())?;
    let tail: Option<TailStatus> = read(&state_dir.tail_snapshot())?;
    let verify: Option<serde_json::Value> = read(&state_dir.verify_snapshot())?;
    let cutover: Option<serde_json::Value> = read(&state_dir.cutover_record())?;
    let backfill_done = state_dir.is_backfill_done();
    let mut drivers = Vec::new();
    if let Some(b) = &backfill {
        drivers.push(Driver {
            component: "backfill",
            pid: b.pid,
            running: !b.done && alive(b.pid),
            updated_at: b.updated_at.clone(),
        });
    }
    if let Some(t) = &tail {
        drivers.push(Driver {
            component: "tail",
            pid: t.pid,
            running: alive(t.pid),
            updated_at: t.updated_at.clone(),
        });
    }
    Ok(StatusReport {
        state_dir: state_dir.display().to_string(),
        phase: phase(
            backfill.as_ref(),
            backfill_done,
            tail.as_ref(),
            verify.as_ref(),
            cutover.as_ref(),
        ),
        drivers,
        rejects: Rejects {
            backfill: count_lines(&state_dir.rejects())?,
            tail: count_lines(&state_dir.tail_rejects())?,
        },
        backfill,
        tail,
        verify,
        cutover,
    })
}

/// The report as an operator reads it.
pub fn render(r: &StatusReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "state     {}", r.state_dir);
    let _ = writeln!(out, "phase     {:?}", r.phase);
    for d in &r.drivers {
        let _ = writeln!(
            out,
            "driver    {} pid {} {} (last update {})",
            d.component,
            d.pid,
            if d.running { "running" } else { "not running" },
            d.updated_at
        );
    }
    if let Some(b) = &r.backfill {
        let pct = if b.expected_items > 0 {
            format!(
                " ({:.0}% of ~{})",
                100.0 * b.scanned as f64 / b.expected_items as f64,
                b.expected_items
            )
        } else {
            String::new()
        };
        let rates = if b.done {
            String::new()
        } else {
            format!(
                "; {:.0} RCU/s, {:.0} WCU/s (limit {:.0}), throttles {}{}",
                b.rcu_per_sec,
                b.wcu_per_sec,
                b.write_limit,
                b.throttles,
                if b.paused { ", PAUSED" } else { "" }
            )
        };
        let _ = writeln!(
            out,
            "backfill  {}{pct}: scanned {}, written {}, rejected {}, skipped {}, collisions {}{rates}",
            if b.done { "done" } else { "running" },
            b.scanned,
            b.written,
            b.rejected,
            b.skipped,
            b.collisions,
        );
    }
    match &r.tail {
        Some(t) => {
            let _ = writeln!(
                out,
                "tail      {} records ({} buffered): {} puts, {} deletes, {} rejected; lag {}; applied through {}",
                t.records,
                t.buffered,
                t.puts,
                t.deletes,
                t.rejected,
                t.lag_seconds
                    .map_or("unknown".to_string(), |l| format!("{l:.1} s")),
                t.applied_through.as_deref().unwrap_or("(not applying yet)")
            );
            for s in &t.shards {
                let _ = writeln!(
                    out,
                    "          {} {} lag {}",
                    s.shard_id,
                    s.state,
                    s.lag_seconds
                        .map_or("unknown".to_string(), |l| format!("{l:.1} s"))
                );
            }
        }
        None => {
            let _ = writeln!(out, "tail      never ran");
        }
    }
    match &r.verify {
        Some(v) => {
            let _ = writeln!(out, "verify    {v}");
        }
        None => {
            let _ = writeln!(out, "verify    never finished");
        }
    }
    let _ = writeln!(
        out,
        "rejects   {} from the backfill, {} from the tail",
        r.rejects.backfill, r.rejects.tail
    );
    if let Some(c) = &r.cutover {
        let _ = writeln!(out, "cutover   {c}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use TailStatus;

    #[test]
    fn the_phase_follows_the_snapshots() {
        let b = BackfillStatus::default();
        let applying = TailStatus {
            applied_through: Some("2026-12-02T00:00:00Z".into()),
            ..Default::default()
        };
        let buffering = TailStatus::default();
        let clean = serde_json::json!({"clean": true});
        let dirty = serde_json::json!({"clean": false});
        assert_eq!(phase(None, false, None, None, None), Phase::NotStarted);
        assert_eq!(
            phase(Some(&b), false, Some(&buffering), None, None),
            Phase::Backfilling
        );
        assert_eq!(
            phase(Some(&b), true, Some(&buffering), None, None),
            Phase::CatchingUp
        );
        assert_eq!(
            phase(Some(&b), true, Some(&applying), None, None),
            Phase::Verifying
        );
        assert_eq!(
            phase(Some(&b), true, Some(&applying), Some(&dirty), None),
            Phase::Verifying
        );
        assert_eq!(
            phase(Some(&b), true, Some(&applying), Some(&clean), None),
            Phase::ReadyForCutover
        );
        let cut = serde_json::json!({"at": "x", "finished_at": null});
        assert_eq!(phase(None, true, None, None, Some(&cut)), Phase::CutOver);
        let done = serde_json::json!({"at": "x", "finished_at": "y"});
        assert_eq!(phase(None, true, None, None, Some(&done)), Phase::Finished);
    }

    #[test]
    fn snapshots_round_trip_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub").join("x.json");
        assert!(read::<BackfillStatus>(&p).unwrap().is_none());
        let b = BackfillStatus {
            written: 7,
            ..Default::default()
        };
        publish(&p, &b).unwrap();
        assert_eq!(read::<BackfillStatus>(&p).unwrap().unwrap().written, 7);
        assert!(alive(std::process::id()));
    }
}
