//! `rekey loadtest`'s arguments → [`LoadtestRun`], checked: the rate, the
//! duration, the mix and the preset, the table pair, and the plan's rule
//! (its keys can be drawn and its reads rendered), all before any AWS call.

use super::{Command, Planned, seconds};
use crate::core::loadtest::scenario::{PRESETS, preset};
use crate::core::plan::Plan;
use crate::ops::cli::{DesignArg, InputError, LoadtestArgs};
use crate::phase::loadtest::{Designs, GivenTables, LoadtestOptions, prepare};

/// `rekey loadtest`: the run, and whether a run against AWS may go ahead.
#[derive(Debug, Clone)]
pub struct LoadtestRun {
    pub options: LoadtestOptions,
    /// `--yes`: the estimated cost is accepted.
    pub yes: bool,
}

pub(super) fn loadtest(a: &LoadtestArgs) -> anyhow::Result<Command> {
    let plan = Plan::load(&a.plan)?;
    if !(a.rate.is_finite() && a.rate > 0.0) {
        return Err(InputError(format!(
            "--rate {}: give requests per second above 0",
            a.rate
        ))
        .into());
    }
    let duration = seconds("--duration", a.duration)?;
    if duration.is_zero() {
        return Err(InputError("--duration: give seconds above 0".into()).into());
    }
    for (flag, n) in [
        ("--concurrency", a.concurrency),
        ("--page", a.page),
        ("--top", a.top),
    ] {
        if n == 0 {
            return Err(InputError(format!("{flag}: give 1 or more")).into());
        }
    }
    let mut scenario = preset(&a.preset).ok_or_else(|| {
        let known: Vec<String> = PRESETS
            .iter()
            .map(|p| format!("{} ({})", p.name, p.about))
            .collect();
        InputError(format!(
            "--preset {}: no such scenario; the presets are: {}",
            a.preset,
            known.join("; ")
        ))
    })?;
    if let Some(mix) = &a.mix {
        scenario.reads = read_share(mix)?;
    }
    let options = LoadtestOptions {
        scenario,
        rule: a.rule.clone(),
        designs: match a.design {
            DesignArg::Old => Designs::Old,
            DesignArg::New => Designs::New,
            DesignArg::Both => Designs::Both,
        },
        rate: a.rate,
        duration,
        concurrency: a.concurrency,
        seed: a.seed,
        page: a.page,
        top: a.top,
        tables: a.tables.as_deref().map(table_pair).transpose()?,
    };
    prepare(&plan, &options)?;
    Ok(Command::Loadtest(Planned {
        plan,
        options: LoadtestRun {
            options,
            yes: a.yes,
        },
    }))
}

/// `READS:WRITES` → the share of reads.
fn read_share(mix: &str) -> Result<f64, InputError> {
    let bad = || {
        InputError(format!(
            "--mix {mix}: give READS:WRITES, two numbers 0 or more, not both 0 (`1:4`, `0:1`)"
        ))
    };
    let (r, w) = mix.split_once(':').ok_or_else(bad)?;
    let num = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    match (num(r), num(w)) {
        (Some(r), Some(w)) if r + w > 0.0 => Ok(r / (r + w)),
        _ => Err(bad()),
    }
}

/// `OLD,NEW`: two different table names.
fn table_pair(s: &str) -> Result<GivenTables, InputError> {
    match s.split_once(',') {
        Some((old, new))
            if !old.trim().is_empty() && !new.trim().is_empty() && old.trim() != new.trim() =>
        {
            Ok(GivenTables {
                old: old.trim().to_string(),
                new: new.trim().to_string(),
            })
        }
        _ => Err(InputError(format!(
            "--tables {s}: give two different tables, OLD,NEW (the old design's, then the new one's)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_reads_to_writes() {
        assert_eq!(read_share("1:4").unwrap(), 0.2);
        assert_eq!(read_share("0:1").unwrap(), 0.0);
        assert_eq!(read_share(" 95 : 5 ").unwrap(), 0.95);
        for bad in ["", "1", "0:0", "-1:2", "a:b", "1:inf"] {
            assert!(read_share(bad).is_err(), "{bad}");
        }
        assert!(table_pair("a,a").is_err());
        assert_eq!(table_pair("a, b").unwrap().new, "b");
    }
}
