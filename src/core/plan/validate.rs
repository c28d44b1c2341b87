//! The plan-wide checks: version, tables and key schemas, indexes,
//! `[options]`, and how the options fit the mode and the keys. Each rule is
//! then checked by `rule`, against the [`Scope`] built here.
//!
//! The order of the checks is the order errors are reported in when two
//! share a position (they are sorted by position, stably), so it is kept as
//! it is; a check that needs valid key schemas runs only once both parsed.

use std::collections::BTreeMap;

use toml::Spanned;

use crate::core::hash::HashFn;
use crate::core::value::ScalarType;

use super::error::Cx;
use super::raw::{RawIndex, RawOptions, RawPlan};
use super::{IndexSpec, KeyAttr, KeySchema, Mode, Plan, TtlDeletes, Unmatched};

/// What the plan-wide settings mean for each rule.
pub(super) struct Scope<'a> {
    pub(super) mode: Mode,
    pub(super) source_key: &'a KeySchema,
    pub(super) target_key: &'a KeySchema,
    /// Index key attribute → its type and the index's name.
    pub(super) index_types: BTreeMap<&'a str, (ScalarType, &'a str)>,
}

/// `[options]`, read (unknown values reported, and replaced by the default).
struct Options {
    unmatched: Unmatched,
    hash: HashFn,
    ttl_deletes: TtlDeletes,
    drop: Vec<String>,
    source_key_prefix: Option<String>,
}

impl Cx<'_> {
    pub(super) fn validate(&mut self, raw: RawPlan) -> Option<Plan> {
        self.version(&raw.version);
        let source_table = self.nonempty(&raw.source.table, "source table");
        let target_table = self.nonempty(&raw.target.table, "target table");
        let source_key = self.key_schema(&raw.source.partition_key, &raw.source.sort_key);
        let target_key = self.key_schema(&raw.target.partition_key, &raw.target.sort_key);
        let mode = if source_table == target_table {
            Mode::InPlace
        } else {
            Mode::Rekey
        };
        let indexes = self.indexes(&raw.target.indexes);
        let options = self.options(&raw.options);

        let (Some(source_key), Some(target_key)) = (source_key, target_key) else {
            return None;
        };
        let scope = Scope {
            mode,
            source_key: &source_key,
            target_key: &target_key,
            index_types: index_types(&indexes),
        };
        if mode == Mode::InPlace {
            self.in_place_options(&raw, options.unmatched, &scope);
        }
        self.options_fit_the_keys(&raw.options, options.unmatched, &scope);
        if raw.rules.is_empty() {
            self.error(raw.target.table.span().start, "the plan has no [[rule]]");
        }
        let rules = self.rules(&raw.rules, &scope);

        Some(Plan {
            path: self.path.to_path_buf(),
            source_table,
            source_key,
            target_table,
            target_key,
            indexes,
            rules,
            unmatched: options.unmatched,
            drop: options.drop,
            source_key_prefix: options.source_key_prefix,
            hash: options.hash,
            ttl_deletes: options.ttl_deletes,
            mode,
            fingerprint: String::new(),
        })
    }

    fn version(&mut self, version: &Option<Spanned<i64>>) {
        if let Some(v) = version
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
    }

    fn nonempty(&mut self, s: &Spanned<String>, what: &str) -> String {
        if s.get_ref().trim().is_empty() {
            self.error(s.span().start, format!("{what} must not be empty"));
        }
        s.get_ref().clone()
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

    /// The target's indexes whose key schema is valid.
    fn indexes(&mut self, raw: &[RawIndex]) -> Vec<IndexSpec> {
        let mut indexes = Vec::new();
        for ix in raw {
            let name = self.nonempty(&ix.name, "index name");
            if let Some(key) = self.key_schema(&ix.partition_key, &ix.sort_key) {
                indexes.push(IndexSpec { name, key });
            }
        }
        indexes
    }

    fn options(&mut self, o: &RawOptions) -> Options {
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
        Options {
            unmatched,
            hash,
            ttl_deletes,
            drop,
            source_key_prefix,
        }
    }

    /// In place the key cannot change, so the settings about keys have no
    /// meaning there: refused rather than silently ignored.
    fn in_place_options(&mut self, raw: &RawPlan, unmatched: Unmatched, scope: &Scope) {
        let o = &raw.options;
        if scope.source_key != scope.target_key {
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

    /// `drop` may not remove a target key attribute, and `copy` writes items
    /// unchanged, so it needs the target's key to be the source's.
    fn options_fit_the_keys(&mut self, o: &RawOptions, unmatched: Unmatched, scope: &Scope) {
        for d in &o.drop {
            if scope.target_key.names().contains(&d.get_ref().as_str()) {
                self.error(
                    d.span().start,
                    format!(
                        "`{}` is a target key attribute and cannot be dropped",
                        d.get_ref()
                    ),
                );
            }
        }
        if unmatched == Unmatched::Copy && scope.source_key != scope.target_key {
            let at = o.unmatched.as_ref().map_or(0, |s| s.span().start);
            let (source_key, target_key) = (scope.source_key, scope.target_key);
            self.error(
                at,
                format!("`unmatched = \"copy\"` copies items unchanged, which needs the same key schema on both tables (source: {source_key}; target: {target_key})"),
            );
        }
    }
}

/// Index key attribute → its type and the index's name, for the rules that
/// set it.
fn index_types(indexes: &[IndexSpec]) -> BTreeMap<&str, (ScalarType, &str)> {
    indexes
        .iter()
        .flat_map(|ix| {
            ix.key
                .attrs()
                .map(move |a| (a.name.as_str(), (a.ty, ix.name.as_str())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_plans::{GOOD, errors};

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
}
