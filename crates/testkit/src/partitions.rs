//! DynamoDB's throughput as it really is: per partition, not per key value.
//!
//! [`crate::limits`] gives every partition key value its own 1,000 WCU/s, as
//! if each key had a partition to itself. DynamoDB does not: it hashes keys
//! onto partitions, and keys that share a partition share its limit, so a
//! client that spreads its writes over keys can still be throttled, and one
//! that writes a single key hard is throttled as soon as that key's
//! partition is full. rekey's pacing and backoff must hold against that, so
//! the proxy can run this model instead of the per-key buckets
//! (`ProxyOptions::partitions`).
//!
//! What is modelled, every knob in [`PartitionOptions`]:
//!
//! * **Placement.** Items hash onto the ring of [`crate::keyspace`]; a table
//!   (and each of its GSIs, keyed by the index's partition key) starts with
//!   [`PartitionOptions::partitions`] equal ranges, by default as many as its
//!   throughput needs (provisioned units, or on-demand warm throughput, over
//!   one partition's limit: a new on-demand table's 4,000 WCU / 12,000 RCU
//!   give 4). The stream front uses the same ring, so a partition and its
//!   stream shard hold the same keys.
//! * **Per-partition hard limit** (1,000 WCU/s, 3,000 RCU/s), a token bucket
//!   keeping up to [`PartitionOptions::burst_seconds`] (300 s) of unused
//!   capacity. Refusal: `…KeyRangeThroughputExceeded`. A single key value
//!   lives in one partition, so no key ever gets more than one partition's
//!   limit, however often the table splits.
//! * **Table mode.** Provisioned: a table bucket at the provisioned rate
//!   (`…ProvisionedThroughputExceeded`), each partition's share being that
//!   rate over the partition count. On-demand: an optional table maximum
//!   (`…MaxOnDemandThroughputExceeded`, answered as `ThrottlingException`).
//! * **Adaptive capacity.** On (DynamoDB's default), a partition past its
//!   share borrows the table's unused capacity (whatever the table bucket
//!   holds), never past its hard limit. Off, the share is a limit too.
//! * **Split for heat.** A partition offered at least
//!   [`PartitionOptions::hot_fraction`] of its limit, by more than one key,
//!   for [`PartitionOptions::split_after`], splits into the two halves of its
//!   hash range; each half has a full limit. Heat from one key value never
//!   splits (DynamoDB does not split what cannot spread). Splits are recorded
//!   ([`PartitionModel::splits`]) so a stream front can roll its shards.
//! * **GSIs.** A put writes every GSI holding the item (it has the index's
//!   key attribute); the write must fit the base partition and each index
//!   partition, and a full index partition refuses the base write with the
//!   index's reason and ARN, as DynamoDB does.
//!
//! Not modelled: splits for size (10 GB), on-demand's doubling of the
//! previous peak, GSI writes caused by updates and deletes (the proxy does
//! not see the stored item), per-index provisioned numbers other than
//! [`PartitionOptions::index_mode`]. Time is always passed in (`now`), so
//! the unit tests below step a clock instead of sleeping.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::keyspace::{equal_ranges, in_range};
use crate::limits::{Bucket, Kind, LimitStats, Refused, THROTTLE_MESSAGE, table_arn};

/// A contiguous range of the ring, `end` exclusive, `None` = to the end.
pub type Range = (u64, Option<u64>);

const THROTTLING_MESSAGE: &str =
    "Throughput exceeds the maximum OnDemandThroughput configured on table or index";

/// How a table (or index) is billed, which decides its table-wide limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Provisioned RCU/WCU: a table-wide limit, spread over the partitions.
    Provisioned { write: f64, read: f64 },
    /// On-demand: no table-wide limit unless a maximum is set; warm
    /// throughput only sizes the initial partition count.
    OnDemand {
        max_write: Option<f64>,
        max_read: Option<f64>,
        warm_write: f64,
        warm_read: f64,
    },
}

impl Mode {
    /// A new on-demand table: no maximum, DynamoDB's initial warm throughput.
    pub fn on_demand() -> Mode {
        Mode::OnDemand {
            max_write: None,
            max_read: None,
            warm_write: 4000.0,
            warm_read: 12000.0,
        }
    }

    /// The table-wide rate, if there is one.
    fn table_rate(&self, kind: Kind) -> Option<f64> {
        match (*self, kind) {
            (Mode::Provisioned { write, .. }, Kind::Write) => Some(write),
            (Mode::Provisioned { read, .. }, Kind::Read) => Some(read),
            (Mode::OnDemand { max_write, .. }, Kind::Write) => max_write,
            (Mode::OnDemand { max_read, .. }, Kind::Read) => max_read,
        }
    }

    /// The throughput the initial partitions must carry.
    fn sizing(&self) -> (f64, f64) {
        match *self {
            Mode::Provisioned { write, read } => (write, read),
            Mode::OnDemand {
                warm_write,
                warm_read,
                ..
            } => (warm_write, warm_read),
        }
    }
}

/// Every knob of the model; `Default` is DynamoDB's numbers.
#[derive(Debug, Clone)]
pub struct PartitionOptions {
    /// Every table's mode.
    pub mode: Mode,
    /// Every GSI's mode; `None` = the table's.
    pub index_mode: Option<Mode>,
    /// Initial partitions of each table and GSI; `None` = what the mode's
    /// throughput needs (at least 1).
    pub partitions: Option<u32>,
    /// One partition's hard write limit, WCU/s (DynamoDB: 1,000).
    pub partition_write: f64,
    /// One partition's hard read limit, RCU/s (DynamoDB: 3,000).
    pub partition_read: f64,
    /// Unused capacity kept, in seconds of the rate (DynamoDB: 300).
    pub burst_seconds: f64,
    /// Adaptive capacity: a partition may use the table's unused capacity
    /// beyond its share (DynamoDB: always on).
    pub adaptive: bool,
    /// How long a partition must stay hot before it splits.
    pub split_after: Duration,
    /// Offered load, as a fraction of the hard limit, that counts as hot.
    pub hot_fraction: f64,
    /// No table or index splits past this many partitions.
    pub max_partitions: u32,
}

impl Default for PartitionOptions {
    fn default() -> PartitionOptions {
        PartitionOptions {
            mode: Mode::on_demand(),
            index_mode: None,
            partitions: None,
            partition_write: 1000.0,
            partition_read: 3000.0,
            burst_seconds: 300.0,
            adaptive: true,
            // DynamoDB splits within minutes of sustained heat.
            split_after: Duration::from_secs(120),
            hot_fraction: 0.8,
            max_partitions: 1024,
        }
    }
}

impl PartitionOptions {
    fn hard(&self, kind: Kind) -> f64 {
        match kind {
            Kind::Write => self.partition_write,
            Kind::Read => self.partition_read,
        }
    }
}

/// Where one charge lands: the table (`index: None`) or one of its GSIs, at
/// the ring position of the item's key there (`None` = unknown: only the
/// table-wide limit applies).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub index: Option<String>,
    pub hash: Option<u64>,
}

/// Units one request (or batch entry) wants, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    pub table: String,
    pub units: f64,
    pub targets: Vec<Target>,
}

impl Charge {
    /// A charge to the base table at `hash`.
    pub fn table(table: &str, hash: Option<u64>, units: f64) -> Charge {
        Charge {
            table: table.to_string(),
            units,
            targets: vec![Target { index: None, hash }],
        }
    }

    /// Also charges GSI `index` at `hash` (a put of an item the index holds).
    pub fn and_index(mut self, index: &str, hash: u64) -> Charge {
        self.targets.push(Target {
            index: Some(index.to_string()),
            hash: Some(hash),
        });
        self
    }

    /// A read of GSI `index` only (a Query with `IndexName`).
    pub fn index(table: &str, index: &str, hash: Option<u64>, units: f64) -> Charge {
        Charge {
            table: table.to_string(),
            units,
            targets: vec![Target {
                index: Some(index.to_string()),
                hash,
            }],
        }
    }
}

/// A refusal as DynamoDB words it.
#[derive(Debug, Clone, PartialEq)]
pub struct Throttle {
    /// `ProvisionedThroughputExceededException` or `ThrottlingException`.
    pub exception: &'static str,
    /// `ThrottlingReasons[0].reason`, e.g. `TableWriteKeyRangeThroughputExceeded`.
    pub reason: String,
    /// The table's or index's ARN.
    pub resource: String,
}

impl Throttle {
    /// DynamoDB's answer body (HTTP 400), fields in DynamoDB's order.
    /// DynamoDB's model spells the list `throttlingReasons` in a
    /// `ThrottlingException` and `ThrottlingReasons` elsewhere; the SDKs
    /// read only the spelling of their exception.
    pub fn body(&self) -> String {
        let reasons = serde_json::json!([{ "reason": self.reason, "resource": self.resource }]);
        let (message, field) = match self.exception {
            "ThrottlingException" => (THROTTLING_MESSAGE, "throttlingReasons"),
            _ => (THROTTLE_MESSAGE, "ThrottlingReasons"),
        };
        format!(
            r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{}","message":"{message}","{field}":{reasons}}}"#,
            self.exception
        )
    }
}

impl From<Refused> for Throttle {
    /// The per-key limiter's refusals, worded as they always were.
    fn from(r: Refused) -> Throttle {
        Throttle {
            exception: "ProvisionedThroughputExceededException",
            reason: r.reason.to_string(),
            resource: table_arn(&r.table),
        }
    }
}

/// Which limit refused.
#[derive(Debug, Clone, Copy)]
enum Limit {
    KeyRange,
    Table,
}

/// A partition split for heat: the stream front rolls the parent's shard
/// into the children's.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub table: String,
    pub index: Option<String>,
    pub parent: Range,
    pub children: [Range; 2],
    pub at: Instant,
}

/// Load offered to a partition in the current one-second window, and since
/// when it has been hot (by windows that closed hot).
struct Heat {
    start: Instant,
    write: f64,
    read: f64,
    first_key: Option<u64>,
    mixed: bool,
    hot_since: Option<Instant>,
}

impl Heat {
    fn new(now: Instant) -> Heat {
        Heat {
            start: now,
            write: 0.0,
            read: 0.0,
            first_key: None,
            mixed: false,
            hot_since: None,
        }
    }

    /// Records `units` offered for key `hash`, first closing the window if a
    /// second has passed. Refused units count: demand is what makes heat.
    fn offer(&mut self, kind: Kind, units: f64, hash: u64, now: Instant, o: &PartitionOptions) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= Duration::from_secs(1) {
            let secs = elapsed.as_secs_f64();
            let hot = self.write / secs >= o.hot_fraction * o.partition_write
                || self.read / secs >= o.hot_fraction * o.partition_read;
            // One key's heat cannot be spread by a split: it does not count.
            self.hot_since = match hot && self.mixed {
                true => self.hot_since.or(Some(self.start)),
                false => None,
            };
            *self = Heat {
                hot_since: self.hot_since,
                ..Heat::new(now)
            };
        }
        match kind {
            Kind::Write => self.write += units,
            Kind::Read => self.read += units,
        }
        match self.first_key {
            None => self.first_key = Some(hash),
            Some(k) if k != hash => self.mixed = true,
            Some(_) => {}
        }
    }
}

struct Partition {
    range: Range,
    /// The hard limit.
    write: Bucket,
    read: Bucket,
    /// The provisioned share (a limit only without adaptive capacity).
    share_write: Bucket,
    share_read: Bucket,
    heat: Heat,
}

impl Partition {
    fn new(range: Range, tokens: (f64, f64), now: Instant) -> Partition {
        let bucket = |tokens| Bucket { tokens, last: now };
        Partition {
            range,
            write: bucket(tokens.0),
            read: bucket(tokens.1),
            share_write: bucket(tokens.0),
            share_read: bucket(tokens.1),
            heat: Heat::new(now),
        }
    }

    fn hard(&mut self, kind: Kind) -> &mut Bucket {
        match kind {
            Kind::Write => &mut self.write,
            Kind::Read => &mut self.read,
        }
    }

    fn share(&mut self, kind: Kind) -> &mut Bucket {
        match kind {
            Kind::Write => &mut self.share_write,
            Kind::Read => &mut self.share_read,
        }
    }
}

/// A table or one GSI: its partitions and its table-wide buckets.
struct Resource {
    mode: Mode,
    parts: Vec<Partition>,
    write: Bucket,
    read: Bucket,
}

impl Resource {
    fn new(mode: Mode, o: &PartitionOptions, now: Instant) -> Resource {
        let n = o.partitions.unwrap_or_else(|| {
            let (w, r) = mode.sizing();
            let need = (w / o.partition_write).max(r / o.partition_read).ceil();
            need.clamp(1.0, f64::from(o.max_partitions)) as u32
        });
        let full = |rate: f64| rate * o.burst_seconds;
        let tokens = (full(o.partition_write), full(o.partition_read));
        let parts = equal_ranges(n)
            .into_iter()
            .map(|r| Partition::new(r, tokens, now))
            .collect();
        let table = |kind| Bucket {
            tokens: mode.table_rate(kind).map_or(0.0, full),
            last: now,
        };
        Resource {
            mode,
            parts,
            write: table(Kind::Write),
            read: table(Kind::Read),
        }
    }

    fn locate(&self, hash: u64) -> usize {
        self.parts
            .iter()
            .position(|p| in_range(hash, p.range))
            .expect("the partitions cover the ring")
    }

    fn table_bucket(&mut self, kind: Kind) -> &mut Bucket {
        match kind {
            Kind::Write => &mut self.write,
            Kind::Read => &mut self.read,
        }
    }

    /// A partition's provisioned share: the table rate over the partitions.
    fn share_rate(&self, kind: Kind, hard: f64) -> Option<f64> {
        let rate = match self.mode {
            Mode::Provisioned { .. } => self.mode.table_rate(kind)?,
            Mode::OnDemand { .. } => return None,
        };
        Some((rate / self.parts.len() as f64).min(hard))
    }
}

/// `(table, index)`.
type ResourceKey = (String, Option<String>);
/// A resource and the position of one of its partitions.
type PartKey = (ResourceKey, usize);

/// The partitions of every table and GSI seen, created on first use.
pub struct PartitionModel {
    pub opts: PartitionOptions,
    resources: HashMap<ResourceKey, Resource>,
    splits: Vec<Split>,
    /// Units admitted (`max_key_write_units_per_sec` is not kept here).
    pub stats: LimitStats,
}

impl PartitionModel {
    pub fn new(opts: PartitionOptions) -> PartitionModel {
        PartitionModel {
            opts,
            resources: HashMap::new(),
            splits: Vec::new(),
            stats: LimitStats::default(),
        }
    }

    fn resource(&mut self, key: &ResourceKey, now: Instant) -> &mut Resource {
        resource(&mut self.resources, &self.opts, key, now)
    }

    /// The ranges of a table's (or GSI's) partitions, in ring order.
    pub fn partitions(&self, table: &str, index: Option<&str>) -> Vec<Range> {
        let key = (table.to_string(), index.map(str::to_string));
        self.resources
            .get(&key)
            .map(|r| r.parts.iter().map(|p| p.range).collect())
            .unwrap_or_default()
    }

    /// Every split so far, oldest first.
    pub fn splits(&self) -> &[Split] {
        &self.splits
    }

    /// Forgets a table and its indexes (it was deleted; it may come back).
    pub fn forget(&mut self, table: &str) {
        self.resources.retain(|(t, _), _| t != table);
    }

    /// Admits all of `charges` or none; on success the units are taken.
    /// The first limit that does not fit names the refusal, the base
    /// table's before its indexes'.
    pub fn admit(&mut self, kind: Kind, charges: &[Charge], now: Instant) -> Result<(), Throttle> {
        // Units per partition (resource, index of partition) and per resource.
        let mut per_part: Vec<(PartKey, f64)> = Vec::new();
        let mut per_resource: Vec<(ResourceKey, f64)> = Vec::new();
        for c in charges {
            for t in &c.targets {
                let key = (c.table.clone(), t.index.clone());
                let res = resource(&mut self.resources, &self.opts, &key, now);
                if let Some(hash) = t.hash {
                    let i = res.locate(hash);
                    res.parts[i]
                        .heat
                        .offer(kind, c.units, hash, now, &self.opts);
                    add(&mut per_part, (key.clone(), i), c.units);
                }
                add(&mut per_resource, key, c.units);
            }
        }
        let verdict = self.check(kind, &per_part, &per_resource, now);
        if verdict.is_ok() {
            self.take(kind, &per_part, &per_resource, now);
            for c in charges {
                match kind {
                    Kind::Write => {
                        self.stats.write_units += c.units;
                        let t = self.stats.per_table_write_units.entry(c.table.clone());
                        *t.or_default() += c.units;
                    }
                    Kind::Read => self.stats.read_units += c.units,
                }
            }
        }
        self.split_hot(&per_part, now);
        verdict
    }

    fn check(
        &mut self,
        kind: Kind,
        per_part: &[(PartKey, f64)],
        per_resource: &[(ResourceKey, f64)],
        now: Instant,
    ) -> Result<(), Throttle> {
        let (burst, adaptive) = (self.opts.burst_seconds, self.opts.adaptive);
        let hard = self.opts.hard(kind);
        for ((key, i), units) in per_part {
            let res = self.resource(key, now);
            let share = res.share_rate(kind, hard).filter(|_| !adaptive);
            let part = &mut res.parts[*i];
            let b = part.hard(kind);
            b.refill(hard, burst, now);
            if !b.fits(*units, hard, burst) {
                return Err(throttle(key, kind, Limit::KeyRange, res.mode));
            }
            if let Some(rate) = share {
                let b = part.share(kind);
                b.refill(rate, burst, now);
                // The share shrinks as the table splits; so does its burst.
                b.tokens = b.tokens.min(rate * burst);
                if !b.fits(*units, rate, burst) {
                    return Err(throttle(key, kind, Limit::KeyRange, res.mode));
                }
            }
        }
        for (key, units) in per_resource {
            let res = self.resource(key, now);
            if let Some(rate) = res.mode.table_rate(kind) {
                let b = res.table_bucket(kind);
                b.refill(rate, burst, now);
                if !b.fits(*units, rate, burst) {
                    return Err(throttle(key, kind, Limit::Table, res.mode));
                }
            }
        }
        Ok(())
    }

    /// Takes what [`Self::check`] found fits (the buckets are refilled to `now`).
    fn take(
        &mut self,
        kind: Kind,
        per_part: &[(PartKey, f64)],
        per_resource: &[(ResourceKey, f64)],
        now: Instant,
    ) {
        let burst = self.opts.burst_seconds;
        let hard = self.opts.hard(kind);
        for ((key, i), units) in per_part {
            let res = self.resource(key, now);
            let share = res.share_rate(kind, hard);
            let part = &mut res.parts[*i];
            part.hard(kind).tokens -= units;
            // Kept with adaptive capacity too, so turning it off mid-run
            // finds the share's true state.
            if let Some(rate) = share {
                let b = part.share(kind);
                b.refill(rate, burst, now);
                b.tokens -= units;
            }
        }
        for (key, units) in per_resource {
            let res = self.resource(key, now);
            if res.mode.table_rate(kind).is_some() {
                res.table_bucket(kind).tokens -= units;
            }
        }
    }

    /// Splits the partitions among `touched` that have been hot long enough.
    fn split_hot(&mut self, touched: &[(PartKey, f64)], now: Instant) {
        let mut touched: Vec<(&ResourceKey, usize)> =
            touched.iter().map(|((k, i), _)| (k, *i)).collect();
        // From the back, so a split does not move the partitions still to see.
        touched.sort_by(|a, b| b.cmp(a));
        touched.dedup();
        let (after, max) = (self.opts.split_after, self.opts.max_partitions as usize);
        for (key, i) in touched {
            let Some(res) = self.resources.get_mut(key) else {
                continue;
            };
            let part = &res.parts[i];
            let due = part
                .heat
                .hot_since
                .is_some_and(|t| now.saturating_duration_since(t) >= after);
            let Some(children) = halve(part.range).filter(|_| due && res.parts.len() < max) else {
                continue;
            };
            let parent = part.range;
            // A new partition has saved no unused capacity: no burst yet.
            let halves = children.map(|r| Partition::new(r, (0.0, 0.0), now));
            res.parts.splice(i..=i, halves);
            self.splits.push(Split {
                table: key.0.clone(),
                index: key.1.clone(),
                parent,
                children,
                at: now,
            });
        }
    }

    /// The entries of one table of a batch, admitted one by one while they
    /// fit, as DynamoDB does: `true` for each entry admitted (an entry
    /// without a charge is admitted uncharged), and the first refusal.
    pub fn admit_each(
        &mut self,
        kind: Kind,
        charges: impl IntoIterator<Item = Option<Charge>>,
        now: Instant,
    ) -> (Vec<bool>, Option<Throttle>) {
        let mut first_refusal = None;
        let admitted = charges
            .into_iter()
            .map(|charge| match charge.map(|c| self.admit(kind, &[c], now)) {
                Some(Err(t)) => {
                    first_refusal.get_or_insert(t);
                    false
                }
                _ => true,
            })
            .collect();
        (admitted, first_refusal)
    }

    /// A Scan of `table` is refused while its table-wide read bucket is in debt.
    pub fn scan_allowed(&mut self, table: &str, now: Instant) -> Result<(), Throttle> {
        let key = (table.to_string(), None);
        let burst = self.opts.burst_seconds;
        let res = self.resource(&key, now);
        if let Some(rate) = res.mode.table_rate(Kind::Read) {
            let b = res.table_bucket(Kind::Read);
            b.refill(rate, burst, now);
            if b.tokens < 0.0 {
                return Err(throttle(&key, Kind::Read, Limit::Table, res.mode));
            }
        }
        Ok(())
    }

    /// Charges what a Scan of `table` read, after the fact: to the table and,
    /// as a scan reads every partition, evenly to its partitions.
    pub fn charge_scan(&mut self, table: &str, units: f64, now: Instant) {
        self.stats.read_units += units;
        let key = (table.to_string(), None);
        let (burst, hard) = (self.opts.burst_seconds, self.opts.partition_read);
        let res = self.resource(&key, now);
        if let Some(rate) = res.mode.table_rate(Kind::Read) {
            let b = res.table_bucket(Kind::Read);
            b.refill(rate, burst, now);
            b.tokens -= units;
        }
        let each = units / res.parts.len() as f64;
        for p in &mut res.parts {
            p.read.refill(hard, burst, now);
            p.read.tokens -= each;
        }
    }
}

/// The resource `key`, created on first use.
fn resource<'a>(
    resources: &'a mut HashMap<ResourceKey, Resource>,
    o: &PartitionOptions,
    key: &ResourceKey,
    now: Instant,
) -> &'a mut Resource {
    let mode = match key.1 {
        Some(_) => o.index_mode.unwrap_or(o.mode),
        None => o.mode,
    };
    resources
        .entry(key.clone())
        .or_insert_with(|| Resource::new(mode, o, now))
}

fn add<K: PartialEq>(list: &mut Vec<(K, f64)>, key: K, units: f64) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some((_, u)) => *u += units,
        None => list.push((key, units)),
    }
}

/// The two halves of `range`, or `None` for a range of one position.
pub fn halve(range: Range) -> Option<[Range; 2]> {
    let start = u128::from(range.0);
    let end = range.1.map_or(u128::from(u64::MAX) + 1, u128::from);
    if end - start < 2 {
        return None;
    }
    let mid = (start + (end - start) / 2) as u64;
    Some([(range.0, Some(mid)), (mid, range.1)])
}

fn throttle(key: &ResourceKey, kind: Kind, limit: Limit, mode: Mode) -> Throttle {
    let (table, index) = key;
    let resource_type = if index.is_some() { "Index" } else { "Table" };
    let op = match kind {
        Kind::Write => "Write",
        Kind::Read => "Read",
    };
    let (why, exception) = match (limit, mode) {
        (Limit::KeyRange, _) => (
            "KeyRangeThroughputExceeded",
            "ProvisionedThroughputExceededException",
        ),
        (Limit::Table, Mode::Provisioned { .. }) => (
            "ProvisionedThroughputExceeded",
            "ProvisionedThroughputExceededException",
        ),
        (Limit::Table, Mode::OnDemand { .. }) => {
            ("MaxOnDemandThroughputExceeded", "ThrottlingException")
        }
    };
    let mut resource = table_arn(table);
    if let Some(index) = index {
        resource.push_str(&format!("/index/{index}"));
    }
    Throttle {
        exception,
        reason: format!("{resource_type}{op}{why}"),
        resource,
    }
}

#[cfg(test)]
mod tests;
