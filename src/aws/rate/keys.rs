//! Adaptive rates per partition key, for the keys DynamoDB throttled.
//!
//! A partition key value has a limit of its own (1,000 WCU/s on DynamoDB,
//! less when its partition is shared with busy neighbours). A throttle of one
//! hot key is no reason to slow the whole table: that key alone gets an
//! [`Adaptive`] rate, found and probed exactly as the table's is, and the
//! other keys go on at the table's pace.
//!
//! Whose throttle is it? DynamoDB says so when it refuses a whole request
//! (`ThrottlingReasons`: `…KeyRangeThroughputExceeded` or the table's), but a
//! batch's refused entries come back as `UnprocessedItems` with no reason.
//! For those, what DynamoDB said last (within [`MEMORY`]) decides; with
//! nothing said yet, the refused keys are blamed when every one of them was
//! **busy**: it sent at least a fifth of what it was allowed (its adaptive
//! rate, or `--key-write-rate`) in the last second. Behind a table limit,
//! the keys refused are whichever happened to be in the batch, most of them
//! sending a trickle: the table slows down. Behind a per-key limit, the keys
//! refused are the hot ones: only they slow down.
//!
//! Memory is bounded: a key's send counts are kept while it sent in the last
//! two seconds, and at most [`KeyRates::new`]'s `max_limited` keys hold a
//! rate of their own; a limited key idle for [`IDLE`], or back at the
//! ceiling, is forgotten (the least recently used goes first when full).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::adapt::{Adaptive, Recent};

/// A refused key sent at least this share of its allowance in the last second: busy.
pub(crate) const BUSY: f64 = 0.2;
/// What DynamoDB's ThrottlingReasons said last decides for UnprocessedItems this long.
pub(crate) const MEMORY: Duration = Duration::from_secs(60);
/// A limited key with no write for this long is forgotten.
pub(crate) const IDLE: Duration = Duration::from_secs(30);

/// Whose limit a throttle hit, as far as the keys can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The refused keys' own: only they slow down.
    Keys,
    /// The table's (or unknown): the table's rate comes down.
    Table,
}

pub(crate) struct KeyRates {
    ceiling: f64,
    /// Seconds of its rate a limited key may send at once.
    burst: f64,
    max_limited: usize,
    epoch: Instant,
    inner: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    /// Every key written in the last two seconds: units sent and admitted.
    seen: HashMap<String, Seen>,
    limited: HashMap<String, Limited>,
    /// What DynamoDB's ThrottlingReasons said last, and when.
    said: Option<(Blame, Instant)>,
    /// The second of the last prune.
    pruned: u64,
}

#[derive(Clone, Copy)]
struct Seen {
    /// The key's first write (since it was last forgotten).
    since: Instant,
    sent: Recent,
    admitted: Recent,
}

struct Limited {
    rate: Adaptive,
    /// A token bucket at the rate, holding at most `burst` seconds of it:
    /// taken when a write goes, never reserved ahead (a queue of
    /// reservations would hold batches, and their other keys' writes, for
    /// seconds, then let them go in a bunch).
    tokens: f64,
    last: Instant,
    last_used: Instant,
}

/// The limited keys' rates, for progress samples.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub(crate) struct KeyRatesSummary {
    pub limited: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl KeyRates {
    /// `ceiling`: WCU/s any one key may take (`--key-write-rate`); `burst`:
    /// seconds of its rate a limited key may send at once.
    pub fn new(ceiling: f64, burst: f64, max_limited: usize) -> KeyRates {
        KeyRates {
            ceiling,
            burst,
            max_limited: max_limited.max(1),
            epoch: Instant::now(),
            inner: Mutex::new(Keys::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take `units` for a write of `key` now: Ok (counted as sent) if its
    /// rate allows, else how long until it could.
    pub fn take(&self, key: &str, units: f64, now: Instant) -> Result<(), Duration> {
        let epoch = self.epoch;
        let mut k = self.lock();
        k.prune(epoch, now, self.ceiling);
        let sent = k
            .seen
            .get(key)
            .map_or(0.0, |s| s.sent.last_second(epoch, now));
        if let Some(l) = k.limited.get_mut(key) {
            l.last_used = now;
            let rate = l.rate.at(now, sent).max(f64::MIN_POSITIVE);
            let dt = now.saturating_duration_since(l.last).as_secs_f64();
            l.tokens = (l.tokens + dt * rate).min((rate * self.burst).max(units));
            l.last = now;
            if l.tokens < units {
                return Err(Duration::from_secs_f64((units - l.tokens) / rate));
            }
            l.tokens -= units;
        }
        match k.seen.get_mut(key) {
            Some(s) => s.sent.add(epoch, now, units),
            None => {
                let mut s = Seen {
                    since: now,
                    sent: Recent::default(),
                    admitted: Recent::default(),
                };
                s.sent.add(epoch, now, units);
                k.seen.insert(key.to_string(), s);
            }
        }
        Ok(())
    }

    /// DynamoDB's answer for some of a batch's keys: `written` went through,
    /// `refused` were throttled (`explicit`: what its ThrottlingReasons said,
    /// None for UnprocessedItems). Whose limit it was: what DynamoDB said,
    /// else what it said last (within [`MEMORY`]), else the keys' if every
    /// refused key was busy. Keys blamed are slowed.
    pub fn answered(
        &self,
        written: &[(&str, f64)],
        refused: &[&str],
        explicit: Option<Blame>,
        now: Instant,
    ) -> Blame {
        let epoch = self.epoch;
        let mut k = self.lock();
        for (key, units) in written {
            if let Some(s) = k.seen.get_mut(*key) {
                s.admitted.add(epoch, now, *units);
            }
        }
        if let Some(b) = explicit {
            k.said = Some((b, now));
        }
        if refused.is_empty() {
            return Blame::Table;
        }
        let said = k
            .said
            .filter(|(_, at)| now.saturating_duration_since(*at) < MEMORY)
            .map(|(b, _)| b);
        let blame = match explicit.or(said) {
            Some(b) => b,
            None if refused
                .iter()
                .all(|key| k.is_busy(key, self.ceiling, epoch, now)) =>
            {
                Blame::Keys
            }
            None => Blame::Table,
        };
        if blame == Blame::Keys {
            let mut keys = refused.to_vec();
            keys.sort_unstable();
            keys.dedup();
            for key in keys {
                k.signal(key, self, now);
            }
        }
        blame
    }

    /// The limited keys' rates now, if any.
    pub fn summary(&self) -> Option<KeyRatesSummary> {
        let k = self.lock();
        let mut rates: Vec<f64> = k.limited.values().map(|l| l.rate.rate()).collect();
        if rates.is_empty() {
            return None;
        }
        rates.sort_by(f64::total_cmp);
        Some(KeyRatesSummary {
            limited: rates.len(),
            min: rates[0],
            median: rates[rates.len() / 2],
            max: rates[rates.len() - 1],
        })
    }

    /// Keys counted and keys limited: what memory holds.
    #[cfg(test)]
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let k = self.lock();
        (k.seen.len(), k.limited.len())
    }
}

impl Keys {
    fn is_busy(&mut self, key: &str, ceiling: f64, epoch: Instant, now: Instant) -> bool {
        let allowed = match self.limited.get_mut(key) {
            Some(l) => l.rate.rate(),
            None => ceiling,
        };
        self.seen
            .get(key)
            .is_some_and(|s| s.sent.last_second(epoch, now) >= BUSY * allowed)
    }

    /// A throttle of `key`: its rate comes down to 90 % of what it got
    /// through in the last second, as the table's would.
    fn signal(&mut self, key: &str, rates: &KeyRates, now: Instant) {
        // Not before a second of answers: in the first moments they say too little.
        let achieved = self
            .seen
            .get(key)
            .filter(|s| now.saturating_duration_since(s.since) >= Duration::from_secs(1))
            .map(|s| s.admitted.last_second(rates.epoch, now));
        if !self.limited.contains_key(key) {
            if self.limited.len() >= rates.max_limited {
                let oldest = self
                    .limited
                    .iter()
                    .min_by_key(|(_, l)| l.last_used)
                    .map(|(k, _)| k.clone());
                if let Some(o) = oldest {
                    self.limited.remove(&o);
                }
            }
            self.limited.insert(
                key.to_string(),
                Limited {
                    rate: Adaptive::new(rates.ceiling),
                    tokens: 0.0,
                    last: now,
                    last_used: now,
                },
            );
        }
        if let Some(l) = self.limited.get_mut(key) {
            l.rate.throttled(now, achieved);
            l.last_used = now;
        }
    }

    /// Once a second: forget keys idle for two seconds, and limited keys idle
    /// for [`IDLE`] or back at the ceiling.
    fn prune(&mut self, epoch: Instant, now: Instant, ceiling: f64) {
        let second = now.saturating_duration_since(epoch).as_secs();
        if second == self.pruned {
            return;
        }
        self.pruned = second;
        self.seen.retain(|_, s| !s.sent.is_idle(epoch, now));
        self.limited.retain(|_, l| {
            now.saturating_duration_since(l.last_used) < IDLE && l.rate.rate() < ceiling
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_busy_key_refused_is_slowed_alone_and_a_trickle_refused_blames_the_table() {
        let t0 = Instant::now();
        let k = KeyRates::new(300.0, 0.25, 100);
        // `hot` sends 200 units in the second, `cold` 2.
        for i in 0..200 {
            let now = t0 + ms(i * 5);
            assert_eq!(k.take("hot", 1.0, now), Ok(()), "not limited yet");
            k.answered(&[("hot", 1.0)], &[], None, now);
        }
        let _ = k.take("cold", 2.0, t0 + ms(990));
        let now = t0 + ms(1000);
        assert_eq!(k.answered(&[], &["hot"], None, now), Blame::Keys);
        assert_eq!(k.answered(&[], &["hot", "cold"], None, now), Blame::Table);
        assert_eq!(
            k.answered(&[], &["cold"], Some(Blame::Keys), now),
            Blame::Keys,
            "DynamoDB named a key"
        );
        assert_eq!(
            k.answered(&[], &["hot"], Some(Blame::Table), now),
            Blame::Table
        );
        let s = k.summary().unwrap();
        // `hot` got 200 through: cut to 90 % of it; `cold` got nothing
        // through: 90 % of 70 % of the ceiling.
        assert_eq!(s.limited, 2);
        assert!(
            (s.min - 180.0).abs() < 1e-9 && (s.max - 189.0).abs() < 1e-9,
            "{s:?}"
        );
        // A limited key waits for its rate: 180 units/s, from an empty bucket.
        let later = now + ms(100);
        let taken = (0..60)
            .take_while(|_| k.take("hot", 1.0, later).is_ok())
            .count();
        assert_eq!(taken, 18, "a tenth of a second's worth");
        let wait = k.take("hot", 1.0, later).unwrap_err();
        assert!(wait > ms(5) && wait < ms(6), "{wait:?}");
        // After a second: no more than a quarter second's worth at once.
        let taken = (0..60)
            .take_while(|_| k.take("hot", 1.0, later + ms(1000)).is_ok())
            .count();
        assert_eq!(taken, 45);
        assert_eq!(k.take("other", 1.0, later), Ok(()));
    }

    #[test]
    fn what_dynamodb_said_last_decides_for_unprocessed_items_for_a_minute() {
        let t0 = Instant::now();
        let k = KeyRates::new(300.0, 0.25, 100);
        let _ = k.take("cold", 1.0, t0);
        assert_eq!(k.answered(&[], &["cold"], None, t0), Blame::Table);
        k.answered(&[], &["x"], Some(Blame::Keys), t0);
        assert_eq!(k.answered(&[], &["cold"], None, t0 + ms(500)), Blame::Keys);
        let later = t0 + MEMORY + ms(500);
        assert_eq!(k.answered(&[], &["cold"], None, later), Blame::Table);
        k.answered(&[], &["y"], Some(Blame::Table), later);
        let _ = k.take("hot", 100.0, later);
        assert_eq!(
            k.answered(&[], &["hot"], None, later),
            Blame::Table,
            "the table, said last, even for a busy key"
        );
    }

    #[test]
    fn memory_is_bounded_and_idle_keys_are_forgotten() {
        let t0 = Instant::now();
        let k = KeyRates::new(300.0, 0.25, 3);
        for i in 0..10 {
            let key = format!("k{i}");
            let _ = k.take(&key, 200.0, t0);
            k.answered(&[], &[&key], Some(Blame::Keys), t0 + ms(i));
        }
        assert_eq!(k.sizes(), (10, 3), "at most 3 limited keys");
        let _ = k.take("x", 1.0, t0 + Duration::from_secs(3));
        assert_eq!(k.sizes().0, 1, "keys idle for two seconds are forgotten");
        let _ = k.take("x", 1.0, t0 + IDLE + Duration::from_secs(1));
        assert_eq!(k.sizes(), (1, 0), "limited keys idle for IDLE too");
    }
}
