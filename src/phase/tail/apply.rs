//! Applying one response's changes (or one chunk of the buffer) to the target.
//!
//! The records are split into lanes, one per source item, in stream order.
//!
//! A re-key plan's writes are full-image puts and deletes by key, so what a
//! target key holds after a run of them is what the last one wrote. Each
//! lane's actions are therefore reduced to the final action per target key
//! (the last Put or Delete of that key in the lane), and those are written
//! with BatchWriteItem, 25 requests a call, several calls in flight
//! ([`reduce`]). A batch never names a key twice (DynamoDB refuses that, and
//! orders nothing inside a batch): different lanes normally touch different
//! target keys (two source items never share one: the backfill rejects
//! collisions), and when they do, the writes of that key go in rounds in the
//! order of the changes they come from, each round acknowledged before the
//! next starts, so the later change's write lands last.
//!
//! In place, each action is a conditional UpdateItem that may have to re-read
//! and decide again: lanes apply their actions one at a time, lanes in
//! parallel, as before.
//!
//! Either way `apply_all` returns only when every write is acknowledged, and
//! its caller checkpoints the shard only then.
//!
//! Counters: `puts` and `deletes` count the records' Put and Delete actions
//! (as when each was its own request), not the requests sent: an action
//! folded into a later write of the same key counts once that write is
//! acknowledged. A write DynamoDB refuses (ValidationException, narrowed down
//! to the request at fault) becomes a reject of the source item it came
//! from; the actions folded into it are not counted.

use std::collections::HashMap;

use anyhow::Context as _;
use futures::stream::{self, StreamExt as _};

use super::{Action, Change, ChangeKind, Flow, Mapper, Tail, actions, mapped_actions};
use crate::aws::Clients;
use crate::aws::rate::Control;
use crate::aws::streams::now_secs;
use crate::core::plan::{KeySchema, Mode, Plan};
use crate::core::value::{Item, encode_key};
use crate::phase::inplace::{self, Applied, Decision, Direction};
use crate::state::snapshot::BarrierState;

use crate::aws::write::{BATCH, Write, write_requests};
use crate::core::marker::{Marker, marker_in};

/// Source items applied at once from one response, in place.
const LANES: usize = 16;

/// BatchWriteItem calls in flight at once.
const BATCHES_IN_FLIGHT: usize = 16;

/// Transient failures retried per target write.
const MAX_RETRIES: u32 = 10;

/// What applying one call's changes did (added to the report once every
/// write is acknowledged).
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub puts: u64,
    pub deletes: u64,
    pub updates: u64,
    pub in_sync: u64,
    pub echoes: u64,
    pub conflicts: u64,
    pub rejects: Vec<(Item, String)>,
}

impl Tally {
    pub(super) fn add(&mut self, t: Tally) {
        self.puts += t.puts;
        self.deletes += t.deletes;
        self.updates += t.updates;
        self.in_sync += t.in_sync;
        self.echoes += t.echoes;
        self.conflicts += t.conflicts;
        self.rejects.extend(t.rejects);
    }
}

/// A target write, owned.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Target {
    Put(Item),
    /// The target key to delete.
    Delete(Item),
}

/// One write left by [`reduce`]: the last Put or Delete of its target key in
/// its lane.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Final {
    pub target: Target,
    /// Its place in stream order: the change it comes from (its index in the
    /// call: the source item of a reject) and its action's place in the
    /// change. Orders a key's writes across lanes, and a round's writes.
    pub order: (usize, usize),
    /// The records' actions it stands for, its own included.
    pub puts: u64,
    pub deletes: u64,
}

/// The writes of one call: no target key twice in a round, and a key's write
/// in a later round comes from a later change. Plus the plan's rejects.
#[derive(Debug, Default)]
pub(super) struct Reduced {
    pub rounds: Vec<Vec<Final>>,
    pub rejects: Vec<(Item, String)>,
}

/// Per source item, changes in stream order: lanes of indices into `changes`,
/// ordered by each item's first change. Changes without a key share a lane.
pub(super) fn lanes(read_key: &KeySchema, changes: &[Change]) -> Vec<Vec<usize>> {
    let names = read_key.names();
    let mut lane_of: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    for (i, c) in changes.iter().enumerate() {
        let key = c
            .new
            .as_ref()
            .or(c.old.as_ref())
            .and_then(|i| encode_key(i, &names))
            .unwrap_or_default();
        let n = lanes.len();
        let lane = *lane_of.entry(key).or_insert(n);
        if lane == n {
            lanes.push(Vec::new());
        }
        lanes[lane].push(i);
    }
    lanes
}

/// Reduce a re-key plan's actions to the final write per target key and lane
/// (see the module docs). Pure: the unit tests below check each case.
pub(super) fn reduce(m: &Mapper<'_>, changes: &[Change], lanes: &[Vec<usize>]) -> Reduced {
    let names = m.flow.write_key(m.plan).names();
    // Target key → its writes, one per lane that touches it, in lane order.
    let mut by_key: HashMap<Vec<u8>, Vec<(usize, Final)>> = HashMap::new();
    let mut rejects = Vec::new();
    for (lane, indices) in lanes.iter().enumerate() {
        for &i in indices {
            for (a, action) in mapped_actions(m, &changes[i]).into_iter().enumerate() {
                let target = match action {
                    Action::Put(item) => Target::Put(item),
                    Action::Delete(key) => Target::Delete(key),
                    Action::Reject { item, reason } => {
                        rejects.push((item, reason));
                        continue;
                    }
                    // Not made for a re-key plan (apply_all routes in-place
                    // plans to the lanes); kept visible rather than dropped.
                    Action::Update(w) => {
                        rejects.push((
                            w.key,
                            "an in-place update in a re-key plan (a bug in rekey)".into(),
                        ));
                        continue;
                    }
                };
                let (item, put) = match &target {
                    Target::Put(item) => (item, 1),
                    Target::Delete(key) => (key, 0),
                };
                // A key that cannot be encoded cannot be compared: its own
                // write (DynamoDB will say what is wrong with it).
                let key = encode_key(item, &names).unwrap_or_else(|| {
                    let mut k = vec![0xff];
                    k.extend_from_slice(&by_key.len().to_be_bytes());
                    k
                });
                let writes = by_key.entry(key).or_default();
                match writes.last_mut() {
                    Some((l, f)) if *l == lane => {
                        f.target = target;
                        f.order = (i, a);
                        f.puts += put;
                        f.deletes += 1 - put;
                    }
                    _ => writes.push((
                        lane,
                        Final {
                            target,
                            order: (i, a),
                            puts: put,
                            deletes: 1 - put,
                        },
                    )),
                }
            }
        }
    }
    let mut rounds: Vec<Vec<Final>> = Vec::new();
    for (_, mut writes) in by_key {
        writes.sort_by_key(|(_, f)| f.order);
        for (round, (_, f)) in writes.into_iter().enumerate() {
            if rounds.len() == round {
                rounds.push(Vec::new());
            }
            rounds[round].push(f);
        }
    }
    for round in &mut rounds {
        round.sort_by_key(|f| f.order);
    }
    Reduced { rounds, rejects }
}

impl Tail<'_> {
    /// Apply changes in stream order per source item (see the module docs);
    /// return when every write is acknowledged.
    pub(super) async fn apply_all(&mut self, changes: Vec<Change>) -> anyhow::Result<()> {
        let markers = markers(self.opts.flow.read_key(self.plan), &changes);
        let lanes = lanes(self.opts.flow.read_key(self.plan), &changes);
        let applied = if self.plan.mode == Mode::InPlace {
            apply_lanes(self.clients, self.plan, &self.control, &changes, lanes).await?
        } else if self.guarded() {
            self.apply_guarded(&changes, &lanes).await?
        } else {
            let reduced = reduce(&self.mapper, &changes, &lanes);
            let table = self.opts.flow.write_table(self.plan);
            write_rounds(
                self.clients,
                table,
                &self.control,
                &changes,
                reduced,
                &|| true,
            )
            .await?
        };
        self.report.in_sync += applied.in_sync;
        self.report.echoes += applied.echoes;
        self.report.conflicts += applied.conflicts;
        self.report.puts += applied.puts;
        self.report.deletes += applied.deletes;
        self.report.updates += applied.updates;
        for (item, reason) in applied.rejects {
            self.rejects.write(&item, &format!("tail: {reason}"))?;
            self.report.rejected += 1;
        }
        if let Some(at) = changes.iter().map(|c| c.at).reduce(f64::max) {
            self.report.last_lag_seconds = (now_secs() - at).max(0.0);
        }
        // Everything before a marker in its shard came before it in this call,
        // and every write of the call is acknowledged now: the barrier is observed.
        let now = now_secs();
        for (m, marker_at) in markers {
            let id = m.barrier;
            if crate::phase::markers::is_probe(&id) {
                // The tail's own probes move `applied_through`; nobody waits on them.
                continue;
            }
            if !self.barriers.contains_key(&id) {
                let b = BarrierState {
                    observed_at: now,
                    started_at: m.started_at,
                    ..Default::default()
                };
                self.store
                    .put(&format!("tail/barrier/{id}"), &(b.clone(), marker_at))?;
                self.barriers.insert(id, (b, marker_at));
            }
        }
        Ok(())
    }
}

/// The drain markers among `changes` (their inserts, in a table keyed by
/// `key`): (the marker, its record's creation time).
pub(super) fn markers(key: &KeySchema, changes: &[Change]) -> Vec<(Marker, f64)> {
    changes
        .iter()
        .filter(|c| c.kind == ChangeKind::Insert)
        .filter_map(|c| Some((marker_in(key, c.new.as_ref()?)?, c.at)))
        .collect()
}

/// The fence of a fleet's shard closed: no more writes for it.
#[derive(Debug, thiserror::Error)]
#[error("the lease on this shard may be gone: no more writes for it")]
pub struct Fenced;

/// A fleet shard's changes (a re-key plan, forwards) applied to the target
/// as [`Tail::apply_all`] applies them, each round of writes sent only while
/// `fence` holds; returns when every write is acknowledged.
pub(super) async fn apply_fenced(
    clients: &Clients,
    plan: &Plan,
    control: &Control,
    changes: &[Change],
    fence: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<Tally> {
    let mapper = Mapper::new(plan, Flow::Forward);
    let lanes = lanes(&plan.source_key, changes);
    let reduced = reduce(&mapper, changes, &lanes);
    write_rounds(
        clients,
        &plan.target_table,
        control,
        changes,
        reduced,
        fence,
    )
    .await
}

/// Write the reduced writes, a round at a time, each round in batches of 25
/// with several in flight, each round only while `fence` holds; refused
/// requests become rejects.
async fn write_rounds(
    clients: &Clients,
    table: &str,
    control: &Control,
    changes: &[Change],
    reduced: Reduced,
    fence: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<Tally> {
    let mut applied = Tally {
        rejects: reduced.rejects,
        ..Tally::default()
    };
    for round in &reduced.rounds {
        if !fence() {
            return Err(Fenced.into());
        }
        // The calls made first, then run (a stream mapping `&[Final]` by a
        // closure trips rustc's Send check of the spawned tail).
        let calls: Vec<_> = round
            .chunks(BATCH)
            .map(|batch| write_batch(clients, table, control, batch))
            .collect();
        let results: Vec<anyhow::Result<Vec<Option<String>>>> = stream::iter(calls)
            .buffered(BATCHES_IN_FLIGHT)
            .collect()
            .await;
        for (batch, refused) in round.chunks(BATCH).zip(results) {
            for (f, refused) in batch.iter().zip(refused?) {
                match refused {
                    None => {
                        applied.puts += f.puts;
                        applied.deletes += f.deletes;
                    }
                    Some(reason) => {
                        let c = &changes[f.order.0];
                        let source = match f.target {
                            Target::Put(_) => c.new.as_ref().or(c.old.as_ref()),
                            Target::Delete(_) => c.old.as_ref().or(c.new.as_ref()),
                        };
                        applied
                            .rejects
                            .push((source.cloned().unwrap_or_default(), reason));
                    }
                }
            }
        }
    }
    Ok(applied)
}

/// One BatchWriteItem of up to 25 writes of different keys: per write, why
/// DynamoDB refused it, if it did.
pub(super) async fn write_batch(
    clients: &Clients,
    table: &str,
    control: &Control,
    batch: &[Final],
) -> anyhow::Result<Vec<Option<String>>> {
    let writes: Vec<Write<'_>> = batch
        .iter()
        .map(|f| match &f.target {
            Target::Put(item) => Write::Put(item),
            Target::Delete(key) => Write::Delete(key),
        })
        .collect();
    let r = write_requests(clients, table, &writes, control, MAX_RETRIES)
        .await
        .with_context(|| format!("tail write to `{table}`"))?;
    Ok(r.refused)
}

/// In place: each lane's actions one at a time, lanes in parallel.
async fn apply_lanes(
    clients: &Clients,
    plan: &Plan,
    control: &Control,
    changes: &[Change],
    lanes: Vec<Vec<usize>>,
) -> anyhow::Result<Tally> {
    let results: Vec<anyhow::Result<Tally>> = stream::iter(lanes)
        .map(|lane| async move {
            let mut r = Tally::default();
            for i in lane {
                for action in actions(plan, &changes[i]) {
                    apply_action(clients, plan, control, action, &mut r).await?;
                }
            }
            Ok(r)
        })
        .buffer_unordered(LANES)
        .collect()
        .await;
    let mut applied = Tally::default();
    for r in results {
        let r = r?;
        applied.updates += r.updates;
        applied.rejects.extend(r.rejects);
    }
    Ok(applied)
}

/// One in-place action against the target, counted into its lane's result.
async fn apply_action(
    clients: &Clients,
    plan: &Plan,
    control: &Control,
    action: Action,
    r: &mut Tally,
) -> anyhow::Result<()> {
    match action {
        Action::Update(w) => {
            // A failed condition means the application wrote the item after
            // this record: re-read, decide again (a later record of the lane
            // will see the same item and find nothing to do).
            let key = w.key.clone();
            match inplace::apply(
                clients,
                plan,
                control,
                Direction::Forward,
                Decision::Write(w),
                10,
            )
            .await?
            {
                Applied::Written { .. } => r.updates += 1,
                Applied::Skipped { .. } => {}
                Applied::Rejected { reason, .. } => {
                    r.rejects.push((key, reason));
                }
            }
        }
        Action::Reject { item, reason } => r.rejects.push((item, reason)),
        Action::Put(_) | Action::Delete(_) => {
            anyhow::bail!("tail: a put or delete in an in-place plan (a bug in rekey)")
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::core::value::Value;

    /// Orders by status: an order's target key changes with its status.
    const BY_STATUS: &str = r#"
[source]
table = "s"
partition_key = "PK"
[target]
table = "t"
partition_key = "PK"
sort_key = "SK"
[[rule]]
match = { PK = "O#{id}" }
key = { PK = "ST#{@status}", SK = "{id}" }
"#;

    /// Every order of a status on one target key: a plan whose rules
    /// collide (the backfill would reject all but one).
    const COLLIDING: &str = r#"
[source]
table = "s"
partition_key = "PK"
[target]
table = "t"
partition_key = "PK"
[[rule]]
match = { PK = "O#{id}" }
key = { PK = "ST#{@status}" }
"#;

    fn plan(text: &str) -> Plan {
        Plan::parse(text, std::path::Path::new("p")).unwrap()
    }

    fn order(id: &str, status: &str) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S(format!("O#{id}")));
        i.insert("status".into(), Value::S(status.into()));
        i
    }

    fn insert(id: &str, status: &str) -> Change {
        change(ChangeKind::Insert, None, Some(order(id, status)))
    }

    fn modify(id: &str, from: &str, to: &str) -> Change {
        change(
            ChangeKind::Modify,
            Some(order(id, from)),
            Some(order(id, to)),
        )
    }

    fn remove(id: &str, status: &str) -> Change {
        change(ChangeKind::Remove, Some(order(id, status)), None)
    }

    fn change(kind: ChangeKind, old: Option<Item>, new: Option<Item>) -> Change {
        Change {
            kind,
            old,
            new,
            ttl: false,
            at: 0.0,
        }
    }

    fn reduced(p: &Plan, changes: &[Change]) -> Reduced {
        reduce(
            &Mapper::new(p, Flow::Forward),
            changes,
            &lanes(&p.source_key, changes),
        )
    }

    /// A write as (put or delete, target PK, change, puts, deletes).
    type Shown = (&'static str, String, usize, u64, u64);

    fn show(f: &Final) -> Shown {
        let (kind, item) = match &f.target {
            Target::Put(i) => ("put", i),
            Target::Delete(k) => ("delete", k),
        };
        let Some(Value::S(pk)) = item.get("PK") else {
            panic!("{item:?}")
        };
        (kind, pk.clone(), f.order.0, f.puts, f.deletes)
    }

    fn shown(r: &Reduced) -> Vec<Vec<Shown>> {
        r.rounds
            .iter()
            .map(|w| w.iter().map(show).collect())
            .collect()
    }

    #[test]
    fn a_key_changing_modify_is_a_delete_of_the_old_key_and_a_put_of_the_new_in_one_batch() {
        let p = plan(BY_STATUS);
        let r = reduced(&p, &[modify("1", "OPEN", "DONE")]);
        assert_eq!(
            shown(&r),
            [[
                ("delete", "ST#OPEN".into(), 0, 0, 1),
                ("put", "ST#DONE".into(), 0, 1, 0)
            ]]
        );
    }

    #[test]
    fn an_insert_then_a_remove_of_one_item_in_one_response_is_only_a_delete() {
        let p = plan(BY_STATUS);
        let r = reduced(&p, &[insert("1", "OPEN"), remove("1", "OPEN")]);
        assert_eq!(shown(&r), [[("delete", "ST#OPEN".into(), 1, 1, 1)]]);
        // Through a key change: each key's last word, both deletes.
        let r = reduced(
            &p,
            &[
                insert("1", "OPEN"),
                modify("1", "OPEN", "DONE"),
                remove("1", "DONE"),
            ],
        );
        assert_eq!(
            shown(&r),
            [[
                ("delete", "ST#OPEN".into(), 1, 1, 1),
                ("delete", "ST#DONE".into(), 2, 1, 1)
            ]]
        );
        // Removed and inserted again: the last put.
        let r = reduced(
            &p,
            &[
                insert("1", "OPEN"),
                remove("1", "OPEN"),
                insert("1", "OPEN"),
            ],
        );
        assert_eq!(shown(&r), [[("put", "ST#OPEN".into(), 2, 2, 1)]]);
    }

    #[test]
    fn two_lanes_on_one_target_key_go_in_rounds_in_stream_order() {
        let p = plan(COLLIDING);
        // Items 1 and 2 both map to ST#OPEN. Item 1's last write of the key
        // is change 2, item 2's is change 1: item 2's goes first.
        let changes = [
            insert("1", "OPEN"),
            insert("2", "OPEN"),
            modify("1", "OPEN", "OPEN"),
            insert("3", "DONE"),
        ];
        let r = reduced(&p, &changes);
        assert_eq!(
            shown(&r),
            [
                vec![
                    ("put", "ST#OPEN".into(), 1, 1, 0),
                    ("put", "ST#DONE".into(), 3, 1, 0)
                ],
                vec![("put", "ST#OPEN".into(), 2, 2, 0)],
            ]
        );
        // Item 2 leaves the key after item 1 wrote it last: the delete last.
        let r = reduced(&p, &[insert("1", "OPEN"), remove("2", "OPEN")]);
        assert_eq!(
            shown(&r),
            [
                [("put", "ST#OPEN".into(), 0, 1, 0)],
                [("delete", "ST#OPEN".into(), 1, 0, 1)]
            ]
        );
    }

    #[test]
    fn rejects_pass_through_and_the_old_key_is_still_deleted() {
        let p = plan(BY_STATUS);
        let mut bad = order("1", "OPEN");
        bad.remove("status");
        let r = reduced(
            &p,
            &[change(
                ChangeKind::Modify,
                Some(order("1", "OPEN")),
                Some(bad.clone()),
            )],
        );
        assert_eq!(shown(&r), [[("delete", "ST#OPEN".into(), 0, 0, 1)]]);
        assert_eq!(r.rejects.len(), 1);
        assert_eq!(r.rejects[0].0, bad);
    }

    /// Many changes over few items and statuses (colliding plan included):
    /// the rounds, applied in order, leave every target key as applying each
    /// record's actions one by one in stream order does; no round names a key
    /// twice; the counters add up to the actions.
    #[test]
    fn the_rounds_leave_what_applying_every_record_in_order_leaves() {
        const STATUSES: [&str; 3] = ["OPEN", "PAID", "DONE"];
        for text in [BY_STATUS, COLLIDING] {
            let p = plan(text);
            let mut several_rounds = 0;
            let names = p.target_key.names();
            let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
            let mut next = |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            for _ in 0..200 {
                // The source: id → status, absent when deleted.
                let mut source: HashMap<String, &str> = HashMap::new();
                let mut changes = Vec::new();
                for _ in 0..next(40) {
                    let id = next(5).to_string();
                    let status = STATUSES[next(3) as usize];
                    changes.push(match (source.get(&id).copied(), next(3)) {
                        (None, _) => insert(&id, status),
                        (Some(old), 0) => remove(&id, old),
                        (Some(old), _) => modify(&id, old, status),
                    });
                    match changes.last().unwrap().kind {
                        ChangeKind::Remove => source.remove(&id),
                        _ => source.insert(id, status),
                    };
                }
                let key = |i: &Item| encode_key(i, &names).unwrap();
                let mut one_by_one: HashMap<Vec<u8>, Option<Item>> = HashMap::new();
                let (mut puts, mut deletes) = (0, 0);
                for c in &changes {
                    for a in actions(&p, c) {
                        match a {
                            Action::Put(i) => {
                                puts += 1;
                                one_by_one.insert(key(&i), Some(i));
                            }
                            Action::Delete(k) => {
                                deletes += 1;
                                one_by_one.insert(key(&k), None);
                            }
                            a => panic!("{a:?}"),
                        }
                    }
                }
                let r = reduced(&p, &changes);
                several_rounds += usize::from(r.rounds.len() > 1);
                let mut batched: HashMap<Vec<u8>, Option<Item>> = HashMap::new();
                for round in &r.rounds {
                    let mut seen = HashSet::new();
                    for f in round {
                        let (k, v) = match &f.target {
                            Target::Put(i) => (key(i), Some(i.clone())),
                            Target::Delete(k) => (key(k), None),
                        };
                        assert!(seen.insert(k.clone()), "a key twice in a round");
                        batched.insert(k, v);
                    }
                }
                assert_eq!(batched, one_by_one, "{changes:?}");
                let all = r.rounds.iter().flatten();
                assert_eq!(all.clone().map(|f| f.puts).sum::<u64>(), puts);
                assert_eq!(all.map(|f| f.deletes).sum::<u64>(), deletes);
            }
            assert_eq!(several_rounds > 0, text == COLLIDING);
        }
    }
}
