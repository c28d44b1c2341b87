//! A second, short-lived reader of the source's stream: which source items
//! were written during a window, and which target keys their new images map to?
//!
//! verify's re-checks need it. A Scan is not a snapshot: an item can map to
//! target key K, move away just before the orphan pass reads it, and move back
//! before K is re-checked — the pass saw nothing map to K, yet K is the item's
//! rightful copy. Every such move is a stream record whose new image maps to K,
//! so a watch started before the pass sees it (docs/verify.md, "Orphans
//! without the prefix"). And two equal reads of an item do not prove it was not
//! written in between (A→B→A); a count of its stream records does.
//!
//! The watch starts at LATEST on the open shards and reads shards created later
//! from their trim horizon; order between shards does not matter for a set of
//! keys. `through()` follows the tail's rule: only records prove a shard read
//! past an instant (an empty page proves nothing on DynamoDB), so a caller
//! waiting on it writes probe markers (crate::phase::barrier) for quiet
//! shards to show. A watch cannot resume after a restart — LATEST is gone —
//! so the pass that depends on it is redone.

use std::collections::HashMap;

use crate::aws::Clients;
use crate::aws::streams::{
    self, ReadError, ShardInfo, ShardProgress, ShardThrough, Start, describe_shards, now_secs,
};
use crate::core::marker::marker_in;
use crate::core::plan::Plan;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::phase::markers::{PROBE_KEYS, ProbeKeys, round_size};

/// A source write seen by the watch: the item written, and the target key its
/// new image maps to (None for a delete, or an image the plan does not map).
#[derive(Debug, Clone, PartialEq)]
pub struct Touch {
    pub source_key: Item,
    pub target_key: Option<Vec<u8>>,
}

#[derive(Debug, Default)]
struct ShardWatch {
    iterator: Option<String>,
    /// The last record read: where a new iterator resumes.
    seq: Option<String>,
    finished: bool,
    parent: Option<String>,
    progress: ShardProgress,
}

pub struct Watch {
    clients: Clients,
    plan: Plan,
    stream: String,
    shards: HashMap<String, ShardWatch>,
    described_at: f64,
    /// Which probe marker reaches which shard, as this watch read them
    /// ([`ProbeKeys`]): a caller's probe then writes those alone.
    probe_keys: ProbeKeys,
}

impl Watch {
    /// Start watching the source's stream now. None when the source has no
    /// stream (then no tail runs either, and nothing can be watched).
    pub async fn start(clients: &Clients, plan: &Plan) -> anyhow::Result<Option<Watch>> {
        let info = clients.describe_table(&plan.source_table).await?;
        let Some(stream) = info.stream else {
            return Ok(None);
        };
        if !stream.view.contains("NEW") {
            anyhow::bail!(crate::phase::error::InputError(format!(
                "table `{}` streams {} records; verify reads new images from the stream \
                 (the tail needs NEW_AND_OLD_IMAGES)",
                info.name, stream.view
            )));
        }
        let stream = stream.arn;
        let described_at = now_secs();
        // The open shards' LATEST iterators, FETCHES at a time: one after
        // another they took seconds over tens of open shards, and a re-check
        // starts a watch for each pass.
        use futures::stream::{self as fs, StreamExt as _, TryStreamExt as _};
        let shards: HashMap<String, ShardWatch> =
            fs::iter(describe_shards(clients, &stream).await?)
                .map(|s| {
                    let stream = &stream;
                    async move {
                        // A shard closed now holds only writes from before the watch.
                        let iterator = match s.closed {
                            true => None,
                            false => Some(
                                streams::shard_iterator(clients, stream, &s.id, Start::Latest)
                                    .await?,
                            ),
                        };
                        let w = ShardWatch {
                            iterator,
                            finished: s.closed,
                            parent: s.parent,
                            ..Default::default()
                        };
                        anyhow::Ok((s.id, w))
                    }
                })
                .buffer_unordered(FETCHES)
                .try_collect()
                .await?;
        Ok(Some(Watch {
            clients: clients.clone(),
            plan: plan.clone(),
            stream,
            shards,
            described_at,
            probe_keys: ProbeKeys::default(),
        }))
    }

    /// One read of every shard still open: every write found, in no order.
    pub async fn poll(&mut self) -> anyhow::Result<Vec<Touch>> {
        // DescribeStream is rate-limited per account (and the tail calls it
        // too): about once a second, which is also how far `through` can lag.
        let described_at = now_secs();
        if described_at - self.described_at >= DESCRIBE_EVERY_SECONDS {
            for s in describe_shards(&self.clients, &self.stream).await? {
                // Created after the watch started: every record in it is in the window.
                self.shards.entry(s.id).or_insert_with(|| ShardWatch {
                    parent: s.parent,
                    ..Default::default()
                });
            }
            self.described_at = described_at;
        }
        let names = self.plan.source_key.names();
        let tnames = self.plan.target_key.names();
        let mut touches = Vec::new();
        let ids: Vec<String> = self
            .shards
            .iter()
            .filter(|(_, w)| !w.finished)
            .map(|(id, _)| id.clone())
            .collect();
        let work: Vec<(String, Option<String>, Option<String>)> = ids
            .into_iter()
            .map(|id| {
                let w = self.shards.get_mut(&id).expect("listed above");
                (id, w.iterator.take(), w.seq.clone())
            })
            .collect();
        let pages = self.fetch_all(work).await;
        for (id, page) in pages {
            let w = self.shards.get_mut(&id).expect("listed above");
            let page = match page {
                Ok(p) => p,
                // An expired iterator is re-made from the last record read;
                // one that never read a record started at LATEST, which
                // cannot be re-made: the watch has a gap.
                Err(ReadError::Expired) if w.seq.is_some() => continue,
                Err(e) => {
                    return Err(anyhow::Error::from(e).context(format!("watching shard {id}")));
                }
            };
            for r in page.records {
                w.seq = Some(r.seq);
                let marker = [&r.new, &r.old]
                    .into_iter()
                    .flatten()
                    .find_map(|i| marker_in(&self.plan.source_key, i));
                if let Some(m) = marker.as_ref().filter(|m| m.barrier == PROBE_KEYS) {
                    self.probe_keys.saw(&id, m.n);
                }
                if let Some(at) = r.created_at {
                    let started = marker.and_then(|m| m.started_at);
                    let at = streams::evidence(at, started);
                    w.progress.record_at = Some(w.progress.record_at.map_or(at, |p| p.max(at)));
                }
                let Some(keys) = r.keys else { continue };
                let source_key: Item = names
                    .iter()
                    .filter_map(|n| keys.get(*n).map(|v| (n.to_string(), v.clone())))
                    .collect();
                if source_key.len() != names.len() {
                    continue;
                }
                let target_key = r.new.and_then(|new| match transform(&self.plan, &new) {
                    Outcome::Put { item, .. } => encode_key(&item, &tnames),
                    _ => None,
                });
                touches.push(Touch {
                    source_key,
                    target_key,
                });
            }
            match page.next {
                Some(next) => w.iterator = Some(next),
                None => w.finished = true,
            }
        }
        Ok(touches)
    }

    /// One page of each shard of `work` (id, iterator, last record read),
    /// [`FETCHES`] at a time. Read one after another, a poll over tens of
    /// open shards (DynamoDB: one per partition, more after splits) took
    /// seconds, and verify's re-check waited on the least fresh of them.
    async fn fetch_all(
        &self,
        work: Vec<(String, Option<String>, Option<String>)>,
    ) -> Vec<(String, Result<streams::Page, ReadError>)> {
        use futures::stream::{self as fs, StreamExt as _};
        fs::iter(work)
            .map(|(id, iterator, seq)| async move {
                let it = match iterator {
                    Some(i) => i,
                    None => {
                        let start = seq.as_deref().map_or(Start::TrimHorizon, Start::After);
                        match streams::shard_iterator(&self.clients, &self.stream, &id, start).await
                        {
                            Ok(i) => i,
                            Err(e) => return (id, Err(ReadError::Aws(e))),
                        }
                    }
                };
                let page =
                    streams::get_records(&self.clients, &self.stream, &it, streams::PAGE).await;
                (id, page)
            })
            .buffered(FETCHES)
            .collect()
            .await
    }

    /// Every write created before this instant (seconds since the epoch) has
    /// been read: the least proof over the leaf shards (an empty page proves
    /// nothing; [`streams::through`]). None until every leaf has shown a record.
    pub fn through(&self) -> Option<f64> {
        let view: Vec<ShardThrough> = self
            .shards
            .iter()
            .map(|(id, w)| ShardThrough {
                id,
                parent: w.parent.as_deref(),
                record_at: w.progress.record_at,
            })
            .collect();
        streams::through(&view)
    }

    /// Shards not read to their end: a probe's round is sized by them.
    pub(crate) fn open_shards(&self) -> usize {
        self.shards.values().filter(|w| !w.finished).count()
    }

    /// The [`PROBE_KEYS`] markers that reach every shard not yet read past
    /// `want` (seconds since the epoch), when one is known for each; else
    /// a full round's first marker and size
    /// ([`ProbeKeys::targets`], [`ProbeKeys::full_round`]).
    pub(crate) fn probe_targets(&mut self, want: f64) -> Result<Vec<u32>, (u32, u32)> {
        let listing: Vec<ShardInfo> = self
            .shards
            .iter()
            .map(|(id, w)| ShardInfo {
                id: id.clone(),
                parent: w.parent.clone(),
                closed: w.finished,
            })
            .collect();
        let quiet: Vec<&str> = self
            .shards
            .iter()
            .filter(|(_, w)| !w.finished && w.progress.record_at.is_none_or(|t| t < want))
            .map(|(id, _)| id.as_str())
            .collect();
        let full = round_size(self.open_shards());
        self.probe_keys
            .targets(&quiet, &listing)
            .ok_or_else(|| (self.probe_keys.full_round(full), full))
    }
}

/// GetRecords a poll has in flight at once (DynamoDB allows 5 a second per
/// shard; a poll reads each shard once), as the tail's turn does.
const FETCHES: usize = 16;

/// How often a poll lists the stream's shards.
const DESCRIBE_EVERY_SECONDS: f64 = 1.0;
