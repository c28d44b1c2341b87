//! The inverse of a plan: one target item in, the source item it came from out.
//!
//! A rollback after cutover replicates the target table's changes back to the
//! source (issue 13), so for every target item it needs the source item that
//! `transform` would turn into it. Pure like `transform`, for the same
//! reasons: the same answer in every process, testable as a function.
//!
//! How a target item is read back:
//!
//! 1. **Choose the rule by parsing.** A rule's target shapes are its key
//!    templates read backwards (captures, `shard()`/`bucket()` by their
//!    layout, attributes the item keeps as the text they hold) and the shapes
//!    of the matched attributes the target keeps. Exactly one rule must read
//!    the item; two is an ambiguous item (rejected), none is an item the plan
//!    copied unchanged (`unmatched = "copy"`: it reverses to itself, if read
//!    as a source item no rule would re-key it) or one no rule wrote (rejected).
//! 2. **Find every reading.** A key can split more than one way (`{a}#{b}`
//!    on `x#y#z`); `parse` finds them all, and captures bound in several
//!    places (both keys, a `set` attribute carrying a capture no key holds)
//!    must agree.
//! 3. **Rebuild and check each.** The source key is rendered from the rule's
//!    `match` shapes; the key attributes, the `set` attributes and the
//!    `source_key_prefix` copies are taken away; everything else is kept
//!    exactly. Each computed key part is recomputed from the rebuilt item and
//!    must equal what the key holds (a wrong shard is a reject that says so).
//!    Then the transform is run forwards: the rebuilt item must be matched by
//!    the same rule and give the same target key.
//! 4. **Exactly one source item.** Readings that rebuild the same item count
//!    once; two different ones mean two source items map to this key, and
//!    the item is rejected rather than guessed. The `source_key_prefix`
//!    copies are not needed (the application writes items without them after
//!    cutover); when present they are a cross-check.
//!
//! So the inverse never returns a wrong item: what it returns transforms back
//! into the target item's key by the same rule. A rule `reversibility` reports
//! as losing data (a capture nothing carries, a dropped attribute) rejects
//! every item; computed `set` attributes are derived, so they are removed, not
//! checked.

mod analysis;
mod compile;
mod injective;
mod irreversible;
mod parse;

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::fmt;

use crate::core::marker::MARKER_PREFIX;
use crate::core::plan::{KeyAttr, Mode, Plan, Unmatched};
use crate::core::template::{RenderError, Scope, Template};
use crate::core::transform::match_rule;
use crate::core::value::{Item, ScalarType, Value, is_valid_number};

pub(crate) use analysis::plan_notes;
pub use analysis::{RuleReversibility, reversibility};
pub use injective::key_injective;
pub use irreversible::{Irreversible, Removal};

use compile::{Reading, Role, RuleInverse, SourceFrom, compile};
use parse::{MAX_SPLITS, Tok, TooMany, part_text, splits};

#[derive(Debug, Clone, PartialEq)]
pub enum InverseOutcome {
    /// Write this item to the source. `rule` is None for an item copied unchanged.
    Put {
        rule: Option<usize>,
        item: Item,
    },
    Reject(InverseReject),
    /// Not a migrated item (a drain marker): nothing to write back.
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InverseReject {
    /// The rule the item was read as, if one was chosen.
    pub rule: Option<String>,
    pub reason: InverseReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InverseReason {
    /// An in-place plan has no second table to replicate back to.
    InPlace,
    /// The target key attribute is missing, or not of its declared type.
    MissingTargetKey(String),
    /// No rule's target shapes read the item, and it is not a copy.
    NoRuleMatched,
    /// `unmatched = "copy"`, but read as a source item this rule would re-key it.
    NotACopy { rule: String },
    /// Several rules' target shapes read the item.
    AmbiguousRule(Vec<String>),
    /// The rule is not reversible (`reversibility` says why).
    Irreversible(Vec<Irreversible>),
    /// A `set` attribute the rule's captures are read from is missing or has not its shape.
    Carrier { attr: String },
    /// A computed key part differs from what the rebuilt item computes.
    ComputedMismatch {
        attr: String,
        part: String,
        held: String,
        computed: String,
    },
    /// A computed key part cannot be computed from the rebuilt item.
    Render { attr: String, error: RenderError },
    /// A numeric source key attribute would not be a number.
    NotANumber { attr: String, text: String },
    /// The rebuilt item would not be re-keyed to this item's key by this rule.
    NotAPreimage { why: String },
    /// Two different source items map to this target key.
    AmbiguousSource { keys: Vec<String> },
    /// The key reads back in too many ways to decide.
    TooManyReadings,
    /// A `source_key_prefix` copy disagrees with the source key read from the target key.
    PrefixMismatch {
        attr: String,
        held: String,
        rebuilt: String,
    },
}

impl InverseReason {
    /// A short stable label for grouping (the tests group by it).
    #[cfg(test)]
    pub(crate) fn kind(&self) -> String {
        match self {
            InverseReason::InPlace => "in place".into(),
            InverseReason::MissingTargetKey(a) => format!("target key `{a}` missing"),
            InverseReason::NoRuleMatched => "no rule's target shapes matched".into(),
            InverseReason::NotACopy { .. } => "not a copy".into(),
            InverseReason::AmbiguousRule(_) => "ambiguous rule".into(),
            InverseReason::Irreversible(_) => "rule not reversible".into(),
            InverseReason::Carrier { attr } => format!("`{attr}` cannot be read back"),
            InverseReason::ComputedMismatch { attr, .. } => {
                format!("`{attr}`: computed part mismatch")
            }
            InverseReason::Render { attr, .. } => format!("`{attr}`: cannot recompute"),
            InverseReason::NotANumber { attr, .. } => format!("`{attr}` is not a number"),
            InverseReason::NotAPreimage { .. } => "no source item maps to it".into(),
            InverseReason::AmbiguousSource { .. } => "ambiguous source key".into(),
            InverseReason::TooManyReadings => "too many readings".into(),
            InverseReason::PrefixMismatch { attr, .. } => format!("`{attr}` disagrees"),
        }
    }
}

impl fmt::Display for InverseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InverseReason::InPlace => f.write_str("the plan is in place: there is no other table to write back"),
            InverseReason::MissingTargetKey(a) => write!(f, "the item has no target key attribute `{a}` of its declared type"),
            InverseReason::NoRuleMatched => f.write_str("no rule's target shapes match the item, and the plan does not copy unmatched items"),
            InverseReason::NotACopy { rule } => write!(f, "no rule's target shapes match the item, and it is not a copy: as a source item, rule `{rule}` would re-key it"),
            InverseReason::AmbiguousRule(rules) => write!(f, "the target shapes of several rules match the item ({})", names(rules)),
            InverseReason::Irreversible(reasons) => {
                let r: Vec<String> = reasons.iter().map(ToString::to_string).collect();
                write!(f, "the rule is not reversible: {}", r.join("; "))
            }
            InverseReason::Carrier { attr } => write!(f, "attribute `{attr}`, which carries a capture back, is missing or does not have the rule's shape"),
            InverseReason::ComputedMismatch { attr, part, held, computed } => write!(f, "`{attr}` holds `{held}` for `{part}`, but the source item read back from it computes `{computed}`"),
            InverseReason::Render { attr, error } => write!(f, "cannot recompute `{attr}` from the source item read back: {error}"),
            InverseReason::NotANumber { attr, text } => write!(f, "source key attribute `{attr}` is a number but would be `{text}`"),
            InverseReason::NotAPreimage { why } => write!(f, "no source item maps to this item: the one read back {why}"),
            InverseReason::AmbiguousSource { keys } => write!(f, "several source items map to this target key ({})", keys.join(", ")),
            InverseReason::TooManyReadings => f.write_str("the target key reads back in too many ways to decide"),
            InverseReason::PrefixMismatch { attr, held, rebuilt } => write!(f, "`{attr}` holds `{held}`, but the target key reads back as `{rebuilt}`"),
        }
    }
}

impl fmt::Display for InverseReject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Some(r) => write!(f, "rule `{r}`: {}", self.reason),
            None => write!(f, "{}", self.reason),
        }
    }
}

fn names(rules: &[String]) -> String {
    rules
        .iter()
        .map(|r| format!("`{r}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `lost` is an attribute the rule drops or removes that none of its
/// key templates reads: the key read back without it is still the key (a
/// key part computed from it could not be recomputed, and might then look
/// like a wrong one).
pub(crate) fn removed_off_key(rule: &crate::core::plan::Rule, lost: &Irreversible) -> bool {
    let Irreversible::Removed { attr, .. } = lost else {
        return false;
    };
    !rule
        .key
        .iter()
        .any(|(_, t)| t.attributes().iter().any(|(a, _)| a == attr))
}

/// The source item `target` came from under `plan`. Compiles the plan's rules
/// for one call; [`Inverter`] compiles them once for many.
pub fn inverse(plan: &Plan, target: &Item) -> InverseOutcome {
    Inverter::new(plan).invert(target)
}

/// The inverse of one plan, its rules compiled once.
pub(crate) struct Inverter<'p> {
    plan: &'p Plan,
    rules: Vec<RuleInverse<'p>>,
    /// Only the source key is wanted ([`Inverter::keys`]).
    keys_only: bool,
}

/// One reading of a target item: the bound values, and the text each
/// computed key part (key reading index, part index) holds.
#[derive(Debug, Clone, Default)]
struct Assignment {
    binds: Vec<(String, String)>,
    parsed: Vec<(usize, usize, String)>,
}

impl Assignment {
    fn get(&self, name: &str) -> Option<&str> {
        self.binds
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Adds a bound value; false if the name is bound to another value.
    fn bind(&mut self, name: &str, value: &str) -> bool {
        match self.get(name) {
            Some(v) => v == value,
            None => {
                self.binds.push((name.to_string(), value.to_string()));
                true
            }
        }
    }

    /// The captures, for rendering (source key bindings are item attributes).
    fn captures(&self) -> Vec<(&str, &str)> {
        self.binds
            .iter()
            .filter(|(n, _)| !n.starts_with('@'))
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect()
    }
}

type Reject = (Option<String>, InverseReason);

impl<'p> Inverter<'p> {
    pub fn new(plan: &'p Plan) -> Inverter<'p> {
        let rules = match plan.mode {
            Mode::Rekey => (0..plan.rules.len()).map(|i| compile(plan, i)).collect(),
            Mode::InPlace => Vec::new(),
        };
        Inverter {
            plan,
            rules,
            keys_only: false,
        }
    }

    /// An inverse that reads back only the source item's key (a fleet
    /// verify's orphan check): a rule that drops or removes attributes its
    /// key does not read loses part of each item but not its key, so it is
    /// read too (one that
    /// overwrites an attribute it reads is not: what it computed from the
    /// source's value cannot be recomputed from the target's). The item
    /// returned then lacks what the rule took away, but it is still checked
    /// as every reading is (its computed key parts recompute, the transform
    /// maps it back to the same key), so its key is never a wrong one; an
    /// item that cannot be so checked is a reject, as before.
    pub fn keys(plan: &'p Plan) -> Inverter<'p> {
        Inverter {
            keys_only: true,
            ..Inverter::new(plan)
        }
    }

    pub(crate) fn invert(&self, target: &Item) -> InverseOutcome {
        match self.invert_inner(target) {
            Ok(Some((rule, item))) => InverseOutcome::Put { rule, item },
            Ok(None) => InverseOutcome::Skip,
            Err((rule, reason)) => InverseOutcome::Reject(InverseReject { rule, reason }),
        }
    }

    fn invert_inner(&self, t: &Item) -> Result<Option<(Option<usize>, Item)>, Reject> {
        let plan = self.plan;
        if plan.mode == Mode::InPlace {
            return Err((None, InverseReason::InPlace));
        }
        for attr in plan.target_key.attrs() {
            if key_text(t, attr).is_none() {
                return Err((None, InverseReason::MissingTargetKey(attr.name.clone())));
            }
        }
        // rekey's own drain markers, should a reverse barrier write them here.
        if key_text(t, &plan.target_key.partition_key).is_some_and(|k| k.starts_with(MARKER_PREFIX))
        {
            return Ok(None);
        }
        let mut chosen = Vec::new();
        for r in &self.rules {
            if let Some(readings) = self.read_target_shapes(r, t) {
                chosen.push((r, readings));
            }
        }
        match chosen.len() {
            0 => self.unmatched(t).map(Some),
            1 => {
                let (r, readings) = chosen.pop().expect("one");
                let name = Some(r.rule.name.clone());
                self.invert_by(r, readings, t)
                    .map(|item| Some((Some(r.index), item)))
                    .map_err(|reason| (name, reason))
            }
            _ => Err((
                None,
                InverseReason::AmbiguousRule(
                    chosen.iter().map(|(r, _)| r.rule.name.clone()).collect(),
                ),
            )),
        }
    }

    /// An item no rule's target shapes read: a copy, or a reject.
    fn unmatched(&self, t: &Item) -> Result<(Option<usize>, Item), Reject> {
        if self.plan.unmatched != Unmatched::Copy {
            return Err((None, InverseReason::NoRuleMatched));
        }
        match match_rule(self.plan, t) {
            None => Ok((None, t.clone())),
            Some((_, rule, _)) => Err((
                None,
                InverseReason::NotACopy {
                    rule: rule.name.clone(),
                },
            )),
        }
    }

    /// The readings of the item by rule `r`'s target shapes, if they match
    /// (`Err` if it reads in too many ways to list).
    fn read_target_shapes(
        &self,
        r: &RuleInverse,
        t: &Item,
    ) -> Option<Result<Vec<Assignment>, InverseReason>> {
        let mut acc = vec![Assignment::default()];
        for (attr, shape) in &r.kept_shapes {
            let vals = shape.matches(t.get(*attr).and_then(Value::as_text)?)?;
            for ((c, _), v) in shape.captures.iter().zip(&vals) {
                acc[0].bind(c, v);
            }
        }
        for (i, reading) in r.key.iter().enumerate() {
            let attr = self
                .plan
                .target_key
                .attrs()
                .find(|a| a.name == reading.attr)?;
            let text = key_text(t, attr)?;
            match self.join(acc, reading, Some(i), text, t) {
                Ok(next) if next.is_empty() => return None,
                Ok(next) => acc = next,
                Err(TooMany) => return Some(Err(InverseReason::TooManyReadings)),
            }
        }
        Some(Ok(acc))
    }

    /// Every reading of `text` by `reading`, joined with each of `acc` whose
    /// bindings agree with it.
    fn join(
        &self,
        acc: Vec<Assignment>,
        reading: &Reading,
        key_index: Option<usize>,
        text: &str,
        t: &Item,
    ) -> Result<Vec<Assignment>, TooMany> {
        let toks = self.tokens(reading, t);
        let found = splits(&toks, text)?;
        let mut out = Vec::new();
        for a in &acc {
            'split: for split in &found {
                let mut next = a.clone();
                for (part, value) in split {
                    match &reading.roles[*part] {
                        Role::Bind(name) => {
                            if !next.bind(name, value) {
                                continue 'split;
                            }
                        }
                        _ => {
                            if let Some(k) = key_index {
                                next.parsed.push((k, *part, value.to_string()));
                            }
                        }
                    }
                }
                out.push(next);
                if out.len() > MAX_SPLITS {
                    return Err(TooMany);
                }
            }
        }
        Ok(out)
    }

    /// The tokens of a reading for this item: kept attributes become their text.
    fn tokens<'r>(&self, reading: &'r Reading, t: &Item) -> Vec<Tok<'r>> {
        use parse::Class;
        reading
            .roles
            .iter()
            .enumerate()
            .map(|(i, role)| match role {
                Role::Lit(l) => Tok::Lit(Cow::Borrowed(l.as_str())),
                Role::Bind(_) => Tok::Var(i, Cow::Owned(Class::Any { min: 1 })),
                Role::Computed(c) => Tok::Var(i, Cow::Borrowed(c)),
                Role::Known => match self.render_part(reading.template, i, &[], t) {
                    Ok(text) => Tok::Lit(Cow::Owned(text)),
                    // Missing here: read as anything, and the check says why.
                    Err(_) => Tok::Var(i, Cow::Owned(Class::Any { min: 0 })),
                },
            })
            .collect()
    }

    fn render_part(
        &self,
        template: &Template,
        part: usize,
        captures: &[(&str, &str)],
        item: &Item,
    ) -> Result<String, RenderError> {
        let one = Template {
            parts: vec![template.parts[part].clone()],
        };
        one.render(&Scope {
            captures,
            item,
            default_hash: self.plan.hash,
        })
    }

    /// The source item of `t` under rule `r`, from the readings of its key.
    fn invert_by(
        &self,
        r: &RuleInverse,
        readings: Result<Vec<Assignment>, InverseReason>,
        t: &Item,
    ) -> Result<Item, InverseReason> {
        let lost: Vec<Irreversible> = r
            .lost
            .iter()
            .filter(|l| !(self.keys_only && removed_off_key(r.rule, l)))
            .cloned()
            .collect();
        if !lost.is_empty() {
            return Err(InverseReason::Irreversible(lost));
        }
        let mut acc = readings?;
        for c in &r.carriers {
            let text =
                t.get(c.attr)
                    .and_then(Value::as_text)
                    .ok_or_else(|| InverseReason::Carrier {
                        attr: c.attr.to_string(),
                    })?;
            acc = self
                .join(acc, c, None, text, t)
                .map_err(|TooMany| InverseReason::TooManyReadings)?;
            if acc.is_empty() {
                return Err(InverseReason::Carrier {
                    attr: c.attr.to_string(),
                });
            }
        }
        let mut found: Vec<Item> = Vec::new();
        let mut first_error = None;
        for a in &acc {
            match self.rebuild(r, a, t) {
                Ok(s) => {
                    if !found.contains(&s) {
                        found.push(s);
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match found.len() {
            0 => Err(first_error.unwrap_or(InverseReason::NoRuleMatched)),
            1 => {
                let s = found.pop().expect("one");
                self.cross_check(&s, t)?;
                Ok(s)
            }
            _ => Err(InverseReason::AmbiguousSource {
                keys: found.iter().map(|s| self.source_key_text(s)).collect(),
            }),
        }
    }

    /// The source item of one reading, checked: computed parts recompute to
    /// what the key holds, and the transform maps it back to this key.
    fn rebuild(&self, r: &RuleInverse, a: &Assignment, t: &Item) -> Result<Item, InverseReason> {
        let plan = self.plan;
        let caps = a.captures();
        let mut s = t.clone();
        if r.keyed {
            for n in plan.target_key.names() {
                s.remove(n);
            }
        }
        for set in &r.rule.set {
            s.remove(&set.name);
        }
        if let Some(p) = &plan.source_key_prefix {
            for n in plan.source_key.names() {
                s.remove(&format!("{p}{n}"));
            }
        }
        for (attr, from) in &r.source_key {
            let text = match from {
                SourceFrom::Shape(tpl) => tpl
                    .render(&Scope {
                        captures: &caps,
                        item: t,
                        default_hash: plan.hash,
                    })
                    .map_err(|error| InverseReason::Render {
                        attr: attr.name.clone(),
                        error,
                    })?,
                SourceFrom::Bind(b) => a.get(b).unwrap_or_default().to_string(),
            };
            s.insert(attr.name.clone(), typed(attr, text)?);
        }
        for (k, part, held) in &a.parsed {
            let reading = &r.key[*k];
            let computed = self
                .render_part(reading.template, *part, &caps, &s)
                .map_err(|error| InverseReason::Render {
                    attr: reading.attr.to_string(),
                    error,
                })?;
            if computed != *held {
                return Err(InverseReason::ComputedMismatch {
                    attr: reading.attr.to_string(),
                    part: part_text(&reading.template.parts[*part]),
                    held: held.clone(),
                    computed,
                });
            }
        }
        self.forwards(r, &s, t)?;
        Ok(s)
    }

    /// The transform, run forwards on the rebuilt item, gives this item's key by this rule.
    fn forwards(&self, r: &RuleInverse, s: &Item, t: &Item) -> Result<(), InverseReason> {
        let plan = self.plan;
        let why = |why: String| Err(InverseReason::NotAPreimage { why });
        if crate::core::marker::marker_id(plan, s).is_some() {
            return why("would be a drain marker".into());
        }
        let Some((index, rule, caps)) = match_rule(plan, s) else {
            return why("matches no rule".into());
        };
        if index != r.index {
            return why(format!("would be re-keyed by rule `{}`", rule.name));
        }
        let scope = Scope {
            captures: &caps,
            item: s,
            default_hash: plan.hash,
        };
        for (attr, tpl) in &rule.key {
            let same = tpl
                .render(&scope)
                .ok()
                .and_then(|text| typed(attr, text).ok())
                .is_some_and(|v| t.get(&attr.name) == Some(&v));
            if !same {
                return why(format!("would be re-keyed to another `{}`", attr.name));
            }
        }
        Ok(())
    }

    /// The `source_key_prefix` copies, where present, name the same source key.
    fn cross_check(&self, s: &Item, t: &Item) -> Result<(), InverseReason> {
        let Some(p) = &self.plan.source_key_prefix else {
            return Ok(());
        };
        for n in self.plan.source_key.names() {
            let attr = format!("{p}{n}");
            if let Some(held) = t.get(&attr)
                && Some(held) != s.get(n)
            {
                return Err(InverseReason::PrefixMismatch {
                    attr,
                    held: held.display_text(),
                    rebuilt: s.get(n).map(Value::display_text).unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    fn source_key_text(&self, s: &Item) -> String {
        self.plan
            .source_key
            .names()
            .iter()
            .map(|n| {
                let v = s.get(*n).map(Value::display_text).unwrap_or_default();
                format!("{n}={v}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The text of a key attribute of the declared type (binary as UTF-8).
fn key_text<'i>(item: &'i Item, attr: &KeyAttr) -> Option<&'i str> {
    match (item.get(&attr.name)?, attr.ty) {
        (Value::S(s), ScalarType::S) | (Value::N(s), ScalarType::N) => Some(s),
        (Value::B(b), ScalarType::B) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn typed(attr: &KeyAttr, text: String) -> Result<Value, InverseReason> {
    Ok(match attr.ty {
        ScalarType::S => Value::S(text),
        ScalarType::B => Value::B(text.into_bytes()),
        ScalarType::N if is_valid_number(&text) => Value::N(text),
        ScalarType::N => {
            return Err(InverseReason::NotANumber {
                attr: attr.name.clone(),
                text,
            });
        }
    })
}
