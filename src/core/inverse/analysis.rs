//! Reversibility: for each rule, can every target item it writes be mapped
//! back to the source item it came from — and if not, why, and what to change?
//!
//! `rekey check` prints this before a migration starts, because the answer
//! decides whether a rollback after cutover (reverse replication) is possible
//! at all, and the fix (keep an attribute, add a capture to a key, a literal
//! between two parts) is a change to the plan that must be made *before* the
//! backfill, not after.
//!
//! Two kinds of reason. Some lose data for every item of the rule (a capture
//! no target template or kept attribute carries; an attribute `drop`,
//! `remove` or an overwrite takes away): the inverse rejects every such
//! item. Others make some items ambiguous (two rules' target keys can take
//! the same value; two parts side by side with no literal between): the
//! inverse still reverses each item whose key reads back one way only, and
//! rejects the others. Both mean "not reversible": not every item can be.
//!
//! The overlap test is exact for the patterns it sees, and those
//! over-approximate what a rule writes: a capture is "one or more of any
//! character", an attribute "any text", `shard()` its digits, `bucket()` its
//! layout; two rules overlap when every attribute both constrain (target key,
//! kept matched attributes) can hold a value both patterns accept. So it may
//! report an overlap no real item hits, never miss one.

use crate::core::plan::{Mode, Plan, Unmatched};
use crate::core::template::Template;

use super::compile::{Reading, Role, RuleInverse, compile};
use super::irreversible::Irreversible;
use super::parse::{Class, part_text};

/// One rule's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReversibility {
    pub rule: String,
    /// Empty when the rule is reversible.
    pub reasons: Vec<Irreversible>,
}

impl RuleReversibility {
    pub fn reversible(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// Every rule of the plan, in order, with why it is not reversible (if so).
pub fn reversibility(plan: &Plan) -> Vec<RuleReversibility> {
    if plan.mode == Mode::InPlace {
        return plan
            .rules
            .iter()
            .map(|r| RuleReversibility {
                rule: r.name.clone(),
                reasons: vec![Irreversible::InPlace],
            })
            .collect();
    }
    let compiled: Vec<RuleInverse> = (0..plan.rules.len()).map(|i| compile(plan, i)).collect();
    let patterns: Vec<Vec<(&str, Vec<Atom>)>> =
        compiled.iter().map(|r| target_patterns(r)).collect();
    compiled
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut reasons = r.lost.clone();
            for reading in r.key.iter().chain(&r.carriers) {
                reasons.extend(adjacent(reading));
            }
            for (j, other) in compiled.iter().enumerate() {
                if i != j && overlap(&patterns[i], &patterns[j]) {
                    reasons.push(Irreversible::Overlap {
                        other: other.rule.name.clone(),
                    });
                }
            }
            RuleReversibility {
                rule: r.rule.name.clone(),
                reasons,
            }
        })
        .collect()
}

/// What the operator should know about the plan's reverse as a whole.
pub(crate) fn plan_notes(plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    if plan.mode == Mode::Rekey && plan.unmatched == Unmatched::Copy {
        out.push("unmatched = \"copy\": a target item no rule's target key matches is taken as copied unchanged, and reverses to itself; this assumes no source item already had the shape of a rule's target key".to_string());
    }
    out
}

/// The first two variable-width parts of a template with no literal between them.
fn adjacent(r: &Reading) -> Option<Irreversible> {
    let mut pending: Option<usize> = None;
    for (i, role) in r.roles.iter().enumerate() {
        let variable = match role {
            Role::Lit(l) => {
                if !l.is_empty() {
                    pending = None;
                }
                continue;
            }
            Role::Bind(_) => true,
            Role::Known => false,
            Role::Computed(c) => c.variable_width(),
        };
        if !variable {
            continue;
        }
        if let Some(p) = pending {
            return Some(Irreversible::Adjacent {
                attr: r.attr.to_string(),
                left: part_text(&r.template.parts[p]),
                right: part_text(&r.template.parts[i]),
            });
        }
        pending = Some(i);
    }
    None
}

// ---- overlap: the intersection of two patterns ---------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CharClass {
    Char(char),
    Digit,
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rep {
    One,
    Opt,
    Star,
}

/// One position of a pattern: a character class, once, optionally or any number of times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Atom {
    class: CharClass,
    rep: Rep,
}

fn atom(class: CharClass, rep: Rep) -> Atom {
    Atom { class, rep }
}

fn lit_atoms(s: &str) -> impl Iterator<Item = Atom> + '_ {
    s.chars().map(|c| atom(CharClass::Char(c), Rep::One))
}

/// The patterns of the attributes a rule's target items are constrained on:
/// the target key, and the matched attributes the target keeps.
fn target_patterns<'p>(r: &RuleInverse<'p>) -> Vec<(&'p str, Vec<Atom>)> {
    let mut out = key_patterns(r);
    for (attr, shape) in &r.kept_shapes {
        let t = Template::parse(&shape.text).expect("a shape parsed, so its text is a template");
        let roles = t
            .parts
            .iter()
            .map(|p| match p {
                crate::core::template::Part::Lit(l) => Role::Lit(l.clone()),
                crate::core::template::Part::Expr { .. } => Role::Bind(String::new()),
            })
            .collect::<Vec<_>>();
        out.push((attr, roles_atoms(&roles)));
    }
    out
}

/// The patterns of a rule's target key alone (what a claim is about).
pub(super) fn key_patterns<'p>(r: &RuleInverse<'p>) -> Vec<(&'p str, Vec<Atom>)> {
    r.key
        .iter()
        .map(|reading| (reading.attr, reading_atoms(reading)))
        .collect()
}

fn reading_atoms(r: &Reading) -> Vec<Atom> {
    roles_atoms(&r.roles)
}

fn roles_atoms(roles: &[Role]) -> Vec<Atom> {
    let mut out = Vec::new();
    for role in roles {
        match role {
            Role::Lit(l) => out.extend(lit_atoms(l)),
            Role::Bind(_) => {
                out.push(atom(CharClass::Any, Rep::One));
                out.push(atom(CharClass::Any, Rep::Star));
            }
            Role::Known => out.push(atom(CharClass::Any, Rep::Star)),
            Role::Computed(Class::Any { min }) => {
                out.extend(std::iter::repeat_n(atom(CharClass::Any, Rep::One), *min));
                out.push(atom(CharClass::Any, Rep::Star));
            }
            Role::Computed(Class::Digits { min, max }) => {
                out.extend(std::iter::repeat_n(atom(CharClass::Digit, Rep::One), *min));
                out.extend(std::iter::repeat_n(
                    atom(CharClass::Digit, Rep::Opt),
                    max.saturating_sub(*min),
                ));
            }
            Role::Computed(Class::Format(f)) => out.extend(f.chars().map(|c| {
                let class = if c == 'd' {
                    CharClass::Digit
                } else {
                    CharClass::Char(c)
                };
                atom(class, Rep::One)
            })),
        }
    }
    out
}

/// Whether some item satisfies both rules' patterns: every attribute both
/// constrain can hold one value both accept.
pub(super) fn overlap(a: &[(&str, Vec<Atom>)], b: &[(&str, Vec<Atom>)]) -> bool {
    a.iter().all(|(attr, pa)| {
        b.iter()
            .filter(|(other, _)| other == attr)
            .all(|(_, pb)| intersect(pa, pb))
    })
}

fn meet(a: CharClass, b: CharClass) -> bool {
    match (a, b) {
        (CharClass::Char(x), CharClass::Char(y)) => x == y,
        (CharClass::Char(c), CharClass::Digit) | (CharClass::Digit, CharClass::Char(c)) => {
            c.is_ascii_digit()
        }
        _ => true,
    }
}

/// Whether one string matches both patterns: a search over pairs of positions.
fn intersect(a: &[Atom], b: &[Atom]) -> bool {
    let (n, m) = (a.len(), b.len());
    let mut seen = vec![false; (n + 1) * (m + 1)];
    let mut stack = vec![(0usize, 0usize)];
    while let Some((i, j)) = stack.pop() {
        if std::mem::replace(&mut seen[i * (m + 1) + j], true) {
            continue;
        }
        if i == n && j == m {
            return true;
        }
        if i < n && a[i].rep != Rep::One {
            stack.push((i + 1, j));
        }
        if j < m && b[j].rep != Rep::One {
            stack.push((i, j + 1));
        }
        if i < n && j < m && meet(a[i].class, b[j].class) {
            let ni = if a[i].rep == Rep::Star { i } else { i + 1 };
            let nj = if b[j].rep == Rep::Star { j } else { j + 1 };
            if (ni, nj) != (i, j) {
                stack.push((ni, nj));
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(roles: &[Role]) -> Vec<Atom> {
        roles_atoms(roles)
    }
    fn lit(s: &str) -> Role {
        Role::Lit(s.into())
    }
    fn bind() -> Role {
        Role::Bind("x".into())
    }

    #[test]
    fn patterns_intersect_exactly() {
        let digits = |min, max| Role::Computed(Class::Digits { min, max });
        let cases: &[(&[Role], &[Role], bool)] = &[
            (&[lit("ORDER#"), bind()], &[lit("PROFILE")], false),
            (&[lit("ORDER#"), bind()], &[bind(), lit("#1")], true),
            (&[lit("A#"), digits(2, 2)], &[lit("A#"), lit("7")], false),
            (&[lit("A#"), digits(1, 2)], &[lit("A#"), lit("7")], true),
            (&[lit("A#"), digits(1, 2)], &[lit("A#x")], false),
            (
                &[bind(), lit("#TASKS")],
                &[bind(), lit("#EVENTS#"), bind()],
                true,
            ),
            (&[lit("CASE")], &[lit("TASK#"), bind()], false),
            (&[Role::Known], &[lit("")], true),
            (&[bind()], &[lit("")], false),
        ];
        for (a, b, want) in cases {
            assert_eq!(intersect(&pat(a), &pat(b)), *want, "{a:?} ∩ {b:?}");
            assert_eq!(intersect(&pat(b), &pat(a)), *want, "{b:?} ∩ {a:?}");
        }
    }
}
