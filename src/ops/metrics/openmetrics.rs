//! A [`Sample`] as OpenMetrics text, through `prometheus-client`'s encoder:
//! a registry built for each scrape from the reading, so every value is the
//! one the snapshots and the feed hold at that moment and none is kept here.
//!
//! The names (each counter gets `_total` in the exposition) are the ones
//! `docs/grafana-dashboard.json` queries and docs/fleet.md lists; [`NAMES`]
//! holds them for the test that checks the dashboard.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::feed::{Capacity, Reason};
use super::sample::{PHASES, Sample, phase_label};

/// The content type of a scrape's answer.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric name rekey serves, as a query names it (counters with `_total`).
#[cfg(test)]
pub(crate) const NAMES: &[&str] = &[
    "rekey_items_scanned_total",
    "rekey_items_written_total",
    "rekey_items_rejected_total",
    "rekey_items_skipped_total",
    "rekey_backfill_expected_items",
    "rekey_consumed_rcu_total",
    "rekey_consumed_wcu_total",
    "rekey_throttles_total",
    "rekey_phase",
    "rekey_tail_records_total",
    "rekey_tail_applied_total",
    "rekey_tail_rejected_total",
    "rekey_tail_lag_seconds",
    "rekey_tail_shard_lag_seconds",
    "rekey_tail_applied_through_timestamp_seconds",
    "rekey_verify_scanned_total",
    "rekey_verify_differences",
    "rekey_verify_unsettled",
    "rekey_verify_clean",
    "rekey_fleet_units",
    "rekey_worker_leases",
    "rekey_worker_items_scanned_total",
];

type Labels = Vec<(&'static str, String)>;
type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn counter(reg: &mut Registry, name: &str, help: &str, n: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(n);
    reg.register(name, help, c);
}

fn gauge(reg: &mut Registry, name: &str, help: &str, unit: Option<Unit>, v: f64) {
    let g = FloatGauge::default();
    g.set(v);
    match unit {
        Some(unit) => reg.register_with_unit(name, help, unit, g),
        None => reg.register(name, help, g),
    }
}

/// The sample as an OpenMetrics exposition, ending in `# EOF`.
pub(crate) fn render(s: &Sample) -> String {
    let mut reg = Registry::with_prefix("rekey");
    if let Some(phase) = s.phase {
        let f = Family::<Labels, FloatGauge>::default();
        for p in PHASES {
            let on = if p == phase { 1.0 } else { 0.0 };
            f.get_or_create(&vec![("phase", phase_label(p).to_string())])
                .set(on);
        }
        reg.register(
            "phase",
            "The migration's phase: 1 for the current one, 0 for the others",
            f,
        );
    }
    if let Some(b) = &s.backfill {
        counter(
            &mut reg,
            "items_scanned",
            "Source items the backfill read",
            b.scanned,
        );
        counter(
            &mut reg,
            "items_written",
            "Items the backfill wrote to the target",
            b.written,
        );
        counter(
            &mut reg,
            "items_rejected",
            "Items the backfill rejected (in the rejects file)",
            b.rejected,
        );
        counter(&mut reg, "items_skipped", "Items the plan skips", b.skipped);
        gauge(
            &mut reg,
            "backfill_expected_items",
            "The source's item count when the backfill started (DescribeTable's estimate)",
            None,
            b.expected_items as f64,
        );
    }
    capacity(&mut reg, s);
    tails(&mut reg, s);
    verify(&mut reg, s);
    if let Some(u) = s.fed.units {
        let f = Family::<Labels, FloatGauge>::default();
        for (state, n) in [("done", u.done), ("open", u.total - u.done.min(u.total))] {
            f.get_or_create(&vec![("state", state.to_string())])
                .set(n as f64);
        }
        reg.register(
            "fleet_units",
            "The fleet's units (Scan segments, export files), done or not",
            f,
        );
        gauge(
            &mut reg,
            "worker_leases",
            "Units this worker holds a lease on",
            None,
            u.held as f64,
        );
        counter(
            &mut reg,
            "worker_items_scanned",
            "Items this worker scanned",
            u.scanned,
        );
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &reg);
    text
}

/// Capacity consumed by this process, by table; throttled attempts by class.
fn capacity(reg: &mut Registry, s: &Sample) {
    let (rcu, wcu) = (
        Family::<Labels, FloatCounter>::default(),
        Family::<Labels, FloatCounter>::default(),
    );
    for ((kind, table), units) in &s.fed.capacity {
        let f = match kind {
            Capacity::Read => &rcu,
            Capacity::Write => &wcu,
        };
        f.get_or_create(&vec![("table", table.clone())])
            .inc_by(*units);
    }
    reg.register(
        "consumed_rcu",
        "Read capacity units this process consumed, as DynamoDB's answers reported them",
        rcu,
    );
    reg.register(
        "consumed_wcu",
        "Write capacity units this process consumed, as DynamoDB's answers reported them",
        wcu,
    );
    let throttles = Family::<Labels, Counter>::default();
    for reason in Reason::ALL {
        let n = s.fed.throttles.get(&reason).copied().unwrap_or(0);
        throttles
            .get_or_create(&vec![("reason", reason.label().to_string())])
            .inc_by(n);
    }
    reg.register("throttles", "Request attempts DynamoDB throttled, by reason: key_range, table, index, other (no reason given, or a batch's unprocessed items)", throttles);
}

fn tails(reg: &mut Registry, s: &Sample) {
    if s.tails.is_empty() {
        return;
    }
    let records = Family::<Labels, Counter>::default();
    let applied = Family::<Labels, Counter>::default();
    let rejected = Family::<Labels, Counter>::default();
    let lag = Family::<Labels, FloatGauge>::default();
    let shard_lag = Family::<Labels, FloatGauge>::default();
    let through = Family::<Labels, FloatGauge>::default();
    for t in &s.tails {
        let d = t.direction.to_string();
        let st = &t.status;
        records
            .get_or_create(&vec![("direction", d.clone())])
            .inc_by(st.records);
        for (op, n) in [
            ("put", st.puts),
            ("delete", st.deletes),
            ("update", st.updates),
        ] {
            applied
                .get_or_create(&vec![("direction", d.clone()), ("op", op.to_string())])
                .inc_by(n);
        }
        rejected
            .get_or_create(&vec![("direction", d.clone())])
            .inc_by(st.rejected);
        if let Some(l) = st.lag_seconds {
            lag.get_or_create(&vec![("direction", d.clone())]).set(l);
        }
        for (shard, l) in t.leaf_lags() {
            shard_lag
                .get_or_create(&vec![
                    ("direction", d.clone()),
                    ("shard", shard.to_string()),
                ])
                .set(l);
        }
        if let Some(at) = st.applied_through {
            let secs = at.timestamp_millis() as f64 / 1000.0;
            through
                .get_or_create(&vec![("direction", d.clone())])
                .set(secs);
        }
    }
    reg.register("tail_records", "Stream records the tail read", records);
    reg.register("tail_applied", "Changes the tail applied, by kind", applied);
    reg.register(
        "tail_rejected",
        "Stream records the tail rejected",
        rejected,
    );
    reg.register_with_unit(
        "tail_lag",
        "How far behind the stream the tail is (its slowest shard)",
        Unit::Seconds,
        lag,
    );
    reg.register_with_unit(
        "tail_shard_lag",
        "Each open shard's lag (open shards only: the leaves of the lineage)",
        Unit::Seconds,
        shard_lag,
    );
    reg.register_with_unit(
        "tail_applied_through_timestamp",
        "Every source write before this instant (epoch seconds) is applied",
        Unit::Seconds,
        through,
    );
}

fn verify(reg: &mut Registry, s: &Sample) {
    let Some(c) = s.verify else {
        return;
    };
    let scanned = Family::<Labels, Counter>::default();
    for (side, n) in [("source", c.scanned), ("target", c.target_scanned)] {
        scanned
            .get_or_create(&vec![("side", side.to_string())])
            .inc_by(n);
    }
    reg.register(
        "verify_scanned",
        "Items verify compared, by the table read",
        scanned,
    );
    gauge(
        reg,
        "verify_differences",
        "Missing, different and orphan items verify confirmed",
        None,
        c.differences() as f64,
    );
    gauge(
        reg,
        "verify_unsettled",
        "Candidates still being re-checked, and those that could not be settled",
        None,
        (c.pending + c.pending_orphans + c.unconfirmed + c.unconfirmed_orphans) as f64,
    );
    if let Some(clean) = s.verify_clean {
        gauge(
            reg,
            "verify_clean",
            "1 if the last finished verify was clean",
            None,
            if clean { 1.0 } else { 0.0 },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::feed::Units;
    use crate::state::snapshot::{BackfillStatus, Phase, ShardPhase, ShardStatus, TailStatus};

    fn sample() -> Sample {
        let mut s = Sample {
            phase: Some(Phase::Backfilling),
            backfill: Some(BackfillStatus {
                scanned: 167,
                written: 155,
                rejected: 12,
                ..BackfillStatus::default()
            }),
            ..Sample::default()
        };
        s.fed
            .capacity
            .insert((Capacity::Write, "dst".into()), 160.5);
        s.fed.throttles.insert(Reason::KeyRange, 3);
        s.fed.units = Some(Units {
            total: 8,
            done: 3,
            held: 2,
            scanned: 70,
        });
        let shard = |id: &str, state, lag| ShardStatus {
            shard_id: id.into(),
            state,
            lag_seconds: Some(lag),
            ..ShardStatus::default()
        };
        s.tails.push(super::super::sample::Tail {
            direction: "forward",
            status: TailStatus {
                puts: 4,
                lag_seconds: Some(2.5),
                shards: vec![
                    shard("old", ShardPhase::Finished, 9.0),
                    shard("leaf", ShardPhase::Open, 2.5),
                ],
                ..TailStatus::default()
            },
        });
        s
    }

    #[test]
    fn a_sample_renders_as_openmetrics_with_every_family_named() {
        let text = render(&sample());
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in [
            "rekey_items_written_total 155",
            "rekey_items_rejected_total 12",
            "rekey_phase{phase=\"backfill\"} 1.0",
            "rekey_phase{phase=\"verify\"} 0.0",
            "rekey_consumed_wcu_total{table=\"dst\"} 160.5",
            "rekey_throttles_total{reason=\"key_range\"} 3",
            "rekey_throttles_total{reason=\"other\"} 0",
            "rekey_tail_applied_total{direction=\"forward\",op=\"put\"} 4",
            "rekey_tail_shard_lag_seconds{direction=\"forward\",shard=\"leaf\"} 2.5",
            "rekey_fleet_units{state=\"open\"} 5.0",
            "rekey_worker_leases 2.0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert!(
            !text.contains("shard=\"old\""),
            "a finished shard is not a leaf: {text}"
        );
        // Every sample's family is one NAMES lists.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(NAMES.contains(&name), "{name} not in NAMES");
        }
    }
}
