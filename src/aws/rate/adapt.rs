//! One adaptive rate: how far to come down when DynamoDB throttles, and how
//! to go back up.
//!
//! A throttle means the rate crossed a limit nobody told rekey about — the
//! table's capacity, a partition's 1,000 WCU/s, other writers' share. What
//! went through in the second before is the best measure of that limit, so
//! the controller remembers it (the *limit found*) and:
//!
//! * **cuts** to 90 % of it — not to 80 % of whatever the rate was: behind a
//!   limit at a tenth of the operator's rate, four cuts land under the limit
//!   instead of eleven. One signal finds at least [`LEAST`] of the rate (a
//!   measure that says less is more likely lagging answers than the limit),
//!   and with nothing measured yet, [`UNMEASURED`] of it;
//! * **holds** for a second: throttles of requests already in flight are the
//!   same burst, one signal;
//! * **returns** to the limit found along a cubic (as TCP CUBIC does: quick
//!   at first, flat near the limit), in [`APPROACH`] seconds from a 10 % cut;
//! * **probes** above it slowly — 1 % of the limit found in the first second,
//!   each second 5 % more than the last — so a limit that went up (the
//!   table's capacity raised, another writer gone) is found again (five
//!   times higher in a minute or so), and one that did not costs a short,
//!   shallow overshoot.
//!
//! The curve's clock runs only while the rate is in use (what went out is at
//! least [`IN_USE`] of it): a rate nobody uses proves nothing, and one that
//! climbed while idle would storm when the work comes back.
//!
//! Every step is proportional to the limit found, never to the operator's
//! ceiling: the old rule (+5 % of the ceiling each quiet second) added half
//! the limit every second when the ceiling was ten times the limit — a storm
//! of throttles every few seconds. The rate stays between 1 % of the ceiling
//! and the ceiling.
//!
//! Time is passed in, so this is a plain function of its inputs; tests drive
//! it with a simulated limiter.

use std::time::Duration;

use tokio::time::Instant;

/// A cut leaves the rate at this share of the limit found.
pub(crate) const CUT_TO: f64 = 0.9;
/// After a cut the rate holds this long; throttles in it are the same burst.
pub(crate) const HOLD: Duration = Duration::from_secs(1);
/// Seconds (after the hold) to climb from a 10 % cut back to the limit found.
pub(crate) const APPROACH: f64 = 8.0;
/// Above the limit found: the first second's step, as a share of it…
pub(crate) const PROBE: f64 = 0.01;
/// …growing by this share every second.
pub(crate) const PROBE_GROWTH: f64 = 0.05;
/// The rate never goes below this share of the ceiling.
pub(crate) const FLOOR: f64 = 0.01;
/// One signal finds a limit of at least this share of the rate.
pub(crate) const LEAST: f64 = 0.5;
/// With nothing measured, the limit is taken to be this share of the rate.
pub(crate) const UNMEASURED: f64 = 0.7;
/// The rate climbs only while at least this share of it is used.
pub(crate) const IN_USE: f64 = 0.8;

#[derive(Debug, Clone)]
pub struct Adaptive {
    ceiling: f64,
    rate: f64,
    /// What went through in the second before throttling last started.
    limit: Option<f64>,
    /// The last cut: when, and the rate it cut to.
    cut: Option<(Instant, f64)>,
    /// The last call of [`Adaptive::at`], and the time since the cut the
    /// rate was not in use (the curve's clock stood still).
    seen: Option<Instant>,
    unused: Duration,
}

impl Adaptive {
    /// Starts at the ceiling: nothing is known about any limit yet.
    pub fn new(ceiling: f64) -> Adaptive {
        Adaptive {
            ceiling,
            rate: ceiling,
            limit: None,
            cut: None,
            seen: None,
            unused: Duration::ZERO,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The limit found at the last throttle, if there was one.
    pub fn limit(&self) -> Option<f64> {
        self.limit
    }

    /// Whether a throttle at `now` would be a new signal (not the burst of the last cut).
    pub(crate) fn is_new_signal(&self, now: Instant) -> bool {
        self.cut
            .is_none_or(|(at, _)| now.saturating_duration_since(at) >= HOLD)
    }

    /// A throttle at `now`, when `achieved` units went through in the second
    /// before (None: not measured): the new rate if this is a new signal,
    /// None if it belongs to the burst of the last cut.
    pub fn throttled(&mut self, now: Instant, achieved: Option<f64>) -> Option<f64> {
        if !self.is_new_signal(now) {
            return None;
        }
        let floor = self.ceiling * FLOOR;
        // More than the rate cannot have been the limit (a saved-up moment
        // of budget can briefly send more), and one signal says no less than
        // half of it: answers that lag their requests (a slow server, a
        // loaded client) or a burst at a low rate would otherwise leave a
        // limit far too low, from which the slow probe takes minutes. Nothing
        // measured, or nothing through at all: a plain multiplicative cut.
        let found = match achieved {
            Some(a) if a > 0.0 => a.clamp(self.rate * LEAST, self.rate),
            _ => self.rate * UNMEASURED,
        }
        .max(floor);
        self.limit = Some(found);
        self.rate = (found * CUT_TO).max(floor);
        self.cut = Some((now, self.rate));
        self.seen = Some(now);
        self.unused = Duration::ZERO;
        Some(self.rate)
    }

    /// The rate at `now`, `used` units a second going out (over the last
    /// second), with no new signal since the last call: the ceiling while
    /// no limit is known; else held, then back to the limit found along a
    /// cubic, then probing above it — the curve's clock running only while
    /// the rate is in use.
    pub fn at(&mut self, now: Instant, used: f64) -> f64 {
        let (Some(limit), Some((at, from))) = (self.limit, self.cut) else {
            return self.rate;
        };
        if let Some(seen) = self.seen
            && used < IN_USE * self.rate
        {
            self.unused += now.saturating_duration_since(seen);
        }
        self.seen = Some(now.max(self.seen.unwrap_or(now)));
        let t = now.saturating_duration_since(at).as_secs_f64()
            - HOLD.as_secs_f64()
            - self.unused.as_secs_f64();
        if t <= 0.0 {
            return self.rate;
        }
        let gap = (limit - from).max(0.0);
        // CUBIC's K: the time to climb back, cube-root in the depth of the cut.
        let k = APPROACH * (gap / (limit * (1.0 - CUT_TO))).cbrt();
        let target = if t < k {
            limit - gap * (1.0 - t / k).powi(3)
        } else {
            // The sum of steps growing by PROBE_GROWTH a second, made continuous.
            let g = (1.0 + PROBE_GROWTH).ln();
            limit * (1.0 + PROBE * ((g * (t - k)).exp() - 1.0) / g)
        };
        self.rate = target.clamp(self.ceiling * FLOOR, self.ceiling);
        self.rate
    }

    /// A new ceiling from the operator: start again at it, the limit found forgotten.
    #[cfg(test)]
    pub(crate) fn reset(&mut self, ceiling: f64) {
        *self = Adaptive::new(ceiling);
    }
}

/// Units per second over (about) the last second, from two one-second
/// counts: the current second's, and the previous one's weighted by the part
/// of it still in the window. Cheap enough to keep per key.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Recent {
    second: u64,
    current: f64,
    previous: f64,
}

impl Recent {
    /// Seconds since `epoch`, and how far into the current one.
    fn clock(epoch: Instant, now: Instant) -> (u64, f64) {
        let t = now.saturating_duration_since(epoch).as_secs_f64();
        (t as u64, t.fract())
    }

    fn roll(&mut self, second: u64) {
        if second == self.second + 1 {
            self.previous = self.current;
        } else if second > self.second {
            self.previous = 0.0;
        }
        if second > self.second {
            self.current = 0.0;
            self.second = second;
        }
    }

    pub fn add(&mut self, epoch: Instant, now: Instant, units: f64) {
        let (second, _) = Recent::clock(epoch, now);
        self.roll(second);
        self.current += units;
    }

    /// Units in the second up to `now`.
    pub(crate) fn last_second(&self, epoch: Instant, now: Instant) -> f64 {
        let (second, frac) = Recent::clock(epoch, now);
        let mut r = *self;
        r.roll(second);
        (r.current + r.previous * (1.0 - frac)).max(0.0)
    }

    /// Nothing counted in the last two seconds.
    pub(crate) fn is_idle(&self, epoch: Instant, now: Instant) -> bool {
        let (second, _) = Recent::clock(epoch, now);
        second > self.second + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn the_first_throttle_cuts_to_what_went_through_not_to_a_share_of_the_rate() {
        let t0 = Instant::now();
        let mut a = Adaptive::new(4000.0);
        assert_eq!(
            a.at(t0 + secs(5.0), 0.0),
            4000.0,
            "no limit known: the ceiling"
        );
        // At least half the rate per signal.
        assert_eq!(a.throttled(t0 - secs(2.0), Some(430.0)), Some(1800.0));
        assert_eq!(a.throttled(t0 - secs(1.0), Some(430.0)), Some(810.0));
        assert_eq!(a.throttled(t0, Some(430.0)), Some(387.0));
        assert_eq!(a.limit(), Some(430.0));
        assert_eq!(
            a.throttled(t0 + secs(0.5), Some(10.0)),
            None,
            "the same burst"
        );
        let busy = 1000.0; // always in use
        assert_eq!(a.at(t0 + secs(0.9), busy), 387.0, "held");
        // Back to the limit found in APPROACH seconds after the hold, concave.
        let r1 = a.at(t0 + secs(2.0), busy);
        let r4 = a.at(t0 + secs(5.0), busy);
        let back = a.at(t0 + HOLD + secs(APPROACH), busy);
        assert!(r1 - 387.0 > (r4 - r1) / 3.0 && r4 < 430.0, "{r1} {r4}");
        assert!((back - 430.0).abs() < 1e-6, "{back}");
        // Then 1 % of the limit found in the first second above it.
        let probe = a.at(t0 + HOLD + secs(APPROACH + 1.0), busy);
        assert!((probe - 430.0 * 1.01).abs() < 0.3, "{probe}");
        // Nothing went through: a multiplicative cut; far below: halving, to the floor.
        let t = t0 + secs(30.0);
        let r = a.rate();
        assert!((a.throttled(t - secs(10.0), None).unwrap() - r * 0.63).abs() < 1e-9);
        let r = a.rate();
        assert!((a.throttled(t - secs(5.0), Some(1.0)).unwrap() - r * 0.45).abs() < 1e-9);
        for i in 0..4 {
            a.throttled(t - secs(4.0 - i as f64), Some(1.0));
        }
        assert_eq!(a.rate(), 40.0);
        // Not in use: the rate stays where it is.
        assert_eq!(a.at(t + secs(3600.0), 20.0), 40.0);
        // Never above the ceiling, however long it probes.
        assert_eq!(a.at(t + secs(3601.0), 40.0), 40.0);
        assert_eq!(a.at(t + secs(7200.0), 40.0), 4000.0);
        a.reset(100.0);
        assert_eq!((a.rate(), a.limit()), (100.0, None));
    }

    /// A token bucket as DynamoDB keeps one (rate, one second of burst,
    /// starting full), fed by a sender at the controller's rate in 10 ms
    /// steps; a refused request is a throttle. Returns the controller's rate
    /// per second and the refused units per second.
    fn simulate(limit: impl Fn(f64) -> f64, ceiling: f64, seconds: usize) -> (Vec<f64>, Vec<f64>) {
        let t0 = Instant::now();
        let dt = 0.01;
        let mut a = Adaptive::new(ceiling);
        let mut bucket = limit(0.0);
        let mut admitted = Recent::default();
        let (mut rates, mut refused) = (Vec::new(), Vec::new());
        let mut refused_now = 0.0;
        let mut rate_sum = 0.0;
        for step in 0..seconds * 100 {
            let t = step as f64 * dt;
            let now = t0 + secs(t);
            let l = limit(t);
            bucket = (bucket + l * dt).min(l);
            let want = a.at(now, a.rate()) * dt;
            rate_sum += a.rate();
            let take = want.min(bucket.max(0.0));
            bucket -= take;
            admitted.add(t0, now, take);
            if want - take > 1e-9 {
                refused_now += want - take;
                a.throttled(now, Some(admitted.last_second(t0, now)));
            }
            if (step + 1) % 100 == 0 {
                rates.push(rate_sum / 100.0);
                refused.push(refused_now);
                rate_sum = 0.0;
                refused_now = 0.0;
            }
        }
        (rates, refused)
    }

    #[test]
    fn behind_a_limit_at_a_tenth_of_the_ceiling_it_settles_near_it_and_stays() {
        let (rates, refused) = simulate(|_| 400.0, 4000.0, 300);
        let settled = &rates[10..];
        let mean = settled.iter().sum::<f64>() / settled.len() as f64;
        let (lo, hi) = settled
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        // Settles within 5 % of the limit on average, never oscillating more
        // than 15 % either way.
        assert!(
            (380.0..=420.0).contains(&mean),
            "mean {mean:.0}: {rates:.0?}"
        );
        assert!(lo >= 340.0 && hi <= 460.0, "{lo:.0}..{hi:.0}: {rates:.0?}");
        // Refused after the first 10 s: under 2 % of what went through.
        let refused_after: f64 = refused[10..].iter().sum();
        assert!(
            refused_after < 0.02 * 400.0 * 290.0,
            "{refused_after:.0}: {refused:.0?}"
        );
        // Before: no more than a couple of seconds' storm.
        assert!(refused[..10].iter().sum::<f64>() < 4000.0, "{refused:.0?}");
    }

    #[test]
    fn a_limit_that_rises_is_found_again_within_a_minute_and_one_that_drops_at_once() {
        let (rates, _) = simulate(|t| if t < 60.0 { 400.0 } else { 2000.0 }, 4000.0, 180);
        let at = |s: usize| rates[s];
        assert!(at(55) < 460.0, "{rates:.0?}");
        assert!(at(150) > 1700.0, "found again: {rates:.0?}");
        let (rates, refused) = simulate(|t| if t < 60.0 { 2000.0 } else { 200.0 }, 4000.0, 120);
        assert!(rates[63] < 230.0, "{rates:.0?}");
        assert!(
            refused[70..].iter().sum::<f64>() < 0.02 * 200.0 * 50.0,
            "{refused:.0?}"
        );
    }

    #[test]
    fn recent_counts_about_the_last_second() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        r.add(t0, t0 + secs(0.5), 10.0);
        r.add(t0, t0 + secs(1.2), 20.0);
        // 20 this second, and 80 % of the previous second's 10.
        assert!((r.last_second(t0, t0 + secs(1.2)) - 28.0).abs() < 1e-9);
        assert!((r.last_second(t0, t0 + secs(2.5)) - 10.0).abs() < 1e-9);
        assert_eq!(r.last_second(t0, t0 + secs(3.0)), 0.0);
        assert!(r.is_idle(t0, t0 + secs(3.0)) && !r.is_idle(t0, t0 + secs(2.9)));
    }
}
