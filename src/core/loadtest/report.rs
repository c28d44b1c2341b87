//! What one design did under the load: requests, throttles by reason, the
//! hottest keys by consumed capacity, latency percentiles, and a verdict.
//!
//! The run loop (`phase::loadtest`) feeds a [`Tally`] every DynamoDB call's
//! answer ([`Tally::call`]: capacity and throttles, by partition key, as
//! Contributor Insights counts them) and every request's end
//! ([`Tally::request`]: a read of the new design is several calls, one
//! request). Times are passed in: nothing here reads a clock.

use std::collections::{BTreeMap, HashMap};

use hdrhistogram::Histogram;
use serde::Serialize;

/// A request's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Write,
    Read,
}

/// How one DynamoDB call ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// Served, with the capacity it consumed.
    Served { consumed: f64 },
    /// Refused, with DynamoDB's `ThrottlingReasons` (none when it gave none).
    Throttled { reasons: Vec<String> },
    /// Any other failure (a 5xx, a reset connection).
    Failed,
}

/// How one request ended: served, or refused by a throttle on any of its
/// calls, or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Served,
    Throttled,
    Failed,
}

/// What a `ThrottlingReasons` entry blames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// One partition's limit (`Table…KeyRangeThroughputExceeded`).
    KeyRange,
    /// The table's provisioned or on-demand maximum.
    Table,
    /// A GSI's, whatever limit (`Index…`).
    Index,
    /// Anything else, or no reason given.
    Other,
}

/// DynamoDB's reason names: `{Table|Index}{Read|Write}{KeyRange|Provisioned|MaxOnDemand}ThroughputExceeded`.
pub(crate) fn blame(reason: &str) -> Blame {
    if reason.starts_with("Index") {
        Blame::Index
    } else if reason.contains("KeyRange") {
        Blame::KeyRange
    } else if reason.contains("Provisioned") || reason.contains("MaxOnDemand") {
        Blame::Table
    } else {
        Blame::Other
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct PerKind {
    pub writes: u64,
    pub reads: u64,
}

impl PerKind {
    fn add(&mut self, kind: Kind) {
        match kind {
            Kind::Write => self.writes += 1,
            Kind::Read => self.reads += 1,
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.writes + self.reads
    }
}

/// Throttled calls by what they blame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ByBlame {
    pub key_range: u64,
    pub table: u64,
    pub index: u64,
    pub other: u64,
}

/// Capacity and throttles of one partition key value.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct HotKey {
    pub key: String,
    pub wcu: f64,
    pub rcu: f64,
    /// Calls on this key refused.
    pub throttled: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Percentiles {
    /// Requests measured (served ones).
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct Latency {
    pub writes: Percentiles,
    pub reads: Percentiles,
}

/// One design's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct DesignReport {
    /// `old` or `new`.
    pub design: &'static str,
    pub table: String,
    pub seconds: f64,
    /// Requests made, per second of the run.
    pub rate: f64,
    pub requests: PerKind,
    /// Requests refused by a throttle (a read of the new design: any of its calls).
    pub throttled: PerKind,
    /// Requests that failed otherwise (5xx, connection reset): not throttles.
    pub failed: PerKind,
    /// Throttled share of writes and of reads, 0 to 1.
    pub throttled_write_share: f64,
    pub throttled_read_share: f64,
    /// DynamoDB calls made (a read of the new design fans out to several).
    pub calls: u64,
    pub throttled_calls: u64,
    /// Throttled calls by what DynamoDB blamed.
    pub by_reason: ByBlame,
    /// Throttled calls by DynamoDB's reason, as it names them.
    pub reasons: BTreeMap<String, u64>,
    pub consumed_wcu: f64,
    pub consumed_rcu: f64,
    /// Partition key values by consumed WCU, then by consumed RCU, then by
    /// throttled calls, hottest first.
    pub hottest_write_keys: Vec<HotKey>,
    pub hottest_read_keys: Vec<HotKey>,
    pub most_throttled_keys: Vec<HotKey>,
    /// Of served requests.
    pub latency: Latency,
    pub verdict: String,
}

/// The running counts of one design.
#[derive(Debug)]
pub(crate) struct Tally {
    requests: PerKind,
    throttled: PerKind,
    failed: PerKind,
    calls: u64,
    throttled_calls: u64,
    by_reason: ByBlame,
    reasons: BTreeMap<String, u64>,
    keys: HashMap<String, HotKey>,
    writes: Histogram<u64>,
    reads: Histogram<u64>,
}

/// Latencies kept from 1 µs to an hour, three significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            requests: PerKind::default(),
            throttled: PerKind::default(),
            failed: PerKind::default(),
            calls: 0,
            throttled_calls: 0,
            by_reason: ByBlame::default(),
            reasons: BTreeMap::new(),
            keys: HashMap::new(),
            writes: histogram(),
            reads: histogram(),
        }
    }
}

impl Tally {
    /// One call on partition key value `key`.
    pub(crate) fn call(&mut self, kind: Kind, key: &str, answer: &Answer) {
        self.calls += 1;
        let entry = self.keys.entry(key.to_string()).or_insert_with(|| HotKey {
            key: key.to_string(),
            ..HotKey::default()
        });
        match answer {
            Answer::Served { consumed } => match kind {
                Kind::Write => entry.wcu += consumed,
                Kind::Read => entry.rcu += consumed,
            },
            Answer::Throttled { reasons } => {
                entry.throttled += 1;
                self.throttled_calls += 1;
                let unknown = ["(none given)".to_string()];
                let reasons = if reasons.is_empty() {
                    &unknown[..]
                } else {
                    &reasons[..]
                };
                for r in reasons {
                    *self.reasons.entry(r.clone()).or_default() += 1;
                    let b = &mut self.by_reason;
                    match blame(r) {
                        Blame::KeyRange => b.key_range += 1,
                        Blame::Table => b.table += 1,
                        Blame::Index => b.index += 1,
                        Blame::Other => b.other += 1,
                    }
                }
            }
            Answer::Failed => {}
        }
    }

    /// One request's end, and for a served one its latency in microseconds.
    pub(crate) fn request(&mut self, kind: Kind, ending: Ending, micros: u64) {
        self.requests.add(kind);
        match ending {
            Ending::Served => {
                let h = match kind {
                    Kind::Write => &mut self.writes,
                    Kind::Read => &mut self.reads,
                };
                h.saturating_record(micros.max(1));
            }
            Ending::Throttled => self.throttled.add(kind),
            Ending::Failed => self.failed.add(kind),
        }
    }

    /// The report of `design` on `table`, over `seconds`, with `top` keys per list.
    pub(crate) fn report(
        self,
        design: &'static str,
        table: &str,
        seconds: f64,
        top: usize,
    ) -> DesignReport {
        let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
        let keys: Vec<HotKey> = self.keys.into_values().collect();
        let hottest = |score: fn(&HotKey) -> f64| {
            let mut v: Vec<HotKey> = keys.iter().filter(|k| score(k) > 0.0).cloned().collect();
            // Ties by key, so a report is the same for the same run.
            v.sort_by(|a, b| score(b).total_cmp(&score(a)).then(a.key.cmp(&b.key)));
            v.truncate(top);
            v
        };
        let mut r = DesignReport {
            design,
            table: table.to_string(),
            seconds,
            rate: self.requests.total() as f64 / seconds.max(1e-9),
            requests: self.requests,
            throttled: self.throttled,
            failed: self.failed,
            throttled_write_share: share(self.throttled.writes, self.requests.writes),
            throttled_read_share: share(self.throttled.reads, self.requests.reads),
            calls: self.calls,
            throttled_calls: self.throttled_calls,
            by_reason: self.by_reason,
            reasons: self.reasons,
            consumed_wcu: keys.iter().map(|k| k.wcu).sum(),
            consumed_rcu: keys.iter().map(|k| k.rcu).sum(),
            hottest_write_keys: hottest(|k| k.wcu),
            hottest_read_keys: hottest(|k| k.rcu),
            most_throttled_keys: hottest(|k| k.throttled as f64),
            latency: Latency {
                writes: percentiles(&self.writes),
                reads: percentiles(&self.reads),
            },
            verdict: String::new(),
        };
        r.verdict = verdict(&r);
        r
    }
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |us: u64| us as f64 / 1000.0;
    if h.is_empty() {
        return Percentiles::default();
    }
    Percentiles {
        count: h.len(),
        p50_ms: ms(h.value_at_quantile(0.5)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
    }
}

/// A share as people read it: `23 %`, `0.4 %` below one per cent.
pub(crate) fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p > 0.0 && p < 1.0 {
        format!("{p:.1} %")
    } else {
        format!("{p:.0} %")
    }
}

/// "no throttling", or what was refused and what DynamoDB blamed most.
fn verdict(r: &DesignReport) -> String {
    if r.requests.total() == 0 {
        return "no requests were made".into();
    }
    if r.throttled.total() == 0 {
        return "no throttling".into();
    }
    let mut parts = Vec::new();
    if r.throttled.writes > 0 {
        parts.push(format!(
            "{} of writes refused",
            percent(r.throttled_write_share)
        ));
    }
    if r.throttled.reads > 0 {
        parts.push(format!(
            "{} of reads refused",
            percent(r.throttled_read_share)
        ));
    }
    let b = r.by_reason;
    let blamed = [
        (b.key_range, "key range: a hot partition"),
        (b.table, "the table's limit"),
        (b.index, "a GSI"),
        (b.other, "no reason given"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    // The first of equals: max_by_key keeps the last.
    .rev()
    .max_by_key(|(n, _)| *n)
    .map_or("", |(_, what)| what);
    format!("throttles: {} (mostly {blamed})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn throttled(reason: &str) -> Answer {
        Answer::Throttled {
            reasons: vec![reason.to_string()],
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut t = Tally::default();
        // 1 ms .. 1000 ms, one each.
        for ms in 1..=1000u64 {
            t.request(Kind::Write, Ending::Served, ms * 1000);
        }
        t.request(Kind::Write, Ending::Throttled, 5);
        let r = t.report("old", "t", 10.0, 5);
        let w = r.latency.writes;
        assert_eq!(w.count, 1000, "a throttled request has no latency");
        assert!((w.p50_ms - 500.0).abs() <= 1.0, "{w:?}");
        assert!((w.p99_ms - 990.0).abs() <= 1.0, "{w:?}");
        assert!((w.max_ms - 1000.0).abs() <= 1.0, "{w:?}");
        assert_eq!(r.latency.reads, Percentiles::default());
        assert_eq!(r.rate, 100.1);
    }

    #[test]
    fn throttles_are_counted_by_reason_and_blame() {
        let mut t = Tally::default();
        t.call(
            Kind::Write,
            "a",
            &throttled("TableWriteKeyRangeThroughputExceeded"),
        );
        t.call(
            Kind::Write,
            "a",
            &throttled("TableWriteKeyRangeThroughputExceeded"),
        );
        t.call(
            Kind::Write,
            "b",
            &throttled("IndexWriteKeyRangeThroughputExceeded"),
        );
        t.call(
            Kind::Read,
            "c",
            &throttled("TableReadProvisionedThroughputExceeded"),
        );
        t.call(
            Kind::Write,
            "d",
            &throttled("TableWriteMaxOnDemandThroughputExceeded"),
        );
        t.call(Kind::Write, "e", &Answer::Throttled { reasons: vec![] });
        t.call(Kind::Write, "a", &Answer::Served { consumed: 2.0 });
        t.call(Kind::Write, "b", &Answer::Failed);
        for _ in 0..4 {
            t.request(Kind::Write, Ending::Throttled, 1);
        }
        t.request(Kind::Read, Ending::Throttled, 1);
        for _ in 0..5 {
            t.request(Kind::Write, Ending::Served, 1);
        }
        t.request(Kind::Write, Ending::Failed, 1);
        let r = t.report("old", "t", 1.0, 10);
        assert_eq!(
            r.by_reason,
            ByBlame {
                key_range: 2,
                table: 2,
                index: 1,
                other: 1
            }
        );
        assert_eq!(r.reasons["TableWriteKeyRangeThroughputExceeded"], 2);
        assert_eq!(r.reasons["(none given)"], 1);
        assert_eq!((r.calls, r.throttled_calls), (8, 6));
        assert_eq!(
            r.requests,
            PerKind {
                writes: 10,
                reads: 1
            }
        );
        assert_eq!(
            r.throttled,
            PerKind {
                writes: 4,
                reads: 1
            }
        );
        assert_eq!(r.failed.writes, 1);
        assert_eq!(r.throttled_write_share, 0.4);
        assert_eq!(r.most_throttled_keys[0].key, "a");
        assert_eq!(r.most_throttled_keys[0].throttled, 2);
        assert_eq!(r.hottest_write_keys.len(), 1);
        assert_eq!(
            r.verdict,
            "throttles: 40 % of writes refused, 100 % of reads refused (mostly key range: a hot partition)"
        );
    }

    #[test]
    fn the_hottest_keys_come_first_by_consumed_capacity_and_only_top_many() {
        let mut t = Tally::default();
        for (key, units) in [("x", 1.0), ("y", 5.0), ("z", 3.0), ("w", 3.0)] {
            t.call(Kind::Write, key, &Answer::Served { consumed: units });
            t.call(
                Kind::Read,
                key,
                &Answer::Served {
                    consumed: 10.0 - units,
                },
            );
        }
        let r = t.report("new", "t", 1.0, 3);
        let keys = |v: &[HotKey]| v.iter().map(|k| k.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&r.hottest_write_keys), ["y", "w", "z"]);
        assert_eq!(keys(&r.hottest_read_keys), ["x", "w", "z"]);
        assert_eq!(r.consumed_wcu, 12.0);
        assert_eq!(r.consumed_rcu, 28.0);
        assert!(r.most_throttled_keys.is_empty());
        assert_eq!(r.verdict, "no requests were made");
    }

    #[test]
    fn verdicts_say_no_throttling_or_the_share_refused() {
        let mut t = Tally::default();
        t.request(Kind::Write, Ending::Served, 10);
        assert_eq!(t.report("new", "t", 1.0, 1).verdict, "no throttling");
        assert_eq!(percent(0.004), "0.4 %");
        assert_eq!(percent(0.23), "23 %");
        assert_eq!(percent(0.0), "0 %");
        assert_eq!(
            blame("IndexReadMaxOnDemandThroughputExceeded"),
            Blame::Index
        );
        assert_eq!(blame("AccountLimit"), Blame::Other);
    }

    proptest! {
        /// Every request is served, throttled or failed; every reason of a
        /// throttled call is counted once, under one blame.
        #[test]
        fn counts_add_up(
            calls in prop::collection::vec((0u8..4, 0usize..5, any::<bool>()), 0..200),
            ends in prop::collection::vec((0u8..3, any::<bool>()), 0..200),
        ) {
            const REASONS: [&str; 5] = [
                "TableWriteKeyRangeThroughputExceeded",
                "TableReadProvisionedThroughputExceeded",
                "IndexWriteKeyRangeThroughputExceeded",
                "Other",
                "TableWriteMaxOnDemandThroughputExceeded",
            ];
            let mut t = Tally::default();
            let mut throttled_calls = 0;
            for (answer, reason, write) in &calls {
                let kind = if *write { Kind::Write } else { Kind::Read };
                let a = match answer {
                    0 => Answer::Served { consumed: 1.0 },
                    1 => Answer::Failed,
                    _ => { throttled_calls += 1; throttled(REASONS[*reason]) }
                };
                t.call(kind, &format!("k{reason}"), &a);
            }
            for (end, write) in &ends {
                let kind = if *write { Kind::Write } else { Kind::Read };
                let e = [Ending::Served, Ending::Throttled, Ending::Failed][*end as usize];
                t.request(kind, e, 1000);
            }
            let r = t.report("old", "t", 1.0, 100);
            let b = r.by_reason;
            prop_assert_eq!(b.key_range + b.table + b.index + b.other, throttled_calls);
            prop_assert_eq!(r.reasons.values().sum::<u64>(), throttled_calls);
            prop_assert_eq!(r.calls, calls.len() as u64);
            prop_assert_eq!(r.requests.total(), ends.len() as u64);
            let served = r.latency.writes.count + r.latency.reads.count;
            prop_assert_eq!(served + r.throttled.total() + r.failed.total(), r.requests.total());
            prop_assert!((0.0..=1.0).contains(&r.throttled_write_share));
        }
    }
}
