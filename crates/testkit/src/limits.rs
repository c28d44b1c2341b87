//! DynamoDB's throughput limits as token buckets, shared by the [`proxy`]
//! (in front of the local server) and the [`standin`] (which answers itself),
//! so both refuse the same writes and reads with the same answers.
//!
//! Real DynamoDB refuses writes beyond ~1000 WCU/s and reads beyond
//! ~3000 RCU/s per partition key value, and beyond the provisioned
//! throughput per table. Each limit is a token bucket (refill at the rate,
//! capacity rate × burst seconds, starting full). A refusal names the limit as
//! DynamoDB's `ThrottlingReasons` do: per key (`…KeyRangeThroughputExceeded`)
//! or per table (`…ProvisionedThroughputExceeded`).
//!
//! * A single-item write or read is admitted whole or refused
//!   ([`Limiter::admit`]);
//! * batch entries are admitted one by one while they fit; the rest goes back
//!   as `UnprocessedItems` / `UnprocessedKeys`, and a batch none of which fits
//!   is refused whole ([`Limiter::admit_each`]);
//! * a Scan is charged after the fact; the next one is refused while the
//!   table's read bucket is in debt ([`Limiter::scan_allowed`],
//!   [`Limiter::charge_scan`]).
//!
//! [`proxy`]: crate::proxy
//! [`standin`]: crate::standin

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Idle per-key state is dropped once this many keys are tracked.
const PRUNE_AT: usize = 100_000;

pub const THROTTLE_MESSAGE: &str = "The level of configured provisioned throughput for the table was exceeded. \
     Consider increasing your provisioning level with the UpdateTable API.";

/// The rates a [`Limiter`] enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Per partition-key value (table + hash key value), WCU/s (DynamoDB: 1000).
    pub key_write: f64,
    /// Per partition-key value, RCU/s (DynamoDB: 3000).
    pub key_read: f64,
    /// Per table, WCU/s; `None` = unlimited.
    pub table_write: Option<f64>,
    /// Per table, RCU/s; `None` = unlimited.
    pub table_read: Option<f64>,
    /// Bucket capacity = rate × burst seconds (DynamoDB keeps ~300 s).
    pub burst: f64,
}

impl Limits {
    /// No limit at all.
    pub fn unlimited() -> Limits {
        Limits {
            key_write: f64::INFINITY,
            key_read: f64::INFINITY,
            table_write: None,
            table_read: None,
            burst: 1.0,
        }
    }

    /// Per-key and per-table rates for `kind`.
    fn rates(&self, kind: Kind) -> (f64, Option<f64>) {
        match kind {
            Kind::Write => (self.key_write, self.table_write),
            Kind::Read => (self.key_read, self.table_read),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Write,
    Read,
}

/// Units one request (or one batch entry) wants from a table and, when its
/// partition key is known, from that key (encoded as
/// [`rekey::core::value::encode_key`] encodes it).
#[derive(Debug, Clone)]
pub struct Charge {
    pub table: String,
    pub key: Option<Vec<u8>>,
    pub units: f64,
}

/// Which limit refused a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub table: String,
    pub reason: &'static str,
}

/// What the limiter has admitted so far.
#[derive(Debug, Clone, Default)]
pub struct LimitStats {
    /// WCU admitted.
    pub write_units: f64,
    /// RCU admitted, plus what scans consumed.
    pub read_units: f64,
    /// The most WCU any single partition key value was sent in any 1-second
    /// (sliding) window, counting every write offered for it, refused ones
    /// included: a measure of the client's pacing. What is admitted never
    /// exceeds rate × (1 + burst_seconds) in a window.
    pub max_key_write_units_per_sec: f64,
    /// WCU admitted per table.
    pub per_table_write_units: BTreeMap<String, f64>,
}

pub(crate) struct Bucket {
    pub(crate) tokens: f64,
    pub(crate) last: Instant,
}

impl Bucket {
    pub(crate) fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        if now <= self.last {
            return; // time is only ever credited once
        }
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate * burst);
        self.last = now;
    }

    /// A full bucket admits even a request bigger than its capacity and goes
    /// into debt (an item larger than the burst must still get through, at
    /// the rate on average). A zero rate admits nothing.
    pub(crate) fn fits(&self, units: f64, rate: f64, burst: f64) -> bool {
        let capacity = rate * burst;
        self.tokens >= units || (capacity > 0.0 && self.tokens >= capacity)
    }
}

/// The write and read buckets of a key or a table, created full when first used.
#[derive(Default)]
struct Buckets {
    write: Option<Bucket>,
    read: Option<Bucket>,
}

impl Buckets {
    /// The bucket for `kind`, refilled to `now`.
    fn get(&mut self, kind: Kind, rate: f64, burst: f64, now: Instant) -> &mut Bucket {
        let slot = match kind {
            Kind::Write => &mut self.write,
            Kind::Read => &mut self.read,
        };
        let bucket = slot.get_or_insert_with(|| Bucket {
            tokens: rate * burst,
            last: now,
        });
        bucket.refill(rate, burst, now);
        bucket
    }
}

#[derive(Default)]
struct KeyState {
    buckets: Buckets,
    /// Writes received in the last second, for `max_key_write_units_per_sec`.
    recent: VecDeque<(Instant, f64)>,
    recent_sum: f64,
}

impl KeyState {
    /// Forgets writes older than a second.
    fn expire(&mut self, now: Instant) {
        while let Some(&(t, units)) = self.recent.front() {
            if now.saturating_duration_since(t) < Duration::from_secs(1) {
                break;
            }
            self.recent.pop_front();
            self.recent_sum -= units;
        }
        if self.recent.is_empty() {
            self.recent_sum = 0.0; // no float drift across windows
        }
    }

    /// Records `units` received now; returns the units of the last second.
    fn record(&mut self, units: f64, now: Instant) -> f64 {
        self.expire(now);
        self.recent.push_back((now, units));
        self.recent_sum += units;
        self.recent_sum
    }
}

/// The buckets of every table and partition key value seen.
pub struct Limiter {
    pub limits: Limits,
    keys: HashMap<(String, Vec<u8>), KeyState>,
    tables: HashMap<String, Buckets>,
    /// Key count at which idle keys are next pruned.
    prune_at: usize,
    pub stats: LimitStats,
}

impl Limiter {
    pub fn new(limits: Limits) -> Limiter {
        Limiter {
            limits,
            keys: HashMap::new(),
            tables: HashMap::new(),
            prune_at: PRUNE_AT,
            stats: LimitStats::default(),
        }
    }

    /// Admits all of `charges` or none; on success the units are taken.
    /// The clock is read here (callers hold the lock), so buckets see time
    /// move forward.
    pub fn admit(&mut self, kind: Kind, charges: &[Charge]) -> Result<(), Refused> {
        let now = Instant::now();
        let Limits { burst, .. } = self.limits;
        let (key_rate, table_rate) = self.limits.rates(kind);
        let mut per_key: HashMap<(String, Vec<u8>), f64> = HashMap::new();
        let mut per_table: HashMap<String, f64> = HashMap::new();
        for c in charges {
            if let Some(key) = &c.key {
                *per_key.entry((c.table.clone(), key.clone())).or_default() += c.units;
            }
            *per_table.entry(c.table.clone()).or_default() += c.units;
        }

        for (key, units) in &per_key {
            let ks = self.keys.entry(key.clone()).or_default();
            if kind == Kind::Write {
                let sum = ks.record(*units, now);
                let max = &mut self.stats.max_key_write_units_per_sec;
                *max = max.max(sum);
            }
        }
        for ((table, key), units) in &per_key {
            let ks = self.keys.entry((table.clone(), key.clone())).or_default();
            if !ks
                .buckets
                .get(kind, key_rate, burst, now)
                .fits(*units, key_rate, burst)
            {
                return Err(refused(table, kind, true));
            }
        }
        if let Some(rate) = table_rate {
            for (table, units) in &per_table {
                let b = self.tables.entry(table.clone()).or_default();
                if !b.get(kind, rate, burst, now).fits(*units, rate, burst) {
                    return Err(refused(table, kind, false));
                }
            }
        }

        for (key, units) in per_key {
            let ks = self.keys.entry(key).or_default();
            ks.buckets.get(kind, key_rate, burst, now).tokens -= units;
        }
        for (table, units) in per_table {
            if let Some(rate) = table_rate {
                let b = self.tables.entry(table.clone()).or_default();
                b.get(kind, rate, burst, now).tokens -= units;
            }
            match kind {
                Kind::Write => {
                    self.stats.write_units += units;
                    *self.stats.per_table_write_units.entry(table).or_default() += units;
                }
                Kind::Read => self.stats.read_units += units,
            }
        }
        self.prune(now);
        Ok(())
    }

    /// The entries of one table of a batch, admitted one by one while they
    /// fit, as DynamoDB does: `true` for each entry admitted (an entry
    /// without a charge — one the caller could not read — is admitted
    /// uncharged), and the first refusal.
    pub fn admit_each(
        &mut self,
        kind: Kind,
        charges: impl IntoIterator<Item = Option<Charge>>,
    ) -> (Vec<bool>, Option<Refused>) {
        let mut first_refusal = None;
        let admitted = charges
            .into_iter()
            .map(|charge| match charge.map(|c| self.admit(kind, &[c])) {
                Some(Err(r)) => {
                    first_refusal.get_or_insert(r);
                    false
                }
                _ => true,
            })
            .collect();
        (admitted, first_refusal)
    }

    /// A Scan of `table` is refused while its read bucket is in debt.
    pub fn scan_allowed(&mut self, table: &str) -> Result<(), Refused> {
        let Limits {
            burst, table_read, ..
        } = self.limits;
        let b = self.tables.entry(table.to_string()).or_default();
        if let Some(rate) = table_read
            && b.get(Kind::Read, rate, burst, Instant::now()).tokens < 0.0
        {
            return Err(refused(table, Kind::Read, false));
        }
        Ok(())
    }

    /// Charges what a Scan of `table` read, after the fact.
    pub fn charge_scan(&mut self, table: &str, units: f64) {
        self.stats.read_units += units;
        if let Some(rate) = self.limits.table_read {
            let burst = self.limits.burst;
            let b = self.tables.entry(table.to_string()).or_default();
            b.get(Kind::Read, rate, burst, Instant::now()).tokens -= units;
        }
    }

    /// Forgets keys that are idle with full buckets (a new key is the same),
    /// once there are many.
    fn prune(&mut self, now: Instant) {
        if self.keys.len() < self.prune_at {
            return;
        }
        let l = self.limits;
        let full =
            |b: &mut Buckets, kind, rate| b.get(kind, rate, l.burst, now).tokens >= rate * l.burst;
        self.keys.retain(|_, ks| {
            ks.expire(now);
            !(ks.recent.is_empty()
                && full(&mut ks.buckets, Kind::Write, l.key_write)
                && full(&mut ks.buckets, Kind::Read, l.key_read))
        });
        self.prune_at = PRUNE_AT.max(2 * self.keys.len());
    }
}

pub fn refused(table: &str, kind: Kind, per_key: bool) -> Refused {
    let reason = match (kind, per_key) {
        (Kind::Write, true) => "TableWriteKeyRangeThroughputExceeded",
        (Kind::Read, true) => "TableReadKeyRangeThroughputExceeded",
        (Kind::Write, false) => "TableWriteProvisionedThroughputExceeded",
        (Kind::Read, false) => "TableReadProvisionedThroughputExceeded",
    };
    Refused {
        table: table.to_string(),
        reason,
    }
}

/// The ARN DynamoDB names a table by (account 000000000000, us-east-1).
pub fn table_arn(table: &str) -> String {
    match table.starts_with("arn:") {
        true => table.to_string(),
        false => format!("arn:aws:dynamodb:us-east-1:000000000000:table/{table}"),
    }
}

/// DynamoDB's throttle answer body (HTTP 400), fields in DynamoDB's order.
pub fn throttle_body(r: &Refused) -> String {
    let reasons = serde_json::json!([{ "reason": r.reason, "resource": table_arn(&r.table) }]);
    format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"{THROTTLE_MESSAGE}","ThrottlingReasons":{reasons}}}"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills_at_rate_up_to_capacity() {
        let t0 = Instant::now();
        let mut buckets = Buckets::default();
        let b = buckets.get(Kind::Write, 10.0, 2.0, t0);
        assert_eq!(b.tokens, 20.0);
        b.tokens = 0.0;
        b.refill(10.0, 2.0, t0 + Duration::from_millis(500));
        assert!((b.tokens - 5.0).abs() < 1e-9);
        b.refill(10.0, 2.0, t0 + Duration::from_secs(60));
        assert_eq!(b.tokens, 20.0);
        assert!(
            b.fits(25.0, 10.0, 2.0),
            "a full bucket admits an oversized item"
        );
        b.tokens = 19.0;
        assert!(!b.fits(25.0, 10.0, 2.0), "only a full one");
        assert!(
            !Buckets::default()
                .get(Kind::Read, 0.0, 1.0, t0)
                .fits(1.0, 0.0, 1.0),
            "a zero rate admits nothing"
        );
    }

    #[test]
    fn batch_entries_are_admitted_while_they_fit() {
        let mut l = Limiter::new(Limits {
            key_write: 3.0,
            ..Limits::unlimited()
        });
        let c = |k: &str| {
            Some(Charge {
                table: "t".into(),
                key: Some(k.as_bytes().to_vec()),
                units: 1.0,
            })
        };
        let (ok, first) = l.admit_each(Kind::Write, [c("a"), c("a"), None, c("b"), c("a"), c("a")]);
        assert_eq!(ok, [true, true, true, true, true, false]);
        assert_eq!(
            first,
            Some(Refused {
                table: "t".into(),
                reason: "TableWriteKeyRangeThroughputExceeded"
            })
        );
        assert_eq!(l.stats.write_units, 4.0);
        assert_eq!(
            l.stats.max_key_write_units_per_sec, 4.0,
            "refused ones count"
        );
    }
}
