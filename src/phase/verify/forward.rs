//! The forward pass: every source item's transform, fetched from the target
//! and compared; differences become candidates for the re-check.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::aws::scan::{self, Page};
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::state::StoreBatch;
use crate::state::snapshot::Counts;

use super::ledger::seg_key;
use super::{
    CAND, Ctx, Kind, Mismatch, differing_attributes, hex, kept_source_key, key_item, now_ms,
    sampled, scan_opts, seg_state,
};

// ---- forward ------------------------------------------------------------------

/// Which table a pass scans.
#[derive(Clone, Copy)]
pub(super) enum Side {
    Source,
    Target,
}

/// One Scan pass, resumed from its checkpoints (`verify/<pass>/…`), each page
/// handed to `on_page` (which commits the page's checkpoint).
pub(super) async fn scan_pass<F, Fut>(
    ctx: &Arc<Ctx>,
    pass: &str,
    side: Side,
    segments: u32,
    on_page: F,
) -> anyhow::Result<()>
where
    F: Fn(Arc<Ctx>, Page) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let starts = ctx.starts(pass, segments).await?;
    let (table, control) = match side {
        Side::Source => (&ctx.plan.source_table, ctx.src.clone()),
        Side::Target => (&ctx.plan.target_table, ctx.tgt.clone()),
    };
    let c = ctx.clone();
    scan::scan(
        &ctx.clients,
        &scan_opts(ctx, table, segments),
        starts,
        control,
        &ctx.stop,
        move |page: Page| on_page(c.clone(), page),
    )
    .await
}

pub(super) async fn forward(ctx: &Arc<Ctx>, segments: u32) -> anyhow::Result<()> {
    scan_pass(ctx, "fwd", Side::Source, segments, |ctx, page| async move {
        forward_page(&ctx, page).await
    })
    .await
}

pub(super) struct Expected {
    pub(super) sk: Vec<u8>,
    pub(super) tk: Vec<u8>,
    pub(super) source_key: Item,
    pub(super) item: Item,
}

pub(super) async fn forward_page(ctx: &Ctx, page: Page) -> anyhow::Result<()> {
    let (delta, cands) = compare_forward(ctx, &page).await?;
    let sn = ctx.src_names();
    let mut l = ctx.ledger.lock().await;
    let mut batch = StoreBatch::default();
    for m in cands {
        let sk = m
            .source_key
            .as_ref()
            .and_then(|k| encode_key(k, &sn))
            .unwrap_or_default();
        batch.put(&format!("{CAND}{}", hex(&sk)), &m)?;
    }
    batch.put(&seg_key("fwd", page.segment), &seg_state(&page))?;
    ctx.this_run.fetch_add(delta.scanned, Ordering::Relaxed);
    l.commit(batch, &delta)
}

/// One source page compared: its counters (candidates `pending`) and the
/// candidates, for the local ledger or a fleet unit to keep.
pub(super) async fn compare_forward(
    ctx: &Ctx,
    page: &Page,
) -> anyhow::Result<(Counts, Vec<Mismatch>)> {
    *ctx.rcu_src.lock().await += page.consumed;
    let found_at = now_ms();
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let mut delta = Counts {
        scanned: page.items.len() as u64 + page.unreadable,
        rejected: page.unreadable,
        ..Default::default()
    };
    let mut puts = Vec::new();
    for item in &page.items {
        let sk = encode_key(item, &sn).unwrap_or_default();
        if let Some(p) = ctx.sample
            && !sampled(&sk, p)
        {
            delta.unsampled += 1;
            continue;
        }
        match transform(&ctx.plan, item) {
            Outcome::Put { item: out, .. } => puts.push(Expected {
                sk,
                tk: encode_key(&out, &tn).unwrap_or_default(),
                source_key: key_item(item, &sn),
                item: out,
            }),
            Outcome::Reject(_) => delta.rejected += 1,
            Outcome::Skip => delta.skipped += 1,
        }
    }
    let keys: Vec<Item> = puts.iter().map(|e| key_item(&e.item, &tn)).collect();
    let got = ctx.get(true, &keys, false).await?;

    // With source_key_prefix the target item names its writer. A target item
    // written from another source item that maps to the same key is a
    // collision (the backfill rejected one of the two), not a difference.
    let mut owners: HashMap<Vec<u8>, bool> = HashMap::new();
    if ctx.plan.source_key_prefix.is_some() {
        let others: Vec<Item> = puts
            .iter()
            .filter_map(|e| {
                let t = got.get(&e.tk)?;
                kept_source_key(&ctx.plan, t).filter(|k| *k != e.source_key)
            })
            .collect();
        if !others.is_empty() {
            let sources = ctx.get(false, &others, true).await?;
            for (sk, it) in sources {
                let maps = matches!(transform(&ctx.plan, &it), Outcome::Put { item, .. }
                    if puts.iter().any(|e| Some(&e.tk) == encode_key(&item, &tn).as_ref()));
                owners.insert(sk, maps);
            }
        }
    }

    // Without the prefix: the first source item to claim a target key owns it.
    // Claims are durable before the page's checkpoint (claims.rs), so a
    // redone page re-claims with the same owners.
    let others: Vec<bool> = if ctx.track_expected {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            puts.iter().map(|e| (e.tk.clone(), e.sk.clone())).collect();
        let expected = ctx.ledger.lock().await.expected.clone();
        let claimed = expected.claim_durably(pairs).await?;
        claimed.owners.into_iter().map(|o| o.is_some()).collect()
    } else {
        Vec::new()
    };
    let mut cands = Vec::new();
    for (i, e) in puts.into_iter().enumerate() {
        let target = got.get(&e.tk);
        let collision = if ctx.track_expected {
            others[i]
        } else {
            target
                .and_then(|t| kept_source_key(&ctx.plan, t))
                .filter(|k| *k != e.source_key)
                .and_then(|k| encode_key(&k, &sn))
                .is_some_and(|k| owners.get(&k).copied().unwrap_or(false))
        };
        if collision {
            delta.rejected += 1;
            delta.collisions += 1;
            continue;
        }
        let (kind, attributes) = match target {
            Some(t) if *t == e.item => {
                delta.matched += 1;
                continue;
            }
            Some(t) => (Kind::Different, differing_attributes(&e.item, t)),
            None => (Kind::Missing, Vec::new()),
        };
        delta.pending += 1;
        cands.push(Mismatch {
            kind,
            suspected: None,
            source_key: Some(e.source_key),
            target_key: Some(key_item(&e.item, &tn)),
            attributes,
            reason: None,
            found_at_ms: found_at,
        });
    }
    Ok((delta, cands))
}
