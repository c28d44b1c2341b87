//! Whether a plan's target key alone determines the source key: if so, two
//! source items can never claim one target key, and the backfill needs no
//! claim index (the index was a third of the backfill's CPU at 1M items and
//! grew with the table: BENCHMARKS.md (f5)).
//!
//! The proof is deliberately narrow, so it is easy to check and never wrong:
//!
//! 1. Within a rule: every source key attribute `A` (a string) must appear in
//!    one target key template (a string attribute) exactly as its source
//!    value — its match shape's literal text and unpadded captures in order,
//!    or `{@A}` — with nothing around it but parts of a fixed width (literal
//!    text, `shard()` padded to its digits, `bucket()`). Cutting those
//!    fixed-width ends off the target value gives back `A`'s source value,
//!    whatever the captures hold (a capture may contain the delimiters: the
//!    value is recovered whole, never split).
//! 2. Across rules: no two rules' target key patterns can hold one value
//!    (the reversibility analysis' overlap test, which over-approximates:
//!    it may see an overlap no item hits, never miss one).
//! 3. Nothing else reaches the target: `unmatched = "copy"` is not proven
//!    (a copied item's key could equal a rule's output), nor are rules that
//!    keep the source key, in-place plans, or non-string keys (DynamoDB
//!    normalises numbers: `7` and `07` are one key).
//!
//! Anything outside that answers "not proven", with the reason, and the
//! backfill keeps its claim index.

use crate::core::plan::{Mode, Plan, Rule, Unmatched};
use crate::core::template::{Expr, Part, Template};
use crate::core::value::ScalarType;

use super::analysis::{key_patterns, overlap};
use super::compile::{Reading, Role, compile};

/// One character-level token of a template, for finding a source value
/// inside a target template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok<'t> {
    Char(char),
    /// An unpadded capture.
    Capture(&'t str),
    /// An unpadded source key attribute read whole.
    Attr(&'t str),
    /// Any other part of a fixed rendered width.
    Fixed,
    /// Any other part.
    Variable,
}

fn is_affix(t: &Tok) -> bool {
    matches!(t, Tok::Char(_) | Tok::Fixed)
}

/// The tokens of a target key template, its roles saying which computed
/// parts have a fixed width.
fn target_tokens<'t>(reading: &Reading<'t>) -> Vec<Tok<'t>> {
    let mut out = Vec::new();
    for (part, role) in reading.template.parts.iter().zip(&reading.roles) {
        match (part, role) {
            (Part::Lit(l), _) => out.extend(l.chars().map(Tok::Char)),
            (
                Part::Expr {
                    expr: Expr::Capture(c),
                    pad: None,
                    ..
                },
                _,
            ) => out.push(Tok::Capture(c)),
            (
                Part::Expr {
                    expr: Expr::Attr(a),
                    pad: None,
                    ..
                },
                _,
            ) => out.push(Tok::Attr(a)),
            (_, Role::Computed(class)) if !class.variable_width() => out.push(Tok::Fixed),
            _ => out.push(Tok::Variable),
        }
    }
    out
}

/// What renders as the source value of a shaped attribute: the shape's text.
fn shape_tokens(t: &Template) -> Option<Vec<Tok<'_>>> {
    let mut out = Vec::new();
    for part in &t.parts {
        match part {
            Part::Lit(l) => out.extend(l.chars().map(Tok::Char)),
            Part::Expr {
                expr: Expr::Capture(c),
                pad: None,
                ..
            } => out.push(Tok::Capture(c)),
            Part::Expr { .. } => return None,
        }
    }
    Some(out)
}

/// Whether `needle` occurs in `hay` with only fixed-width tokens around it.
fn framed(hay: &[Tok], needle: &[Tok]) -> bool {
    (0..=hay.len().saturating_sub(needle.len())).any(|start| {
        let end = start + needle.len();
        end <= hay.len()
            && hay[start..end] == *needle
            && hay[..start].iter().all(is_affix)
            && hay[end..].iter().all(is_affix)
    })
}

/// Why one keyed rule's target key might not determine its source key.
fn rule_injective(plan: &Plan, index: usize, rule: &Rule) -> Result<(), String> {
    let compiled = compile(plan, index);
    let targets: Vec<Vec<Tok>> = compiled
        .key
        .iter()
        .filter(|r| string_key(plan, r.attr))
        .map(target_tokens)
        .collect();
    for attr in plan.source_key.attrs() {
        let whole = [Tok::Attr(attr.name.as_str())];
        let shape = rule
            .matchers
            .iter()
            .find(|(m, _)| *m == attr.name)
            .map(|(_, s)| Template::parse(&s.text).expect("a shape parsed, so it is a template"));
        let shaped = shape.as_ref().and_then(shape_tokens);
        let found = targets.iter().any(|t| {
            framed(t, &whole)
                || shaped
                    .as_ref()
                    .is_some_and(|s| !s.is_empty() && framed(t, s))
        });
        if !found {
            return Err(format!(
                "rule `{}`: no target key holds source key `{}` whole between fixed-width parts",
                rule.name, attr.name
            ));
        }
    }
    Ok(())
}

fn string_key(plan: &Plan, attr: &str) -> bool {
    plan.target_key
        .attrs()
        .any(|a| a.name == attr && a.ty == ScalarType::S)
}

/// `Ok` when no two source items can have one target key; else why that is
/// not proven (the backfill then claims every target key).
pub fn key_injective(plan: &Plan) -> Result<(), String> {
    if plan.mode != Mode::Rekey {
        return Err("in place: the target key is the source key".into());
    }
    if plan.unmatched == Unmatched::Copy {
        return Err("unmatched = \"copy\": a copied item's key could equal a rule's".into());
    }
    if let Some(a) = plan
        .source_key
        .attrs()
        .chain(plan.target_key.attrs())
        .find(|a| a.ty != ScalarType::S)
    {
        return Err(format!(
            "key attribute `{}` is not a string (DynamoDB compares numbers and bytes by value)",
            a.name
        ));
    }
    for (i, rule) in plan.rules.iter().enumerate() {
        if rule.key.is_empty() {
            return Err(format!("rule `{}` keeps the source key", rule.name));
        }
        rule_injective(plan, i, rule)?;
    }
    let patterns: Vec<_> = (0..plan.rules.len())
        .map(|i| key_patterns(&compile(plan, i)))
        .collect();
    for i in 0..patterns.len() {
        for j in i + 1..patterns.len() {
            if overlap(&patterns[i], &patterns[j]) {
                return Err(format!(
                    "rules `{}` and `{}` can write the same target key",
                    plan.rules[i].name, plan.rules[j].name
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
