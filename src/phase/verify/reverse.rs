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

use super::*;

use crate::core::inverse::{InverseOutcome, Inverter};

/// One difference found by a scan, to re-check.
#[derive(Debug, Clone)]
struct Candidate {
    kind: Kind,
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

/// Verify the source against inverse(target); see the module docs.
pub async fn run_reverse(
    clients: &Clients,
    plan: &Plan,
    opts: &VerifyOptions,
    progress: &Progress,
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
            stop: opts.stop.clone(),
        };
        let s = shared.clone();
        scan::scan(
            clients,
            &scan_opts,
            Vec::new(),
            shared.control(table).clone(),
            move |page| {
                let s = s.clone();
                async move { check_page(&s, page, backwards).await }
            },
        )
        .await?;
    }
    if opts.stop.is_cancelled() {
        return Err(Stopped.into());
    }
    let Found {
        mut counts,
        candidates,
    } = std::mem::take(&mut *shared.found.lock().await);
    let mut notes = Vec::new();
    let mut examples = Vec::new();
    if !candidates.is_empty() {
        let through = Utc::now() + MARGIN;
        let wait = wait_for_tail(
            &opts.state_dir,
            through,
            opts.recheck_timeout,
            opts.stale_after,
        );
        let settled = match wait.await {
            TailWait::Behind(why) => {
                notes.push(why);
                false
            }
            TailWait::CaughtUp | TailWait::NoTail => true,
        };
        for c in candidates {
            let still = if settled {
                recheck(&shared, &c).await?
            } else {
                Some(c.kind)
            };
            match (still, settled) {
                (None, _) => {
                    counts.resolved += 1;
                    counts.matched += 1;
                }
                (Some(kind), true) => {
                    match kind {
                        Kind::Orphan => counts.orphans += 1,
                        Kind::Different => counts.different += 1,
                        _ => counts.missing += 1,
                    }
                    if examples.len() < EXAMPLES {
                        examples.push(example(&mismatch(kind, &c)));
                    }
                }
                (Some(_), false) => counts.unconfirmed += 1,
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
    let key_of = |item: &Item, names: &[&str]| -> Item {
        names
            .iter()
            .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
            .collect()
    };
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
                found => delta.candidates.push(Candidate {
                    kind: if found.is_some() {
                        Kind::Different
                    } else {
                        Kind::Missing
                    },
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
                    kind: Kind::Orphan,
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

/// Read both sides again: None when the difference is gone.
async fn recheck(s: &Shared, c: &Candidate) -> anyhow::Result<Option<Kind>> {
    let plan = &s.plan;
    let (sn, tn) = (plan.source_key.names(), plan.target_key.names());
    let source = get(
        s,
        &plan.source_table,
        &sn,
        std::slice::from_ref(&c.source_key),
    )
    .await?;
    let source = source.into_values().next();
    // What the source item maps to now (else the key it was read from), and
    // what the target holds there.
    let mapped = match source.as_ref().map(|i| transform(plan, i)) {
        Some(Outcome::Put { item, .. }) => Some(item),
        _ => None,
    };
    let probe = mapped.or_else(|| c.target_key.clone());
    let target = match &probe {
        Some(k) => get(s, &plan.target_table, &tn, std::slice::from_ref(k))
            .await?
            .into_values()
            .next(),
        None => None,
    };
    let inverter = Inverter::new(plan);
    Ok(match (source, target) {
        (None, None) => None,
        (Some(_), None) => Some(Kind::Orphan),
        (None, Some(t)) => match inverter.invert(&t) {
            InverseOutcome::Put { .. } => Some(Kind::Missing),
            _ => None,
        },
        (Some(s_item), Some(t)) => match inverter.invert(&t) {
            InverseOutcome::Put { item, .. } if item == s_item => None,
            _ => Some(Kind::Different),
        },
    })
}
