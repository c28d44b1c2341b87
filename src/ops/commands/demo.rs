//! `rekey demo`: the plan and analyze's verdict first, then the migration
//! and its before/after.

use std::fmt::Write as _;

use super::print;
use crate::ops::cli::exit;
use crate::ops::config::{Common, Format};
use crate::ops::demo::{self, Demo, DemoOptions};
use crate::ops::redact::PlanRedactor;
use crate::ops::{out, progress};
use crate::phase::analyze;

pub(super) async fn demo(c: &Common, options: DemoOptions) -> anyhow::Result<i32> {
    let progress = progress::new(c.output.progress);
    let mut demo = Demo::prepare(&options, &progress).await?;
    PlanRedactor::new(&demo.plan, c.output.redactor).analyze(&mut demo.report);
    if c.output.format == Format::Text {
        // Before the migration, which takes minutes.
        out::text(&before_text(&demo))?;
    }
    let summary = demo.migrate(&progress).await?;
    print(c, &summary, demo::render)?;
    Ok(if summary.completed {
        exit::OK
    } else {
        exit::DIFFERENCES
    })
}

/// The plan (without its comments) and analyze's short verdict.
fn before_text(demo: &Demo) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Plan ({}):\n", demo.plan.path.display());
    for line in demo::DEMO_PLAN
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let _ = writeln!(o, "    {line}");
    }
    let _ = writeln!(o);
    o.push_str(&analyze::render::short(&demo.report));
    let _ = writeln!(o);
    o
}
