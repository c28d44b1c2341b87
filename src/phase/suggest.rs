//! `rekey suggest TABLE`: read a sample of the table's keys under the read
//! budget (the same Scan, budget and progress as analyze), infer their shapes
//! and the shard counts ([`crate::core::suggest`]), and render the answer.
//!
//! The Scan stops once the sample is full, so a huge table costs at most
//! `sample` items of reads; the limits are DynamoDB's per-partition ceilings,
//! as analyze names them.

use std::fmt::Write as _;
use std::ops::ControlFlow;

use crate::aws::Clients;
use crate::core::suggest::{
    Action, Limits, Sample, ShapeReport, ShardRounding, SuggestOptions, Suggestion, Verdict,
    suggest,
};
use crate::phase::analyze::{PARTITION_RCU, PARTITION_WCU, ScanSettings, TableRead, read_table};
use crate::phase::progress::Progress;

/// DynamoDB's per-partition limits, for the shard arithmetic.
pub const LIMITS: Limits = Limits {
    write_units: PARTITION_WCU,
    read_units: PARTITION_RCU,
};

#[derive(Debug, Clone)]
pub struct SuggestRun {
    pub table: String,
    pub scan: ScanSettings,
    /// Items read at most.
    pub sample: usize,
    pub options: SuggestOptions,
}

/// Sample `run.table` and suggest.
pub async fn run(
    clients: &Clients,
    run: &SuggestRun,
    progress: &Progress,
) -> anyhow::Result<Suggestion> {
    let info = clients.describe_table(&run.table).await?;
    let mut sample = Sample::new(run.sample);
    let read = TableRead {
        table: &info,
        settings: &run.scan,
        label: "suggest",
    };
    let mut stopped = false;
    read_table(clients, &read, progress, |page| {
        for item in &page.items {
            sample.add(item, &info.key);
        }
        stopped = sample.is_full();
        Ok(if stopped {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    })
    .await?;
    let mut s = suggest(&info.name, &info.key, &sample, &run.options);
    // A table of exactly `sample` items reads as a sample: the Scan stopped before it could tell.
    s.whole_table = !stopped;
    Ok(s)
}

fn pct(x: f64) -> String {
    crate::core::suggest::render::pct(x)
}

fn shape(w: &mut String, s: &Suggestion, r: &ShapeReport) {
    let text = match &r.sk {
        Some(sk) => format!("{} / {sk}", r.pk),
        None => r.pk.clone(),
    };
    let _ = writeln!(w, "\nshape {text}: {} items ({})", r.items, pct(r.share));
    let _ = writeln!(
        w,
        "  hottest key {}: {} of the writes → {:.0} WCU/s (budget {:.0})",
        r.hottest_key,
        pct(r.hottest_write_share),
        r.write_load,
        s.write_budget
    );
    if let Some(l) = r.read_load {
        let _ = writeln!(
            w,
            "  and {} of the reads → {l:.0} RCU/s (budget {:.0})",
            pct(r.hottest_read_share),
            s.read_budget
        );
    }
    match &r.action {
        Action::NoRule => {
            let _ = writeln!(w, "  no rule needed ({:.2} of the budget)", r.needed);
        }
        Action::Shard { shards, capture } => {
            let rounding = match s.rounding {
                ShardRounding::PowerOfTwo => "the next power of two",
                ShardRounding::Exact => "rounded up",
            };
            let _ = writeln!(
                w,
                "  {:.2} shards needed → {shards} ({rounding}) by a hash of `{capture}`",
                r.needed
            );
        }
        Action::Keep => {
            let _ = writeln!(w, "  no rule needed for its load");
        }
        Action::CannotShard => {
            let _ = writeln!(w, "  {:.2} shards needed, but:", r.needed);
        }
    }
    if let Some(rule) = &r.rule {
        let _ = writeln!(w, "  rule `{}`: new key {}", rule.name, rule.key_pk);
    }
    for n in &r.notes {
        let _ = writeln!(w, "  {n}");
    }
}

/// The text report (key values already redacted by the caller).
///
/// ```text
/// shape TENANT#{tenant}#DAY#{day} / ORDER#{order}: 2000 items (95.2 %)
///   hottest key TENANT#‹287c2c75›#DAY#‹4bae7bf3›: 32.5 % of the writes → 6495 WCU/s (budget 500)
///   12.99 shards needed → 16 (the next power of two) by a hash of `order`
/// ```
pub fn render(s: &Suggestion) -> String {
    let mut w = String::new();
    let read = if s.whole_table {
        "the whole table"
    } else {
        "a sample"
    };
    let _ = writeln!(
        w,
        "suggest: `{}`, {} items read ({read})",
        s.table, s.sampled
    );
    let rates = match s.read_rate {
        Some(r) => format!("{:.0} writes/s and {r:.0} reads/s", s.write_rate),
        None => format!("{:.0} writes/s", s.write_rate),
    };
    let _ = writeln!(
        w,
        "for {rates} with {:.0} % headroom: one key (one shard) may take {:.0} WCU/s, {:.0} RCU/s",
        s.headroom * 100.0,
        s.write_budget,
        s.read_budget
    );
    if !s.hot_keys.is_empty() {
        let _ = writeln!(w, "\nhottest keys:");
    }
    for k in &s.hot_keys {
        let _ = writeln!(
            w,
            "  {:<40} {:>8} items  {:>7} of the writes  {:>8.0} WCU/s",
            k.key,
            k.items,
            pct(k.write_share),
            k.write_load
        );
    }
    for r in &s.shapes {
        shape(&mut w, s, r);
    }
    let _ = writeln!(w, "\n{}", s.verdict.message());
    let stuck = s
        .shapes
        .iter()
        .filter(|r| r.action == Action::CannotShard)
        .count();
    if s.verdict == Verdict::Plan && stuck > 0 {
        let _ = writeln!(
            w,
            "but {stuck} hot shape(s) stay hot: no rule can spread them (see their notes)"
        );
    }
    if s.verdict == Verdict::Plan {
        let _ = writeln!(w, "target table: `{}`", s.target_table);
    }
    w
}
