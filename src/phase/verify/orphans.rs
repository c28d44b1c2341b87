//! The backward pass: every target item must map back to a source item;
//! without `source_key_prefix`, a second pass over the source under a stream
//! watch ("Orphans without the prefix").

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;

use crate::aws::scan::Page;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::state::StoreBatch;
use crate::state::snapshot::Counts;

use super::forward::{Side, scan_pass};
use super::ledger::seg_key;
use super::recheck::{Verdict, Watcher, next_candidates, tally_orphan};
use super::{
    Ctx, Kind, MARGIN, MAX_ROUNDS, MM, Mismatch, Named, OCAND, OWNER, TOUCHED, TailWait, hex,
    key_item, ms_to_time, now_ms, seg_state,
};

// ---- backward -----------------------------------------------------------------

pub(super) async fn backward(ctx: &Arc<Ctx>, segments: u32) -> anyhow::Result<()> {
    scan_pass(ctx, "bwd", Side::Target, segments, |ctx, page| async move {
        backward_page(&ctx, page).await
    })
    .await
}

pub(super) async fn backward_page(ctx: &Ctx, page: Page) -> anyhow::Result<()> {
    let (delta, cands) = compare_backward(ctx, &page).await?;
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let mut l = ctx.ledger.lock().await;
    let mut batch = StoreBatch::default();
    for m in cands {
        if let Some(sk) = m.source_key.as_ref().and_then(|k| encode_key(k, &sn)) {
            // The item it names: the re-check's watch counts writes to it.
            batch.put(&format!("{OWNER}{}", hex(&sk)), &true)?;
        }
        let tk = m
            .target_key
            .as_ref()
            .and_then(|k| encode_key(k, &tn))
            .unwrap_or_default();
        batch.put(&format!("{OCAND}{}", hex(&tk)), &m)?;
    }
    batch.put(&seg_key("bwd", page.segment), &seg_state(&page))?;
    l.commit(batch, &delta)
}

/// One target page judged: its counters (orphan candidates
/// `pending_orphans`) and the candidates. Without `source_key_prefix` it
/// reads the local index of expected keys the forward pass built.
pub(super) async fn compare_backward(
    ctx: &Ctx,
    page: &Page,
) -> anyhow::Result<(Counts, Vec<Mismatch>)> {
    *ctx.rcu_tgt.lock().await += page.consumed;
    let found_at = now_ms();
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let mut delta = Counts {
        target_scanned: page.items.len() as u64 + page.unreadable,
        // An item this SDK cannot read is not judged an orphan: nothing is known of it.
        target_matched: page.unreadable,
        ..Default::default()
    };
    // Named (the prefix, the inverse): map each target item back to its
    // source item.
    let mut maps_back: HashMap<Vec<u8>, bool> = HashMap::new();
    let named = if ctx.names_sources() {
        ctx.named_sources(&page.items.iter().collect::<Vec<_>>())
    } else {
        Vec::new()
    };
    if ctx.names_sources() {
        let keys: Vec<Item> = named.iter().filter_map(Named::key).cloned().collect();
        let sources = ctx.get(false, &keys, false).await?;
        for (t, n) in page.items.iter().zip(&named) {
            let tk = encode_key(t, &tn).unwrap_or_default();
            let ok = n
                .key()
                .and_then(|k| encode_key(k, &sn))
                .and_then(|k| sources.get(&k))
                .is_some_and(|s| {
                    matches!(transform(&ctx.plan, s), Outcome::Put { item, .. }
                        if encode_key(&item, &tn).as_ref() == Some(&tk))
                });
            maps_back.insert(tk, ok);
        }
    }
    let mut cands = Vec::new();
    for (i, t) in page.items.iter().enumerate() {
        let tk = encode_key(t, &tn).unwrap_or_default();
        let expected = match maps_back.get(&tk) {
            Some(ok) => *ok,
            None => ctx.ledger.lock().await.expected.owner(&tk)?.is_some(),
        };
        if expected {
            delta.target_matched += 1;
            continue;
        }
        delta.pending_orphans += 1;
        cands.push(Mismatch {
            kind: Kind::Orphan,
            suspected: None,
            source_key: named.get(i).and_then(Named::key).cloned(),
            target_key: Some(key_item(t, &tn)),
            attributes: Vec::new(),
            reason: None,
            found_at_ms: found_at,
        });
    }
    Ok((delta, cands))
}

/// Without the prefix, the orphan re-check is a second pass over the source
/// that only computes target keys: every candidate some source item maps to
/// is resolved (the candidate set is sorted on disk; each computed key is
/// looked up in it). A stream watch runs from before the pass until the
/// candidates are settled, to see items that moved while the pass ran.
pub(super) async fn orphan_pass(ctx: &Arc<Ctx>, segments: u32) -> anyhow::Result<()> {
    if ctx.ledger.lock().await.counts.pending_orphans == 0 {
        return Ok(());
    }
    {
        // A pass cut short by a restart lost its watch: start over.
        let l = ctx.ledger.lock().await;
        l.store.remove_prefix("verify/p2/")?;
        l.store.remove_prefix(TOUCHED)?;
        l.store.flush()?;
    }
    let watcher = Watcher::start(ctx).await?;
    scan_pass(ctx, "p2", Side::Source, segments, |ctx, page| async move {
        *ctx.rcu_src.lock().await += page.consumed;
        let tn = ctx.tgt_names();
        let mut l = ctx.ledger.lock().await;
        let mut batch = StoreBatch::default();
        let mut delta = Counts::default();
        let mut seen = std::collections::HashSet::new();
        for item in &page.items {
            if let Outcome::Put { item: out, .. } = transform(&ctx.plan, item) {
                let key = format!("{OCAND}{}", hex(&encode_key(&out, &tn).unwrap_or_default()));
                if seen.insert(key.clone()) && l.store.contains(&key)? {
                    batch.remove(&key);
                    delta.pending_orphans = delta.pending_orphans.wrapping_sub(1);
                    delta.target_matched += 1;
                    delta.resolved += 1;
                }
            }
        }
        batch.put(&seg_key("p2", page.segment), &seg_state(&page))?;
        l.commit(batch, &delta)
    })
    .await?;
    // The pass is over: candidates still open were read while the pass ran.
    {
        let l = ctx.ledger.lock().await;
        l.store.put("verify/p2_end_ms", &now_ms())?;
        l.store.flush()?;
    }
    recheck_orphans_all(ctx, watcher.as_ref()).await?;
    if let Some(w) = watcher {
        w.stop().await;
    }
    Ok(())
}

/// An owner of an orphan candidate as one round read it (None: absent), with
/// the writes the watch had seen to it before the read.
pub(super) type OwnerRead = (Option<Item>, Option<u64>);

/// Settle orphan candidates, round by round after the tail has caught up:
/// read the target item (gone: resolved), then the source items that could
/// own it — with the prefix, the one it names; without it, those the stream
/// watch saw map to this key since before the second pass (none: an orphan,
/// docs/verify.md). One that maps to this key resolves it; otherwise it is
/// confirmed once two rounds read the same sources.
pub(super) async fn recheck_orphans_all(
    ctx: &Ctx,
    watcher: Option<&Watcher>,
) -> anyhow::Result<()> {
    loop {
        let batch = next_candidates(ctx, OCAND).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let verdicts = decide_orphans(ctx, watcher, &batch).await?;
        commit_verdicts(ctx, batch, verdicts).await?;
    }
}

/// The re-check of one batch of orphan candidates (key, candidate): a
/// verdict for each, None when still undecided after the last round.
pub(super) async fn decide_orphans(
    ctx: &Ctx,
    watcher: Option<&Watcher>,
    batch: &[(String, Mismatch)],
) -> anyhow::Result<Vec<Option<Verdict>>> {
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let named = ctx.names_sources();
    {
        let mut through = batch
            .iter()
            .map(|(_, m)| m.found_at_ms)
            .max()
            .map_or_else(Utc::now, ms_to_time)
            + MARGIN;
        if !named {
            let end: Option<i64> = ctx.ledger.lock().await.store.get("verify/p2_end_ms")?;
            through = through.max(end.map_or_else(Utc::now, ms_to_time) + MARGIN);
        }
        let mut verdicts: Vec<Option<Verdict>> = batch.iter().map(|_| None).collect();
        // Per candidate, its owners as the previous round read them, with the
        // writes the watch had seen to each (same twice: nothing changed).
        let mut prev: Vec<Option<Vec<OwnerRead>>> = batch.iter().map(|_| None).collect();
        let mut tail = true;
        for _round in 0..MAX_ROUNDS {
            if verdicts.iter().all(Option::is_some) {
                break;
            }
            if tail {
                match ctx.wait_tail(through).await {
                    TailWait::CaughtUp => {}
                    TailWait::NoTail => tail = false,
                    TailWait::Behind(why) => {
                        for (v, (_, m)) in verdicts.iter_mut().zip(batch) {
                            if v.is_none() {
                                *v = Some(Verdict::Unconfirmed(m.clone(), why.clone()));
                            }
                        }
                        break;
                    }
                }
            }
            let live: Vec<usize> = (0..batch.len())
                .filter(|&i| verdicts[i].is_none())
                .collect();
            let tkeys: Vec<Item> = live
                .iter()
                .map(|&i| batch[i].1.target_key.clone().unwrap_or_default())
                .collect();
            let targets = ctx.get(true, &tkeys, true).await?;
            let read_at = Utc::now() + MARGIN;
            // Who could own each target item still present (Err: the
            // inverse cannot tell).
            let mut owners: Vec<Option<Owners>> = vec![None; live.len()];
            let mut watch_behind = None;
            if let Some(w) = watcher
                && let Err(why) = w.wait(read_at, ctx.opts.recheck_timeout).await
            {
                ctx.note(why.clone());
                watch_behind = Some(why);
            }
            owners_of(ctx, watcher, &tkeys, &targets, &mut owners).await?;
            let skeys: Vec<Item> = owners
                .iter()
                .flatten()
                .filter_map(|o| o.as_ref().ok())
                .flatten()
                .cloned()
                .collect();
            // As in the forward re-check: writes seen to each owner before it is read.
            let seen: HashMap<Vec<u8>, u64> = if watcher.is_some() && watch_behind.is_none() {
                let counts = ctx.ledger.lock().await.writes(&skeys, &sn)?;
                skeys
                    .iter()
                    .map(|k| encode_key(k, &sn).unwrap_or_default())
                    .zip(counts)
                    .collect()
            } else {
                HashMap::new()
            };
            let sources = if skeys.is_empty() {
                HashMap::new()
            } else {
                ctx.get(false, &skeys, true).await?
            };
            // The next round waits for the tail to pass these reads.
            through = Utc::now() + MARGIN;
            for (n, &i) in live.iter().enumerate() {
                let tk = encode_key(&tkeys[n], &tn).unwrap_or_default();
                let Some(owners) = &owners[n] else {
                    verdicts[i] = Some(Verdict::Resolved);
                    continue;
                };
                let mut m = batch[i].1.clone();
                let owners = match (owners, &watch_behind) {
                    (_, Some(why)) | (Err(why), None) => {
                        verdicts[i] = Some(Verdict::Unconfirmed(m, why.clone()));
                        continue;
                    }
                    (Ok(owners), None) => owners,
                };
                let srcs: Vec<OwnerRead> = owners
                    .iter()
                    .map(|k| {
                        let k = encode_key(k, &sn).unwrap_or_default();
                        (sources.get(&k).cloned(), seen.get(&k).copied())
                    })
                    .collect();
                let maps = srcs.iter().filter_map(|(s, _)| s.as_ref()).any(|s| {
                    matches!(transform(&ctx.plan, s), Outcome::Put { item, .. }
                        if encode_key(&item, &tn).as_ref() == Some(&tk))
                });
                if maps {
                    verdicts[i] = Some(Verdict::Resolved);
                } else if owners.is_empty() || !tail || prev[i].as_ref() == Some(&srcs) {
                    if named {
                        m.source_key = owners.first().cloned();
                    }
                    verdicts[i] = Some(Verdict::Confirmed(m));
                } else {
                    prev[i] = Some(srcs);
                }
            }
        }
        Ok(verdicts)
    }
}

/// Counts and records one batch's verdicts; a candidate still undecided
/// after the last round is unconfirmed.
async fn commit_verdicts(
    ctx: &Ctx,
    batch: Vec<(String, Mismatch)>,
    verdicts: Vec<Option<Verdict>>,
) -> anyhow::Result<()> {
    let mut delta = Counts::default();
    let mut b = StoreBatch::default();
    for ((key, m), v) in batch.into_iter().zip(verdicts) {
        b.remove(&key);
        delta.pending_orphans = delta.pending_orphans.wrapping_sub(1);
        let id = format!("{MM}o{}", &key[OCAND.len()..]);
        if let Some(m) = tally_orphan(v, m, &mut delta) {
            b.put(&id, &m)?;
        }
    }
    ctx.ledger.lock().await.commit(b, &delta)?;
    Ok(())
}

/// The source keys that could own a target item, or why that cannot be told.
type Owners = Result<Vec<Item>, String>;

/// Who could own each target item still present (None: the item is gone).
async fn owners_of(
    ctx: &Ctx,
    watcher: Option<&Watcher>,
    tkeys: &[Item],
    targets: &HashMap<Vec<u8>, Item>,
    owners: &mut [Option<Owners>],
) -> anyhow::Result<()> {
    let tn = ctx.tgt_names();
    let present: Vec<(usize, &Item)> = tkeys
        .iter()
        .enumerate()
        .filter_map(|(n, k)| Some((n, targets.get(&encode_key(k, &tn)?)?)))
        .collect();
    if ctx.names_sources() {
        // The items name their sources: read back all at once (one inverse).
        let items: Vec<&Item> = present.iter().map(|(_, t)| *t).collect();
        for ((n, _), named) in present.iter().zip(ctx.named_sources(&items)) {
            owners[*n] = Some(match named {
                Named::Source(k) => Ok(vec![k]),
                Named::Unreadable(why) => Err(why),
                Named::Nothing => Ok(Vec::new()),
            });
        }
        return Ok(());
    }
    for (n, _) in present {
        let k = &tkeys[n];
        owners[n] = if watcher.is_some() {
            let tk = encode_key(k, &tn).unwrap_or_default();
            let l = ctx.ledger.lock().await;
            Some(Ok(l
                .store
                .scan_prefix::<Item>(&format!("{TOUCHED}{}/", hex(&tk)))?
                .into_iter()
                .map(|(_, sk)| sk)
                .collect()))
        } else {
            // No stream, so no tail and no live writes: the pass was exact.
            Some(Ok(Vec::new()))
        };
    }
    Ok(())
}
