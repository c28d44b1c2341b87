//! Key values out of terminal and `--json` output, unless `--show-keys`.
//!
//! Keys are often customer data (tenant names, e-mail addresses, order ids),
//! and terminal output ends up in CI logs, tickets and screen shares. So by
//! default every key value rekey prints is replaced by a token: the first 8
//! hex digits of the MD5 of its text, `‹3f9a1c2e›`. The token is stable across
//! runs and machines, so an operator can find the item in the files of the
//! owner-only state directory (rejects, mismatches), which keep the real
//! values: `printf '%s' 'TENANT#acme' | md5sum | cut -c1-8`. A key of several
//! attributes is shown as its attributes joined by ` / `, each redacted on its
//! own ([`Redactor::key`], which knows no plan, hashes the joined text whole).
//! The token pseudonymises, it does not encrypt: a guessable value (a small
//! tenant list) can be found by hashing the guesses.
//!
//! Where the plan knows how a key value is built, what the plan wrote stays
//! readable and only what came from the item is hashed:
//! * a **source** key is matched against the rules' `match` shapes: the
//!   literals stay, each capture is hashed (`TENANT#acme#DAY#2026-07-07` shows
//!   as `TENANT#‹a1b2c3d4›#DAY#‹5e6f7a8b›`);
//! * a **target** key (or an attribute a rule's `set` builds, such as an index
//!   key) is split against the rules' templates: the literals and what
//!   `shard()` computed stay, so the shard a key landed on can be read
//!   (`TENANT#‹a1b2c3d4›#DAY#‹5e6f7a8b›#SHARD#07`); captures, `{@attributes}`
//!   and `bucket()` are hashed. A shard number is a few bits of a hash of a
//!   value whose token is shown anyway, and the shard is what an operator
//!   needs to see to judge the new design. A bucket is hashed: it is a captured
//!   or attribute time at a coarser grain, so it still dates the item, as the
//!   `day` capture of the same design does.
//!
//! A shard number is shown only when the value splits against the template
//! in exactly one way, so a captured value that happens to look like plan
//! text and digits (`a#SHARD#07`) cannot pass for them: with two or more
//! splits, the whole value is hashed. A value that fits none of the plan's
//! shapes and templates is hashed whole too. An attribute's templates are
//! tried in rule order, as rules match (specific rules first), and the first
//! that fits decides; the source shapes come last, for a kept or copied source
//! key no template fits. What rule order cannot tell apart: a value built
//! another way (a copied source key) that fits an earlier template exactly,
//! with a valid shard number where its shard goes, reads as that template's.

use std::collections::{BTreeMap, BTreeSet};

use md5::{Digest as _, Md5};

use crate::core::plan::Plan;
use crate::core::template::{Expr, Part, Shape, Template};
use crate::core::value::{Item, Value};
use crate::phase::analyze::{Distribution, Report};
use crate::phase::check::CheckReport;
use crate::phase::verify::{Example, VerifyReport};

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
        shapes
            .iter()
            .find_map(|shape| shape_redacted(shape, value))
            .unwrap_or_else(|| token(value))
    }

    /// One value, by the first of `forms` it fits.
    fn formed(&self, value: &str, forms: &[Form]) -> String {
        if self.show {
            return value.to_string();
        }
        forms
            .iter()
            .find_map(|form| form.redacted(value))
            .unwrap_or_else(|| token(value))
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

/// `value` with the captures of `shape` hashed, if the shape matches it.
fn shape_redacted(shape: &Shape, value: &str) -> Option<String> {
    let ranges = shape.capture_ranges(value)?;
    let mut out = String::new();
    let mut at = 0;
    for r in ranges {
        out.push_str(&value[at..r.start]);
        out.push_str(&token(&value[r.clone()]));
        at = r.end;
    }
    out.push_str(&value[at..]);
    Some(out)
}

/// One part of a target template, as redaction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Plan text: shown.
    Lit(String),
    /// `shard(…, n)`, zero-padded to `width`: a number below `n`, shown.
    Shard { n: u32, width: usize },
    /// Item data — a capture, an `@attribute`, a `bucket()`, a quoted
    /// template: hashed. Shapes capture one character or more, so only a
    /// capture is known not to be empty; the rest may be.
    Data { may_be_empty: bool },
}

impl Piece {
    fn of(part: &Part) -> Piece {
        match part {
            Part::Lit(l) => Piece::Lit(l.clone()),
            Part::Expr {
                expr: Expr::Shard { n, .. },
                pad,
                ..
            } => Piece::Shard {
                n: *n,
                width: pad.unwrap_or(0),
            },
            Part::Expr { expr, .. } => Piece::Data {
                may_be_empty: !matches!(expr, Expr::Capture(_)),
            },
        }
    }

    /// Where a literal or shard starting at byte `start` of `value` can end.
    /// (Data can end anywhere; the split handles it apart.)
    fn ends<'v>(&'v self, value: &'v str, start: usize) -> Box<dyn Iterator<Item = usize> + 'v> {
        let rest = &value[start..];
        match self {
            Piece::Lit(l) => Box::new(
                rest.starts_with(l.as_str())
                    .then_some(start + l.len())
                    .into_iter(),
            ),
            Piece::Shard { n, width } => {
                // Digits are one byte each, so every prefix of a run of digits ends on a char boundary.
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                Box::new(
                    (1..=digits.min(shard_text_max(*n, *width)))
                        .filter(move |&len| is_shard_text(&rest[..len], *n, *width))
                        .map(move |len| start + len),
                )
            }
            Piece::Data { .. } => Box::new(std::iter::empty()),
        }
    }
}

/// The longest text `shard(…, n)` padded to `width` renders.
fn shard_text_max(n: u32, width: usize) -> usize {
    n.saturating_sub(1).to_string().len().max(width)
}

/// Whether `text` is exactly what a shard below `n` renders as, padded to
/// `width` — so `07` for `:02` but not for no padding, and never `16` of 16.
fn is_shard_text(text: &str, n: u32, width: usize) -> bool {
    text.parse::<u32>()
        .is_ok_and(|k| k < n && format!("{k:0width$}") == text)
}

/// In how many ways a suffix of the pieces fits a suffix of the value:
/// 0, 1, or [`MANY`].
type Ways = u8;

/// Two or more ways: all that matters is that the split is not unique.
const MANY: Ways = 2;

fn add(a: Ways, b: Ways) -> Ways {
    (a + b).min(MANY)
}

/// A target template as redaction reads it: which parts to show, which to hash.
#[derive(Debug, Clone)]
struct TargetShape {
    pieces: Vec<Piece>,
}

impl TargetShape {
    fn new(t: &Template) -> TargetShape {
        TargetShape {
            pieces: t.parts.iter().map(Piece::of).collect(),
        }
    }

    /// `value` with its data hashed, if it fits the template; hashed whole if
    /// it fits in more than one way, as then the shown parts might be data.
    fn redacted(&self, value: &str) -> Option<String> {
        let ways = self.ways(value);
        match ways[0][0] {
            0 => None,
            1 => Some(
                self.split(value, &ways)
                    .map_or_else(|| token(value), |ends| self.show(value, &ends)),
            ),
            _ => Some(token(value)),
        }
    }

    /// `ways[i][p]`: in how many ways `pieces[i..]` fit `value[p..]`, counted
    /// from the right so that each cell is computed once (a backtracking
    /// search can take exponential time on many `#`s).
    fn ways(&self, value: &str) -> Vec<Vec<Ways>> {
        let len = value.len();
        let mut ways = vec![vec![0; len + 1]; self.pieces.len() + 1];
        ways[self.pieces.len()][len] = 1;
        for (i, piece) in self.pieces.iter().enumerate().rev() {
            let (row, next) = {
                let (left, right) = ways.split_at_mut(i + 1);
                (&mut left[i], &right[0])
            };
            match piece {
                Piece::Data { may_be_empty } => {
                    // Data ends anywhere: a running sum of the ways from its possible ends.
                    let mut from_here: Ways = 0;
                    for p in (0..=len).rev().filter(|&p| value.is_char_boundary(p)) {
                        let after_here = from_here;
                        from_here = add(from_here, next[p]);
                        row[p] = if *may_be_empty { from_here } else { after_here };
                    }
                }
                fixed => {
                    for p in (0..=len).filter(|&p| value.is_char_boundary(p)) {
                        row[p] = fixed.ends(value, p).fold(0, |acc, e| add(acc, next[e]));
                    }
                }
            }
        }
        ways
    }

    /// The end of each piece in the one split `ways` counted. None cannot
    /// happen when `ways[0][0]` is 1; the caller hashes the whole value then.
    fn split(&self, value: &str, ways: &[Vec<Ways>]) -> Option<Vec<usize>> {
        let mut ends = Vec::with_capacity(self.pieces.len());
        let mut at = 0;
        for (i, piece) in self.pieces.iter().enumerate() {
            let next = &ways[i + 1];
            let end = match piece {
                Piece::Data { may_be_empty } => {
                    let first = at + usize::from(!may_be_empty);
                    (first..=value.len()).find(|&e| value.is_char_boundary(e) && next[e] > 0)
                }
                fixed => fixed.ends(value, at).find(|&e| next[e] > 0),
            }?;
            ends.push(end);
            at = end;
        }
        Some(ends)
    }

    /// The value, piece by piece: literals and shards as they are, data hashed.
    fn show(&self, value: &str, ends: &[usize]) -> String {
        let mut out = String::new();
        let mut at = 0;
        for (piece, &end) in self.pieces.iter().zip(ends) {
            let text = &value[at..end];
            match piece {
                Piece::Data { .. } => out.push_str(&token(text)),
                Piece::Lit(_) | Piece::Shard { .. } => out.push_str(text),
            }
            at = end;
        }
        out
    }
}

/// How the plan says a value of one attribute is built.
#[derive(Debug, Clone)]
enum Form {
    /// A rule's `match` shape (a source key, kept or copied).
    Source(Shape),
    /// A rule's key or `set` template.
    Target(TargetShape),
}

impl Form {
    /// The value redacted by this form, if it fits.
    fn redacted(&self, value: &str) -> Option<String> {
        match self {
            Form::Source(shape) => shape_redacted(shape, value),
            Form::Target(t) => t.redacted(value),
        }
    }
}

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

    pub fn source_value(&self, attr: &str, value: &str) -> String {
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

    /// `expected` in a short notation: each `‹text›` stands for `token("text")`.
    fn tokens_in(expected: &str) -> String {
        let mut out = String::new();
        let mut rest = expected;
        while let Some(open) = rest.find('‹') {
            let body = &rest[open + '‹'.len_utf8()..];
            let close = body.find('›').expect("‹ without ›");
            out.push_str(&rest[..open]);
            out.push_str(&token(&body[..close]));
            rest = &body[close + '›'.len_utf8()..];
        }
        out.push_str(rest);
        out
    }

    fn by_template(template: &str, value: &str) -> String {
        let form = Form::Target(TargetShape::new(&Template::parse(template).unwrap()));
        HIDE.formed(value, &[form])
    }

    #[test]
    fn target_values_show_literals_and_shards_and_hash_the_rest() {
        let cases = [
            // Literals and the shard are shown; captures are hashed.
            (
                "T#{t}#D#{d}#S#{shard(id, 16):02}",
                "T#acme#D#2026-07-07#S#07",
                "T#‹acme›#D#‹2026-07-07›#S#07",
            ),
            ("T#{t}#S#{shard(id, 16):02}", "T#日本#S#03", "T#‹日本›#S#03"),
            // Widths: none, :02, :03, and wider than the padding when n needs it.
            ("S#{shard(id, 16)}", "S#7", "S#7"),
            ("S#{shard(id, 16)}", "S#15", "S#15"),
            ("S#{shard(id, 1000):03}", "S#007", "S#007"),
            ("S#{shard(id, 256):02}", "S#255", "S#255"),
            ("S#{shard(id, 1)}", "S#0", "S#0"),
            // Not what the shard renders: the value does not fit, hashed whole.
            ("S#{shard(id, 16)}", "S#07", "‹S#07›"),
            ("S#{shard(id, 16):02}", "S#7", "‹S#7›"),
            ("S#{shard(id, 16):02}", "S#16", "‹S#16›"),
            ("S#{shard(id, 256):02}", "S#055", "‹S#055›"),
            ("S#{shard(id, 16):02}", "S#+7", "‹S#+7›"),
            ("S#{shard(id, 16):02}", "S#0x", "‹S#0x›"),
            // Every hash function renders the shard in decimal.
            ("S#{shard(id, 20, java31)}", "S#13", "S#13"),
            ("S#{shard(id, 64, murmur3_32):02}", "S#42", "S#42"),
            ("S#{shard(id, 8, fnv1a32)}", "S#0", "S#0"),
            // A capture may hold `#`, even plan text, when only one split fits.
            (
                "T#{t}#S#{shard(id, 16):02}",
                "T#a#S#01#S#02",
                "T#‹a#S#01›#S#02",
            ),
            ("T#{t}#D#{d}", "T#a#D#b#D#c", "‹T#a#D#b#D#c›"),
            // Two splits: the digits shown could be data, so all is hashed.
            ("A#{t}#{shard(id, 100)}#{d}", "A#x#12#34#y", "‹A#x#12#34#y›"),
            ("{t}{shard(id, 100)}", "x12", "‹x12›"),
            // Touching parts are fine when only one reading works.
            ("{t}{shard(id, 16):02}", "acme07", "‹acme›07"),
            ("{t}{shard(id, 16):02}", "ab1207", "‹ab12›07"),
            // `@attributes`, buckets and quoted templates are data.
            ("{@status}#{shard(id, 4)}", "OPEN#3", "‹OPEN›#3"),
            ("{@status}#{shard(id, 4)}", "#3", "‹›#3"),
            (
                "D#{bucket(@ts, day)}#S#{shard(id, 4)}",
                "D#2026-07-07#S#3",
                "D#‹2026-07-07›#S#3",
            ),
            (
                "{\"{@PK}#{@SK}\"}#{shard(\"{@PK}\", 4)}",
                "A#B#3",
                "‹A#B›#3",
            ),
            ("{@n:05}", "00042", "‹00042›"),
            // Literal braces are plan text.
            ("{{{t}}}#{shard(id, 4)}", "{a}#2", "{‹a›}#2"),
            // No fit: hashed whole. A capture is never empty.
            ("T#{t}#S#{shard(id, 16):02}", "other", "‹other›"),
            ("T#{t}", "T#", "‹T#›"),
            ("T#{t}", "X#a", "‹X#a›"),
            // Only plan text: shown.
            ("PROFILE", "PROFILE", "PROFILE"),
        ];
        for (template, value, expected) in cases {
            assert_eq!(
                by_template(template, value),
                tokens_in(expected),
                "{template} on {value}: expected {expected}"
            );
        }
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
    fn a_long_value_of_many_separators_splits_in_linear_passes() {
        // Backtracking would try every placement of the three captures.
        let value = format!("A#{}#9", "x#".repeat(1500));
        let out = by_template("A#{a}#{b}#{c}#{shard(id, 10)}", &value);
        assert_eq!(out, token(&value), "many splits: hashed whole");
        let value = format!("A#{}#B#9", "x".repeat(2000));
        let out = by_template("A#{a}#B#{shard(id, 10)}", &value);
        assert_eq!(out, format!("A#{}#B#9", token(&"x".repeat(2000))));
    }

    /// A template of literals, captures, attributes and shards, its rendering,
    /// and what redaction should show if it can tell the parts apart.
    fn rendered_case(
        lits: &[String],
        kinds: &[(u8, String, u32, usize)],
    ) -> (String, String, String, Vec<String>) {
        let mut template = String::new();
        let mut expected = String::new();
        let mut captures = vec![("key".to_string(), "k".to_string())];
        let mut item = Item::new();
        let mut data = Vec::new();
        for (i, (lit, (kind, v, n, width))) in lits.iter().zip(kinds).enumerate() {
            template.push_str(lit);
            expected.push_str(lit);
            match kind % 3 {
                0 => {
                    template.push_str(&format!("{{c{i}}}"));
                    captures.push((format!("c{i}"), v.clone()));
                    expected.push_str(&token(v));
                    data.push(v.clone());
                }
                1 => {
                    template.push_str(&format!("{{@a{i}}}"));
                    item.insert(format!("a{i}"), Value::S(v.clone()));
                    expected.push_str(&token(v));
                    data.push(v.clone());
                }
                _ => {
                    let pad = if *width > 0 {
                        format!(":0{width}")
                    } else {
                        String::new()
                    };
                    template.push_str(&format!("{{shard(key, {n}){pad}}}"));
                    let k = crate::core::hash::shard(crate::core::hash::HashFn::Fnv1a32, "k", *n);
                    expected.push_str(&format!("{k:0width$}"));
                }
            }
        }
        let scope = crate::core::template::Scope {
            captures: &captures,
            item: &item,
            default_hash: crate::core::hash::HashFn::Fnv1a32,
        };
        let value = Template::parse(&template).unwrap().render(&scope).unwrap();
        (template, value, expected, data)
    }

    proptest::proptest! {
        /// Whatever the captures hold (`#`, digits, plan text), redaction shows
        /// either the true split or nothing: never a captured value.
        #[test]
        fn no_captured_value_is_ever_shown(
            lits in proptest::collection::vec("[A-C#]{0,3}", 1..6),
            kinds in proptest::collection::vec(
                (0u8..3, "[g-i0-9#A-C]{1,6}", 1u32..300, 0usize..4),
                1..6,
            ),
        ) {
            let (template, value, expected, data) = rendered_case(&lits, &kinds);
            let out = by_template(&template, &value);
            proptest::prop_assert!(
                out == expected || out == token(&value),
                "{} on {}: {} (want {} or the whole hashed)", template, value, out, expected
            );
            // Lowercase g-i cannot come from plan text, digits or a hex token.
            for v in data.iter().filter(|v| v.contains(|c: char| ('g'..='i').contains(&c))) {
                proptest::prop_assert!(!out.contains(v.as_str()), "{} shows {}: {}", template, v, out);
            }
        }
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
