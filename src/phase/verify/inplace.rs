//! `rekey verify` on an in-place plan: every item's computed attributes are
//! what the plan gives for its current inputs.
//!
//! One Scan; an item that differs is a candidate, appended to a file (not
//! kept in memory). Once the tail has applied every write up to the end of the
//! Scan (plus a second), each candidate is read again, consistently: gone or
//! now right → resolved (it was in flight); still wrong → different. If the
//! tail is not keeping up, candidates are unconfirmed. Not checkpointed: a
//! rerun scans again (an in-place verify reads each item once, no target).

use std::io::{BufRead as _, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::aws::rate::Control;
use crate::aws::scan::{self, ScanOptions};
use crate::aws::{Clients, TableInfo, item};
use crate::core::plan::Plan;
use crate::core::value::Item;
use crate::phase::error::{InputError, Stopped};
use crate::phase::inplace::{check_item, retried};
use crate::phase::progress::Progress;
use crate::state::snapshot::{Counts, VerifyResult};

use super::{TailWait, VerifyOptions, wait_for_tail};

#[derive(Debug, Clone, Serialize)]
pub struct InPlaceVerifyReport {
    #[serde(flatten)]
    pub result: VerifyResult,
    /// Candidates that were in flight and came right.
    pub resolved: u64,
    pub mismatches_file: String,
    pub notes: Vec<String>,
}

/// Verifies the table in place. Once `stop` is cancelled (Ctrl-C, SIGTERM)
/// the scan reads no new page, the re-check is abandoned, nothing is
/// published, and it returns `Stopped` (a rerun starts over: an in-place
/// verify keeps no checkpoint).
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &VerifyOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<InPlaceVerifyReport> {
    let started_at = Utc::now();
    let table = clients.describe_table(&plan.source_table).await?;
    table.check_key(&plan.source_key, "source")?;
    let read_rate = opts
        .read_rate
        .map(|r| r.resolve(&table.name, table.provisioned_read, "read"))
        .transpose()
        .map_err(InputError)?;
    std::fs::create_dir_all(opts.state_dir.verify_store())?;
    let pass = Pass {
        clients,
        plan,
        opts,
        table: &table,
        read_rate,
        candidates: opts.state_dir.in_place_candidates(),
        stop,
    };
    progress.start("verify", Some(table.item_count));
    let mut c = pass.scan(progress).await?;
    progress.finish();
    if stop.is_cancelled() {
        return Err(Stopped.into());
    }
    let scanned_by = Utc::now();
    let mut notes = Vec::new();
    let mismatches_path = opts.state_dir.mismatches();
    let mut mismatches = std::io::BufWriter::new(std::fs::File::create(&mismatches_path)?);
    let resolved = if c.pending > 0 {
        let recheck = pass.recheck(scanned_by, &mut c, &mut notes, &mut mismatches);
        stop.run_until_cancelled(recheck).await.ok_or(Stopped)??
    } else {
        0
    };
    mismatches.flush()?;
    let _ = std::fs::remove_file(&pass.candidates);
    anyhow::ensure!(c.accounted(), "verify counters do not add up: {c:?}");
    let result = VerifyResult {
        source_table: plan.source_table.clone(),
        target_table: plan.target_table.clone(),
        plan_fingerprint: plan.fingerprint.clone(),
        started_at,
        finished_at: Utc::now(),
        clean: c.differences() == 0,
        sample_percent: None,
        reverse: false,
        counts: c,
    };
    crate::state::snapshot::publish(&opts.state_dir.verify_snapshot(), &result)?;
    Ok(InPlaceVerifyReport {
        result,
        resolved,
        mismatches_file: mismatches_path.display().to_string(),
        notes,
    })
}

/// One in-place verify: what its scan and its re-check share.
struct Pass<'a> {
    clients: &'a Clients,
    plan: &'a Plan,
    opts: &'a VerifyOptions,
    table: &'a TableInfo,
    read_rate: Option<f64>,
    /// Keys of the items that differed in the scan, one JSON line each.
    candidates: PathBuf,
    stop: &'a CancellationToken,
}

impl Pass<'_> {
    /// The Scan: every item checked, differing keys appended to the candidates file.
    async fn scan(&self, progress: &Progress) -> anyhow::Result<Counts> {
        let candidates = Arc::new(Mutex::new(std::io::BufWriter::new(std::fs::File::create(
            &self.candidates,
        )?)));
        let counts = Arc::new(Mutex::new(Counts::default()));
        let scan_opts = ScanOptions {
            table: self.table.name.clone(),
            segments: self
                .opts
                .segments
                .unwrap_or_else(|| scan::default_segments(self.table.size_bytes, 4)),
            page_limit: self.opts.page_limit,
            consistent_read: false,
        };
        let plan = Arc::new(self.plan.clone());
        let (file, tally, progress) = (candidates.clone(), counts.clone(), progress.clone());
        scan::scan(
            self.clients,
            &scan_opts,
            Vec::new(),
            Arc::new(Control::new(self.read_rate, None)),
            self.stop,
            move |page| {
                let (plan, candidates, counts, progress) =
                    (plan.clone(), file.clone(), tally.clone(), progress.clone());
                async move {
                    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
                    let mut f = candidates.lock().unwrap_or_else(|e| e.into_inner());
                    for item in &page.items {
                        c.scanned += 1;
                        match check_item(&plan, item) {
                            None => c.matched += 1,
                            Some(d) => {
                                c.pending += 1;
                                serde_json::to_writer(&mut *f, &d.key)?;
                                writeln!(f)?;
                            }
                        }
                    }
                    progress.update(c.scanned, page.consumed);
                    anyhow::Ok(())
                }
            },
        )
        .await?;
        candidates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .flush()?;
        Ok(*counts.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Each candidate read again once the tail has applied every write up
    /// to the end of the scan; returns how many were resolved.
    async fn recheck(
        &self,
        scanned_by: chrono::DateTime<Utc>,
        c: &mut Counts,
        notes: &mut Vec<String>,
        mismatches: &mut impl Write,
    ) -> anyhow::Result<u64> {
        let opts = self.opts;
        let wait = wait_for_tail(
            &opts.state_dir,
            scanned_by + chrono::Duration::seconds(1),
            opts.recheck_timeout,
            opts.stale_after,
        )
        .await;
        if wait == TailWait::NoTail {
            notes.push(
                "no tail status: re-checked at once, assuming the application stopped writing"
                    .into(),
            );
        }
        let behind = match &wait {
            TailWait::Behind(why) => {
                notes.push(why.clone());
                true
            }
            _ => false,
        };
        let control = Control::new(self.read_rate, None);
        let mut resolved = 0;
        let file = std::io::BufReader::new(std::fs::File::open(&self.candidates)?);
        for line in file.lines() {
            let key: Item = serde_json::from_str(&line?)?;
            c.pending -= 1;
            let current = if behind {
                None
            } else {
                let name = self.table.name.as_str();
                let out = retried(&control, name, opts.max_retries, || {
                    item::get_item(self.clients, name, &key, true)
                })
                .await?;
                Some(out)
            };
            let (kind, diff) = match current {
                None => ("unconfirmed", None),
                Some(None) => ("resolved", None),
                Some(Some(item)) => match check_item(self.plan, &item) {
                    None => ("resolved", None),
                    Some(d) => ("different", Some(d)),
                },
            };
            match kind {
                "resolved" => {
                    resolved += 1;
                    c.matched += 1;
                    continue;
                }
                "unconfirmed" => c.unconfirmed += 1,
                _ => c.different += 1,
            }
            serde_json::to_writer(
                &mut *mismatches,
                &serde_json::json!({
                    "kind": kind,
                    "key": &key,
                    "attributes": diff.map(|d| d.attrs.iter().map(|a| a.attr.clone()).collect::<Vec<_>>()),
                }),
            )?;
            writeln!(mismatches)?;
        }
        Ok(resolved)
    }
}
