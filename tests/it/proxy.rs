//! The proxy against the real local server (moto), through the real AWS SDK with
//! retries disabled, so that every throttle and fault is visible.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::list_tables::{ListTablesError, ListTablesOutput};
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue as AV, KeysAndAttributes, PutRequest, WriteRequest};
use rekey::local::LocalServer;
use rekey_testkit::proxy::{Faults, Proxy, ProxyOptions, ProxyStats};

use crate::support::client::{create_plain_table, dynamodb_without_retries};
use crate::support::{shared_server, shared_shadow};

/// The local server all tests share; each test has its tables.
async fn local() -> &'static LocalServer {
    shared_server().await
}

/// A client with retries disabled: every throttle and fault is visible.
async fn client(endpoint: &str) -> Client {
    dynamodb_without_retries(endpoint).await
}

async fn options(upstream: &str) -> ProxyOptions {
    ProxyOptions {
        upstream: upstream.to_string(),
        key_write_units: 1000.0,
        key_read_units: 3000.0,
        table_write_units: None,
        table_read_units: None,
        burst_seconds: 1.0,
        faults: Faults::default(),
        shadow: Some(shared_shadow().await),
        partitions: None,
    }
}

/// A table keyed by `PK`, and `SK` with `sort_key`.
async fn create_table(c: &Client, name: &str, sort_key: bool) {
    let keys: &[&str] = if sort_key { &["PK", "SK"] } else { &["PK"] };
    create_plain_table(c, name, keys, false).await;
}

fn s(v: impl Into<String>) -> AV {
    AV::S(v.into())
}

/// The throttling reasons of a PutItem throttle; panics on any other error.
fn put_throttle_reasons(e: SdkError<PutItemError, HttpResponse>) -> Vec<(String, String)> {
    match e.into_service_error() {
        PutItemError::ProvisionedThroughputExceededException(x) => x
            .throttling_reasons()
            .iter()
            .map(|r| {
                (
                    r.reason().unwrap_or("").to_string(),
                    r.resource().unwrap_or("").to_string(),
                )
            })
            .collect(),
        other => panic!("expected ProvisionedThroughputExceededException, got {other:?}"),
    }
}

#[tokio::test]
async fn hot_key_is_throttled_at_the_per_key_rate() {
    let local = local().await;
    let direct = client(local.endpoint()).await;
    create_table(&direct, "hot", false).await;
    let proxy = Proxy::start(ProxyOptions {
        key_write_units: 20.0,
        ..options(local.endpoint()).await
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;

    // Full speed: 8 writers of 3 WCU items (2.5 KB), so that even a slow,
    // loaded local server (10-300 ms per write here) is offered > 20 WCU/s.
    let start = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..8 {
        let c = c.clone();
        writers.spawn(async move {
            let (mut admitted, mut throttled) = (0u32, 0u32);
            while start.elapsed() < Duration::from_secs(3) {
                let put = c
                    .put_item()
                    .table_name("hot")
                    .item("PK", s("k"))
                    .item("n", AV::N(format!("{w}{admitted}")))
                    .item("pad", s("p".repeat(2500)));
                match put.send().await {
                    Ok(_) => admitted += 1,
                    Err(e) => {
                        throttled += 1;
                        let reasons = put_throttle_reasons(e);
                        assert_eq!(
                            reasons,
                            [(
                                "TableWriteKeyRangeThroughputExceeded".to_string(),
                                "arn:aws:dynamodb:us-east-1:000000000000:table/hot".to_string()
                            )]
                        );
                    }
                }
            }
            (admitted, throttled)
        });
    }
    let (mut admitted, mut throttled) = (0u32, 0u32);
    while let Some(counts) = writers.join_next().await {
        let (a, t) = counts.unwrap();
        admitted += a;
        throttled += t;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let wcu = 3.0 * f64::from(admitted);
    eprintln!("hot key: {wcu} WCU admitted, {throttled} writes throttled in {elapsed:.2} s");
    // A 20/s bucket holding 1 s of burst: at most 20 + 20 × elapsed.
    assert!(throttled > 0);
    let expected = 20.0 + 20.0 * elapsed;
    assert!(wcu <= expected, "{wcu} WCU admitted in {elapsed:.2}s");
    assert!(wcu >= 0.5 * expected, "{wcu} WCU admitted in {elapsed:.2}s");

    // Other keys have their own buckets.
    c.put_item()
        .table_name("hot")
        .item("PK", s("other"))
        .send()
        .await
        .unwrap();

    let stats = proxy.stats();
    assert_eq!(stats.throttled, u64::from(throttled));
    assert_eq!(stats.write_units, wcu + 1.0);
    assert_eq!(stats.per_table_write_units["hot"], stats.write_units);
    assert_eq!(stats.requests, u64::from(admitted + throttled) + 1);
    // Offered load on the hot key (throttled writes included) was far above 20/s.
    assert!(stats.max_key_write_units_per_sec > 30.0, "{stats:?}");
}

#[tokio::test]
async fn batch_write_returns_what_does_not_fit_as_unprocessed() {
    let local = local().await;
    let direct = client(local.endpoint()).await;
    create_table(&direct, "batch", true).await;
    let proxy = Proxy::start(ProxyOptions {
        key_write_units: 10.0,
        ..options(local.endpoint()).await
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;

    let batch = |prefix: &str| -> Vec<WriteRequest> {
        (0..25)
            .map(|i| {
                let put = PutRequest::builder()
                    .item("PK", s("one"))
                    .item("SK", s(format!("{prefix}{i:02}")))
                    .build()
                    .unwrap();
                WriteRequest::builder().put_request(put).build()
            })
            .collect()
    };
    let out = c
        .batch_write_item()
        .request_items("batch", batch("a"))
        .send()
        .await
        .unwrap();
    // Stop refilling, so that the next batch is refused however slow this machine is.
    proxy.set_limits(0.0, None);
    // Nothing fits: the whole batch is refused.
    let e = c
        .batch_write_item()
        .request_items("batch", batch("b"))
        .send()
        .await
        .unwrap_err();
    let service = e.into_service_error();
    let aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemError::ProvisionedThroughputExceededException(x) = service
    else {
        panic!("expected a throttle, got {service:?}");
    };
    assert_eq!(
        x.throttling_reasons()[0].reason(),
        Some("TableWriteKeyRangeThroughputExceeded")
    );
    let unprocessed = &out.unprocessed_items().unwrap()["batch"];
    assert_eq!(unprocessed.len(), 15);
    let unprocessed_sks: Vec<String> = unprocessed
        .iter()
        .map(|w| {
            w.put_request().unwrap().item()["SK"]
                .as_s()
                .unwrap()
                .clone()
        })
        .collect();
    for i in 0..25 {
        let sk = format!("a{i:02}");
        let got = direct
            .get_item()
            .table_name("batch")
            .key("PK", s("one"))
            .key("SK", s(sk.clone()))
            .send()
            .await
            .unwrap();
        assert_eq!(got.item().is_some(), !unprocessed_sks.contains(&sk), "{sk}");
    }

    // The throttle answer, byte for byte.
    let item = r#"{"TableName":"batch","Item":{"PK":{"S":"one"},"SK":{"S":"z"}}}"#;
    let answer = raw_post(&proxy.endpoint(), "PutItem", item).await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer
            .to_lowercase()
            .contains("\r\nx-amzn-errortype: provisionedthroughputexceededexception\r\n")
    );
    assert!(
        answer
            .to_lowercase()
            .contains("\r\ncontent-type: application/x-amz-json-1.0\r\n")
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(
        body,
        r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.","ThrottlingReasons":[{"reason":"TableWriteKeyRangeThroughputExceeded","resource":"arn:aws:dynamodb:us-east-1:000000000000:table/batch"}]}"#
    );

    let stats = proxy.stats();
    assert_eq!((stats.write_units, stats.throttled), (10.0, 3));
}

#[tokio::test]
async fn batch_get_returns_what_does_not_fit_as_unprocessed_keys() {
    let local = local().await;
    let direct = client(local.endpoint()).await;
    create_table(&direct, "bget", true).await;
    for i in 0..10 {
        direct
            .put_item()
            .table_name("bget")
            .item("PK", s("p"))
            .item("SK", s(i.to_string()))
            .send()
            .await
            .unwrap();
    }
    let proxy = Proxy::start(ProxyOptions {
        key_read_units: 4.0,
        ..options(local.endpoint()).await
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;
    let mut keys = KeysAndAttributes::builder();
    for i in 0..10 {
        keys = keys.keys(
            [
                ("PK".to_string(), s("p")),
                ("SK".to_string(), s(i.to_string())),
            ]
            .into(),
        );
    }
    let out = c
        .batch_get_item()
        .request_items("bget", keys.build().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(out.responses().unwrap()["bget"].len(), 4);
    assert_eq!(out.unprocessed_keys().unwrap()["bget"].keys().len(), 6);
}

#[tokio::test]
async fn table_limit_spread_over_many_keys_is_a_table_throttle() {
    let local = local().await;
    let direct = client(local.endpoint()).await;
    create_table(&direct, "wide", false).await;
    let proxy = Proxy::start(ProxyOptions {
        table_write_units: Some(2.0),
        ..options(local.endpoint()).await
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;

    // 10 writes to 10 keys at once against 2 WCU/s (1 s of burst).
    let start = Instant::now();
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..10 {
        let put = c
            .put_item()
            .table_name("wide")
            .item("PK", s(format!("k{i}")));
        writes.spawn(put.send());
    }
    let mut reasons = Vec::new();
    while let Some(result) = writes.join_next().await {
        if let Err(e) = result.unwrap() {
            reasons.extend(put_throttle_reasons(e));
        }
    }
    let admitted = 10 - reasons.len();
    assert!(admitted as f64 <= 2.0 + 2.0 * start.elapsed().as_secs_f64());
    assert!(!reasons.is_empty());
    for (reason, resource) in reasons {
        assert_eq!(reason, "TableWriteProvisionedThroughputExceeded");
        assert_eq!(
            resource,
            "arn:aws:dynamodb:us-east-1:000000000000:table/wide"
        );
    }
    assert!(proxy.stats().max_key_write_units_per_sec <= 1.0);

    // Lifted while running.
    proxy.set_limits(1000.0, None);
    for i in 0..30 {
        c.put_item()
            .table_name("wide")
            .item("PK", s(format!("x{i}")))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn scans_are_charged_after_the_fact_and_reads_per_key() {
    let local = local().await;
    let direct = client(local.endpoint()).await;
    create_table(&direct, "reads", false).await;
    for i in 0..10 {
        let big = "x".repeat(4000);
        direct
            .put_item()
            .table_name("reads")
            .item("PK", s(i.to_string()))
            .item("d", s(big))
            .send()
            .await
            .unwrap();
    }
    let proxy = Proxy::start(ProxyOptions {
        key_read_units: 2.0,
        table_read_units: Some(1.0),
        ..options(local.endpoint()).await
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;

    // ~40 KB eventually consistent = 5 RCU, from a bucket of 1: in debt.
    assert_eq!(
        c.scan()
            .table_name("reads")
            .send()
            .await
            .unwrap()
            .items()
            .len(),
        10
    );
    let e = c.scan().table_name("reads").send().await.unwrap_err();
    assert_eq!(e.code(), Some("ProvisionedThroughputExceededException"));
    let x = e.into_service_error();
    let aws_sdk_dynamodb::operation::scan::ScanError::ProvisionedThroughputExceededException(x) = x
    else {
        panic!("{x:?}")
    };
    assert_eq!(
        x.throttling_reasons()[0].reason(),
        Some("TableReadProvisionedThroughputExceeded")
    );
    assert!(proxy.stats().read_units >= 5.0);

    // Per-key reads: 2 RCU of burst on key "1" (refilled one per 5 s), no table limit.
    let proxy = Proxy::start(ProxyOptions {
        key_read_units: 0.2,
        burst_seconds: 10.0,
        ..options(local.endpoint()).await
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;
    let query = || {
        c.query()
            .table_name("reads")
            .key_condition_expression("#k = :v")
            .expression_attribute_names("#k", "PK")
            .expression_attribute_values(":v", s("1"))
            .send()
    };
    assert_eq!(query().await.unwrap().count(), 1);
    c.get_item()
        .table_name("reads")
        .key("PK", s("1"))
        .send()
        .await
        .unwrap();
    let e = query().await.unwrap_err();
    let aws_sdk_dynamodb::operation::query::QueryError::ProvisionedThroughputExceededException(x) =
        e.into_service_error()
    else {
        panic!("expected a throttle")
    };
    assert_eq!(
        x.throttling_reasons()[0].reason(),
        Some("TableReadKeyRangeThroughputExceeded")
    );
    c.get_item()
        .table_name("reads")
        .key("PK", s("2"))
        .send()
        .await
        .unwrap();
}

/// One kind of fault, injected into every request: what the SDK and the
/// proxy's stats must show after one ListTables through it.
struct Fault {
    name: &'static str,
    faults: Faults,
    check: fn(ListTablesResult, &ProxyStats, Duration) -> Result<(), String>,
}

type ListTablesResult = Result<ListTablesOutput, SdkError<ListTablesError, HttpResponse>>;

/// `Err(what)` unless `holds`.
fn ensure(holds: bool, what: impl std::fmt::Display) -> Result<(), String> {
    if holds { Ok(()) } else { Err(what.to_string()) }
}

#[tokio::test]
async fn faults_are_visible_to_the_sdk() {
    let local = local().await;
    let cases = [
        Fault {
            name: "every request a 500",
            faults: Faults {
                error_500_ratio: 1.0,
                ..Faults::default()
            },
            check: |r, stats, _| {
                let e = r.err().ok_or("succeeded")?;
                let status = e.raw_response().map(|r| r.status().as_u16());
                ensure(status == Some(500), format!("status {status:?}"))?;
                ensure(
                    e.code() == Some("InternalServerError"),
                    format!("code {:?}", e.code()),
                )?;
                ensure(
                    e.into_service_error().is_internal_server_error(),
                    "not an InternalServerError",
                )?;
                ensure(stats.errors_500 == 1, format!("{stats:?}"))
            },
        },
        Fault {
            name: "every connection reset",
            faults: Faults {
                reset_ratio: 1.0,
                ..Faults::default()
            },
            check: |r, stats, _| {
                let e = r.err().ok_or("succeeded")?;
                ensure(matches!(e, SdkError::DispatchFailure(_)), format!("{e:?}"))?;
                ensure(stats.resets == 1, format!("{stats:?}"))
            },
        },
        Fault {
            name: "300 ms of latency",
            faults: Faults {
                latency: Duration::from_millis(300),
                ..Faults::default()
            },
            check: |r, _, took| {
                r.map_err(|e| format!("{e:?}"))?;
                ensure(took >= Duration::from_millis(300), format!("took {took:?}"))
            },
        },
    ];
    let mut failed = Vec::new();
    for case in cases {
        let proxy = Proxy::start(ProxyOptions {
            faults: case.faults,
            ..options(local.endpoint()).await
        })
        .await
        .unwrap();
        let c = client(&proxy.endpoint()).await;
        let started = Instant::now();
        let r = c.list_tables().send().await;
        let took = started.elapsed();
        if let Err(why) = (case.check)(r, &proxy.stats(), took) {
            failed.push(format!("case `{}`: {why}", case.name));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));

    // Same seed, same faults.
    let mut runs = Vec::new();
    for _ in 0..2 {
        let p = Proxy::start(ProxyOptions {
            faults: Faults {
                error_500_ratio: 0.3,
                reset_ratio: 0.2,
                seed: 42,
                ..Faults::default()
            },
            ..options(local.endpoint()).await
        })
        .await
        .unwrap();
        let c = client(&p.endpoint()).await;
        let mut outcomes = Vec::new();
        for _ in 0..30 {
            outcomes.push(match c.list_tables().send().await {
                Ok(_) => 'o',
                Err(SdkError::DispatchFailure(_)) => 'r',
                Err(_) => 'e',
            });
        }
        runs.push(outcomes.into_iter().collect::<String>());
    }
    assert_eq!(runs[0], runs[1]);
    assert!(
        runs[0].contains('o') && runs[0].contains('r') && runs[0].contains('e'),
        "{}",
        runs[0]
    );
}

#[tokio::test]
async fn everything_passes_through_unchanged_below_the_limits() {
    let local = local().await;
    let proxy = Proxy::start(options(local.endpoint()).await).await.unwrap();
    let c = client(&proxy.endpoint()).await;

    create_table(&c, "pass", true).await;
    let desc = c.describe_table().table_name("pass").send().await.unwrap();
    assert_eq!(desc.table().unwrap().key_schema().len(), 2);
    for i in 0..3 {
        c.put_item()
            .table_name("pass")
            .item("PK", s("a"))
            .item("SK", s(i.to_string()))
            .item("n", AV::N(i.to_string()))
            .send()
            .await
            .unwrap();
    }
    let got = c
        .get_item()
        .table_name("pass")
        .key("PK", s("a"))
        .key("SK", s("1"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.item().unwrap()["n"], AV::N("1".into()));
    let q = c
        .query()
        .table_name("pass")
        .key_condition_expression("PK = :p AND SK >= :s")
        .expression_attribute_values(":p", s("a"))
        .expression_attribute_values(":s", s("1"))
        .send()
        .await
        .unwrap();
    assert_eq!(q.count(), 2);
    c.delete_item()
        .table_name("pass")
        .key("PK", s("a"))
        .key("SK", s("0"))
        .send()
        .await
        .unwrap();
    c.update_item()
        .table_name("pass")
        .key("PK", s("a"))
        .key("SK", s("1"))
        .update_expression("SET n = :n")
        .expression_attribute_values(":n", AV::N("10".into()))
        .send()
        .await
        .unwrap();
    let put = aws_sdk_dynamodb::types::Put::builder()
        .table_name("pass")
        .item("PK", s("b"))
        .item("SK", s("t"))
        .build()
        .unwrap();
    let put = aws_sdk_dynamodb::types::TransactWriteItem::builder()
        .put(put)
        .build();
    c.transact_write_items()
        .transact_items(put)
        .send()
        .await
        .unwrap();
    let scan = c.scan().table_name("pass").send().await.unwrap();
    assert_eq!(scan.count(), 3);
    // Errors from the local server come through as they are.
    let e = c
        .get_item()
        .table_name("missing")
        .key("PK", s("a"))
        .send()
        .await
        .unwrap_err();
    assert!(e.into_service_error().is_resource_not_found_exception());

    let stats = proxy.stats();
    assert_eq!(stats.throttled, 0);
    // 3 puts, 1 delete, 1 update, 1 transactional put (2 WCU)
    assert_eq!(stats.write_units, 7.0);
    assert!(stats.read_units >= 3.0);

    // A body that is not JSON is forwarded untouched: the local server
    // answers it (moto with an HTML 500; DynamoDB would say 400
    // SerializationException). An invalid item is refused by strict
    // validation as DynamoDB refuses it, and never reaches the local server
    // (moto answered it with an HTML 500 too).
    let not_json = raw_post(&proxy.endpoint(), "PutItem", "{not json").await;
    assert!(not_json.starts_with("HTTP/1.1 500"), "{not_json}");
    assert!(not_json.contains("Werkzeug"), "{not_json}");
    let bad_item = raw_post(
        &proxy.endpoint(),
        "PutItem",
        r#"{"TableName":"pass","Item":{"PK":{"X":"1"}}}"#,
    )
    .await;
    assert!(bad_item.starts_with("HTTP/1.1 400"), "{bad_item}");
    assert!(bad_item.contains("ValidationException"), "{bad_item}");
    assert_eq!(proxy.take_refusals().len(), 1);
    assert_eq!(proxy.stats().write_units, 7.0);
}

/// What moto accepts and DynamoDB refuses (docs/test-backend.md, "Strict
/// validation"): each request is refused by strict validation with DynamoDB's
/// error, and a proxy whose refusals were not taken fails the test that
/// sent them.
#[tokio::test]
async fn requests_dynamodb_refuses_are_refused_and_fail_the_test_that_sent_them() {
    let local = local().await;
    let proxy = Proxy::start(options(local.endpoint()).await).await.unwrap();
    let c = client(&proxy.endpoint()).await;
    let table = format!("strict-{}", std::process::id());
    create_table(&c, &table, true).await;
    let key = |pk: &str, sk: &str| {
        std::collections::HashMap::from([("PK".to_string(), s(pk)), ("SK".to_string(), s(sk))])
    };
    c.put_item()
        .table_name(&table)
        .set_item(Some(key("a", "1")))
        .send()
        .await
        .unwrap();
    // A key holding a non-key attribute (what verify --reverse's re-check
    // sent): moto reads the key's attributes and ignores the rest.
    let mut with_extra = key("a", "1");
    with_extra.insert("status".into(), s("OPEN"));
    let ka = KeysAndAttributes::builder()
        .keys(with_extra)
        .build()
        .unwrap();
    let e = c
        .batch_get_item()
        .request_items(&table, ka.clone())
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationException"), "{e:?}");
    let moto = client(local.endpoint()).await;
    let accepted = moto.batch_get_item().request_items(&table, ka).send().await;
    assert!(accepted.is_ok(), "moto accepts it");
    // The same key twice in one batch.
    let twice = KeysAndAttributes::builder()
        .keys(key("a", "1"))
        .keys(key("a", "1"))
        .build()
        .unwrap();
    let e = c
        .batch_get_item()
        .request_items(&table, twice)
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationException"), "{e:?}");
    // An expression value no expression uses.
    let e = c
        .put_item()
        .table_name(&table)
        .set_item(Some(key("b", "1")))
        .condition_expression("attribute_not_exists(PK)")
        .expression_attribute_values(":unused", s("x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationException"), "{e:?}");
    // A key attribute of the wrong type.
    let e = c
        .get_item()
        .table_name(&table)
        .key("PK", AV::N("1".into()))
        .key("SK", s("1"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ValidationException"), "{e:?}");
    let audit = proxy.audit().unwrap();
    assert_eq!(audit.refused.len(), 4, "{:?}", audit.refused);

    // Not taken: dropping the proxy fails the test.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(proxy)));
    let why = dropped.expect_err("the proxy's drop fails the test");
    let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(why.contains("4 request(s) DynamoDB would refuse"), "{why}");
}

/// One request on its own connection, written by hand; the whole answer.
async fn raw_post(endpoint: &str, op: &str, body: &str) -> String {
    let port = endpoint.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.{op}\r\nX-Amz-Date: 20260101T000000Z\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, \
         SignedHeaders=host, Signature=0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    })
    .await
    .unwrap()
}

/// `hold` keeps one action's requests waiting (and counts them) while the
/// others pass; `release` lets them through: a test's barrier on a client.
#[tokio::test]
async fn a_held_action_waits_until_released_and_other_actions_pass() {
    let local = local().await;
    let direct = client(local.endpoint()).await;
    create_table(&direct, "held", false).await;
    let proxy = Proxy::start(options(local.endpoint()).await).await.unwrap();
    let c = client(&proxy.endpoint()).await;
    proxy.hold("PutItem");
    let put = tokio::spawn({
        let c = c.clone();
        async move {
            c.put_item()
                .table_name("held")
                .item("PK", s("k"))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| format!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
        }
    });
    crate::support::poll_until("the put to be held", Duration::from_secs(60), || {
        proxy.stats().held == 1
    })
    .await;
    // Held: not written, while another action passes.
    let got = c
        .get_item()
        .table_name("held")
        .key("PK", s("k"))
        .send()
        .await
        .unwrap();
    assert!(got.item().is_none());
    proxy.release();
    put.await.unwrap().unwrap();
    assert_eq!(proxy.stats().held, 0);
    let got = direct
        .get_item()
        .table_name("held")
        .key("PK", s("k"))
        .send()
        .await
        .unwrap();
    assert!(got.item().is_some());
}
