//! One page: transform, claim the target keys, write; or, in place, the
//! conditional UpdateItem of each item that needs one.

use std::num::NonZeroU32;

use anyhow::Context as _;
use futures::stream::{self, StreamExt};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::core::plan::{Mode, Plan};
use crate::core::transform::{Owned, Remnant, transform_owned};
use crate::core::value::{Item, Value, decode_key, encode_key};
use crate::phase::inplace::{self, Applied, Direction};
use crate::state::claims::{Claim, Claimed, Owners};

use super::Counters;
use super::import::ImportSink;
use super::ledger::{Ledger, digest};
use super::writer::{Answer, Writer};

/// Where a page's target items go: the target table (BatchWriteItem), or,
/// with `--via-import`, the open S3 object of the page's stream.
#[derive(Clone, Copy)]
pub(super) enum Put<'a> {
    Table(&'a Writer),
    Import(&'a ImportSink, &'a str),
}

/// Transform, claim and write one page's items: what settled ([`Settled`]:
/// the whole page, or on a stop the part written).
pub(super) async fn process_page(
    put: Put<'_>,
    ledger: &Mutex<Ledger>,
    plan: &Plan,
    items: Vec<Item>,
    step: PageStep<'_>,
) -> anyhow::Result<Settled> {
    if plan.mode == Mode::InPlace {
        let Put::Table(writer) = put else {
            anyhow::bail!("in place, items are updated in the table, never imported");
        };
        let direction = step.direction.unwrap_or(Direction::Forward);
        return process_page_in_place(writer, plan, &items, direction, step).await;
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
    let answers = match put {
        Put::Table(writer) => writer.write(&page.puts, step.stop).await?,
        // An import part only buffers (its object is written at a commit):
        // nothing there waits on a rate, so its pages always finish.
        Put::Import(sink, stream) => sink
            .add(ledger, plan, stream, &page.puts)
            .await?
            .into_iter()
            .map(Answer::of_refusal)
            .collect(),
    };
    let done = page.written(plan, answers, step.room);
    if let (Some(claims), Some(ticket)) = (&claims, ticket) {
        claims.durable(ticket).await?;
    }
    Ok(done)
}

/// How one page is processed besides its items.
#[derive(Clone, Copy)]
pub(super) struct PageStep<'a> {
    /// `Some(Undo)` for `rekey undo`; in-place plans otherwise go forward.
    pub(super) direction: Option<Direction>,
    /// Cancelled: the writes not yet answered are abandoned.
    pub(super) stop: &'a CancellationToken,
    /// How many settled items a partial checkpoint may still name (its
    /// segment's checkpoint may already carry some).
    pub(super) room: usize,
}

/// Items a partial checkpoint names at most. It is one value in the store
/// (or one attribute of a fleet's unit item, under DynamoDB's 400 KB):
/// 34 bytes an item. Items beyond it are written again on resume.
pub(super) const MAX_SETTLED: usize = 4000;

/// What a page's processing settled: its counters and rejects, and, when a
/// stop came first, which items they cover.
#[derive(Debug, Default)]
pub(super) struct Settled {
    pub(super) counts: Counters,
    pub(super) rejects: Vec<(Item, String)>,
    /// None: the whole page. Some: a stop came before every write was
    /// answered; the digests ([`digest`]) of the items counted. The others
    /// are counted when the page is read again.
    pub(super) partial: Option<Vec<String>>,
}

/// One item as a stop found it: settled (its digest, and its counts), or not.
struct Tally<'a> {
    c: &'a mut Counters,
    done: &'a mut Vec<String>,
    room: usize,
}

impl Tally<'_> {
    /// Counts an item settled as `add` says, if its key is known and the
    /// checkpoint has room; whether it was counted.
    fn settle(&mut self, digest: Option<String>, add: impl FnOnce(&mut Counters)) -> bool {
        match digest {
            Some(d) if self.done.len() < self.room => {
                self.done.push(d);
                self.c.scanned += 1;
                add(self.c);
                true
            }
            _ => false,
        }
    }
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
    /// Rejects from `collisions_from` on are collisions (keep_owned's).
    collisions_from: usize,
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
        collisions_from: usize::MAX,
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
                log_reject(plan, &source, &r);
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
                let key = source_key(out, rem, &source);
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
        self.collisions_from = self.collisions_from.min(self.rejects.len());
        for (((out, rem), (tk, _)), owner) in puts.into_iter().zip(remnants).zip(keys).zip(owners) {
            match owner {
                None => {
                    self.puts.push(out);
                    self.remnants.push(rem);
                }
                Some(other) => {
                    self.c.rejected += 1;
                    self.c.collisions += 1;
                    // The contested key (`target_key`: ops::log redacts it).
                    tracing::debug!(
                        target_key = %decode_key(tk).join(" / "),
                        "item rejected: its target key belongs to another source item"
                    );
                    self.rejects.push((rem.restore(out), collision(tk, &other)));
                }
            }
        }
    }

    /// The page's counters and rejects once its writes answered (or were
    /// abandoned by a stop: then only what settled, at most `room` items).
    pub(super) fn written(self, plan: &Plan, answers: Vec<Answer>, room: usize) -> Settled {
        if answers.contains(&Answer::Unanswered) {
            return self.settled_part(plan, answers, room);
        }
        let Transformed {
            mut c,
            mut rejects,
            puts,
            remnants,
            ..
        } = self;
        for (answer, (out, rem)) in answers.into_iter().zip(puts.into_iter().zip(remnants)) {
            match answer {
                Answer::Refused(reason) => {
                    c.rejected += 1;
                    rejects.push((rem.restore(out), reason));
                }
                Answer::Written | Answer::Unanswered => c.written += 1,
            }
        }
        Settled {
            counts: c,
            rejects,
            partial: None,
        }
    }

    /// After a stop: the items that settled — rejected by the transform or
    /// a collision, written, refused — each named by its digest. Skipped
    /// items are not (their keys went with them): the re-read skips them
    /// again and counts them then.
    fn settled_part(self, plan: &Plan, answers: Vec<Answer>, room: usize) -> Settled {
        let names = plan.source_key.names();
        let (mut c, mut done, mut rejects) = (Counters::default(), Vec::new(), Vec::new());
        let mut tally = Tally {
            c: &mut c,
            done: &mut done,
            room,
        };
        for (i, (item, reason)) in self.rejects.into_iter().enumerate() {
            let collision = i >= self.collisions_from;
            if tally.settle(digest(&item, &names), |c| {
                c.rejected += 1;
                c.collisions += u64::from(collision);
            }) {
                rejects.push((item, reason));
            }
        }
        let items = self.puts.into_iter().zip(self.remnants);
        for (answer, (out, rem)) in answers.into_iter().zip(items) {
            let d = digest(&source_key(&out, &rem, &names), &names);
            match answer {
                Answer::Written => {
                    tally.settle(d, |c| c.written += 1);
                }
                Answer::Refused(reason) => {
                    if tally.settle(d, |c| c.rejected += 1) {
                        rejects.push((rem.restore(out), reason));
                    }
                }
                Answer::Unanswered => {}
            }
        }
        Settled {
            counts: c,
            rejects,
            partial: Some(done),
        }
    }
}

/// The source key of the item a target item `out` was made from.
fn source_key(out: &Item, rem: &Remnant<'_>, names: &[&str]) -> Item {
    names
        .iter()
        .filter_map(|n| rem.source_value(out, n).map(|v| (n.to_string(), v.clone())))
        .collect()
}

/// The reject reason of a source item whose target key `tk` another source
/// item (`owner`, encoded) claimed first: one wording, on one machine or many.
/// A rejected item in the log (debug, `-vv`): its source key's values
/// joined by ` / ` in `source_key` and the reason in `detail`, the fields
/// `ops::log` redacts (unless `--show-keys`) as the terminal redacts keys.
fn log_reject(plan: &Plan, item: &Item, reason: &dyn std::fmt::Display) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let key: Vec<String> = plan
            .source_key
            .names()
            .iter()
            .filter_map(|n| item.get(*n).map(Value::display_text))
            .collect();
        tracing::debug!(source_key = %key.join(" / "), detail = %reason, "item rejected");
    }
}

fn collision(tk: &[u8], owner: &[u8]) -> String {
    format!(
        "collision: target key {} already belongs to source item {} — never overwritten",
        decode_key(tk).join(" / "),
        decode_key(owner).join(" / ")
    )
}

/// In place: one conditional UpdateItem per item that needs one (see
/// [`crate::phase::inplace`]), `concurrency` at a time. Items already right, unmatched,
/// or deleted before rekey could write them are skipped. Once `step.stop`
/// is cancelled the updates not answered are abandoned (a conditional
/// update, repeated on resume, is harmless).
pub(super) async fn process_page_in_place(
    writer: &Writer,
    plan: &Plan,
    items: &[Item],
    direction: Direction,
    step: PageStep<'_>,
) -> anyhow::Result<Settled> {
    let stop = step.stop;
    let results: Vec<anyhow::Result<(Option<Applied>, Item)>> = stream::iter(items.to_vec())
        .map(|item| async move {
            let applied = tokio::select! {
                biased;
                () = stop.cancelled() => None,
                r = update_one(writer, plan, &item, direction) => Some(r?),
            };
            Ok((applied, item))
        })
        .buffer_unordered(writer.concurrency)
        .collect()
        .await;
    let partial = results.iter().any(|r| matches!(r, Ok((None, _))));
    let names = plan.source_key.names();
    let (mut c, mut done, mut rejects) = (Counters::default(), Vec::new(), Vec::new());
    let mut tally = Tally {
        c: &mut c,
        done: &mut done,
        room: if partial { step.room } else { usize::MAX },
    };
    let mut consumed = 0.0;
    for r in results {
        let (applied, item) = r.context("in-place write failed")?;
        let Some(applied) = applied else { continue };
        consumed += consumed_by(&applied);
        // A whole page counts every item: its digests are not kept.
        let d = if partial {
            digest(&item, &names)
        } else {
            Some(String::new())
        };
        match applied {
            Applied::Written { .. } => {
                tally.settle(d, |c| c.written += 1);
            }
            Applied::Skipped { .. } => {
                tally.settle(d, |c| c.skipped += 1);
            }
            Applied::Rejected { reason, .. } => {
                if tally.settle(d, |c| c.rejected += 1) {
                    rejects.push((item, reason));
                }
            }
        }
    }
    *writer.consumed_wcu.lock().await += consumed;
    Ok(Settled {
        counts: c,
        rejects,
        partial: partial.then_some(done),
    })
}

/// The write units an in-place write used.
fn consumed_by(a: &Applied) -> f64 {
    match a {
        Applied::Written { consumed }
        | Applied::Skipped { consumed }
        | Applied::Rejected { consumed, .. } => *consumed,
    }
}

/// One item's in-place decision and conditional write, paced per key.
async fn update_one(
    writer: &Writer,
    plan: &Plan,
    item: &Item,
    direction: Direction,
) -> anyhow::Result<Applied> {
    let decision = direction.decide(plan, item);
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
    inplace::apply(
        &writer.clients,
        plan,
        &writer.control,
        direction,
        decision,
        writer.max_retries,
    )
    .await
}
