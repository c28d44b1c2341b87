//! The reverse tail's start line: where in the target's stream the
//! application's writes begin.
//!
//! Until the cutover only rekey writes the target: the backfill, and the
//! forward tail, which announces its writes in its echo ledger only once a
//! reverse tail exists (`guard`). The reverse tail must write none of those
//! back. Read from its oldest record, the target's stream holds them as if
//! the application had made them, and applying them is wrong whenever the
//! forward tail lags: an order the application deleted from the source, not
//! yet deleted from the target, is written back into the source
//! (`rollback::a_reverse_tail_never_writes_back_what_rekey_wrote_to_the_target_before_it_started`).
//!
//! So the reverse tail starts at a line drawn before the application can
//! write the target: by the cutover (before it is recorded), or by the first
//! reverse tail, whichever comes first. Drawing it:
//!
//! 1. Take a LATEST iterator on every open shard of the target's stream.
//! 2. Create the reverse store's folder: from its next page on, the forward
//!    tail announces every write (`Tail::guarded`).
//! 3. If a forward tail runs, wait for its next status: it publishes
//!    between pages, so every page it applied unannounced was done by then,
//!    and every page after is announced. (A forward tail started after step
//!    2 announces from its first page.)
//! 4. Write marker items into the target, in rounds, until every open shard
//!    has shown one (a child of a shard that has holds only later writes).
//!    On each shard, everything before its first marker is rekey's; what the
//!    forward tail announced of it is recorded (`taken`), so the reverse
//!    tail counts it as taken instead of waiting for it forever.
//! 5. Record the line (`<state dir>/reverse/line.json`): per shard, the
//!    marker's sequence number, after which the reverse tail starts; the
//!    shards that closed before any marker reached them, which it skips.
//!
//! Invariant: every target record after the line on its shard is either an
//! announced forward write or a write of the application's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::aws::Clients;
use crate::aws::streams::{self, ReadError, ShardInfo, Start, now_secs};
use crate::core::marker::marker_in;
use crate::core::plan::{Mode, Plan};
use crate::phase::markers::{Markers, ROUND_EVERY, new_probe_id, round_size};
use crate::state::StateDir;
use crate::state::echoes::{Entry, entry};
use crate::state::snapshot::{self, TailStatus};

use super::{Flow, Mapper, change_of};

/// The line, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Line {
    /// Its markers' barrier id.
    pub id: String,
    pub drawn_at: f64,
    /// Bytes of the forward tail's echo ledger before step 2: announcements
    /// from before are of no record the reverse tail reads.
    pub ledger_from: u64,
    /// Shard → the sequence number of its first marker.
    pub lined: BTreeMap<String, String>,
    /// Shards wholly before the line.
    pub before: Vec<String>,
    /// Echo entries of the records before the line that were read.
    pub taken: Vec<Entry>,
}

/// Whether the migration can be rolled back: a re-key plan whose every rule
/// reads back, and a target with a NEW_AND_OLD_IMAGES stream. Else why not.
pub async fn reversible(clients: &Clients, plan: &Plan) -> anyhow::Result<Result<(), String>> {
    if plan.mode == Mode::InPlace {
        return Ok(Err("the plan is in place".into()));
    }
    if crate::core::inverse::reversibility(plan)
        .iter()
        .any(|r| !r.reversible())
    {
        return Ok(Err(
            "a rule is not reversible (`rekey check` says which)".into()
        ));
    }
    let info = clients.describe_table(&plan.target_table).await?;
    if info
        .stream
        .as_ref()
        .is_some_and(|s| s.view == "NEW_AND_OLD_IMAGES")
    {
        return Ok(Ok(()));
    }
    Ok(Err(format!(
        "`{}` has no NEW_AND_OLD_IMAGES stream (aws dynamodb update-table --table-name {} \
         --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES)",
        plan.target_table, plan.target_table
    )))
}

/// The recorded line, or a new one drawn (module docs) within `timeout`.
pub async fn ensure(
    clients: &Clients,
    plan: &Plan,
    dir: &StateDir,
    timeout: Duration,
) -> anyhow::Result<Line> {
    let path = dir.reverse_line();
    if let Some(line) = snapshot::read::<Line>(&path)? {
        return Ok(line);
    }
    if dir.cutover_record().exists() {
        tracing::warn!(
            "the reverse tail's start line is drawn after the cutover: writes the application made \
             to `{}` before now are not carried back to the source",
            plan.target_table
        );
    }
    let started = Instant::now();
    let info = clients.describe_table(&plan.target_table).await?;
    let stream = super::source_stream(&info, Flow::Reverse)?;
    let mut reading = Reading::default();
    let at_start = streams::describe_shards(clients, &stream).await?;
    for s in at_start.iter().filter(|s| !s.closed) {
        let it = streams::shard_iterator(clients, &stream, &s.id, Start::Latest).await?;
        reading.iterators.insert(s.id.clone(), it);
    }
    reading.known = at_start.into_iter().map(|s| s.id).collect();
    let ledger = Flow::Forward.ledger(dir);
    let ledger_from = std::fs::metadata(&ledger).map_or(0, |m| m.len());
    let guarded_at = chrono::Utc::now();
    std::fs::create_dir_all(dir.reverse_store())?;
    forward_guarded(dir, guarded_at, timeout.saturating_sub(started.elapsed())).await?;
    let id = new_probe_id();
    let markers_ledger = dir.markers();
    let markers = Markers {
        clients,
        key: &plan.target_key,
        table: &plan.target_table,
        id: &id,
        started_at: now_secs(),
        ledger: &markers_ledger,
    };
    let mapper = Mapper::new(plan, Flow::Reverse);
    let mut written = 0;
    let mut round_at: Option<Instant> = None;
    loop {
        let shards = streams::describe_shards(clients, &stream).await?;
        reading.follow_new(clients, &stream, &shards).await?;
        reading.read(clients, &stream, &id, &mapper).await?;
        let waiting = reading.waiting(&shards);
        if waiting.is_empty() {
            let line = Line {
                id,
                drawn_at: now_secs(),
                ledger_from,
                before: reading.before(&shards),
                lined: reading.lined,
                taken: reading.taken,
            };
            snapshot::publish(&path, &line)?;
            return Ok(line);
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "drawing the reverse tail's start line through `{}`'s stream: no marker reached shard(s) {} within {:.0} s",
            plan.target_table,
            waiting.join(", "),
            timeout.as_secs_f64()
        );
        if round_at.is_none_or(|at| at.elapsed() >= ROUND_EVERY) {
            let open = shards.iter().filter(|s| !s.closed).count();
            written += markers.round(written, round_size(open)).await?;
            round_at = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Step 3: returns once no forward tail runs, or the one that runs has
/// published its status since `since`.
async fn forward_guarded(
    dir: &StateDir,
    since: chrono::DateTime<chrono::Utc>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        match snapshot::read::<TailStatus>(&Flow::Forward.snapshot(dir))? {
            Some(s) if !s.stopped && snapshot::alive(s.pid) && s.updated_at <= since => {}
            _ => return Ok(()),
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "drawing the reverse tail's start line: the tail (pid in {}) has not published its status for {:.0} s",
            Flow::Forward.snapshot(dir).display(),
            timeout.as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The shards being read up to their first marker.
#[derive(Default)]
struct Reading {
    /// Every shard listed when the line began.
    known: HashSet<String>,
    iterators: HashMap<String, String>,
    /// Read to their end without a marker.
    closed: HashSet<String>,
    lined: BTreeMap<String, String>,
    taken: Vec<Entry>,
}

impl Reading {
    /// A shard begun since (a split of a shard with no marker yet) is read
    /// from its start; a child of a lined shard is after the line.
    async fn follow_new(
        &mut self,
        clients: &Clients,
        stream: &str,
        shards: &[ShardInfo],
    ) -> anyhow::Result<()> {
        for s in shards {
            let new = !self.known.contains(&s.id) && !self.iterators.contains_key(&s.id);
            if new && !self.closed.contains(&s.id) && !self.after_line(shards, &s.id) {
                let it =
                    streams::shard_iterator(clients, stream, &s.id, Start::TrimHorizon).await?;
                self.iterators.insert(s.id.clone(), it);
            }
        }
        Ok(())
    }

    /// Reads every shard not yet lined as far as it goes now.
    async fn read(
        &mut self,
        clients: &Clients,
        stream: &str,
        id: &str,
        mapper: &Mapper<'_>,
    ) -> anyhow::Result<()> {
        let ids: Vec<String> = self.iterators.keys().cloned().collect();
        for shard in ids {
            let mut it = self.iterators.remove(&shard).unwrap_or_default();
            loop {
                let page = match streams::get_records(clients, stream, &it, streams::PAGE).await {
                    Ok(p) => p,
                    Err(ReadError::Aws(e)) => return Err(e.into()),
                    // Nothing is recorded until the line is whole: a rerun draws it anew.
                    Err(e) => anyhow::bail!(
                        "drawing the reverse tail's start line, shard {shard}: {e}; run the command again"
                    ),
                };
                let count = page.records.len();
                let mut marker = None;
                for r in page.records {
                    let (seq, c) = change_of(r);
                    let Some(any) = c.new.as_ref().or(c.old.as_ref()) else {
                        continue;
                    };
                    if marker_in(&mapper.plan.target_key, any).is_some_and(|m| m.barrier == id) {
                        marker = Some(seq);
                        break;
                    }
                    let image = c
                        .new
                        .as_ref()
                        .filter(|_| c.kind != super::ChangeKind::Remove);
                    self.taken.push(entry(&mapper.read_key_of(any), image));
                }
                if let Some(seq) = marker {
                    self.lined.insert(shard.clone(), seq);
                    break;
                }
                match page.next {
                    None => {
                        self.closed.insert(shard.clone());
                        break;
                    }
                    Some(next) if count == 0 => {
                        self.iterators.insert(shard.clone(), next);
                        break;
                    }
                    Some(next) => it = next,
                }
            }
        }
        Ok(())
    }

    fn after_line(&self, shards: &[ShardInfo], id: &str) -> bool {
        let parent = |id: &str| shards.iter().find(|s| s.id == id)?.parent.clone();
        let mut at = parent(id);
        while let Some(p) = at {
            if self.lined.contains_key(&p) {
                return true;
            }
            at = parent(&p);
        }
        false
    }

    /// Open shards neither lined nor after the line.
    fn waiting(&self, shards: &[ShardInfo]) -> Vec<String> {
        shards
            .iter()
            .filter(|s| !s.closed && !self.lined.contains_key(&s.id))
            .filter(|s| !self.after_line(shards, &s.id))
            .map(|s| s.id.clone())
            .collect()
    }

    /// Listed shards neither lined nor after the line: all closed by now.
    fn before(&self, shards: &[ShardInfo]) -> Vec<String> {
        shards
            .iter()
            .filter(|s| !self.lined.contains_key(&s.id) && !self.after_line(shards, &s.id))
            .map(|s| s.id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parent: Option<&str>, closed: bool) -> ShardInfo {
        ShardInfo {
            id: id.into(),
            parent: parent.map(Into::into),
            closed,
        }
    }

    #[test]
    fn children_of_a_lined_shard_are_after_the_line_and_a_shard_closed_unmarked_is_before() {
        // a (closed before any marker) → b (lined) → c (open, after the line);
        // d open without a marker yet; e closed before the line began.
        let shards = [
            shard("a", None, true),
            shard("b", Some("a"), true),
            shard("c", Some("b"), false),
            shard("d", None, false),
            shard("e", None, true),
        ];
        let mut r = Reading::default();
        r.lined.insert("b".into(), "17".into());
        assert!(r.after_line(&shards, "c"));
        assert!(!r.after_line(&shards, "b") && !r.after_line(&shards, "d"));
        assert_eq!(r.waiting(&shards), ["d"]);
        r.lined.insert("d".into(), "3".into());
        assert!(r.waiting(&shards).is_empty());
        assert_eq!(r.before(&shards), ["a", "e"]);
    }
}
