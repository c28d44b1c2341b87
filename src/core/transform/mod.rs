//! The pure core: one source item in, what the target must hold out.
//!
//! No I/O, no clock, no randomness: the same plan and item give the same answer
//! on every run, in every process. That is what makes a rerun idempotent and
//! lets backfill, tail and verify agree on what "correct" means without talking
//! to each other.
//!
//! Building the target item, in order: start from the source item; take away the
//! source key attributes (they are replaced), `options.drop` and the rule's
//! `remove`; keep the source key under `source_key_prefix` if asked; render the
//! target key and the `set` attributes. Then check the result is an item
//! DynamoDB will store (key values non-empty and within size, whole item ≤ 400 KB).

use std::fmt;

use crate::core::plan::{KeySchema, Mode, Plan, Rule, Unmatched};
use crate::core::template::{RenderError, Scope};
use crate::core::value::{
    Item, MAX_ITEM_BYTES, MAX_PARTITION_KEY_BYTES, MAX_SORT_KEY_BYTES, ScalarType, Value,
    is_valid_number, item_size,
};

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Write this item to the target. `rule` is None for an unmatched item copied unchanged.
    Put {
        rule: Option<usize>,
        item: Item,
    },
    Reject(Reject),
    /// Counted, not written (`unmatched = "skip"`, or a drain marker).
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// The rule that matched, if one did.
    pub rule: Option<String>,
    pub reason: RejectReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    NoRuleMatched,
    MissingSourceKey(String),
    Render {
        attr: String,
        error: RenderError,
    },
    NotANumber {
        attr: String,
        text: String,
    },
    EmptyKey(String),
    KeyTooLarge {
        attr: String,
        bytes: usize,
        limit: usize,
    },
    TooLarge {
        bytes: usize,
    },
}

impl RejectReason {
    /// A short stable label for grouping in reports.
    pub fn kind(&self) -> String {
        match self {
            RejectReason::NoRuleMatched => "no rule matched".into(),
            RejectReason::MissingSourceKey(a) => format!("source key `{a}` missing"),
            RejectReason::Render { attr, error } => format!("`{attr}`: {error}"),
            RejectReason::NotANumber { attr, .. } => format!("`{attr}` renders a non-number"),
            RejectReason::EmptyKey(a) => format!("`{a}` renders empty"),
            RejectReason::KeyTooLarge { attr, .. } => format!("`{attr}` too large for a key"),
            RejectReason::TooLarge { .. } => "item over 400 KB".into(),
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::NoRuleMatched => f.write_str("no rule matched the item"),
            RejectReason::MissingSourceKey(a) => {
                write!(f, "the item has no source key attribute `{a}`")
            }
            RejectReason::Render { attr, error } => write!(f, "cannot render `{attr}`: {error}"),
            RejectReason::NotANumber { attr, text } => {
                write!(f, "`{attr}` is a number attribute but renders `{text}`")
            }
            RejectReason::EmptyKey(a) => write!(
                f,
                "key attribute `{a}` renders an empty string, which DynamoDB refuses"
            ),
            RejectReason::KeyTooLarge { attr, bytes, limit } => {
                write!(
                    f,
                    "key attribute `{attr}` renders {bytes} bytes, over DynamoDB's {limit}"
                )
            }
            RejectReason::TooLarge { bytes } => {
                write!(
                    f,
                    "the target item is {bytes} bytes, over DynamoDB's {MAX_ITEM_BYTES}"
                )
            }
        }
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Some(r) => write!(f, "rule `{r}`: {}", self.reason),
            None => write!(f, "{}", self.reason),
        }
    }
}

/// Capture name → captured text, in shape order, borrowed from the plan
/// and the item.
pub(crate) type Captures<'a> = Vec<(&'a str, &'a str)>;

mod owned;
pub use owned::{Owned, Remnant, transform_owned};

/// The first rule whose shapes all match, with its index and captures.
pub(crate) fn match_rule<'a>(
    plan: &'a Plan,
    item: &'a Item,
) -> Option<(usize, &'a Rule, Captures<'a>)> {
    'rules: for (i, rule) in plan.rules.iter().enumerate() {
        let mut captures = Vec::new();
        for (attr, shape) in &rule.matchers {
            let Some(text) = item.get(attr).and_then(Value::as_text) else {
                continue 'rules;
            };
            let Some(ranges) = shape.capture_ranges(text) else {
                continue 'rules;
            };
            captures.extend(
                shape
                    .captures
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .zip(ranges.into_iter().map(|r| &text[r])),
            );
        }
        return Some((i, rule, captures));
    }
    None
}

pub fn transform(plan: &Plan, item: &Item) -> Outcome {
    match decide(plan, item) {
        Decided::Reject(r) => Outcome::Reject(r),
        Decided::Skip => Outcome::Skip,
        Decided::Copy => Outcome::Put {
            rule: None,
            item: item.clone(),
        },
        Decided::Apply(index, rule, rendered) => match apply(plan, rule, rendered, item) {
            Ok(out) => Outcome::Put {
                rule: Some(index),
                item: out,
            },
            Err(reason) => Outcome::Reject(rejected(Some(rule), reason)),
        },
    }
}

fn rejected(rule: Option<&Rule>, reason: RejectReason) -> Reject {
    Reject {
        rule: rule.map(|r| r.name.clone()),
        reason,
    }
}

/// What the source item, as it is, decides: everything that reads it
/// before the target is built from it (so that [`transform_owned`] can then
/// take the item apart).
enum Decided<'p> {
    Reject(Reject),
    Skip,
    /// `unmatched = "copy"`: the item unchanged.
    Copy,
    /// The rule that matched, with its rendered attributes.
    Apply(usize, &'p Rule, Vec<(&'p str, Value)>),
}

fn decide<'p>(plan: &'p Plan, item: &Item) -> Decided<'p> {
    for a in plan.source_key.attrs() {
        if !item.contains_key(&a.name) {
            return Decided::Reject(rejected(
                None,
                RejectReason::MissingSourceKey(a.name.clone()),
            ));
        }
    }
    // rekey's own drain markers (barrier.rs) pass through the source only.
    if crate::core::marker::marker_id(plan, item).is_some() {
        return Decided::Skip;
    }
    let Some((index, _, captures)) = match_rule(plan, item) else {
        return match plan.unmatched {
            Unmatched::Reject => Decided::Reject(rejected(None, RejectReason::NoRuleMatched)),
            Unmatched::Skip => Decided::Skip,
            Unmatched::Copy => Decided::Copy,
        };
    };
    // The plan's own rule (match_rule's borrows the item too).
    let rule = &plan.rules[index];
    match render(plan, rule, &captures, item) {
        Ok(rendered) => Decided::Apply(index, rule, rendered),
        Err(reason) => Decided::Reject(rejected(Some(rule), reason)),
    }
}

fn apply(
    plan: &Plan,
    rule: &Rule,
    rendered: Vec<(&str, Value)>,
    item: &Item,
) -> Result<Item, RejectReason> {
    // Copy only what the target keeps (a clone and then removals cost a
    // string copy and a tree search per removed attribute).
    let taken = Taken::new(plan, rule);
    let mut out: Item = item
        .iter()
        .filter(|(k, _)| !taken.replaced(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (name, a) in taken.prefixed() {
        out.insert(name, item[&a.name].clone());
    }
    for r in &rule.remove {
        out.remove(r);
    }
    for (name, value) in rendered {
        out.insert(name.to_string(), value);
    }
    check(plan, &out)?;
    Ok(out)
}

/// The target key and `set` attributes, rendered from the source item as it
/// is (before anything is taken out of it), in the order they are written.
fn render<'p>(
    plan: &Plan,
    rule: &'p Rule,
    captures: &[(&str, &str)],
    item: &Item,
) -> Result<Vec<(&'p str, Value)>, RejectReason> {
    let scope = Scope {
        captures,
        item,
        default_hash: plan.hash,
    };
    let mut out = Vec::with_capacity(rule.key.len() + rule.set.len());
    for (attr, tpl) in &rule.key {
        let text = tpl.render(&scope).map_err(|error| RejectReason::Render {
            attr: attr.name.clone(),
            error,
        })?;
        out.push((attr.name.as_str(), typed(&attr.name, attr.ty, text)?));
    }
    for s in &rule.set {
        let text = s
            .template
            .render(&scope)
            .map_err(|error| RejectReason::Render {
                attr: s.name.clone(),
                error,
            })?;
        out.push((s.name.as_str(), typed(&s.name, s.ty, text)?));
    }
    Ok(out)
}

/// What a rule takes out of the source item before it writes its own
/// attributes: the source key when the rule renders a new one, and
/// `options.drop` (in a re-key only), and where the old key is kept.
struct Taken<'p> {
    plan: &'p Plan,
    rule: &'p Rule,
    rekey: bool,
}

impl<'p> Taken<'p> {
    fn new(plan: &'p Plan, rule: &'p Rule) -> Self {
        let rekey = plan.mode == Mode::Rekey;
        Taken { plan, rule, rekey }
    }

    fn replaced(&self, name: &str) -> bool {
        self.rekey
            && ((!self.rule.key.is_empty() && self.plan.source_key.attrs().any(|a| a.name == name))
                || self.plan.drop.iter().any(|d| d == name))
    }

    /// The names [`Taken::replaced`] answers yes to.
    fn replaced_names(&self) -> impl Iterator<Item = &'p str> + 'p {
        let (plan, rekey, keyed) = (self.plan, self.rekey, !self.rule.key.is_empty());
        let key = plan.source_key.attrs().filter(move |_| rekey && keyed);
        let drop = plan.drop.iter().filter(move |_| rekey);
        key.map(|a| a.name.as_str()).chain(drop.map(String::as_str))
    }

    /// `source_key_prefix` + each source key attribute, in a re-key.
    fn prefixed(&self) -> impl Iterator<Item = (String, &'p crate::core::plan::KeyAttr)> + 'p {
        let plan = self.plan;
        let prefix = plan.source_key_prefix.as_deref().filter(|_| self.rekey);
        prefix.into_iter().flat_map(move |prefix| {
            plan.source_key.attrs().map(move |a| {
                let mut name = String::with_capacity(prefix.len() + a.name.len());
                name.push_str(prefix);
                name.push_str(&a.name);
                (name, a)
            })
        })
    }
}

/// Is `out` an item DynamoDB will store as the target's?
fn check(plan: &Plan, out: &Item) -> Result<(), RejectReason> {
    check_key(&plan.target_key, out)?;
    // Index keys too: DynamoDB refuses an empty string for a GSI key attribute.
    for ix in &plan.indexes {
        for a in ix.key.attrs() {
            if matches!(out.get(&a.name), Some(Value::S(s)) if s.is_empty()) {
                return Err(RejectReason::EmptyKey(a.name.clone()));
            }
        }
    }
    let bytes = item_size(out);
    if bytes > MAX_ITEM_BYTES {
        return Err(RejectReason::TooLarge { bytes });
    }
    Ok(())
}

fn typed(attr: &str, ty: ScalarType, text: String) -> Result<Value, RejectReason> {
    Ok(match ty {
        ScalarType::S => Value::S(text),
        ScalarType::B => Value::B(text.into_bytes()),
        ScalarType::N => {
            if !is_valid_number(&text) {
                return Err(RejectReason::NotANumber {
                    attr: attr.to_string(),
                    text,
                });
            }
            Value::N(text)
        }
    })
}

fn check_key(key: &KeySchema, item: &Item) -> Result<(), RejectReason> {
    for (attr, limit) in std::iter::once((&key.partition_key, MAX_PARTITION_KEY_BYTES))
        .chain(key.sort_key.as_ref().map(|s| (s, MAX_SORT_KEY_BYTES)))
    {
        let bytes = match item.get(&attr.name) {
            Some(Value::S(s)) => s.len(),
            Some(Value::B(b)) => b.len(),
            Some(Value::N(_)) => continue,
            _ => return Err(RejectReason::MissingSourceKey(attr.name.clone())),
        };
        if bytes == 0 {
            return Err(RejectReason::EmptyKey(attr.name.clone()));
        }
        if bytes > limit {
            return Err(RejectReason::KeyTooLarge {
                attr: attr.name.clone(),
                bytes,
                limit,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::{HashFn, shard};
    use proptest::prelude::*;
    use std::path::Path;

    const PLAN: &str = r#"
[source]
table = "orders"
partition_key = "PK"
sort_key = "SK"
[target]
table = "orders_v2"
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
key = { PK = "TENANT#{tenant}#DAY#{day}#SHARD#{shard(order_id,16):02}", SK = "ORDER#{order_id}" }
set = { GSI1PK = "TENANT#{tenant}#STATUS#{@status}#B#{bucket(@created, week)}" }
remove = ["tmp"]
[[rule]]
name = "profile"
match = { PK = "TENANT#{tenant}", SK = "PROFILE" }
key = { PK = "TENANT#{tenant}", SK = "PROFILE" }
"#;

    fn plan() -> Plan {
        Plan::parse(PLAN, Path::new("t.toml")).unwrap()
    }

    fn item(json: &str) -> Item {
        serde_json::from_str(json).unwrap()
    }

    fn order() -> Item {
        item(
            r#"{"PK":{"S":"TENANT#acme#DAY#2026-07-07"},"SK":{"S":"ORDER#o-42"},"status":{"S":"OPEN"},
               "created":{"S":"2026-07-07T10:00:00Z"},"legacy":{"BOOL":true},"tmp":{"N":"1"},
               "total":{"N":"12.50"},"tags":{"SS":["a","b"]},"blob":{"B":"AAEC"},"meta":{"M":{"x":{"L":[{"NULL":true}]}}}}"#,
        )
    }

    #[test]
    fn rekeys_an_order_keeping_every_other_attribute_exactly() {
        let Outcome::Put { rule, item: out } = transform(&plan(), &order()) else {
            panic!()
        };
        assert_eq!(rule, Some(0));
        let s = shard(HashFn::Fnv1a32, "o-42", 16);
        assert_eq!(
            out["PK"],
            Value::S(format!("TENANT#acme#DAY#2026-07-07#SHARD#{s:02}"))
        );
        assert_eq!(out["SK"], Value::S("ORDER#o-42".into()));
        assert_eq!(
            out["GSI1PK"],
            Value::S("TENANT#acme#STATUS#OPEN#B#2026-W28".into())
        );
        assert_eq!(out["old_PK"], Value::S("TENANT#acme#DAY#2026-07-07".into()));
        assert!(!out.contains_key("legacy") && !out.contains_key("tmp"));
        for untouched in ["total", "tags", "blob", "meta", "status", "created"] {
            assert_eq!(out[untouched], order()[untouched], "{untouched}");
        }
        let Value::N(total) = &out["total"] else {
            panic!()
        };
        assert_eq!(total, "12.50", "numbers keep their text");
    }

    #[test]
    fn first_matching_rule_wins_and_unmatched_is_rejected() {
        let p = plan();
        let prof = item(r#"{"PK":{"S":"TENANT#acme"},"SK":{"S":"PROFILE"}}"#);
        assert!(matches!(
            transform(&p, &prof),
            Outcome::Put { rule: Some(1), .. }
        ));
        let other = item(r#"{"PK":{"S":"USER#1"},"SK":{"S":"X"}}"#);
        assert_eq!(
            transform(&p, &other),
            Outcome::Reject(Reject {
                rule: None,
                reason: RejectReason::NoRuleMatched
            })
        );
    }

    #[test]
    fn unmatched_policies() {
        let other = item(r#"{"PK":{"S":"USER#1"},"SK":{"S":"X"}}"#);
        let skip = Plan::parse(
            &PLAN.replace("[options]", "[options]\nunmatched = \"skip\""),
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(transform(&skip, &other), Outcome::Skip);
        let copy = Plan::parse(
            &PLAN.replace("[options]", "[options]\nunmatched = \"copy\""),
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(
            transform(&copy, &other),
            Outcome::Put {
                rule: None,
                item: other.clone()
            }
        );
    }

    #[test]
    fn data_problems_are_rejects_that_name_the_attribute() {
        let p = plan();
        let mut it = order();
        it.remove("status");
        let Outcome::Reject(r) = transform(&p, &it) else {
            panic!()
        };
        assert_eq!(r.rule.as_deref(), Some("order"));
        assert_eq!(
            r.reason,
            RejectReason::Render {
                attr: "GSI1PK".into(),
                error: RenderError::MissingAttribute("status".into())
            }
        );
        assert!(r.to_string().contains("attribute `status` is missing"));

        let mut it = order();
        it.insert("status".into(), Value::L(vec![]));
        let Outcome::Reject(r) = transform(&p, &it) else {
            panic!()
        };
        assert!(r.to_string().contains("`status` is L"), "{r}");

        let mut it = order();
        it.insert("created".into(), Value::S("yesterday".into()));
        let Outcome::Reject(r) = transform(&p, &it) else {
            panic!()
        };
        assert!(r.to_string().contains("bucket of `yesterday`"), "{r}");

        let mut it = order();
        it.remove("SK");
        assert_eq!(
            transform(&p, &it),
            Outcome::Reject(Reject {
                rule: None,
                reason: RejectReason::MissingSourceKey("SK".into())
            })
        );
    }

    #[test]
    fn oversized_items_are_rejected_after_the_transform() {
        let mut it = order();
        it.insert("big".into(), Value::S("x".repeat(MAX_ITEM_BYTES - 200)));
        let Outcome::Reject(r) = transform(&plan(), &it) else {
            panic!()
        };
        assert!(matches!(r.reason, RejectReason::TooLarge { bytes } if bytes > MAX_ITEM_BYTES));
        // The same item is fine without the added attributes: the check is on the result.
        let mut small = order();
        small.insert("big".into(), Value::S("x".repeat(MAX_ITEM_BYTES - 400)));
        assert!(matches!(transform(&plan(), &small), Outcome::Put { .. }));
    }

    #[test]
    fn empty_rendered_keys_are_rejected() {
        let p = Plan::parse(
            &PLAN.replace(
                "key = { PK = \"TENANT#{tenant}\", SK = \"PROFILE\" }",
                "key = { PK = \"TENANT#{tenant}\", SK = \"{@nick}\" }",
            ),
            Path::new("t"),
        )
        .unwrap();
        let prof = item(r#"{"PK":{"S":"TENANT#acme"},"SK":{"S":"PROFILE"},"nick":{"S":""}}"#);
        let Outcome::Reject(r) = transform(&p, &prof) else {
            panic!()
        };
        assert_eq!(r.reason, RejectReason::EmptyKey("SK".into()));
    }

    fn arb_text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9\u{e9}\u{1F980}-]{1,12}"
    }

    proptest! {
        /// The same item always gives the same target item, and the key a rerun
        /// computes is the key the first run wrote.
        #[test]
        fn transform_is_deterministic(tenant in arb_text(), id in arb_text(), day in 1u32..28, status in arb_text()) {
            let p = plan();
            let it = item(&format!(
                r#"{{"PK":{{"S":"TENANT#{tenant}#DAY#2026-02-{day:02}"}},"SK":{{"S":"ORDER#{id}"}},"status":{{"S":"{status}"}},"created":{{"N":"1783418400"}}}}"#
            ));
            let a = transform(&p, &it);
            let b = transform(&plan(), &it.clone());
            prop_assert_eq!(&a, &b);
            let Outcome::Put { item: out, .. } = a else { return Err(TestCaseError::fail("not put")) };
            let s = shard(HashFn::Fnv1a32, &id, 16);
            prop_assert_eq!(&out["PK"], &Value::S(format!("TENANT#{tenant}#DAY#2026-02-{day:02}#SHARD#{s:02}")));
        }
    }
}
