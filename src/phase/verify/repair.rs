//! `--repair`: rewrite missing and different items from their source, delete
//! orphans, and re-verify exactly those keys.

use crate::aws::item::GET_BATCH;
use crate::aws::write::write_batch;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};

use super::recheck::{Verdict, recheck_forward, unconfirmed};
use super::report::{EXAMPLES, example};
use super::{Ctx, Kind, MM, Mismatch, RepairReport, now_ms};

// ---- repair -------------------------------------------------------------------

/// Rewrite missing and different items from a fresh consistent read of their
/// source, delete orphans, then re-verify exactly those keys. Walks the
/// recorded mismatches a chunk at a time: memory does not grow with them.
pub(super) async fn repair(ctx: &Ctx) -> anyhow::Result<RepairReport> {
    let mut report = RepairReport::default();
    let mut after = MM.to_string();
    loop {
        let chunk: Vec<(String, Mismatch)> = ctx
            .ledger
            .lock()
            .await
            .store
            .chunk_after(MM, &after, GET_BATCH)?;
        let Some((last, _)) = chunk.last() else {
            return Ok(report);
        };
        after = last.clone();
        let (mut forward, mut orphans) = (Vec::new(), Vec::new());
        for (_, m) in chunk {
            match m.kind {
                Kind::Missing | Kind::Different => forward.push(m),
                Kind::Orphan => orphans.push(m),
                // Not settled: repairing on a guess could undo the tail's work.
                Kind::Unconfirmed => {}
            }
        }
        repair_chunk(ctx, &forward, &orphans, &mut report).await?;
    }
}

pub(super) async fn repair_chunk(
    ctx: &Ctx,
    forward: &[Mismatch],
    orphans: &[Mismatch],
    report: &mut RepairReport,
) -> anyhow::Result<()> {
    let (sn, tn) = (ctx.src_names(), ctx.tgt_names());
    let skeys: Vec<Item> = forward
        .iter()
        .filter_map(|m| m.source_key.clone())
        .collect();
    let sources = ctx.get(false, &skeys, true).await?;
    let mut items = Vec::new();
    for k in &skeys {
        match encode_key(k, &sn)
            .and_then(|k| sources.get(&k))
            .map(|s| transform(&ctx.plan, s))
        {
            Some(Outcome::Put { item, .. }) => items.push(item),
            _ => report.skipped += 1,
        }
    }
    for batch in items.chunks(crate::aws::write::BATCH) {
        let r = write_batch(
            &ctx.clients,
            &ctx.plan.target_table,
            batch,
            &ctx.tgt,
            ctx.opts.max_retries,
        )
        .await?;
        report.rewritten += r.refused.iter().filter(|x| x.is_none()).count() as u64;
    }
    for m in orphans {
        let Some(key) = &m.target_key else { continue };
        loop {
            let _in_flight = ctx.tgt.wait_write().await;
            match crate::aws::item::delete_item(&ctx.clients, &ctx.plan.target_table, key).await {
                Ok(()) => {
                    report.deleted += 1;
                    break;
                }
                Err(e) if e.is_throttle() => ctx.tgt.write_throttled(&e, 2).await,
                Err(e) => return Err(e.into()),
            }
        }
    }
    // Re-verify exactly those keys, with the same re-check rule (a write
    // DynamoDB refused shows up here as still different).
    let now = now_ms();
    let fresh: Vec<Mismatch> = forward
        .iter()
        .map(|m| Mismatch {
            found_at_ms: now,
            ..m.clone()
        })
        .collect();
    let mut still: Vec<Mismatch> = Vec::new();
    for v in recheck_forward(ctx, fresh, None).await? {
        match v {
            Verdict::Resolved => {}
            Verdict::Confirmed(m) => still.push(m),
            Verdict::Unconfirmed(m, why) => still.push(unconfirmed(m, why)),
        }
    }
    let keys: Vec<Item> = orphans
        .iter()
        .filter_map(|m| m.target_key.clone())
        .collect();
    let present = ctx.get(true, &keys, true).await?;
    for m in orphans {
        if m.target_key
            .as_ref()
            .and_then(|k| encode_key(k, &tn))
            .is_some_and(|k| present.contains_key(&k))
        {
            still.push(m.clone());
        }
    }
    report.still_different += still.len() as u64;
    for m in still {
        if report.examples.len() < EXAMPLES {
            report.examples.push(example(&m));
        }
    }
    Ok(())
}
