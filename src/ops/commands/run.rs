//! `rekey run`: the whole lifecycle in one resumable command.

use tokio_util::sync::CancellationToken;

use super::{connect, print_done};
use crate::ops::cli::exit;
use crate::ops::config::{Common, Planned};
use crate::ops::progress;
use crate::phase::lifecycle::{self, RunOptions, RunReport};

/// `stop` ends every phase of the run cleanly.
pub(super) async fn run(
    c: &Common,
    cmd: Planned<RunOptions>,
    stop: CancellationToken,
) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let report = lifecycle::run(&clients, &plan, &options, &progress, &stop).await?;
    print_done(c, &report, run_text)?;
    Ok(if report.blocked.is_some() {
        exit::DIFFERENCES
    } else {
        exit::OK
    })
}

fn run_text(report: &RunReport) -> String {
    match &report.blocked {
        Some(why) => format!("stopped: {why}\n"),
        None => format!("phase: {:?}\n", report.phase),
    }
}
