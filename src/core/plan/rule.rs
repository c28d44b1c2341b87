//! The checks of one `[[rule]]`: its shapes and the captures they bind, the
//! target key it renders, the attributes it sets and removes, and, in place,
//! that it never writes what it reads.
//!
//! `core::template` parses a template on its own; what else makes one valid
//! depends on the rule around it (the captures its shapes bind, the type of
//! the attribute it renders), so those checks are here.

use std::collections::BTreeSet;

use toml::Spanned;

use crate::core::template::{Expr, Part, Shape, Template};
use crate::core::value::ScalarType;

use super::error::Cx;
use super::raw::{RawRule, RawSet};
use super::validate::Scope;
use super::{KeyAttr, Mode, Rule, SetAttr};

/// The rule being checked: the name its messages give, and what its
/// templates may use.
struct ThisRule<'r> {
    name: &'r str,
    /// Where the rule's `[[rule]]` table starts.
    start: usize,
    raw: &'r RawRule,
    /// The captures its shapes bind.
    captured: &'r BTreeSet<String>,
}

impl Cx<'_> {
    pub(super) fn rules(&mut self, raw: &[Spanned<RawRule>], scope: &Scope) -> Vec<Rule> {
        let mut seen_names = BTreeSet::new();
        let mut rules = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let start = r.span().start;
            let r = r.get_ref();
            let name = r
                .name
                .as_ref()
                .map_or_else(|| format!("rule {}", i + 1), |n| n.get_ref().clone());
            if !seen_names.insert(name.clone()) {
                self.error(
                    r.name.as_ref().map_or(start, |n| n.span().start),
                    format!("two rules are named `{name}`"),
                );
            }
            rules.push(self.rule(name, start, r, scope));
        }
        rules
    }

    fn rule(&mut self, name: String, start: usize, raw: &RawRule, scope: &Scope) -> Rule {
        let (matchers, captured) = self.matchers(&name, raw);
        let this = ThisRule {
            name: &name,
            start,
            raw,
            captured: &captured,
        };
        let key = self.rule_key(&this, scope);
        let set = self.set_attrs(&this, scope);
        let remove = self.remove_attrs(&this, scope);
        let rule = Rule {
            name: name.clone(),
            matchers,
            key,
            set,
            remove,
        };
        if scope.mode == Mode::InPlace {
            self.reads_are_not_written(&this, &rule);
            if rule.set.is_empty() && rule.remove.is_empty() && raw.set.is_empty() {
                self.error(
                    start,
                    format!(
                        "rule `{name}` sets nothing: in place, a rule must set or remove attributes"
                    ),
                );
            }
        }
        rule
    }

    /// Shapes and the captures they bind; a capture bound twice is an error.
    fn matchers(&mut self, name: &str, raw: &RawRule) -> (Vec<(String, Shape)>, BTreeSet<String>) {
        let mut matchers = Vec::new();
        let mut captured: BTreeSet<String> = BTreeSet::new();
        for (attr, shape) in &raw.matches {
            match Shape::parse(shape.get_ref()) {
                Ok(s) => {
                    for (c, off) in &s.captures {
                        if !captured.insert(c.clone()) {
                            let at = self.inner_offset(shape.span(), shape.get_ref(), *off);
                            self.error(
                                at,
                                format!("capture `{c}` is bound by two shapes in rule `{name}`"),
                            );
                        }
                    }
                    matchers.push((attr.clone(), s));
                }
                Err(e) => self.syntax(shape.span(), shape.get_ref(), e),
            }
        }
        (matchers, captured)
    }

    /// The target key templates: every target key attribute, and nothing
    /// else; none at all in place, where the key cannot change.
    fn rule_key(&mut self, rule: &ThisRule, scope: &Scope) -> Vec<(KeyAttr, Template)> {
        let (name, target_key) = (rule.name, scope.target_key);
        let mut key = Vec::new();
        match (&rule.raw.key, scope.mode) {
            (Some(k), Mode::InPlace) => {
                self.error(
                    k.span().start,
                    format!("rule `{name}` changes the primary key, but source and target are the same table: a key cannot change in place — re-key into a new table instead"),
                );
            }
            (Some(k), Mode::Rekey) => {
                for (attr_name, t) in k.get_ref() {
                    match target_key.attrs().find(|a| &a.name == attr_name) {
                        None => self.error(
                            t.span().start,
                            format!("`{attr_name}` is not a target key attribute (target key: {target_key}); put other attributes under `set`"),
                        ),
                        Some(attr) => {
                            if let Some(tpl) = self.template(rule, t, t.get_ref()) {
                                self.check_type(&tpl, attr.ty, t, attr_name);
                                key.push((attr.clone(), tpl));
                            }
                        }
                    }
                }
                for attr in target_key.attrs() {
                    if !k.get_ref().contains_key(&attr.name) {
                        self.error(
                            k.span().start,
                            format!(
                                "rule `{name}` does not produce target key attribute `{}`",
                                attr.name
                            ),
                        );
                    }
                }
            }
            (None, Mode::Rekey) if scope.source_key != target_key => {
                self.error(
                    rule.start,
                    format!("rule `{name}` has no `key`, so it would keep the source key, but the target key schema differs ({target_key}); add key = {{ … }}"),
                );
            }
            (None, _) => {}
        }
        key
    }

    /// Added attributes: not the target key, and of an index key's type.
    fn set_attrs(&mut self, rule: &ThisRule, scope: &Scope) -> Vec<SetAttr> {
        let mut set = Vec::new();
        for (attr_name, v) in &rule.raw.set {
            let (body, ty) = match v.get_ref() {
                RawSet::Plain(t) => (t.clone(), ScalarType::S),
                RawSet::Typed { template, ty } => match ScalarType::from_name(ty) {
                    Some(st) => (template.clone(), st),
                    None => {
                        self.error(
                            v.span().start,
                            format!("unknown type `{ty}` for `{attr_name}` (S, N or B)"),
                        );
                        continue;
                    }
                },
            };
            if scope.target_key.names().contains(&attr_name.as_str()) {
                self.error(
                    v.span().start,
                    format!(
                        "`{attr_name}` is a target key attribute: render it under `key`, not `set`"
                    ),
                );
                continue;
            }
            if let Some((ix_ty, ix)) = scope.index_types.get(attr_name.as_str())
                && *ix_ty != ty
            {
                self.error(v.span().start, format!("`{attr_name}` is a key of index `{ix}` of type {ix_ty}, but this rule sets it as {ty}"));
            }
            let spanned = Spanned::new(v.span(), body.clone());
            if let Some(tpl) = self.template(rule, &spanned, &body) {
                self.check_type(&tpl, ty, &spanned, attr_name);
                set.push(SetAttr {
                    name: attr_name.clone(),
                    ty,
                    template: tpl,
                });
            }
        }
        set
    }

    /// Removed attributes: not the target key, and not also set.
    fn remove_attrs(&mut self, rule: &ThisRule, scope: &Scope) -> Vec<String> {
        let name = rule.name;
        let remove: Vec<String> = rule
            .raw
            .remove
            .iter()
            .map(|s| s.get_ref().clone())
            .collect();
        for s in &rule.raw.remove {
            if scope.target_key.names().contains(&s.get_ref().as_str()) {
                self.error(
                    s.span().start,
                    format!(
                        "`{}` is a target key attribute and cannot be removed",
                        s.get_ref()
                    ),
                );
            }
            if rule.raw.set.contains_key(s.get_ref()) {
                self.error(
                    s.span().start,
                    format!("`{}` is both set and removed by rule `{name}`", s.get_ref()),
                );
            }
        }
        remove
    }

    /// In place, a rule that writes what it reads would change its own input
    /// with every write: the tail would follow its own writes forever.
    fn reads_are_not_written(&mut self, this: &ThisRule, rule: &Rule) {
        let name = this.name;
        let reads = rule.reads();
        for s in &rule.set {
            if reads.contains(s.name.as_str()) {
                let at = this
                    .raw
                    .set
                    .get(&s.name)
                    .map_or(this.start, |v| v.span().start);
                self.error(at, format!("rule `{name}` sets `{}`, which it also reads: in place, every write would change its own input", s.name));
            }
        }
        for s in &this.raw.remove {
            if reads.contains(s.get_ref().as_str()) {
                self.error(s.span().start, format!("rule `{name}` removes `{}`, which it also reads: in place, the rule could never apply again", s.get_ref()));
            }
        }
    }

    /// A template of the rule: it parses, and every capture it uses is one
    /// the rule's shapes bind.
    fn template(
        &mut self,
        rule: &ThisRule,
        text: &Spanned<String>,
        body: &str,
    ) -> Option<Template> {
        let (name, captured) = (rule.name, rule.captured);
        match Template::parse(body) {
            Ok(t) => {
                for (c, off) in t.captures() {
                    if !captured.contains(c) {
                        let at = self.inner_offset(text.span(), body, off);
                        let known = if captured.is_empty() {
                            "it captures nothing; write {@name} for an item attribute".to_string()
                        } else {
                            format!(
                                "it captures {}; write {{@{c}}} for an item attribute",
                                join(captured)
                            )
                        };
                        self.error(
                            at,
                            format!("`{c}` is not captured by rule `{name}` ({known})"),
                        );
                    }
                }
                Some(t)
            }
            Err(e) => {
                self.syntax(text.span(), body, e);
                None
            }
        }
    }

    /// A number attribute can only come from one expression: literal text around
    /// it would never be a number. Zero padding is fine (`007` is a number).
    fn check_type(&mut self, t: &Template, ty: ScalarType, at: &Spanned<String>, attr: &str) {
        if ty == ScalarType::N && !t.is_single_expr() {
            let lit = t.literal_text();
            if lit.chars().any(|c| !c.is_ascii_digit())
                || !t.parts.iter().any(|p| matches!(p, Part::Expr { .. }))
            {
                self.error(at.span().start, format!("`{attr}` is a number (N) but its template adds text `{lit}` that is not a number"));
            }
        }
        // Shard padding narrower than the shard count's digits would give keys of
        // different widths, which sort wrongly and read ambiguously.
        for p in &t.parts {
            if let Part::Expr {
                expr: Expr::Shard { n, .. },
                pad: Some(w),
                offset,
            } = p
            {
                let need = (n - 1).to_string().len();
                if *w < need {
                    let pos = self.inner_offset(at.span(), at.get_ref(), *offset);
                    self.error(
                        pos,
                        format!(
                            "padding :0{w} is narrower than shard count {n} needs ({need} digits)"
                        ),
                    );
                }
            }
        }
    }
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::test_plans::{GOOD, IN_PLACE, errors, parse};
    use super::super::{Mode, Plan};

    #[test]
    fn uncaptured_names_point_at_their_column() {
        let src = GOOD.replace("#STATUS#{@status}", "#STATUS#{status}");
        let errs = errors(&src);
        assert_eq!(errs.len(), 1, "{errs:?}");
        let line = src
            .lines()
            .position(|l| l.contains("#STATUS#{status}"))
            .unwrap()
            + 1;
        let col = src.lines().nth(line - 1).unwrap().find("{status}").unwrap() + 1;
        assert!(
            errs[0].starts_with(&format!("p.toml:{line}:{col}: `status` is not captured")),
            "{errs:?}"
        );
        assert!(
            errs[0].contains("{@status}"),
            "suggests the attribute form: {errs:?}"
        );
    }

    #[test]
    fn structural_errors_are_all_reported_with_positions() {
        let src = GOOD
            .replace("shard(order_id,16)", "shard(order_id,0)")
            .replace("{shard(order_id, 4)}", "{sha(order_id)}");
        let errs = errors(&src);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs.iter()
                .any(|e| e.contains("shard count must be at least 1"))
        );
        assert!(errs.iter().any(|e| e.contains("unknown function `sha`")));
        assert!(errs.iter().all(|e| e.starts_with("p.toml:")));
    }

    #[test]
    fn every_rule_must_produce_the_target_key() {
        let src = GOOD.replace(", SK = \"ORDER#{order_id}\" }\nset", " }\nset");
        let errs = errors(&src);
        assert!(
            errs.iter()
                .any(|e| e.contains("does not produce target key attribute `SK`")),
            "{errs:?}"
        );
    }

    #[test]
    fn number_keys_cannot_hold_text() {
        let src = GOOD.replace("partition_key = \"GSI1PK\"", "partition_key = \"GSI1PK:N\"");
        let errs = errors(&src);
        assert!(
            errs.iter()
                .any(|e| e.contains("key of index `GSI1` of type N")),
            "{errs:?}"
        );
        let src = GOOD.replace(
            "template = \"{shard(order_id, 4)}\"",
            "template = \"X{shard(order_id, 4)}\"",
        );
        assert!(errors(&src).iter().any(|e| e.contains("is a number (N)")));
    }

    #[test]
    fn narrow_shard_padding_is_refused() {
        let errs = errors(&GOOD.replace("shard(order_id,16):02", "shard(order_id,128):02"));
        assert!(
            errs.iter()
                .any(|e| e.contains("narrower than shard count 128")),
            "{errs:?}"
        );
    }

    #[test]
    fn in_place_plans_may_not_touch_the_key() {
        let src = GOOD.replace("orders_v2", "orders");
        let errs = errors(&src);
        assert!(
            errs.iter()
                .any(|e| e.contains("re-key into a new table instead")),
            "{errs:?}"
        );
        let ok = src.replace(
            "key = { PK = \"TENANT#{tenant}#DAY#{day}#SHARD#{shard(order_id,16):02}\", SK = \"ORDER#{order_id}\" }\n",
            "",
        );
        let ok = ok
            .replace("drop = [\"legacy\"]\n", "")
            .replace("source_key_prefix = \"old_\"\n", "");
        let p = parse(&ok).unwrap();
        assert_eq!(p.mode, Mode::InPlace);
    }

    #[test]
    fn in_place_a_rule_may_not_write_what_it_reads() {
        let errs = errors(&IN_PLACE.replace("set = { X = \"{k}\" }", "set = { kind = \"{k}\" }"));
        assert!(
            errs.iter()
                .any(|e| e.contains("sets `kind`, which it also reads")),
            "{errs:?}"
        );
        let errs = errors(&IN_PLACE.replace(
            "set = { X = \"{k}\" }",
            "set = { X = \"{k}\" }\nremove = [\"kind\"]",
        ));
        assert!(
            errs.iter()
                .any(|e| e.contains("removes `kind`, which it also reads")),
            "{errs:?}"
        );
    }

    #[test]
    fn the_status_gsi_example_plan_is_in_place_and_refuses_key_changes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("plans/status-gsi-in-place.toml");
        let p = Plan::load(&path).unwrap();
        assert_eq!(p.mode, Mode::InPlace);
        let text = std::fs::read_to_string(&path).unwrap();
        let bad = text.replace(
            "[[rule]]\nname = \"task\"\n",
            "[[rule]]\nname = \"task\"\nkey = { PK = \"X#{tenant}\", SK = \"{task_id}\" }\n",
        );
        assert_ne!(bad, text);
        let errs = errors(&bad);
        assert!(
            errs.iter().any(|e| e.contains("changes the primary key")
                && e.contains("re-key into a new table instead")),
            "{errs:?}"
        );
    }
}
