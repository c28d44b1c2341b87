//! Retry timing shared by every AWS call loop: exponential backoff with full
//! jitter.

use std::time::Duration;

/// Backoff for retry `attempt` (0-based): exponential from 50 ms, capped at
/// 5 s, with full jitter so that parallel writers do not retry in lockstep.
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let base = 0.05 * 2f64.powi(attempt.min(16) as i32);
    Duration::from_secs_f64(base.min(5.0) * jitter.clamp(0.0, 1.0))
}

/// A cheap jitter source; the quality of randomness does not matter here, only
/// that concurrent writers differ.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() % 1_000_000) as f64 / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0, 1.0), Duration::from_millis(50));
        assert_eq!(backoff(3, 1.0), Duration::from_millis(400));
        assert_eq!(backoff(30, 1.0), Duration::from_secs(5));
        assert_eq!(backoff(3, 0.0), Duration::ZERO);
        let j = jitter();
        assert!((0.0..1.0).contains(&j));
    }
}
