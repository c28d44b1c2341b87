//! The stream front's shard model, without I/O: shards per partition, their
//! lineage, readable-at times, pages, iterators, expiry and trimming. Time
//! is an argument (milliseconds on the front's clock), so every rule here is
//! tested without waiting.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value as Json, json};

use super::StreamsOptions;
use crate::keyspace::{equal_ranges, in_range, key_hash};

/// Milliseconds on the front's clock.
pub(crate) type Ms = u64;
/// A hash range of the ring: `(start, end)`, `end` exclusive, `None` = through `u64::MAX`.
type Range = (u64, Option<u64>);

/// DynamoDB's cap on one GetRecords answer.
const PAGE_RECORDS: usize = 1000;
const PAGE_BYTES: u64 = 1 << 20;
/// DynamoDB's sequence numbers have 21+ digits; ours start there.
const FIRST_SEQ: u128 = 100_000_000_000_000_000_000;
/// DescribeStream's page size when the request gives no `Limit` (and its maximum).
const DESCRIBE_LIMIT: usize = 100;

/// An error answer: the exception's name (after `#` in `__type`) and message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub kind: &'static str,
    pub message: String,
}

fn err(kind: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        kind,
        message: message.into(),
    }
}

/// What the model has done, for [`super::StreamsStats`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub records: u64,
    pub per_shard: BTreeMap<String, u64>,
    pub empty_forced: u64,
    pub empty_pending: u64,
    pub empty_idle: u64,
    pub rollovers: u64,
    pub splits: u64,
    pub isolations: u64,
    pub expired: u64,
    pub trimmed: u64,
}

struct Record {
    seq: u128,
    received: Ms,
    readable: Ms,
    size: u64,
    json: Json,
}

struct Shard {
    id: String,
    parent: Option<String>,
    range: Range,
    start_seq: u128,
    /// Set when the shard closes: no record of it is above this.
    end_seq: Option<u128>,
    closed_at: Option<Ms>,
    /// Listed by DescribeStream from this time on.
    listed_at: Ms,
    delay: Ms,
    rollover_at: Option<Ms>,
    records: VecDeque<Record>,
    /// The last sequence number trimmed away (records older than retention).
    trimmed_through: Option<u128>,
    /// Closed, emptied by trimming and past retention: no longer listed.
    gone: bool,
}

struct Stream {
    hash_key: String,
    /// In creation order, so parents come before their children.
    shards: Vec<Shard>,
}

/// Where an iterator reads: the first record at or after `pos`. `run` is
/// the empty run drawn at this position (`None` = not drawn yet; `Some(n)`
/// = `n` more empty pages before records are served).
#[derive(Debug, Clone, PartialEq)]
struct Iter {
    arn: String,
    shard: String,
    pos: u128,
    issued: Ms,
    run: Option<u32>,
}

impl Iter {
    fn encode(&self) -> String {
        let run = self.run.map_or("-".to_string(), |n| n.to_string());
        format!(
            "{}|{}|{}|{}|{run}",
            self.arn, self.shard, self.pos, self.issued
        )
    }

    fn decode(s: &str) -> Option<Iter> {
        let mut parts = s.rsplitn(5, '|');
        let run = parts.next()?;
        let issued = parts.next()?.parse().ok()?;
        let pos = parts.next()?.parse().ok()?;
        let shard = parts.next()?.to_string();
        let arn = parts.next()?.to_string();
        let run = if run == "-" {
            None
        } else {
            Some(run.parse().ok()?)
        };
        Some(Iter {
            arn,
            shard,
            pos,
            issued,
            run,
        })
    }
}

/// The stream ARN an iterator reads, if the string is one of ours.
pub(crate) fn iterator_arn(iterator: &str) -> Option<String> {
    Iter::decode(iterator).map(|i| i.arn)
}

pub(crate) struct Model {
    opts: StreamsOptions,
    rng: u64,
    next_seq: u128,
    next_shard: u64,
    streams: BTreeMap<String, Stream>,
    pub counters: Counters,
}

fn ms(d: std::time::Duration) -> Ms {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Model {
    pub fn new(opts: &StreamsOptions) -> Model {
        Model {
            opts: opts.clone(),
            rng: opts.seed,
            next_seq: FIRST_SEQ,
            next_shard: 1,
            streams: BTreeMap::new(),
            counters: Counters::default(),
        }
    }

    /// SplitMix64, in `[0, 1)`.
    fn draw(&mut self) -> f64 {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        self.rng = self.rng.wrapping_add(GAMMA);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn take_seq(&mut self) -> u128 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    pub fn knows(&self, arn: &str) -> bool {
        self.streams.contains_key(arn)
    }

    /// Starts modelling a stream: `partitions` open shards over the ring,
    /// listed at once (they exist before anyone looks).
    pub fn add_stream(&mut self, arn: &str, hash_key: &str, now: Ms) {
        if self.knows(arn) {
            return;
        }
        let mut shards = Vec::new();
        for range in equal_ranges(self.opts.partitions) {
            shards.push(self.new_shard(range, None, now, true));
        }
        let stream = Stream {
            hash_key: hash_key.to_string(),
            shards,
        };
        self.streams.insert(arn.to_string(), stream);
    }

    fn new_shard(&mut self, range: Range, parent: Option<String>, now: Ms, initial: bool) -> Shard {
        let n = self.next_shard;
        self.next_shard += 1;
        let (lo, hi) = (ms(self.opts.delay_min), ms(self.opts.delay_max));
        let delay = lo + ((hi.saturating_sub(lo)) as f64 * self.draw()) as u64;
        // Jittered so a table's shards do not all roll over together.
        let rollover_at = self
            .opts
            .rollover_every
            .map(|every| now + (ms(every) as f64 * (0.75 + 0.5 * self.draw())) as u64);
        Shard {
            // DynamoDB's shape: shardId-<20 digits>-<8 hex>.
            id: format!("shardId-{:020}-{:08x}", 1_700_000_000_000 + now, n),
            parent,
            range,
            start_seq: self.take_seq(),
            end_seq: None,
            closed_at: None,
            listed_at: if initial {
                0
            } else {
                now + ms(self.opts.describe_delay)
            },
            delay,
            rollover_at,
            records: VecDeque::new(),
            trimmed_through: None,
            gone: false,
        }
    }

    /// Takes a record from the upstream stream: it goes to the open shard
    /// whose range holds its partition key's hash, gets that shard's next
    /// sequence number and is readable `delay` later (never before the
    /// shard's earlier records).
    pub fn ingest(&mut self, arn: &str, mut record: Json, now: Ms) {
        self.tick(now);
        let seq = self.take_seq();
        let Some(stream) = self.streams.get_mut(arn) else {
            return;
        };
        let hash = key_hash(&record["dynamodb"]["Keys"][&stream.hash_key]);
        let Some(shard) = stream
            .shards
            .iter_mut()
            .find(|s| s.end_seq.is_none() && in_range(hash, s.range))
        else {
            return; // the open shards cover the ring: unreachable
        };
        let d = &mut record["dynamodb"];
        d["SequenceNumber"] = json!(seq.to_string());
        if let Some(t) = d["ApproximateCreationDateTime"].as_f64() {
            // DynamoDB gives whole seconds; the local server gives fractions.
            d["ApproximateCreationDateTime"] = json!(t.floor() as i64);
        }
        let size = d["SizeBytes"].as_u64().unwrap_or(1);
        let after = shard.records.back().map_or(0, |r| r.readable);
        shard.records.push_back(Record {
            seq,
            received: now,
            readable: (now + shard.delay).max(after),
            size,
            json: record,
        });
        self.counters.records += 1;
        *self.counters.per_shard.entry(shard.id.clone()).or_default() += 1;
    }

    /// Rolls over the shards whose time has come, trims what retention
    /// has let go.
    pub fn tick(&mut self, now: Ms) {
        let due: Vec<(String, usize)> = self
            .streams
            .iter()
            .flat_map(|(arn, st)| {
                st.shards
                    .iter()
                    .enumerate()
                    .filter(move |(_, s)| {
                        s.end_seq.is_none() && s.rollover_at.is_some_and(|t| t <= now)
                    })
                    .map(move |(i, _)| (arn.clone(), i))
            })
            .collect();
        for (arn, i) in due {
            let range = self.streams[&arn].shards[i].range;
            self.replace(&arn, i, &[range], now);
            self.counters.rollovers += 1;
        }
        let retention = ms(self.opts.retention);
        for st in self.streams.values_mut() {
            for s in &mut st.shards {
                while s
                    .records
                    .front()
                    .is_some_and(|r| r.received + retention <= now)
                {
                    let r = s.records.pop_front().expect("checked above");
                    s.trimmed_through = Some(r.seq);
                }
                if s.records.is_empty() && s.closed_at.is_some_and(|c| c + retention <= now) {
                    s.gone = true;
                }
            }
        }
    }

    /// Closes shard `i` of `arn` and opens children over `ranges`.
    fn replace(&mut self, arn: &str, i: usize, ranges: &[Range], now: Ms) {
        let parent = {
            let s = &mut self.streams.get_mut(arn).expect("a known stream").shards[i];
            let last = s.records.back().map_or(s.start_seq, |r| r.seq);
            s.end_seq = Some(last.max(s.trimmed_through.unwrap_or(0)));
            s.closed_at = Some(now);
            s.id.clone()
        };
        for &range in ranges {
            let child = self.new_shard(range, Some(parent.clone()), now, false);
            self.streams
                .get_mut(arn)
                .expect("a known stream")
                .shards
                .push(child);
        }
    }

    /// The index (in `arn`'s shard list) of its `partition`-th open shard in
    /// ring order.
    fn open_shard(&self, arn: &str, partition: usize) -> Option<usize> {
        let mut open: Vec<(u64, usize)> = self.streams[arn]
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.end_seq.is_none())
            .map(|(i, s)| (s.range.0, i))
            .collect();
        open.sort_unstable();
        open.get(partition).map(|&(_, i)| i)
    }

    /// Halves the `partition`-th open shard's range (in ring order) into two
    /// children; false if there is no such partition or it is one hash wide.
    pub fn split(&mut self, arn: &str, partition: usize, now: Ms) -> bool {
        self.tick(now);
        let Some(i) = self.open_shard(arn, partition) else {
            return false;
        };
        let (start, end) = self.streams[arn].shards[i].range;
        let stop = end.map_or(u128::from(u64::MAX) + 1, u128::from);
        if stop - u128::from(start) < 2 {
            return false;
        }
        let mid = ((u128::from(start) + stop) / 2) as u64;
        self.replace(arn, i, &[(start, Some(mid)), (mid, end)], now);
        self.counters.splits += 1;
        true
    }

    /// Carves a partition holding the one hash `hash` out of the open shard
    /// that holds it: up to three children (below, exactly `hash`, above).
    /// False if that partition already holds only `hash`.
    pub fn isolate(&mut self, arn: &str, hash: u64, now: Ms) -> bool {
        self.tick(now);
        let Some(i) = self.streams[arn]
            .shards
            .iter()
            .position(|s| s.end_seq.is_none() && in_range(hash, s.range))
        else {
            return false;
        };
        let (start, end) = self.streams[arn].shards[i].range;
        let above = hash.checked_add(1);
        if start == hash && end == above {
            return false;
        }
        let mut ranges = Vec::new();
        if start < hash {
            ranges.push((start, Some(hash)));
        }
        ranges.push((hash, above));
        if let Some(a) = above
            && end.is_none_or(|e| a < e)
        {
            ranges.push((a, end));
        }
        self.replace(arn, i, &ranges, now);
        self.counters.isolations += 1;
        true
    }

    /// Every known stream's ARN.
    pub fn arns(&self) -> Vec<String> {
        self.streams.keys().cloned().collect()
    }

    /// DescribeStream's `Shards` page and `LastEvaluatedShardId`.
    pub fn describe(
        &mut self,
        arn: &str,
        exclusive_start: Option<&str>,
        limit: Option<u64>,
        now: Ms,
    ) -> Result<(Vec<Json>, Option<String>), ApiError> {
        self.tick(now);
        let limit = match limit {
            None => DESCRIBE_LIMIT,
            Some(n @ 1..=100) => n as usize,
            Some(n) => {
                return Err(err(
                    "ValidationException",
                    format!(
                        "1 validation error detected: Value '{n}' at 'limit' failed to satisfy constraint: Member must have value between 1 and 100"
                    ),
                ));
            }
        };
        let stream = self.stream(arn)?;
        let listed: Vec<&Shard> = stream
            .shards
            .iter()
            .filter(|s| !s.gone && s.listed_at <= now)
            .collect();
        let from = match exclusive_start {
            None => 0,
            Some(id) => listed.iter().position(|s| s.id == id).map_or(0, |p| p + 1),
        };
        let page: Vec<Json> = listed[from..]
            .iter()
            .take(limit)
            .map(|s| shard_json(s))
            .collect();
        let last =
            (from + page.len() < listed.len()).then(|| listed[from + page.len() - 1].id.clone());
        Ok((page, last))
    }

    fn stream(&self, arn: &str) -> Result<&Stream, ApiError> {
        self.streams.get(arn).ok_or_else(|| {
            err(
                "ResourceNotFoundException",
                format!("Requested resource not found: Stream: {arn} not found"),
            )
        })
    }

    fn shard(&self, arn: &str, id: &str) -> Result<&Shard, ApiError> {
        self.stream(arn)?
            .shards
            .iter()
            .find(|s| s.id == id && !s.gone)
            .ok_or_else(|| {
                err(
                    "ResourceNotFoundException",
                    format!("Requested resource not found: Shard does not exist: {id}"),
                )
            })
    }

    /// GetShardIterator.
    pub fn shard_iterator(
        &mut self,
        arn: &str,
        shard_id: &str,
        kind: &str,
        sequence_number: Option<&str>,
        now: Ms,
    ) -> Result<String, ApiError> {
        self.tick(now);
        let next_seq = self.next_seq;
        let s = self.shard(arn, shard_id)?;
        let horizon = s.trimmed_through.map_or(s.start_seq, |t| t + 1);
        let pos = match kind {
            "TRIM_HORIZON" => horizon,
            "LATEST" => s.end_seq.map_or(next_seq, |e| e + 1),
            "AT_SEQUENCE_NUMBER" | "AFTER_SEQUENCE_NUMBER" => {
                let seq: u128 = sequence_number
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| err("ValidationException", "Invalid SequenceNumber"))?;
                if seq < s.start_seq || s.end_seq.is_some_and(|e| seq > e) {
                    return Err(err(
                        "ValidationException",
                        format!("Invalid SequenceNumber {seq} for shard {shard_id}"),
                    ));
                }
                let pos = if kind == "AT_SEQUENCE_NUMBER" {
                    seq
                } else {
                    seq + 1
                };
                if pos < horizon && s.trimmed_through.is_some() {
                    self.counters.trimmed += 1;
                    return Err(trimmed(seq));
                }
                pos
            }
            other => {
                return Err(err(
                    "ValidationException",
                    format!("Invalid ShardIteratorType: {other}"),
                ));
            }
        };
        Ok(Iter {
            arn: arn.to_string(),
            shard: shard_id.to_string(),
            pos,
            issued: now,
            run: None,
        }
        .encode())
    }

    /// GetRecords: the readable records from the iterator's position, cut
    /// at min(`limit`, 1000) records or 1 MB, unless an empty run is drawn.
    pub fn get_records(
        &mut self,
        iterator: &str,
        limit: Option<u64>,
        now: Ms,
    ) -> Result<Json, ApiError> {
        self.tick(now);
        let it = Iter::decode(iterator)
            .ok_or_else(|| err("ValidationException", "Invalid ShardIterator"))?;
        if now > it.issued + ms(self.opts.iterator_ttl) {
            self.counters.expired += 1;
            return Err(err(
                "ExpiredIteratorException",
                format!(
                    "Iterator expired. The iterator was created at time {} while right now it is {}",
                    it.issued, now
                ),
            ));
        }
        let limit = match limit {
            None => PAGE_RECORDS,
            Some(n @ 1..) => (n as usize).min(PAGE_RECORDS),
            Some(0) => {
                return Err(err(
                    "ValidationException",
                    "1 validation error detected: Value '0' at 'limit' failed to satisfy constraint: Member must have value greater than or equal to 1",
                ));
            }
        };
        let s = self.shard(&it.arn, &it.shard)?;
        if s.trimmed_through.is_some_and(|t| it.pos <= t) {
            self.counters.trimmed += 1;
            return Err(trimmed(it.pos));
        }
        let from = s.records.partition_point(|r| r.seq < it.pos);
        let readable = s
            .records
            .range(from..)
            .take_while(|r| r.readable <= now)
            .count();
        let left = s.records.len() - from;
        let pending = left - readable;
        // A closed shard is read to its end once no record is left past the
        // position: the answer then has no NextShardIterator.
        let closed = s.end_seq.is_some();
        let next = |pos: u128, run: Option<u32>| Iter {
            pos,
            issued: now,
            run,
            ..it.clone()
        };
        if readable == 0 {
            if pending > 0 {
                self.counters.empty_pending += 1;
            } else {
                self.counters.empty_idle += 1;
            }
            let done = closed && left == 0;
            return Ok(page(Vec::new(), (!done).then(|| next(it.pos, it.run))));
        }
        let run = match it.run {
            Some(n) => n,
            None if self.opts.empty_run_max > 0 && self.draw() < self.opts.empty_run_ratio => {
                1 + (self.draw() * f64::from(self.opts.empty_run_max)) as u32
            }
            None => 0,
        };
        if run > 0 {
            self.counters.empty_forced += 1;
            return Ok(page(Vec::new(), Some(next(it.pos, Some(run - 1)))));
        }
        let s = self.shard(&it.arn, &it.shard)?;
        let mut bytes = 0;
        let mut out = Vec::new();
        for r in s.records.range(from..from + readable).take(limit) {
            if !out.is_empty() && bytes + r.size > PAGE_BYTES {
                break;
            }
            bytes += r.size;
            out.push(r);
        }
        let pos = out.last().map_or(it.pos, |r| r.seq + 1);
        let records = out.iter().map(|r| r.json.clone()).collect();
        let done = closed && out.len() == left;
        Ok(page(records, (!done).then(|| next(pos, None))))
    }
}

fn trimmed(seq: u128) -> ApiError {
    err(
        "TrimmedDataAccessException",
        format!("Attempted to access data older than the trim horizon (sequence number {seq})"),
    )
}

fn page(records: Vec<Json>, next: Option<Iter>) -> Json {
    let mut out = json!({ "Records": records });
    if let Some(n) = next {
        out["NextShardIterator"] = json!(n.encode());
    }
    out
}

fn shard_json(s: &Shard) -> Json {
    let mut range = json!({ "StartingSequenceNumber": s.start_seq.to_string() });
    if let Some(e) = s.end_seq {
        range["EndingSequenceNumber"] = json!(e.to_string());
    }
    let mut j = json!({ "ShardId": s.id, "SequenceNumberRange": range });
    if let Some(p) = &s.parent {
        j["ParentShardId"] = json!(p);
    }
    j
}

#[cfg(test)]
mod tests;
