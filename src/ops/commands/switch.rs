//! Switching over: `drain`, `cutover`, `finish`.

use std::fmt::Write as _;

use super::{connect, print};
use crate::core::plan::Plan;
use crate::ops::cli::exit;
use crate::ops::config::{Common, FinishOptions, Planned};
use crate::ops::progress;
use crate::phase::barrier::{self, DrainOptions, DrainReport};
use crate::phase::cutover::{self, CutoverOptions, CutoverReport, FinishReport};
use crate::state::snapshot::show_time;

/// `rekey drain`: a barrier through the running tail. With `--state`,
/// through the fleet's tail; a fleet without one (`rekey tail --fleet` beside
/// workers without `--tail`) drains through this machine's tail, as before.
pub(super) async fn drain(c: &Common, cmd: Planned<DrainOptions>) -> anyhow::Result<i32> {
    let Planned { plan, mut options } = cmd;
    let clients = connect(c).await?;
    if let Some(at) = options.fleet.clone()
        && !barrier::fleet::fleet_has_tail(&clients, &at).await?
    {
        if barrier::tail_has_run(&options.state_dir, options.flow) {
            crate::ops::log::note(&format!(
                "{} has no `rekey worker --tail`; draining through this machine's tail (`rekey tail --fleet`)",
                at.display()
            ));
            options.fleet = None;
        } else {
            crate::ops::log::note(&format!(
                "no `rekey worker --tail` has taken the stream's shards of {} yet; waiting for one",
                at.display()
            ));
        }
    } else if options.fleet.is_none() && !barrier::tail_has_run(&options.state_dir, options.flow) {
        crate::ops::log::note(&format!(
            "no tail has published status under {} yet; waiting for one to start",
            options.state_dir.display()
        ));
    }
    let report = barrier::drain(&clients, &plan, &options).await?;
    print(c, &report, drain_text)?;
    Ok(if report.complete {
        exit::OK
    } else {
        exit::GATE
    })
}

fn drain_text(report: &DrainReport) -> String {
    if report.complete {
        format!(
            "drained: the {} applied every write made before barrier {} ({:.1} s)\n",
            report.direction, report.barrier, report.waited_seconds
        )
    } else if report.waiting_on.is_empty() {
        format!(
            "not drained: the {} did not report barrier {} within {:.0} s — is it running and keeping up?\n",
            report.direction, report.barrier, report.waited_seconds
        )
    } else {
        format!(
            "not drained: the {} did not report barrier {} within {:.0} s; still waiting for shard(s) {} \
             to show a record from after it (a shard no marker key reaches, such as a partition split by \
             sort key under one hot key, proves itself only by its own writes or by closing: wait, or \
             raise --timeout)\n",
            report.direction,
            report.barrier,
            report.waited_seconds,
            report.waiting_on.join(", ")
        )
    }
}

/// `rekey cutover`: the gates, the postpone file, a drain, the record.
pub(super) async fn cutover(c: &Common, cmd: Planned<CutoverOptions>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let report = cutover::cutover(&clients, &plan, &options, &progress).await?;
    print(c, &report, |r| cutover_text(&plan, r))?;
    Ok(if report.cut_over {
        exit::OK
    } else {
        exit::GATE
    })
}

/// `rekey rollback`: the mirror of cutover, through the reverse tail.
pub(super) async fn rollback(c: &Common, cmd: Planned<CutoverOptions>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let report = cutover::rollback(&clients, &plan, &options, &progress).await?;
    print(c, &report, |r| rollback_text(&plan, r))?;
    Ok(if report.cut_over {
        exit::OK
    } else {
        exit::GATE
    })
}

fn rollback_text(plan: &Plan, report: &CutoverReport) -> String {
    let mut o = gates_text(report);
    match (&report.record, &report.blocked) {
        (Some(r), _) => {
            let _ = writeln!(
                o,
                "\nRolled back at {} (drain barrier {}): every write to `{}` until then is in `{}`.\n",
                show_time(&r.at),
                r.barrier,
                r.target_table,
                r.source_table
            );
            let _ = writeln!(o, "{}", cutover::rollback_steps(plan, &plan.path));
        }
        (None, Some(why)) => {
            let _ = writeln!(o, "\nnot rolled back: {why}");
        }
        (None, None) => {}
    }
    o
}

/// One line per gate.
fn gates_text(report: &CutoverReport) -> String {
    let mut o = String::new();
    for g in &report.gates {
        let _ = writeln!(
            o,
            "[{}] {}: {}",
            if g.ok { "ok" } else { "  " },
            g.name,
            g.detail
        );
    }
    o
}

fn cutover_text(plan: &Plan, report: &CutoverReport) -> String {
    let mut o = gates_text(report);
    match (&report.record, &report.blocked) {
        (Some(r), _) => {
            let _ = writeln!(
                o,
                "\nCut over at {} (drain barrier {}): every write to `{}` until then is in `{}`.\n",
                show_time(&r.at),
                r.barrier,
                r.source_table,
                r.target_table
            );
            let _ = writeln!(o, "{}", cutover::next_steps(plan, &plan.path));
        }
        (None, Some(why)) => {
            let _ = writeln!(o, "\nnot cut over: {why}");
        }
        (None, None) => {}
    }
    o
}

/// `rekey finish`: drain once more, record the end, stop the tail.
pub(super) async fn finish(c: &Common, cmd: Planned<FinishOptions>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let clients = connect(c).await?;
    let report = cutover::finish(
        &clients,
        &plan,
        &options.state_dir,
        options.drain_timeout,
        options.fleet.as_ref(),
    )
    .await?;
    print(c, &report, |r| finish_text(&plan, r))?;
    Ok(if report.finished {
        exit::OK
    } else {
        exit::GATE
    })
}

fn finish_text(plan: &Plan, report: &FinishReport) -> String {
    if report.finished {
        format!(
            "finished: the last writes to `{}` are in `{}`; the tail stops now. `{}` is kept.\n",
            plan.source_table, plan.target_table, plan.source_table
        )
    } else {
        format!(
            "not finished: the tail did not report drain barrier {} in time — is it running?\n",
            report.barrier
        )
    }
}
