//! Guarded writes: why two tails running in opposite directions never loop.
//!
//! During a rollback's deploy window the forward tail writes the target,
//! whose stream feeds the reverse tail, which writes the source, whose stream
//! feeds the forward tail. Neither may write the other's change back, and an
//! application write on either side must not be undone by an echo of an
//! older one. So while a reverse tail exists, both directions apply a lane
//! (one item of the table read) by state, not by replaying records:
//!
//! 1. **Current state, not the record.** The item is read again (consistent
//!    GetItem) in the table the stream belongs to, and what is written is the
//!    mapping of *that* — the lane's records only say which item changed and
//!    what it was before (the first record's old image). A stale record (the
//!    item has changed since) therefore never writes an old image: a later
//!    record carries the newer state, and re-reading an item changed back and
//!    forth (A → B → A) finds A, not B.
//! 2. **Nothing already held.** Each resulting write is compared with what the
//!    table written holds at its key: equal (or a delete of an absent key),
//!    and it is not made. A write's echo — the other tail reading it from
//!    this table's stream — always finds the other side holding it, so it
//!    writes nothing: tail writes are bounded by application writes
//!    (`rollback::both_tails_with_disjoint_writers_write_no_echo`).
//! 3. **Not over an independent change.** The write is made only if the table
//!    written still holds what this direction would have left there before
//!    the lane's changes (the mapping of the old image, or of any image in
//!    the lane), or what this tail last wrote at that key. Anything else was
//!    written on that side independently — by the application, or by the
//!    other tail carrying an application write — and the write is counted as
//!    a *conflict* and not made: the other direction carries the newer side
//!    over, and `verify` (both ways) reports an item both applications wrote.
//!
//! Lanes are applied one after the other in stream order (two target keys of
//! one source item, a move, touch one source key), each write acknowledged
//! before the next check.

use super::apply::{Final, Tally, Target, write_batch};
use super::*;

use crate::aws::item::get_item;

/// How many target keys' last writes are remembered (then forgotten at once).
const REMEMBERED: usize = 100_000;

impl Tail<'_> {
    /// Whether writes are guarded: always backwards, and forwards once a
    /// reverse tail has run for this migration.
    pub(super) fn guarded(&self) -> bool {
        self.opts.flow == Flow::Reverse || self.opts.state_dir.reverse_store().exists()
    }
}

/// What a guarded write finds in the table written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Write,
    InSync,
    Conflict,
}

/// Pure: a write (`wanted`: the item, or None for a delete) against what the
/// table holds at its key, given the states this direction may have left
/// there (`behind`).
pub(super) fn check(wanted: Option<&Item>, held: Option<&Item>, behind: &[Option<Item>]) -> Check {
    if held == wanted {
        Check::InSync
    } else if behind.iter().any(|b| b.as_ref() == held) {
        Check::Write
    } else {
        Check::Conflict
    }
}

/// What this direction would leave at write key `key` for each image of the
/// lane (and the old image): the mapping if it lands on that key, else
/// nothing.
fn behind(m: &Mapper<'_>, key: &Item, images: &[Option<&Item>]) -> Vec<Option<Item>> {
    let mut out = vec![None];
    for image in images.iter().flatten() {
        if let Mapped::Put(item) = m.map(image)
            && &m.write_key_of(&item) == key
        {
            out.push(Some(item));
        }
    }
    out.dedup();
    out
}

/// Apply lanes by the rules in the module docs; return when every write is
/// acknowledged.
pub(super) async fn apply_guarded(
    clients: &Clients,
    m: &Mapper<'_>,
    control: &Control,
    changes: &[Change],
    lanes: &[Vec<usize>],
    mine: &mut HashMap<Vec<u8>, Option<Item>>,
) -> anyhow::Result<Tally> {
    let write_table = m.flow.write_table(m.plan);
    let names = m.flow.write_key(m.plan).names();
    let mut tally = Tally::default();
    for lane in lanes {
        let (Some(&first), Some(&last)) = (lane.first(), lane.last()) else {
            continue;
        };
        let Some(current) = current_change(clients, m, &changes[first], &changes[last]).await?
        else {
            continue;
        };
        let images: Vec<Option<&Item>> = lane
            .iter()
            .flat_map(|&i| [changes[i].old.as_ref(), changes[i].new.as_ref()])
            .collect();
        for (a, action) in mapped_actions(m, &current).into_iter().enumerate() {
            let target = match action {
                Action::Put(item) => Target::Put(item),
                Action::Delete(key) => Target::Delete(key),
                Action::Reject { item, reason } => {
                    tally.rejects.push((item, reason));
                    continue;
                }
                Action::Update(w) => {
                    tally
                        .rejects
                        .push((w.key, "an in-place update in a guarded tail (a bug in rekey)".into()));
                    continue;
                }
            };
            let (key, wanted) = match &target {
                Target::Put(item) => (m.write_key_of(item), Some(item)),
                Target::Delete(key) => (key.clone(), None),
            };
            let held = get_item(clients, write_table, &key, true)
                .await
                .with_context(|| format!("guarded tail: reading `{write_table}`"))?;
            let code = encode_key(&key, &names).unwrap_or_default();
            let mut behind = behind(m, &key, &images);
            if let Some(last_written) = mine.get(&code) {
                behind.push(last_written.clone());
            }
            match check(wanted, held.as_ref(), &behind) {
                Check::InSync => tally.in_sync += 1,
                Check::Conflict => {
                    tracing::info!(table = write_table, "guarded tail: conflict, write not made");
                    tally.conflicts += 1;
                }
                Check::Write => {
                    let put = u64::from(wanted.is_some());
                    let f = Final {
                        target: target.clone(),
                        order: (last, a),
                        puts: put,
                        deletes: 1 - put,
                    };
                    let refused = write_batch(clients, write_table, control, &[f]).await?;
                    match refused.into_iter().next().flatten() {
                        None => {
                            tally.puts += put;
                            tally.deletes += 1 - put;
                            if mine.len() >= REMEMBERED {
                                mine.clear();
                            }
                            mine.insert(code, wanted.cloned());
                        }
                        Some(reason) => {
                            let source = current.new.as_ref().or(current.old.as_ref());
                            tally
                                .rejects
                                .push((source.cloned().unwrap_or_default(), reason));
                        }
                    }
                }
            }
        }
    }
    Ok(tally)
}

/// The lane as one change from the first record's old image to the item as
/// the table read holds it now; None when both are absent.
async fn current_change(
    clients: &Clients,
    m: &Mapper<'_>,
    first: &Change,
    last: &Change,
) -> anyhow::Result<Option<Change>> {
    let Some(any) = last.new.as_ref().or(last.old.as_ref()) else {
        return Ok(None);
    };
    let read_table = m.flow.read_table(m.plan);
    let now = get_item(clients, read_table, &m.read_key_of(any), true)
        .await
        .with_context(|| format!("guarded tail: reading `{read_table}`"))?;
    let kind = match (&first.old, &now) {
        (None, None) => return Ok(None),
        (_, None) => ChangeKind::Remove,
        (None, Some(_)) => ChangeKind::Insert,
        (Some(_), Some(_)) => ChangeKind::Modify,
    };
    Ok(Some(Change {
        kind,
        old: first.old.clone(),
        ttl: last.ttl && now.is_none(),
        new: now,
        at: last.at,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::Value;

    fn it(v: &str) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S("k".into()));
        i.insert("v".into(), Value::S(v.into()));
        i
    }

    #[test]
    fn an_echo_is_in_sync_a_lagging_side_is_written_and_an_independent_change_is_left() {
        let (a, b, c) = (it("a"), it("b"), it("c"));
        // The other side already holds it (an echo): no write.
        assert_eq!(check(Some(&b), Some(&b), &[None, Some(a.clone())]), Check::InSync);
        assert_eq!(check(None, None, &[Some(a.clone())]), Check::InSync);
        // It holds what this direction left before: write.
        assert_eq!(check(Some(&b), Some(&a), &[None, Some(a.clone())]), Check::Write);
        assert_eq!(check(Some(&b), None, &[None]), Check::Write);
        assert_eq!(check(None, Some(&a), &[None, Some(a.clone())]), Check::Write);
        // It holds something this direction never left: someone else wrote it.
        assert_eq!(check(Some(&b), Some(&c), &[None, Some(a.clone())]), Check::Conflict);
        assert_eq!(check(None, Some(&c), &[None, Some(a)]), Check::Conflict);
    }
}
