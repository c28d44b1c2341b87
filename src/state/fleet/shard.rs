//! The fleet's tail: one leased unit per stream shard (issue 15, item 2).
//!
//! Items under the migration's `pk = MIG#<id>`:
//! - `SHARD#<shardId>`: parent shard id, owner, lease counter, beat, `page`
//!   (commits so far: a grant starts at one, as a unit's does), `seq` (the
//!   last sequence number buffered or applied: where a new holder resumes),
//!   `chunks` (buffer chunks committed), `applied` (the apply cursor: chunks
//!   applied, in order), `finished` (closed and read to its end), `live`
//!   (records are applied as read), `done` (finished and everything
//!   applied), the progress `status` shows (newest record applied, last empty
//!   read) and `grants`, the lease history, as a unit's;
//!   `drains`, a counter its holder bumps each time a read found the shard
//!   at its end with everything read applied, and `barrier:<id>`, one
//!   attribute per drain barrier whose marker its holder applied (the
//!   marker's creation time): both written by the fenced commit itself
//!   ([`crate::phase::barrier::fleet`] says why that is enough).
//!
//! Buffer chunks are items of their own partition, `pk = BUF#<id>#<shardId>`,
//! `sk = <chunk n>` (zero-padded): the migration's Query, which every worker
//! runs on every beat, never reads them. A chunk is the records of one
//! GetRecords response (or a part of one), JSON, deflated, < [`CHUNK_LIMIT`].
//!
//! The buffer protocol: write chunk n (conditional on no newer lease having
//! written it), then commit `{seq, chunks = n + 1}` conditional on the lease
//! and on `chunks = n` (the fence). A holder that dies between the two leaves
//! chunk n uncommitted: the next holder deletes it when it takes the shard
//! (it may go live and never write chunk n), then reads again from `seq`.
//! Applying moves the cursor the same way: apply chunk k, commit
//! `applied = k + 1`, then delete chunk k (a chunk left by a death between
//! the commit and the delete is below the cursor, never read again).

use std::collections::{BTreeMap, HashMap, HashSet};

use std::io::{Read as _, Write as _};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::held::HeldKey;
use super::lease::leased;
use super::{
    Fleet, FleetError, Grant, Judged, PK, SK, exprs, fnum, grants_of, inum, n, num, s, text,
    wall_ms,
};
use crate::aws::control::Cond;
use crate::aws::streams::{self, ShardInfo, ShardThrough, ready_shards};
use crate::core::value::{Item, Value};

/// A buffer chunk's largest compressed size: under DynamoDB's 400 KB item
/// limit with room for its key and attributes.
pub(crate) const CHUNK_LIMIT: usize = 350_000;

/// A shard as a held key: `SHARD#<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ShardKey(pub String);

impl HeldKey for ShardKey {
    fn sk(&self, _: &Fleet) -> String {
        shard_sk(&self.0)
    }
}

fn shard_sk(id: &str) -> String {
    format!("SHARD#{id}")
}

/// Where a shard stands: what its holder commits, conditional on its lease.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ShardCheckpoint {
    /// The last sequence number buffered or applied: where a holder resumes.
    pub seq: Option<String>,
    /// Buffer chunks committed.
    pub chunks: u64,
    /// Chunks applied, in order: the apply cursor.
    pub applied: u64,
    /// Closed and read to its end.
    pub finished: bool,
    /// Records are applied as read.
    pub live: bool,
    /// Finished and everything applied.
    pub done: bool,
    /// Creation time of the newest record applied (epoch seconds).
    pub record_at: Option<f64>,
    /// Start of the last read that found nothing new, while live.
    pub empty_read_at: Option<f64>,
    /// Reads that found the shard at its end with everything read applied
    /// (live), as committed: what a fleet drain barrier counts, instead of
    /// comparing the holders' clocks.
    pub drains: u64,
}

/// What a shard commit covers besides its checkpoint.
#[derive(Debug, Clone, Default)]
pub(crate) struct Covers {
    /// Writes to the target (the first such commit records `first_apply_ms`).
    pub applies: bool,
    /// Drain barriers whose marker was among the records applied: (barrier
    /// id, the marker's creation time). Recorded in the same fenced write.
    pub observed: Vec<(String, f64)>,
    /// Rejects the writes made (added to the shard's `rejected`): counted
    /// once, by the commit that covers them — a refused commit's are not.
    pub rejected: u64,
}

/// The attribute of a shard item that records barrier `id`'s observation.
pub(crate) fn barrier_attr(id: &str) -> String {
    format!("{BARRIER_ATTR}{id}")
}

const BARRIER_ATTR: &str = "barrier:";

/// One shard's unit, as read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardUnit {
    pub id: String,
    pub parent: Option<String>,
    pub owner: Option<String>,
    pub lease: u64,
    pub beat: u64,
    /// Commits so far (where a grant starts).
    pub page: u64,
    #[serde(flatten)]
    pub cp: ShardCheckpoint,
    /// When its holder first applied (epoch ms, the holder's clock).
    pub first_apply_ms: Option<i64>,
    /// When it was done (epoch ms, the holder's clock).
    pub done_ms: Option<i64>,
    pub grants: Vec<Grant>,
    /// Drain barriers observed in this shard: id → the marker's creation time.
    pub barriers: BTreeMap<String, f64>,
    /// The tail's rejects in this shard, as committed (what `cutover
    /// --state` counts: each worker's rejects file is on its machine).
    pub rejected: u64,
}

leased!(ShardUnit, String, id, cp.done);

/// How long DynamoDB Streams keeps a record: 24 hours.
pub(crate) const RETENTION_MS: i64 = 24 * 3600 * 1000;

/// Whether records of `u` may have been trimmed from the stream while no
/// worker held it: not done, taken before, and its last lease ended (as its
/// holder last renewed it) longer than the stream's retention before
/// `now_ms`. Resuming from its checkpoint would then skip the trimmed
/// records without a word, so the fleet stops instead (as one machine's tail
/// does with a checkpoint that old). The workers' clocks are compared here,
/// but across 24 hours, not seconds.
pub(crate) fn unheld_past_retention(u: &ShardUnit, now_ms: i64) -> bool {
    let last_held = u.grants.iter().map(|g| g.until_ms).max();
    !u.cp.done && last_held.is_some_and(|t| now_ms - t > RETENTION_MS)
}

/// What the holder of a shard does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read and buffer: the fleet's backfill (or the parent shard) is not done.
    Buffer,
    /// Finished reading, nothing to apply yet: wait for the backfill or the parent.
    Wait,
    /// Apply buffer chunk n (the cursor).
    Apply(u64),
    /// Read and apply as read.
    Live,
    /// Read to its end and everything applied: commit done.
    Finish,
    Done,
}

/// The holder's next step: apply only once the fleet's backfill is done and
/// the parent shard is done (or unknown: trimmed away), the buffer first, in
/// order; buffer meanwhile.
pub fn step(u: &ShardUnit, backfill_done: bool, parent_done: bool) -> Step {
    if u.cp.done {
        Step::Done
    } else if !backfill_done || !parent_done {
        if u.cp.finished {
            Step::Wait
        } else {
            Step::Buffer
        }
    } else if u.cp.applied < u.cp.chunks {
        Step::Apply(u.cp.applied)
    } else if u.cp.finished {
        Step::Finish
    } else {
        Step::Live
    }
}

fn infos(shards: &[ShardUnit]) -> Vec<ShardInfo> {
    shards
        .iter()
        .map(|s| ShardInfo {
            id: s.id.clone(),
            parent: s.parent.clone(),
            closed: s.cp.finished,
        })
        .collect()
}

/// Shards a worker may take: not done, and whose parent is read to its end
/// (its records all buffered or applied) or unknown. A child is taken while
/// its parent's buffer waits, so that it is read within the stream's
/// retention however long the backfill takes; it applies only once its
/// parent is done ([`may_apply`]).
pub(crate) fn may_take(shards: &[ShardUnit]) -> Vec<String> {
    let by_id: HashMap<&str, &ShardUnit> = shards.iter().map(|s| (s.id.as_str(), s)).collect();
    shards
        .iter()
        .filter(|s| !s.cp.done)
        .filter(|s| match s.parent.as_deref().and_then(|p| by_id.get(p)) {
            Some(parent) => parent.cp.finished,
            None => true,
        })
        .map(|s| s.id.clone())
        .collect()
}

/// Whether `id`'s records may be applied: its parent is done or unknown
/// (the lineage order, from the control table, across workers).
pub(crate) fn may_apply(shards: &[ShardUnit], id: &str) -> bool {
    let done: HashSet<String> = shards
        .iter()
        .filter(|s| s.cp.done)
        .map(|s| s.id.clone())
        .collect();
    ready_shards(&infos(shards), &done).iter().any(|r| r == id)
}

/// Lag and `applied_through` of the fleet's tail: the least proof over the
/// leaf shards ([`streams::through`]; an empty read proves nothing). A shard
/// still buffering (not live, not done) holds `applied_through` back (None):
/// its records are not applied yet.
pub(crate) fn fleet_through(shards: &[ShardUnit], now: f64) -> (Option<f64>, Option<f64>) {
    let view: Vec<ShardThrough> = shards
        .iter()
        .map(|s| ShardThrough {
            id: &s.id,
            parent: s.parent.as_deref(),
            record_at: s.cp.record_at,
        })
        .collect();
    // Lag over the live shards (a buffering one's shows once it applies).
    let live: Vec<ShardThrough> = view
        .iter()
        .zip(shards)
        .filter(|(_, s)| s.cp.done || s.cp.live)
        .map(|(v, _)| v.clone())
        .collect();
    let lag = streams::through(&live).map(|t| (now - t).max(0.0));
    let buffering = shards.iter().any(|s| !s.cp.done && !s.cp.live);
    if buffering || shards.is_empty() {
        return (lag, None);
    }
    (lag, streams::through(&view))
}

/// The records, as deflated JSON chunks each under `limit` bytes: (end
/// index, bytes) in order, covering every record. A record that alone is
/// over the limit is an error.
pub fn pack<T: Serialize>(records: &[T], limit: usize) -> Result<Vec<(usize, Vec<u8>)>, String> {
    let mut out = Vec::new();
    pack_into(records, 0, limit, &mut out)?;
    Ok(out)
}

fn pack_into<T: Serialize>(
    records: &[T],
    offset: usize,
    limit: usize,
    out: &mut Vec<(usize, Vec<u8>)>,
) -> Result<(), String> {
    if records.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_vec(records).map_err(|e| e.to_string())?;
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&json).map_err(|e| e.to_string())?;
    let bytes = z.finish().map_err(|e| e.to_string())?;
    if bytes.len() < limit {
        out.push((offset + records.len(), bytes));
        return Ok(());
    }
    if records.len() == 1 {
        return Err(format!(
            "one stream record is {} bytes compressed, over the buffer chunk's {limit}",
            bytes.len()
        ));
    }
    let half = records.len() / 2;
    pack_into(&records[..half], offset, limit, out)?;
    pack_into(&records[half..], offset + half, limit, out)
}

/// A chunk's records.
pub(crate) fn unpack<T: DeserializeOwned>(bytes: &[u8]) -> Result<Vec<T>, String> {
    let mut json = Vec::new();
    flate2::read::DeflateDecoder::new(bytes)
        .read_to_end(&mut json)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

impl Fleet {
    fn buf_pk(&self, shard: &str) -> String {
        format!("BUF#{}#{shard}", self.at.migration)
    }

    /// Creates `shard`'s unit unless it exists (any worker that lists the
    /// stream may; the first write wins, the others change nothing).
    pub async fn create_shard(&self, shard: &ShardInfo) -> Result<(), FleetError> {
        let mut it = Item::new();
        it.insert(PK.into(), s(&self.pk()));
        it.insert(SK.into(), s(&shard_sk(&shard.id)));
        it.insert("shard".into(), s(&shard.id));
        if let Some(p) = &shard.parent {
            it.insert("parent".into(), s(p));
        }
        for name in ["lease", "beat", "page", "chunks", "applied", "drains"] {
            it.insert(name.into(), n(0));
        }
        for name in ["finished", "live", "done"] {
            it.insert(name.into(), Value::Bool(false));
        }
        it.insert("grants".into(), Value::M(Item::new()));
        let first = exprs("", "attribute_not_exists(#pk)", &["pk"], vec![]);
        self.control.put_if(&it, &first).await?;
        Ok(())
    }

    /// Every shard's unit, read consistently.
    pub(crate) async fn read_shards(&self) -> Result<Vec<ShardUnit>, FleetError> {
        let items = self.control.query_prefix(&self.pk(), "SHARD#").await?;
        Ok(items.iter().map(shard_of).collect())
    }

    /// Takes `u` (see [`Fleet::take`]): the new lease, or None.
    pub async fn take_shard(
        &self,
        u: &ShardUnit,
        expired: Option<u64>,
        fence: std::time::Duration,
    ) -> Result<Option<u64>, FleetError> {
        let at = Judged {
            sk: shard_sk(&u.id),
            owner: u.owner.clone(),
            lease: u.lease,
            page: u.page,
        };
        Ok(self
            .take_at(&at, expired, fence)
            .await?
            .then_some(u.lease + 1))
    }

    /// Writes buffer chunk `n` of `shard` under `lease`: refused when a
    /// newer lease has written it (this holder's lease is gone).
    pub async fn put_chunk(
        &self,
        shard: &str,
        chunk: u64,
        lease: u64,
        bytes: Vec<u8>,
    ) -> Result<Cond, FleetError> {
        let mut it = Item::new();
        it.insert(PK.into(), s(&self.buf_pk(shard)));
        it.insert(SK.into(), s(&format!("{chunk:010}")));
        it.insert("lease".into(), n(lease));
        it.insert("data".into(), Value::B(bytes));
        let e = exprs(
            "",
            "attribute_not_exists(#pk) OR #lease <= :lease",
            &["pk", "lease"],
            vec![(":lease", n(lease))],
        );
        Ok(self.control.put_if(&it, &e).await?)
    }

    /// Buffer chunk `n` of `shard`, deflated.
    pub(crate) async fn get_chunk(&self, shard: &str, chunk: u64) -> Result<Vec<u8>, FleetError> {
        let sk = format!("{chunk:010}");
        let it = self.control.get(&self.buf_pk(shard), &sk).await?;
        match it.and_then(|mut i| i.remove("data")) {
            Some(Value::B(b)) => Ok(b),
            _ => Err(self.malformed(
                &format!("{} {sk}", self.buf_pk(shard)),
                "a committed buffer chunk is missing",
            )),
        }
    }

    /// Deletes an applied chunk (below the apply cursor: never read again).
    pub(crate) async fn delete_chunk(&self, shard: &str, chunk: u64) -> Result<(), FleetError> {
        let sk = format!("{chunk:010}");
        Ok(self.control.delete(&self.buf_pk(shard), &sk).await?)
    }

    /// Commits `c` for `shard` under `lease`, if the lease is still this
    /// worker's and the checkpoint is still `was` (its chunk count and
    /// cursor): the fence. Refused: the lease is gone and nothing moved.
    /// `covers`: writes to the target and barriers observed, recorded in
    /// the same write.
    pub(crate) async fn commit_shard(
        &self,
        shard: &str,
        lease: u64,
        was: &ShardCheckpoint,
        c: &ShardCheckpoint,
        covers: &Covers,
    ) -> Result<Cond, FleetError> {
        let now = wall_ms();
        let mut update = String::from(
            "SET #chunks = :chunks, #applied = :applied, #finished = :finished, #live = :live, \
             #done = :done, #drains = :drains, #page = #page + :one",
        );
        let mut values = vec![
            (":me", s(&self.worker)),
            (":lease", n(lease)),
            (":was_chunks", n(was.chunks)),
            (":was_applied", n(was.applied)),
            (":chunks", n(c.chunks)),
            (":applied", n(c.applied)),
            (":finished", Value::Bool(c.finished)),
            (":live", Value::Bool(c.live)),
            (":done", Value::Bool(c.done)),
            (":drains", n(c.drains)),
            (":one", n(1)),
        ];
        let mut names = vec![
            "owner", "lease", "chunks", "applied", "finished", "live", "done", "drains", "page",
        ];
        let optional = [
            ("seq", c.seq.as_ref().map(|x| s(x))),
            ("record_at", c.record_at.map(n)),
            ("empty_read_at", c.empty_read_at.map(n)),
            ("done_ms", c.done.then(|| n(now))),
        ];
        for (name, v) in optional {
            if let Some(v) = v {
                update.push_str(&format!(", #{name} = :{name}"));
                names.push(name);
                values.push((placeholder(name), v));
            }
        }
        if covers.applies {
            update.push_str(", #first_apply_ms = if_not_exists(#first_apply_ms, :now)");
            names.push("first_apply_ms");
            values.push((":now", n(now)));
        }
        let mut e = exprs(
            &update,
            "#owner = :me AND #lease = :lease AND #chunks = :was_chunks AND #applied = :was_applied",
            &names,
            values,
        );
        if covers.rejected > 0 {
            e.update
                .push_str(", #rejected = if_not_exists(#rejected, :zero) + :rejected");
            e.names.insert("#rejected".into(), "rejected".into());
            e.values.insert(":rejected".into(), n(covers.rejected));
            e.values.insert(":zero".into(), n(0));
        }
        for (i, (id, at)) in covers.observed.iter().enumerate() {
            e.update.push_str(&format!(", #bar{i} = :bar{i}"));
            e.names.insert(format!("#bar{i}"), barrier_attr(id));
            e.values.insert(format!(":bar{i}"), n(at));
        }
        Ok(self
            .control
            .update_if(&self.pk(), &shard_sk(shard), &e)
            .await?)
    }
}

/// The placeholder of an optional attribute (from a fixed set of names).
fn placeholder(name: &str) -> &'static str {
    match name {
        "seq" => ":seq",
        "record_at" => ":record_at",
        "empty_read_at" => ":empty_read_at",
        _ => ":done_ms",
    }
}

pub(super) fn shard_of(it: &Item) -> ShardUnit {
    let b = |x: &str| matches!(it.get(x), Some(Value::Bool(true)));
    let f = |x: &str| it.contains_key(x).then(|| fnum(it, x));
    let ms = |x: &str| it.contains_key(x).then(|| inum(it, x));
    ShardUnit {
        id: text(it, "shard").unwrap_or_default().into(),
        parent: text(it, "parent").map(str::to_string),
        owner: text(it, "owner").map(str::to_string),
        lease: num(it, "lease"),
        beat: num(it, "beat"),
        page: num(it, "page"),
        cp: ShardCheckpoint {
            seq: text(it, "seq").map(str::to_string),
            chunks: num(it, "chunks"),
            applied: num(it, "applied"),
            finished: b("finished"),
            live: b("live"),
            done: b("done"),
            record_at: f("record_at"),
            empty_read_at: f("empty_read_at"),
            drains: num(it, "drains"),
        },
        first_apply_ms: ms("first_apply_ms"),
        done_ms: ms("done_ms"),
        grants: grants_of(it, 0),
        barriers: it
            .keys()
            .filter_map(|k| k.strip_prefix(BARRIER_ATTR))
            .map(|id| (id.to_string(), fnum(it, &barrier_attr(id))))
            .collect(),
        rejected: num(it, "rejected"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parent: Option<&str>) -> ShardUnit {
        ShardUnit {
            id: id.into(),
            parent: parent.map(str::to_string),
            owner: None,
            lease: 0,
            beat: 0,
            page: 0,
            cp: ShardCheckpoint::default(),
            first_apply_ms: None,
            done_ms: None,
            grants: vec![],
            barriers: BTreeMap::new(),
            rejected: 0,
        }
    }

    #[test]
    fn a_shard_nobody_held_for_longer_than_the_streams_retention_may_have_lost_records() {
        let grant = |until_ms| Grant {
            unit: 0,
            lease: 1,
            owner: "w".into(),
            granted_ms: 0,
            from_page: 0,
            until_ms,
            released: true,
        };
        let now = 10 * RETENTION_MS;
        let mut u = shard("a", None);
        assert!(
            !unheld_past_retention(&u, now),
            "never taken: nothing read yet"
        );
        u.grants = vec![grant(now - RETENTION_MS - 1), grant(now - 2 * RETENTION_MS)];
        assert!(unheld_past_retention(&u, now), "last held over 24 h ago");
        u.grants.push(grant(now - RETENTION_MS + 60_000));
        assert!(!unheld_past_retention(&u, now), "held within 24 h");
        u.grants = vec![grant(0)];
        u.cp.done = true;
        assert!(
            !unheld_past_retention(&u, now),
            "done: nothing left to read"
        );
    }

    #[test]
    fn a_child_is_taken_once_its_parent_is_read_to_its_end_and_applies_once_it_is_done() {
        let mut a = shard("a", None);
        let b = shard("b", Some("a"));
        let c = shard("c", Some("gone"));
        let all = |a: &ShardUnit| vec![a.clone(), b.clone(), c.clone()];
        let mut t = may_take(&all(&a));
        t.sort();
        assert_eq!(t, ["a", "c"], "b waits for a; c's parent was trimmed away");
        assert!(!may_apply(&all(&a), "b") && may_apply(&all(&a), "c"));
        a.cp.finished = true;
        let mut t = may_take(&all(&a));
        t.sort();
        assert_eq!(t, ["a", "b", "c"], "a still has a buffer to apply");
        assert!(!may_apply(&all(&a), "b"), "not before a is done");
        a.cp.done = true;
        let mut t = may_take(&all(&a));
        t.sort();
        assert_eq!(t, ["b", "c"]);
        assert!(may_apply(&all(&a), "b"));
    }

    #[test]
    fn the_holder_buffers_until_the_backfill_and_the_parent_are_done_then_applies_in_order() {
        let mut u = shard("a", None);
        assert_eq!(step(&u, false, true), Step::Buffer);
        assert_eq!(step(&u, true, false), Step::Buffer);
        u.cp.chunks = 3;
        u.cp.applied = 1;
        assert_eq!(step(&u, false, true), Step::Buffer);
        assert_eq!(step(&u, true, true), Step::Apply(1));
        u.cp.finished = true;
        assert_eq!(step(&u, true, false), Step::Wait);
        assert_eq!(step(&u, true, true), Step::Apply(1));
        u.cp.applied = 3;
        assert_eq!(step(&u, true, true), Step::Finish);
        u.cp.finished = false;
        assert_eq!(step(&u, true, true), Step::Live);
        u.cp.done = true;
        assert_eq!(step(&u, false, false), Step::Done);
    }

    #[test]
    fn chunks_stay_under_the_limit_cover_every_record_in_order_and_round_trip() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let records: Vec<(String, String)> = (0..500)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (format!("{i:021}"), format!("{x:016x}"))
            })
            .collect();
        let one = pack(&records, CHUNK_LIMIT).unwrap();
        assert_eq!(one.len(), 1);
        let small = pack(&records, 2_000).unwrap();
        assert!(small.len() > 3, "{}", small.len());
        let mut start = 0;
        let mut back: Vec<(String, String)> = Vec::new();
        for (end, bytes) in &small {
            assert!(bytes.len() < 2_000);
            assert!(*end > start);
            let part: Vec<(String, String)> = unpack(bytes).unwrap();
            assert_eq!(part.len(), end - start);
            back.extend(part);
            start = *end;
        }
        assert_eq!(back, records);
        assert!(
            pack(&records[..1], 10).is_err(),
            "one record over the limit"
        );
        assert!(pack::<u8>(&[], 10).unwrap().is_empty());
    }

    #[test]
    fn applied_through_is_the_minimum_over_open_shards_and_waits_for_buffering_ones() {
        // a's empty read at 150 proves nothing (issue 25): its record does.
        let mut a = shard("a", Some("old"));
        a.cp.live = true;
        a.cp.record_at = Some(100.0);
        a.cp.empty_read_at = Some(150.0);
        let mut b = shard("b", None);
        b.cp.live = true;
        b.cp.record_at = Some(120.0);
        let mut old = shard("old", None);
        old.cp.done = true;
        let (lag, through) = fleet_through(&[a.clone(), b.clone(), old.clone()], 200.0);
        assert_eq!(through, Some(100.0));
        assert_eq!(lag, Some(100.0));
        // A done shard without children yet proves nothing past its records.
        let mut alone = shard("alone", None);
        alone.cp.done = true;
        assert_eq!(fleet_through(&[b.clone(), alone], 200.0).1, None);
        let c = shard("c", None);
        assert_eq!(fleet_through(&[a, b, c], 200.0).1, None, "c is buffering");
        assert_eq!(fleet_through(&[], 200.0).1, None);
    }
}
