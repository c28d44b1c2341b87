//! Guarded writes: why two tails running in opposite directions never loop,
//! and an echo never undoes an application write.
//!
//! During a rollback's deploy window the forward tail writes the target,
//! whose stream feeds the reverse tail, which writes the source, whose stream
//! feeds the forward tail. While a reverse tail exists, both directions apply
//! each record under three rules:
//!
//! 1. **An echo is not written back.** Every write a guarded tail makes is
//!    announced first in its echo ledger (`state::echoes`); a record whose
//!    key and new image (or deletion) the other direction announced is that
//!    write coming back, and is taken, not applied. So tail writes are bounded
//!    by application writes, by construction
//!    (`rollback::both_tails_with_disjoint_writers_write_no_echo_and_both_tables_converge`).
//! 2. **The current state, not a stale record.** The item is read again
//!    (consistent GetItem) in the table the stream belongs to. If it no
//!    longer holds the record's new image, a later record carries the newer
//!    state: only the record's delete of an old key is applied (what the item
//!    maps to now is not there), never its old put. Replaying an item changed
//!    back and forth (A → B → A) therefore never writes B.
//! 3. **Nothing already held, no other item deleted.** A put equal to what
//!    the table written holds is not made (`in_sync`); a delete is made only
//!    if the key holds a version of the same item (mapped back, it has the
//!    key of the item the record changed) — anything else there is another
//!    item (a collision) and is counted as a `conflict`, not deleted.
//!
//! The same item written on both sides in the window (issue 13, item 4): each
//! tail applies the write it reads while it is still current on its side, so
//! the write applied last to both tables wins — in practice the later one;
//! README, "Rolling back", says which and how `verify` reports what is left.
//!
//! Records are applied one at a time in stream order (two target keys of one
//! source item, a move, touch one source key), each write acknowledged
//! before the next check.

use super::apply::{Final, Tally, Target, write_batch};
use super::*;

use crate::aws::item::get_item;
use crate::state::echoes::{Echoes, entry};

impl Tail<'_> {
    /// Whether writes are guarded: always backwards, and forwards once a
    /// reverse tail has run for this migration.
    pub(super) fn guarded(&self) -> bool {
        self.opts.flow == Flow::Reverse || self.opts.state_dir.reverse_store().exists()
    }

    /// The echo ledgers, opened on the first guarded call.
    pub(super) fn open_echoes(&mut self) -> anyhow::Result<()> {
        if self.echoes.is_none() {
            let flow = self.opts.flow;
            let dir = &self.opts.state_dir;
            self.echoes = Some(Echoes::open(&flow.ledger(dir), &flow.other().ledger(dir))?);
        }
        Ok(())
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
/// table holds at its key; a delete only of a version of the same item
/// (`same_item`: what is held maps back to the key of the item changed).
pub(super) fn check(wanted: Option<&Item>, held: Option<&Item>, same_item: bool) -> Check {
    if held == wanted {
        Check::InSync
    } else if wanted.is_some() || same_item {
        Check::Write
    } else {
        Check::Conflict
    }
}

/// Apply records by the rules in the module docs; return when every write is
/// acknowledged.
pub(super) async fn apply_guarded(
    clients: &Clients,
    m: &Mapper<'_>,
    control: &Control,
    changes: &[Change],
    lanes: &[Vec<usize>],
    echoes: &mut Echoes,
) -> anyhow::Result<Tally> {
    let mut order: Vec<usize> = lanes.iter().flatten().copied().collect();
    order.sort_unstable();
    let mut tally = Tally::default();
    for i in order {
        let c = &changes[i];
        let Some(any) = c.new.as_ref().or(c.old.as_ref()) else {
            continue;
        };
        let key = m.read_key_of(any);
        let image = c.new.as_ref().filter(|_| c.kind != ChangeKind::Remove);
        if echoes.take(&entry(&key, image))? {
            tally.echoes += 1;
            continue;
        }
        let read_table = m.flow.read_table(m.plan);
        let now = get_item(clients, read_table, &key, true)
            .await
            .with_context(|| format!("guarded tail: reading `{read_table}`"))?;
        let current = now.as_ref() == image;
        let before = c.old.as_ref().and_then(|o| match m.map(o) {
            Mapped::Put(item) => Some(item),
            _ => None,
        });
        let actions = if current {
            mapped_actions(m, c)
        } else {
            // Stale: only the old key's delete, if the item maps elsewhere now.
            let now_key = now.as_ref().and_then(|n| match m.map(n) {
                Mapped::Put(item) => Some(m.write_key_of(&item)),
                _ => None,
            });
            before
                .iter()
                .map(|b| m.write_key_of(b))
                .filter(|k| Some(k) != now_key.as_ref())
                .map(Action::Delete)
                .collect()
        };
        for (a, action) in actions.into_iter().enumerate() {
            let target = match action {
                Action::Put(item) => Target::Put(item),
                Action::Delete(key) => Target::Delete(key),
                Action::Reject { item, reason } => {
                    tally.rejects.push((item, reason));
                    continue;
                }
                Action::Update(w) => {
                    tally.rejects.push((
                        w.key,
                        "an in-place update in a guarded tail (a bug in rekey)".into(),
                    ));
                    continue;
                }
            };
            write_one(
                clients,
                m,
                control,
                echoes,
                (target, (i, a)),
                &key,
                &mut tally,
            )
            .await?;
        }
    }
    Ok(tally)
}

/// One write after its check: announced in the ledger, then sent.
async fn write_one(
    clients: &Clients,
    m: &Mapper<'_>,
    control: &Control,
    echoes: &mut Echoes,
    (target, order): (Target, (usize, usize)),
    read_key: &Item,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let write_table = m.flow.write_table(m.plan);
    let (key, wanted) = match &target {
        Target::Put(item) => (m.write_key_of(item), Some(item)),
        Target::Delete(key) => (key.clone(), None),
    };
    let held = get_item(clients, write_table, &key, true)
        .await
        .with_context(|| format!("guarded tail: reading `{write_table}`"))?;
    let same_item = held
        .as_ref()
        .is_some_and(|h| m.back_key(h).as_ref() == Some(read_key));
    match check(wanted, held.as_ref(), same_item) {
        Check::InSync => tally.in_sync += 1,
        Check::Conflict => {
            tracing::info!(
                table = write_table,
                "guarded tail: conflict, delete not made"
            );
            tally.conflicts += 1;
        }
        Check::Write => {
            echoes.announce(&entry(&key, wanted))?;
            let put = u64::from(wanted.is_some());
            let f = Final {
                target: target.clone(),
                order,
                puts: put,
                deletes: 1 - put,
            };
            match write_batch(clients, write_table, control, &[f])
                .await?
                .into_iter()
                .next()
                .flatten()
            {
                None => {
                    tally.puts += put;
                    tally.deletes += 1 - put;
                }
                Some(reason) => tally.rejects.push((wanted.cloned().unwrap_or(key), reason)),
            }
        }
    }
    Ok(())
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
    fn a_put_is_made_unless_held_and_a_delete_only_of_a_version_of_the_same_item() {
        let (a, b) = (it("a"), it("b"));
        assert_eq!(check(Some(&b), Some(&b), true), Check::InSync);
        assert_eq!(check(None, None, false), Check::InSync);
        assert_eq!(check(Some(&b), Some(&a), true), Check::Write);
        assert_eq!(check(Some(&b), None, false), Check::Write);
        assert_eq!(check(None, Some(&a), true), Check::Write);
        // Another item at that key: not deleted.
        assert_eq!(check(None, Some(&a), false), Check::Conflict);
    }
}
