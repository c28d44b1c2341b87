//! Retry timing shared by every AWS call loop: exponential backoff with full
//! jitter; and which throttles the SDK leaves to rekey's own loops.

use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::InterceptorContext;
use aws_sdk_dynamodb::config::retry::{ClassifyRetry, RetryAction};
use aws_smithy_runtime_api::client::retries::classifiers::{RetryClassifierPriority, RetryReason};
use aws_smithy_types::retry::ErrorKind;

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

/// For calls whose throttles rekey's own loop retries (BatchWriteItem): the
/// SDK hands a throttle back at once instead of retrying it itself, which
/// would send it again unpaced and unseen by the adaptive rate, holding the
/// request's share of the budget for seconds. Other failures keep the SDK's
/// retries. Runs after the SDK's own classifiers and overrides a throttle's
/// verdict only.
#[derive(Debug)]
pub struct ThrottlesToCaller;

impl ClassifyRetry for ThrottlesToCaller {
    fn classify_retry(&self, _: &InterceptorContext) -> RetryAction {
        RetryAction::NoActionIndicated
    }

    fn classify_retry_v2(&self, _: &InterceptorContext, previous: &RetryAction) -> RetryAction {
        match previous {
            RetryAction::RetryIndicated(RetryReason::RetryableError {
                kind: ErrorKind::ThrottlingError,
                ..
            }) => RetryAction::RetryForbidden,
            _ => RetryAction::NoActionIndicated,
        }
    }

    fn name(&self) -> &'static str {
        "rekey: throttles to the caller"
    }

    fn priority(&self) -> RetryClassifierPriority {
        RetryClassifierPriority::run_after(RetryClassifierPriority::transient_error_classifier())
    }
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
