//! What the inverse needs from one rule, worked out once per plan.
//!
//! For every part of the rule's target key templates: how it reads back — a
//! literal, a value to bind (a capture, or a source key attribute the key
//! carries whole), an attribute the target item keeps unchanged (known, so
//! read as a literal), or a computed part (`shard()`, `bucket()`, padding)
//! whose text is found by its layout and checked once the source item is
//! rebuilt. Then which attributes carry the captures the keys do not (kept
//! attributes the rule matched, `set` attributes rendered from captures), and
//! what the rule loses for good. The analysis reports from the same
//! structure the inverse runs on, so the two cannot disagree.

use std::collections::BTreeSet;

use crate::core::plan::{KeyAttr, Plan, Rule};
use crate::core::template::{Expr, Part, Shape, Template};

use super::irreversible::{Irreversible, Removal};
use super::parse::{Class, bucket_format, part_text};

/// How one template part reads back.
#[derive(Debug, Clone)]
pub(super) enum Role {
    Lit(String),
    /// A capture, or (`@PK`) a source key attribute with no shape, read whole.
    Bind(String),
    /// An attribute the target item keeps: its text is known before reading.
    Known,
    /// Computed from the rebuilt source item; read by its layout, then checked.
    Computed(Class),
}

/// A template to read back from one attribute of the target item.
pub(super) struct Reading<'p> {
    pub(super) attr: &'p str,
    pub(super) template: &'p Template,
    pub(super) roles: Vec<Role>,
}

impl Reading<'_> {
    fn binds(&self) -> impl Iterator<Item = &str> {
        self.roles.iter().filter_map(|r| match r {
            Role::Bind(b) => Some(b.as_str()),
            _ => None,
        })
    }
}

/// Where a source key attribute's value comes from.
pub(super) enum SourceFrom {
    /// The rule's shape for it, rendered with the captures.
    Shape(Template),
    /// Read whole out of a target template (`{@SK}`).
    Bind(String),
}

/// One rule, ready to be read backwards.
pub(super) struct RuleInverse<'p> {
    pub(super) index: usize,
    pub(super) rule: &'p Rule,
    /// Whether the rule renders a new key (else it keeps the source key).
    pub(super) keyed: bool,
    /// The target key templates (empty when the rule keeps the key).
    pub(super) key: Vec<Reading<'p>>,
    /// Matched attributes the target keeps (the key too, when kept): their
    /// shapes read there exactly as the transform read them.
    pub(super) kept_shapes: Vec<(&'p str, &'p Shape)>,
    /// `set` attributes read back for captures nothing else carries.
    pub(super) carriers: Vec<Reading<'p>>,
    /// The source key to rebuild (none when the rule keeps the key).
    pub(super) source_key: Vec<(&'p KeyAttr, SourceFrom)>,
    /// What the rule loses for every item: if any, no item is reversed.
    pub(super) lost: Vec<Irreversible>,
}

/// The binding of a source key attribute read whole: `@` never starts a capture's name.
pub(super) fn key_binding(attr: &str) -> String {
    format!("@{attr}")
}

/// Whether the target item holds the source item's `attr` unchanged.
pub(super) fn kept(plan: &Plan, rule: &Rule, attr: &str) -> bool {
    let keyed = !rule.key.is_empty();
    let replaced = keyed
        && (plan.source_key.names().contains(&attr) || plan.target_key.names().contains(&attr));
    !(replaced
        || plan.drop.iter().any(|d| d == attr)
        || rule.remove.iter().any(|r| r == attr)
        || rule.set.iter().any(|s| s.name == attr)
        || prefixed(plan, attr))
}

/// Whether `attr` is where `source_key_prefix` keeps a source key attribute.
pub(super) fn prefixed(plan: &Plan, attr: &str) -> bool {
    plan.source_key_prefix.as_ref().is_some_and(|p| {
        attr.strip_prefix(p.as_str())
            .is_some_and(|n| plan.source_key.names().contains(&n))
    })
}

fn roles(plan: &Plan, rule: &Rule, t: &Template) -> Vec<Role> {
    let keyed = !rule.key.is_empty();
    t.parts
        .iter()
        .map(|p| {
            let (expr, pad) = match p {
                Part::Lit(l) => return Role::Lit(l.clone()),
                Part::Expr { expr, pad, .. } => (expr, *pad),
            };
            let at_least = |min: usize| Class::Any {
                min: pad.unwrap_or(0).max(min),
            };
            match expr {
                Expr::Capture(c) if pad.is_none() => Role::Bind(c.clone()),
                Expr::Capture(_) => Role::Computed(at_least(1)),
                Expr::Attr(a) if keyed && plan.source_key.names().contains(&a.as_str()) => {
                    let shaped = rule.matchers.iter().any(|(m, _)| m == a);
                    if pad.is_none() && !shaped {
                        Role::Bind(key_binding(a))
                    } else {
                        Role::Computed(at_least(1))
                    }
                }
                Expr::Attr(a) if kept(plan, rule, a) => Role::Known,
                Expr::Shard { n, .. } => {
                    let digits = (n.saturating_sub(1)).to_string().len();
                    let w = pad.unwrap_or(0);
                    Role::Computed(Class::Digits {
                        min: w.max(1),
                        max: w.max(digits),
                    })
                }
                Expr::Bucket { unit, .. } => {
                    Role::Computed(Class::Format(bucket_format(*unit, pad)))
                }
                Expr::Attr(_) | Expr::Text(_) => Role::Computed(at_least(0)),
            }
        })
        .collect()
}

fn reading<'p>(plan: &Plan, rule: &Rule, attr: &'p str, t: &'p Template) -> Reading<'p> {
    Reading {
        attr,
        template: t,
        roles: roles(plan, rule, t),
    }
}

/// Rule `index` of `plan`, compiled for the inverse.
pub(super) fn compile(plan: &Plan, index: usize) -> RuleInverse<'_> {
    let rule = &plan.rules[index];
    let keyed = !rule.key.is_empty();
    let key: Vec<Reading> = rule
        .key
        .iter()
        .map(|(a, t)| reading(plan, rule, &a.name, t))
        .collect();
    let kept_shapes: Vec<(&str, &Shape)> = rule
        .matchers
        .iter()
        .filter(|(a, _)| kept(plan, rule, a))
        .map(|(a, s)| (a.as_str(), s))
        .collect();

    // What must be bound to rebuild the source key: every capture, and each
    // source key attribute no shape matches.
    let mut needed: Vec<String> = rule
        .matchers
        .iter()
        .flat_map(|(_, s)| s.captures.iter().map(|(c, _)| c.clone()))
        .collect();
    let mut source_key = Vec::new();
    if keyed {
        for attr in plan.source_key.attrs() {
            match rule.matchers.iter().find(|(m, _)| *m == attr.name) {
                Some((_, shape)) => {
                    let t = Template::parse(&shape.text)
                        .expect("a shape parsed, so its text is a template");
                    source_key.push((attr, SourceFrom::Shape(t)));
                }
                None => {
                    needed.push(key_binding(&attr.name));
                    source_key.push((attr, SourceFrom::Bind(key_binding(&attr.name))));
                }
            }
        }
    }

    let mut bound: BTreeSet<String> = key
        .iter()
        .flat_map(|r| r.binds())
        .map(String::from)
        .collect();
    bound.extend(
        kept_shapes
            .iter()
            .flat_map(|(_, s)| s.captures.iter().map(|(c, _)| c.clone())),
    );
    let mut carriers: Vec<Reading> = Vec::new();
    let mut lost = Vec::new();
    for n in &needed {
        if bound.contains(n) {
            continue;
        }
        let carrier = rule
            .set
            .iter()
            .map(|s| reading(plan, rule, &s.name, &s.template))
            .find(|r| r.binds().any(|b| b == n));
        match carrier {
            Some(r) => {
                bound.extend(r.binds().map(String::from));
                carriers.push(r);
            }
            None => lost.push(lost_binding(rule, n)),
        }
    }
    lost.extend(removed(plan, rule));
    lost.extend(overwritten(plan, rule));
    RuleInverse {
        index,
        rule,
        keyed,
        key,
        kept_shapes,
        carriers,
        source_key,
        lost,
    }
}

/// Why binding `n` cannot be read back from any target template.
fn lost_binding(rule: &Rule, n: &str) -> Irreversible {
    if let Some(attr) = n.strip_prefix('@') {
        return Irreversible::LostSourceKey {
            attr: attr.to_string(),
        };
    }
    let (attr, shape) = rule
        .matchers
        .iter()
        .find(|(_, s)| s.captures.iter().any(|(c, _)| c == n))
        .map_or((String::new(), String::new()), |(a, s)| {
            (a.clone(), s.text.clone())
        });
    // A padded occurrence carries the value only up to its leading zeros.
    let templates = rule
        .key
        .iter()
        .map(|(a, t)| (a.name.as_str(), t))
        .chain(rule.set.iter().map(|s| (s.name.as_str(), &s.template)));
    let mut padded = None;
    for (a, t) in templates {
        for p in &t.parts {
            if let Part::Expr {
                expr: Expr::Capture(c),
                pad: Some(_),
                ..
            } = p
                && c == n
                && padded.is_none()
            {
                padded = Some((a.to_string(), part_text(p)));
            }
        }
    }
    Irreversible::LostCapture {
        capture: n.to_string(),
        attr,
        shape,
        padded,
    }
}

/// Attributes `drop` or the rule's `remove` take away (the source key
/// excepted: it is rebuilt).
fn removed(plan: &Plan, rule: &Rule) -> Vec<Irreversible> {
    let keyed = !rule.key.is_empty();
    let rebuilt = |a: &str| keyed && plan.source_key.names().contains(&a);
    let by = |list: &[String], removal: Removal| {
        list.iter()
            .filter(|a| !rebuilt(a))
            .map(|a| Irreversible::Removed {
                attr: a.clone(),
                by: removal,
            })
            .collect::<Vec<_>>()
    };
    let mut out = by(&plan.drop, Removal::Drop);
    out.extend(by(&rule.remove, Removal::Remove));
    out
}

/// Attributes the rule reads (so every source item holds them) but writes
/// over: their source values are not on the target item.
fn overwritten(plan: &Plan, rule: &Rule) -> Vec<Irreversible> {
    let keyed = !rule.key.is_empty();
    let mut reads: BTreeSet<&str> = rule.reads();
    for (_, t) in &rule.key {
        reads.extend(t.attributes().into_iter().map(|(a, _)| a));
    }
    let source_key = plan.source_key.names();
    reads
        .into_iter()
        .filter(|a| !plan.drop.iter().any(|d| d == a) && !rule.remove.iter().any(|r| r == a))
        .filter_map(|a| {
            let by = if rule.set.iter().any(|s| s.name == a) {
                "the rule's `set`"
            } else if keyed && plan.target_key.names().contains(&a) && !source_key.contains(&a) {
                "the target key"
            } else if prefixed(plan, a) {
                "`source_key_prefix`"
            } else {
                return None;
            };
            Some(Irreversible::Overwritten {
                attr: a.to_string(),
                by,
            })
        })
        .collect()
}
