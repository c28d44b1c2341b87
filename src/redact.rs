//! Key values out of terminal and `--json` output, unless `--show-keys`.
//!
//! Keys are often customer data (tenant names, e-mail addresses, order ids),
//! and terminal output ends up in CI logs, tickets and screen shares. So by
//! default every key value rekey prints is replaced by a token: the first 8
//! hex digits of the MD5 of its text, `‹3f9a1c2e›`. The token is stable across
//! runs and machines, so an operator can find the item in the files of the
//! owner-only state directory (rejects, mismatches), which keep the real
//! values: `printf '%s' 'TENANT#acme' | md5sum | cut -c1-8`. A key of several
//! attributes is hashed as its values joined by ` / `, as shown with
//! `--show-keys`. The token pseudonymises, it does not encrypt: a guessable
//! value (a small tenant list) can be found by hashing the guesses.
//!
//! Where the plan knows a key's shape, the shape stays readable and only the
//! captured values are hashed: `TENANT#acme#DAY#2026-07-07` shows as
//! `TENANT#‹a1b2c3d4›#DAY#‹5e6f7a8b›` — the shape is plan text, not data.
//! Target keys are matched against the shape of the plan's key templates
//! (each `{…}` expression a capture), source keys against the rules' `match`
//! shapes. A value no shape matches is hashed whole.

use std::collections::{BTreeMap, BTreeSet};

use md5::{Digest as _, Md5};

use crate::analyze::{Distribution, Report};
use crate::check::CheckReport;
use crate::plan::Plan;
use crate::template::{Part, Shape, Template};
use crate::value::{Item, Value};

/// The token for `text`: `‹` + the first 8 hex digits of its MD5 + `›`.
pub fn token(text: &str) -> String {
    let d = Md5::digest(text.as_bytes());
    format!("‹{:02x}{:02x}{:02x}{:02x}›", d[0], d[1], d[2], d[3])
}

/// Redacts key values unless `show`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Redactor {
    pub show: bool,
}

impl Redactor {
    /// A whole key, from its decoded attribute values.
    pub fn key(&self, decoded_parts: &[String]) -> String {
        let joined = decoded_parts.join(" / ");
        if self.show { joined } else { token(&joined) }
    }

    /// One value, keeping the literal text of the first shape it matches.
    pub fn shaped(&self, value: &str, shapes: &[Shape]) -> String {
        if self.show {
            return value.to_string();
        }
        for shape in shapes {
            if let Some(ranges) = shape.capture_ranges(value) {
                let mut out = String::new();
                let mut at = 0;
                for r in ranges {
                    out.push_str(&value[at..r.start]);
                    out.push_str(&token(&value[r.clone()]));
                    at = r.end;
                }
                out.push_str(&value[at..]);
                return out;
            }
        }
        token(value)
    }

    /// A message: every `backticked` span that is not one of `names` (the
    /// plan's attribute names) is hashed, as it may quote a value.
    pub fn message(&self, msg: &str, names: &BTreeSet<String>) -> String {
        if self.show {
            return msg.to_string();
        }
        let mut out = String::new();
        let mut rest = msg;
        while let Some(open) = rest.find('`') {
            let Some(len) = rest[open + 1..].find('`') else {
                break;
            };
            let span = &rest[open + 1..open + 1 + len];
            out.push_str(&rest[..=open]);
            if names.contains(span) {
                out.push_str(span);
            } else {
                out.push_str(&token(span));
            }
            out.push('`');
            rest = &rest[open + len + 2..];
        }
        out.push_str(rest);
        out
    }
}

/// The shape of a template's output: its literal text, each expression a capture.
/// None when two expressions touch (no literal text to tell them apart).
fn template_shape(t: &Template) -> Option<Shape> {
    let mut text = String::new();
    for (i, part) in t.parts.iter().enumerate() {
        match part {
            Part::Lit(l) => text.push_str(&l.replace('{', "{{").replace('}', "}}")),
            Part::Expr { .. } => text.push_str(&format!("{{c{i}}}")),
        }
    }
    Shape::parse(&text).ok()
}

/// A [`Redactor`] that knows the plan's key shapes and attribute names.
pub struct PlanRedactor {
    pub redactor: Redactor,
    source: BTreeMap<String, Vec<Shape>>,
    target: BTreeMap<String, Vec<Shape>>,
    /// Attributes of a target item that carry key values.
    target_attrs: BTreeSet<String>,
    names: BTreeSet<String>,
    source_key: Vec<String>,
    target_key: Vec<String>,
}

impl PlanRedactor {
    pub fn new(plan: &Plan, redactor: Redactor) -> Self {
        let mut source: BTreeMap<String, Vec<Shape>> = BTreeMap::new();
        let mut target: BTreeMap<String, Vec<Shape>> = BTreeMap::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        let mut target_attrs: BTreeSet<String> = BTreeSet::new();
        let note_template = |names: &mut BTreeSet<String>, t: &Template| {
            names.extend(t.attributes().into_iter().map(|(a, _)| a.to_string()));
            names.extend(t.captures().into_iter().map(|(c, _)| c.to_string()));
        };
        for rule in &plan.rules {
            for (attr, shape) in &rule.matchers {
                source.entry(attr.clone()).or_default().push(shape.clone());
                names.insert(attr.clone());
            }
            for (attr, t) in &rule.key {
                note_template(&mut names, t);
                if let Some(s) = template_shape(t) {
                    target.entry(attr.name.clone()).or_default().push(s);
                }
            }
            for set in &rule.set {
                note_template(&mut names, &set.template);
                names.insert(set.name.clone());
                // Set attributes built from other values (GSI keys, mostly) may carry key values.
                if set
                    .template
                    .parts
                    .iter()
                    .any(|p| matches!(p, Part::Expr { .. }))
                {
                    target_attrs.insert(set.name.clone());
                    if let Some(s) = template_shape(&set.template) {
                        target.entry(set.name.clone()).or_default().push(s);
                    }
                }
            }
            names.extend(rule.remove.iter().cloned());
        }
        // A target attribute the rules do not shape may still hold a source
        // key (kept key, copied unmatched item): fall back on the source shapes.
        for (attr, shapes) in &source {
            target
                .entry(attr.clone())
                .or_default()
                .extend(shapes.iter().cloned());
        }
        let source_key: Vec<String> = plan
            .source_key
            .names()
            .into_iter()
            .map(str::to_string)
            .collect();
        let target_key: Vec<String> = plan
            .target_key
            .names()
            .into_iter()
            .map(str::to_string)
            .collect();
        names.extend(source_key.iter().cloned());
        names.extend(target_key.iter().cloned());
        names.extend(plan.drop.iter().cloned());
        target_attrs.extend(target_key.iter().cloned());
        for ix in &plan.indexes {
            for a in ix.key.names() {
                names.insert(a.to_string());
                target_attrs.insert(a.to_string());
            }
        }
        if let Some(prefix) = &plan.source_key_prefix {
            for a in &source_key {
                let copy = format!("{prefix}{a}");
                if let Some(shapes) = source.get(a) {
                    target.insert(copy.clone(), shapes.clone());
                }
                names.insert(copy.clone());
                target_attrs.insert(copy);
            }
        }
        PlanRedactor {
            redactor,
            source,
            target,
            target_attrs,
            names,
            source_key,
            target_key,
        }
    }

    pub fn source_value(&self, attr: &str, value: &str) -> String {
        self.redactor
            .shaped(value, self.source.get(attr).map_or(&[], Vec::as_slice))
    }

    pub fn target_value(&self, attr: &str, value: &str) -> String {
        self.redactor
            .shaped(value, self.target.get(attr).map_or(&[], Vec::as_slice))
    }

    pub fn message(&self, msg: &str) -> String {
        self.redactor.message(msg, &self.names)
    }

    fn parts(&self, parts: &mut [String], names: &[String], target: bool) {
        for (part, attr) in parts.iter_mut().zip(names) {
            *part = if target {
                self.target_value(attr, part)
            } else {
                self.source_value(attr, part)
            };
        }
    }

    fn distribution(&self, d: &mut Distribution, target: bool) {
        for k in d.hottest_by_items.iter_mut().chain(&mut d.largest_by_bytes) {
            k.key = if target {
                self.target_value(&d.attribute, &k.key)
            } else {
                self.source_value(&d.attribute, &k.key)
            };
        }
    }

    /// Redact every key value in an analyze report.
    pub fn analyze(&self, r: &mut Report) {
        if self.redactor.show {
            return;
        }
        for reason in &mut r.reject_reasons {
            for e in &mut reason.examples {
                self.parts(&mut e.source_key, &self.source_key, false);
                e.message = self.message(&e.message);
            }
        }
        for c in &mut r.collisions.examples {
            self.parts(&mut c.target_key, &self.target_key, true);
            for s in &mut c.source_keys {
                self.parts(s, &self.source_key, false);
            }
        }
        self.distribution(&mut r.old, false);
        self.distribution(&mut r.new, true);
        for ix in &mut r.indexes {
            self.distribution(&mut ix.distribution, true);
        }
    }

    fn item(&self, item: &mut Item, target: bool) {
        for (name, v) in item.iter_mut() {
            let is_key = if target {
                self.target_attrs.contains(name)
            } else {
                self.source_key.contains(name)
            };
            if !is_key {
                continue;
            }
            let redact = |t: &str| {
                if target {
                    self.target_value(name, t)
                } else {
                    self.source_value(name, t)
                }
            };
            let new = match &*v {
                Value::S(s) => Value::S(redact(s)),
                // The type tag stays, so the item still reads as what it is.
                Value::N(n) => Value::N(redact(n)),
                other => Value::S(redact(&other.display_text())),
            };
            *v = new;
        }
    }

    /// Redact the key attributes of `rekey check`'s sample items.
    pub fn check(&self, r: &mut CheckReport) {
        if self.redactor.show {
            return;
        }
        for s in &mut r.items {
            if let Some(i) = &mut s.before {
                self.item(i, false);
            }
            if let Some(i) = &mut s.after {
                self.item(i, true);
            }
            // A transform's reason may quote a value; an unreadable line's is about the file.
            if s.outcome == "reject"
                && let Some(reason) = &mut s.reason
            {
                *reason = self.message(reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const HIDE: Redactor = Redactor { show: false };
    const SHOW: Redactor = Redactor { show: true };

    #[test]
    fn tokens_are_stable_short_and_distinct() {
        let parts = vec!["TENANT#acme".to_string(), "ORDER#1".to_string()];
        let a = HIDE.key(&parts);
        assert_eq!(a, HIDE.key(&parts));
        // MD5("TENANT#acme / ORDER#1"), first 8 hex digits: reproducible with md5sum.
        let d = Md5::digest(b"TENANT#acme / ORDER#1");
        assert_eq!(
            a,
            format!("‹{:02x}{:02x}{:02x}{:02x}›", d[0], d[1], d[2], d[3])
        );
        assert_eq!(a.chars().count(), 10);
        assert_ne!(a, HIDE.key(&["TENANT#acme".into(), "ORDER#2".into()]));
        assert!(!a.contains("acme"));
        assert_eq!(token("acme"), token("acme"));
        assert_ne!(token("acme"), token("acmf"));
    }

    #[test]
    fn show_passes_keys_through() {
        let parts = vec!["TENANT#acme".to_string(), "ORDER#1".to_string()];
        assert_eq!(SHOW.key(&parts), "TENANT#acme / ORDER#1");
        let shape = Shape::parse("TENANT#{t}").unwrap();
        assert_eq!(SHOW.shaped("TENANT#acme", &[shape]), "TENANT#acme");
        assert_eq!(
            SHOW.message("renders `abc`", &BTreeSet::new()),
            "renders `abc`"
        );
    }

    #[test]
    fn a_known_shape_keeps_its_literals_and_hashes_the_captures() {
        let shapes = [
            Shape::parse("USER#{u}").unwrap(),
            Shape::parse("TENANT#{t}#DAY#{d}").unwrap(),
        ];
        assert_eq!(
            HIDE.shaped("TENANT#acme#DAY#2026-07-07", &shapes),
            format!("TENANT#{}#DAY#{}", token("acme"), token("2026-07-07"))
        );
        // No shape matches: the whole value is hashed.
        assert_eq!(HIDE.shaped("other", &shapes), token("other"));
    }

    #[test]
    fn messages_keep_attribute_names_and_hash_quoted_values() {
        let names: BTreeSet<String> = ["total".to_string()].into();
        assert_eq!(
            HIDE.message("`total` is a number attribute but renders `x1`", &names),
            format!(
                "`total` is a number attribute but renders `{}`",
                token("x1")
            )
        );
        assert_eq!(HIDE.message("no rule matched", &names), "no rule matched");
        assert_eq!(HIDE.message("odd ` quote", &names), "odd ` quote");
    }

    #[test]
    fn target_keys_are_shaped_by_the_key_templates() {
        let src = "version = 1\n[source]\ntable = \"a\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
                   [target]\ntable = \"b\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
                   [options]\nsource_key_prefix = \"src_\"\n\
                   [[rule]]\nmatch = { PK = \"T#{t}#D#{d}\" }\n\
                   key = { PK = \"T#{t}#D#{d}#S#{shard(t, 16):02}\", SK = \"{@SK}\" }\n";
        let plan = Plan::parse(src, Path::new("p.toml")).unwrap();
        let r = PlanRedactor::new(&plan, HIDE);
        assert_eq!(
            r.target_value("PK", "T#acme#D#2026#S#05"),
            format!("T#{}#D#{}#S#{}", token("acme"), token("2026"), token("05"))
        );
        assert_eq!(
            r.source_value("PK", "T#acme#D#2026"),
            format!("T#{}#D#{}", token("acme"), token("2026"))
        );
        assert_eq!(r.target_value("SK", "ORDER#1"), token("ORDER#1"));
        let mut item = Item::new();
        item.insert("PK".into(), Value::S("T#acme#D#2026#S#05".into()));
        item.insert("src_PK".into(), Value::S("T#acme#D#2026".into()));
        item.insert("total".into(), Value::N("12.50".into()));
        r.item(&mut item, true);
        assert_eq!(
            item["src_PK"],
            Value::S(format!("T#{}#D#{}", token("acme"), token("2026")))
        );
        assert_eq!(item["total"], Value::N("12.50".into()));
        assert!(!format!("{item:?}").contains("acme"));
    }
}
