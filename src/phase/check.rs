//! `rekey check`: does the plan load, and what does it do to sample items?
//!
//! No AWS: an operator can iterate on a plan with a file of real items (an
//! export's lines, or `aws dynamodb scan` output) before touching any table.
//!
//! It also says, per rule, whether the plan can be reversed (`core::inverse`):
//! a rollback after cutover needs every target item mapped back to its source
//! item, and what makes a rule irreversible must be changed before the
//! backfill, so the place to learn it is here.

use std::path::Path;

use serde::Serialize;

use crate::core::inverse::{key_injective, plan_notes, reversibility};
use crate::core::plan::{Mode, Plan};
use crate::core::transform::{Outcome, transform};
use crate::core::value::Item;
use crate::phase::error::InputError;
use crate::state::itemfile;

#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub plan: String,
    pub fingerprint: String,
    pub rules: usize,
    /// Per rule, in plan order: can its target items be mapped back?
    pub reversibility: Vec<RuleReverse>,
    /// What holds for the plan's reverse as a whole.
    pub reverse_notes: Vec<String>,
    /// Why two source items might share a target key (the backfill then
    /// claims every target key); None when the plan proves they cannot.
    pub collisions_possible: Option<String>,
    pub items: Vec<SampleResult>,
    pub put: u64,
    pub rejected: u64,
    pub skipped: u64,
    /// Lines of the sample that were not items at all.
    pub unreadable: u64,
}

#[derive(Debug, Serialize)]
pub struct RuleReverse {
    pub rule: String,
    pub reversible: bool,
    pub reasons: Vec<ReverseReason>,
}

#[derive(Debug, Serialize)]
pub struct ReverseReason {
    pub reason: String,
    /// What to change in the plan.
    pub fix: String,
    /// Every item of the rule is lost (else only some are ambiguous).
    pub every_item: bool,
}

#[derive(Debug, Serialize)]
pub struct SampleResult {
    pub line: usize,
    pub outcome: &'static str,
    pub rule: Option<String>,
    pub before: Option<Item>,
    pub after: Option<Item>,
    pub reason: Option<String>,
}

pub fn run(plan: &Plan, sample: Option<&Path>) -> anyhow::Result<CheckReport> {
    let mut r = CheckReport {
        plan: plan.path.display().to_string(),
        fingerprint: plan.fingerprint.clone(),
        rules: plan.rules.len(),
        reversibility: reversibility(plan)
            .into_iter()
            .map(|r| RuleReverse {
                reversible: r.reversible(),
                rule: r.rule,
                reasons: r
                    .reasons
                    .iter()
                    .map(|why| ReverseReason {
                        reason: why.to_string(),
                        fix: why.fix(),
                        every_item: why.every_item(),
                    })
                    .collect(),
            })
            .collect(),
        reverse_notes: plan_notes(plan),
        collisions_possible: (plan.mode == Mode::Rekey)
            .then(|| key_injective(plan).err())
            .flatten(),
        items: Vec::new(),
        put: 0,
        rejected: 0,
        skipped: 0,
        unreadable: 0,
    };
    let Some(sample) = sample else { return Ok(r) };
    let entries = itemfile::read_file(sample).map_err(|e| InputError(format!("{e:#}")))?;
    for e in entries {
        let item = match e.item {
            Ok(i) => i,
            Err(msg) => {
                r.unreadable += 1;
                r.items.push(SampleResult {
                    line: e.line,
                    outcome: "unreadable",
                    rule: None,
                    before: None,
                    after: None,
                    reason: Some(format!("{}:{}: {msg}", sample.display(), e.line)),
                });
                continue;
            }
        };
        let res = match transform(plan, &item) {
            Outcome::Put { rule, item: after } => {
                r.put += 1;
                SampleResult {
                    line: e.line,
                    outcome: "put",
                    rule: Some(rule.map_or_else(
                        || "(unmatched, copied)".to_string(),
                        |i| plan.rules[i].name.clone(),
                    )),
                    before: Some(item),
                    after: Some(after),
                    reason: None,
                }
            }
            Outcome::Reject(rej) => {
                r.rejected += 1;
                SampleResult {
                    line: e.line,
                    outcome: "reject",
                    rule: rej.rule.clone(),
                    before: Some(item),
                    after: None,
                    reason: Some(rej.to_string()),
                }
            }
            Outcome::Skip => {
                r.skipped += 1;
                SampleResult {
                    line: e.line,
                    outcome: "skip",
                    rule: None,
                    before: Some(item),
                    after: None,
                    reason: Some("no rule matched (skipped)".into()),
                }
            }
        };
        r.items.push(res);
    }
    Ok(r)
}

pub fn render(plan: &Plan, r: &CheckReport) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let mode = match plan.mode {
        Mode::Rekey => format!(
            "re-key {} [{}] → {} [{}]",
            plan.source_table, plan.source_key, plan.target_table, plan.target_key
        ),
        Mode::InPlace => format!("in place on {} [{}]", plan.source_table, plan.source_key),
    };
    let _ = writeln!(
        o,
        "{}: OK — {mode}, {} rules, fingerprint {}",
        r.plan, r.rules, r.fingerprint
    );
    if plan.mode == Mode::Rekey {
        let _ = match &r.collisions_possible {
            None => writeln!(
                o,
                "collisions: impossible — each target key holds its source key whole (no claim index)"
            ),
            Some(why) => writeln!(
                o,
                "collisions: possible ({why}) — the backfill claims every target key"
            ),
        };
    }
    render_reversibility(&mut o, r);
    for s in &r.items {
        let json = |i: &Option<Item>| {
            i.as_ref()
                .map(|i| serde_json::to_string(i).unwrap_or_default())
                .unwrap_or_default()
        };
        match s.outcome {
            "put" => {
                let _ = writeln!(
                    o,
                    "line {}: rule {}",
                    s.line,
                    s.rule.as_deref().unwrap_or("")
                );
                let _ = writeln!(o, "  before: {}", json(&s.before));
                let _ = writeln!(o, "  after:  {}", json(&s.after));
            }
            _ => {
                let _ = writeln!(
                    o,
                    "line {}: {} — {}",
                    s.line,
                    s.outcome.to_uppercase(),
                    s.reason.as_deref().unwrap_or("")
                );
                if s.before.is_some() {
                    let _ = writeln!(o, "  before: {}", json(&s.before));
                }
            }
        }
    }
    if !r.items.is_empty() {
        let _ = writeln!(
            o,
            "{} items: {} put, {} rejected, {} skipped, {} unreadable",
            r.items.len(),
            r.put,
            r.rejected,
            r.skipped,
            r.unreadable
        );
    }
    o
}

/// Per rule: "reversible", or each reason with what to change.
fn render_reversibility(o: &mut String, r: &CheckReport) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "reversibility (a rollback after cutover maps target items back):"
    );
    for rule in &r.reversibility {
        if rule.reversible {
            let _ = writeln!(o, "  rule {}: reversible", rule.rule);
            continue;
        }
        let _ = writeln!(o, "  rule {}: not reversible", rule.rule);
        for why in &rule.reasons {
            let _ = writeln!(o, "    - {}", why.reason);
            let _ = writeln!(o, "      change: {}", why.fix);
        }
    }
    for note in &r.reverse_notes {
        let _ = writeln!(o, "  note: {note}");
    }
}
