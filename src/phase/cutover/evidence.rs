//! What the gates look at: what the other processes published in the state
//! directory, or, for a fleet, what its control table holds in place of the
//! local backfill, rejects and verify. Read here, judged in `gates`, so the
//! judgement stays a pure function of it.

use crate::aws::Clients;
use crate::aws::control::ControlTable;
use crate::phase::tail::Flow;
use crate::state::StateDir;
use crate::state::fleet::shard::{self as shard_state, ShardUnit};
use crate::state::fleet::{Counters, Fleet, FleetRef};
use crate::state::snapshot::{self, BackfillStatus, CutoverRecord, TailStatus, VerifyResult};

/// What the control table says of a fleet's backfill and verify.
#[derive(Debug, Clone, Default)]
pub struct FleetEvidence {
    pub at: String,
    pub totals: Counters,
    /// `--from-export`: the export the backfill read and the time of its
    /// data (`export ID at LOCATION, data as of TIME`); None: a Scan.
    pub export: Option<String>,
    /// The fleet verify started before the backfill was done: it proves nothing.
    pub verify_before_done: bool,
    /// The fleet's own tail (`rekey worker --tail`), when its workers have
    /// created the stream's shard units: the tail gate reads it.
    pub tail: Option<FleetTail>,
}

/// The fleet's tail, from its shards' units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetTail {
    /// Shards not done.
    pub open: usize,
    /// Of those, held by no worker.
    pub unheld: usize,
    /// Of those, not applying as they read yet (buffering until the
    /// backfill or the parent shard is done).
    pub buffering: usize,
    /// How far behind the stream the slowest live shard's holder is, in
    /// seconds (its newest record applied against this machine's clock,
    /// unless its last empty read came after it): a gate, not a proof — the
    /// drain barrier is the proof.
    pub lag: Option<f64>,
}

impl FleetTail {
    /// None when no worker has created the stream's shard units.
    pub fn of(shards: &[ShardUnit], now: f64) -> Option<FleetTail> {
        if shards.is_empty() {
            return None;
        }
        let open: Vec<&ShardUnit> = shards.iter().filter(|s| !s.cp.done).collect();
        Some(FleetTail {
            open: open.len(),
            unheld: open.iter().filter(|s| s.owner.is_none()).count(),
            buffering: open.iter().filter(|s| !s.cp.live).count(),
            lag: shard_state::fleet_through(shards, now).0,
        })
    }
}

/// What the gates look at, read from the state directory.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// Forward: a cutover's evidence; Reverse: a rollback's (the reverse
    /// tail's status, its rejects, and whether a cutover is recorded).
    pub flow: Flow,
    pub cut_over: bool,
    /// When the cutover being rolled back was recorded.
    pub cut_over_at: Option<chrono::DateTime<chrono::Utc>>,
    pub backfill_done: bool,
    pub backfill: Option<BackfillStatus>,
    pub tail: Option<TailStatus>,
    pub tail_running: bool,
    pub verify: Option<VerifyResult>,
    pub rejects: u64,
    /// A fleet's (`--state dynamodb://…`): backfill, rejects and verify from
    /// the control table.
    pub fleet: Option<FleetEvidence>,
}

impl Evidence {
    pub fn read(state_dir: &StateDir) -> anyhow::Result<Evidence> {
        Evidence::read_for(state_dir, Flow::Forward)
    }

    pub fn read_for(state_dir: &StateDir, flow: Flow) -> anyhow::Result<Evidence> {
        let tail: Option<TailStatus> = snapshot::read(&flow.snapshot(state_dir))?;
        let rejects = match flow {
            Flow::Forward => {
                snapshot::count_lines(&state_dir.rejects())?
                    + snapshot::count_lines(&state_dir.tail_rejects())?
            }
            Flow::Reverse => snapshot::count_lines(&state_dir.reverse_rejects())?,
        };
        let cutover: Option<CutoverRecord> = snapshot::read(&state_dir.cutover_record())?;
        Ok(Evidence {
            flow,
            cut_over: cutover.as_ref().is_some_and(|c| c.finished_at.is_none()),
            cut_over_at: cutover.as_ref().map(|c| c.at),
            backfill_done: state_dir.is_backfill_done(),
            backfill: snapshot::read(&state_dir.backfill_snapshot())?,
            tail_running: tail.as_ref().is_some_and(|t| snapshot::alive(t.pid)),
            tail,
            verify: snapshot::read(&state_dir.verify_snapshot())?,
            rejects,
            fleet: None,
        })
    }

    /// This machine's evidence (the tail, its rejects, the cutover record)
    /// with the fleet's backfill, rejects and verify in place of the local
    /// ones: "backfill done" from `META`, the rejects summed over the units'
    /// counters (the workers' files are on their machines), the verify
    /// from `VERIFY` — counted only if it started after the backfill was done.
    pub async fn read_fleet(
        clients: &Clients,
        state_dir: &StateDir,
        at: &FleetRef,
    ) -> anyhow::Result<Evidence> {
        let mut e = Evidence::read(state_dir)?;
        let backfill = Fleet::open(clients, at, "cutover").read().await?;
        let verdict = Fleet::verify(ControlTable::new(clients, &at.table), at.clone(), "cutover")
            .verify_verdict()
            .await?;
        let done_ms = backfill.meta.as_ref().and_then(|m| m.done_ms);
        let totals = backfill.totals();
        e.backfill_done = done_ms.is_some();
        e.backfill = None;
        // The fleet's tail counts its rejects in the shards' items.
        let tail_rejected: u64 = backfill.shards.iter().map(|s| s.rejected).sum();
        e.rejects =
            totals.rejected + tail_rejected + snapshot::count_lines(&state_dir.tail_rejects())?;
        let finished = verdict.as_ref().and_then(|v| {
            let ms = |t: i64| chrono::DateTime::from_timestamp_millis(t).unwrap_or_default();
            Some(VerifyResult {
                source_table: String::new(),
                target_table: String::new(),
                plan_fingerprint: String::new(),
                started_at: ms(v.started_ms),
                finished_at: ms(v.finished_ms?),
                clean: v.clean?,
                sample_percent: None,
                reverse: false,
                counts: v.counts?,
            })
        });
        let before = |v: &VerifyResult| done_ms.is_none_or(|d| v.started_at.timestamp_millis() < d);
        let export = backfill.meta.as_ref().and_then(|m| m.export.as_ref());
        e.fleet = Some(FleetEvidence {
            at: at.display(),
            totals,
            export: export.map(|x| {
                let time = chrono::DateTime::from_timestamp_millis(x.export_time_ms)
                    .map_or_else(|| x.export_time_ms.to_string(), |t| snapshot::show_time(&t));
                format!("{}, data as of {time}", x.describe())
            }),
            verify_before_done: finished.as_ref().is_some_and(before),
            tail: FleetTail::of(&backfill.shards, crate::aws::streams::now_secs()),
        });
        e.verify = finished;
        Ok(e)
    }
}
