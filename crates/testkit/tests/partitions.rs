//! The partition model through the real proxy in front of moto, seen by the
//! AWS SDK (retries off, so every throttle is seen): DynamoDB's exceptions
//! and `ThrottlingReasons` parse, keys sharing a partition share its limit,
//! a full GSI partition refuses the base write, and batches come back with
//! `UnprocessedItems` (or refused whole when nothing fits).
//!
//! Rates are tiny (0.01 WCU/s with 500 s of burst: 5 WCU a partition, and
//! less than one more in a minute), so what is admitted does not depend on
//! how fast the machine is.

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials};
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue as AV, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, PutRequest, ReturnConsumedCapacity, ScalarAttributeType,
    ThrottlingReason, WriteRequest,
};
use rekey::local::{LocalOptions, LocalServer};
use rekey_testkit::keyspace::{equal_ranges, in_range, key_hash};
use rekey_testkit::partitions::{Mode, PartitionOptions};
use rekey_testkit::proxy::{Proxy, ProxyOptions};
use serde_json::json;

const TABLE_ARN: &str = "arn:aws:dynamodb:us-east-1:000000000000:table/orders";

async fn client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .http_client(rekey::aws::https_client())
        .endpoint_url(endpoint)
        .region("us-east-1")
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .retry_config(RetryConfig::disabled())
        .load()
        .await;
    aws_sdk_dynamodb::Client::new(&config)
}

/// 8 partitions a table and a GSI, 5 WCU each, no table-wide limit.
fn tiny(mode: Mode) -> PartitionOptions {
    PartitionOptions {
        mode,
        partitions: Some(8),
        partition_write: 0.01,
        partition_read: 0.01,
        burst_seconds: 500.0,
        ..PartitionOptions::default()
    }
}

/// `n` distinct keys `prefix…` whose hash lies in partition `p` of 8.
fn keys_in(prefix: &str, p: usize, n: usize) -> Vec<String> {
    let range = equal_ranges(8)[p];
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|k| in_range(key_hash(&json!({ "S": k })), range))
        .take(n)
        .collect()
}

async fn create_orders(c: &aws_sdk_dynamodb::Client) {
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let hash = |name: &str| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(KeyType::Hash)
            .build()
            .unwrap()
    };
    let gsi = GlobalSecondaryIndex::builder()
        .index_name("by_status")
        .key_schema(hash("status"))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .unwrap();
    c.create_table()
        .table_name("orders")
        .attribute_definitions(attr("PK"))
        .attribute_definitions(attr("status"))
        .key_schema(hash("PK"))
        .global_secondary_indexes(gsi)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
}

async fn put(
    c: &aws_sdk_dynamodb::Client,
    pk: &str,
    status: Option<&str>,
) -> Result<(), PutItemError> {
    let mut req = c
        .put_item()
        .table_name("orders")
        .item("PK", AV::S(pk.into()));
    if let Some(s) = status {
        req = req.item("status", AV::S(s.into()));
    }
    req.send()
        .await
        .map(|_| ())
        .map_err(SdkError::into_service_error)
}

fn reasons(r: &[ThrottlingReason]) -> Vec<(&str, &str)> {
    r.iter()
        .map(|r| {
            (
                r.reason().unwrap_or_default(),
                r.resource().unwrap_or_default(),
            )
        })
        .collect()
}

fn batch(keys: &[String]) -> Vec<WriteRequest> {
    keys.iter()
        .map(|k| {
            let put = PutRequest::builder()
                .item("PK", AV::S(k.clone()))
                .build()
                .unwrap();
            WriteRequest::builder().put_request(put).build()
        })
        .collect()
}

#[tokio::test]
async fn partition_throttles_parse_in_the_sdk_and_batches_come_back_unprocessed() {
    let local = LocalServer::start(&LocalOptions::default())
        .await
        .unwrap_or_else(|e| panic!("moto_server (REKEY_MOTO_SERVER) did not start: {e}"));
    let proxy = Proxy::start(ProxyOptions {
        partitions: Some(tiny(Mode::on_demand())),
        ..ProxyOptions::pass_through(local.endpoint())
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;
    create_orders(&c).await;

    // Six different keys, one partition: five fit its 5 WCU, the sixth is
    // refused (per key value, each would have had 5 of its own).
    let shared = keys_in("shared", 0, 6);
    for k in &shared[..5] {
        put(&c, k, None).await.unwrap();
    }
    let PutItemError::ProvisionedThroughputExceededException(e) =
        put(&c, &shared[5], None).await.unwrap_err()
    else {
        panic!("not a ProvisionedThroughputExceededException");
    };
    assert_eq!(
        reasons(e.throttling_reasons()),
        [("TableWriteKeyRangeThroughputExceeded", TABLE_ARN)]
    );
    assert_eq!(proxy.partitions("orders", None).len(), 8);

    // Six items in six base partitions, all in the GSI's `OPEN` partition:
    // the index refuses the sixth, and the base write with it.
    for p in 1..6 {
        put(&c, &keys_in("open", p, 1)[0], Some("OPEN"))
            .await
            .unwrap();
    }
    let PutItemError::ProvisionedThroughputExceededException(e) =
        put(&c, &keys_in("open", 6, 1)[0], Some("OPEN"))
            .await
            .unwrap_err()
    else {
        panic!("not a ProvisionedThroughputExceededException");
    };
    let index_arn = format!("{TABLE_ARN}/index/by_status");
    assert_eq!(
        reasons(e.throttling_reasons()),
        [("IndexWriteKeyRangeThroughputExceeded", index_arn.as_str())]
    );

    // Ten puts to a fresh partition: five are written, five come back.
    let fresh = keys_in("batch", 7, 13);
    let out = c
        .batch_write_item()
        .request_items("orders", batch(&fresh[..10]))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .unwrap();
    let unprocessed = out
        .unprocessed_items()
        .and_then(|u| u.get("orders"))
        .map_or(0, Vec::len);
    assert_eq!(unprocessed, 5);
    assert_eq!(out.consumed_capacity()[0].capacity_units(), Some(5.0));
    // None of the next fits: the batch is refused whole.
    let err = c
        .batch_write_item()
        .request_items("orders", batch(&fresh[10..]))
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    let BatchWriteItemError::ProvisionedThroughputExceededException(e) = err else {
        panic!("not a ProvisionedThroughputExceededException: {err:?}");
    };
    assert_eq!(
        reasons(e.throttling_reasons()),
        [("TableWriteKeyRangeThroughputExceeded", TABLE_ARN)]
    );

    // What was refused never reached the server.
    let scan = c.scan().table_name("orders").send().await.unwrap();
    assert_eq!(scan.count(), 5 + 5 + 5);
    assert!(proxy.splits().is_empty(), "nothing was hot for minutes");
}

#[tokio::test]
async fn an_on_demand_maximum_answers_throttling_exception() {
    let local = LocalServer::start(&LocalOptions::default())
        .await
        .unwrap_or_else(|e| panic!("moto_server (REKEY_MOTO_SERVER) did not start: {e}"));
    let mode = Mode::OnDemand {
        max_write: Some(0.01),
        max_read: None,
        warm_write: 4000.0,
        warm_read: 12000.0,
    };
    let proxy = Proxy::start(ProxyOptions {
        partitions: Some(PartitionOptions {
            partition_write: 1000.0,
            partition_read: 3000.0,
            ..tiny(mode)
        }),
        ..ProxyOptions::pass_through(local.endpoint())
    })
    .await
    .unwrap();
    let c = client(&proxy.endpoint()).await;
    create_orders(&c).await;

    for i in 0..5 {
        put(&c, &format!("k{i}"), None).await.unwrap();
    }
    let PutItemError::ThrottlingException(e) = put(&c, "k5", None).await.unwrap_err() else {
        panic!("not a ThrottlingException");
    };
    assert_eq!(
        reasons(e.throttling_reasons()),
        [("TableWriteMaxOnDemandThroughputExceeded", TABLE_ARN)]
    );
}
