//! What the tail publishes, at most about once a second: lag,
//! `applied_through` and barriers, into its store and `tail/status.json`
//! (read by `status`, `drain`, `verify` and `cutover`).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{Tail, Turn, barrier_complete, shard_view, time};
use crate::aws::streams::{self, ShardThrough, now_secs};
use crate::phase::progress::Progress;
use crate::state::snapshot::{ShardPhase, ShardStatus, TailStatus};

impl Tail<'_> {
    /// Lag, applied_through and barriers: into the store and status.json, at
    /// most about once a second.
    pub(super) fn publish(
        &mut self,
        turn: &Turn,
        progress: &Progress,
        busy: bool,
    ) -> anyhow::Result<()> {
        let Turn {
            shards,
            states,
            finished,
            ready,
            ..
        } = turn;
        if busy
            && self
                .published
                .is_some_and(|t| t.elapsed() < Duration::from_millis(900))
        {
            return Ok(());
        }
        self.published = Some(Instant::now());
        let now = now_secs();
        let applying = self.drained()? && self.backfill_done();
        let view = shard_view(shards, &self.progress);
        let through = streams::through(&view);
        let (lag, shard_lags) = streams::lags(&view, now);
        let probe_keys = self.probe_keys.keys_for(shards);
        self.proven = through;
        if applying {
            for (id, (b, marker_at)) in self.barriers.iter_mut() {
                if b.complete_at.is_some() {
                    continue;
                }
                let start = b.started_at.unwrap_or(marker_at.floor() + 1.0);
                b.waiting_on = waiting_on(&view, start);
                if barrier_complete(b, *marker_at, through) {
                    b.complete_at = Some(now);
                }
                self.store
                    .put(&format!("tail/barrier/{id}"), &(b.clone(), *marker_at))?;
            }
        }
        let status = TailStatus {
            pid: std::process::id(),
            updated_at: time(now),
            applied_through: through.filter(|_| applying).map(time),
            lag_seconds: if applying { lag } else { None },
            backfill_done: self.backfill_done(),
            records: self.report.records,
            buffered: self.report.buffered,
            puts: self.report.puts,
            deletes: self.report.deletes,
            updates: self.report.updates,
            rejected: self.report.rejected,
            in_sync: self.report.in_sync,
            echoes: self.report.echoes,
            conflicts: self.report.conflicts,
            shards: shards
                .iter()
                .map(|s| {
                    let p = self.progress.get(&s.id).cloned().unwrap_or_default();
                    let probe_key = probe_keys.get(&s.id).copied();
                    let state = if finished.contains(&s.id) {
                        ShardPhase::Finished
                    } else if !ready.contains(&s.id) {
                        ShardPhase::Waiting
                    } else if s.closed {
                        ShardPhase::Closed
                    } else {
                        ShardPhase::Open
                    };
                    let shard_lag = shard_lags.get(&s.id).copied().flatten();
                    ShardStatus {
                        shard_id: s.id.clone(),
                        state,
                        last_sequence: states.get(&s.id).and_then(|st| st.seq.clone()),
                        last_record_at: p.record_at.map(time),
                        lag_seconds: if state == ShardPhase::Finished {
                            Some(0.0)
                        } else {
                            shard_lag
                        },
                        probe_key,
                    }
                })
                .collect(),
            barriers: self
                .barriers
                .iter()
                .map(|(k, (b, _))| (k.clone(), b.clone()))
                .collect(),
            stopped: false,
        };
        self.store.put("tail/status", &status)?;
        let path = self.opts.flow.snapshot(&self.opts.state_dir);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&status)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
        let lag_text = match status.lag_seconds {
            Some(l) => format!("lag {l:.1} s"),
            None if applying => "lag unknown".into(),
            None => "buffering until the backfill is done".into(),
        };
        progress.status(
            format!(
                "{} records, {} buffered, {lag_text}, {} shards",
                self.report.records, self.report.buffered, self.report.shards
            ),
            serde_json::to_value(&status)?,
        );
        progress.update(self.report.records, 0.0);
        Ok(())
    }
}

/// The leaf shards whose proof (or their nearest ancestor's) is older than
/// `start`, or missing: what a barrier begun then still waits for.
fn waiting_on(view: &[ShardThrough], start: f64) -> Vec<String> {
    let parents: HashSet<&str> = view.iter().filter_map(|s| s.parent).collect();
    view.iter()
        .filter(|s| !parents.contains(s.id))
        .filter(|s| {
            let mut chain = vec![(*s).clone()];
            let mut cur = s.parent;
            while let Some(p) = cur.and_then(|p| view.iter().find(|v| v.id == p)) {
                chain.push(p.clone());
                cur = p.parent;
                if chain.len() > 10_000 {
                    break;
                }
            }
            streams::through(&chain).is_none_or(|t| t < start)
        })
        .map(|s| s.id.to_string())
        .collect()
}
