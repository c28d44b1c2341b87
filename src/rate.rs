//! Capacity budgets: capacity units per second, paid from what DynamoDB says a
//! request consumed.
//!
//! A Scan's cost is only known after it returns (ReturnConsumedCapacity), so
//! the budget runs on debt: a caller takes what it spent, and whoever comes next
//! waits until the bucket is back above zero. Over any window longer than a
//! page, consumption averages to the rate. The rate can be changed while
//! callers wait, which is what adaptive throttling needs and why this is not a
//! fixed-quota `governor` limiter (governor serves the fixed per-key limits).

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Budget {
    state: Option<Mutex<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    /// At most one second of unused budget is saved up, so an idle spell is
    /// not followed by a burst at many times the rate.
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.capacity);
        self.last = now;
    }
}

impl Budget {
    /// `None`: unlimited.
    pub fn new(units_per_second: Option<f64>) -> Budget {
        Budget {
            state: units_per_second.filter(|r| *r > 0.0).map(|rate| {
                Mutex::new(Bucket {
                    rate,
                    capacity: rate,
                    tokens: 0.0,
                    last: Instant::now(),
                })
            }),
        }
    }

    pub fn unlimited() -> Budget {
        Budget { state: None }
    }

    /// Wait until the budget is out of debt. Call before a request.
    pub async fn ready(&self) {
        loop {
            let wait = match &self.state {
                None => return,
                Some(m) => {
                    let mut b = m.lock().await;
                    b.refill(Instant::now());
                    if b.tokens >= 0.0 {
                        return;
                    }
                    Duration::from_secs_f64(-b.tokens / b.rate)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Record what a request consumed.
    pub async fn spend(&self, units: f64) {
        if let Some(m) = &self.state {
            let mut b = m.lock().await;
            b.refill(Instant::now());
            b.tokens -= units;
        }
    }

    pub async fn rate(&self) -> Option<f64> {
        match &self.state {
            None => None,
            Some(m) => Some(m.lock().await.rate),
        }
    }

    /// Change the rate; waiting callers see it at their next check.
    pub async fn set_rate(&self, rate: f64) {
        if let Some(m) = &self.state {
            let mut b = m.lock().await;
            b.refill(Instant::now());
            b.rate = rate.max(0.1);
            b.capacity = b.rate;
            b.tokens = b.tokens.min(b.capacity);
        }
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
}
