//! One reading of everything the metrics show, taken when a scrape comes
//! (or an EMF line is due): the snapshots the phases publish in the state
//! directory — the same files `rekey status` reads, so a scrape and the
//! status never disagree — and what the feed saw ([`super::feed`]).

use crate::state::StateDir;
use crate::state::snapshot::{
    self, BackfillStatus, Counts, CutoverRecord, Phase, ShardPhase, TailStatus, VerifyResult,
};

use super::feed::{self, Fed};

/// Every phase, in the order of a migration: the `phase` label's values.
pub(crate) const PHASES: [Phase; 7] = [
    Phase::NotStarted,
    Phase::Backfilling,
    Phase::CatchingUp,
    Phase::Verifying,
    Phase::ReadyForCutover,
    Phase::CutOver,
    Phase::Finished,
];

pub(crate) fn phase_label(p: Phase) -> &'static str {
    match p {
        Phase::NotStarted => "not_started",
        Phase::Backfilling => "backfill",
        Phase::CatchingUp => "catch_up",
        Phase::Verifying => "verify",
        Phase::ReadyForCutover => "ready_for_cutover",
        Phase::CutOver => "cut_over",
        Phase::Finished => "finished",
    }
}

/// A tail's direction: `forward` (`rekey tail`), `reverse` (`rekey reverse`).
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    pub(crate) direction: &'static str,
    pub(crate) status: TailStatus,
}

impl Tail {
    /// The lag of each open shard: the leaves of the stream's lineage (a
    /// closed shard has, or will have, children), so the label's values stay
    /// as few as the stream's open shards.
    pub(crate) fn leaf_lags(&self) -> impl Iterator<Item = (&str, f64)> {
        self.status
            .shards
            .iter()
            .filter(|s| s.state == ShardPhase::Open)
            .filter_map(|s| Some((s.shard_id.as_str(), s.lag_seconds?)))
    }
}

/// One reading.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    /// The migration's phase, for a command with a local state directory.
    pub(crate) phase: Option<Phase>,
    pub(crate) backfill: Option<BackfillStatus>,
    pub(crate) tails: Vec<Tail>,
    /// Verify's counts: the finished result's, else the running verify's.
    pub(crate) verify: Option<Counts>,
    /// Whether the last finished verify was clean.
    pub(crate) verify_clean: Option<bool>,
    pub(crate) fed: Fed,
}

impl Sample {
    /// Reads the snapshots in `dir` (none for a fleet's commands, whose
    /// state is the control table) and the feed.
    pub(crate) fn take(dir: Option<&StateDir>) -> anyhow::Result<Sample> {
        let fed = feed::read();
        let Some(dir) = dir else {
            return Ok(Sample {
                verify: fed.verify.map(|(c, _)| c),
                fed,
                ..Sample::default()
            });
        };
        let backfill: Option<BackfillStatus> = snapshot::read(&dir.backfill_snapshot())?;
        let forward: Option<TailStatus> = snapshot::read(&dir.tail_snapshot())?;
        let reverse: Option<TailStatus> = snapshot::read(&dir.reverse_snapshot())?;
        let result: Option<VerifyResult> = snapshot::read(&dir.verify_snapshot())?;
        let cutover: Option<CutoverRecord> = snapshot::read(&dir.cutover_record())?;
        let phase = snapshot::phase(
            backfill.as_ref(),
            dir.is_backfill_done(),
            forward.as_ref(),
            result.as_ref(),
            cutover.as_ref(),
        );
        let tails = [("forward", forward), ("reverse", reverse)]
            .into_iter()
            .filter_map(|(direction, t)| {
                Some(Tail {
                    direction,
                    status: t?,
                })
            })
            .collect();
        // A verify running now reports through the feed once a second; a
        // finished one's result is exact, and stays.
        let verify = match (fed.verify, &result) {
            (Some((counts, at)), Some(r)) if at > r.finished_at => Some(counts),
            (_, Some(r)) => Some(r.counts),
            (live, None) => live.map(|(c, _)| c),
        };
        Ok(Sample {
            phase: Some(phase),
            backfill,
            tails,
            verify,
            verify_clean: result.map(|r| r.clean),
            fed,
        })
    }
}
