//! `rekey analyze`: the dry run on the source table.

use super::{connect, print};
use crate::ops::cli::exit;
use crate::ops::config::{AnalyzeRun, Common, Planned};
use crate::ops::progress;
use crate::ops::redact::PlanRedactor;
use crate::phase::analyze;
use crate::state::rejects::RejectsFile;

pub(super) async fn analyze(c: &Common, cmd: Planned<AnalyzeRun>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let rejects = options
        .rejects
        .as_deref()
        .map(RejectsFile::open)
        .transpose()?;
    let progress = progress::new(c.output.progress);
    let mut report = analyze::run(
        &clients,
        &plan,
        &options.scan,
        options.options,
        rejects,
        &progress,
    )
    .await?;
    PlanRedactor::new(&plan, c.output.redactor).analyze(&mut report);
    print(c, &report, analyze::render::render)?;
    Ok(exit::OK)
}
