//! One page: transform, claim the target keys, write; or, in place, the
//! conditional UpdateItem of each item that needs one.

use super::*;

/// Where a page's target items go: the target table (BatchWriteItem), or,
/// with `--via-import`, the open S3 object of the page's stream.
#[derive(Clone, Copy)]
pub(super) enum Put<'a> {
    Table(&'a Writer),
    Import(&'a ImportSink, &'a str),
}

/// Transform, claim and write one page's items; returns its counters and rejects.
pub(super) async fn process_page(
    put: Put<'_>,
    ledger: &Mutex<Ledger>,
    plan: &Plan,
    items: &[Item],
    direction: Option<Direction>,
) -> anyhow::Result<(Counters, Vec<(Item, String)>)> {
    if plan.mode == Mode::InPlace {
        let Put::Table(writer) = put else {
            anyhow::bail!("in place, items are updated in the table, never imported");
        };
        let direction = direction.unwrap_or(Direction::Forward);
        return process_page_in_place(writer, plan, items, direction).await;
    }
    let mut c = Counters {
        scanned: items.len() as u64,
        ..Default::default()
    };
    let mut rejects = Vec::new();
    let mut puts = Vec::new();
    let mut sources = Vec::new();
    let mut pairs = Vec::new();
    let target_names = plan.target_key.names();
    let source_names = plan.source_key.names();
    let claims = ledger.lock().await.claims.clone();
    for item in items {
        match transform(plan, item) {
            Outcome::Put { item: out, .. } => {
                if claims.is_some() {
                    let tk = encode_key(&out, &target_names).unwrap_or_default();
                    let sk = encode_key(item, &source_names).unwrap_or_default();
                    pairs.push((tk, sk));
                }
                puts.push(out);
                sources.push(item);
            }
            Outcome::Reject(r) => {
                c.rejected += 1;
                rejects.push((item.clone(), r.to_string()));
            }
            Outcome::Skip => c.skipped += 1,
        }
    }
    // Claims commit in memory now and on disk before this page's checkpoint
    // (claims.rs); the ledger is not held meanwhile, so other pages' claims
    // share the durable commit. A plan that cannot collide claims nothing.
    let (pairs, owners, ticket) = match &claims {
        Some(claims) => {
            let Claimed {
                pairs,
                owners,
                ticket,
            } = claims.claim_all(pairs).await?;
            (pairs, owners, Some(ticket))
        }
        None => (
            vec![(Vec::new(), Vec::new()); puts.len()],
            vec![None; puts.len()],
            None,
        ),
    };
    let mut claimed = (Vec::new(), Vec::new());
    for (((out, src), (tk, _)), owner) in puts.into_iter().zip(sources).zip(&pairs).zip(owners) {
        match owner {
            None => {
                claimed.0.push(out);
                claimed.1.push(src);
            }
            Some(other) => {
                c.rejected += 1;
                c.collisions += 1;
                rejects.push((src.clone(), collision(tk, &other)));
            }
        }
    }
    let (puts, sources) = claimed;
    let refusals = match put {
        Put::Table(writer) => writer.write(puts).await?,
        Put::Import(sink, stream) => sink.add(ledger, plan, stream, puts).await?,
    };
    for (refused, src) in refusals.into_iter().zip(sources) {
        match refused {
            None => c.written += 1,
            Some(reason) => {
                c.rejected += 1;
                rejects.push((src.clone(), reason));
            }
        }
    }
    if let (Some(claims), Some(ticket)) = (&claims, ticket) {
        claims.durable(ticket).await?;
    }
    Ok((c, rejects))
}

/// The reject reason of a source item whose target key `tk` another source
/// item (`owner`, encoded) claimed first: one wording, on one machine or many.
pub(super) fn collision(tk: &[u8], owner: &[u8]) -> String {
    format!(
        "collision: target key {} already belongs to source item {} — never overwritten",
        decode_key(tk).join(" / "),
        decode_key(owner).join(" / ")
    )
}

/// In place: one conditional UpdateItem per item that needs one (see
/// [`crate::phase::inplace`]), `concurrency` at a time. Items already right, unmatched,
/// or deleted before rekey could write them are skipped.
pub(super) async fn process_page_in_place(
    writer: &Writer,
    plan: &Plan,
    items: &[Item],
    direction: Direction,
) -> anyhow::Result<(Counters, Vec<(Item, String)>)> {
    let mut c = Counters {
        scanned: items.len() as u64,
        ..Default::default()
    };
    let results: Vec<anyhow::Result<(Applied, Item)>> = stream::iter(items.to_vec())
        .map(|item| async move {
            let decision = direction.decide(plan, &item);
            if matches!(decision, inplace::Decision::Write(_)) {
                // Paced per partition key like the re-key's writes: a Scan
                // returns an item collection's items together.
                let pk = item
                    .get(&writer.pk_name)
                    .map(Value::display_text)
                    .unwrap_or_default();
                let _ = writer.per_key.until_key_n_ready(&pk, NonZeroU32::MIN).await;
            }
            let applied = inplace::apply(
                &writer.clients,
                plan,
                &writer.control,
                direction,
                decision,
                writer.max_retries,
            )
            .await?;
            Ok((applied, item))
        })
        .buffer_unordered(writer.concurrency)
        .collect()
        .await;
    let mut rejects = Vec::new();
    let mut consumed = 0.0;
    for r in results {
        match r.context("in-place write failed")? {
            (Applied::Written { consumed: u }, _) => {
                c.written += 1;
                consumed += u;
            }
            (Applied::Skipped { consumed: u }, _) => {
                c.skipped += 1;
                consumed += u;
            }
            (
                Applied::Rejected {
                    reason,
                    consumed: u,
                },
                item,
            ) => {
                c.rejected += 1;
                consumed += u;
                rejects.push((item, reason));
            }
        }
    }
    *writer.consumed_wcu.lock().await += consumed;
    Ok((c, rejects))
}
