//! In-place mode: the plan's computed attributes (say a new GSI's keys) set on
//! the items of a live table, without ever overwriting an application write.
//!
//! The pure half decides, for one item as read, what to write:
//! [`plan_update`] gives an UpdateItem of just the attributes that differ
//! (SET) or must go (REMOVE), with the values of every input it was computed
//! from ([`crate::core::plan::Plan::inputs`]); [`condition`] turns those into a
//! ConditionExpression — the item still exists and every input still holds the
//! value read (`attribute_not_exists` for an absent one). [`plan_undo`] is the
//! reverse: remove a computed attribute only where it still holds what the
//! plan computes from the item's current inputs. [`check_item`] is what a
//! verify compares.
//!
//! The I/O half, [`apply`], sends the UpdateItem; on ConditionalCheckFailed
//! (the application changed the item between the read and the write) it
//! re-reads the item with a consistent GetItem and decides again, a bounded
//! number of times. An item deleted meanwhile is skipped, never resurrected.
//!
//! Invariant: rekey never overwrites a concurrent application write in place:
//! every write is conditioned on the inputs it was computed from.
//! Invariant: no loop: an item whose computed attributes are already right is
//! never written, and the item rekey's own write leaves behind is such an item,
//! so the tail reading its own writes from the stream writes nothing for them.

use serde::Serialize;

use crate::aws::item::{self, Expressions};
use crate::aws::rate::Control;
use crate::aws::retry::{backoff, jitter};
use crate::aws::{AwsError, Clients};
use crate::core::plan::Plan;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, Value};

/// One conditional UpdateItem: the pure description of an in-place write.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateWrite {
    /// The item's primary key.
    pub key: Item,
    pub set: Vec<(String, Value)>,
    pub remove: Vec<String>,
    /// Every input the write was computed from, with the value read (None: absent).
    pub expect: Vec<(String, Option<Value>)>,
}

/// What the in-place mode does with one item as read.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Write(UpdateWrite),
    /// The computed attributes already hold what the plan gives.
    Correct,
    /// No rule matched (`unmatched = "skip"`) or a drain marker.
    Skip,
    Reject(String),
}

fn key_of(plan: &Plan, item: &Item) -> Item {
    plan.source_key
        .names()
        .iter()
        .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
        .collect()
}

fn expect_of(plan: &Plan, rule: usize, item: &Item) -> Vec<(String, Option<Value>)> {
    plan.inputs(rule)
        .into_iter()
        .map(|a| (a.to_string(), item.get(a).cloned()))
        .collect()
}

/// The computed attributes for `item`: (rule index, the transformed item), or
/// what to do instead.
fn computed(plan: &Plan, item: &Item) -> Result<(usize, Item), Decision> {
    match transform(plan, item) {
        Outcome::Put {
            rule: Some(i),
            item: out,
        } => Ok((i, out)),
        // In place there is no copy of unmatched items (the plan refuses it).
        Outcome::Put { rule: None, .. } | Outcome::Skip => Err(Decision::Skip),
        Outcome::Reject(r) => Err(Decision::Reject(r.to_string())),
    }
}

/// The write that makes `item` hold what the plan computes, if any.
pub fn plan_update(plan: &Plan, item: &Item) -> Decision {
    let (i, out) = match computed(plan, item) {
        Ok(c) => c,
        Err(d) => return d,
    };
    let rule = &plan.rules[i];
    let set: Vec<(String, Value)> = rule
        .set
        .iter()
        .filter(|s| item.get(&s.name) != out.get(&s.name))
        .filter_map(|s| out.get(&s.name).map(|v| (s.name.clone(), v.clone())))
        .collect();
    let remove: Vec<String> = rule
        .remove
        .iter()
        .filter(|r| item.contains_key(*r))
        .cloned()
        .collect();
    if set.is_empty() && remove.is_empty() {
        return Decision::Correct;
    }
    Decision::Write(UpdateWrite {
        key: key_of(plan, item),
        set,
        remove,
        expect: expect_of(plan, i, item),
    })
}

/// Undo: remove each attribute the rule sets, but only where it still holds
/// exactly what the plan computes from the item's current inputs — a value the
/// application wrote itself is left alone. The condition also pins the removed
/// attributes to the values read. (Attributes a rule `remove`d cannot be
/// brought back: their old values are gone.)
pub(crate) fn plan_undo(plan: &Plan, item: &Item) -> Decision {
    let (i, out) = match computed(plan, item) {
        Ok(c) => c,
        Err(Decision::Reject(_)) => return Decision::Skip,
        Err(d) => return d,
    };
    let rule = &plan.rules[i];
    let mut expect = expect_of(plan, i, item);
    let mut remove = Vec::new();
    for s in &rule.set {
        if let Some(v) = item.get(&s.name)
            && out.get(&s.name) == Some(v)
        {
            remove.push(s.name.clone());
            expect.push((s.name.clone(), Some(v.clone())));
        }
    }
    if remove.is_empty() {
        return Decision::Correct;
    }
    Decision::Write(UpdateWrite {
        key: key_of(plan, item),
        set: Vec::new(),
        remove,
        expect,
    })
}

/// One computed attribute that does not hold what the plan gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttrDifference {
    pub attr: String,
    /// None: the plan removes it.
    pub expected: Option<Value>,
    pub found: Option<Value>,
}

/// How an item differs from what the in-place plan computes for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub key: Item,
    pub rule: String,
    pub attrs: Vec<AttrDifference>,
}

/// For a verify of an in-place plan: None when the item holds what the plan
/// computes (or the plan leaves it alone: unmatched, marker, or a reject,
/// which the backfill reports in its rejects file).
pub fn check_item(plan: &Plan, item: &Item) -> Option<Difference> {
    let Decision::Write(w) = plan_update(plan, item) else {
        return None;
    };
    let rule = crate::core::transform::match_rule(plan, item)
        .map_or_else(String::new, |(_, r, _)| r.name.clone());
    let attrs = w
        .set
        .iter()
        .map(|(a, v)| AttrDifference {
            attr: a.clone(),
            expected: Some(v.clone()),
            found: item.get(a).cloned(),
        })
        .chain(w.remove.iter().map(|a| AttrDifference {
            attr: a.clone(),
            expected: None,
            found: item.get(a).cloned(),
        }))
        .collect();
    Some(Difference {
        key: w.key,
        rule,
        attrs,
    })
}

/// The UpdateExpression and ConditionExpression of a write. Every attribute
/// name goes through a `#` placeholder (names may be reserved words or hold
/// any character); the item must still exist (`attribute_exists` of its
/// partition key), every input must hold the value read, and at least one
/// computed attribute must still differ from what the write sets.
pub fn expressions(plan: &Plan, w: &UpdateWrite) -> Expressions {
    let mut e = Expressions::default();
    fn name(e: &mut Expressions, a: &str) -> String {
        if let Some((p, _)) = e.names.iter().find(|(_, v)| v.as_str() == a) {
            return p.clone();
        }
        let p = format!("#n{}", e.names.len());
        e.names.insert(p.clone(), a.to_string());
        p
    }
    let mut sets = Vec::new();
    for (i, (a, v)) in w.set.iter().enumerate() {
        let n = name(&mut e, a);
        let p = format!(":s{i}");
        e.values.insert(p.clone(), v.clone());
        sets.push(format!("{n} = {p}"));
    }
    let removes: Vec<String> = w.remove.iter().map(|a| name(&mut e, a)).collect();
    let mut update = Vec::new();
    if !sets.is_empty() {
        update.push(format!("SET {}", sets.join(", ")));
    }
    if !removes.is_empty() {
        update.push(format!("REMOVE {}", removes.join(", ")));
    }
    e.update = update.join(" ");
    let pk = &plan.source_key.partition_key.name;
    let mut conds = vec![format!("attribute_exists({})", name(&mut e, pk))];
    for (i, (a, v)) in w.expect.iter().enumerate() {
        let n = name(&mut e, a);
        match v {
            None => conds.push(format!("attribute_not_exists({n})")),
            Some(v) => {
                let p = format!(":e{i}");
                e.values.insert(p.clone(), v.clone());
                conds.push(format!("{n} = {p}"));
            }
        }
    }
    // And the write still changes something: an item made right meanwhile
    // (by the application, or a tail applying an older record) is not written
    // again, which would only put one more record on the stream.
    let mut changes: Vec<String> = w
        .set
        .iter()
        .enumerate()
        .map(|(i, (a, _))| {
            let n = name(&mut e, a);
            format!("attribute_not_exists({n}) OR {n} <> :s{i}")
        })
        .collect();
    changes.extend(
        w.remove
            .iter()
            .map(|a| format!("attribute_exists({})", name(&mut e, a))),
    );
    conds.push(format!("({})", changes.join(" OR ")));
    e.condition = conds.join(" AND ");
    e
}

/// Which decision [`apply`] makes on a re-read item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Undo,
}

impl Direction {
    pub(crate) fn decide(self, plan: &Plan, item: &Item) -> Decision {
        match self {
            Direction::Forward => plan_update(plan, item),
            Direction::Undo => plan_undo(plan, item),
        }
    }
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    Written {
        consumed: f64,
    },
    /// Nothing to write after a re-read: already right, unmatched, or deleted meanwhile.
    Skipped {
        consumed: f64,
    },
    Rejected {
        reason: String,
        consumed: f64,
    },
}

/// Re-reads after a failed condition before giving up on an item (it is then
/// rejected: an item rewritten this often is being written by the application,
/// and the tail sees each of those writes).
pub(crate) const MAX_CONFLICTS: u32 = 5;

/// Send one decision's write, retrying throttles and transient failures; on a
/// failed condition, re-read the item (consistent GetItem) and decide again.
pub async fn apply(
    clients: &Clients,
    plan: &Plan,
    control: &Control,
    direction: Direction,
    first: Decision,
    max_retries: u32,
) -> anyhow::Result<Applied> {
    let table = &plan.target_table;
    let mut decision = first;
    let mut conflicts = 0;
    let mut consumed = 0.0;
    loop {
        let w = match decision {
            Decision::Write(w) => w,
            Decision::Correct | Decision::Skip => return Ok(Applied::Skipped { consumed }),
            Decision::Reject(reason) => return Ok(Applied::Rejected { reason, consumed }),
        };
        let e = expressions(plan, &w);
        let outcome = retried(control, table, max_retries, || {
            item::update_item_if(clients, table, &w.key, &e)
        })
        .await?;
        match outcome {
            Some(c) => {
                consumed += c;
                return Ok(Applied::Written { consumed });
            }
            None => {
                // A failed condition still costs the write.
                consumed += 1.0;
                conflicts += 1;
                if conflicts > MAX_CONFLICTS {
                    return Ok(Applied::Rejected {
                        reason: format!(
                            "in place: the item changed under rekey {MAX_CONFLICTS} times in a row; left to the tail"
                        ),
                        consumed,
                    });
                }
                let current = retried(control, table, max_retries, || {
                    item::get_item(clients, table, &w.key, true)
                })
                .await?;
                consumed += 1.0;
                decision = match current {
                    // Deleted meanwhile: an UpdateItem would resurrect it.
                    None => Decision::Skip,
                    Some(item) => direction.decide(plan, &item),
                };
            }
        }
    }
}

/// One call, retried through throttles (never gives up) and up to
/// `max_retries` transient failures.
pub(crate) async fn retried<T, F, Fut>(
    control: &Control,
    table: &str,
    max_retries: u32,
    call: F,
) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, AwsError>>,
{
    let mut attempt = 0;
    let mut failures = 0;
    loop {
        let _in_flight = control.acquire_write(1.0).await;
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_throttle() => {
                control.write_throttled(&e, attempt).await;
                attempt = (attempt + 1).min(6);
            }
            Err(e) if e.is_transient() && failures < max_retries => {
                failures += 1;
                tokio::time::sleep(backoff(failures, jitter())).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("in-place write to `{table}`")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const PLAN: &str = r#"
[source]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[target]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[[target.index]]
name = "GSI2"
partition_key = "GSI2PK"
sort_key = "GSI2SK"
[options]
unmatched = "skip"
[[rule]]
name = "task"
match = { PK = "TENANT#{tenant}", SK = "TASK#{task_id}" }
set = { GSI2PK = "TENANT#{tenant}#STATUS#{@status}#BUCKET#{shard(task_id, 16):02}", GSI2SK = "{@created}#{task_id}" }
remove = ["GSI1PK"]
"#;

    fn plan() -> Plan {
        Plan::parse(PLAN, Path::new("p.toml")).unwrap()
    }

    fn task(status: Option<&str>) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S("TENANT#t1".into()));
        i.insert("SK".into(), Value::S("TASK#42".into()));
        i.insert("created".into(), Value::N("7".into()));
        if let Some(s) = status {
            i.insert("status".into(), Value::S(s.into()));
        }
        i
    }

    fn done(p: &Plan, item: &Item) -> Item {
        match transform(p, item) {
            Outcome::Put { item, .. } => item,
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn a_new_item_gets_the_computed_attributes_conditioned_on_its_inputs() {
        let p = plan();
        let mut it = task(Some("OPEN"));
        it.insert("GSI1PK".into(), Value::S("STATUS#OPEN".into()));
        let Decision::Write(w) = plan_update(&p, &it) else {
            panic!()
        };
        assert_eq!(
            w.set.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
            vec!["GSI2PK", "GSI2SK"]
        );
        assert_eq!(w.remove, vec!["GSI1PK".to_string()]);
        assert_eq!(w.key.len(), 2);
        let names: Vec<&str> = w.expect.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(names, vec!["PK", "SK", "created", "status"]);
        // Only what differs: the item after the write is correct.
        let after = done(&p, &it);
        assert_eq!(plan_update(&p, &after), Decision::Correct);
        assert_eq!(check_item(&p, &after), None);
        let d = check_item(&p, &it).unwrap();
        assert_eq!(d.rule, "task");
        assert_eq!(d.attrs.len(), 3);
        assert_eq!(d.attrs[2].expected, None);
    }

    #[test]
    fn only_the_attributes_that_differ_are_set() {
        let p = plan();
        let mut it = done(&p, &task(Some("OPEN")));
        it.insert("status".into(), Value::S("DONE".into()));
        let Decision::Write(w) = plan_update(&p, &it) else {
            panic!()
        };
        assert_eq!(w.set.len(), 1);
        assert_eq!(w.set[0].0, "GSI2PK");
        assert!(w.remove.is_empty());
    }

    #[test]
    fn a_missing_input_is_a_reject_and_unmatched_items_are_skipped() {
        let p = plan();
        assert!(
            matches!(plan_update(&p, &task(None)), Decision::Reject(r) if r.contains("status"))
        );
        let mut other = task(Some("OPEN"));
        other.insert("SK".into(), Value::S("NOTE#1".into()));
        assert_eq!(plan_update(&p, &other), Decision::Skip);
        assert_eq!(check_item(&p, &other), None);
    }

    #[test]
    fn the_condition_pins_every_input_and_the_item_s_existence() {
        let p = plan();
        let mut it = task(Some("OPEN"));
        it.remove("created");
        it.insert("created".into(), Value::S("x".into()));
        let Decision::Write(mut w) = plan_update(&p, &it) else {
            panic!()
        };
        w.expect.push(("gone".into(), None));
        let e = expressions(&p, &w);
        assert_eq!(e.update, "SET #n0 = :s0, #n1 = :s1");
        assert_eq!(
            e.condition,
            "attribute_exists(#n2) AND #n2 = :e0 AND #n3 = :e1 AND #n4 = :e2 AND #n5 = :e3 AND attribute_not_exists(#n6) \
             AND (attribute_not_exists(#n0) OR #n0 <> :s0 OR attribute_not_exists(#n1) OR #n1 <> :s1)"
        );
        assert_eq!(e.names["#n0"], "GSI2PK");
        assert_eq!(e.names["#n2"], "PK");
        assert_eq!(e.names["#n5"], "status");
        assert_eq!(e.names["#n6"], "gone");
        assert_eq!(e.values[":e3"], Value::S("OPEN".into()));
        assert_eq!(e.values.len(), 6);
        // Every placeholder used is defined and every one defined is used.
        let text = format!("{} {}", e.update, e.condition);
        for k in e.names.keys().chain(e.values.keys()) {
            assert!(text.contains(k.as_str()), "{k} unused");
        }
    }

    #[test]
    fn remove_only_writes_have_no_set_clause() {
        let p = plan();
        let it = task(Some("OPEN"));
        let Decision::Write(w) = plan_undo(&p, &done(&p, &it)) else {
            panic!()
        };
        let e = expressions(&p, &w);
        assert_eq!(e.update, "REMOVE #n0, #n1");
        assert!(e.condition.contains("#n0 = :e"), "{}", e.condition);
    }

    #[test]
    fn undo_removes_only_what_still_holds_the_plan_s_value() {
        let p = plan();
        let it = task(Some("OPEN"));
        let mut after = done(&p, &it);
        assert_eq!(plan_undo(&p, &it), Decision::Correct, "nothing to undo");
        // The application changed status since: GSI2PK no longer is the plan's value.
        after.insert("status".into(), Value::S("DONE".into()));
        let Decision::Write(w) = plan_undo(&p, &after) else {
            panic!()
        };
        assert_eq!(w.remove, vec!["GSI2SK".to_string()]);
        assert!(
            w.expect
                .contains(&("GSI2SK".into(), after.get("GSI2SK").cloned()))
        );
        // A reject is left alone.
        assert_eq!(plan_undo(&p, &task(None)), Decision::Skip);
    }

    proptest::proptest! {
        /// For any status and prior attribute values: one write makes the item
        /// correct, and a correct item is never written (no loop).
        #[test]
        fn one_write_converges(status in "[A-Z]{1,6}", old in proptest::option::of("[A-Z#0-9]{0,8}"), has_old in proptest::bool::ANY) {
            let p = plan();
            let mut it = task(Some(&status));
            if let Some(o) = old { it.insert("GSI2PK".into(), Value::S(o)); }
            if has_old { it.insert("GSI1PK".into(), Value::S("x".into())); }
            let after = match plan_update(&p, &it) {
                Decision::Write(w) => {
                    let mut a = it.clone();
                    for (k, v) in w.set { a.insert(k, v); }
                    for k in w.remove { a.remove(&k); }
                    a
                }
                Decision::Correct => it.clone(),
                d => panic!("{d:?}"),
            };
            proptest::prop_assert_eq!(plan_update(&p, &after), Decision::Correct);
            proptest::prop_assert_eq!(check_item(&p, &after), None);
            let mut undone = after.clone();
            if let Decision::Write(w) = plan_undo(&p, &after) {
                for k in w.remove { undone.remove(&k); }
            }
            proptest::prop_assert!(!undone.contains_key("GSI2PK") && !undone.contains_key("GSI2SK"));
        }
    }
}
