//! `rekey run`: the whole migration in one command, resumable in any phase.
//!
//! check (the plan loads) → analyze gate → capture (the tail starts, from the
//! stream's trim horizon) → backfill → catch-up (a drain barrier: the tail has
//! applied everything captured) → verify → ready for cutover. Then it goes on
//! tailing until `rekey finish` (or exits with `--exit-when-ready`).
//!
//! Nothing here keeps state of its own beyond the analyze gate's verdict:
//! each phase is the ordinary command, with its own checkpoints, so after
//! kill -9 a rerun skips what is complete (`backfill.done`, a clean verify
//! newer than the backfill) and resumes what was in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::aws::Clients;
use crate::core::plan::Plan;
use crate::phase::analyze::{self, AnalyzeOptions, ScanSettings};
use crate::phase::backfill::{self, BackfillOptions};
use crate::phase::barrier::{self, DrainOptions};
use crate::phase::error::{GateNotMet, Stopped};
use crate::phase::progress::Progress;
use crate::phase::tail::{self, Flow, TailOptions};
use crate::phase::verify::{self, VerifyOptions};
use crate::state::StateDir;
use crate::state::snapshot;
use crate::state::snapshot::VerifyResult;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub state_dir: StateDir,
    /// None: skip the analyze gate.
    pub analyze: Option<(ScanSettings, AnalyzeOptions)>,
    pub allow_hot_keys: bool,
    pub backfill: BackfillOptions,
    pub tail: TailOptions,
    pub verify: VerifyOptions,
    pub drain_timeout: Duration,
    pub exit_when_ready: bool,
    /// Notified when the migration is ready for cutover and this run goes on
    /// tailing (not with `exit_when_ready`), for a caller that cuts over and
    /// finishes in the same process (`rekey demo`).
    pub ready: Option<Arc<tokio::sync::Notify>>,
}

/// After a cutover is recorded, the reverse tail (target → source), so the
/// migration can be rolled back (`rekey rollback`), when the target has a
/// NEW_AND_OLD_IMAGES stream and every rule is reversible; else a note says
/// why not. Ends with the forward tail (its `stop`, or `rekey finish`).
async fn reverse_after_cutover(
    clients: &Clients,
    plan: &Plan,
    forward: &TailOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let dir = &forward.state_dir;
    loop {
        if stop.is_cancelled() || dir.is_finished() {
            return Ok(());
        }
        // After a rollback too: the reverse tail runs until `rekey finish`
        // (writes that still reach the target are carried back), also in a
        // `run` started again after the rollback.
        if dir.cutover_record().exists() || dir.rollback_record().exists() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
    if let Err(why) = tail::line::reversible(clients, plan).await? {
        progress.note(&format!("cut over; no reverse tail, so no rollback: {why}"));
        return Ok(());
    }
    progress.note("cut over: the reverse tail carries the target's writes back to the source (`rekey rollback` is possible)");
    let opts = TailOptions {
        flow: Flow::Reverse,
        rejects: dir.reverse_rejects(),
        ..forward.clone()
    };
    match tail::run(clients, plan, &opts, &progress.beside(), stop).await {
        Ok(_) => Ok(()),
        Err(e) if e.is::<Stopped>() => Ok(()),
        Err(e) => Err(e.context("the reverse tail stopped")),
    }
}

/// The analyze gate's verdict, kept so a rerun does not scan again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnalyzeVerdict {
    pub scanned: u64,
    pub new_keys_over_limit: u64,
    pub old_keys_over_limit: u64,
    pub collisions: u64,
    pub rejected: u64,
}

impl AnalyzeVerdict {
    pub fn of(r: &analyze::Report) -> AnalyzeVerdict {
        let over =
            |d: &analyze::Distribution| d.load.iter().map(|l| l.keys_over_limit).max().unwrap_or(0);
        AnalyzeVerdict {
            scanned: r.scanned,
            new_keys_over_limit: over(&r.new),
            old_keys_over_limit: over(&r.old),
            collisions: r.collisions.target_keys,
            rejected: r.rejected,
        }
    }
}

/// The phase between ready-for-cutover and `rekey finish`, in [`RunReport::timings`].
pub const TAILING: &str = "tailing until finish";

/// How long one phase of this run took.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseTime {
    pub phase: String,
    pub seconds: f64,
}

impl PhaseTime {
    /// `phase`, from `started` until now.
    pub fn since(phase: &str, started: Instant) -> PhaseTime {
        PhaseTime {
            phase: phase.into(),
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub phase: snapshot::Phase,
    pub analyze: Option<AnalyzeVerdict>,
    pub backfill: Option<backfill::BackfillReport>,
    pub verify: Option<VerifyResult>,
    /// Why the run stopped before ready-for-cutover (gate not met, differences).
    pub blocked: Option<String>,
    /// What this run's tail did, when it stopped on its own (after `rekey finish`).
    pub tail: Option<tail::TailReport>,
    /// The phases this run went through, in order.
    pub timings: Vec<PhaseTime>,
}

impl RunReport {
    fn timed(&mut self, phase: &str, started: Instant) {
        self.timings.push(PhaseTime::since(phase, started));
    }
}

/// The span the events of one phase of `run` are in: the log's `phase`.
fn phase_span(phase: &'static str) -> tracing::Span {
    tracing::info_span!("phase", phase)
}

/// The lifecycle, until ready for cutover and then `rekey finish` (or
/// `exit_when_ready`). Once `stop` is cancelled (Ctrl-C, SIGTERM) the phase
/// in progress stops after its work in flight, the tail publishes a stopped
/// status, and `run` returns `Stopped`; a rerun resumes.
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &RunOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<RunReport> {
    if plan.mode == crate::core::plan::Mode::InPlace {
        anyhow::bail!(crate::phase::error::InputError(format!(
            "{}: `rekey run` drives a re-key into a new table; in place, run `rekey tail`, \
             `rekey backfill` and `rekey verify` (README, \"In place\")",
            plan.path.display()
        )));
    }
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("cannot create {}", opts.state_dir.display()))?;
    let mut report = RunReport {
        phase: snapshot::Phase::NotStarted,
        analyze: None,
        backfill: None,
        verify: None,
        blocked: None,
        tail: None,
        timings: Vec::new(),
    };

    // 1. The analyze gate: refuse a design whose new keys would still throttle.
    if let Some((scan, aopts)) = &opts.analyze {
        // A dry run writes nothing: a stop may cut it short.
        tokio::select! {
            r = analyze_gate(clients, plan, opts, (scan, aopts), progress, &mut report)
                .instrument(phase_span("analyze")) => r?,
            () = stop.cancelled() => return Err(Stopped.into()),
        }
    }

    // Every phase stops through `stop`; the tails through a child of it, so
    // that `run` can also stop the tails alone when it gives up.
    let tail_stop = stop.child_token();
    let opts = &RunOptions {
        backfill: BackfillOptions {
            tail_in_process: true,
            ..opts.backfill.clone()
        },
        ..opts.clone()
    };

    // 2. Capture: the tail runs for the rest of the command, in this process.
    let mut tail_task = {
        let (clients, plan, topts) = (clients.clone(), plan.clone(), opts.tail.clone());
        let (beside, stop) = (progress.beside(), tail_stop.clone());
        tokio::spawn(
            async move { tail::run(&clients, &plan, &topts, &beside, &stop).await }
                .instrument(phase_span("tail")),
        )
    };
    // The reverse tail from the start too (it waits for a cutover record):
    // a `run` started again after a cutover carries the target's writes
    // back at once, not after its own catch-up and verify.
    let reverse_task = {
        let (clients, plan, topts) = (clients.clone(), plan.clone(), opts.tail.clone());
        let (beside, stop) = (progress.beside(), tail_stop.clone());
        tokio::spawn(
            async move { reverse_after_cutover(&clients, &plan, &topts, &beside, &stop).await }
                .instrument(phase_span("reverse")),
        )
    };
    let reverse_ended = |r: Result<anyhow::Result<()>, tokio::task::JoinError>| match r {
        Ok(r) => r,
        Err(e) => Err(anyhow::anyhow!("the reverse tail's task failed: {e}")),
    };
    let tail_ended = |r: Result<anyhow::Result<tail::TailReport>, tokio::task::JoinError>| match r {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(e.context("the tail stopped")),
        Err(e) => Err(anyhow::anyhow!("the tail task failed: {e}")),
    };
    // Every phase after capture depends on the tail: if it stops (a trimmed
    // stream, a lost permission), say so now rather than time out later.
    let mut tail_over = false;
    let result = tokio::select! {
        r = phases(clients, plan, opts, progress, stop, &mut report) => r,
        r = &mut tail_task => {
            tail_over = true;
            match tail_ended(r) {
                Ok(_) => Err(anyhow::anyhow!("the tail stopped before the migration was ready")),
                Err(e) => Err(e),
            }
        }
    };
    let result = match result {
        Ok(()) if report.blocked.is_none() && !opts.exit_when_ready => {
            match &opts.ready {
                // The caller cuts over and finishes, in this process.
                Some(ready) => {
                    progress.note("ready for cutover; tailing until finish");
                    ready.notify_one();
                }
                None => progress.note(
                    "ready for cutover; tailing until `rekey finish` (or stop with Ctrl-C and run `rekey tail`)",
                ),
            }
            let started = Instant::now();
            let (tailed, reversed) = tokio::join!(async { tail_ended(tail_task.await) }, async {
                reverse_ended(reverse_task.await)
            });
            let tailed = tailed.map(|t| report.tail = Some(t));
            report.timed(TAILING, started);
            tailed.and(reversed)
        }
        other => {
            // Stop both tails cleanly: each publishes that it stopped.
            tail_stop.cancel();
            if !tail_over {
                let _ = tail_task.await;
            }
            let _ = reverse_task.await;
            other
        }
    };
    result?;
    report.phase = snapshot::gather(&opts.state_dir)?.phase;
    Ok(report)
}

/// The analyze gate's verdict (recorded, or from a full dry run), or exit 3
/// if the new design would still put a key over the per-partition limit.
async fn analyze_gate(
    clients: &Clients,
    plan: &Plan,
    opts: &RunOptions,
    (scan, aopts): (&ScanSettings, &AnalyzeOptions),
    progress: &Progress,
    report: &mut RunReport,
) -> anyhow::Result<()> {
    // A caller that has just analyzed the same source (`rekey demo`) records
    // its verdict there, so the gate does not scan again.
    let path = opts.state_dir.analyze_verdict();
    let verdict = match snapshot::read::<AnalyzeVerdict>(&path)? {
        Some(v) => v,
        None => {
            let started = Instant::now();
            progress.note("analyze: applying the plan to every source item (no writes)");
            let r = analyze::run(clients, plan, scan, aopts.clone(), None, progress).await?;
            let v = AnalyzeVerdict::of(&r);
            snapshot::publish(&path, &v)?;
            report.timed("analyze", started);
            v
        }
    };
    report.analyze = Some(verdict.clone());
    progress.note(&format!(
        "analyze: {} items; new keys over the per-partition limit: {} (old design: {}); {} collisions, {} rejects",
        verdict.scanned,
        verdict.new_keys_over_limit,
        verdict.old_keys_over_limit,
        verdict.collisions,
        verdict.rejected
    ));
    if verdict.new_keys_over_limit > 0 && !opts.allow_hot_keys {
        anyhow::bail!(GateNotMet(format!(
            "analyze gate: {} new partition key(s) would still exceed the per-partition limit; \
             change the plan (more shards), or pass --allow-hot-keys",
            verdict.new_keys_over_limit
        )));
    }
    Ok(())
}

/// Verify passes `run` makes while only unconfirmed differences remain.
const VERIFY_ATTEMPTS: usize = 3;

/// A drain barrier, or exit 3 if the tail does not report it in time.
async fn drain_or_gate(
    clients: &Clients,
    plan: &Plan,
    opts: &RunOptions,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let drain_opts = DrainOptions {
        state_dir: opts.state_dir.clone(),
        timeout: opts.drain_timeout,
        flow: Flow::Forward,
        fleet: None,
    };
    // Waiting for a barrier holds nothing: a stop may cut it short.
    let drain = tokio::select! {
        d = barrier::drain(clients, plan, &drain_opts) => d?,
        () = stop.cancelled() => return Err(Stopped.into()),
    };
    if !drain.complete {
        anyhow::bail!(GateNotMet(format!(
            "catch-up: the tail did not apply drain barrier {} within {:.0} s",
            drain.barrier, drain.waited_seconds
        )));
    }
    Ok(())
}

/// Backfill, catch-up and verify, each skipped when already complete.
async fn phases(
    clients: &Clients,
    plan: &Plan,
    opts: &RunOptions,
    progress: &Progress,
    stop: &CancellationToken,
    report: &mut RunReport,
) -> anyhow::Result<()> {
    // 3. Backfill (resumes from its checkpoints; skipped once done).
    if !opts.state_dir.is_backfill_done() {
        let started = Instant::now();
        progress.note("backfill: copying every source item into the target");
        let backfill = backfill::run(clients, plan, &opts.backfill, progress, stop);
        report.backfill = Some(backfill.instrument(phase_span("backfill")).await?);
        report.timed("backfill", started);
    }

    // 4. Catch-up: the tail has applied its buffer and everything written until now.
    let started = Instant::now();
    progress.note("catch-up: waiting for the tail to apply every change captured so far");
    drain_or_gate(clients, plan, opts, stop)
        .instrument(phase_span("catch-up"))
        .await?;
    report.timed("catch-up", started);

    // 5. Verify, unless a clean full verify already finished after the backfill.
    // Differences the re-check could not settle because the tail was behind
    // (unconfirmed) are worth another pass once it has caught up; confirmed
    // differences stop the run.
    let previous: Option<VerifyResult> = snapshot::read(&opts.state_dir.verify_snapshot())?;
    let fresh = previous
        .as_ref()
        .is_some_and(|v| v.clean && v.sample_percent.is_none());
    let mut verdict = previous;
    let started = Instant::now();
    if !fresh {
        for attempt in 1..=VERIFY_ATTEMPTS {
            progress.note("verify: comparing every source item with the target, and back");
            let r = verify::run(clients, plan, &opts.verify, progress, stop)
                .instrument(phase_span("verify"))
                .await?;
            let c = r.result.counts;
            let confirmed = c.missing + c.different + c.orphans;
            let unsettled = c.unconfirmed + c.unconfirmed_orphans;
            let clean = r.result.clean;
            verdict = Some(r.result);
            if clean || confirmed > 0 || attempt == VERIFY_ATTEMPTS {
                break;
            }
            progress.note(&format!(
                "verify: {unsettled} difference(s) unconfirmed (the tail was behind); catching up and verifying again"
            ));
            drain_or_gate(clients, plan, opts, stop).await?;
        }
        report.timed("verify", started);
    }
    if let Some(v) = verdict.as_ref().filter(|v| !v.clean) {
        report.blocked = Some(format!(
            "verify found differences ({}; see {}); repair with `rekey verify --repair`, then run again",
            serde_json::to_string(&v.counts).unwrap_or_default(),
            opts.state_dir.mismatches().display()
        ));
    }
    report.verify = verdict;
    Ok(())
}
