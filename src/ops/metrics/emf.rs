//! `--metrics emf`: CloudWatch's embedded metric format, for where nothing
//! scrapes (Lambda, ECS, Batch): one JSON object a line on stderr, every
//! `--metrics-interval` and once more when the command ends, which the
//! CloudWatch agent or the awslogs driver turns into metrics. stderr, so
//! `--json`'s reports on stdout stay as they are.
//!
//! Counters go out as what they grew by since the previous line (CloudWatch
//! sums the datapoints of a period), gauges as they are. Namespace `rekey`,
//! dimensions `Command` and `Table` (the plan's source table); the phase is
//! a property (`Phase`), queryable in Logs Insights but not a metric.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::feed::{Capacity, Reason};
use super::sample::{Sample, phase_label};

pub(crate) const NAMESPACE: &str = "rekey";

/// A metric's kind: a counter goes out as its growth.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// The metrics of one sample: name, CloudWatch unit, kind, value.
fn metrics(s: &Sample) -> Vec<(&'static str, &'static str, Kind, f64)> {
    use Kind::{Counter, Gauge};
    let mut m = Vec::new();
    if let Some(b) = &s.backfill {
        m.push(("ItemsScanned", "Count", Counter, b.scanned as f64));
        m.push(("ItemsWritten", "Count", Counter, b.written as f64));
        m.push(("ItemsRejected", "Count", Counter, b.rejected as f64));
        m.push(("ItemsSkipped", "Count", Counter, b.skipped as f64));
    }
    let consumed = |kind| -> f64 {
        s.fed
            .capacity
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, u)| u)
            .sum()
    };
    m.push(("ConsumedRCU", "Count", Counter, consumed(Capacity::Read)));
    m.push(("ConsumedWCU", "Count", Counter, consumed(Capacity::Write)));
    for (reason, name) in [
        (Reason::KeyRange, "ThrottlesKeyRange"),
        (Reason::Table, "ThrottlesTable"),
        (Reason::Index, "ThrottlesIndex"),
        (Reason::Other, "ThrottlesOther"),
    ] {
        let n = s.fed.throttles.get(&reason).copied().unwrap_or(0);
        m.push((name, "Count", Counter, n as f64));
    }
    for t in &s.tails {
        let st = &t.status;
        let (lag, applied, rejected) = match t.direction {
            "reverse" => (
                "ReverseTailLag",
                "ReverseTailApplied",
                "ReverseTailRejected",
            ),
            _ => ("TailLag", "TailApplied", "TailRejected"),
        };
        if let Some(l) = st.lag_seconds {
            m.push((lag, "Seconds", Gauge, l));
        }
        let changes = st.puts + st.deletes + st.updates;
        m.push((applied, "Count", Counter, changes as f64));
        m.push((rejected, "Count", Counter, st.rejected as f64));
    }
    if let Some(c) = s.verify {
        m.push(("VerifyScanned", "Count", Counter, c.scanned as f64));
        m.push(("VerifyDifferences", "Count", Gauge, c.differences() as f64));
    }
    if let Some(u) = s.fed.units {
        m.push(("FleetUnitsDone", "Count", Gauge, u.done as f64));
        m.push((
            "FleetUnitsOpen",
            "Count",
            Gauge,
            u.total.saturating_sub(u.done) as f64,
        ));
        m.push(("WorkerLeases", "Count", Gauge, u.held as f64));
        m.push(("WorkerItemsScanned", "Count", Counter, u.scanned as f64));
    }
    m
}

/// Writes the lines: remembers each counter's last value.
pub(crate) struct Emitter {
    pub(crate) command: &'static str,
    pub(crate) table: String,
    last: BTreeMap<&'static str, f64>,
}

impl Emitter {
    pub(crate) fn new(command: &'static str, table: String) -> Emitter {
        Emitter {
            command,
            table,
            last: BTreeMap::new(),
        }
    }

    /// The line for `s`, taken at `now_ms` (epoch milliseconds).
    pub(crate) fn line(&mut self, s: &Sample, now_ms: i64) -> String {
        let mut root = Map::new();
        let mut defs = Vec::new();
        for (name, unit, kind, value) in metrics(s) {
            let out = match kind {
                Kind::Gauge => value,
                Kind::Counter => {
                    let before = self.last.insert(name, value).unwrap_or(0.0);
                    // A counter never goes back; a snapshot rewritten by a
                    // resumed run starts from its committed totals, not 0.
                    (value - before).max(0.0)
                }
            };
            defs.push(json!({"Name": name, "Unit": unit}));
            root.insert(name.to_string(), json!(out));
        }
        root.insert(
            "_aws".into(),
            json!({
                "Timestamp": now_ms,
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE,
                    "Dimensions": [["Command", "Table"]],
                    "Metrics": defs,
                }],
            }),
        );
        root.insert("Command".into(), json!(self.command));
        root.insert("Table".into(), json!(self.table));
        if let Some(p) = s.phase {
            root.insert("Phase".into(), json!(phase_label(p)));
        }
        Value::Object(root).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::snapshot::BackfillStatus;

    fn sample(written: u64, wcu: f64) -> Sample {
        let mut s = Sample {
            backfill: Some(BackfillStatus {
                written,
                ..BackfillStatus::default()
            }),
            ..Sample::default()
        };
        s.fed.capacity.insert((Capacity::Write, "dst".into()), wcu);
        s
    }

    #[test]
    fn each_line_is_an_emf_object_whose_counters_are_their_growth() {
        let mut e = Emitter::new("backfill", "src".into());
        let first: Value = serde_json::from_str(&e.line(&sample(10, 12.5), 1_000)).unwrap();
        let second: Value = serde_json::from_str(&e.line(&sample(25, 30.0), 2_000)).unwrap();
        let directive = &first["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "rekey");
        assert_eq!(directive["Dimensions"], json!([["Command", "Table"]]));
        assert_eq!(first["_aws"]["Timestamp"], 1_000);
        assert_eq!(
            (&first["Command"], &first["Table"]),
            (&json!("backfill"), &json!("src"))
        );
        // Every metric the directive names is a member, with a unit.
        for m in directive["Metrics"].as_array().unwrap() {
            let name = m["Name"].as_str().unwrap();
            assert!(first[name].is_number(), "{name}");
            assert!(m["Unit"].is_string(), "{m}");
        }
        assert_eq!(
            (
                first["ItemsWritten"].as_f64(),
                second["ItemsWritten"].as_f64()
            ),
            (Some(10.0), Some(15.0))
        );
        assert_eq!(second["ConsumedWCU"].as_f64(), Some(17.5));
    }
}
