//! `rekey verify --reverse`: the rollback's check, the source against
//! inverse(target) — what a rollback hands back to the application.
//!
//! Two scans: every target item is read back by the plan's inverse
//! (`core::inverse`) and the source must hold exactly that item (`missing`:
//! no item at the key; `different`: another image; an item the inverse
//! rejects is `rejected`); every source item the plan re-keys must be read
//! back from some target item (`orphans`: a source item the target no longer
//! holds). Differences are re-checked once both tails have applied every
//! write up to the moment they were seen (`wait_for_tail`), by reading both
//! sides again consistently; still different, they count.
//!
//! Unlike the forward verify it keeps no checkpoint and holds its candidates
//! in memory: it runs in the rollback window, on a table the forward verify
//! has already checked, and a rerun simply starts again. It publishes its
//! result where the forward verify does, so `rekey rollback`'s clean-verify
//! gate reads it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use chrono::Utc;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::item::{GET_BATCH, batch_get};
use crate::aws::rate::Control;
use crate::aws::scan::{self, Page, ScanOptions};
use crate::core::inverse::{InverseOutcome, Inverter};
use crate::core::plan::Plan;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::phase::error::Stopped;
use crate::phase::progress::Progress;
use crate::state::snapshot::{Counts, VerifyResult};

use super::report::{EXAMPLES, example};
use super::{
    Kind, MARGIN, Mismatch, Tables, TailWait, VerifyOptions, VerifyReport, tables, wait_for_tail,
};

/// One difference found by a scan, to re-check.
#[derive(Debug, Clone)]
struct Candidate {
    /// The source key it is about, and the target key it was read from.
    source_key: Item,
    target_key: Option<Item>,
}

#[derive(Default)]
struct Found {
    counts: Counts,
    candidates: Vec<Candidate>,
}

struct Shared {
    clients: Clients,
    plan: Plan,
    /// The source's read budget (`--read-rate`) and the target's
    /// (`--target-read-rate`), as the forward verify has them.
    src: Arc<Control>,
    tgt: Arc<Control>,
    found: Mutex<Found>,
    max_retries: u32,
}

impl Shared {
    /// The read budget of `table` (the source or the target).
    fn control(&self, table: &str) -> &Arc<Control> {
        if table == self.plan.source_table {
            &self.src
        } else {
            &self.tgt
        }
    }
}

/// Verify the source against inverse(target); see the module docs. Once
/// `stop` is cancelled no pass reads another page, and it returns `Stopped`.
pub(crate) async fn run_reverse(
    clients: &Clients,
    plan: &Plan,
    opts: &VerifyOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<VerifyReport> {
    let started_at = Utc::now();
    let started = Instant::now();
    let Tables {
        src_rate, tgt_rate, ..
    } = tables(clients, plan, opts).await?;
    let shared = Arc::new(Shared {
        clients: clients.clone(),
        plan: plan.clone(),
        src: Arc::new(Control::new(src_rate, None)),
        tgt: Arc::new(Control::new(tgt_rate, None)),
        found: Mutex::new(Found::default()),
        max_retries: opts.max_retries,
    });
    progress.start("verify --reverse", None);
    for (table, backwards) in [(&plan.target_table, true), (&plan.source_table, false)] {
        let scan_opts = ScanOptions {
            table: table.clone(),
            segments: opts.segments.unwrap_or(4),
            page_limit: opts.page_limit,
            consistent_read: false,
        };
        let s = shared.clone();
        scan::scan(
            clients,
            &scan_opts,
            Vec::new(),
            shared.control(table).clone(),
            stop,
            move |page| {
                let s = s.clone();
                async move { check_page(&s, page, backwards).await }
            },
        )
        .await?;
    }
    if stop.is_cancelled() {
        return Err(Stopped.into());
    }
    let Found {
        mut counts,
        candidates,
    } = std::mem::take(&mut *shared.found.lock().await);
    let mut notes = Vec::new();
    let mut examples = Vec::new();
    let verdicts = recheck_all(&shared, candidates.clone(), opts).await?;
    for (c, v) in candidates.iter().zip(verdicts) {
        match v {
            Ok(None) => {
                counts.resolved += 1;
                counts.matched += 1;
            }
            Ok(Some(kind)) => {
                match kind {
                    Kind::Orphan => counts.orphans += 1,
                    Kind::Different => counts.different += 1,
                    _ => counts.missing += 1,
                }
                if examples.len() < EXAMPLES {
                    examples.push(example(&mismatch(kind, c)));
                }
            }
            Err(why) => {
                counts.unconfirmed += 1;
                if !notes.contains(&why) {
                    notes.push(why);
                }
            }
        }
    }
    progress.finish();
    let clean = counts.missing + counts.different + counts.orphans + counts.unconfirmed == 0;
    let result = VerifyResult {
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        plan_fingerprint: plan.fingerprint.clone(),
        started_at,
        finished_at: Utc::now(),
        clean,
        sample_percent: None,
        reverse: true,
        counts,
    };
    std::fs::create_dir_all(opts.state_dir.verify_store())
        .with_context(|| format!("cannot create {}", opts.state_dir.verify_store().display()))?;
    crate::state::snapshot::publish(&opts.state_dir.verify_snapshot(), &result)?;
    Ok(VerifyReport {
        this_run_scanned: result.counts.target_scanned,
        result,
        resumed: false,
        consumed_rcu_source: 0.0,
        consumed_rcu_target: 0.0,
        elapsed_seconds: started.elapsed().as_secs_f64(),
        mismatches_file: String::new(),
        examples,
        notes,
        sample: None,
        repair: None,
    })
}

fn mismatch(kind: Kind, c: &Candidate) -> Mismatch {
    Mismatch {
        kind,
        suspected: None,
        source_key: Some(c.source_key.clone()),
        target_key: c.target_key.clone(),
        attributes: Vec::new(),
        reason: Some("verify --reverse".into()),
        found_at_ms: 0,
    }
}

/// One scanned page: target items read back and compared with the source
/// (`backwards`), or source items looked up in the target.
async fn check_page(s: &Shared, page: Page, backwards: bool) -> anyhow::Result<()> {
    let plan = &s.plan;
    let (sn, tn) = (plan.source_key.names(), plan.target_key.names());
    let mut delta = Found::default();
    if backwards {
        delta.counts.target_scanned += page.items.len() as u64;
        let inverter = Inverter::new(plan);
        let mut read_back = Vec::new();
        for t in &page.items {
            match inverter.invert(t) {
                InverseOutcome::Put { item, .. } => read_back.push((key_of(t, &tn), item)),
                InverseOutcome::Reject(_) => delta.counts.rejected += 1,
                InverseOutcome::Skip => delta.counts.skipped += 1,
            }
        }
        let keys: Vec<Item> = read_back.iter().map(|(_, s)| key_of(s, &sn)).collect();
        let held = get(s, &plan.source_table, &sn, &keys).await?;
        for ((tk, expected), sk) in read_back.into_iter().zip(keys) {
            let code = encode_key(&sk, &sn).unwrap_or_default();
            match held.get(&code) {
                Some(h) if *h == expected => delta.counts.target_matched += 1,
                _ => delta.candidates.push(Candidate {
                    source_key: sk,
                    target_key: Some(tk),
                }),
            }
        }
    } else {
        delta.counts.scanned += page.items.len() as u64;
        let mut mapped = Vec::new();
        for item in &page.items {
            match transform(plan, item) {
                Outcome::Put { item: t, .. } => mapped.push((key_of(item, &sn), key_of(&t, &tn))),
                _ => delta.counts.skipped += 1,
            }
        }
        let keys: Vec<Item> = mapped.iter().map(|(_, t)| t.clone()).collect();
        let held = get(s, &plan.target_table, &tn, &keys).await?;
        for (sk, tk) in mapped {
            if held.contains_key(&encode_key(&tk, &tn).unwrap_or_default()) {
                delta.counts.matched += 1;
            } else {
                delta.candidates.push(Candidate {
                    source_key: sk,
                    target_key: Some(tk),
                });
            }
        }
    }
    let mut found = s.found.lock().await;
    found.counts.add(&delta.counts);
    found.candidates.extend(delta.candidates);
    Ok(())
}

async fn get(
    s: &Shared,
    table: &str,
    names: &[&str],
    keys: &[Item],
) -> anyhow::Result<HashMap<Vec<u8>, Item>> {
    let mut out = HashMap::new();
    for chunk in keys.chunks(GET_BATCH) {
        let (found, _) = batch_get(
            &s.clients,
            table,
            names,
            chunk,
            true,
            s.control(table),
            s.max_retries,
        )
        .await
        .with_context(|| format!("verify --reverse: reading `{table}`"))?;
        out.extend(found);
    }
    Ok(out)
}

/// Rounds of the reverse re-check. More than the forward verify's: a round
/// whose target changed between its two reads says nothing, and in the
/// rollback window the application rewrites the items it works on.
const REVERSE_ROUNDS: usize = 12;

/// A candidate's re-check so far.
struct Open {
    cand: Candidate,
    /// The target key to read this round: where the source item, as last
    /// read, maps to.
    tk: Item,
    /// The previous round's reads and whether they differed.
    prev: Option<Reads>,
    verdict: Option<Option<Kind>>,
}

/// One round's reads of a candidate: the target, then the source.
#[derive(PartialEq)]
struct Reads {
    target: Option<Item>,
    source: Option<Item>,
}

/// Re-checks the candidates in rounds; per candidate, `None` when the
/// difference is gone, else its kind (confirmed, or `Err` unconfirmed).
///
/// Either table may be the one the application writes: the source before a
/// cutover, the target in the rollback window, each followed by its tail.
/// A round reads the target, waits until the tails have applied every write
/// up to that read, reads the source, and reads the target again: a pair in
/// sync then reads equal (the source has every target write before the
/// first read, and none after it changed the target before the second). A
/// target that changed between its two reads says nothing that round. A pair
/// still different counts only when the next round reads both sides the same
/// and different again: a rewrite A→B→A between two target reads makes a
/// difference that is not there once, not twice.
async fn recheck_all(
    s: &Shared,
    cands: Vec<Candidate>,
    opts: &VerifyOptions,
) -> anyhow::Result<Vec<Result<Option<Kind>, String>>> {
    let mut open: Vec<Open> = cands
        .into_iter()
        .map(|c| Open {
            tk: c.target_key.clone().unwrap_or_default(),
            cand: c,
            prev: None,
            verdict: None,
        })
        .collect();
    let (sn, tn) = (s.plan.source_key.names(), s.plan.target_key.names());
    let mut tail = true;
    for _round in 0..REVERSE_ROUNDS {
        let live: Vec<usize> = (0..open.len())
            .filter(|&i| open[i].verdict.is_none())
            .collect();
        if live.is_empty() {
            break;
        }
        let tkeys: Vec<Item> = live.iter().map(|&i| open[i].tk.clone()).collect();
        let targets = get(s, &s.plan.target_table, &tn, &tkeys).await?;
        if tail {
            let through = Utc::now() + MARGIN;
            match wait_for_tail(
                &opts.state_dir,
                through,
                opts.recheck_timeout,
                opts.stale_after,
            )
            .await
            {
                TailWait::CaughtUp => {}
                TailWait::NoTail => tail = false,
                // Those still open cannot be settled.
                TailWait::Behind(why) => return Ok(unconfirmed_all(open, &why)),
            }
        }
        let skeys: Vec<Item> = live
            .iter()
            .map(|&i| open[i].cand.source_key.clone())
            .collect();
        let sources = get(s, &s.plan.source_table, &sn, &skeys).await?;
        // The target again: a source read between two equal target reads
        // is judged against them; a target that changed in between says
        // nothing this round.
        let again = match tail {
            true => Some(get(s, &s.plan.target_table, &tn, &tkeys).await?),
            false => None,
        };
        for i in live {
            let o = &mut open[i];
            let code = encode_key(&o.tk, &tn);
            if let Some(again) = &again
                && code.as_ref().and_then(|k| again.get(k))
                    != code.as_ref().and_then(|k| targets.get(k))
            {
                o.prev = None;
                continue;
            }
            let reads = Reads {
                target: code.and_then(|k| targets.get(&k).cloned()),
                source: encode_key(&o.cand.source_key, &sn).and_then(|k| sources.get(&k).cloned()),
            };
            // Where the source item maps to now: read there next round.
            if let Some(Outcome::Put { item, .. }) =
                reads.source.as_ref().map(|i| transform(&s.plan, i))
            {
                let tk = key_of(&item, &tn);
                if tk != o.tk {
                    o.tk = tk;
                    o.prev = None;
                    continue;
                }
            }
            let Some(kind) = compare(&s.plan, &reads) else {
                o.verdict = Some(None);
                continue;
            };
            if !tail || o.prev.as_ref() == Some(&reads) {
                o.verdict = Some(Some(kind));
            } else {
                o.prev = Some(reads);
            }
        }
    }
    Ok(unconfirmed_all(
        open,
        "both tables kept changing during the re-check",
    ))
}

/// The verdicts, `why` for those without one.
fn unconfirmed_all(open: Vec<Open>, why: &str) -> Vec<Result<Option<Kind>, String>> {
    open.into_iter()
        .map(|o| o.verdict.ok_or_else(|| why.to_string()))
        .collect()
}

/// What one round's reads say: `None` when source == inverse(target).
fn compare(plan: &Plan, reads: &Reads) -> Option<Kind> {
    let inverter = Inverter::new(plan);
    match (&reads.source, &reads.target) {
        (None, None) => None,
        (Some(s), None) => match transform(plan, s) {
            Outcome::Put { .. } => Some(Kind::Orphan),
            _ => None,
        },
        (None, Some(t)) => match inverter.invert(t) {
            InverseOutcome::Put { .. } => Some(Kind::Missing),
            _ => None,
        },
        (Some(s), Some(t)) => match inverter.invert(t) {
            InverseOutcome::Put { item, .. } if item == *s => None,
            _ => Some(Kind::Different),
        },
    }
}

/// The attributes of `item` named in `names`: its key.
fn key_of(item: &Item, names: &[&str]) -> Item {
    names
        .iter()
        .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
        .collect()
}
