//! The demo's application: new orders, status changes and deletes written
//! to the source at a steady rate while the migration runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::workload::{OrderKey, WRITER_SEED, Workload, order_key};
use crate::aws::Clients;
use crate::aws::item::{self, Expressions};
use crate::core::value::{Item, Value};

/// What the demo's application wrote to the source during the migration.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct WriterReport {
    /// The rate it was asked for, writes/s.
    pub rate: f64,
    pub inserts: u64,
    pub updates: u64,
    pub deletes: u64,
    pub seconds: f64,
    pub writes_per_second: f64,
}

pub(super) struct WriterOptions {
    pub(super) clients: Clients,
    pub(super) table: String,
    /// The orders in the table: the ones to change and delete.
    pub(super) keys: Vec<OrderKey>,
    /// The number of the first new order.
    pub(super) first_order: u64,
    pub(super) rate: f64,
}

/// The demo's application: writes to the source at a steady rate until
/// stopped — half new orders, a third status changes, the rest deletes.
pub(super) struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<WriterReport>>,
}

impl Writer {
    pub(super) fn start(opts: WriterOptions) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(write_loop(opts, stop.clone()));
        Writer { stop, task }
    }

    /// Stop after the write in flight; what it wrote.
    pub(super) async fn stop(mut self) -> anyhow::Result<WriterReport> {
        self.stop.store(true, Ordering::Relaxed);
        (&mut self.task)
            .await
            .context("the demo's application failed")?
    }
}

impl Drop for Writer {
    /// A demo that fails stops its application too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

enum Write {
    Insert(Item),
    Status(OrderKey, &'static str),
    Delete(OrderKey),
}

/// Writes the application has in flight at most: enough to keep its rate
/// while the local server, which serves one request at a time, also serves
/// the backfill's and verify's.
const WRITES_IN_FLIGHT: usize = 16;

async fn write_loop(opts: WriterOptions, stop: Arc<AtomicBool>) -> anyhow::Result<WriterReport> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let WriterOptions {
        clients,
        table,
        mut keys,
        first_order,
        rate,
    } = opts;
    let mut workload = Workload::new(WRITER_SEED);
    let mut next = first_order;
    let mut report = WriterReport {
        rate,
        ..WriterReport::default()
    };
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
    // Behind (slow responses): carry on at the rate, no burst to catch up.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = FuturesUnordered::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            Some(w) = in_flight.next() => record(w?, &mut report, &mut keys),
            _ = tick.tick(), if in_flight.len() < WRITES_IN_FLIGHT => {
                let write = next_write(&mut workload, &mut keys, &mut next);
                in_flight.push(apply(&clients, &table, write));
            }
        }
    }
    while let Some(w) = in_flight.next().await {
        record(w?, &mut report, &mut keys);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.writes_per_second =
        (report.inserts + report.updates + report.deletes) as f64 / report.seconds.max(0.001);
    Ok(report)
}

fn record(write: Write, report: &mut WriterReport, keys: &mut Vec<OrderKey>) {
    match write {
        Write::Insert(item) => {
            report.inserts += 1;
            // Changed or deleted only once it exists.
            keys.extend(order_key(&item));
        }
        Write::Status(..) => report.updates += 1,
        Write::Delete(_) => report.deletes += 1,
    }
}

/// Half new orders, a third status changes, the rest deletes. A deleted
/// order leaves `keys` at once, so no later write picks it.
fn next_write(workload: &mut Workload, keys: &mut Vec<OrderKey>, next: &mut u64) -> Write {
    const STATUSES: [&str; 4] = ["OPEN", "PAID", "SHIPPED", "DELIVERED"];
    let roll = workload.rng.next() % 20;
    let at = (workload.rng.next() % keys.len().max(1) as u64) as usize;
    match roll {
        _ if keys.is_empty() || roll < 10 => {
            *next += 1;
            Write::Insert(workload.order(*next - 1))
        }
        10..17 => {
            let status = STATUSES[(workload.rng.next() % 4) as usize];
            Write::Status(keys[at].clone(), status)
        }
        _ => Write::Delete(keys.swap_remove(at)),
    }
}

/// One write; a status change of an order deleted meanwhile (by a delete
/// still in flight) is dropped rather than recreating part of it.
async fn apply(clients: &Clients, table: &str, write: Write) -> anyhow::Result<Write> {
    let key = |(pk, sk): &OrderKey| -> Item {
        [
            ("PK".to_string(), Value::S(pk.clone())),
            ("SK".to_string(), Value::S(sk.clone())),
        ]
        .into()
    };
    let context = "the demo's application writing to the source";
    match &write {
        Write::Insert(item) => item::put_item(clients, table, item)
            .await
            .context(context)?,
        Write::Status(k, status) => {
            let set_status = Expressions {
                update: "SET #s = :s".into(),
                condition: "attribute_exists(PK)".into(),
                names: [("#s".to_string(), "status".to_string())].into(),
                values: [(":s".to_string(), Value::S((*status).into()))].into(),
            };
            // None: the order was deleted meanwhile; nothing to do.
            item::update_item_if(clients, table, &key(k), &set_status)
                .await
                .context(context)?;
        }
        Write::Delete(k) => item::delete_item(clients, table, &key(k))
            .await
            .context(context)?,
    }
    Ok(write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::demo::workload::generate;

    #[test]
    fn the_application_never_writes_an_order_it_deleted() {
        let items = generate(200);
        let mut keys: Vec<OrderKey> = items.iter().filter_map(order_key).collect();
        assert_eq!(
            keys.len(),
            200,
            "profiles are not the application's to change"
        );
        let (mut workload, mut next) = (Workload::new(WRITER_SEED), 200);
        let mut deleted = std::collections::HashSet::new();
        let (mut inserts, mut updates) = (0, 0);
        for _ in 0..2_000 {
            match next_write(&mut workload, &mut keys, &mut next) {
                Write::Insert(item) => {
                    inserts += 1;
                    let k = order_key(&item).unwrap();
                    assert!(!keys.contains(&k), "order ids are new");
                    keys.push(k);
                }
                Write::Status(k, _) => {
                    updates += 1;
                    assert!(!deleted.contains(&k));
                }
                Write::Delete(k) => {
                    assert!(deleted.insert(k.clone()), "deleted twice");
                    assert!(!keys.contains(&k));
                }
            }
        }
        let deletes = deleted.len();
        assert!(inserts > updates && updates > deletes && deletes > 0);
    }
}
