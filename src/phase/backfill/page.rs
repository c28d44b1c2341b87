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
    items: Vec<Item>,
    direction: Option<Direction>,
) -> anyhow::Result<(Counters, Vec<(Item, String)>)> {
    if plan.mode == Mode::InPlace {
        let Put::Table(writer) = put else {
            anyhow::bail!("in place, items are updated in the table, never imported");
        };
        let direction = direction.unwrap_or(Direction::Forward);
        return process_page_in_place(writer, plan, &items, direction).await;
    }
    let mut page = transform_page(plan, items);
    // Claims commit in memory now and on disk before this page's checkpoint
    // (claims.rs); the ledger is not held meanwhile, so other pages' claims
    // share the durable commit. A plan that cannot collide claims nothing.
    let claims = ledger.lock().await.claims.clone();
    let ticket = match &claims {
        Some(claims) => {
            let Claimed {
                pairs,
                owners,
                ticket,
            } = claims.claim_all(page.claim_keys(plan)).await?;
            page.keep_owned(&pairs, owners);
            Some(ticket)
        }
        None => None,
    };
    let refusals = match put {
        Put::Table(writer) => writer.write(&page.puts).await?,
        Put::Import(sink, stream) => sink.add(ledger, plan, stream, &page.puts).await?,
    };
    let done = page.written(refusals);
    if let (Some(claims), Some(ticket)) = (&claims, ticket) {
        claims.durable(ticket).await?;
    }
    Ok(done)
}

/// A page after the transform: counters of its rejects and skips, the
/// rejects, and the target items still to write beside what each took from
/// its source item (a collision or a refusal rejects the source item, given
/// back whole by [`Remnant::restore`]). The backfill and the fleet's worker
/// both go through it; they differ only in where target keys are claimed
/// and how the items are written.
pub(super) struct Transformed<'p> {
    c: Counters,
    rejects: Vec<(Item, String)>,
    pub(super) puts: Vec<Item>,
    remnants: Vec<Remnant<'p>>,
}

/// The page's items are the page's: the target items are built from them,
/// moved rather than copied ([`transform_owned`]).
pub(super) fn transform_page(plan: &Plan, items: Vec<Item>) -> Transformed<'_> {
    let mut t = Transformed {
        c: Counters {
            scanned: items.len() as u64,
            ..Default::default()
        },
        rejects: Vec::new(),
        puts: Vec::with_capacity(items.len()),
        remnants: Vec::with_capacity(items.len()),
    };
    for item in items {
        match transform_owned(plan, item) {
            Owned::Put {
                item: out, remnant, ..
            } => {
                t.puts.push(out);
                t.remnants.push(remnant);
            }
            Owned::Reject(r, source) => {
                t.c.rejected += 1;
                t.rejects.push((source, r.to_string()));
            }
            Owned::Skip => t.c.skipped += 1,
        }
    }
    t
}

impl Transformed<'_> {
    /// `(encoded target key, encoded source key)` of each item to write.
    pub(super) fn claim_keys(&self, plan: &Plan) -> Vec<Claim> {
        let (target, source) = (plan.target_key.names(), plan.source_key.names());
        self.puts
            .iter()
            .zip(&self.remnants)
            .map(|(out, rem)| {
                let key: Item = source
                    .iter()
                    .filter_map(|n| rem.source_value(out, n).map(|v| (n.to_string(), v.clone())))
                    .collect();
                (
                    encode_key(out, &target).unwrap_or_default(),
                    encode_key(&key, &source).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Keeps the items whose target key this page owns (`None`); the others
    /// are collisions, rejected with both keys named.
    pub(super) fn keep_owned(&mut self, keys: &[Claim], owners: Owners) {
        let puts = std::mem::take(&mut self.puts);
        let remnants = std::mem::take(&mut self.remnants);
        for (((out, rem), (tk, _)), owner) in puts.into_iter().zip(remnants).zip(keys).zip(owners) {
            match owner {
                None => {
                    self.puts.push(out);
                    self.remnants.push(rem);
                }
                Some(other) => {
                    self.c.rejected += 1;
                    self.c.collisions += 1;
                    self.rejects.push((rem.restore(out), collision(tk, &other)));
                }
            }
        }
    }

    /// The page's counters and rejects once its writes answered (per item
    /// written, `None`, or why DynamoDB refused it).
    pub(super) fn written(
        mut self,
        refusals: Vec<Option<String>>,
    ) -> (Counters, Vec<(Item, String)>) {
        let items = self.puts.into_iter().zip(self.remnants);
        for (refused, (out, rem)) in refusals.into_iter().zip(items) {
            match refused {
                None => self.c.written += 1,
                Some(reason) => {
                    self.c.rejected += 1;
                    self.rejects.push((rem.restore(out), reason));
                }
            }
        }
        (self.c, self.rejects)
    }
}

/// The reject reason of a source item whose target key `tk` another source
/// item (`owner`, encoded) claimed first: one wording, on one machine or many.
fn collision(tk: &[u8], owner: &[u8]) -> String {
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
            let _slot = writer.slot().await;
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
