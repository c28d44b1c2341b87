//! What the metrics read besides the state directory's snapshots, taken
//! where the numbers already pass: each AWS request attempt's event (the
//! interceptor in `aws::trace`), seen by a tracing layer, and the status the
//! phases hand their progress sink once a second, seen by a sink that wraps
//! the terminal's. Neither keeps a count of its own beside the phases': the
//! layer adds up what the answers reported, the sink keeps the last status.
//!
//! Process-wide, as the log subscriber is: the layer is installed with it
//! (`ops::log::install`), before any command runs.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

use crate::phase::progress::{Progress, ProgressSink};
use crate::state::snapshot::Counts;

/// The target of the interceptor's events (`aws::trace`).
pub(crate) const REQUEST_TARGET: &str = "rekey::aws::trace";

/// Read or write capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Capacity {
    Read,
    Write,
}

/// Why DynamoDB throttled, in four classes: its ThrottlingReasons name a
/// key range, a table or an index; anything else (an error code without
/// reasons, a batch's unprocessed items) is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reason {
    KeyRange,
    Table,
    Index,
    Other,
}

impl Reason {
    pub(crate) const ALL: [Reason; 4] = [
        Reason::KeyRange,
        Reason::Table,
        Reason::Index,
        Reason::Other,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Reason::KeyRange => "key_range",
            Reason::Table => "table",
            Reason::Index => "index",
            Reason::Other => "other",
        }
    }

    /// The class of one attempt's `throttle_reason` (DynamoDB's reasons
    /// joined by commas): a key range if any reason names one, else an
    /// index, else the table. One class per attempt, so the classes add up
    /// to the throttled attempts.
    pub(crate) fn of(reasons: &str) -> Reason {
        let rs: Vec<&str> = reasons.split(',').map(str::trim).collect();
        if rs.iter().any(|r| r.contains("KeyRange")) {
            Reason::KeyRange
        } else if rs.iter().any(|r| r.starts_with("Index")) {
            Reason::Index
        } else if rs.iter().any(|r| r.starts_with("Table")) {
            Reason::Table
        } else {
            Reason::Other
        }
    }
}

/// A fleet worker's view of its units (`phase::fleet`'s status).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Units {
    pub(crate) total: u64,
    pub(crate) done: u64,
    /// Units this worker holds a lease on.
    pub(crate) held: u64,
    /// Items this worker scanned.
    pub(crate) scanned: u64,
}

/// What was fed so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fed {
    /// Capacity units consumed, by kind and table.
    pub(crate) capacity: BTreeMap<(Capacity, String), f64>,
    /// Throttled attempts, by class.
    pub(crate) throttles: BTreeMap<Reason, u64>,
    /// Verify's counts while it runs, and when they were reported.
    pub(crate) verify: Option<(Counts, chrono::DateTime<chrono::Utc>)>,
    pub(crate) units: Option<Units>,
}

#[derive(Default)]
struct Feed {
    on: std::sync::atomic::AtomicBool,
    fed: Mutex<Fed>,
}

static FEED: LazyLock<Feed> = LazyLock::new(Feed::default);

fn fed() -> MutexGuard<'static, Fed> {
    FEED.fed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Metrics are on in this process: progress sinks report to the feed.
pub(crate) fn switch_on() {
    FEED.on.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// A copy of what was fed so far.
pub(crate) fn read() -> Fed {
    fed().clone()
}

/// The capacity an operation consumes: reads or writes.
fn capacity_of(operation: &str) -> Option<Capacity> {
    match operation {
        "Scan" | "Query" | "GetItem" | "BatchGetItem" => Some(Capacity::Read),
        "PutItem" | "DeleteItem" | "UpdateItem" | "BatchWriteItem" | "TransactWriteItems" => {
            Some(Capacity::Write)
        }
        _ => None,
    }
}

/// The fields of one request event the metrics use.
#[derive(Default)]
struct Attempt {
    operation: Option<String>,
    table: Option<String>,
    consumed: Option<f64>,
    reason: Option<String>,
}

impl Visit for Attempt {
    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "consumed_capacity" {
            self.consumed = Some(value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "operation" => self.operation = Some(value.to_string()),
            "table" => self.table = Some(value.to_string()),
            "throttle_reason" => self.reason = Some(value.to_string()),
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl Attempt {
    fn add_to(self, fed: &mut Fed) {
        if let (Some(units), Some(kind)) = (
            self.consumed,
            self.operation.as_deref().and_then(capacity_of),
        ) {
            let table = self.table.unwrap_or_default();
            *fed.capacity.entry((kind, table)).or_default() += units;
        }
        if let Some(reason) = &self.reason {
            *fed.throttles.entry(Reason::of(reason)).or_default() += 1;
        }
    }
}

/// The tracing layer that adds up the request events; installed (with its
/// own filter, [`REQUEST_TARGET`] at debug) only when metrics are asked for.
pub(crate) struct RequestLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RequestLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != REQUEST_TARGET {
            return;
        }
        let mut attempt = Attempt::default();
        event.record(&mut attempt);
        attempt.add_to(&mut fed());
    }
}

/// `progress`, reporting to the feed too once metrics are on.
pub(crate) fn tee(progress: Arc<dyn ProgressSink>) -> Progress {
    if FEED.on.load(std::sync::atomic::Ordering::SeqCst) {
        Progress::new(Arc::new(Tee(progress)))
    } else {
        Progress::new(progress)
    }
}

/// A progress sink that hands on everything and keeps the statuses the
/// metrics read: verify's counts, a fleet worker's units.
struct Tee(Arc<dyn ProgressSink>);

impl ProgressSink for Tee {
    fn start(&self, label: &str, expected_items: Option<u64>) {
        self.0.start(label, expected_items);
    }

    fn update(&self, items: u64, units: f64) {
        self.0.update(items, units);
    }

    fn status(&self, text: String, json: serde_json::Value) {
        keep_status(&json, &mut fed());
        self.0.status(text, json);
    }

    fn note(&self, text: &str) {
        self.0.note(text);
    }

    fn finish(&self) {
        self.0.finish();
    }

    fn beside(&self) -> Arc<dyn ProgressSink> {
        Arc::new(Tee(self.0.beside()))
    }
}

/// What a status says that the metrics show: verify's (`counts`), a fleet
/// worker's (`units`, `units_done`, `held`).
fn keep_status(json: &serde_json::Value, fed: &mut Fed) {
    if let Some(counts) = json
        .get("counts")
        .and_then(|c| serde_json::from_value::<Counts>(c.clone()).ok())
    {
        fed.verify = Some((counts, chrono::Utc::now()));
    }
    let n = |k: &str| json.get(k).and_then(serde_json::Value::as_u64);
    if let (Some(total), Some(done), Some(held)) = (
        n("units"),
        n("units_done"),
        json.get("held").and_then(serde_json::Value::as_array),
    ) {
        fed.units = Some(Units {
            total,
            done,
            held: held.len() as u64,
            scanned: n("this_worker_scanned").unwrap_or(0),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reasons_fall_into_four_classes_one_per_attempt() {
        assert_eq!(
            Reason::of("TableWriteKeyRangeThroughputExceeded"),
            Reason::KeyRange
        );
        assert_eq!(
            Reason::of("IndexWriteKeyRangeThroughputExceeded"),
            Reason::KeyRange
        );
        assert_eq!(
            Reason::of("TableWriteProvisionedThroughputExceeded"),
            Reason::Table
        );
        assert_eq!(
            Reason::of(
                "TableReadMaxOnDemandThroughputExceeded,IndexReadProvisionedThroughputExceeded"
            ),
            Reason::Index
        );
        assert_eq!(
            Reason::of("ProvisionedThroughputExceededException"),
            Reason::Other
        );
        assert_eq!(Reason::of("UnprocessedItems"), Reason::Other);
    }

    #[test]
    fn a_request_event_adds_its_capacity_by_kind_and_table_and_its_throttle() {
        let mut fed = Fed::default();
        for (op, table, units, reason) in [
            ("Scan", "src", Some(1.5), None),
            ("Scan", "src", Some(2.0), None),
            ("BatchWriteItem", "dst", Some(25.0), None),
            ("BatchWriteItem", "dst", None, Some("UnprocessedItems")),
            (
                "PutItem",
                "dst",
                None,
                Some("TableWriteKeyRangeThroughputExceeded"),
            ),
            ("DescribeTable", "dst", Some(9.0), None),
        ] {
            Attempt {
                operation: Some(op.into()),
                table: Some(table.into()),
                consumed: units,
                reason: reason.map(str::to_string),
            }
            .add_to(&mut fed);
        }
        assert_eq!(fed.capacity[&(Capacity::Read, "src".into())], 3.5);
        assert_eq!(fed.capacity[&(Capacity::Write, "dst".into())], 25.0);
        assert_eq!(fed.capacity.len(), 2, "DescribeTable consumes nothing");
        assert_eq!(fed.throttles[&Reason::Other], 1);
        assert_eq!(fed.throttles[&Reason::KeyRange], 1);
    }

    #[test]
    fn the_status_keeps_verify_counts_and_a_workers_units() {
        let mut fed = Fed::default();
        keep_status(&serde_json::json!({"rcu_per_sec": 3.0}), &mut fed);
        assert!(fed.verify.is_none() && fed.units.is_none());
        let counts = Counts {
            scanned: 10,
            different: 2,
            ..Counts::default()
        };
        keep_status(
            &serde_json::json!({"phase": "Forward", "counts": counts}),
            &mut fed,
        );
        assert_eq!(
            fed.verify.map(|(c, _)| (c.scanned, c.different)),
            Some((10, 2))
        );
        keep_status(
            &serde_json::json!({"units": 8, "units_done": 3, "held": [1, 4], "this_worker_scanned": 70}),
            &mut fed,
        );
        assert_eq!(
            fed.units,
            Some(Units {
                total: 8,
                done: 3,
                held: 2,
                scanned: 70
            })
        );
    }
}
