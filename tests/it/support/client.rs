//! What the tests do to DynamoDB (and S3) themselves, besides running rekey:
//! SDK clients for a local endpoint, table creation, puts, scans, and the
//! independent comparison of a target with transform(source).

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType,
};
use rekey::core::plan::{KeyAttr, KeySchema, Plan};
use rekey::core::value::{Item, ScalarType};

use super::TestEnv;

/// A key `PK` (S) alone.
pub fn pk_only() -> KeySchema {
    KeySchema {
        partition_key: KeyAttr {
            name: "PK".into(),
            ty: ScalarType::S,
        },
        sort_key: None,
    }
}

/// The key schema most tests use: `PK` (S) and `SK` (S).
pub fn pk_sk() -> KeySchema {
    KeySchema {
        sort_key: Some(KeyAttr {
            name: "SK".into(),
            ty: ScalarType::S,
        }),
        ..pk_only()
    }
}

impl TestEnv {
    /// A table with `key`, created through rekey's own clients; no stream.
    pub async fn create_table(&self, name: &str, key: &KeySchema) {
        self.clients
            .create_table(name, key, false)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }

    /// A table with `key` and a stream (new and old images).
    pub async fn create_streamed_table(&self, name: &str, key: &KeySchema) {
        self.clients
            .create_table(name, key, true)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }

    pub async fn put(&self, table: &str, items: &[Item]) {
        rekey::aws::write::put_all(&self.clients, table, items, 4)
            .await
            .unwrap_or_else(|e| panic!("put into {table}: {e}"));
    }

    /// Every item of a table, through a plain Scan.
    pub async fn scan_all(&self, table: &str) -> Vec<Item> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .clients
                .dynamodb
                .scan()
                .table_name(table)
                .set_exclusive_start_key(start)
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "scan {table}: {}",
                        aws_smithy_types::error::display::DisplayErrorContext(&e)
                    )
                });
            for it in page.items.unwrap_or_default() {
                out.push(rekey::aws::from_sdk_item(it).expect("known types"));
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return out,
            }
        }
    }

    /// A table as a map from its key to the item.
    pub async fn table_map(&self, table: &str, key: &[&str]) -> BTreeMap<Vec<u8>, Item> {
        self.scan_all(table)
            .await
            .into_iter()
            .map(|i| {
                (
                    rekey::core::value::encode_key(&i, key).expect("key attributes"),
                    i,
                )
            })
            .collect()
    }
}

/// What the target must hold: transform(source), keyed by target key.
pub fn expected_target(plan: &Plan, source: &[Item]) -> BTreeMap<Vec<u8>, Item> {
    let names = plan.target_key.names();
    source
        .iter()
        .filter_map(|i| match rekey::core::transform::transform(plan, i) {
            rekey::core::transform::Outcome::Put { item, .. } => {
                Some((rekey::core::value::encode_key(&item, &names).unwrap(), item))
            }
            _ => None,
        })
        .collect()
}

/// (missing, extra, stale): how the target differs from transform(source),
/// compared independently of rekey's own verify.
pub async fn target_vs_transform(
    env: &TestEnv,
    plan: &Plan,
    source: &str,
    target: &str,
) -> (usize, usize, usize) {
    let expected = expected_target(plan, &env.scan_all(source).await);
    let names = plan.target_key.names();
    let mut actual = env.table_map(target, &names).await;
    // The reverse tail's probes come and go in the target as they do in the
    // source (the transform skips those): tests that end the tails check
    // that none is left (`assert_no_markers`).
    actual.retain(|_, item| !is_marker(item));
    let missing = expected.keys().filter(|k| !actual.contains_key(*k)).count();
    let extra = actual.keys().filter(|k| !expected.contains_key(*k)).count();
    let stale = expected
        .iter()
        .filter(|(k, v)| actual.get(*k).is_some_and(|a| a != *v))
        .count();
    (missing, extra, stale)
}

/// Whether `item` is one of rekey's barrier or probe markers (partition key `PK`).
pub fn is_marker(item: &Item) -> bool {
    matches!(item.get("PK"), Some(rekey::core::value::Value::S(pk)) if pk.starts_with(rekey::core::marker::MARKER_PREFIX))
}

/// No marker is left in `table` (once every process that writes them ended).
pub async fn assert_no_markers(env: &TestEnv, table: &str) {
    let left: Vec<Item> = env
        .scan_all(table)
        .await
        .into_iter()
        .filter(is_marker)
        .collect();
    assert!(left.is_empty(), "markers left in `{table}`: {left:?}");
}

/// A DynamoDB client for a local endpoint: fixed credentials and region,
/// the SDK's default retries.
pub async fn dynamodb(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config(endpoint, true).await)
}

/// A DynamoDB client for a local endpoint with retries disabled, so that
/// every throttle and fault is visible.
pub async fn dynamodb_without_retries(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config(endpoint, false).await)
}

/// A DynamoDB Streams client for a local endpoint.
pub async fn streams(endpoint: &str) -> aws_sdk_dynamodbstreams::Client {
    aws_sdk_dynamodbstreams::Client::new(&sdk_config(endpoint, true).await)
}

/// An S3 client for a local endpoint: path-style.
pub async fn s3(endpoint: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(&sdk_config(endpoint, true).await)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

async fn sdk_config(endpoint: &str, retries: bool) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(rekey::aws::https_client())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test", "test", None, None, "static",
        ));
    if !retries {
        loader = loader.retry_config(aws_config::retry::RetryConfig::disabled());
    }
    loader.load().await
}

/// Creates an on-demand table keyed by `keys` (hash, then range; all S),
/// through a plain SDK client; with `stream`, a NEW_AND_OLD_IMAGES stream,
/// whose ARN it returns.
pub async fn create_plain_table(
    c: &aws_sdk_dynamodb::Client,
    name: &str,
    keys: &[&str],
    stream: bool,
) -> Option<String> {
    let mut req = c
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest);
    for (attr, kind) in keys.iter().zip([KeyType::Hash, KeyType::Range]) {
        req = req
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*attr)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*attr)
                    .key_type(kind)
                    .build()
                    .unwrap(),
            );
    }
    if stream {
        req = req.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap(),
        );
    }
    let out = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {name}: {}", rekey::aws::error_chain(&e)));
    out.table_description()
        .and_then(|d| d.latest_stream_arn())
        .map(str::to_string)
}
