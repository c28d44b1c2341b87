//! The suggested plan as commented TOML: every rule says which shape it is
//! for and the numbers that justify it; shapes that need no rule say so.

use std::fmt::Write as _;

use super::{Action, RuleText, ShapeReport, Suggestion};
use crate::core::plan::KeySchema;

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML key: bare when it can be.
fn key(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        s.to_string()
    } else {
        quote(s)
    }
}

/// How specific a shape is: its delimiters and literal characters outside captures.
fn specificity(shape: &str) -> (usize, usize) {
    let mut depth = 0;
    let (mut delims, mut literal) = (0, 0);
    for c in shape.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            c if depth == 0 && super::shape::DELIMITERS.contains(&c) => delims += 1,
            _ if depth == 0 => literal += 1,
            _ => {}
        }
    }
    (delims, literal)
}

/// Rules in the order they must be tried: the first match wins and a capture
/// matches delimiters too, so the more segments (then literals), the earlier.
pub fn rule_order(shapes: &[ShapeReport]) -> Vec<&ShapeReport> {
    let mut v: Vec<&ShapeReport> = shapes.iter().filter(|r| r.rule.is_some()).collect();
    v.sort_by_key(|r| {
        let t = r.rule.as_ref().expect("filtered");
        let sk = t.match_sk.as_deref().map(specificity).unwrap_or_default();
        let pk = specificity(&t.match_pk);
        std::cmp::Reverse((pk.0 + sk.0, pk.1 + sk.1))
    });
    v
}

/// A share as a percentage: one decimal, two below 1 %.
pub fn pct(x: f64) -> String {
    if x > 0.0 && x < 0.01 {
        format!("{:.2} %", x * 100.0)
    } else {
        format!("{:.1} %", x * 100.0)
    }
}

fn shape_text(r: &ShapeReport) -> String {
    match &r.sk {
        Some(sk) => format!("{} / {sk}", r.pk),
        None => r.pk.clone(),
    }
}

/// The comment lines that justify a shape's rule (or its absence).
fn justification(s: &Suggestion, r: &ShapeReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{}: {} items ({}); its hottest key takes {} of the writes: {:.0} WCU/s at {:.0} writes/s (budget {:.0})",
        shape_text(r),
        r.items,
        pct(r.share),
        pct(r.hottest_write_share),
        r.write_load,
        s.write_rate,
        s.write_budget,
    )];
    if let (Some(load), Some(rate)) = (r.read_load, s.read_rate) {
        lines.push(format!(
            "and {} of the reads: {load:.0} RCU/s at {rate:.0} reads/s (budget {:.0})",
            pct(r.hottest_read_share),
            s.read_budget
        ));
    }
    match &r.action {
        Action::Shard { shards, capture } => lines.push(format!(
            "→ {:.2} shards needed, {shards} by a hash of `{capture}`",
            r.needed
        )),
        Action::NoRule => lines.push("→ no rule needed: copied unchanged".into()),
        Action::Keep => {}
        Action::CannotShard => {}
    }
    lines.extend(r.notes.iter().cloned());
    lines
}

fn comment(out: &mut String, lines: &[String]) {
    for l in lines {
        let _ = writeln!(out, "# {l}");
    }
}

fn rule(out: &mut String, t: &RuleText, key_schema: &KeySchema) {
    let pk = key(&key_schema.partition_key.name);
    let sk = key_schema.sort_key.as_ref().map(|a| key(&a.name));
    let pair = |p: &str, s: &Option<String>| match (&sk, s) {
        (Some(name), Some(v)) => format!("{{ {pk} = {}, {name} = {} }}", quote(p), quote(v)),
        _ => format!("{{ {pk} = {} }}", quote(p)),
    };
    let _ = writeln!(out, "[[rule]]");
    let _ = writeln!(out, "name = {}", quote(&t.name));
    let _ = writeln!(out, "match = {}", pair(&t.match_pk, &t.match_sk));
    let _ = writeln!(out, "key = {}", pair(&t.key_pk, &t.key_sk));
}

/// The plan: source and target (the same key names), `unmatched = "copy"`
/// for the shapes that need no rule, and one rule per shape that does.
pub fn plan(s: &Suggestion, key_schema: &KeySchema) -> String {
    let mut out = String::new();
    let rate = match s.read_rate {
        Some(r) => format!("{:.0} writes/s and {r:.0} reads/s", s.write_rate),
        None => format!("{:.0} writes/s", s.write_rate),
    };
    comment(
        &mut out,
        &[
            format!(
                "Suggested by `rekey suggest` from {} sampled items of `{}`, for {rate}",
                s.sampled, s.table
            ),
            format!(
                "with {:.0} % headroom: one key (one shard) may take {:.0} WCU/s and {:.0} RCU/s.",
                s.headroom * 100.0,
                s.write_budget,
                s.read_budget
            ),
            "Review the names, then `rekey check` and `rekey analyze --app-write-rate` it.".into(),
        ],
    );
    let _ = writeln!(out, "version = 1\n");
    let table = |out: &mut String, section: &str, name: &str| {
        let _ = writeln!(out, "[{section}]\ntable = {}", quote(name));
        let _ = writeln!(
            out,
            "partition_key = {}",
            quote(&key_schema.partition_key.name)
        );
        if let Some(sk) = &key_schema.sort_key {
            let _ = writeln!(out, "sort_key = {}", quote(&sk.name));
        }
        out.push('\n');
    };
    table(&mut out, "source", &s.table);
    table(&mut out, "target", &s.target_table);
    let _ = writeln!(out, "[options]");
    comment(
        &mut out,
        &["Items of the shapes that need no rule (below) are copied unchanged.".into()],
    );
    let _ = writeln!(out, "unmatched = \"copy\"");
    for r in rule_order(&s.shapes) {
        out.push('\n');
        comment(&mut out, &justification(s, r));
        rule(
            &mut out,
            r.rule.as_ref().expect("ordered rules have one"),
            key_schema,
        );
    }
    for r in s.shapes.iter().filter(|r| r.rule.is_none()) {
        out.push('\n');
        comment(&mut out, &justification(s, r));
    }
    out
}
