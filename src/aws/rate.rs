//! Capacity budgets: capacity units per second, paid from what DynamoDB says a
//! request consumed.
//!
//! A Scan's cost is only known after it returns (ReturnConsumedCapacity), so
//! the budget runs on debt: a caller takes what it spent, and whoever comes next
//! waits until the bucket is back above zero. Over any window longer than a
//! page, consumption averages to the rate. The rate can be changed while
//! callers wait, which is what adaptive throttling needs and why this is not a
//! fixed-quota `governor` limiter (governor serves the fixed per-key limits).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use crate::aws::AwsError;
use crate::aws::retry::{backoff, jitter};

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

#[derive(Debug)]
pub struct Budget {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// None: unlimited.
    rate: Option<f64>,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        if let Some(rate) = self.rate {
            // At most one second of unused budget is saved up, so an idle spell
            // is not followed by a burst at many times the rate.
            self.tokens = (self.tokens + dt * rate).min(rate);
        }
        self.last = now;
    }
}

impl Budget {
    /// `None`: unlimited.
    pub fn new(units_per_second: Option<f64>) -> Budget {
        Budget {
            state: Mutex::new(Bucket {
                rate: units_per_second.filter(|r| *r > 0.0),
                tokens: 0.0,
                last: Instant::now(),
            }),
        }
    }

    pub fn unlimited() -> Budget {
        Budget::new(None)
    }

    /// Wait until the budget is out of debt. Call before a request.
    pub async fn ready(&self) {
        loop {
            let wait = {
                let mut b = self.state.lock().await;
                b.refill(Instant::now());
                match b.rate {
                    Some(rate) if b.tokens < 0.0 => Duration::from_secs_f64(-b.tokens / rate),
                    _ => return,
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Take `units` now and wait until they are paid for: for requests whose
    /// cost is known beforehand (writes), so that many concurrent callers are
    /// spaced out instead of all passing a non-negative bucket at once.
    pub async fn acquire(&self, units: f64) {
        let wait = {
            let mut b = self.state.lock().await;
            b.refill(Instant::now());
            match b.rate {
                Some(rate) => {
                    b.tokens -= units;
                    if b.tokens < 0.0 {
                        Duration::from_secs_f64(-b.tokens / rate)
                    } else {
                        Duration::ZERO
                    }
                }
                None => Duration::ZERO,
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Record what a request consumed.
    pub async fn spend(&self, units: f64) {
        let mut b = self.state.lock().await;
        b.refill(Instant::now());
        if b.rate.is_some() {
            b.tokens -= units;
        }
    }

    pub async fn rate(&self) -> Option<f64> {
        self.state.lock().await.rate
    }

    /// Change the rate; waiting callers see it at their next check.
    pub async fn set_rate(&self, rate: f64) {
        let mut b = self.state.lock().await;
        b.refill(Instant::now());
        let rate = rate.max(0.1);
        b.rate = Some(rate);
        b.tokens = b.tokens.min(rate);
    }
}

/// A run's rate control: read and write budgets that adapt to throttling,
/// pausing, and what was throttled and why.
///
/// Adaptation is AIMD, as TCP does it: a throttle cuts the rate to 80 % (at
/// most once a second, so a burst of rejections from many in-flight
/// requests counts as one signal); every second without a throttle adds 5 % of
/// the operator's ceiling back. The rate never exceeds the ceiling the
/// operator set and never drops below 1 % of it.
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
/// ends it.
#[must_use = "hold it until the write is answered"]
pub struct InFlight<'a>(&'a Control);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

struct ControlState {
    read_ceiling: Option<f64>,
    write_ceiling: Option<f64>,
    last_read_cut: Option<Instant>,
    last_write_cut: Option<Instant>,
    last_throttle: Option<Instant>,
    stats: ThrottleStats,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ThrottleStats {
    pub read_throttles: u64,
    pub write_throttles: u64,
    /// DynamoDB's ThrottlingReasons, counted (`TableWriteKeyRangeThroughputExceeded`, …).
    pub reasons: BTreeMap<String, u64>,
}

const CUT: f64 = 0.8;
const CUT_EVERY: Duration = Duration::from_secs(1);
const RAISE: f64 = 0.05;

impl Control {
    pub fn new(read_rate: Option<f64>, write_rate: Option<f64>) -> Control {
        Control {
            read: Budget::new(read_rate),
            write: Budget::new(write_rate),
            inner: Mutex::new(ControlState {
                read_ceiling: read_rate,
                write_ceiling: write_rate,
                last_read_cut: None,
                last_write_cut: None,
                last_throttle: None,
                stats: ThrottleStats::default(),
            }),
            paused: watch::channel(false).0,
            in_flight: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts a write in flight once the pause gate lets it through. The
    /// count goes up before the gate is looked at, so a pause that finds no
    /// write in flight knows that none will start until it is lifted.
    async fn enter_write(&self) -> InFlight<'_> {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            self.in_flight.fetch_add(1, SeqCst);
            let guard = InFlight(self);
            if !self.is_paused() {
                return guard;
            }
            drop(guard);
            self.wait_unpaused().await;
        }
    }

    /// Writes past the pause gate and not answered yet.
    pub fn writes_in_flight(&self) -> u64 {
        self.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Paused, with no write in flight: what `rekey control --pause` waits for.
    pub fn is_quiet(&self) -> bool {
        self.is_paused() && self.writes_in_flight() == 0
    }

    async fn wait_unpaused(&self) {
        let mut rx = self.paused.subscribe();
        // An error means the sender is gone, which cannot happen while self lives.
        let _ = rx.wait_for(|p| !*p).await;
    }

    pub async fn wait_read(&self) {
        self.wait_unpaused().await;
        self.read.ready().await;
    }

    /// Wait for room for a write whose cost is known only after it; hold
    /// the guard until the write is answered.
    pub async fn wait_write(&self) -> InFlight<'_> {
        self.write.ready().await;
        self.enter_write().await
    }

    /// Wait for room for a write of `units` WCU (known from the item sizes);
    /// hold the guard until the write is answered.
    pub async fn acquire_write(&self, units: f64) -> InFlight<'_> {
        self.write.acquire(units).await;
        self.enter_write().await
    }

    pub fn set_paused(&self, paused: bool) {
        if self.paused.send_replace(paused) != paused {
            tracing::info!(
                paused,
                "reads and writes {}",
                if paused { "paused" } else { "resumed" }
            );
        }
    }

    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// New ceilings from the operator; the current rate moves to them.
    pub async fn set_ceilings(&self, read: Option<f64>, write: Option<f64>) {
        let mut s = self.inner.lock().await;
        if let Some(r) = read {
            s.read_ceiling = Some(r);
            self.read.set_rate(r).await;
        }
        if let Some(w) = write {
            s.write_ceiling = Some(w);
            self.write.set_rate(w).await;
        }
    }

    async fn throttled(&self, write: bool, e: &AwsError, attempt: u32) {
        let now = Instant::now();
        {
            let mut guard = self.inner.lock().await;
            let s = &mut *guard;
            s.last_throttle = Some(now);
            if write {
                s.stats.write_throttles += 1;
            } else {
                s.stats.read_throttles += 1;
            }
            if let AwsError::Throttled { reasons, code, .. } = e {
                tracing::info!(write, code = %code, reasons = ?reasons, attempt, "throttled: rate cut, backing off");
                if reasons.is_empty() {
                    *s.stats.reasons.entry(code.clone()).or_default() += 1;
                }
                for r in reasons {
                    *s.stats.reasons.entry(r.clone()).or_default() += 1;
                }
            }
            let (last, ceiling, budget) = if write {
                (&mut s.last_write_cut, s.write_ceiling, &self.write)
            } else {
                (&mut s.last_read_cut, s.read_ceiling, &self.read)
            };
            if last.is_none_or(|t| now.duration_since(t) >= CUT_EVERY) {
                *last = Some(now);
                if let (Some(ceiling), Some(rate)) = (ceiling, budget.rate().await) {
                    budget.set_rate((rate * CUT).max(ceiling * 0.01)).await;
                }
            }
        }
        tokio::time::sleep(backoff(attempt, jitter())).await;
    }

    /// Record a throttled read, cut the read rate, and back off.
    pub async fn read_throttled(&self, e: &AwsError) {
        self.throttled(false, e, 2).await;
    }

    /// Record a throttled read on its `attempt`-th retry (BatchGetItem's
    /// UnprocessedKeys), cut the read rate, and back off exponentially.
    pub async fn read_throttled_retry(&self, e: &AwsError, attempt: u32) {
        self.throttled(false, e, attempt).await;
    }

    /// Record a throttled write (its `attempt`-th retry), cut the write rate, and back off.
    pub async fn write_throttled(&self, e: &AwsError, attempt: u32) {
        self.throttled(true, e, attempt).await;
    }

    /// Additive increase; call once a second.
    pub async fn tick(&self) {
        let s = self.inner.lock().await;
        if s.last_throttle
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        for (ceiling, budget) in [(s.read_ceiling, &self.read), (s.write_ceiling, &self.write)] {
            if let (Some(c), Some(r)) = (ceiling, budget.rate().await)
                && r < c
            {
                budget.set_rate((r + c * RAISE).min(c)).await;
            }
        }
    }

    pub async fn stats(&self) -> ThrottleStats {
        self.inner.lock().await.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn debt_is_paid_at_the_rate() {
        let b = Budget::new(Some(100.0));
        let start = Instant::now();
        for _ in 0..10 {
            b.ready().await;
            b.spend(50.0).await;
        }
        b.ready().await;
        // 500 units at 100/s: the last caller may go after 5 s, not before.
        let t = start.elapsed().as_secs_f64();
        assert!((4.99..=5.01).contains(&t), "{t}");
    }

    #[test]
    fn rates_are_units_or_shares_of_provisioned_capacity() {
        assert_eq!("500".parse::<Rate>(), Ok(Rate::Units(500.0)));
        assert_eq!("25%".parse::<Rate>(), Ok(Rate::Share(0.25)));
        assert!(
            "0".parse::<Rate>().is_err()
                && "150%".parse::<Rate>().is_err()
                && "x".parse::<Rate>().is_err()
        );
        assert_eq!(
            Rate::Share(0.25).resolve("t", Some(400), "write"),
            Ok(100.0)
        );
        assert_eq!(Rate::Units(7.0).resolve("t", None, "write"), Ok(7.0));
        assert!(
            Rate::Share(0.5)
                .resolve("t", None, "write")
                .unwrap_err()
                .contains("on-demand")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn acquiring_spaces_concurrent_callers() {
        let b = std::sync::Arc::new(Budget::new(Some(100.0)));
        let start = Instant::now();
        let mut done = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let b = b.clone();
            tasks.push(tokio::spawn(async move {
                b.acquire(50.0).await;
                Instant::now()
            }));
        }
        for t in tasks {
            done.push(t.await.unwrap().duration_since(start).as_secs_f64());
        }
        done.sort_by(f64::total_cmp);
        // 50 units each at 100/s: released at 0.5, 1.0, 1.5 and 2.0 s, not all at once.
        for (i, t) in done.iter().enumerate() {
            let want = 0.5 * (i + 1) as f64;
            assert!((t - want).abs() < 0.01, "{done:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_saves_at_most_one_second() {
        let b = Budget::new(Some(10.0));
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        for _ in 0..4 {
            b.ready().await;
            b.spend(10.0).await;
        }
        b.ready().await;
        // 10 saved units cover the first request; the other 30 take 3 s.
        let t = start.elapsed().as_secs_f64();
        assert!((2.99..=3.01).contains(&t), "{t}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_rate_applies_to_waiting_debt() {
        let b = Budget::new(Some(10.0));
        b.spend(100.0).await;
        b.set_rate(100.0).await;
        let start = Instant::now();
        b.ready().await;
        let t = start.elapsed().as_secs_f64();
        assert!((0.99..=1.01).contains(&t), "{t}");
        assert_eq!(b.rate().await, Some(100.0));
        Budget::unlimited().ready().await;
    }

    fn throttle(reason: &str) -> AwsError {
        AwsError::Throttled {
            action: "PutItem",
            resource: "t".into(),
            code: "ProvisionedThroughputExceededException".into(),
            detail: String::new(),
            reasons: vec![reason.into()],
            endpoint: std::sync::Arc::new(crate::aws::Endpoint {
                service: crate::aws::Service::DynamoDb,
                url: "http://127.0.0.1:9".into(),
                source: crate::aws::Source::Flag,
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn throttles_cut_the_rate_once_per_burst_and_quiet_seconds_restore_it() {
        let c = Control::new(None, Some(1000.0));
        // Ten rejections at once are one congestion signal.
        for _ in 0..10 {
            c.write.set_rate(c.write.rate().await.unwrap()).await; // no-op; keeps the clock still
        }
        let e = throttle("TableWriteKeyRangeThroughputExceeded");
        let mut joins = Vec::new();
        for i in 0..10 {
            let c = &c;
            let e = &e;
            joins.push(async move { c.write_throttled(e, i).await });
        }
        futures::future::join_all(joins).await;
        assert_eq!(c.write.rate().await, Some(800.0));
        let stats = c.stats().await;
        assert_eq!(stats.write_throttles, 10);
        assert_eq!(stats.reasons["TableWriteKeyRangeThroughputExceeded"], 10);
        // Repeated throttling keeps cutting, but never below 1 % of the ceiling.
        for _ in 0..60 {
            tokio::time::sleep(CUT_EVERY).await;
            c.write_throttled(&e, 0).await;
        }
        assert_eq!(c.write.rate().await, Some(10.0));
        // Quiet seconds add 5 % of the ceiling each, up to the ceiling.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..30 {
            c.tick().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(c.write.rate().await, Some(1000.0));
        assert_eq!(
            c.read.rate().await,
            None,
            "an unlimited read budget stays unlimited"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pause_holds_callers_until_resumed() {
        let c = std::sync::Arc::new(Control::new(None, None));
        c.set_paused(true);
        let c2 = c.clone();
        let waiter = tokio::spawn(async move {
            let _in_flight = c2.wait_write().await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiter.is_finished());
        let resumed_at = Instant::now();
        c.set_paused(false);
        assert!(waiter.await.unwrap() >= resumed_at);
        c.set_ceilings(Some(50.0), Some(60.0)).await;
        assert_eq!(c.read.rate().await, Some(50.0));
        assert_eq!(c.write.rate().await, Some(60.0));
    }

    /// A pause is quiet only once every write that passed the gate before it
    /// was answered; a write that comes to the gate after it waits, uncounted.
    #[tokio::test(start_paused = true)]
    async fn a_pause_is_quiet_once_writes_in_flight_are_answered() {
        let c = std::sync::Arc::new(Control::new(None, None));
        let sent = c.acquire_write(1.0).await;
        c.set_paused(true);
        assert_eq!(c.writes_in_flight(), 1);
        assert!(!c.is_quiet(), "a write is still in flight");
        let c2 = c.clone();
        let late = tokio::spawn(async move {
            let _in_flight = c2.acquire_write(1.0).await;
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!late.is_finished(), "held at the gate");
        drop(sent);
        assert!(c.is_quiet(), "the late write is not counted while it waits");
        c.set_paused(false);
        late.await.unwrap();
        assert_eq!(c.writes_in_flight(), 0);
    }
}
