//! The lease decisions, as pure functions of what a worker read and its own
//! clock (a monotonic offset), so that unit tests can walk every case.
//!
//! Expiry is judged the way the Kinesis Client Library judges it, never from
//! another machine's clock: a taker remembers, per unit, the (lease, beat)
//! pair it last saw and when *it* first saw it; the lease has expired once
//! that pair has not moved for a whole lease duration on the taker's clock.
//! The holder fences itself on *its* clock: it writes only while its last
//! successful renewal, timed from when the renewal was sent, is younger than
//! [`FENCE_FRACTION`] of the duration. Clocks may disagree by any offset;
//! only their rates must agree to within the margin between the two
//! (half a lease duration), which every real clock does.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use super::Unit;

/// What the lease decisions read of a leased item: a Scan segment's unit or
/// a stream shard's (`super::shard`), judged alike.
pub trait Leased {
    type Key: Hash + Eq + Clone;
    fn key(&self) -> Self::Key;
    fn owner(&self) -> Option<&str>;
    fn lease(&self) -> u64;
    fn beat(&self) -> u64;
    fn done(&self) -> bool;
}

/// [`Leased`] for a struct with `owner`, `lease` and `beat` fields, its key
/// and its done flag where it keeps them.
macro_rules! leased {
    ($t:ty, $k:ty, $key:ident, $($done:ident).+) => {
        impl $crate::state::fleet::lease::Leased for $t {
            type Key = $k;
            fn key(&self) -> $k {
                self.$key.clone()
            }
            fn owner(&self) -> Option<&str> {
                self.owner.as_deref()
            }
            fn lease(&self) -> u64 {
                self.lease
            }
            fn beat(&self) -> u64 {
                self.beat
            }
            fn done(&self) -> bool {
                self.$($done).+
            }
        }
    };
}
pub(crate) use leased;

leased!(Unit, u32, n, done);

/// The holder writes only while its last renewal is younger than this share
/// of the lease duration; a taker waits the whole duration.
pub const FENCE_FRACTION: f64 = 0.5;

/// Renewals per lease duration.
pub const BEATS_PER_LEASE: u32 = 5;

/// What a worker remembers of a unit it does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub lease: u64,
    pub beat: u64,
    /// When this worker first read this (lease, beat): its own monotonic clock.
    pub since: Duration,
}

/// What a worker may do with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// Finished: nothing to take.
    Done,
    /// Nobody holds it: take it if `lease` is still its counter.
    Free { lease: u64 },
    /// Its holder has not renewed for a whole lease duration on this
    /// worker's clock: take it if `lease` and `beat` still hold.
    Expired { lease: u64, beat: u64 },
    /// Held, and renewed recently enough (or not watched long enough yet).
    Held,
    /// This worker holds it.
    Mine,
}

/// The observations of every unit (or shard), updated at each read.
#[derive(Debug, Clone)]
pub struct Observer<K = u32> {
    seen: HashMap<K, Seen>,
}

impl<K> Default for Observer<K> {
    fn default() -> Self {
        Observer {
            seen: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> Observer<K> {
    /// Records what was read at `now`: a (lease, beat) not seen before
    /// starts a new wait.
    pub fn observe<L: Leased<Key = K>>(&mut self, unit: &L, now: Duration) -> Seen {
        let fresh = Seen {
            lease: unit.lease(),
            beat: unit.beat(),
            since: now,
        };
        let e = self.seen.entry(unit.key()).or_insert(fresh);
        if e.lease != unit.lease() || e.beat != unit.beat() {
            *e = fresh;
        }
        *e
    }
}

/// The decision for `unit`, read at `now` (after [`Observer::observe`]).
pub fn judge<L: Leased>(
    unit: &L,
    me: &str,
    seen: &Seen,
    now: Duration,
    duration: Duration,
) -> Judgement {
    if unit.done() {
        return Judgement::Done;
    }
    match unit.owner() {
        None => Judgement::Free {
            lease: unit.lease(),
        },
        Some(o) if o == me => Judgement::Mine,
        Some(_) => {
            let unchanged = seen.lease == unit.lease() && seen.beat == unit.beat();
            if unchanged && now.saturating_sub(seen.since) >= duration {
                Judgement::Expired {
                    lease: unit.lease(),
                    beat: unit.beat(),
                }
            } else {
                Judgement::Held
            }
        }
    }
}

/// May the holder still write? `renewed`: when its last successful renewal
/// (or the take) was *sent*, on its own clock.
pub fn may_write(renewed: Duration, now: Duration, duration: Duration) -> bool {
    now.saturating_sub(renewed) < duration.mul_f64(FENCE_FRACTION)
}

/// Units this worker should hold: its share of the units not done, rounded
/// up, at most `max`, at least one.
pub fn share(open_units: usize, live_workers: usize, max: usize) -> usize {
    open_units
        .div_ceil(live_workers.max(1))
        .clamp(1, max.max(1))
}

/// What a worker sees when it asks whether to hand a unit back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    /// Units this worker holds (none of them being handed back already).
    pub held: usize,
    /// Units not done.
    pub open: usize,
    /// Live workers, this one included.
    pub live: usize,
    /// The fewest units any *other* live worker holds (None: no other).
    pub fewest_other: Option<usize>,
    /// Units nobody holds right now (a hand-back not taken yet).
    pub free: usize,
    /// `--max-units`.
    pub max: usize,
}

/// Should this worker hand one unit back (at its next page boundary)? Only
/// above its fair share ([`share`]), only when another live worker holds at
/// least two fewer (the hysteresis: after the move the taker holds at most
/// what the giver keeps, so it never wants to give the unit back), and only
/// when no unit is free (the last one handed back was taken: one at a time,
/// and never more than the others take).
pub fn hand_back(b: Balance) -> bool {
    b.free == 0
        && b.held > share(b.open, b.live, b.max)
        && b.fewest_other.is_some_and(|f| f + 2 <= b.held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fleet::{Checkpoint, Counters};

    const D: Duration = Duration::from_secs(10);

    fn unit(owner: Option<&str>, lease: u64, beat: u64) -> Unit {
        Unit {
            n: 3,
            file: None,
            owner: owner.map(str::to_string),
            lease,
            beat,
            checkpoint: Checkpoint::Beginning,
            page: 0,
            counts: Counters::default(),
            done: false,
        }
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_free_unit_is_taken_at_its_counter() {
        let u = unit(None, 4, 9);
        let mut o = Observer::default();
        let seen = o.observe(&u, s(0));
        assert_eq!(judge(&u, "a", &seen, s(0), D), Judgement::Free { lease: 4 });
    }

    #[test]
    fn a_done_unit_is_never_taken_even_with_a_stale_owner() {
        let mut u = unit(Some("b"), 1, 0);
        u.done = true;
        let seen = Observer::default().observe(&u, s(0));
        assert_eq!(judge(&u, "a", &seen, s(100), D), Judgement::Done);
    }

    #[test]
    fn a_held_unit_expires_only_after_a_whole_duration_unchanged_on_the_takers_clock() {
        let u = unit(Some("b"), 2, 5);
        let mut o = Observer::default();
        // The first read starts the wait, whatever time the holder wrote.
        let seen = o.observe(&u, s(50));
        assert_eq!(judge(&u, "a", &seen, s(50), D), Judgement::Held);
        let seen = o.observe(&u, s(59));
        assert_eq!(judge(&u, "a", &seen, s(59), D), Judgement::Held);
        let seen = o.observe(&u, s(60));
        assert_eq!(
            judge(&u, "a", &seen, s(60), D),
            Judgement::Expired { lease: 2, beat: 5 }
        );
    }

    #[test]
    fn a_renewal_restarts_the_wait() {
        let mut o = Observer::default();
        o.observe(&unit(Some("b"), 2, 5), s(0));
        let renewed = unit(Some("b"), 2, 6);
        let seen = o.observe(&renewed, s(9));
        assert_eq!(judge(&renewed, "a", &seen, s(18), D), Judgement::Held);
        assert_eq!(
            judge(&renewed, "a", &seen, s(19), D),
            Judgement::Expired { lease: 2, beat: 6 }
        );
    }

    #[test]
    fn a_new_holder_restarts_the_wait() {
        let mut o = Observer::default();
        o.observe(&unit(Some("b"), 2, 5), s(0));
        let taken = unit(Some("c"), 3, 0);
        let seen = o.observe(&taken, s(20));
        assert_eq!(judge(&taken, "a", &seen, s(20), D), Judgement::Held);
    }

    #[test]
    fn my_own_unit_is_mine() {
        let u = unit(Some("a"), 1, 0);
        let seen = Observer::default().observe(&u, s(0));
        assert_eq!(judge(&u, "a", &seen, s(100), D), Judgement::Mine);
    }

    #[test]
    fn the_holder_stops_writing_at_half_the_duration_before_any_taker_can_take() {
        assert!(may_write(s(0), s(4), D));
        assert!(!may_write(s(0), s(5), D));
        // The taker's earliest take: a whole duration after it first saw the
        // last renewal, which was sent before the holder's `renewed`.
        let renewed = s(0);
        let earliest_take = renewed + D;
        let last_write = renewed + D.mul_f64(FENCE_FRACTION);
        assert!(last_write < earliest_take);
    }

    #[test]
    fn the_share_rounds_up_and_stays_within_bounds() {
        assert_eq!(share(16, 4, 8), 4);
        assert_eq!(share(17, 4, 8), 5);
        assert_eq!(share(16, 1, 8), 8);
        assert_eq!(share(0, 3, 8), 1);
        assert_eq!(share(5, 0, 8), 5);
    }

    fn bal(held: usize, open: usize, live: usize, fewest: Option<usize>, free: usize) -> Balance {
        Balance {
            held,
            open,
            live,
            fewest_other: fewest,
            free,
            max: 16,
        }
    }

    #[test]
    fn a_worker_above_its_share_hands_back_to_one_below_it() {
        // Alone on 16 units, a second worker joins holding none.
        assert!(hand_back(bal(16, 16, 2, Some(0), 0)));
        // At its share it keeps them.
        assert!(!hand_back(bal(8, 16, 2, Some(7), 0)));
        // Alone: nobody to hand to.
        assert!(!hand_back(bal(16, 16, 1, None, 0)));
    }

    #[test]
    fn hysteresis_no_hand_back_that_would_just_invert_the_imbalance() {
        // 9 vs 8 on 17 units: at the share (rounded up) — keep.
        assert!(!hand_back(bal(9, 17, 2, Some(8), 0)));
        // 3 vs 2, but a unit finished since the holdings were read (4 open,
        // share 2): moving one would make it 2 vs 3, and back again.
        assert!(!hand_back(bal(3, 4, 2, Some(2), 0)));
        // 4 vs 2: share 3, the taker ends with 3 = what the giver keeps.
        assert!(hand_back(bal(4, 6, 2, Some(2), 0)));
    }

    #[test]
    fn one_hand_back_at_a_time_until_it_is_taken() {
        assert!(!hand_back(bal(16, 16, 2, Some(0), 1)));
        assert!(hand_back(bal(15, 16, 2, Some(1), 0)));
    }
}
