//! `rekey verify`: into a new table (both ways), or in place.

use std::fmt::Write as _;

use tokio_util::sync::CancellationToken;

use super::{connect, print_done};
use crate::core::plan::Mode;
use crate::ops::cli::exit;
use crate::ops::config::{Common, Planned};
use crate::ops::progress;
use crate::ops::redact::PlanRedactor;
use crate::phase::verify::fleet::FleetVerifyOptions;
use crate::phase::verify::inplace::{self as in_place, InPlaceVerifyReport};
use crate::phase::verify::{self, VerifyOptions};

/// `rekey verify`: `stop` ends it cleanly.
pub(super) async fn verify(
    c: &Common,
    cmd: Planned<VerifyOptions>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let clean = if plan.mode == Mode::InPlace {
        let report = in_place::run(&clients, &plan, &options, &progress, &stop).await?;
        print_done(c, &report, in_place_text)?;
        report.result.clean
    } else {
        let mut report = if options.reverse {
            verify::run_reverse(&clients, &plan, &options, &progress, &stop).await?
        } else {
            verify::run(&clients, &plan, &options, &progress, &stop).await?
        };
        PlanRedactor::new(&plan, c.output.redactor).verify(&mut report);
        print_done(c, &report, verify::render)?;
        report.ok()
    };
    Ok(if clean { exit::OK } else { exit::DIFFERENCES })
}

/// `rekey verify --state dynamodb://…`: this process's share, then the
/// fleet's verdict, reported as a verify on one machine is.
pub(super) async fn fleet_verify(
    c: &Common,
    cmd: Planned<FleetVerifyOptions>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let mut report = verify::fleet::run_fleet(&clients, &plan, &options, &progress, &stop).await?;
    PlanRedactor::new(&plan, c.output.redactor).verify(&mut report);
    print_done(c, &report, verify::render)?;
    Ok(if report.ok() {
        exit::OK
    } else {
        exit::DIFFERENCES
    })
}

fn in_place_text(report: &InPlaceVerifyReport) -> String {
    let mut o = String::new();
    let c = &report.result.counts;
    let _ = writeln!(
        o,
        "verify in place `{}`: {} scanned = {} matched ({} came right during the verify) + {} different + {} unconfirmed; {}",
        report.result.source_table,
        c.scanned,
        c.matched,
        report.resolved,
        c.different,
        c.unconfirmed,
        if report.result.clean {
            "clean".to_string()
        } else {
            format!("DIFFERENCES in {}", report.mismatches_file)
        }
    );
    for n in &report.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}
