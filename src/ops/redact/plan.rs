//! [`PlanRedactor`]: a [`Redactor`] that knows the plan's key shapes,
//! templates and attribute names, and redacts each command's report.

use std::collections::{BTreeMap, BTreeSet};

use super::Redactor;
use super::target::{Form, TargetShape};
use crate::core::plan::Plan;
use crate::core::template::{Part, Shape, Template};
use crate::core::value::{Item, Value};
use crate::phase::analyze::{Distribution, Report};
use crate::phase::check::CheckReport;
use crate::phase::verify::{Example, VerifyReport};

/// A [`Redactor`] that knows the plan's key shapes and attribute names.
pub struct PlanRedactor {
    pub redactor: Redactor,
    source: BTreeMap<String, Vec<Shape>>,
    target: BTreeMap<String, Vec<Form>>,
    /// Attributes of a target item that carry key values.
    target_attrs: BTreeSet<String>,
    names: BTreeSet<String>,
    source_key: Vec<String>,
    target_key: Vec<String>,
}

impl PlanRedactor {
    pub fn new(plan: &Plan, redactor: Redactor) -> Self {
        let mut source: BTreeMap<String, Vec<Shape>> = BTreeMap::new();
        let mut target: BTreeMap<String, Vec<Form>> = BTreeMap::new();
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
                target
                    .entry(attr.name.clone())
                    .or_default()
                    .push(Form::Target(TargetShape::new(t)));
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
                    target
                        .entry(set.name.clone())
                        .or_default()
                        .push(Form::Target(TargetShape::new(&set.template)));
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
                .extend(shapes.iter().cloned().map(Form::Source));
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
                    let forms = shapes.iter().cloned().map(Form::Source).collect();
                    target.insert(copy.clone(), forms);
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

    pub(crate) fn source_value(&self, attr: &str, value: &str) -> String {
        self.redactor
            .shaped(value, self.source.get(attr).map_or(&[], Vec::as_slice))
    }

    pub fn target_value(&self, attr: &str, value: &str) -> String {
        self.redactor
            .formed(value, self.target.get(attr).map_or(&[], Vec::as_slice))
    }

    /// A value of a target (new design) or source (old design) attribute.
    fn value(&self, attr: &str, value: &str, target: bool) -> String {
        if target {
            self.target_value(attr, value)
        } else {
            self.source_value(attr, value)
        }
    }

    pub fn message(&self, msg: &str) -> String {
        self.redactor.message(msg, &self.names)
    }

    /// A whole target or source key on one line: each attribute of the
    /// plan's key as [`Self::target_value`] or [`Self::source_value`] shows
    /// it, joined by ` / ` as [`Redactor::key`] joins them.
    pub fn key(&self, key: &Item, target: bool) -> String {
        let names = if target {
            &self.target_key
        } else {
            &self.source_key
        };
        let parts: Vec<String> = names
            .iter()
            .filter_map(|attr| {
                let v = key.get(attr)?;
                Some(self.value(attr, &v.display_text(), target))
            })
            .collect();
        parts.join(" / ")
    }

    /// A whole key given as text, its attributes' values joined by ` / `
    /// (the log's key fields): each part redacted as [`Self::key`] redacts
    /// it; a text that does not split into the plan's key attributes is
    /// hashed whole.
    pub(crate) fn key_text(&self, text: &str, target: bool) -> String {
        if self.redactor.show {
            return text.to_string();
        }
        let names = if target {
            &self.target_key
        } else {
            &self.source_key
        };
        let mut parts: Vec<String> = text.split(" / ").map(str::to_string).collect();
        if parts.len() != names.len() {
            return super::token(text);
        }
        self.parts(&mut parts, names, target);
        parts.join(" / ")
    }

    fn parts(&self, parts: &mut [String], names: &[String], target: bool) {
        for (part, attr) in parts.iter_mut().zip(names) {
            *part = self.value(attr, part, target);
        }
    }

    fn distribution(&self, d: &mut Distribution, target: bool) {
        for k in d.hottest_by_items.iter_mut().chain(&mut d.largest_by_bytes) {
            k.key = self.value(&d.attribute, &k.key, target);
        }
    }

    /// Redact every key value in an analyze report.
    /// Verify's examples (and its repair's): named by their key, redacted as
    /// every command redacts keys (the plan's shapes and an orphan's shard
    /// readable, values hashed), or the key itself with `--show-keys`.
    pub fn verify(&self, r: &mut VerifyReport) {
        let repair = r.repair.iter_mut().flat_map(|rep| rep.examples.iter_mut());
        for e in r.examples.iter_mut().chain(repair) {
            self.example(e);
        }
    }

    fn example(&self, e: &mut Example) {
        if self.redactor.show {
            return;
        }
        e.key = match &e.named_by {
            Some((k, target)) => self.key(k, *target),
            None => self.redactor.key(&[]),
        };
    }

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
            let redact = |t: &str| self.value(name, t, target);
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
    use crate::ops::redact::tests::{HIDE, SHOW, tokens_in};
    use crate::ops::redact::token;

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
            format!("T#{}#D#{}#S#05", token("acme"), token("2026"))
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
            item["PK"],
            Value::S(format!("T#{}#D#{}#S#05", token("acme"), token("2026")))
        );
        assert_eq!(
            item["src_PK"],
            Value::S(format!("T#{}#D#{}", token("acme"), token("2026")))
        );
        assert_eq!(item["total"], Value::N("12.50".into()));
        assert!(!format!("{item:?}").contains("acme"));
    }

    #[test]
    fn templates_are_tried_in_rule_order_then_the_source_shapes() {
        let src = "version = 1\n[source]\ntable = \"a\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
                   [target]\ntable = \"b\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
                   [[target.index]]\nname = \"G\"\npartition_key = \"GPK\"\n\
                   [options]\nunmatched = \"copy\"\n\
                   [[rule]]\nmatch = { PK = \"T#{t}#D#{d}\", SK = \"O#{id}\" }\n\
                   key = { PK = \"T#{t}#D#{d}#S#{shard(id, 16):02}\", SK = \"O#{id}\" }\n\
                   set = { GPK = \"ST#{@status}#B#{shard(id, 4)}\", n = \"{shard(id, 8)}\" }\n\
                   [[rule]]\nmatch = { PK = \"T#{t}\", SK = \"PROFILE\" }\n\
                   key = { PK = \"T#{t}\", SK = \"PROFILE\" }\n\
                   [[rule]]\nmatch = { PK = \"U#{u}\" }\n";
        let plan = Plan::parse(src, Path::new("p.toml")).unwrap();
        let r = PlanRedactor::new(&plan, HIDE);
        let cases = [
            ("PK", "T#acme#D#2026#S#05", "T#‹acme›#D#‹2026›#S#05"),
            // The second rule's template: the first does not fit.
            ("PK", "T#acme", "T#‹acme›"),
            // Fits no template: a copied source key, by the source shapes.
            ("PK", "U#1", "U#‹1›"),
            ("PK", "nothing", "‹nothing›"),
            ("SK", "PROFILE", "PROFILE"),
            // An index key a rule sets.
            ("GPK", "ST#OPEN#B#3", "ST#‹OPEN›#B#3"),
            ("n", "7", "7"),
        ];
        for (attr, value, expected) in cases {
            assert_eq!(
                r.target_value(attr, value),
                tokens_in(expected),
                "{attr} = {value}"
            );
        }
        let mut item = Item::new();
        item.insert("GPK".into(), Value::S("ST#OPEN#B#3".into()));
        item.insert("n".into(), Value::N("7".into()));
        r.item(&mut item, true);
        assert_eq!(item["GPK"], Value::S(tokens_in("ST#‹OPEN›#B#3")));
        assert_eq!(
            item["n"],
            Value::N("7".into()),
            "a shard number stays a number"
        );
        // --show-keys: as they are.
        let r = PlanRedactor::new(&plan, SHOW);
        assert_eq!(
            r.target_value("PK", "T#acme#D#2026#S#05"),
            "T#acme#D#2026#S#05"
        );
    }

    #[test]
    fn verify_examples_name_keys_as_every_command_redacts_them() {
        let src = "version = 1\n[source]\ntable = \"a\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
                   [target]\ntable = \"b\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
                   [[rule]]\nmatch = { PK = \"T#{t}\", SK = \"O#{id}\" }\n\
                   key = { PK = \"T#{t}#S#{shard(id, 16):02}\", SK = \"O#{id}\" }\n";
        let plan = Plan::parse(src, std::path::Path::new("p.toml")).unwrap();
        let key = |pk: &str, sk: &str| {
            let mut i = Item::new();
            i.insert("PK".into(), Value::S(pk.into()));
            i.insert("SK".into(), Value::S(sk.into()));
            i
        };
        let m = |kind, named_by: (Item, bool)| Example {
            kind,
            key: String::new(),
            named_by: Some(named_by),
            attributes: Vec::new(),
        };
        let show_key = |keys: &PlanRedactor, e: &Example| {
            let mut e = e.clone();
            keys.example(&mut e);
            e.key
        };
        let tok = token;
        let hidden = PlanRedactor::new(&plan, Redactor { show: false });
        // An orphan by its target key, its shard readable.
        use crate::phase::verify::Kind;
        let mut orphan = m(Kind::Orphan, (key("T#acme#S#07", "O#1"), true));
        assert_eq!(
            show_key(&hidden, &orphan),
            format!("T#{}#S#07 / O#{}", tok("acme"), tok("1"))
        );
        // Any other difference by its source key.
        let missing = m(Kind::Missing, (key("T#acme", "O#1"), false));
        assert_eq!(
            show_key(&hidden, &missing),
            format!("T#{} / O#{}", tok("acme"), tok("1"))
        );
        // With --show-keys the example keeps the key verify wrote.
        orphan.key = "the key".into();
        let shown = PlanRedactor::new(&plan, Redactor { show: true });
        assert_eq!(show_key(&shown, &orphan), "the key");
    }
}
