//! `rekey verify PLAN --state dynamodb://TABLE[/MIGRATION]`: the verify run by
//! N processes on as many machines, as the backfill is by `rekey worker`.
//!
//! Its units are the Scan segments of both passes — forward units `0..S`
//! (the source's segments), orphan units `S..2S` (the target's), S being
//! the migration's segment count — leased as the workers lease theirs
//! ([`crate::phase::fleet`]: the same takes, heartbeat,
//! fence, re-balancing and release), as `VUNIT#` items. Each page is compared
//! exactly as on one machine ([`compare_forward`], [`compare_backward`]) and
//! its candidates re-checked at once, before the page's commit, by the same
//! rounds ([`recheck_forward`], [`decide_orphans`]), waiting on the fleet
//! tail's `TAIL` item instead of a local status file. The page's counters
//! and confirmed differences (a sample per unit) are then committed to the
//! unit item, conditioned on the lease: a process killed mid-page leaves
//! nothing of that page, and the next holder redoes it. Once every unit is
//! done, the first process to see it writes the verdict (`VERIFY`).
//!
//! Its orphan check reads each target item's source key back, item by item:
//! from the `source_key_prefix` copies, or without them through the plan's
//! inverse ([`Inverter::keys`]). What it cannot do (yet), and refuses: a plan
//! without the prefix whose target key does not hold the whole source key
//! (only the index of expected target keys that one machine's forward pass
//! builds can tell its orphans), `--sample`, `--repair`, `--reverse`. Its
//! re-check has no stream watch: a source item rewritten A→B→A between two
//! reads is judged by value (a false alarm is possible there, never a
//! missed difference).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::control::{Cond, ControlTable};
use crate::aws::rate::Control;
use crate::aws::scan::Page;
use crate::core::plan::Plan;
use crate::phase::error::{InputError, Stopped};
use crate::phase::fleet::{
    Beside, Budgets, Drive, LeaseLost, Leasing, Shared, UnitScan, lead, scan_unit,
};
use crate::phase::progress::Progress;
use crate::state::fleet::verify::count_pairs;
use crate::state::fleet::{Checkpoint, Fleet, FleetRef, Lease, Unit};
use crate::state::snapshot::{Counts, VerifyResult};
use crate::state::{StateDir, StateStore};

use super::forward::compare_forward;
use super::ledger::Ledger;
use super::orphans::{compare_backward, decide_orphans};
use super::recheck::{recheck_forward, tally_forward, tally_orphan};
use super::report::{EXAMPLES, example};
use super::{
    Ctx, Mismatch, Step, Tables, VerifyOptions, VerifyReport, check_inputs, ms_to_time, now_ms,
    tables,
};

/// `rekey verify --state dynamodb://…`.
#[derive(Debug, Clone)]
pub struct FleetVerifyOptions {
    pub verify: VerifyOptions,
    pub fleet: FleetRef,
    pub worker_id: String,
    /// How long a lease lives without a renewal.
    pub lease: Duration,
    /// Units held at once, at most.
    pub max_units: usize,
}

/// Confirmed differences kept per unit in the control table (the counters
/// count them all).
const DIFFS_PER_UNIT: usize = 20;

/// Segments of a migration a verify creates (no worker has).
const DEFAULT_SEGMENTS: u32 = 32;

struct VerifyDrive {
    ctx: Arc<Ctx>,
    shared: Arc<Shared>,
    segments: u32,
    /// What this process committed.
    this: Mutex<Counts>,
}

impl Drive for VerifyDrive {
    fn run(
        self: Arc<Self>,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> futures::future::BoxFuture<'static, anyhow::Result<bool>> {
        Box::pin(self.run_unit(unit, l, stop))
    }
    fn scanned(&self) -> futures::future::BoxFuture<'_, u64> {
        Box::pin(async {
            let c = self.this.lock().await;
            c.scanned + c.target_scanned
        })
    }
    fn all_done(&self) -> futures::future::BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async {
            let fleet = &self.shared.fleet;
            let mut total = Counts::default();
            for u in fleet.verify_units().await? {
                total.add(&u.counts);
            }
            if fleet.finish_verify(&total).await? == Cond::Written {
                tracing::info!(clean = total.differences() == 0, "verify verdict written");
            }
            Ok(())
        })
    }
}

impl VerifyDrive {
    /// One unit: the source's segment `n` (forward), or the target's
    /// segment `n - S` (orphans).
    async fn run_unit(
        self: Arc<Self>,
        unit: Unit,
        l: Lease,
        stop: CancellationToken,
    ) -> anyhow::Result<bool> {
        let forward = unit.n < self.segments;
        let (table, control) = if forward {
            (self.ctx.plan.source_table.clone(), self.ctx.src.clone())
        } else {
            (self.ctx.plan.target_table.clone(), self.ctx.tgt.clone())
        };
        let kept = self
            .shared
            .fleet
            .verify_units()
            .await?
            .into_iter()
            .find(|u| u.n == unit.n)
            .map_or(0, |u| u.diffs.len());
        let kept = Arc::new(AtomicU64::new(kept as u64));
        let scan = UnitScan {
            table,
            segments: self.segments,
            segment: unit.n % self.segments,
            page_limit: self.ctx.opts.page_limit,
            control,
            stop,
        };
        let me = self.clone();
        scan_unit(&self.ctx.clients, scan, &unit, move |page, page_no| {
            let (me, kept) = (me.clone(), kept.clone());
            async move { me.page(l, forward, page, page_no, &kept).await }
        })
        .await
    }

    /// One page: compared, its candidates re-checked, then its counters and
    /// differences committed under the lease.
    async fn page(
        &self,
        l: Lease,
        forward: bool,
        page: Page,
        page_no: u64,
        kept: &AtomicU64,
    ) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let (delta, diffs) = if forward {
            settle_forward_page(ctx, &page).await?
        } else {
            settle_orphan_page(ctx, &page).await?
        };
        let room = (DIFFS_PER_UNIT as u64).saturating_sub(kept.load(Ordering::SeqCst)) as usize;
        let appended: Vec<String> = diffs
            .iter()
            .take(room)
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()?;
        let checkpoint = match &page.next {
            Some(k) => Checkpoint::After(k.clone()),
            None => Checkpoint::Done,
        };
        let lost = LeaseLost {
            unit: l.unit,
            lease: l.lease,
        };
        if !self.shared.may_write(l.unit, l) {
            return Err(lost.into());
        }
        let pairs = count_pairs(&delta);
        let adds: Vec<(&str, u64)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let fleet = &self.shared.fleet;
        if fleet
            .commit_counts(l, &checkpoint, page_no + 1, &adds, &appended)
            .await?
            == Cond::Refused
        {
            return Err(lost.into());
        }
        kept.fetch_add(appended.len() as u64, Ordering::SeqCst);
        self.this.lock().await.add(&delta);
        ctx.this_run.fetch_add(delta.scanned, Ordering::Relaxed);
        Ok(())
    }
}

/// A source page compared and its candidates settled: the page's counters
/// (nothing pending) and its confirmed or unconfirmed differences.
async fn settle_forward_page(ctx: &Ctx, page: &Page) -> anyhow::Result<(Counts, Vec<Mismatch>)> {
    let (mut delta, cands) = compare_forward(ctx, page).await?;
    if cands.is_empty() {
        return Ok((delta, Vec::new()));
    }
    delta.pending -= cands.len() as u64;
    let verdicts = recheck_forward(ctx, cands, None).await?;
    let diffs = verdicts
        .into_iter()
        .filter_map(|v| tally_forward(v, &mut delta))
        .collect();
    Ok((delta, diffs))
}

/// A target page judged and its orphan candidates settled.
async fn settle_orphan_page(ctx: &Ctx, page: &Page) -> anyhow::Result<(Counts, Vec<Mismatch>)> {
    let (mut delta, cands) = compare_backward(ctx, page).await?;
    if cands.is_empty() {
        return Ok((delta, Vec::new()));
    }
    delta.pending_orphans -= cands.len() as u64;
    let batch: Vec<(String, Mismatch)> = cands.into_iter().map(|m| (String::new(), m)).collect();
    let verdicts = decide_orphans(ctx, None, &batch).await?;
    let diffs = batch
        .into_iter()
        .zip(verdicts)
        .filter_map(|((_, m), v)| tally_orphan(v, m, &mut delta))
        .collect();
    Ok((delta, diffs))
}

fn refuse_unsupported(plan: &Plan, opts: &VerifyOptions) -> anyhow::Result<()> {
    let unread = unreadable_key(plan);
    let what = if let Some(why) = &unread {
        Some(why.as_str())
    } else if opts.sample.is_some() {
        Some("--sample")
    } else if opts.repair {
        Some("--repair")
    } else if opts.reverse {
        Some("--reverse")
    } else if opts.restart {
        Some("--restart (a fleet verify is one run per migration)")
    } else {
        None
    };
    match what {
        Some(w) => Err(InputError(format!(
            "rekey verify --state does not run {w} yet: run rekey verify on one machine"
        ))
        .into()),
        None => Ok(()),
    }
}

/// Why the orphan check cannot read target items back, if it cannot: without
/// `source_key_prefix` it reads each target item's source key through the
/// plan's inverse ([`Inverter::keys`]), so every rule's target key must hold
/// the whole source key, one way only (no variable parts side by side, no
/// two rules' target keys meeting), and no rule may overwrite an attribute
/// it reads; attributes a rule drops do not matter unless its key reads
/// them. Else only one machine's index of expected keys can tell.
pub(super) fn unreadable_key(plan: &Plan) -> Option<String> {
    use crate::core::inverse::{Irreversible, removed_off_key, reversibility};
    if plan.source_key_prefix.is_some() {
        return None;
    }
    let lost = reversibility(plan).into_iter().find_map(|r| {
        let rule = plan.rules.iter().find(|x| x.name == r.rule)?;
        let why: Vec<String> = r
            .reasons
            .iter()
            .filter(|x| {
                matches!(
                    x,
                    Irreversible::InPlace
                        | Irreversible::LostSourceKey { .. }
                        | Irreversible::LostCapture { .. }
                        | Irreversible::Overwritten { .. }
                        | Irreversible::Adjacent { .. }
                        | Irreversible::Overlap { .. }
                ) || (matches!(x, Irreversible::Removed { .. }) && !removed_off_key(rule, x))
            })
            .map(ToString::to_string)
            .collect();
        (!why.is_empty()).then(|| format!("rule `{}`: {}", r.rule, why.join("; ")))
    })?;
    Some(format!(
        "a plan without source_key_prefix whose target key does not hold the whole source key \
         ({lost}), so its orphans cannot be read back (give the plan source_key_prefix)"
    ))
}

/// The verify's context for a fleet process: the tables' read budgets, no
/// index of expected keys (target items name their source: the prefix, or
/// the inverse), the re-checks
/// waiting on the fleet's `TAIL`. Its local store (for the stream watch's
/// bookkeeping, unused here) is its own, beside a local verify's.
fn fleet_ctx(
    clients: &Clients,
    plan: &Plan,
    opts: &VerifyOptions,
    tables: &Tables,
    fleet: Fleet,
    stop: &CancellationToken,
) -> anyhow::Result<Arc<Ctx>> {
    let own = StateDir::new(opts.state_dir.root().join("verify-fleet"));
    let store = StateStore::open(&own.verify_store(), plan)?;
    let expected = crate::state::claims::Claims::open(&own.expected_keys())?;
    Ok(Arc::new(Ctx {
        clients: clients.clone(),
        plan: plan.clone(),
        opts: opts.clone(),
        stop: stop.clone(),
        src: Arc::new(Control::new(tables.src_rate, None)),
        tgt: Arc::new(Control::new(tables.tgt_rate, None)),
        ledger: Mutex::new(Ledger {
            store,
            expected,
            counts: Counts::default(),
        }),
        sample: None,
        track_expected: false,
        rcu_src: Mutex::new(0.0),
        rcu_tgt: Mutex::new(0.0),
        this_run: AtomicU64::new(0),
        waiting: AtomicBool::new(false),
        phase: std::sync::Mutex::new(Step::Forward),
        notes: std::sync::Mutex::new(Vec::new()),
        fleet_tail: Some(fleet),
        named_by_inverse: plan.source_key_prefix.is_none(),
    }))
}

/// Runs one of the fleet verify's processes until every unit is done (the
/// verdict read back from `VERIFY`), or `stop` (its pages in flight
/// committed, its leases released, then [`Stopped`]).
pub async fn run_fleet(
    clients: &Clients,
    plan: &Plan,
    opts: &FleetVerifyOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<VerifyReport> {
    let v = &opts.verify;
    check_inputs(plan, v)?;
    refuse_unsupported(plan, v)?;
    let started = Instant::now();
    let t = tables(clients, plan, v).await?;
    let control = ControlTable::new(clients, &opts.fleet.table);
    let fleet = Fleet::verify(control, opts.fleet.clone(), &opts.worker_id);
    let asked = v.segments.unwrap_or(DEFAULT_SEGMENTS);
    let segments = fleet.join(plan, asked).await?;
    if v.segments.is_some_and(|n| n != segments) {
        progress.note(&format!(
            "--segments {asked} ignored: the migration was created with {segments}"
        ));
    }
    fleet.create_units(2 * segments).await?;
    let started_ms = fleet.start_verify().await?;
    progress.note(&format!(
        "verify {} joined {} ({} units: {segments} forward, {segments} orphans)",
        opts.worker_id,
        opts.fleet.display(),
        2 * segments
    ));
    let ctx = fleet_ctx(clients, plan, v, &t, fleet.clone(), stop)?;
    let shared = Shared::new(fleet, opts.lease);
    let drive = Arc::new(VerifyDrive {
        ctx: ctx.clone(),
        shared: shared.clone(),
        segments,
        this: Mutex::new(Counts::default()),
    });
    let leasing = Leasing {
        max_units: opts.max_units,
        stop: stop.clone(),
    };
    let budgets = Budgets {
        read: t.src_rate,
        write: None,
    };
    progress.start("verify", Some(t.source.item_count));
    let (outcome, _) = lead(
        &shared,
        drive.clone(),
        &leasing,
        ctx.src.clone(),
        budgets,
        progress,
        None::<Beside<std::future::Ready<()>>>,
    )
    .await;
    progress.finish();
    let (_, done) = outcome?;
    if !done {
        return Err(Stopped.into());
    }
    fleet_report(&ctx, &shared.fleet, started_ms, started).await
}

/// The fleet's verdict, as this process reports it.
async fn fleet_report(
    ctx: &Ctx,
    fleet: &Fleet,
    started_ms: i64,
    started: Instant,
) -> anyhow::Result<VerifyReport> {
    let verdict = fleet.verify_verdict().await?;
    let units = fleet.verify_units().await?;
    let mut counts = Counts::default();
    for u in &units {
        counts.add(&u.counts);
    }
    anyhow::ensure!(
        counts.accounted() && counts.pending == 0 && counts.pending_orphans == 0,
        "fleet verify counters do not add up: {counts:?}"
    );
    let finished_ms = verdict.and_then(|v| v.finished_ms).unwrap_or_else(now_ms);
    let plan = &ctx.plan;
    let result = VerifyResult {
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        plan_fingerprint: plan.fingerprint.clone(),
        started_at: ms_to_time(started_ms),
        finished_at: ms_to_time(finished_ms),
        clean: counts.differences() == 0,
        sample_percent: None,
        reverse: false,
        counts,
    };
    // Every unit's sample, into this process's mismatches file.
    let mismatches: Vec<Mismatch> = units
        .iter()
        .flat_map(|u| u.diffs.iter())
        .filter_map(|j| serde_json::from_str(j).ok())
        .collect();
    let file = ctx.opts.state_dir.mismatches();
    let mut text = String::new();
    for m in &mismatches {
        text.push_str(&serde_json::to_string(m)?);
        text.push('\n');
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    let notes = ctx.notes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(VerifyReport {
        result,
        resumed: false,
        this_run_scanned: ctx.this_run.load(Ordering::Relaxed),
        consumed_rcu_source: *ctx.rcu_src.lock().await,
        consumed_rcu_target: *ctx.rcu_tgt.lock().await,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        mismatches_file: file.display().to_string(),
        examples: mismatches.iter().take(EXAMPLES).map(example).collect(),
        notes,
        sample: None,
        repair: None,
    })
}
