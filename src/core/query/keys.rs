//! A logical key → the partition keys it was spread over.
//!
//! The plan's rule says how a new partition key is made:
//! `TENANT#{tenant}#DAY#{day}#SHARD#{shard(order_id, 16):02}`. A reader who
//! knows the tenant and the day but not the order ids must read every value
//! `shard()` can take (16 keys), and for `bucket()` every label of the time
//! range asked for. The values the reader does know come from `--where`
//! (`tenant=acme,day=2026-07-07`) and must be exactly the captures and
//! attributes the template reads outside `shard()` and `bucket()`: a
//! missing one cannot be guessed, an extra one would be silently ignored.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::bucket::{TimeInput, buckets_between};
use crate::core::plan::{KeyAttr, Plan, Rule};
use crate::core::template::{Expr, Part, Template, push_padded};
use crate::core::value::is_valid_number;

/// Why a logical key cannot be read; every case is bad input (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyError {
    #[error(
        "the target table has no sort key: each partition key holds one item, read it with GetItem"
    )]
    NoSortKey,
    #[error("the plan has no rule named `{0}`")]
    UnknownRule(String),
    #[error("rule `{0}` keeps the source key: there is nothing to fan out")]
    KeepsKey(String),
    #[error(
        "no rule's partition key is made of exactly {given}; give --rule, or --where with: {options}"
    )]
    NoRule { given: String, options: String },
    #[error("several rules' partition keys are made of {given} ({rules}): choose one with --rule")]
    Ambiguous { given: String, rules: String },
    #[error("rule `{rule}`: its partition key needs {names} in --where")]
    Missing { rule: String, names: String },
    #[error("rule `{rule}`: its partition key does not use {names}")]
    Unused { rule: String, names: String },
    #[error("rule `{0}`: its partition key has a time bucket; give --from and --to")]
    NoTimeRange(String),
    #[error(
        "rule `{0}`: --from and --to are for a partition key with a time bucket, and it has none"
    )]
    TimeRangeUnused(String),
    #[error("--from/--to: {0}")]
    BadTime(String),
    #[error("rule `{0}`: its partition key template cannot be read by query")]
    Unsupported(String),
    #[error(
        "rule `{rule}`: {keys} partition keys to read, more than {MAX_KEYS}; narrow --from/--to"
    )]
    TooMany { rule: String, keys: usize },
}

/// Most partition keys one read fans out to: every page queries each of them.
pub(crate) const MAX_KEYS: usize = 10_000;

/// `--from` and `--to`: ISO-8601 text or epoch seconds/milliseconds, as
/// `bucket()` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeRange {
    pub from: String,
    pub to: String,
}

/// The partition keys of one logical key, in a fixed order (template parts
/// left to right, the leftmost varying slowest): a key's index in `keys` is
/// how the merge and the cursor name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalKey {
    pub rule: String,
    pub table: String,
    pub partition_key: String,
    pub sort_key: String,
    pub keys: Vec<String>,
}

/// The names a template reads outside `shard()` and `bucket()`, and whether it has a `bucket()`.
pub(crate) fn needs(t: &Template) -> (BTreeSet<&str>, bool) {
    let mut names = BTreeSet::new();
    let mut bucketed = false;
    for p in &t.parts {
        if let Part::Expr { expr, .. } = p {
            match expr {
                Expr::Capture(n) | Expr::Attr(n) => {
                    names.insert(n.as_str());
                }
                Expr::Bucket { .. } => bucketed = true,
                Expr::Shard { .. } | Expr::Text(_) => {}
            }
        }
    }
    (names, bucketed)
}

fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rule's partition-key template; None when the rule keeps the source key.
pub(crate) fn pk_template<'p>(plan: &'p Plan, rule: &'p Rule) -> Option<&'p Template> {
    let pk = &plan.target_key.partition_key.name;
    rule.key.iter().find(|(a, _)| &a.name == pk).map(|(_, t)| t)
}

/// The rule `--rule` names, or the one rule whose partition key reads
/// exactly the `--where` names.
pub(crate) fn pick_rule<'p>(
    plan: &'p Plan,
    rule: Option<&str>,
    given: &BTreeMap<String, String>,
) -> Result<&'p Rule, KeyError> {
    if let Some(name) = rule {
        return plan
            .rules
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| KeyError::UnknownRule(name.to_string()));
    }
    let given_names: BTreeSet<&str> = given.keys().map(String::as_str).collect();
    let candidates: Vec<&Rule> = plan
        .rules
        .iter()
        .filter(|r| pk_template(plan, r).is_some_and(|t| needs(t).0 == given_names))
        .collect();
    match candidates.as_slice() {
        [one] => Ok(one),
        [] => Err(KeyError::NoRule {
            given: list(given_names),
            options: plan
                .rules
                .iter()
                .filter_map(|r| {
                    let t = pk_template(plan, r)?;
                    Some(format!("{} for rule `{}`", list(needs(t).0), r.name))
                })
                .collect::<Vec<_>>()
                .join("; "),
        }),
        many => Err(KeyError::Ambiguous {
            given: list(given_names),
            rules: list(many.iter().map(|r| r.name.as_str())),
        }),
    }
}

/// Render every partition key of `rule` for the `--where` values and the time range.
pub(crate) fn render(
    plan: &Plan,
    rule: &Rule,
    given: &BTreeMap<String, String>,
    range: Option<&TimeRange>,
) -> Result<LogicalKey, KeyError> {
    let Some(KeyAttr { name: sk, .. }) = &plan.target_key.sort_key else {
        return Err(KeyError::NoSortKey);
    };
    let t = pk_template(plan, rule).ok_or_else(|| KeyError::KeepsKey(rule.name.clone()))?;
    let (names, bucketed) = needs(t);
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !given.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        return Err(KeyError::Missing {
            rule: rule.name.clone(),
            names: list(missing),
        });
    }
    let unused: Vec<&str> = given
        .keys()
        .map(String::as_str)
        .filter(|n| !names.contains(n))
        .collect();
    if !unused.is_empty() {
        return Err(KeyError::Unused {
            rule: rule.name.clone(),
            names: list(unused),
        });
    }
    match (bucketed, range) {
        (true, None) => return Err(KeyError::NoTimeRange(rule.name.clone())),
        (false, Some(_)) => return Err(KeyError::TimeRangeUnused(rule.name.clone())),
        _ => {}
    }
    let mut keys = vec![String::new()];
    for part in &t.parts {
        let choices: Vec<String> = match part {
            Part::Lit(l) => vec![l.clone()],
            Part::Expr { expr, pad, .. } => {
                let padded = |v: &str| {
                    let mut s = String::new();
                    push_padded(&mut s, v, *pad);
                    s
                };
                match expr {
                    Expr::Capture(n) | Expr::Attr(n) => vec![padded(&given[n])],
                    Expr::Shard { n, .. } => (0..*n).map(|i| padded(&i.to_string())).collect(),
                    Expr::Bucket { unit, .. } => {
                        let r = range.ok_or_else(|| KeyError::NoTimeRange(rule.name.clone()))?;
                        let labels = buckets_between(time(&r.from), time(&r.to), *unit)
                            .map_err(|e| KeyError::BadTime(e.to_string()))?;
                        if labels.is_empty() {
                            return Err(KeyError::BadTime(format!(
                                "--to {} is before --from {}",
                                r.to, r.from
                            )));
                        }
                        labels.iter().map(|l| padded(l)).collect()
                    }
                    Expr::Text(_) => return Err(KeyError::Unsupported(rule.name.clone())),
                }
            }
        };
        let count = keys.len().saturating_mul(choices.len());
        if count > MAX_KEYS {
            return Err(KeyError::TooMany {
                rule: rule.name.clone(),
                keys: count,
            });
        }
        keys = keys
            .iter()
            .flat_map(|k| choices.iter().map(move |c| format!("{k}{c}")))
            .collect();
    }
    Ok(LogicalKey {
        rule: rule.name.clone(),
        table: plan.target_table.clone(),
        partition_key: plan.target_key.partition_key.name.clone(),
        sort_key: sk.clone(),
        keys,
    })
}

/// A `--from`/`--to` value as `bucket()` reads it: a number is epoch time.
fn time(s: &str) -> TimeInput<'_> {
    if is_valid_number(s) {
        TimeInput::Number(s)
    } else {
        TimeInput::Text(s)
    }
}
