//! The tail's probes: markers written into the table it reads when its proof
//! is old, so that quiet shards show a record and `applied_through` (which
//! cutover's gates and verify's re-checks wait on) stays current
//! (crate::phase::barrier).
//!
//! A round that reaches K shards by chance needs about K·ln K markers, each
//! a put and a delete. Written every two seconds by each tail, over tens of
//! shards, those rounds were most of the traffic a table saw from rekey
//! when the application was quiet. But a key keeps its partition, and so its
//! shard and the shard that follows it at a rollover: probes use one set of
//! keys ([`markers::PROBE_KEYS`]), the tail remembers a key it has read on
//! each shard ([`ProbeKeys`]), and when it knows one for every quiet shard
//! it writes those alone. A shard whose key stops reaching it (a split, or a
//! child listed before its sibling) gets a full round again after a few
//! targeted probes it did not show.
//!
//! Probes only ever add evidence: a shard is credited with what a marker
//! read on it carries, whichever probe wrote it, so a wrong guess costs time,
//! never soundness.

use std::time::{Duration, Instant};

use tracing::Instrument as _;

use crate::aws::streams::{ShardInfo, now_secs};
use crate::core::marker::marker_in;
use crate::core::plan::KeySchema;
use crate::phase::markers::{self, Markers, PROBE_KEYS, round_size};

use super::{Change, Tail, Turn};

/// An applying tail whose proof is older than this probes: writes a round
/// of markers into the table it reads, so that quiet shards show a record
/// and its lag and `applied_through` stay current (crate::phase::barrier).
pub(super) const PROBE_AFTER_SECONDS: f64 = 2.0;

/// The number of `c`'s marker if it is one of [`PROBE_KEYS`] (other probes'
/// keys — verify's watch writes its own — say nothing of these).
pub(super) fn key_of(key: &KeySchema, c: &Change) -> Option<u32> {
    [&c.new, &c.old]
        .into_iter()
        .flatten()
        .find_map(|i| marker_in(key, i))
        .filter(|m| m.barrier == PROBE_KEYS)
        .map(|m| m.n)
}

/// How long a stopping tail spends sweeping a probe it cut short; what is
/// left then is swept by the next run.
pub(super) const SWEEP_ON_STOP: Duration = Duration::from_secs(5);

impl Tail<'_> {
    /// A probe, when the proof is old and no probe is in flight or recent.
    /// Its markers are written by a task of its own, off the turn: a round
    /// over tens of shards against throttled partitions takes seconds, and
    /// written within the turn it held every shard's reading up that long,
    /// so the least fresh shard fell further behind than the probe helped.
    pub(super) async fn probe(&mut self, turn: &Turn) -> anyhow::Result<()> {
        if let Some(probing) = self.probing.take_if(|p| p.is_finished()) {
            probing.await.map_err(anyhow::Error::new)??;
        }
        let key = self.opts.flow.read_key(self.plan);
        if self.probing.is_some()
            || key.partition_key.ty == crate::core::value::ScalarType::N
            || !(self.drained()? && self.backfill_done())
        {
            return Ok(());
        }
        let now = now_secs();
        let after = Duration::from_secs_f64(PROBE_AFTER_SECONDS);
        if self.proven.is_some_and(|t| now - t < PROBE_AFTER_SECONDS)
            || self.probed.is_some_and(|t| t.elapsed() < after)
        {
            return Ok(());
        }
        self.probed = Some(Instant::now());
        let open: Vec<&ShardInfo> = turn
            .shards
            .iter()
            .filter(|s| !turn.finished.contains(&s.id))
            .collect();
        let quiet: Vec<&str> = open
            .iter()
            .filter(|s| {
                let at = self.progress.get(&s.id).and_then(|p| p.record_at);
                at.is_none_or(|t| now - t >= PROBE_AFTER_SECONDS)
            })
            .map(|s| s.id.as_str())
            .collect();
        let targets = self.probe_keys.targets(&quiet, &turn.shards);
        if targets.as_ref().is_some_and(Vec::is_empty) {
            return Ok(());
        }
        let size = round_size(open.len());
        let from = self.probe_keys.full_round(size);
        let clients = self.clients.clone();
        let key = key.clone();
        let table = self.opts.flow.read_table(self.plan).to_string();
        let ledger = self.opts.state_dir.markers();
        let probe = async move {
            let markers = Markers {
                clients: &clients,
                key: &key,
                table: &table,
                id: PROBE_KEYS,
                started_at: now,
                ledger: &ledger,
            };
            let (n, targeted) = match &targets {
                Some(ns) => (markers.these(ns).await?, true),
                None => (markers.round(from, size).await?, false),
            };
            tracing::debug!(markers = n, targeted, "probe written");
            Ok(())
        };
        // In the command's span, so its events carry the phase (ops::log).
        self.probing = Some(tokio::spawn(probe.in_current_span()));
        Ok(())
    }

    /// Deletes the markers of a probe that the stop cut short.
    pub(super) async fn sweep_probes(&self) -> anyhow::Result<()> {
        let ledger = self.opts.state_dir.markers();
        let table = self.opts.flow.read_table(self.plan);
        let key = self.opts.flow.read_key(self.plan);
        markers::sweep(self.clients, &ledger, table, key).await
    }
}
