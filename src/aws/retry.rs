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

/// A per-call configuration that makes one attempt: no retry by the SDK,
/// so a throttle reaches the caller as a throttle. For `rekey loadtest`'s
/// measured requests, which count throttles instead of riding them out.
pub(crate) fn single_attempt() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::new()
        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
}

/// Attempts of a single-item call (GetItem, PutItem, DeleteItem) before a
/// transient failure — a 5xx, a connection reset — is the caller's.
pub const ITEM_ATTEMPTS: u32 = 10;

/// `call` again after a backoff while it fails transiently (crate::aws::AwsError::is_transient),
/// up to [`ITEM_ATTEMPTS`]: for idempotent calls only. The SDK's own retries
/// do not take a connection closed mid-request for transient, and a long
/// tail must not stop on one. Throttles go back to the caller, whose rate
/// they concern.
pub async fn transient<T, F, Fut>(mut call: F) -> Result<T, crate::aws::AwsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::aws::AwsError>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(e) if e.is_transient() && attempt + 1 < ITEM_ATTEMPTS => {
                tracing::info!(error = %e, attempt, "retrying");
                tokio::time::sleep(backoff(attempt, jitter())).await;
                attempt += 1;
            }
            done => return done,
        }
    }
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

    fn reset() -> crate::aws::AwsError {
        use crate::aws::endpoint::{Endpoint, Service, Source};
        crate::aws::AwsError::Unreachable {
            endpoint: std::sync::Arc::new(Endpoint {
                service: Service::DynamoDb,
                url: "http://127.0.0.1:1".into(),
                source: Source::Flag,
            }),
            detail: "connection closed before message completed".into(),
        }
    }

    /// Regression: a connection reset on a tail's GetItem (the guard) or a
    /// marker's DeleteItem stopped the tail, and `run` with it: the SDK does
    /// not retry a connection closed mid-request.
    #[tokio::test(start_paused = true)]
    async fn a_reset_is_made_again_and_a_refusal_is_not() {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let got = transient(|| async {
            match calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
                0..=2 => Err(reset()),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!((got.ok(), calls.into_inner()), (Some(7), 4));
        let calls = std::sync::atomic::AtomicU32::new(0);
        let got: Result<(), _> = transient(|| async {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(crate::aws::AwsError::Schema {
                table: "t".into(),
                detail: "no".into(),
            })
        })
        .await;
        assert!(got.is_err() && calls.into_inner() == 1);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let got: Result<(), _> = transient(|| async {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(reset())
        })
        .await;
        assert!(got.is_err() && calls.into_inner() == ITEM_ATTEMPTS);
    }

    /// A server that refuses every request as a hot partition does, and
    /// counts them: its endpoint and the count.
    async fn refusing_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicU32>) {
        use std::sync::atomic::{AtomicU32, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(AtomicU32::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        };
                        let headers = String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
                        let length: usize = headers
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() < head + 4 + length {
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        }
                        buf.drain(..head + 4 + length);
                        seen.fetch_add(1, Ordering::SeqCst);
                        let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow down","ThrottlingReasons":[{"reason":"TableWriteKeyRangeThroughputExceeded","resource":"arn:aws:dynamodb:us-east-1:1:table/t"}]}"#;
                        let answer = format!(
                            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, count)
    }

    /// The load test's measured calls are made once even where the client
    /// retries (here 3 attempts, as `AWS_MAX_ATTEMPTS=3` would): a throttle
    /// reaches the caller as one, with DynamoDB's reason. The same client's
    /// ordinary PutItem retries, so the server does provoke retries.
    #[tokio::test]
    async fn measured_calls_are_made_once_whatever_the_clients_attempts() {
        use std::sync::atomic::Ordering;
        let (url, count) = refusing_server().await;
        let clients = crate::aws::Clients::connect(&crate::aws::AwsOptions {
            endpoint_url: Some(url),
            region: Some("us-east-1".into()),
            static_credentials: Some(("k".into(), "s".into())),
            max_attempts: Some(3),
            ..Default::default()
        })
        .await
        .unwrap();
        let item: crate::core::value::Item = [
            ("PK".to_string(), crate::core::value::Value::S("a".into())),
            ("SK".to_string(), crate::core::value::Value::S("b".into())),
        ]
        .into();
        let throttled = |e: crate::aws::AwsError| match e {
            crate::aws::AwsError::Throttled { reasons, .. } => reasons,
            other => panic!("not a throttle: {other}"),
        };
        let e = crate::aws::item::put_once(&clients, "t", &item)
            .await
            .unwrap_err();
        assert_eq!(throttled(e), ["TableWriteKeyRangeThroughputExceeded"]);
        assert_eq!(count.swap(0, Ordering::SeqCst), 1, "PutItem made once");
        let call = crate::aws::query::QueryCall {
            table: "t",
            partition_key: "PK",
            sort_key: "SK",
            key: "a",
            condition: &crate::core::query::KeyCondition::None,
            ascending: true,
            start: None,
            limit: 10,
            consistent_read: false,
        };
        let e = crate::aws::query::query_once(&clients, &call)
            .await
            .unwrap_err();
        assert_eq!(throttled(e), ["TableWriteKeyRangeThroughputExceeded"]);
        assert_eq!(count.swap(0, Ordering::SeqCst), 1, "Query made once");
        let e = crate::aws::item::put_item(&clients, "t", &item)
            .await
            .unwrap_err();
        assert!(e.is_throttle());
        assert_eq!(count.load(Ordering::SeqCst), 3, "the client's own attempts");
    }

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
