//! `rekey suggest TABLE`: sample, suggest, redact the hot keys, write the plan.

use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use super::{connect, print};
use crate::core::plan::Plan;
use crate::core::suggest::{Suggestion, Verdict};
use crate::core::template::Shape;
use crate::ops::cli::exit;
use crate::ops::config::{Common, SuggestCommand};
use crate::ops::progress;
use crate::ops::redact::Redactor;
use crate::phase::suggest;

#[derive(Serialize)]
struct Output {
    #[serde(flatten)]
    suggestion: Suggestion,
    /// The file the plan was written to.
    written: Option<String>,
}

pub(super) async fn suggest(c: &Common, cmd: SuggestCommand) -> anyhow::Result<i32> {
    let clients = connect(c).await?;
    let progress = progress::new(c.output.progress);
    let mut suggestion = suggest::run(&clients, &cmd.run, &progress).await?;
    let written = match (&cmd.output, &suggestion.plan) {
        (Some(path), Some(text)) if suggestion.verdict == Verdict::Plan => {
            write_plan(path, text)?;
            Some(path.display().to_string())
        }
        _ => None,
    };
    redact(&mut suggestion, c.output.redactor);
    let out = Output {
        suggestion,
        written,
    };
    print(c, &out, |o| {
        let mut text = suggest::render(&o.suggestion);
        match (&o.written, &o.suggestion.plan) {
            (Some(path), _) => text.push_str(&format!("plan written to {path}\n")),
            (None, Some(plan)) => text.push_str(&format!("\n{plan}")),
            (None, None) => {}
        }
        text
    })?;
    Ok(exit::OK)
}

/// The plan is checked as `rekey check` would before it is written.
fn write_plan(path: &Path, text: &str) -> anyhow::Result<()> {
    Plan::parse(text, path).context("the suggested plan does not validate (a rekey bug)")?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Hot keys keep their shape's literals; what was captured is hashed.
fn redact(s: &mut Suggestion, redactor: Redactor) {
    let shapes: Vec<Shape> = s
        .shapes
        .iter()
        .filter_map(|r| Shape::parse(&r.pk).ok())
        .collect();
    for r in &mut s.shapes {
        r.hottest_key = redactor.shaped(&r.hottest_key, &shapes);
    }
    for k in &mut s.hot_keys {
        k.key = redactor.shaped(&k.key, &shapes);
    }
}
