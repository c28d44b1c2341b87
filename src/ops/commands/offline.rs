//! The commands that need no AWS: `check`, `status`, `control`, `iam-policy`,
//! `completions`, `man`.

use super::print;
use clap::CommandFactory as _;

use crate::ops::cli::{Cli, exit};
use crate::ops::config::{CheckOptions, Common, ControlChange, Planned};
use crate::ops::iam::{self, PolicyOptions};
use crate::ops::out;
use crate::ops::redact::PlanRedactor;
use crate::ops::status;
use crate::phase::check;
use crate::phase::error::GateNotMet;
use crate::state::StateDir;
use crate::state::control::ControlFile;
use crate::state::control::{self, PauseAck};
use crate::state::snapshot;

/// `rekey check`: the plan, and its sample items before and after.
pub(super) fn check(c: &Common, cmd: Planned<CheckOptions>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    let mut report = check::run(&plan, options.sample.as_deref())?;
    PlanRedactor::new(&plan, c.output.redactor).check(&mut report);
    print(c, &report, |r| check::render(&plan, r))?;
    // Sample lines that are not items are bad input; rejects are the plan working.
    Ok(if report.unreadable > 0 {
        exit::BAD_INPUT
    } else {
        exit::OK
    })
}

/// `rekey status`: what the migration's processes publish.
pub(super) fn status(c: &Common, cmd: Planned<StateDir>) -> anyhow::Result<i32> {
    let report = snapshot::gather(&cmd.options)?;
    print(c, &report, status::render)?;
    Ok(exit::OK)
}

/// `rekey control`: change the control file a running backfill polls.
pub(super) async fn control(c: &Common, cmd: Planned<ControlChange>) -> anyhow::Result<i32> {
    let ControlChange {
        state_dir,
        paused,
        read_rate,
        write_rate,
    } = cmd.options;
    let mut file = ControlFile::read(&state_dir)?;
    if let Some(paused) = paused {
        file.paused = paused;
    }
    if read_rate.is_some() {
        file.read_rate = read_rate;
    }
    if write_rate.is_some() {
        file.write_rate = write_rate;
    }
    let asked_at = chrono::Utc::now();
    file.write(&state_dir)?;
    // A pause has taken effect when the backfill says so: paused, with no
    // write in flight.
    let ack = match paused {
        Some(true) => Some(control::wait_for_pause(&state_dir, asked_at, PAUSE_ACK_WAIT).await?),
        _ => None,
    };
    let mut text = format!(
        "{}: {}\n",
        ControlFile::path(&state_dir).display(),
        serde_json::to_string(&file)?
    );
    match &ack {
        Some(PauseAck::Quiet { pid }) => {
            text += &format!("paused: the backfill (pid {pid}) has no write in flight\n");
        }
        Some(PauseAck::NoBackfill) => {
            text += "no backfill is running; one started now starts paused\n";
        }
        _ => {}
    }
    print(c, &file, |_| text)?;
    if let Some(PauseAck::TimedOut { pid }) = ack {
        anyhow::bail!(GateNotMet(format!(
            "the backfill (pid {pid}) did not report the pause within {} s (writes still in flight?)",
            PAUSE_ACK_WAIT.as_secs()
        )));
    }
    Ok(exit::OK)
}

/// How long `rekey control --pause` waits for the backfill to say it paused.
const PAUSE_ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `rekey iam-policy`: the least-privilege policy, as JSON.
pub(super) fn iam_policy(c: &Common, cmd: Planned<PolicyOptions>) -> anyhow::Result<i32> {
    let Planned { plan, options } = cmd;
    if !c.output.quiet && (options.region.is_none() || options.account.is_none()) {
        crate::ops::log::note(
            "`*` stands for the region and account in the ARNs: pass --region and --account to pin them",
        );
    }
    out::json(&iam::document(&plan, &options))?;
    Ok(exit::OK)
}

/// `rekey completions SHELL`: the shell's completion script, generated from
/// the argument definition (`ops::cli`).
pub(super) fn completions(shell: clap_complete::Shell) -> anyhow::Result<i32> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "rekey", &mut script);
    out::text(&String::from_utf8(script)?)?;
    Ok(exit::OK)
}

/// `rekey man`: the man page (roff), generated from the argument definition:
/// one page, the global options and then each command's synopsis,
/// description and options as a section of its own (`.SH "REKEY BACKFILL"`),
/// so `man rekey` holds everything `--help` does.
pub(super) fn man() -> anyhow::Result<i32> {
    out::text(&man_page()?)?;
    Ok(exit::OK)
}

fn man_page() -> anyhow::Result<String> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    let mut page = String::from_utf8(page)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let man = clap_mangen::Man::new(sub.clone());
        let mut part = Vec::new();
        man.render_synopsis_section(&mut part)?;
        man.render_description_section(&mut part)?;
        man.render_options_section(&mut part)?;
        page.push_str(&format!(
            ".SH \"REKEY {}\"\n",
            sub.get_name().to_uppercase().replace('-', "\\-")
        ));
        // Each part repeats roff's preamble (the `Aq` string): once is enough;
        // its sections become subsections of the command's.
        for line in String::from_utf8(part)?.lines() {
            if line.starts_with(".ie \\n(.g .ds Aq") || line.starts_with(".el .ds Aq") {
                continue;
            }
            match line.strip_prefix(".SH ") {
                Some(heading) => page.push_str(&format!(".SS {heading}\n")),
                None => page.push_str(&format!("{line}\n")),
            }
        }
    }
    Ok(page)
}
