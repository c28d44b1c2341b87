//! Plan files: the TOML an operator writes, turned into a validated [`Plan`].
//!
//! Two layers, as ripgrep turns raw arguments into its high-level config:
//! `raw` is exactly what serde reads, spans and all; [`Plan`] is what the
//! rest of rekey uses, and it only exists once every structural check passed
//! (`validate` for the plan as a whole, `rule` for each rule).
//! "A plan that loads cannot fail for structural reasons at run time": what is
//! left to fail is data (a missing attribute, a malformed date), and that is a
//! per-item reject, never an abort.
//!
//! Every error carries `file:line:col`, and loading reports all the errors it
//! finds, not only the first (`error`).

mod error;
mod raw;
mod rule;
mod validate;

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::core::hash::HashFn;
use crate::core::template::{Shape, Template};
use crate::core::value::ScalarType;

pub use error::{PlanError, PlanErrors};

use error::Cx;
use raw::RawPlan;

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
    pub(crate) fn inputs(&self, index: usize) -> BTreeSet<&str> {
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

/// The plans the unit tests of every part of plan loading start from.
#[cfg(test)]
mod test_plans {
    use std::path::Path;

    use super::{Plan, PlanErrors};

    pub(super) const GOOD: &str = r#"
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

    pub(super) const IN_PLACE: &str = r#"
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

    pub(super) fn parse(src: &str) -> Result<Plan, PlanErrors> {
        Plan::parse(src, Path::new("p.toml"))
    }

    pub(super) fn errors(src: &str) -> Vec<String> {
        parse(src)
            .unwrap_err()
            .0
            .iter()
            .map(|e| e.to_string())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_plans::{GOOD, IN_PLACE, errors, parse};
    use super::*;

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
    fn toml_syntax_errors_have_positions() {
        let errs = errors("[source]\ntable = \n");
        assert!(errs[0].starts_with("p.toml:2:"), "{errs:?}");
        let errs = errors(&GOOD.replace("[options]", "[options]\nbogus = 1"));
        assert!(errs[0].contains("bogus"), "{errs:?}");
    }

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
}
