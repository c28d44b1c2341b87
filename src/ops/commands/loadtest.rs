//! `rekey loadtest`: the cost gate against AWS, the run, each design's
//! report redacted (its hottest keys are key values) and printed.

use std::fmt::Write as _;

use tokio_util::sync::CancellationToken;

use super::{connect, print};
use crate::core::loadtest::cost::{self, READ_PRICE_PER_MILLION, WRITE_PRICE_PER_MILLION};
use crate::core::loadtest::report::{DesignReport, HotKey, Percentiles, percent};
use crate::core::plan::Plan;
use crate::ops::cli::{InputError, exit};
use crate::ops::config::{Common, LoadtestRun, Planned};
use crate::ops::progress;
use crate::ops::redact::PlanRedactor;
use crate::phase::loadtest::{self, LoadReport, prepare};

pub(super) async fn loadtest(
    c: &Common,
    cmd: Planned<LoadtestRun>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned {
        plan,
        options: LoadtestRun { options, yes },
    } = cmd;
    let clients = connect(c).await?;
    let endpoint = &clients.endpoints.dynamodb;
    if !endpoint.is_local() {
        let e = cost::estimate(&prepare(&plan, &options)?.traffic);
        eprintln!(
            "loadtest against AWS ({endpoint}): about ${:.2} — {:.0} write and {:.0} read request \
             units at on-demand prices (us-east-1: ${WRITE_PRICE_PER_MILLION} and \
             ${READ_PRICE_PER_MILLION} per million; other regions differ), on scratch tables \
             deleted afterwards",
            e.dollars, e.write_units, e.read_units
        );
        if !yes {
            return Err(InputError(
                "a load test against AWS costs money: run it again with --yes to go ahead".into(),
            )
            .into());
        }
    }
    if !c.output.quiet {
        eprintln!(
            "loadtest: {} ({}), {} reads, {} requests/s for {} s per design",
            options.scenario.name,
            options.scenario.about,
            percent(options.scenario.reads),
            options.rate,
            options.duration.as_secs_f64()
        );
    }
    let progress = progress::new(c.output.progress);
    let mut report = loadtest::run(&clients, &plan, &options, &progress, &stop).await?;
    redact(&plan, c, &mut report);
    print(c, &report, text)?;
    Ok(exit::OK)
}

/// Hot keys are partition key values: each as the plan's shapes redact it.
fn redact(plan: &Plan, c: &Common, r: &mut LoadReport) {
    let redactor = PlanRedactor::new(plan, c.output.redactor);
    for d in &mut r.designs {
        let new = d.design == "new";
        let attr = if new {
            &plan.target_key.partition_key.name
        } else {
            &plan.source_key.partition_key.name
        };
        for k in d
            .hottest_write_keys
            .iter_mut()
            .chain(&mut d.hottest_read_keys)
            .chain(&mut d.most_throttled_keys)
        {
            k.key = if new {
                redactor.target_value(attr, &k.key)
            } else {
                redactor.source_value(attr, &k.key)
            };
        }
    }
}

fn latency(p: &Percentiles) -> String {
    if p.count == 0 {
        "none served".into()
    } else {
        format!("p50 {:.1} ms, p99 {:.1} ms", p.p50_ms, p.p99_ms)
    }
}

fn keys(list: &[HotKey], units: fn(&HotKey) -> f64, unit: &str) -> String {
    if list.is_empty() {
        return "none".into();
    }
    list.iter()
        .map(|k| {
            let refused = match k.throttled {
                0 => String::new(),
                n => format!(", {n} throttled"),
            };
            format!("{} {:.0} {unit}{refused}", k.key, units(k))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn design(out: &mut String, d: &DesignReport) {
    let _ = writeln!(
        out,
        "\n{} design, table {}: {} requests in {:.1} s ({:.0}/s): {} writes, {} reads",
        d.design,
        d.table,
        d.requests.total(),
        d.seconds,
        d.rate,
        d.requests.writes,
        d.requests.reads
    );
    let b = d.by_reason;
    let _ = writeln!(
        out,
        "  throttled: {} writes ({}), {} reads ({}); calls refused by reason: key range {}, \
         table {}, index {}, other {}",
        d.throttled.writes,
        percent(d.throttled_write_share),
        d.throttled.reads,
        percent(d.throttled_read_share),
        b.key_range,
        b.table,
        b.index,
        b.other
    );
    if d.failed.total() > 0 {
        let _ = writeln!(
            out,
            "  failed otherwise (5xx, connection): {} requests",
            d.failed.total()
        );
    }
    let _ = writeln!(
        out,
        "  latency of served requests: writes {}; reads {}",
        latency(&d.latency.writes),
        latency(&d.latency.reads)
    );
    let _ = writeln!(
        out,
        "  hottest keys by WCU: {}",
        keys(&d.hottest_write_keys, |k| k.wcu, "WCU")
    );
    if d.requests.reads > 0 {
        let _ = writeln!(
            out,
            "  hottest keys by RCU: {}",
            keys(&d.hottest_read_keys, |k| k.rcu, "RCU")
        );
    }
    let _ = writeln!(out, "  verdict: {}", d.verdict);
}

fn text(r: &LoadReport) -> String {
    let mut out = format!(
        "loadtest of rule `{}`: {} ({}), {} reads, {} requests/s, {} s per design, seed {}{}",
        r.rule,
        r.scenario.name,
        r.scenario.about,
        percent(r.scenario.reads),
        r.rate,
        r.duration_seconds,
        r.seed,
        if r.stopped { " (stopped early)" } else { "" }
    );
    for d in &r.designs {
        design(&mut out, d);
    }
    if r.scratch_tables {
        out.push_str("\nscratch tables deleted\n");
    }
    out
}
