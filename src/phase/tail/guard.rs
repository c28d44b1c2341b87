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
//! 3. **Nothing already held.** A put equal to what the table written holds
//!    is not made (`in_sync`).
//! 4. **The source wins a conflict.** The reverse tail writes the source only
//!    where the source still holds what the record's old image reads back to
//!    (or what an image of an earlier, stale record of the same target item
//!    reads back to: kept in `tail/pending/` in its store, so kill -9 keeps
//!    them): a source
//!    item written since by the application is a `conflict` and is left as
//!    it is — the forward tail carries it to the target, over the target's
//!    write. The forward tail writes regardless (a delete only of a version
//!    of the same item). So an item written on both sides in the window ends
//!    as the source's write on both tables, whole, with no ping-pong: the
//!    source is the table of record until `rekey finish`, and a rollback must
//!    never lose what the old application wrote.
//!
//! Records are applied in lanes, several at once, each lane in stream order
//! with every write acknowledged before its next check. Forwards, one lane
//! per source item; backwards, one per source item too: the records of the
//! target keys that read back to one source key (a move is a delete of one
//! and a put of another) share a lane (`reverse_lanes`), and a move's put
//! read before its delete (two shards) waits for the delete
//! (`Lane::put_deferred`).

use super::apply::{Final, Tally, Target, write_batch};
use std::collections::HashMap;

use anyhow::Context as _;

use super::{Action, Change, ChangeKind, Flow, Mapped, Mapper, Tail, mapped_actions};
use crate::aws::Clients;
use crate::aws::rate::Control;
use crate::core::value::{Item, encode_key};
use crate::state::StateStore;

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
            let (own, other) = (flow.ledger(dir), flow.other().ledger(dir));
            self.echoes = Some(match &self.line {
                Some(l) => Echoes::open_after(&own, &other, l.ledger_from, &l.taken)?,
                None => Echoes::open(&own, &other)?,
            });
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

/// What a write may replace, besides what it would write.
#[derive(Debug, Clone, Copy)]
pub(super) enum Replaces<'a> {
    /// Forwards: anything for a put; for a delete, only a version of the
    /// same item (what is held maps back to the key of the item changed).
    Forward { same_item: bool },
    /// Backwards: only what the record's (or a pending) old image reads back
    /// to at that key — the source wins a conflict.
    Reverse(&'a [Option<Item>]),
}

/// Pure: a write (`wanted`: the item, or None for a delete) against what the
/// table holds at its key.
pub(super) fn check(wanted: Option<&Item>, held: Option<&Item>, replaces: Replaces<'_>) -> Check {
    let ok = match replaces {
        _ if held == wanted => return Check::InSync,
        Replaces::Forward { same_item } => wanted.is_some() || same_item,
        Replaces::Reverse(before) => before.iter().any(|b| b.as_ref() == held),
    };
    if ok { Check::Write } else { Check::Conflict }
}

impl Tail<'_> {
    /// Apply records by the rules in the module docs; return when every write is
    /// acknowledged.
    ///
    /// The lanes (one per source item) go at once, [`GUARDED_LANES`] at a time,
    /// each in stream order: a guarded write is a read and then a write, and one
    /// record at a time did not keep up with an application writing the source
    /// (a cutover's drain timed out) nor, backwards, with one writing the target
    /// over many shards (verify waited on a reverse tail 25 s behind). Two lanes
    /// never undo each other: a forward delete is only of a version of its own
    /// item, and backwards no two lanes touch one key on either side.
    pub(super) async fn apply_guarded(
        &mut self,
        changes: &[Change],
        lanes: &[Vec<usize>],
    ) -> anyhow::Result<Tally> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        self.open_echoes()?;
        let m = &self.mapper;
        let lanes: Vec<Vec<usize>> = match m.flow {
            Flow::Forward => lanes.to_vec(),
            Flow::Reverse => reverse_lanes(m, changes),
        };
        let echoes = std::sync::Mutex::new(self.echoes.as_mut().expect("opened above"));
        let ctx = Lane {
            clients: self.clients,
            m,
            control: &self.control,
            changes,
            echoes: &echoes,
            store: &self.store,
        };
        let tallies: Vec<Tally> = stream::iter(lanes)
            .map(|lane| ctx.apply(lane))
            .buffer_unordered(GUARDED_LANES)
            .try_collect()
            .await?;
        let mut tally = Tally::default();
        for t in tallies {
            tally.add(t);
        }
        Ok(tally)
    }
}

/// Lanes of a guarded call applied at once.
const GUARDED_LANES: usize = 16;

/// Backwards, one lane per source item: records that share a target key or
/// a source key their images read back to, in stream order. A move on the
/// target (a delete of one target key, a put of another) reads back to one
/// source key, so its two records, and the put it may defer
/// (`Lane::put_deferred`), share a lane; two lanes never touch one key on
/// either side. Records whose images read back to nothing share the first
/// lane through their target key only.
fn reverse_lanes(m: &Mapper<'_>, changes: &[Change]) -> Vec<Vec<usize>> {
    let read_names = m.flow.read_key(m.plan).names();
    let write_names = m.flow.write_key(m.plan).names();
    // Union-find over records: a record joins every earlier record that
    // named one of its keys.
    let mut parent: Vec<usize> = (0..changes.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut owner: HashMap<(bool, Vec<u8>), usize> = HashMap::new();
    for (i, c) in changes.iter().enumerate() {
        let images = [c.old.as_ref(), c.new.as_ref()];
        let read = images
            .iter()
            .flatten()
            .filter_map(|item| encode_key(item, &read_names))
            .map(|k| (false, k));
        let written = images
            .iter()
            .flatten()
            .filter_map(|item| match m.map(item) {
                Mapped::Put(back) => encode_key(&back, &write_names),
                _ => None,
            })
            .map(|k| (true, k));
        let mut keys: Vec<(bool, Vec<u8>)> = read.chain(written).collect();
        if keys.is_empty() {
            // No key at all: with every other such record.
            keys.push((false, Vec::new()));
        }
        for k in keys {
            match owner.get(&k) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a.max(b)] = a.min(b);
                }
                None => {
                    owner.insert(k, i);
                }
            }
        }
    }
    let mut lane_of: HashMap<usize, usize> = HashMap::new();
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    for i in 0..changes.len() {
        let r = root(&mut parent, i);
        let n = lanes.len();
        let lane = *lane_of.entry(r).or_insert(n);
        if lane == n {
            lanes.push(Vec::new());
        }
        lanes[lane].push(i);
    }
    lanes
}

/// What every lane of a guarded call shares.
struct Lane<'a, 'm, 'e> {
    clients: &'a Clients,
    m: &'a Mapper<'m>,
    control: &'a Control,
    changes: &'a [Change],
    echoes: &'a std::sync::Mutex<&'e mut Echoes>,
    store: &'a StateStore,
}

impl<'e> Lane<'_, '_, 'e> {
    fn ledger(&self) -> std::sync::MutexGuard<'_, &'e mut Echoes> {
        // A panic while holding the lock leaves no broken invariant here.
        self.echoes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One lane's records, in stream order.
    async fn apply(&self, lane: Vec<usize>) -> anyhow::Result<Tally> {
        let (clients, m, store) = (self.clients, self.m, self.store);
        let mut tally = Tally::default();
        for i in lane {
            let c = &self.changes[i];
            let Some(any) = c.new.as_ref().or(c.old.as_ref()) else {
                continue;
            };
            // A barrier's or a probe's marker is never copied: no read, no
            // write (a probe over K shards is K·ln K of them).
            if crate::core::marker::marker_in(m.flow.read_key(m.plan), any).is_some() {
                continue;
            }
            let key = m.read_key_of(any);
            let image = c.new.as_ref().filter(|_| c.kind != ChangeKind::Remove);
            if self.ledger().take(&entry(&key, image))? {
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
            // Backwards: what this item's writes may replace in the source.
            let mut replaceable = vec![before.clone()];
            if m.flow == Flow::Reverse {
                // The images of the stale records since this key's last applied
                // one: the source may hold what any of them reads back to.
                let pending = format!("tail/pending/{}", hex(&entry(&key, None).0));
                // (None: the item absent.)
                let mut seen: Vec<Option<Item>> = store.get(&pending)?.unwrap_or_default();
                if current {
                    replaceable.extend(seen.iter().map(|o| match o.as_ref().map(|o| m.map(o)) {
                        Some(Mapped::Put(item)) => Some(item),
                        _ => None,
                    }));
                    store.remove(&pending)?;
                } else {
                    seen.extend([c.old.clone(), image.cloned()]);
                    seen.dedup();
                    store.put(&pending, &seen)?;
                }
            }
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
                let w = Guarded {
                    target,
                    order: (i, a),
                    read_key: &key,
                    replaceable: &replaceable,
                };
                self.write_one(w, &mut tally).await?;
            }
        }
        Ok(tally)
    }
}

/// One write to check and make.
struct Guarded<'a> {
    target: Target,
    order: (usize, usize),
    /// The key of the item changed, in the table read.
    read_key: &'a Item,
    /// Backwards: the images (mapped) the write may replace.
    replaceable: &'a [Option<Item>],
}

/// Where a deferred put waits, by the source key it is for.
fn deferred(key: &Item) -> String {
    format!("tail/deferred/{}", hex(&entry(key, None).0))
}

fn hex(d: &[u8; 16]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl Lane<'_, '_, '_> {
    /// One write after its check: announced in the ledger, then sent.
    async fn write_one(&self, w: Guarded<'_>, tally: &mut Tally) -> anyhow::Result<()> {
        let (clients, m, control) = (self.clients, self.m, self.control);
        let Guarded {
            target,
            order,
            read_key,
            replaceable,
        } = w;
        let write_table = m.flow.write_table(m.plan);
        let (key, wanted) = match &target {
            Target::Put(item) => (m.write_key_of(item), Some(item)),
            Target::Delete(key) => (key.clone(), None),
        };
        let held = get_item(clients, write_table, &key, true)
            .await
            .with_context(|| format!("guarded tail: reading `{write_table}`"))?;
        let replaces = match m.flow {
            Flow::Forward => Replaces::Forward {
                same_item: held
                    .as_ref()
                    .is_some_and(|h| m.back_key(h).as_ref() == Some(read_key)),
            },
            Flow::Reverse => Replaces::Reverse(replaceable),
        };
        // A replaceable image elsewhere than this key stands for nothing here.
        let here: Vec<Option<Item>>;
        let replaces = match replaces {
            Replaces::Reverse(r) => {
                here = r
                    .iter()
                    .map(|b| b.clone().filter(|b| m.write_key_of(b) == key))
                    .collect();
                Replaces::Reverse(&here)
            }
            f => f,
        };
        let checked = check(wanted, held.as_ref(), replaces);
        let reverse = m.flow == Flow::Reverse;
        match checked {
            Check::InSync => tally.in_sync += 1,
            Check::Conflict if reverse && wanted.is_some() => {
                // Maybe a move whose delete sits on another shard, unread:
                // the put waits for the source item's delete.
                tracing::info!(table = write_table, "guarded tail: conflict, put deferred");
                self.store.put(&deferred(&key), read_key)?;
                tally.conflicts += 1;
            }
            Check::Conflict => {
                tracing::info!(
                    table = write_table,
                    "guarded tail: conflict, write not made"
                );
                tally.conflicts += 1;
            }
            Check::Write => {
                self.ledger().announce(&entry(&key, wanted))?;
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
                    Some(reason) => {
                        tally
                            .rejects
                            .push((wanted.cloned().unwrap_or(key.clone()), reason));
                        return Ok(());
                    }
                }
            }
        }
        if reverse && wanted.is_none() && checked != Check::Conflict {
            self.put_deferred(&key, tally).await?;
        }
        Ok(())
    }

    /// Backwards, once source key `key` is free: the put a conflict deferred
    /// there, if the target still holds the item it came from.
    ///
    /// A move on the target is a delete of the old key and a put of the new,
    /// usually on two shards, and nothing orders two shards' records: the
    /// put may come first. The source still holds the old item then, so the
    /// put is a conflict (the source wins: it may be the old application's
    /// write); but when the old key's delete arrives and removes that item,
    /// the put is made after all. A source item the old application wrote
    /// is never deleted by a target record, so its conflicts stay conflicts.
    async fn put_deferred(&self, key: &Item, tally: &mut Tally) -> anyhow::Result<()> {
        let (clients, m) = (self.clients, self.m);
        let slot = deferred(key);
        let Some(target_key) = self.store.get::<Item>(&slot)? else {
            return Ok(());
        };
        let read_table = m.flow.read_table(m.plan);
        let now = get_item(clients, read_table, &target_key, true)
            .await
            .with_context(|| format!("guarded tail: reading `{read_table}`"))?;
        let item = match now.as_ref().map(|n| m.map(n)) {
            Some(Mapped::Put(item)) if m.write_key_of(&item) == *key => item,
            _ => {
                self.store.remove(&slot)?;
                return Ok(());
            }
        };
        let w = Guarded {
            target: Target::Put(item),
            order: (0, 0),
            read_key: &target_key,
            replaceable: &[None],
        };
        // (Made or not, the slot goes after: a kill -9 before repeats this.)
        Box::pin(self.write_one(w, tally)).await?;
        self.store.remove(&slot)?;
        Ok(())
    }
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

    /// The target's shape of an order: its status is in the target key, so
    /// a status change there is a move (a delete and a put).
    fn target_order(id: &str, status: &str) -> Item {
        let p = super::super::tests::plan();
        let source = super::super::tests::order(id, status);
        match Mapper::new(&p, Flow::Forward).map(&source) {
            Mapped::Put(item) => item,
            other => panic!("the order does not map: {other:?}"),
        }
    }

    #[test]
    fn backwards_a_move_and_its_source_item_share_a_lane_and_other_items_do_not() {
        let p = super::super::tests::plan();
        let m = Mapper::new(&p, Flow::Reverse);
        let (open, done) = (target_order("1", "OPEN"), target_order("1", "DONE"));
        let other = target_order("2", "OPEN");
        let changes = vec![
            // The move's put, read before its delete (two shards).
            super::super::tests::change(ChangeKind::Insert, None, Some(done.clone())),
            super::super::tests::change(ChangeKind::Modify, Some(other.clone()), Some(other)),
            super::super::tests::change(ChangeKind::Remove, Some(open), None),
            super::super::tests::change(ChangeKind::Modify, Some(done.clone()), Some(done)),
        ];
        assert_eq!(reverse_lanes(&m, &changes), vec![vec![0, 2, 3], vec![1]]);
    }

    #[test]
    fn forwards_a_put_is_made_unless_held_and_a_delete_only_of_the_same_item() {
        let (a, b) = (it("a"), it("b"));
        let same = Replaces::Forward { same_item: true };
        let other = Replaces::Forward { same_item: false };
        assert_eq!(check(Some(&b), Some(&b), same), Check::InSync);
        assert_eq!(check(None, None, other), Check::InSync);
        assert_eq!(check(Some(&b), Some(&a), same), Check::Write);
        assert_eq!(check(Some(&b), None, other), Check::Write);
        assert_eq!(check(None, Some(&a), same), Check::Write);
        // Another item at that key: not deleted.
        assert_eq!(check(None, Some(&a), other), Check::Conflict);
    }

    #[test]
    fn backwards_the_source_wins_a_conflict() {
        let (a, b, c) = (it("a"), it("b"), it("c"));
        let from_a = [Some(a.clone())];
        // The source still holds what the target's old image reads back to.
        assert_eq!(
            check(Some(&b), Some(&a), Replaces::Reverse(&from_a)),
            Check::Write
        );
        assert_eq!(
            check(None, Some(&a), Replaces::Reverse(&from_a)),
            Check::Write
        );
        assert_eq!(
            check(Some(&b), None, Replaces::Reverse(&[None])),
            Check::Write
        );
        // The application wrote the source since: left as it is.
        assert_eq!(
            check(Some(&b), Some(&c), Replaces::Reverse(&from_a)),
            Check::Conflict
        );
        assert_eq!(
            check(None, Some(&c), Replaces::Reverse(&from_a)),
            Check::Conflict
        );
        assert_eq!(
            check(Some(&b), Some(&c), Replaces::Reverse(&[None])),
            Check::Conflict
        );
        assert_eq!(
            check(Some(&b), Some(&b), Replaces::Reverse(&from_a)),
            Check::InSync
        );
    }
}
