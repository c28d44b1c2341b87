//! Plan files: the TOML an operator writes, turned into a validated [`Plan`].
//!
//! Two layers, as ripgrep turns raw arguments into its high-level config:
//! [`RawPlan`] is exactly what serde reads, spans and all; [`Plan`] is what the
//! rest of rekey uses, and it only exists once every structural check passed.
//! "A plan that loads cannot fail for structural reasons at run time": what is
//! left to fail is data (a missing attribute, a malformed date), and that is a
//! per-item reject, never an abort.
//!
//! Every error carries `file:line:col`, and loading reports all the errors it
//! finds, not only the first.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::core::hash::HashFn;
use crate::core::template::{Shape, SyntaxError, Template};
use crate::core::value::ScalarType;

// ---- errors ---------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    pub path: PathBuf,
    /// 1-based line and column (in characters); None when the file could not be read.
    pub position: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => {
                write!(f, "{}:{line}:{col}: {}", self.path.display(), self.message)
            }
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

/// All the problems found in one plan file. Callers branch on this type to
/// choose exit code 2 (bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PlanErrors(pub Vec<PlanError>);

impl fmt::Display for PlanErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

// ---- the raw layer ---------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    version: Option<Spanned<i64>>,
    source: RawTable,
    target: RawTarget,
    #[serde(default)]
    options: RawOptions,
    #[serde(default, rename = "rule")]
    rules: Vec<Spanned<RawRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    table: Spanned<String>,
    partition_key: Spanned<String>,
    sort_key: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    table: Spanned<String>,
    partition_key: Spanned<String>,
    sort_key: Option<Spanned<String>>,
    #[serde(default, rename = "index")]
    indexes: Vec<RawIndex>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIndex {
    name: Spanned<String>,
    partition_key: Spanned<String>,
    sort_key: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOptions {
    unmatched: Option<Spanned<String>>,
    #[serde(default)]
    drop: Vec<Spanned<String>>,
    source_key_prefix: Option<Spanned<String>>,
    hash: Option<Spanned<String>>,
    ttl_deletes: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<Spanned<String>>,
    #[serde(default, rename = "match")]
    matches: BTreeMap<String, Spanned<String>>,
    key: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    #[serde(default)]
    set: BTreeMap<String, Spanned<RawSet>>,
    #[serde(default)]
    remove: Vec<Spanned<String>>,
}

/// `GSI1PK = "…"` or `count = { template = "…", type = "N" }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSet {
    Plain(String),
    Typed {
        template: String,
        #[serde(rename = "type")]
        ty: String,
    },
}

// ---- the validated layer ----------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyAttr {
    pub name: String,
    pub ty: ScalarType,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySchema {
    pub partition_key: KeyAttr,
    pub sort_key: Option<KeyAttr>,
}

impl KeySchema {
    pub fn names(&self) -> Vec<&str> {
        let mut v = vec![self.partition_key.name.as_str()];
        if let Some(sk) = &self.sort_key {
            v.push(sk.name.as_str());
        }
        v
    }
    pub fn attrs(&self) -> impl Iterator<Item = &KeyAttr> {
        std::iter::once(&self.partition_key).chain(self.sort_key.as_ref())
    }
}

impl fmt::Display for KeySchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.partition_key.name, self.partition_key.ty)?;
        if let Some(sk) = &self.sort_key {
            write!(f, ", {} ({})", sk.name, sk.ty)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct IndexSpec {
    pub name: String,
    pub key: KeySchema,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmatched {
    Reject,
    Copy,
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlDeletes {
    Replicate,
    Ignore,
}

/// Re-key into another table, or set attributes on the table itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Rekey,
    InPlace,
}

#[derive(Debug, Clone)]
pub struct SetAttr {
    pub name: String,
    pub ty: ScalarType,
    pub template: Template,
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    /// Attribute → shape; all must match. Empty matches every item.
    pub matchers: Vec<(String, Shape)>,
    /// Target key attributes and their templates; empty keeps the source key
    /// (only allowed where source and target key schemas are the same).
    pub key: Vec<(KeyAttr, Template)>,
    pub set: Vec<SetAttr>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub path: PathBuf,
    pub source_table: String,
    pub source_key: KeySchema,
    pub target_table: String,
    pub target_key: KeySchema,
    pub indexes: Vec<IndexSpec>,
    pub rules: Vec<Rule>,
    pub unmatched: Unmatched,
    pub drop: Vec<String>,
    pub source_key_prefix: Option<String>,
    pub hash: HashFn,
    pub ttl_deletes: TtlDeletes,
    pub mode: Mode,
    /// Stable over comments and formatting; changes with any setting. Stored
    /// with checkpoints so that a resume under a different plan is refused.
    pub fingerprint: String,
}

// ---- loading ------------------------------------------------------------------

impl Plan {
    pub fn load(path: &Path) -> Result<Plan, PlanErrors> {
        let src = std::fs::read_to_string(path).map_err(|e| {
            PlanErrors(vec![PlanError {
                path: path.to_path_buf(),
                position: None,
                message: format!("cannot read: {e}"),
            }])
        })?;
        Plan::parse(&src, path)
    }

    /// Pure: text in, plan or errors out.
    pub fn parse(src: &str, path: &Path) -> Result<Plan, PlanErrors> {
        let mut cx = Cx {
            src,
            path,
            errors: Vec::new(),
        };
        let raw: RawPlan = match toml::from_str(src) {
            Ok(r) => r,
            Err(e) => {
                let at = e.span().map_or(0, |s| s.start);
                cx.error(at, e.message().trim_end().to_string());
                return Err(PlanErrors(cx.errors));
            }
        };
        let plan = cx.validate(raw);
        if cx.errors.is_empty()
            && let Some(mut plan) = plan
        {
            plan.fingerprint = fingerprint(src);
            return Ok(plan);
        }
        cx.errors.sort_by_key(|e| e.position);
        Err(PlanErrors(cx.errors))
    }

    /// The rule named `name`, for reports.
    pub fn rule_index(&self, name: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.name == name)
    }

    /// Every attribute name the plan writes outside the target key: the
    /// attributes the in-place mode owns.
    pub fn set_attribute_names(&self) -> BTreeSet<&str> {
        self.rules
            .iter()
            .flat_map(|r| r.set.iter().map(|s| s.name.as_str()))
            .collect()
    }
}

impl Rule {
    /// Every item attribute the rule reads: the attributes its shapes match
    /// (which bind the captures) and the `{@attr}` references of its `set`
    /// templates. In place, a computed attribute is right only while these
    /// hold the values it was computed from.
    pub fn reads(&self) -> BTreeSet<&str> {
        self.matchers
            .iter()
            .map(|(a, _)| a.as_str())
            .chain(
                self.set
                    .iter()
                    .flat_map(|s| s.template.attributes().into_iter().map(|(a, _)| a)),
            )
            .collect()
    }
}

impl Plan {
    /// The attributes whose values decide what rule `index` computes for an
    /// item: what the rule reads, and the attributes the shapes of every
    /// earlier rule match (a change there could make an earlier rule apply).
    pub fn inputs(&self, index: usize) -> BTreeSet<&str> {
        let mut out: BTreeSet<&str> = self.rules[..index]
            .iter()
            .flat_map(|r| r.matchers.iter().map(|(a, _)| a.as_str()))
            .collect();
        if let Some(r) = self.rules.get(index) {
            out.extend(r.reads());
        }
        out
    }
}

/// FNV-1a 64 of the plan re-serialised from its parsed form, so comments and
/// whitespace don't change it.
fn fingerprint(src: &str) -> String {
    let canonical = toml::from_str::<toml::Value>(src)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| src.to_string());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

struct Cx<'a> {
    src: &'a str,
    path: &'a Path,
    errors: Vec<PlanError>,
}

impl Cx<'_> {
    fn error(&mut self, offset: usize, message: impl Into<String>) {
        let position = Some(line_col(self.src, offset));
        self.errors.push(PlanError {
            path: self.path.to_path_buf(),
            position,
            message: message.into(),
        });
    }

    /// Offset in the file of byte `inner` of a string value whose span is `span`.
    /// Exact for plain one-line strings; otherwise the string's start.
    fn inner_offset(&self, span: Range<usize>, text: &str, inner: usize) -> usize {
        let raw = self.src.get(span.clone()).unwrap_or("");
        let body = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
        if body == text && raw.len() >= 2 && !raw.starts_with("\"\"\"") && !raw.starts_with("'''") {
            span.start + 1 + inner
        } else {
            span.start
        }
    }

    fn syntax(&mut self, span: Range<usize>, text: &str, e: SyntaxError) {
        let at = self.inner_offset(span, text, e.offset);
        self.error(at, e.message);
    }

    /// `"PK"`, `"PK:S"`, `"ts:N"`.
    fn key_attr(&mut self, s: &Spanned<String>) -> Option<KeyAttr> {
        let text = s.get_ref();
        let (name, ty) = match text.rsplit_once(':') {
            Some((n, t)) => (n, t),
            None => (text.as_str(), "S"),
        };
        if name.is_empty() {
            self.error(s.span().start, "empty attribute name");
            return None;
        }
        match ScalarType::from_name(ty) {
            Some(ty) => Some(KeyAttr {
                name: name.to_string(),
                ty,
            }),
            None => {
                self.error(
                    s.span().start,
                    format!("unknown key type `{ty}` in `{text}`: key attributes are S, N or B"),
                );
                None
            }
        }
    }

    fn key_schema(
        &mut self,
        pk: &Spanned<String>,
        sk: &Option<Spanned<String>>,
    ) -> Option<KeySchema> {
        let partition_key = self.key_attr(pk);
        let sort_key = sk.as_ref().map(|s| self.key_attr(s));
        match (partition_key, sort_key) {
            (Some(partition_key), None) => Some(KeySchema {
                partition_key,
                sort_key: None,
            }),
            (Some(partition_key), Some(Some(sk))) => {
                if sk.name == partition_key.name {
                    self.error(
                        pk.span().start,
                        "partition key and sort key are the same attribute",
                    );
                    return None;
                }
                Some(KeySchema {
                    partition_key,
                    sort_key: Some(sk),
                })
            }
            _ => None,
        }
    }

    fn nonempty(&mut self, s: &Spanned<String>, what: &str) -> String {
        if s.get_ref().trim().is_empty() {
            self.error(s.span().start, format!("{what} must not be empty"));
        }
        s.get_ref().clone()
    }

    fn validate(&mut self, raw: RawPlan) -> Option<Plan> {
        if let Some(v) = &raw.version
            && *v.get_ref() != 1
        {
            self.error(
                v.span().start,
                format!(
                    "unsupported plan version {} (this rekey reads version 1)",
                    v.get_ref()
                ),
            );
        }
        let source_table = self.nonempty(&raw.source.table, "source table");
        let target_table = self.nonempty(&raw.target.table, "target table");
        let source_key = self.key_schema(&raw.source.partition_key, &raw.source.sort_key);
        let target_key = self.key_schema(&raw.target.partition_key, &raw.target.sort_key);
        let mode = if source_table == target_table {
            Mode::InPlace
        } else {
            Mode::Rekey
        };

        let mut indexes = Vec::new();
        for ix in &raw.target.indexes {
            let name = self.nonempty(&ix.name, "index name");
            if let Some(key) = self.key_schema(&ix.partition_key, &ix.sort_key) {
                indexes.push(IndexSpec { name, key });
            }
        }

        let o = &raw.options;
        let unmatched = match o
            .unmatched
            .as_ref()
            .map(|s| (s.get_ref().as_str(), s.span()))
        {
            None | Some(("reject", _)) => Unmatched::Reject,
            Some(("copy", _)) => Unmatched::Copy,
            Some(("skip", _)) => Unmatched::Skip,
            Some((other, span)) => {
                self.error(
                    span.start,
                    format!("unknown unmatched policy `{other}` (reject, copy or skip)"),
                );
                Unmatched::Reject
            }
        };
        let hash = match &o.hash {
            None => HashFn::default(),
            Some(h) => HashFn::from_name(h.get_ref()).unwrap_or_else(|| {
                self.error(
                    h.span().start,
                    format!(
                        "unknown hash `{}` (known: fnv1a32, murmur3_32, java31)",
                        h.get_ref()
                    ),
                );
                HashFn::default()
            }),
        };
        let ttl_deletes = match o
            .ttl_deletes
            .as_ref()
            .map(|s| (s.get_ref().as_str(), s.span()))
        {
            None | Some(("replicate", _)) => TtlDeletes::Replicate,
            Some(("ignore", _)) => TtlDeletes::Ignore,
            Some((other, span)) => {
                self.error(
                    span.start,
                    format!("unknown ttl_deletes policy `{other}` (replicate or ignore)"),
                );
                TtlDeletes::Replicate
            }
        };
        let drop: Vec<String> = o.drop.iter().map(|d| d.get_ref().clone()).collect();
        let source_key_prefix = o
            .source_key_prefix
            .as_ref()
            .map(|p| self.nonempty(p, "source_key_prefix"));

        let (Some(source_key), Some(target_key)) = (source_key, target_key) else {
            return None;
        };

        if mode == Mode::InPlace {
            if source_key != target_key {
                self.error(
                    raw.target.partition_key.span().start,
                    "source and target are the same table, so their key schemas must be the same",
                );
            }
            if unmatched == Unmatched::Copy {
                let at = o.unmatched.as_ref().map_or(0, |s| s.span().start);
                self.error(at, "`unmatched = \"copy\"` has no meaning in place: unmatched items stay as they are (use skip or reject)");
            }
            if let Some(p) = &o.source_key_prefix {
                self.error(
                    p.span().start,
                    "source_key_prefix has no meaning in place: the key does not change",
                );
            }
            for d in &o.drop {
                self.error(d.span().start, "in place, rekey only sets or removes the attributes its rules compute: `drop` is for re-keying into a new table");
            }
        }
        for d in &o.drop {
            if target_key.names().contains(&d.get_ref().as_str()) {
                self.error(
                    d.span().start,
                    format!(
                        "`{}` is a target key attribute and cannot be dropped",
                        d.get_ref()
                    ),
                );
            }
        }
        if unmatched == Unmatched::Copy && source_key != target_key {
            let at = o.unmatched.as_ref().map_or(0, |s| s.span().start);
            self.error(
                at,
                format!("`unmatched = \"copy\"` copies items unchanged, which needs the same key schema on both tables (source: {source_key}; target: {target_key})"),
            );
        }
        if raw.rules.is_empty() {
            self.error(raw.target.table.span().start, "the plan has no [[rule]]");
        }

        let index_types: BTreeMap<&str, (ScalarType, &str)> = indexes
            .iter()
            .flat_map(|ix| {
                ix.key
                    .attrs()
                    .map(move |a| (a.name.as_str(), (a.ty, ix.name.as_str())))
            })
            .collect();

        let mut rules = Vec::new();
        let mut seen_names = BTreeSet::new();
        for (i, r) in raw.rules.iter().enumerate() {
            let span = r.span();
            let r = r.get_ref();
            let name = r
                .name
                .as_ref()
                .map_or_else(|| format!("rule {}", i + 1), |n| n.get_ref().clone());
            if !seen_names.insert(name.clone()) {
                self.error(
                    r.name.as_ref().map_or(span.start, |n| n.span().start),
                    format!("two rules are named `{name}`"),
                );
            }

            // Shapes and the captures they bind.
            let mut matchers = Vec::new();
            let mut captured: BTreeSet<String> = BTreeSet::new();
            for (attr, shape) in &r.matches {
                match Shape::parse(shape.get_ref()) {
                    Ok(s) => {
                        for (c, off) in &s.captures {
                            if !captured.insert(c.clone()) {
                                let at = self.inner_offset(shape.span(), shape.get_ref(), *off);
                                self.error(
                                    at,
                                    format!(
                                        "capture `{c}` is bound by two shapes in rule `{name}`"
                                    ),
                                );
                            }
                        }
                        matchers.push((attr.clone(), s));
                    }
                    Err(e) => self.syntax(shape.span(), shape.get_ref(), e),
                }
            }

            let check_template =
                |cx: &mut Self, text: &Spanned<String>, body: &str| -> Option<Template> {
                    match Template::parse(body) {
                        Ok(t) => {
                            for (c, off) in t.captures() {
                                if !captured.contains(c) {
                                    let at = cx.inner_offset(text.span(), body, off);
                                    let known = if captured.is_empty() {
                                        "it captures nothing; write {@name} for an item attribute"
                                            .to_string()
                                    } else {
                                        format!(
                                            "it captures {}; write {{@{c}}} for an item attribute",
                                            join(&captured)
                                        )
                                    };
                                    cx.error(
                                        at,
                                        format!("`{c}` is not captured by rule `{name}` ({known})"),
                                    );
                                }
                            }
                            Some(t)
                        }
                        Err(e) => {
                            cx.syntax(text.span(), body, e);
                            None
                        }
                    }
                };

            // Target key templates.
            let mut key = Vec::new();
            match (&r.key, mode) {
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
                                if let Some(tpl) = check_template(self, t, t.get_ref()) {
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
                (None, Mode::Rekey) if source_key != target_key => {
                    self.error(
                        span.start,
                        format!("rule `{name}` has no `key`, so it would keep the source key, but the target key schema differs ({target_key}); add key = {{ … }}"),
                    );
                }
                (None, _) => {}
            }

            // Added attributes.
            let mut set = Vec::new();
            for (attr_name, v) in &r.set {
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
                if target_key.names().contains(&attr_name.as_str()) {
                    self.error(v.span().start, format!("`{attr_name}` is a target key attribute: render it under `key`, not `set`"));
                    continue;
                }
                if let Some((ix_ty, ix)) = index_types.get(attr_name.as_str())
                    && *ix_ty != ty
                {
                    self.error(v.span().start, format!("`{attr_name}` is a key of index `{ix}` of type {ix_ty}, but this rule sets it as {ty}"));
                }
                let spanned = Spanned::new(v.span(), body.clone());
                if let Some(tpl) = check_template(self, &spanned, &body) {
                    self.check_type(&tpl, ty, &spanned, attr_name);
                    set.push(SetAttr {
                        name: attr_name.clone(),
                        ty,
                        template: tpl,
                    });
                }
            }
            let remove: Vec<String> = r.remove.iter().map(|s| s.get_ref().clone()).collect();
            for s in &r.remove {
                if target_key.names().contains(&s.get_ref().as_str()) {
                    self.error(
                        s.span().start,
                        format!(
                            "`{}` is a target key attribute and cannot be removed",
                            s.get_ref()
                        ),
                    );
                }
                if r.set.contains_key(s.get_ref()) {
                    self.error(
                        s.span().start,
                        format!("`{}` is both set and removed by rule `{name}`", s.get_ref()),
                    );
                }
            }
            if mode == Mode::InPlace {
                // A rule that writes what it reads would change its own input
                // with every write: the tail would follow its own writes forever.
                let reads: BTreeSet<&str> = matchers
                    .iter()
                    .map(|(a, _)| a.as_str())
                    .chain(
                        set.iter()
                            .flat_map(|s| s.template.attributes().into_iter().map(|(a, _)| a)),
                    )
                    .collect();
                for s in &set {
                    if reads.contains(s.name.as_str()) {
                        let at = r.set.get(&s.name).map_or(span.start, |v| v.span().start);
                        self.error(at, format!("rule `{name}` sets `{}`, which it also reads: in place, every write would change its own input", s.name));
                    }
                }
                for s in &r.remove {
                    if reads.contains(s.get_ref().as_str()) {
                        self.error(s.span().start, format!("rule `{name}` removes `{}`, which it also reads: in place, the rule could never apply again", s.get_ref()));
                    }
                }
            }
            if mode == Mode::InPlace && set.is_empty() && remove.is_empty() && r.set.is_empty() {
                self.error(
                    span.start,
                    format!(
                        "rule `{name}` sets nothing: in place, a rule must set or remove attributes"
                    ),
                );
            }
            rules.push(Rule {
                name,
                matchers,
                key,
                set,
                remove,
            });
        }

        Some(Plan {
            path: self.path.to_path_buf(),
            source_table,
            source_key,
            target_table,
            target_key,
            indexes,
            rules,
            unmatched,
            drop,
            source_key_prefix,
            hash,
            ttl_deletes,
            mode,
            fingerprint: String::new(),
        })
    }

    /// A number attribute can only come from one expression: literal text around
    /// it would never be a number. Zero padding is fine (`007` is a number).
    fn check_type(&mut self, t: &Template, ty: ScalarType, at: &Spanned<String>, attr: &str) {
        if ty == ScalarType::N && !t.is_single_expr() {
            let lit = t.literal_text();
            if lit.chars().any(|c| !c.is_ascii_digit())
                || !t
                    .parts
                    .iter()
                    .any(|p| matches!(p, crate::core::template::Part::Expr { .. }))
            {
                self.error(at.span().start, format!("`{attr}` is a number (N) but its template adds text `{lit}` that is not a number"));
            }
        }
        // Shard padding narrower than the shard count's digits would give keys of
        // different widths, which sort wrongly and read ambiguously.
        for p in &t.parts {
            if let crate::core::template::Part::Expr {
                expr: crate::core::template::Expr::Shard { n, .. },
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

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = &src[..src.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
version = 1
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
unmatched = "reject"
drop = ["legacy"]
source_key_prefix = "old_"

[[rule]]
name = "order"
match = { PK = "TENANT#{tenant}#DAY#{day}", SK = "ORDER#{order_id}" }
key = { PK = "TENANT#{tenant}#DAY#{day}#SHARD#{shard(order_id,16):02}", SK = "ORDER#{order_id}" }
set = { GSI1PK = "TENANT#{tenant}#STATUS#{@status}", n = { template = "{shard(order_id, 4)}", type = "N" } }
"#;

    fn parse(src: &str) -> Result<Plan, PlanErrors> {
        Plan::parse(src, Path::new("p.toml"))
    }

    fn errors(src: &str) -> Vec<String> {
        parse(src)
            .unwrap_err()
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn a_good_plan_loads() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.mode, Mode::Rekey);
        assert_eq!(p.rules.len(), 1);
        assert_eq!(p.rules[0].key.len(), 2);
        assert_eq!(p.rules[0].set.len(), 2);
        assert_eq!(p.indexes[0].key.partition_key.name, "GSI1PK");
        assert_eq!(p.source_key_prefix.as_deref(), Some("old_"));
        assert_eq!(p.fingerprint.len(), 16);
    }

    #[test]
    fn fingerprint_ignores_comments_but_not_settings() {
        let a = parse(GOOD).unwrap().fingerprint;
        let b = parse(&format!("# a comment\n{GOOD}")).unwrap().fingerprint;
        let c = parse(&GOOD.replace("16):02", "32):02"))
            .unwrap()
            .fingerprint;
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

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
    fn unknown_hash_and_key_types() {
        let errs = errors(
            &GOOD
                .replace("unmatched = \"reject\"", "hash = \"md5\"")
                .replace(
                    "sort_key = \"SK\"\n\n[target]",
                    "sort_key = \"SK:X\"\n\n[target]",
                ),
        );
        assert!(
            errs.iter().any(|e| e.contains("unknown hash `md5`")),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|e| e.contains("unknown key type `X`")),
            "{errs:?}"
        );
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
    fn toml_syntax_errors_have_positions() {
        let errs = errors("[source]\ntable = \n");
        assert!(errs[0].starts_with("p.toml:2:"), "{errs:?}");
        let errs = errors(&GOOD.replace("[options]", "[options]\nbogus = 1"));
        assert!(errs[0].contains("bogus"), "{errs:?}");
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

    const IN_PLACE: &str = r#"
[source]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[target]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[[rule]]
name = "note"
match = { PK = "NOTE#{id}", kind = "N#{k}" }
set = { X = "{k}" }
[[rule]]
name = "task"
match = { PK = "TENANT#{tenant}", SK = "TASK#{task_id}" }
set = { GSI2PK = "TENANT#{tenant}#STATUS#{@status}#{shard(\"{@owner}\", 4)}", GSI2SK = "{bucket(@created_at, week)}#{task_id}" }
"#;

    #[test]
    fn a_rule_reads_its_shapes_and_its_template_attributes() {
        let p = parse(IN_PLACE).unwrap();
        assert_eq!(p.mode, Mode::InPlace);
        let task = &p.rules[1];
        assert_eq!(
            task.reads().into_iter().collect::<Vec<_>>(),
            vec!["PK", "SK", "created_at", "owner", "status"]
        );
        // Inputs add what earlier rules match: `kind` could make rule `note` apply.
        assert_eq!(
            p.inputs(1).into_iter().collect::<Vec<_>>(),
            vec!["PK", "SK", "created_at", "kind", "owner", "status"]
        );
        assert_eq!(
            p.inputs(0).into_iter().collect::<Vec<_>>(),
            vec!["PK", "kind"]
        );
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

    #[test]
    fn copy_needs_matching_key_schemas() {
        let src = GOOD
            .replace("unmatched = \"reject\"", "unmatched = \"copy\"")
            .replace(
                "sort_key = \"SK\"\n[[target",
                "sort_key = \"SK2\"\n[[target",
            );
        let errs = errors(&src);
        assert!(
            errs.iter().any(|e| e.contains("copies items unchanged")),
            "{errs:?}"
        );
    }

    proptest::proptest! {
        /// No input makes loading panic: arbitrary text, and a good plan with a
        /// random slice cut out or a random character put in.
        #[test]
        fn loading_never_panics(text in ".{0,200}", cut in 0usize..2000, len in 0usize..40, ch in proptest::char::any()) {
            let _ = parse(&text);
            let at = GOOD.floor_char_boundary(cut.min(GOOD.len()));
            let end = GOOD.floor_char_boundary((at + len).min(GOOD.len()));
            let _ = parse(&format!("{}{}", &GOOD[..at], &GOOD[end..]));
            let _ = parse(&format!("{}{ch}{}", &GOOD[..at], &GOOD[at..]));
        }
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncdé f", 0), (1, 1));
        assert_eq!(line_col("ab\ncdé f", 3), (2, 1));
        assert_eq!(line_col("ab\ncdé f", 7), (2, 4)); // after the two-byte é
    }
}
