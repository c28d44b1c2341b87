//! `rekey query`'s arguments → [`QueryOptions`], checked: the `--where`
//! pairs parsed, the sort-key condition and page size, and the keys and
//! cursor prepared once here so that a bad `--where` or a corrupt or
//! foreign `--cursor` is exit 2 before any AWS call.

use std::collections::BTreeMap;

use super::{Command, Planned};
use crate::core::plan::Plan;
use crate::core::query::{Order, SkCondition, TimeRange};
use crate::ops::cli::{InputError, QueryArgs};
use crate::phase::query::{QueryOptions, prepare};

pub(super) fn query(a: &QueryArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    if a.limit == 0 {
        return Err(InputError("--limit: give 1 or more items per page".into()).into());
    }
    if let Some(r) = a.read_rate
        && !(r.is_finite() && r > 0.0)
    {
        return Err(InputError(format!("--read-rate {r}: give RCU per second above 0")).into());
    }
    let condition = match (&a.sk_begins_with, a.sk_between.as_deref()) {
        (Some(p), _) => SkCondition::BeginsWith(p.clone()),
        (None, Some([low, high])) if low <= high => SkCondition::Between(low.clone(), high.clone()),
        (None, Some([low, high])) => {
            return Err(InputError(format!(
                "--sk-between {low:?} {high:?}: the low end sorts after the high end"
            ))
            .into());
        }
        _ => SkCondition::Any,
    };
    let options = QueryOptions {
        rule: a.rule.clone(),
        where_: where_pairs(&a.where_)?,
        time: a
            .from
            .clone()
            .zip(a.to.clone())
            .map(|(from, to)| TimeRange { from, to }),
        condition,
        order: if a.desc {
            Order::Descending
        } else {
            Order::Ascending
        },
        limit: a.limit,
        cursor: a.cursor.clone(),
        read_rate: a.read_rate,
        consistent_read: a.consistent,
    };
    prepare(&plan, &options)?;
    Ok(Command::Query(Planned { plan, options }))
}

/// `name=value` pairs, comma-separated, from every `--where`. A comma not
/// followed by `name=` belongs to the value (`note=a,b` is one pair).
fn where_pairs(args: &[String]) -> Result<BTreeMap<String, String>, InputError> {
    let is_name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '@')
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    for arg in args {
        let mut first = true;
        for seg in arg.split(',') {
            match seg.split_once('=') {
                Some((name, value)) if is_name(name) => {
                    let name = name.strip_prefix('@').unwrap_or(name);
                    pairs.push((name.to_string(), value.to_string()));
                }
                _ if !first => {
                    if let Some((_, v)) = pairs.last_mut() {
                        v.push(',');
                        v.push_str(seg);
                    }
                }
                _ => {
                    return Err(InputError(format!(
                        "--where {arg:?}: give name=value pairs, comma-separated"
                    )));
                }
            }
            first = false;
        }
    }
    let mut out = BTreeMap::new();
    for (name, value) in pairs {
        if out.insert(name.clone(), value).is_some() {
            return Err(InputError(format!("--where: `{name}` is given twice")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(args: &[&str]) -> Result<Vec<(String, String)>, InputError> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        where_pairs(&args).map(|m| m.into_iter().collect())
    }

    #[test]
    fn where_reads_pairs_and_keeps_commas_inside_values() {
        let got = pairs(&["tenant=acme,day=2026-07-07", "note=a,b,@status=OPEN"]).unwrap();
        let want = [
            ("day", "2026-07-07"),
            ("note", "a,b"),
            ("status", "OPEN"),
            ("tenant", "acme"),
        ];
        assert_eq!(
            got,
            want.map(|(a, b)| (a.to_string(), b.to_string())).to_vec()
        );
        assert!(pairs(&["tenant"]).unwrap_err().0.contains("name=value"));
        assert!(pairs(&["a=1", "a=2"]).unwrap_err().0.contains("twice"));
        assert_eq!(pairs(&["a="]).unwrap(), [("a".to_string(), String::new())]);
    }
}
