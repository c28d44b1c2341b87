//! The shard count: how many calculated shards keep the hottest key's share of
//! the application's traffic under a partition's limit, with headroom.
//!
//! A partition-key value lives on one partition, which serves at most a fixed
//! number of units per second (the limits are the caller's: `phase::analyze`
//! names DynamoDB's). Splitting the key into N shards by a hash of an id
//! divides its load by about N, so the answer is the smallest N with
//! `load / N <= limit × (1 − headroom)`; the headroom absorbs the hash's
//! imbalance and growth.

use serde::Serialize;

/// How the shard count is rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardRounding {
    /// The smallest power of two that satisfies the inequality (the default:
    /// shards can later be doubled by splitting each in two).
    PowerOfTwo,
    /// The smallest integer that satisfies it.
    Exact,
}

/// The largest shard count suggested: past it, a key design change is needed,
/// not more shards.
pub const MAX_SHARDS: u32 = 4096;

/// The per-key units/s one shard may take: `limit × (1 − headroom)`.
pub fn budget(limit: f64, headroom: f64) -> f64 {
    limit * (1.0 - headroom.clamp(0.0, 0.99))
}

/// The smallest N (rounded as asked) with `load / N <= budget`; 1 when the
/// load already fits, `None` past [`MAX_SHARDS`] or for a budget that is not
/// positive.
pub fn shard_count(load: f64, budget: f64, rounding: ShardRounding) -> Option<u32> {
    if budget.is_nan() || budget <= 0.0 || !load.is_finite() {
        return None;
    }
    if load <= budget {
        return Some(1);
    }
    let mut n = (load / budget).ceil().max(1.0) as u64;
    // `ceil` of a ratio computed in floating point can land one above or below.
    while n > 1 && load / (n - 1) as f64 <= budget {
        n -= 1;
    }
    while load / n as f64 > budget {
        n += 1;
    }
    if rounding == ShardRounding::PowerOfTwo {
        n = n.next_power_of_two();
    }
    (n <= u64::from(MAX_SHARDS)).then_some(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_demo_numbers() {
        // 35.2 % of 20,000 writes/s on one key, 500 WCU/s per shard.
        let b = budget(1000.0, 0.5);
        assert_eq!(b, 500.0);
        assert_eq!(shard_count(7040.0, b, ShardRounding::PowerOfTwo), Some(16));
        assert_eq!(shard_count(7040.0, b, ShardRounding::Exact), Some(15));
        assert_eq!(shard_count(400.0, b, ShardRounding::PowerOfTwo), Some(1));
        assert_eq!(shard_count(500.0, b, ShardRounding::PowerOfTwo), Some(1));
        assert_eq!(shard_count(1e12, b, ShardRounding::PowerOfTwo), None);
        assert_eq!(shard_count(10.0, 0.0, ShardRounding::Exact), None);
    }

    proptest! {
        #[test]
        fn the_count_is_the_smallest_power_of_two_that_fits(
            load in 0.0f64..1e6, limit in 1.0f64..5000.0, headroom in 0.0f64..0.9,
        ) {
            let b = budget(limit, headroom);
            match shard_count(load, b, ShardRounding::PowerOfTwo) {
                Some(n) => {
                    prop_assert!(n.is_power_of_two());
                    prop_assert!(load / f64::from(n) <= b);
                    if n > 1 {
                        prop_assert!(load / f64::from(n / 2) > b);
                    }
                }
                None => prop_assert!(load / f64::from(MAX_SHARDS) > b),
            }
            if let Some(n) = shard_count(load, b, ShardRounding::Exact) {
                prop_assert!(load / f64::from(n) <= b);
                prop_assert!(n == 1 || load / f64::from(n - 1) > b);
            }
        }
    }
}
