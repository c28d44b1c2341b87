//! The write side of a backfill: batches of 25 under the table budget,
//! interleaved across target keys and paced per key, so one hot old key never
//! makes a hot new one. A key DynamoDB throttles gets an adaptive rate of its
//! own ([`KeyRates`]), below `--key-write-rate`, and its throttles leave the
//! table's rate alone.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::stream::{self, StreamExt};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{Mutex, Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

use crate::aws::Clients;
use crate::aws::rate::Control;
use crate::aws::rate::keys::KeyRates;
use crate::aws::write::{BATCH, Blame, Pace, blame_of, write_batch_paced};
use crate::core::plan::Plan;
use crate::core::value::{Item, Value, item_size, write_units};
use crate::phase::fleet::Fenced;

use super::BackfillOptions;

/// Limited keys held at most (each a few hundred bytes).
const MAX_LIMITED_KEYS: usize = 10_000;
/// A request waits at most this long for a limited key's next write to
/// join it; then what is ready goes, and the rest follows in another.
const GATHER: Duration = Duration::from_millis(50);

/// Per written item: its index in the page, and why it was refused, if it was.
pub(super) type Refusals = Vec<(usize, Option<String>)>;

/// What became of one item handed to the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    Written,
    /// DynamoDB refused it: why.
    Refused(String),
    /// A stop came before its batch was answered. It may or may not have
    /// landed, so it is neither counted nor checkpointed: a resume writes it
    /// again (a plain put of the same image, harmless).
    Unanswered,
}

impl Answer {
    pub(super) fn of_refusal(refused: Option<String>) -> Answer {
        refused.map_or(Answer::Written, Answer::Refused)
    }
}

/// The write side: batches under the table budget and a per-key limit.
pub(super) struct Writer {
    pub(super) clients: Clients,
    pub(super) table: String,
    pub(super) pk_name: String,
    pub(super) control: Arc<Control>,
    pub(super) per_key: DefaultKeyedRateLimiter<String>,
    pub(super) key_burst: u32,
    /// Adaptive rates of the keys DynamoDB throttled.
    pub(super) key_rates: KeyRates,
    pub(super) concurrency: usize,
    /// `concurrency` requests in flight across every segment and page: each
    /// page used to send its own `concurrency`, so 8 segments held 256
    /// connections, each keeping a read buffer grown by the Scan pages it
    /// carried — RSS climbed through a 10M-item run (BENCHMARKS.md (f6)).
    slots: Semaphore,
    pub(super) max_retries: u32,
    pub(super) consumed_wcu: Mutex<f64>,
}

impl Writer {
    pub(super) fn new(
        clients: &Clients,
        plan: &Plan,
        opts: &BackfillOptions,
        control: Arc<Control>,
    ) -> Writer {
        let key_rate = NonZeroU32::new(opts.key_write_rate.max(1)).unwrap_or(NonZeroU32::MIN);
        // A small burst keeps any one second of a key's writes near the rate: at most
        // rate + burst, well under the partition's 1,000 WCU/s at the default.
        let key_burst =
            NonZeroU32::new((opts.key_write_rate / 4).max(1)).unwrap_or(NonZeroU32::MIN);
        Writer {
            clients: clients.clone(),
            table: plan.target_table.clone(),
            pk_name: plan.target_key.partition_key.name.clone(),
            control,
            per_key: RateLimiter::keyed(Quota::per_second(key_rate).allow_burst(key_burst)),
            key_burst: key_burst.get(),
            key_rates: KeyRates::new(
                f64::from(key_rate.get()),
                f64::from(key_burst.get()) / f64::from(key_rate.get()),
                MAX_LIMITED_KEYS,
            ),
            concurrency: opts.concurrency.max(1),
            slots: Semaphore::new(opts.concurrency.max(1)),
            max_retries: opts.max_retries,
            consumed_wcu: Mutex::new(0.0),
        }
    }

    /// Write items (distinct target keys) in batches of 25, interleaved across
    /// target keys and paced per key: a Scan returns items clustered by the old
    /// key, and each old key fans out to few new ones. Returns what became
    /// of each item; once `stop` is cancelled no batch is sent, and those
    /// waiting (on the budget, a key's pace, a backoff) or in flight are
    /// abandoned: a stop's time does not grow with the page or the rate.
    pub(super) async fn write(
        &self,
        items: &[Item],
        stop: &CancellationToken,
    ) -> anyhow::Result<Vec<Answer>> {
        self.write_fenced(items, &|| true, stop).await
    }

    /// One of the `concurrency` requests in flight: taken after the pacing,
    /// so a batch waiting for its keys' budget holds no connection.
    pub(super) async fn slot(&self) -> SemaphorePermit<'_> {
        // Never closed, so acquiring cannot fail.
        self.slots
            .acquire()
            .await
            .expect("the writer's slots are never closed")
    }

    /// [`Writer::write`], asking `fence` before every BatchWriteItem: once
    /// it says no (a fleet worker's lease may be gone), no batch is sent and
    /// the write fails with [`Fenced`].
    pub(super) async fn write_fenced(
        &self,
        items: &[Item],
        fence: &(dyn Fn() -> bool + Sync),
        stop: &CancellationToken,
    ) -> anyhow::Result<Vec<Answer>> {
        let n = items.len();
        let mut by_key: HashMap<String, Vec<(usize, &Item)>> = HashMap::new();
        for (i, it) in items.iter().enumerate() {
            let pk = it
                .get(&self.pk_name)
                .map(Value::display_text)
                .unwrap_or_default();
            by_key.entry(pk).or_default().push((i, it));
        }
        let mut queues: Vec<(String, std::vec::IntoIter<(usize, &Item)>)> = by_key
            .into_iter()
            .map(|(k, v)| (k, v.into_iter()))
            .collect();
        let mut order = Vec::with_capacity(n);
        while !queues.is_empty() {
            queues.retain_mut(|(k, q)| match q.next() {
                Some((i, it)) => {
                    order.push((k.clone(), i, it));
                    true
                }
                None => false,
            });
        }
        let mut batches: Vec<Vec<(String, usize, &Item)>> = Vec::new();
        for x in order {
            match batches.last_mut() {
                Some(b) if b.len() < BATCH => b.push(x),
                _ => batches.push(vec![x]),
            }
        }
        // The futures made first (lazily: none runs before it is polled), so
        // that the stream holds no closure over the batches' borrows.
        let sends: Vec<_> = batches
            .into_iter()
            .map(|b| self.send_unless_stopped(b, fence, stop))
            .collect();
        let results: Vec<anyhow::Result<Option<Refusals>>> = stream::iter(sends)
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let mut out = vec![Answer::Unanswered; n];
        for r in results {
            for (i, refused) in r.context("backfill write failed")?.unwrap_or_default() {
                out[i] = Answer::of_refusal(refused);
            }
        }
        Ok(out)
    }

    /// [`Writer::send`], or None once `stop` is cancelled: the batch is
    /// dropped wherever it waits. Dropping is safe: its in-flight count and
    /// budget are settled by their guards, and its items stay unanswered.
    async fn send_unless_stopped(
        &self,
        batch: Vec<(String, usize, &Item)>,
        fence: &(dyn Fn() -> bool + Sync),
        stop: &CancellationToken,
    ) -> anyhow::Result<Option<Refusals>> {
        tokio::select! {
            // A stop wins over an answer that is also ready: no batch after it.
            biased;
            () = stop.cancelled() => Ok(None),
            r = self.send(batch, fence) => r.map(Some),
        }
    }

    /// One batch: paced per key, then sent in one of the slots, fenced.
    async fn send(
        &self,
        batch: Vec<(String, usize, &Item)>,
        fence: &(dyn Fn() -> bool + Sync),
    ) -> anyhow::Result<Refusals> {
        let mut pks = Vec::with_capacity(batch.len());
        let mut units = Vec::with_capacity(batch.len());
        let mut idx = Vec::with_capacity(batch.len());
        let mut its = Vec::with_capacity(batch.len());
        for (pk, i, it) in batch {
            let wcu = write_units(item_size(it)) as u32;
            let cells = NonZeroU32::new(wcu.clamp(1, self.key_burst)).unwrap_or(NonZeroU32::MIN);
            let _ = self.per_key.until_key_n_ready(&pk, cells).await;
            pks.push(pk);
            units.push(f64::from(wcu.max(1)));
            idx.push(i);
            its.push(it);
        }
        let pace = BatchPace {
            rates: &self.key_rates,
            keys: pks.iter().map(String::as_str).zip(units).collect(),
        };
        let _slot = self.slot().await;
        if !fence() {
            return Err(Fenced.into());
        }
        let r = write_batch_paced(
            &self.clients,
            &self.table,
            &its,
            &self.control,
            self.max_retries,
            &pace,
        )
        .await?;
        *self.consumed_wcu.lock().await += r.consumed;
        Ok(idx.into_iter().zip(r.refused).collect())
    }
}

/// One batch's items as the per-key rates see them: partition key and WCU.
struct BatchPace<'a> {
    rates: &'a KeyRates,
    keys: Vec<(&'a str, f64)>,
}

impl Pace for BatchPace<'_> {
    async fn ready(&self, pending: &[usize]) -> Vec<usize> {
        let start = tokio::time::Instant::now();
        let mut go = Vec::with_capacity(pending.len());
        let mut rest = pending.to_vec();
        loop {
            let now = tokio::time::Instant::now();
            let mut wait = Duration::MAX;
            rest.retain(
                |&i| match self.rates.take(self.keys[i].0, self.keys[i].1, now) {
                    Ok(()) => {
                        go.push(i);
                        false
                    }
                    Err(w) => {
                        wait = wait.min(w);
                        true
                    }
                },
            );
            // Everything, or what is ready once waiting longer would hold it back.
            let late = now.checked_add(wait).is_none_or(|t| t > start + GATHER);
            if rest.is_empty() || (!go.is_empty() && late) {
                go.sort_unstable();
                return go;
            }
            tokio::time::sleep(wait).await;
        }
    }

    fn answered(&self, written: &[usize], throttled: &[usize], reasons: &[String]) -> Blame {
        let written: Vec<(&str, f64)> = written.iter().map(|&i| self.keys[i]).collect();
        let throttled: Vec<&str> = throttled.iter().map(|&i| self.keys[i].0).collect();
        self.rates.answered(
            &written,
            &throttled,
            blame_of(reasons),
            tokio::time::Instant::now(),
        )
    }
}
