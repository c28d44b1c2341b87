//! Capacity budgets: capacity units per second, paid from what DynamoDB says a
//! request consumed.
//!
//! A Scan's cost is only known after it returns (ReturnConsumedCapacity), so
//! the budget runs on debt: a caller takes what it spent, and whoever comes next
//! waits until the bucket is back above zero. Over any window longer than a
//! page, consumption averages to the rate. The rate can be changed while
//! callers wait, which is what adaptive throttling needs and why this is not a
//! fixed-quota `governor` limiter (governor serves the fixed per-key limits).
//! A budget also records what its requests consumed, per second, when they
//! are answered: the measure the adaptive rates ([`adapt`], per key [`keys`])
//! take the limit they found from.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Mutex, Notify, watch};
use tokio::time::Instant;

use crate::aws::AwsError;
use crate::aws::retry::{backoff, jitter};

pub(crate) mod adapt;
pub(crate) mod keys;

pub use adapt::Adaptive;
pub(crate) use adapt::Recent;

/// A rate as an operator gives it: capacity units per second (`500`), or a
/// share of the table's provisioned capacity (`25%`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    Units(f64),
    Share(f64),
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Rate, String> {
        let t = s.trim();
        let (num, share) = match t.strip_suffix('%') {
            Some(n) => (n, true),
            None => (t, false),
        };
        match num.trim().parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() && (!share || v <= 100.0) => Ok(if share {
                Rate::Share(v / 100.0)
            } else {
                Rate::Units(v)
            }),
            _ => Err(format!(
                "`{s}` is not a rate: give capacity units per second (500) or a share of provisioned capacity (25%)"
            )),
        }
    }
}

impl Rate {
    /// Units per second, given the table's provisioned capacity (None: on-demand).
    pub fn resolve(self, table: &str, provisioned: Option<i64>, kind: &str) -> Result<f64, String> {
        match (self, provisioned) {
            (Rate::Units(u), _) => Ok(u),
            (Rate::Share(f), Some(p)) => Ok((p as f64 * f).max(1.0)),
            (Rate::Share(_), None) => Err(format!(
                "table `{table}` is on-demand, so it has no provisioned {kind} capacity to take a share of: give the rate in capacity units per second"
            )),
        }
    }
}

/// A token bucket on debt, whose rate can change while callers wait; and
/// what went through, per second.
#[derive(Debug)]
pub struct Budget {
    state: Mutex<Bucket>,
    /// Wakes waiting callers when the rate changes.
    changed: Notify,
    /// Units consumed, recorded when the requests were answered.
    through: std::sync::Mutex<Through>,
}

#[derive(Debug, Default)]
struct Through {
    recent: Recent,
    /// The first record, the clock of `recent`; None: the budget's callers
    /// never said what they consumed.
    first: Option<Instant>,
}

/// When units were taken from a [`Budget`]: its count of rate cuts then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken(u64);

/// Unused budget saved up, in seconds of the rate: an idle spell (writers
/// backing off, a page boundary) is not followed by a burst the table
/// refuses.
pub(crate) const SAVED: f64 = 0.25;

#[derive(Debug)]
struct Bucket {
    /// None: unlimited.
    rate: Option<f64>,
    tokens: f64,
    last: Instant,
    /// Everything refilled since the start, uncapped: a caller in debt goes
    /// once this reaches its place in the queue, at whatever rates it took.
    refilled: f64,
    /// Times the rate was lowered: units taken before a cut are not given
    /// back after it.
    cuts: u64,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        if let Some(rate) = self.rate {
            self.tokens = (self.tokens + dt * rate).min(rate * SAVED);
            self.refilled += dt * rate;
        }
        self.last = now;
    }
}

impl Budget {
    /// `None`: unlimited.
    pub fn new(units_per_second: Option<f64>) -> Budget {
        let now = Instant::now();
        Budget {
            state: Mutex::new(Bucket {
                rate: units_per_second.filter(|r| *r > 0.0),
                tokens: 0.0,
                last: now,
                refilled: 0.0,
                cuts: 0,
            }),
            changed: Notify::new(),
            through: std::sync::Mutex::new(Through::default()),
        }
    }

    #[cfg(test)]
    pub(crate) fn unlimited() -> Budget {
        Budget::new(None)
    }

    /// Wait until the budget is out of debt. Call before a request.
    pub async fn ready(&self) {
        loop {
            let changed = self.changed.notified();
            let wait = {
                let mut b = self.state.lock().await;
                b.refill(Instant::now());
                match b.rate {
                    Some(rate) if b.tokens < 0.0 => -b.tokens / rate,
                    _ => return,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(wait)) => {}
                _ = changed => {}
            }
        }
    }

    /// Take `units` now and wait until they are paid for: for requests whose
    /// cost is known beforehand (writes), so that many concurrent callers are
    /// spaced out instead of all passing a non-negative bucket at once. A
    /// caller waits its turn in the queue of debt at the rate of the moment:
    /// a rate cut slows those already waiting too. Returns when the units
    /// were taken, for [`Budget::give_back`].
    pub(crate) async fn acquire(&self, units: f64) -> Taken {
        let (place, taken) = {
            let mut b = self.state.lock().await;
            b.refill(Instant::now());
            let taken = Taken(b.cuts);
            match b.rate {
                Some(_) => {
                    b.tokens -= units;
                    ((b.tokens < 0.0).then(|| b.refilled - b.tokens), taken)
                }
                None => (None, taken),
            }
        };
        let Some(place) = place else {
            return taken;
        };
        loop {
            let changed = self.changed.notified();
            let wait = {
                let mut b = self.state.lock().await;
                b.refill(Instant::now());
                match b.rate {
                    Some(rate) if b.refilled < place => (place - b.refilled) / rate,
                    _ => return taken,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(wait)) => {}
                _ = changed => {}
            }
        }
    }

    /// A request consumed `units`, paid after the fact (reads).
    pub(crate) async fn spend(&self, units: f64) {
        let mut b = self.state.lock().await;
        b.refill(Instant::now());
        if b.rate.is_some() {
            b.tokens -= units;
        }
        drop(b);
        self.record(units);
    }

    /// Return `units` taken (when `taken`) and not used; negative: take
    /// more. Units taken before a cut are not handed out again at the lower
    /// rate (a storm's refused requests would otherwise pay for the next
    /// one), and no more than [`SAVED`] is ever saved up.
    pub(crate) async fn give_back(&self, units: f64, taken: Taken) {
        let mut b = self.state.lock().await;
        b.refill(Instant::now());
        if let Some(rate) = b.rate
            && (units < 0.0 || taken.0 == b.cuts)
        {
            b.tokens = (b.tokens + units).min((rate * SAVED).max(b.tokens));
        }
    }

    /// A request was answered, having consumed `units`.
    pub fn record(&self, units: f64) {
        let now = Instant::now();
        let mut t = self.through.lock().unwrap_or_else(|e| e.into_inner());
        let first = *t.first.get_or_insert(now);
        t.recent.add(first, now, units);
    }

    /// Units consumed by requests answered in the last second; None until a
    /// second after the first answer (answers lag the requests: in the first
    /// moments they say too little), or if no caller ever says.
    pub(crate) fn last_second(&self) -> Option<f64> {
        let now = Instant::now();
        let t = self.through.lock().unwrap_or_else(|e| e.into_inner());
        let first = t.first?;
        (now.saturating_duration_since(first) >= Duration::from_secs(1))
            .then(|| t.recent.last_second(first, now))
    }

    pub async fn rate(&self) -> Option<f64> {
        self.state.lock().await.rate
    }

    /// Change the rate; waiting callers see it at once.
    pub(crate) async fn set_rate(&self, rate: f64) {
        let mut b = self.state.lock().await;
        b.refill(Instant::now());
        let rate = rate.max(0.1);
        if b.rate.is_some_and(|r| rate < r) {
            b.cuts += 1;
        }
        b.rate = Some(rate);
        b.tokens = b.tokens.min(rate * SAVED);
        drop(b);
        self.changed.notify_waiters();
    }
}

/// A run's rate control: read and write budgets that adapt to throttling,
/// pausing, and what was throttled and why.
///
/// Each limited budget follows an [`Adaptive`] rate: a throttle cuts it to
/// 90 % of what went through in the second before (a burst of rejections
/// from many in-flight requests counts as one signal: the rate holds for a
/// second after a cut), then it climbs back to that limit along a cubic and
/// probes above it slowly. The rate never exceeds the ceiling the operator
/// set and never drops below 1 % of it. A throttle blamed on one partition
/// key ([`keys::KeyRates`]) is counted but leaves the table's rate alone.
pub struct Control {
    pub read: Budget,
    pub write: Budget,
    inner: Mutex<ControlState>,
    paused: watch::Sender<bool>,
    /// Writes past the pause gate and not finished: a pause is acknowledged
    /// only once none is left.
    in_flight: std::sync::atomic::AtomicU64,
}

/// A write past the pause gate; dropping it (when the call is answered)
/// ends it, and records the units it took as consumed unless it was
/// [settled](InFlight::settle) with what DynamoDB said.
#[must_use = "hold it until the write is answered"]
pub(crate) struct InFlight<'a> {
    control: &'a Control,
    units: f64,
    taken: Taken,
    settled: bool,
}

impl InFlight<'_> {
    /// The write was answered having consumed `used` units (0: refused):
    /// the budget gets back what it took beyond that.
    pub async fn settle(mut self, used: f64) {
        self.control
            .write
            .give_back(self.units - used, self.taken)
            .await;
        self.control.write.record(used);
        self.settled = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.control.write.record(self.units);
        }
        self.control
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

struct ControlState {
    /// None: unlimited, nothing to adapt.
    read: Option<Adaptive>,
    write: Option<Adaptive>,
    stats: ThrottleStats,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ThrottleStats {
    pub read_throttles: u64,
    pub write_throttles: u64,
    /// Of the write throttles, those blamed on the refused items' own
    /// partition keys (their rates came down, the table's did not).
    pub key_write_throttles: u64,
    /// Times the write rate was cut (one per burst of throttles).
    pub write_cuts: u64,
    /// WCU/s that went through when the write rate was last cut: the limit found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_limit_found: Option<f64>,
    /// DynamoDB's ThrottlingReasons, counted (`TableWriteKeyRangeThroughputExceeded`, …).
    pub reasons: BTreeMap<String, u64>,
}

/// Who a throttle slows down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slow {
    Read,
    Write,
    /// A write blamed on its partition keys: counted, the table's rate kept.
    Keys,
}

impl Control {
    pub fn new(read_rate: Option<f64>, write_rate: Option<f64>) -> Control {
        Control {
            read: Budget::new(read_rate),
            write: Budget::new(write_rate),
            inner: Mutex::new(ControlState {
                read: read_rate.map(Adaptive::new),
                write: write_rate.map(Adaptive::new),
                stats: ThrottleStats::default(),
            }),
            paused: watch::channel(false).0,
            in_flight: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts a write in flight once the pause gate lets it through. The
    /// count goes up before the gate is looked at, so a pause that finds no
    /// write in flight knows that none will start until it is lifted.
    async fn enter_write(&self, units: f64, taken: Taken) -> InFlight<'_> {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            self.in_flight.fetch_add(1, SeqCst);
            let mut guard = InFlight {
                control: self,
                units: 0.0,
                taken,
                settled: true,
            };
            if !self.is_paused() {
                guard.units = units;
                guard.settled = false;
                return guard;
            }
            drop(guard);
            self.wait_unpaused().await;
        }
    }

    /// Writes past the pause gate and not answered yet.
    pub(crate) fn writes_in_flight(&self) -> u64 {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Paused, with no write in flight: what `rekey control --pause` waits for.
    #[cfg(test)]
    pub(crate) fn is_quiet(&self) -> bool {
        self.is_paused() && self.writes_in_flight() == 0
    }

    async fn wait_unpaused(&self) {
        let mut rx = self.paused.subscribe();
        // An error means the sender is gone, which cannot happen while self lives.
        let _ = rx.wait_for(|p| !*p).await;
    }

    pub(crate) async fn wait_read(&self) {
        self.wait_unpaused().await;
        self.read.ready().await;
    }

    /// Wait for room for a write whose cost is known only after it; hold
    /// the guard until the write is answered.
    pub(crate) async fn wait_write(&self) -> InFlight<'_> {
        self.write.ready().await;
        self.enter_write(0.0, Taken(0)).await
    }

    /// Wait for room for a write of `units` WCU (known from the item sizes);
    /// hold the guard until the write is answered.
    pub(crate) async fn acquire_write(&self, units: f64) -> InFlight<'_> {
        let taken = self.write.acquire(units).await;
        self.enter_write(units, taken).await
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        if self.paused.send_replace(paused) != paused {
            tracing::info!(
                paused,
                "reads and writes {}",
                if paused { "paused" } else { "resumed" }
            );
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// New ceilings from the operator; the current rate moves to them and
    /// the limits found are forgotten.
    pub(crate) async fn set_ceilings(&self, read: Option<f64>, write: Option<f64>) {
        let mut s = self.inner.lock().await;
        if let Some(r) = read {
            s.read = Some(Adaptive::new(r));
            self.read.set_rate(r).await;
        }
        if let Some(w) = write {
            s.write = Some(Adaptive::new(w));
            self.write.set_rate(w).await;
        }
    }

    async fn throttled(&self, slow: Slow, e: &AwsError, mut attempt: u32) {
        let now = Instant::now();
        {
            let mut guard = self.inner.lock().await;
            let s = &mut *guard;
            match slow {
                Slow::Read => s.stats.read_throttles += 1,
                Slow::Write => s.stats.write_throttles += 1,
                Slow::Keys => {
                    s.stats.write_throttles += 1;
                    s.stats.key_write_throttles += 1;
                }
            }
            if let AwsError::Throttled { reasons, code, .. } = e {
                tracing::info!(on = ?slow, code = %code, reasons = ?reasons, attempt, "throttled: backing off");
                if reasons.is_empty() {
                    *s.stats.reasons.entry(code.clone()).or_default() += 1;
                }
                for r in reasons {
                    *s.stats.reasons.entry(r.clone()).or_default() += 1;
                }
            }
            let (mut adaptive, budget) = match slow {
                Slow::Read => (s.read.as_mut(), &self.read),
                Slow::Write => (s.write.as_mut(), &self.write),
                Slow::Keys => (None, &self.write),
            };
            if let Some(a) = adaptive.as_deref_mut()
                && a.is_new_signal(now)
            {
                let achieved = budget.last_second();
                if let Some(rate) = a.throttled(now, achieved) {
                    budget.set_rate(rate).await;
                    if slow == Slow::Write {
                        s.stats.write_cuts += 1;
                        s.stats.write_limit_found = a.limit();
                    }
                }
            }
            // An adaptive budget paces the retry; the backoff only spreads
            // the writers out. Without one, it is all there is.
            if adaptive.is_some() || slow == Slow::Keys {
                attempt = attempt.min(2);
            }
        }
        tokio::time::sleep(backoff(attempt, jitter())).await;
    }

    /// Record a throttled read, cut the read rate, and back off.
    pub(crate) async fn read_throttled(&self, e: &AwsError) {
        self.throttled(Slow::Read, e, 2).await;
    }

    /// Record a throttled read on its `attempt`-th retry (BatchGetItem's
    /// UnprocessedKeys), cut the read rate, and back off exponentially.
    pub(crate) async fn read_throttled_retry(&self, e: &AwsError, attempt: u32) {
        self.throttled(Slow::Read, e, attempt).await;
    }

    /// Record a throttled write (its `attempt`-th retry), cut the write rate, and back off.
    pub(crate) async fn write_throttled(&self, e: &AwsError, attempt: u32) {
        self.throttled(Slow::Write, e, attempt).await;
    }

    /// Record a write throttled by its items' own partition keys (whose
    /// rates the caller brings down) and back off; the table's rate stays.
    pub(crate) async fn write_key_throttled(&self, e: &AwsError, attempt: u32) {
        self.throttled(Slow::Keys, e, attempt).await;
    }

    /// Move the rates along their curves; call once a second.
    pub async fn tick(&self) {
        let now = Instant::now();
        let mut guard = self.inner.lock().await;
        let s = &mut *guard;
        for (adaptive, budget) in [
            (s.read.as_mut(), &self.read),
            (s.write.as_mut(), &self.write),
        ] {
            if let Some(a) = adaptive {
                let used = budget.last_second().unwrap_or(a.rate());
                let r = a.at(now, used);
                if budget.rate().await != Some(r) {
                    budget.set_rate(r).await;
                }
            }
        }
    }

    pub async fn stats(&self) -> ThrottleStats {
        self.inner.lock().await.stats.clone()
    }
}

#[cfg(test)]
mod tests;
