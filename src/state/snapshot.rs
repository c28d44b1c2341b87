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
use chrono::{DateTime, Utc};
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
    // Past i32::MAX the cast would go negative: a process group, or all of them.
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// Timestamps as RFC 3339 text (`2026-12-02T17:00:00.500Z`).
pub(crate) mod rfc3339 {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

/// Optional timestamps as RFC 3339 text, `null` when absent.
pub(crate) mod rfc3339_opt {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => DateTime::parse_from_rfc3339(&text)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A time as snapshots write it: `2026-12-02T17:00:00.500Z`.
pub fn show_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// What a backfill publishes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackfillStatus {
    pub pid: u32,
    #[serde(with = "rfc3339")]
    pub updated_at: DateTime<Utc>,
    pub done: bool,
    /// Paused (`rekey control --pause`) as the backfill sees it.
    pub paused: bool,
    /// Writes sent and not yet answered: a pause has taken effect once it is 0.
    #[serde(default)]
    pub writes_in_flight: u64,
    /// Stopped by a signal after checkpointing the pages in flight; a rerun resumes.
    #[serde(default)]
    pub stopped: bool,
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
    /// `--via-import`: the objects written so far, then the import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<ImportProgress>,
}

/// Where a `--via-import` backfill is: objects committed, then ImportTable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ImportProgress {
    /// `s3://bucket/prefix/data/`: where the objects are.
    pub objects_at: String,
    /// Objects written and committed (over every run of this migration).
    pub objects: u64,
    /// Set as soon as ImportTable answered; a rerun waits for this import.
    pub import_arn: Option<String>,
    /// DescribeImport's status (`IN_PROGRESS`, `COMPLETED`, …).
    pub status: Option<String>,
    pub processed_items: u64,
    pub processed_bytes: u64,
}

/// What the tail publishes about itself (`<state dir>/tail/status.json`).
/// Readers take missing fields as their defaults, so a reader and a tail of
/// neighbouring versions still understand each other.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TailStatus {
    pub pid: u32,
    #[serde(with = "rfc3339")]
    pub updated_at: DateTime<Utc>,
    /// Every source write made before this instant is applied to the target
    /// (None while the backfill runs and changes are only buffered).
    #[serde(with = "rfc3339_opt")]
    pub applied_through: Option<DateTime<Utc>>,
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
    /// Writes not made because the table written already held them: the
    /// other direction's echoes, or the item already in sync (issue 13).
    #[serde(default)]
    pub in_sync: u64,
    /// Records that were the other direction's writes coming back (not applied).
    #[serde(default)]
    pub echoes: u64,
    /// Writes not made because the table written had changed independently
    /// (both sides wrote the item; see README, "Rolling back").
    #[serde(default)]
    pub conflicts: u64,
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
    pub state: ShardPhase,
    pub last_sequence: Option<String>,
    /// Creation time of the last record applied or buffered.
    #[serde(default, with = "rfc3339_opt")]
    pub last_record_at: Option<DateTime<Utc>>,
    pub lag_seconds: Option<f64>,
    /// The tail's probe marker known to reach this shard
    /// (crate::phase::markers::ProbeKeys): a drain writes it alone for the
    /// shard instead of a K·ln K round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_key: Option<u32>,
}

/// Where a shard is in the tail's reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardPhase {
    /// Not read yet: its parent is still open.
    Waiting,
    #[default]
    Open,
    /// Closed by DynamoDB, still being read.
    Closed,
    /// Closed and read to its end.
    Finished,
}

impl std::fmt::Display for ShardPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShardPhase::Waiting => "waiting",
            ShardPhase::Open => "open",
            ShardPhase::Closed => "closed",
            ShardPhase::Finished => "finished",
        })
    }
}

/// A barrier as the tail publishes it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BarrierState {
    /// When the tail applied its first marker (epoch seconds, the tail's clock).
    pub observed_at: f64,
    /// When every shard had moved past it (crate::phase::barrier).
    pub complete_at: Option<f64>,
    /// When the barrier began (the clock of whoever began it): every write
    /// acknowledged before is applied once it is complete.
    #[serde(default)]
    pub started_at: Option<f64>,
    /// Shards that delivered one of its markers.
    #[serde(default)]
    pub passed: std::collections::BTreeSet<String>,
    /// Shards it still waits for, as of the last publish.
    #[serde(default)]
    pub waiting_on: Vec<String>,
    /// Markers written so far (the next one's number), and when the last
    /// round of them was written.
    #[serde(default)]
    pub markers: u32,
    #[serde(default)]
    pub round_at: Option<f64>,
}

/// Counters committed with each checkpoint.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub scanned: u64,
    pub matched: u64,
    pub missing: u64,
    pub different: u64,
    /// Forward candidates the re-check could not settle.
    pub unconfirmed: u64,
    /// Forward candidates awaiting their re-check.
    pub pending: u64,
    pub rejected: u64,
    /// Rejects that are collisions: another source item owns the target key.
    pub collisions: u64,
    pub skipped: u64,
    /// Not picked by `--sample`.
    pub unsampled: u64,
    /// Candidates (both ways) a re-check showed were transient: counted as matched.
    pub resolved: u64,
    pub target_scanned: u64,
    pub target_matched: u64,
    pub orphans: u64,
    pub unconfirmed_orphans: u64,
    pub pending_orphans: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        macro_rules! add {
            ($($f:ident),*) => {$( self.$f = self.$f.wrapping_add(o.$f); )*};
        }
        add!(
            scanned,
            matched,
            missing,
            different,
            unconfirmed,
            pending,
            rejected,
            collisions,
            skipped,
            unsampled,
            resolved,
            target_scanned,
            target_matched,
            orphans,
            unconfirmed_orphans,
            pending_orphans
        );
    }

    /// Source items found wrong in the target (missing, different, or not settled).
    pub fn mismatched(&self) -> u64 {
        self.missing + self.different + self.unconfirmed
    }

    /// `scanned = matched + mismatched + rejected + skipped` (+ pending, unsampled),
    /// and the same on the target side.
    pub fn accounted(&self) -> bool {
        self.scanned
            == self.matched
                + self.mismatched()
                + self.pending
                + self.rejected
                + self.skipped
                + self.unsampled
            && self.target_scanned
                == self.target_matched
                    + self.orphans
                    + self.unconfirmed_orphans
                    + self.pending_orphans
    }

    pub fn differences(&self) -> u64 {
        self.mismatched() + self.orphans + self.unconfirmed_orphans
    }
}

/// What a finished verify leaves for a later `cutover` gate, in the store
/// (`verify/last`) and as `<state dir>/verify/result.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifyResult {
    pub source_table: String,
    pub target_table: String,
    pub plan_fingerprint: String,
    #[serde(with = "rfc3339")]
    pub started_at: DateTime<Utc>,
    #[serde(with = "rfc3339")]
    pub finished_at: DateTime<Utc>,
    pub clean: bool,
    /// Set for a `--sample` run: only that share of the source was checked, forward only.
    pub sample_percent: Option<f64>,
    /// `rekey verify --reverse`: the source checked against inverse(target),
    /// the evidence a rollback needs.
    #[serde(default)]
    pub reverse: bool,
    pub counts: Counts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gate {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CutoverRecord {
    #[serde(with = "rfc3339")]
    pub at: DateTime<Utc>,
    pub barrier: String,
    pub source_table: String,
    pub target_table: String,
    pub gates: Vec<Gate>,
    #[serde(default, with = "rfc3339_opt")]
    pub finished_at: Option<DateTime<Utc>>,
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
    #[serde(with = "rfc3339")]
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub state_dir: String,
    pub phase: Phase,
    pub drivers: Vec<Driver>,
    pub backfill: Option<BackfillStatus>,
    pub tail: Option<TailStatus>,
    /// The reverse tail (target → source, for a rollback), if one has run.
    pub reverse: Option<TailStatus>,
    pub verify: Option<VerifyResult>,
    pub cutover: Option<CutoverRecord>,
    /// The last rollback (`rekey rollback`), if any.
    pub rollback: Option<CutoverRecord>,
    pub rejects: Rejects,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Rejects {
    pub backfill: u64,
    pub tail: u64,
    pub reverse: u64,
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

/// The phase, from the snapshots (pure).
pub fn phase(
    backfill: Option<&BackfillStatus>,
    backfill_done: bool,
    tail: Option<&TailStatus>,
    verify: Option<&VerifyResult>,
    cutover: Option<&CutoverRecord>,
) -> Phase {
    if let Some(c) = cutover {
        return if c.finished_at.is_some() {
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
        Some(v) if v.clean => Phase::ReadyForCutover,
        _ => Phase::Verifying,
    }
}

pub fn gather(state_dir: &StateDir) -> anyhow::Result<StatusReport> {
    let backfill: Option<BackfillStatus> = read(&state_dir.backfill_snapshot())?;
    let tail: Option<TailStatus> = read(&state_dir.tail_snapshot())?;
    let reverse: Option<TailStatus> = read(&state_dir.reverse_snapshot())?;
    let verify: Option<VerifyResult> = read(&state_dir.verify_snapshot())?;
    let cutover: Option<CutoverRecord> = read(&state_dir.cutover_record())?;
    let rollback: Option<CutoverRecord> = read(&state_dir.rollback_record())?;
    let backfill_done = state_dir.is_backfill_done();
    let mut drivers = Vec::new();
    if let Some(b) = &backfill {
        drivers.push(Driver {
            component: "backfill",
            pid: b.pid,
            running: !b.done && alive(b.pid),
            updated_at: b.updated_at,
        });
    }
    if let Some(t) = &tail {
        drivers.push(Driver {
            component: "tail",
            pid: t.pid,
            running: alive(t.pid),
            updated_at: t.updated_at,
        });
    }
    if let Some(t) = &reverse {
        drivers.push(Driver {
            component: "reverse",
            pid: t.pid,
            running: alive(t.pid),
            updated_at: t.updated_at,
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
            reverse: count_lines(&state_dir.reverse_rejects())?,
        },
        backfill,
        tail,
        reverse,
        verify,
        cutover,
        rollback,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_follows_the_snapshots() {
        let b = BackfillStatus::default();
        let applying = TailStatus {
            applied_through: Some(Utc::now()),
            ..Default::default()
        };
        let buffering = TailStatus::default();
        let verify = |clean| VerifyResult {
            source_table: "a".into(),
            target_table: "b".into(),
            plan_fingerprint: "f".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            clean,
            sample_percent: None,
            reverse: false,
            counts: Counts::default(),
        };
        let (clean, dirty) = (verify(true), verify(false));
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
        let mut record = CutoverRecord {
            at: Utc::now(),
            barrier: "x".into(),
            source_table: "a".into(),
            target_table: "b".into(),
            gates: Vec::new(),
            finished_at: None,
        };
        assert_eq!(phase(None, true, None, None, Some(&record)), Phase::CutOver);
        record.finished_at = Some(Utc::now());
        assert_eq!(
            phase(None, true, None, None, Some(&record)),
            Phase::Finished
        );
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

    /// Snapshots written by the previous version (times as text) still read.
    #[test]
    fn a_tail_status_of_the_previous_version_reads() {
        let text = r#"{"pid":1,"updated_at":"2026-12-02T18:40:02.341Z",
            "applied_through":"2026-12-02T18:40:01.329Z","lag_seconds":0.0,"backfill_done":true,
            "records":2,"buffered":0,"puts":1,"deletes":1,"rejected":0,"barriers":{},
            "shards":[{"shard_id":"s","state":"open","last_sequence":"1",
            "last_record_at":"2026-12-02T18:40:01Z","lag_seconds":0.0}]}"#;
        let t: TailStatus = serde_json::from_str(text).unwrap();
        assert_eq!(show_time(&t.updated_at), "2026-12-02T18:40:02.341Z");
        assert_eq!(t.shards[0].state, ShardPhase::Open);
        let back = serde_json::to_string(&t).unwrap();
        assert!(
            back.contains(r#""applied_through":"2026-12-02T18:40:01.329Z""#),
            "{back}"
        );
    }
}
