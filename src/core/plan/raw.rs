//! The raw layer: exactly what serde reads from the TOML, spans and all.
//!
//! Nothing here is checked beyond TOML's own syntax and the field names
//! (`deny_unknown_fields`, so a misspelt setting is an error, not silently
//! ignored). Every value keeps its [`Spanned`] position so that the checks in
//! `validate` and `rule` can point at the exact `file:line:col` of what is
//! wrong; once they pass, none of these types is needed again.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    pub(super) version: Option<Spanned<i64>>,
    pub(super) source: RawTable,
    pub(super) target: RawTarget,
    #[serde(default)]
    pub(super) options: RawOptions,
    #[serde(default, rename = "rule")]
    pub(super) rules: Vec<Spanned<RawRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTable {
    pub(super) table: Spanned<String>,
    pub(super) partition_key: Spanned<String>,
    pub(super) sort_key: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) table: Spanned<String>,
    pub(super) partition_key: Spanned<String>,
    pub(super) sort_key: Option<Spanned<String>>,
    #[serde(default, rename = "index")]
    pub(super) indexes: Vec<RawIndex>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIndex {
    pub(super) name: Spanned<String>,
    pub(super) partition_key: Spanned<String>,
    pub(super) sort_key: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOptions {
    pub(super) unmatched: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) drop: Vec<Spanned<String>>,
    pub(super) source_key_prefix: Option<Spanned<String>>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) ttl_deletes: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: Option<Spanned<String>>,
    #[serde(default, rename = "match")]
    pub(super) matches: BTreeMap<String, Spanned<String>>,
    pub(super) key: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    #[serde(default)]
    pub(super) set: BTreeMap<String, Spanned<RawSet>>,
    #[serde(default)]
    pub(super) remove: Vec<Spanned<String>>,
}

/// `GSI1PK = "…"` or `count = { template = "…", type = "N" }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawSet {
    Plain(String),
    Typed {
        template: String,
        #[serde(rename = "type")]
        ty: String,
    },
}
