//! The transform of an item the caller gives away (a page rekey read and
//! will drop): the target is the source item itself, its replaced
//! attributes taken out and the rendered ones put in — nothing is copied.
//! Copying every kept attribute was most of the transform's time
//! (BENCHMARKS.md (f6)). What the move took out is kept in a [`Remnant`],
//! from which a reject decided later (a collision, a write DynamoDB refused)
//! gets the source item back whole for the rejects file.
//!
//! It decides exactly as [`super::transform`] does (the same `decide`, the
//! same `check`); a proptest holds the two to the same target, and the
//! remnant to the same source.

use std::borrow::Cow;

use super::{Decided, Reject, Taken, check, decide, rejected};
use crate::core::plan::Plan;
use crate::core::value::{Item, Value};

#[derive(Debug)]
pub enum Owned<'p> {
    /// Write `item`; `remnant` gives the source back.
    Put {
        rule: Option<usize>,
        item: Item,
        remnant: Remnant<'p>,
    },
    /// The source item, untouched, and why.
    Reject(Reject, Item),
    Skip,
}

/// What a transform took out of the source item, and the names it added:
/// the source is the target without the added names, with the taken
/// attributes put back.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Remnant<'p> {
    /// The source's own attributes the target does not hold as they were.
    taken: Vec<(String, Value)>,
    /// Names the target holds that the source did not (or held otherwise).
    added: Vec<Cow<'p, str>>,
}

impl Remnant<'_> {
    /// The source item, from the target it was turned into.
    pub(crate) fn restore(self, mut target: Item) -> Item {
        for name in &self.added {
            target.remove(name.as_ref());
        }
        target.extend(self.taken);
        target
    }

    /// A source attribute's value, beside the target it was turned into.
    pub(crate) fn source_value<'a>(&'a self, target: &'a Item, name: &str) -> Option<&'a Value> {
        match self.taken.iter().find(|(n, _)| n == name) {
            Some((_, v)) => Some(v),
            None if self.added.iter().any(|a| a == name) => None,
            None => target.get(name),
        }
    }

    fn known(&self, name: &str) -> bool {
        self.added.iter().any(|a| a == name) || self.taken.iter().any(|(n, _)| n == name)
    }

    /// Keeps `value`, once held under `name` in the item being built, if it
    /// is the source's: not something this transform wrote, nor a second
    /// sight of an attribute already taken.
    fn keep(&mut self, name: String, value: Value) {
        if !self.known(&name) {
            self.taken.push((name, value));
        }
    }

    fn take(&mut self, item: &mut Item, name: &str) {
        if let Some((name, value)) = item.remove_entry(name) {
            self.keep(name, value);
        }
    }
}

impl<'p> Remnant<'p> {
    fn write(&mut self, item: &mut Item, name: Cow<'p, str>, value: Value) {
        match item.insert(name.to_string(), value) {
            Some(old) => self.keep(name.into_owned(), old),
            None if self.added.contains(&name) => {}
            None => self.added.push(name),
        }
    }
}

/// [`super::transform`] of an item given away.
pub fn transform_owned(plan: &Plan, mut item: Item) -> Owned<'_> {
    let (index, rule, rendered) = match decide(plan, &item) {
        Decided::Reject(r) => return Owned::Reject(r, item),
        Decided::Skip => return Owned::Skip,
        Decided::Copy => {
            return Owned::Put {
                rule: None,
                item,
                remnant: Remnant::default(),
            };
        }
        Decided::Apply(index, rule, rendered) => (index, rule, rendered),
    };
    let taken = Taken::new(plan, rule);
    let mut rem = Remnant::default();
    for name in taken.replaced_names() {
        rem.take(&mut item, name);
    }
    for (name, a) in taken.prefixed() {
        let value = rem
            .source_value(&item, &a.name)
            .cloned()
            .expect("decide() checked that the source key is there");
        rem.write(&mut item, Cow::Owned(name), value);
    }
    for r in &rule.remove {
        rem.take(&mut item, r);
    }
    for (name, value) in rendered {
        rem.write(&mut item, Cow::Borrowed(name), value);
    }
    match check(plan, &item) {
        Ok(()) => Owned::Put {
            rule: Some(index),
            item,
            remnant: rem,
        },
        Err(reason) => Owned::Reject(rejected(Some(rule), reason), rem.restore(item)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;
    use crate::core::transform::{Outcome, transform};

    /// Plans whose rules take, keep, remove and overwrite attributes in every
    /// way the move has to undo.
    const PLANS: &[&str] = &[
        // The source key kept under a prefix, a dropped and a removed attribute,
        // a rendered index key, and a second rule that renders the same key.
        r#"
[source]
table = "a"
partition_key = "PK"
sort_key = "SK"
[target]
table = "b"
partition_key = "PK"
sort_key = "SK"
[[target.index]]
name = "GSI1"
partition_key = "GSI1PK"
[options]
drop = ["legacy"]
source_key_prefix = "old_"
[[rule]]
name = "order"
match = { PK = "TENANT#{tenant}#DAY#{day}", SK = "ORDER#{order_id}" }
key = { PK = "TENANT#{tenant}#DAY#{day}#SHARD#{shard(order_id,4):02}", SK = "ORDER#{order_id}" }
set = { GSI1PK = "TENANT#{tenant}#STATUS#{@status}" }
remove = ["tmp"]
[[rule]]
name = "profile"
match = { PK = "TENANT#{tenant}", SK = "PROFILE" }
key = { PK = "TENANT#{tenant}", SK = "PROFILE" }
"#,
        // `set` overwrites an attribute the source has and one the prefix
        // wrote; unmatched items are copied whole.
        r#"
[source]
table = "a"
partition_key = "PK"
sort_key = "SK"
[target]
table = "b"
partition_key = "PK"
sort_key = "SK"
[options]
source_key_prefix = "old_"
unmatched = "copy"
[[rule]]
name = "r"
match = { PK = "T#{t}" }
key = { PK = "N#{t}", SK = "{@SK}" }
set = { status = "S#{@status}", old_SK = "again {@SK}" }
remove = ["tmp"]
"#,
        // A target key of another name (the source's goes), no prefix, two
        // dropped attributes, unmatched items skipped.
        r#"
[source]
table = "a"
partition_key = "PK"
[target]
table = "b"
partition_key = "id"
[options]
drop = ["legacy", "x"]
unmatched = "skip"
[[rule]]
name = "r"
match = { PK = "T#{t}" }
key = { id = "N#{t}#{@status}" }
"#,
    ];

    fn plans() -> Vec<Plan> {
        PLANS
            .iter()
            .map(|text| Plan::parse(text, Path::new("t.toml")).unwrap_or_else(|e| panic!("{e:#}")))
            .collect()
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9#]{0,6}",
            "T#[a-z]{1,3}",
            "TENANT#[a-z]{1,3}(#DAY#[0-9]{1,2})?"
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(Value::S),
            (0u32..100).prop_map(|n| Value::N(n.to_string())),
            any::<bool>().prop_map(Value::Bool),
        ]
    }

    fn source() -> impl Strategy<Value = Item> {
        const OTHERS: &[&str] = &["status", "tmp", "legacy", "old_PK", "old_SK", "GSI1PK", "x"];
        let sk = prop_oneof![
            Just(Value::S("PROFILE".into())),
            "ORDER#[a-z0-9]{1,4}".prop_map(Value::S),
            text().prop_map(Value::S),
        ];
        (
            text(),
            proptest::option::of(sk),
            proptest::collection::btree_map(proptest::sample::select(OTHERS), value(), 0..7),
        )
            .prop_map(|(pk, sk, rest)| {
                let mut item: Item = rest.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                item.insert("PK".into(), Value::S(pk));
                if let Some(sk) = sk {
                    item.insert("SK".into(), sk);
                }
                item
            })
    }

    #[test]
    fn every_plan_here_parses() {
        assert_eq!(plans().len(), PLANS.len());
    }

    proptest! {
        /// The move decides and builds exactly what the copy does, and
        /// what it took out gives the source back.
        #[test]
        fn the_owned_transform_is_the_transform_and_gives_the_source_back(item in source()) {
            for plan in plans() {
                let copied = transform(&plan, &item);
                match (transform_owned(&plan, item.clone()), copied) {
                    (Owned::Put { rule, item: out, remnant }, Outcome::Put { rule: r2, item: out2 }) => {
                        prop_assert_eq!(rule, r2);
                        prop_assert_eq!(&out, &out2);
                        for a in plan.source_key.attrs() {
                            prop_assert_eq!(remnant.source_value(&out, &a.name), item.get(&a.name));
                        }
                        prop_assert_eq!(&remnant.restore(out), &item);
                    }
                    (Owned::Reject(r, back), Outcome::Reject(r2)) => {
                        prop_assert_eq!(r, r2);
                        prop_assert_eq!(&back, &item);
                    }
                    (Owned::Skip, Outcome::Skip) => {}
                    (a, b) => prop_assert!(false, "owned {a:?} but copied {b:?}"),
                }
            }
        }
    }
}
