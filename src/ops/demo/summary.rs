//! The demo's before/after: [`Summary`], and its rendering for people.

use serde::Serialize;

use super::check::FinalCheck;
use super::writer::WriterReport;
use crate::phase::analyze::{self, Distribution, Report};
use crate::phase::backfill::Counters;
use crate::phase::lifecycle::PhaseTime;
use crate::phase::tail::TailReport;
use crate::state::snapshot::VerifyResult;

/// The demo's before/after, printed by `rekey demo` (as JSON with `--json`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    /// Cut over and finished (or the demo fails), verify clean, and the
    /// target equal to the plan applied to the source.
    pub completed: bool,
    pub source_table: String,
    pub target_table: String,
    /// Orders and tenant profiles, before the migration.
    pub items_loaded: u64,
    pub hottest: Hottest,
    /// What the application wrote to the source during the migration.
    pub application: WriterReport,
    /// The backfill's totals: `scanned = written + rejected + skipped`.
    pub backfill: Counters,
    /// The application's writes the tail carried into the target.
    pub tail: TailReport,
    pub verify_clean: bool,
    /// `rekey run`'s verify result (counts, times).
    pub verify: Option<VerifyResult>,
    pub cut_over_at: String,
    pub finished_at: String,
    pub check: FinalCheck,
    pub phases: Vec<PhaseTime>,
    pub total_seconds: f64,
}

/// The hottest partition key of each design, from analyze's report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Hottest {
    /// Application writes/s of the estimate, spread as the items are.
    pub app_write_rate: Option<f64>,
    pub old: HotSide,
    pub new: HotSide,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct HotSide {
    /// Redacted unless `--show-keys`.
    pub key: String,
    pub item_share: f64,
    /// WCU/s this key would take at `app_write_rate`.
    pub predicted_wcu: Option<f64>,
    /// Keys over 1,000 WCU/s at that rate.
    pub keys_over_limit: Option<u64>,
}

impl Hottest {
    pub(super) fn of(r: &Report, app_write_rate: Option<f64>) -> Hottest {
        let side = |d: &Distribution| {
            let app = d.load.iter().position(|l| l.scenario == "application");
            d.hottest_by_items
                .first()
                .map(|h| HotSide {
                    key: h.key.clone(),
                    item_share: h.item_share,
                    predicted_wcu: app.and_then(|i| h.predicted_wcu.get(i).copied()),
                    keys_over_limit: app.map(|i| d.load[i].keys_over_limit),
                })
                .unwrap_or_default()
        };
        Hottest {
            app_write_rate,
            old: side(&r.old),
            new: side(&r.new),
        }
    }
}

/// The summary for people: before/after, the migration, the time it took.
pub(crate) fn render(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(w, "\nBefore and after");
    render_hottest(w, &s.hottest);
    let a = &s.application;
    let _ = writeln!(
        w,
        "\nThe migration of `{}` into `{}`, while the application wrote:",
        s.source_table, s.target_table
    );
    let b = &s.backfill;
    let row = |w: &mut String, label: &str, text: String| {
        let _ = writeln!(w, "  {label:<13}{text}");
    };
    // Both rates: the local server serves one request at a time, and writes
    // wait while a Scan page holds it, so fewer get through than asked.
    row(
        w,
        "application",
        format!(
            "{} writes in {:.0} s ({:.0}/s of {:.0}/s asked): {} new orders, {} status changes, {} deletes",
            a.inserts + a.updates + a.deletes,
            a.seconds,
            a.writes_per_second,
            a.rate,
            a.inserts,
            a.updates,
            a.deletes
        ),
    );
    row(
        w,
        "backfill",
        format!(
            "{} items copied (scanned {} = written {} + rejected {} + skipped {})",
            b.written, b.scanned, b.written, b.rejected, b.skipped
        ),
    );
    let t = &s.tail;
    row(
        w,
        "tail",
        format!(
            "{} stream records read; applied to the target: {} puts, {} deletes ({} rejected)",
            t.records, t.puts, t.deletes, t.rejected
        ),
    );
    let c = s.verify.as_ref().map(|v| v.counts).unwrap_or_default();
    row(
        w,
        "verify",
        format!(
            "{}: {} source items matched, {} target items mapped back; {} changed under it, settled by re-checks",
            if s.verify_clean {
                "clean"
            } else {
                "DIFFERENCES"
            },
            c.matched,
            c.target_matched,
            c.resolved
        ),
    );
    row(
        w,
        "cutover",
        format!("at {} (gates held, drain barrier complete)", s.cut_over_at),
    );
    row(
        w,
        "finish",
        format!("at {}; the tail stopped", s.finished_at),
    );
    let c = &s.check;
    let check = if c.equal {
        format!("target == plan(source): {} items", c.target_items)
    } else {
        format!(
            "target != plan(source): {} missing, {} extra, {} different ({} expected, {} in the target)",
            c.missing, c.extra, c.different, c.expected, c.target_items
        )
    };
    row(w, "check", check);
    let _ = writeln!(w, "\nTime");
    for p in &s.phases {
        let _ = writeln!(w, "  {:<24}{:>8.1} s", p.phase, p.seconds);
    }
    let _ = writeln!(w, "  {:<24}{:>8.1} s", "total", s.total_seconds);
    o
}

fn render_hottest(w: &mut String, h: &Hottest) {
    use std::fmt::Write as _;
    let row = |w: &mut String, label: &str, old: String, new: String| {
        let _ = writeln!(w, "  {label:<28}{old:>16}{new:>16}");
    };
    row(w, "", "old design".into(), "new design".into());
    row(
        w,
        "hottest key's share of items",
        format!("{:.2}%", h.old.item_share * 100.0),
        format!("{:.2}%", h.new.item_share * 100.0),
    );
    if let Some(rate) = h.app_write_rate {
        let wcu = |s: &HotSide| {
            s.predicted_wcu.map_or("-".into(), |v| {
                let over = if v > analyze::PARTITION_WCU {
                    " THROTTLE"
                } else {
                    ""
                };
                format!("{v:.0}{over}")
            })
        };
        row(
            w,
            &format!("its WCU/s at {rate:.0} writes/s"),
            wcu(&h.old),
            wcu(&h.new),
        );
        let over = |s: &HotSide| s.keys_over_limit.map_or("-".into(), |n| n.to_string());
        row(w, "keys over 1,000 WCU/s", over(&h.old), over(&h.new));
    }
    let _ = writeln!(w, "  hottest key, old design    {}", h.old.key);
    let _ = writeln!(w, "  hottest key, new design    {}", h.new.key);
}
