//! The one place that owns AWS SDK clients and turns SDK errors into errors an
//! operator can act on.
//!
//! Clients are built once per process from the standard chain (environment,
//! profile, `--endpoint-url`, `--region`) and passed by reference; nothing else
//! in rekey constructs one. Each client's endpoint is resolved here
//! ([`endpoint`]) and set on it whenever it is not AWS's default, so what an
//! error names is what the client used. Every SDK error leaves this module as
//! an [`AwsError`] that names the service and endpoint (with where it came
//! from) and the table or IAM action — never as the SDK's `Debug` dump.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{AttributeValue, KeyType, ScalarAttributeType, StreamViewType};
use aws_smithy_types::Blob;

use crate::core::plan::{IndexSpec, KeyAttr, KeySchema};
use crate::core::value::{Item, ScalarType, Value};

pub mod control;
pub(crate) mod endpoint;
pub mod export;
pub(crate) mod import;
pub mod item;
pub(crate) mod query;
pub mod rate;
pub(crate) mod retry;
pub(crate) mod scan;
pub mod streams;
mod trace;
pub mod write;

pub use endpoint::{Endpoint, Endpoints, Service, Source};
use trace::RequestLog;

/// How to reach AWS: the aws CLI's own options.
#[derive(Debug, Clone, Default)]
pub struct AwsOptions {
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    pub profile: Option<String>,
    /// Fixed credentials instead of the standard chain (the local server in tests and the demo).
    pub static_credentials: Option<(String, String)>,
    /// Attempts the SDK makes per request before an error reaches rekey.
    pub max_attempts: Option<u32>,
}

/// A failed AWS call. Each variant from a call carries the endpoint of the
/// client that made it, which knows its service: "DynamoDB Streams at URL
/// (from AWS_ENDPOINT_URL_DYNAMODB_STREAMS)" says what to fix. Actions are
/// API names (`&'static str`) and endpoints shared, so the error stays small
/// enough to return by value.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("cannot reach {} at {endpoint}: {detail}", endpoint.service)]
    Unreachable {
        endpoint: Arc<Endpoint>,
        detail: String,
    },
    /// A table (DynamoDB) or stream (DynamoDB Streams) that is not there.
    #[error(
        "{} `{resource}` does not exist in region {region} at {endpoint}",
        endpoint.service.resource_kind()
    )]
    NotFound {
        resource: String,
        region: String,
        endpoint: Arc<Endpoint>,
    },
    #[error(
        "permission denied for {action} on `{resource}`: {detail} (the IAM policy needs dynamodb:{action}) — {} at {endpoint}",
        endpoint.service
    )]
    AccessDenied {
        action: &'static str,
        resource: String,
        detail: String,
        endpoint: Arc<Endpoint>,
    },
    #[error(
        "{action} on `{resource}` was throttled ({code}{}): {detail} — {} at {endpoint}",
        reason_list(reasons),
        endpoint.service
    )]
    Throttled {
        action: &'static str,
        resource: String,
        code: String,
        detail: String,
        reasons: Vec<String>,
        endpoint: Arc<Endpoint>,
    },
    #[error(
        "{action} on `{resource}` failed ({code}): {detail} — {} at {endpoint}",
        endpoint.service
    )]
    Service {
        action: &'static str,
        resource: String,
        code: String,
        detail: String,
        endpoint: Arc<Endpoint>,
    },
    #[error(
        "{action} on `{resource}` failed: {detail} — {} at {endpoint}",
        endpoint.service
    )]
    Other {
        action: &'static str,
        resource: String,
        detail: String,
        endpoint: Arc<Endpoint>,
    },
    #[error("table `{table}`: {detail}")]
    Schema { table: String, detail: String },
}

fn reason_list(reasons: &[String]) -> String {
    if reasons.is_empty() {
        String::new()
    } else {
        format!(": {}", reasons.join(", "))
    }
}

impl AwsError {
    pub(crate) fn is_throttle(&self) -> bool {
        matches!(self, AwsError::Throttled { .. })
    }

    /// Worth retrying: the network, or the service's own 5xx-class failures.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            AwsError::Unreachable { .. } | AwsError::Other { .. } => true,
            AwsError::Service { code, .. } => {
                matches!(
                    code.as_str(),
                    "InternalServerError"
                        | "ServiceUnavailable"
                        | "InternalFailure"
                        | "RequestTimeout"
                )
            }
            _ => false,
        }
    }
}

const THROTTLE_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "Throttling",
    "TooManyRequestsException",
];

#[derive(Debug, Clone)]
pub struct Clients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub streams: aws_sdk_dynamodbstreams::Client,
    pub s3: aws_sdk_s3::Client,
    /// Where each client sends its requests; `notes` are for the command
    /// layer to print once.
    pub endpoints: Endpoints,
    pub region: String,
}

impl Clients {
    pub async fn connect(opts: &AwsOptions) -> anyhow::Result<Clients> {
        let config = load_config(opts).await;
        let region = config.region().map(|r| r.to_string()).ok_or_else(|| {
            anyhow::anyhow!(
                "no AWS region: pass --region, set AWS_REGION, or set a region in the profile"
            )
        })?;
        let endpoints = endpoint::resolve(opts, &region, |var| std::env::var(var).ok());
        for e in [&endpoints.dynamodb, &endpoints.streams, &endpoints.s3] {
            tracing::info!(service = %e.service, url = %e.url, "{} endpoint: {e}", e.service);
        }
        // Set per client, not on the shared config: each service has its own.
        // Each with the interceptor that logs every attempt (aws::trace).
        let mut ddb = aws_sdk_dynamodb::config::Builder::from(&config).interceptor(RequestLog {
            service: "dynamodb",
        });
        ddb.set_endpoint_url(endpoints.dynamodb.explicit().map(str::to_string));
        let mut streams =
            aws_sdk_dynamodbstreams::config::Builder::from(&config).interceptor(RequestLog {
                service: "dynamodbstreams",
            });
        streams.set_endpoint_url(endpoints.streams.explicit().map(str::to_string));
        let mut s3 =
            aws_sdk_s3::config::Builder::from(&config).interceptor(RequestLog { service: "s3" });
        s3.set_endpoint_url(endpoints.s3.explicit().map(str::to_string));
        // A local S3 server needs path-style addresses: it has no DNS for
        // bucket.host names.
        let s3 = s3.force_path_style(endpoints.s3.is_local()).build();
        Ok(Clients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(ddb.build()),
            streams: aws_sdk_dynamodbstreams::Client::from_conf(streams.build()),
            s3: aws_sdk_s3::Client::from_conf(s3),
            endpoints,
            region,
        })
    }

    /// A DynamoDB call's SDK error as one that names what the operator must fix.
    pub fn error<E, R>(&self, action: &'static str, resource: &str, err: SdkError<E, R>) -> AwsError
    where
        E: ProvideErrorMetadata + ThrottleReasons + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        classify(
            &self.endpoints.dynamodb,
            &self.region,
            action,
            resource,
            err,
        )
    }

    /// A DynamoDB Streams call's SDK error, naming the Streams endpoint.
    pub(crate) fn streams_error<E, R>(
        &self,
        action: &'static str,
        stream: &str,
        err: SdkError<E, R>,
    ) -> AwsError
    where
        E: ProvideErrorMetadata + ThrottleReasons + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        classify(&self.endpoints.streams, &self.region, action, stream, err)
    }

    /// A DynamoDB Streams answer without what it must hold.
    pub(crate) fn streams_missing(
        &self,
        action: &'static str,
        stream: &str,
        what: &str,
    ) -> AwsError {
        AwsError::Other {
            action,
            resource: stream.to_string(),
            detail: format!("the answer held {what}"),
            endpoint: self.endpoints.streams.clone(),
        }
    }

    pub async fn describe_table(&self, table: &str) -> Result<TableInfo, AwsError> {
        let out = self
            .dynamodb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| self.error("DescribeTable", table, e))?;
        let t = out.table.ok_or_else(|| AwsError::Schema {
            table: table.into(),
            detail: "DescribeTable returned no table".into(),
        })?;
        let types: HashMap<String, ScalarType> = t
            .attribute_definitions()
            .iter()
            .filter_map(|d| {
                let ty = match d.attribute_type() {
                    ScalarAttributeType::S => ScalarType::S,
                    ScalarAttributeType::N => ScalarType::N,
                    ScalarAttributeType::B => ScalarType::B,
                    _ => return None,
                };
                Some((d.attribute_name().to_string(), ty))
            })
            .collect();
        let attr = |name: &str| -> Result<KeyAttr, AwsError> {
            let ty = *types.get(name).ok_or_else(|| AwsError::Schema {
                table: table.into(),
                detail: format!("key attribute `{name}` has no attribute definition"),
            })?;
            Ok(KeyAttr {
                name: name.to_string(),
                ty,
            })
        };
        let mut pk = None;
        let mut sk = None;
        for k in t.key_schema() {
            match k.key_type() {
                KeyType::Hash => pk = Some(attr(k.attribute_name())?),
                KeyType::Range => sk = Some(attr(k.attribute_name())?),
                _ => {}
            }
        }
        let partition_key = pk.ok_or_else(|| AwsError::Schema {
            table: table.into(),
            detail: "no HASH key".into(),
        })?;
        let stream = t
            .stream_specification()
            .filter(|s| s.stream_enabled())
            .map(|s| StreamInfo {
                arn: t.latest_stream_arn().unwrap_or_default().to_string(),
                view: s
                    .stream_view_type()
                    .map(StreamViewType::as_str)
                    .unwrap_or("")
                    .to_string(),
            });
        Ok(TableInfo {
            name: table.to_string(),
            key: KeySchema {
                partition_key,
                sort_key: sk,
            },
            item_count: t.item_count().unwrap_or(0).max(0) as u64,
            size_bytes: t.table_size_bytes().unwrap_or(0).max(0) as u64,
            provisioned_read: t
                .provisioned_throughput()
                .and_then(|p| p.read_capacity_units())
                .filter(|&r| r > 0),
            provisioned_write: t
                .provisioned_throughput()
                .and_then(|p| p.write_capacity_units())
                .filter(|&w| w > 0),
            stream,
        })
    }
}

/// An error and its sources, each by Display, joined with ": ". (The SDK's
/// DisplayErrorContext appends a Debug dump, which is not for operators.)
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// DynamoDB says why it throttled (ThrottlingReasons: key range, table,
/// index or account): rekey counts and reports them.
pub trait ThrottleReasons {
    fn reasons(&self) -> Vec<String>;
}

fn reason_names(r: &[aws_sdk_dynamodb::types::ThrottlingReason]) -> Vec<String> {
    r.iter()
        .filter_map(|t| t.reason().map(str::to_string))
        .collect()
}

macro_rules! throttle_reasons {
    ($($t:ty),*) => {$(
        impl ThrottleReasons for $t {
            fn reasons(&self) -> Vec<String> {
                match self {
                    Self::ProvisionedThroughputExceededException(e) => reason_names(e.throttling_reasons()),
                    Self::ThrottlingException(e) => reason_names(e.throttling_reasons()),
                    _ => Vec::new(),
                }
            }
        }
    )*};
}

throttle_reasons!(
    aws_sdk_dynamodb::operation::scan::ScanError,
    aws_sdk_dynamodb::operation::put_item::PutItemError,
    aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemError,
    aws_sdk_dynamodb::operation::update_item::UpdateItemError,
    aws_sdk_dynamodb::operation::delete_item::DeleteItemError,
    aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemError,
    aws_sdk_dynamodb::operation::get_item::GetItemError,
    aws_sdk_dynamodb::operation::query::QueryError,
    aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError
);

macro_rules! no_throttle_reasons {
    ($($t:ty),*) => {$(
        impl ThrottleReasons for $t {
            fn reasons(&self) -> Vec<String> { Vec::new() }
        }
    )*};
}

no_throttle_reasons!(
    aws_sdk_dynamodb::operation::describe_table::DescribeTableError,
    aws_sdk_dynamodb::operation::create_table::CreateTableError,
    aws_sdk_dynamodb::operation::delete_table::DeleteTableError,
    aws_sdk_dynamodb::operation::update_table::UpdateTableError,
    aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError,
    aws_sdk_dynamodbstreams::operation::describe_stream::DescribeStreamError,
    aws_sdk_dynamodbstreams::operation::get_shard_iterator::GetShardIteratorError,
    aws_sdk_dynamodb::operation::import_table::ImportTableError,
    aws_sdk_dynamodb::operation::describe_import::DescribeImportError,
    aws_sdk_s3::operation::put_object::PutObjectError,
    aws_sdk_s3::operation::delete_object::DeleteObjectError,
    aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Error
);

/// What rekey needs to know of a table.
#[derive(Debug, Clone)]
pub struct TableInfo {
    pub name: String,
    pub key: KeySchema,
    pub item_count: u64,
    pub size_bytes: u64,
    pub provisioned_read: Option<i64>,
    pub provisioned_write: Option<i64>,
    pub stream: Option<StreamInfo>,
}

#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub arn: String,
    pub view: String,
}

impl TableInfo {
    /// The plan's idea of the key must be the table's.
    pub(crate) fn check_key(&self, declared: &KeySchema, role: &str) -> Result<(), AwsError> {
        if &self.key != declared {
            return Err(AwsError::Schema {
                table: self.name.clone(),
                detail: format!(
                    "the plan declares the {role} key as {declared}, but the table's key is {}",
                    self.key
                ),
            });
        }
        Ok(())
    }
}

/// The shared SDK configuration: region, profile, credentials, retries.
/// Endpoints are not set here (see [`Clients::connect`]).
async fn load_config(opts: &AwsOptions) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(https_client());
    if let Some(region) = &opts.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(profile) = &opts.profile {
        loader = loader.profile_name(profile);
    }
    if let Some((key, secret)) = &opts.static_credentials {
        loader =
            loader.credentials_provider(Credentials::new(key, secret, None, None, "rekey-static"));
    }
    // Otherwise the standard chain decides (AWS_MAX_ATTEMPTS, the profile, or 3).
    if let Some(n) = opts.max_attempts {
        loader = loader.retry_config(RetryConfig::standard().with_max_attempts(n));
    }
    loader.load().await
}

/// The SDK's HTTP client: rustls with ring, trusting the system's
/// certificates (Cargo.toml says why not the SDK's default one). Plain-HTTP
/// endpoints (a local server) go through it too. Public for the tests' own
/// SDK clients.
pub fn https_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// Any SDK error of a call to `endpoint` as an [`AwsError`].
fn classify<E, R>(
    endpoint: &Arc<Endpoint>,
    region: &str,
    action: &'static str,
    resource: &str,
    err: SdkError<E, R>,
) -> AwsError
where
    E: ProvideErrorMetadata + ThrottleReasons + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let endpoint = endpoint.clone();
    if let SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) = &err {
        return AwsError::Unreachable {
            endpoint,
            detail: error_chain(&err),
        };
    }
    let code = err.code().unwrap_or("").to_string();
    let detail = match err.message() {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => error_chain(&err),
    };
    let resource = resource.to_string();
    if code == "ResourceNotFoundException" {
        AwsError::NotFound {
            resource,
            region: region.to_string(),
            endpoint,
        }
    } else if code == "AccessDeniedException" || code == "UnrecognizedClientException" {
        AwsError::AccessDenied {
            action,
            resource,
            detail,
            endpoint,
        }
    } else if THROTTLE_CODES.contains(&code.as_str()) {
        let reasons = err
            .as_service_error()
            .map(ThrottleReasons::reasons)
            .unwrap_or_default();
        AwsError::Throttled {
            action,
            resource,
            code,
            detail,
            reasons,
            endpoint,
        }
    } else if code.is_empty() {
        AwsError::Other {
            action,
            resource,
            detail,
            endpoint,
        }
    } else {
        AwsError::Service {
            action,
            resource,
            code,
            detail,
            endpoint,
        }
    }
}

// ---- table definitions ------------------------------------------------------

fn definition(attr: &KeyAttr) -> Result<aws_sdk_dynamodb::types::AttributeDefinition, String> {
    let ty = match attr.ty {
        ScalarType::S => ScalarAttributeType::S,
        ScalarType::N => ScalarAttributeType::N,
        ScalarType::B => ScalarAttributeType::B,
    };
    aws_sdk_dynamodb::types::AttributeDefinition::builder()
        .attribute_name(&attr.name)
        .attribute_type(ty)
        .build()
        .map_err(|e| format!("invalid key schema: {e}"))
}

fn key_elements(key: &KeySchema) -> Result<Vec<aws_sdk_dynamodb::types::KeySchemaElement>, String> {
    std::iter::once((&key.partition_key, KeyType::Hash))
        .chain(key.sort_key.iter().map(|s| (s, KeyType::Range)))
        .map(|(attr, kt)| {
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name(&attr.name)
                .key_type(kt)
                .build()
                .map_err(|e| format!("invalid key schema: {e}"))
        })
        .collect()
}

fn gsi(index: &IndexSpec) -> Result<aws_sdk_dynamodb::types::GlobalSecondaryIndex, String> {
    use aws_sdk_dynamodb::types::{GlobalSecondaryIndex, Projection, ProjectionType};
    GlobalSecondaryIndex::builder()
        .index_name(&index.name)
        .set_key_schema(Some(key_elements(&index.key)?))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .map_err(|e| format!("index `{}`: {e}", index.name))
}

// ---- conversions between rekey's values and the SDK's ------------------------

pub fn to_sdk(v: &Value) -> AttributeValue {
    match v {
        Value::S(s) => AttributeValue::S(s.clone()),
        Value::N(n) => AttributeValue::N(n.clone()),
        Value::B(b) => AttributeValue::B(Blob::new(b.clone())),
        Value::Ss(v) => AttributeValue::Ss(v.clone()),
        Value::Ns(v) => AttributeValue::Ns(v.clone()),
        Value::Bs(v) => AttributeValue::Bs(v.iter().map(|b| Blob::new(b.clone())).collect()),
        Value::M(m) => AttributeValue::M(to_sdk_item(m)),
        Value::L(l) => AttributeValue::L(l.iter().map(to_sdk).collect()),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Null => AttributeValue::Null(true),
    }
}

pub fn to_sdk_item(item: &Item) -> HashMap<String, AttributeValue> {
    item.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect()
}

/// `None` for a type this SDK version does not know (never silently dropped:
/// the caller rejects the item).
pub(crate) fn from_sdk(v: AttributeValue) -> Option<Value> {
    Some(match v {
        AttributeValue::S(s) => Value::S(s),
        AttributeValue::N(n) => Value::N(n),
        AttributeValue::B(b) => Value::B(b.into_inner()),
        AttributeValue::Ss(v) => Value::Ss(v),
        AttributeValue::Ns(v) => Value::Ns(v),
        AttributeValue::Bs(v) => Value::Bs(v.into_iter().map(Blob::into_inner).collect()),
        AttributeValue::M(m) => Value::M(from_sdk_item(m)?),
        AttributeValue::L(l) => Value::L(l.into_iter().map(from_sdk).collect::<Option<_>>()?),
        AttributeValue::Bool(b) => Value::Bool(b),
        AttributeValue::Null(_) => Value::Null,
        _ => return None,
    })
}

pub fn from_sdk_item(m: HashMap<String, AttributeValue>) -> Option<Item> {
    m.into_iter()
        .map(|(k, v)| from_sdk(v).map(|v| (k, v)))
        .collect()
}

/// Table creation, for the demo, the test environment and the load test's
/// scratch tables (on-demand billing; a stream with both images when asked,
/// as the tail needs; GSIs projecting every attribute).
impl Clients {
    pub async fn create_table(
        &self,
        table: &str,
        key: &KeySchema,
        stream: bool,
    ) -> Result<(), AwsError> {
        self.create_table_with(table, key, stream, &[]).await
    }

    /// [`Clients::create_table`] with these GSIs.
    pub(crate) async fn create_table_with(
        &self,
        table: &str,
        key: &KeySchema,
        stream: bool,
        indexes: &[IndexSpec],
    ) -> Result<(), AwsError> {
        use aws_sdk_dynamodb::types::{BillingMode, StreamSpecification};
        let mut req = self
            .dynamodb
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest);
        let invalid = |detail: String| AwsError::Schema {
            table: table.into(),
            detail,
        };
        let mut defined = std::collections::BTreeSet::new();
        for attr in key
            .attrs()
            .chain(indexes.iter().flat_map(|i| i.key.attrs()))
        {
            if defined.insert(attr.name.clone()) {
                req = req.attribute_definitions(definition(attr).map_err(invalid)?);
            }
        }
        for e in key_elements(key).map_err(invalid)? {
            req = req.key_schema(e);
        }
        for index in indexes {
            req = req.global_secondary_indexes(gsi(index).map_err(invalid)?);
        }
        if stream {
            let spec = StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build();
            if let Ok(spec) = spec {
                req = req.stream_specification(spec);
            }
        }
        req.send()
            .await
            .map_err(|e| self.error("CreateTable", table, e))?;
        self.wait_active(table).await
    }

    /// DeleteTable (the load test's scratch tables); one that is already
    /// gone is not an error.
    pub(crate) async fn delete_table(&self, table: &str) -> Result<(), AwsError> {
        match self.dynamodb.delete_table().table_name(table).send().await {
            Ok(_) => Ok(()),
            Err(e) => match self.error("DeleteTable", table, e) {
                AwsError::NotFound { .. } => Ok(()),
                e => Err(e),
            },
        }
    }

    /// Waits until `table` is ACTIVE: AWS creates tables in the background
    /// (seconds); a local server has them at once.
    pub(crate) async fn wait_active(&self, table: &str) -> Result<(), AwsError> {
        use aws_sdk_dynamodb::types::TableStatus;
        let started = std::time::Instant::now();
        loop {
            let out = self
                .dynamodb
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| self.error("DescribeTable", table, e))?;
            let status = out.table.and_then(|t| t.table_status);
            if status == Some(TableStatus::Active) {
                return Ok(());
            }
            if started.elapsed() > std::time::Duration::from_secs(600) {
                return Err(AwsError::Schema {
                    table: table.into(),
                    detail: format!(
                        "not ACTIVE 10 minutes after CreateTable (status {})",
                        status.as_ref().map_or("unknown", TableStatus::as_str)
                    ),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }

    /// Turn on a NEW_AND_OLD_IMAGES stream on an existing table: records start
    /// with the next write, as on a table enabled before a migration.
    pub(crate) async fn enable_stream(&self, table: &str) -> Result<(), AwsError> {
        use aws_sdk_dynamodb::types::StreamSpecification;
        let spec = StreamSpecification::builder()
            .stream_enabled(true)
            .stream_view_type(StreamViewType::NewAndOldImages)
            .build()
            .map_err(|e| AwsError::Schema {
                table: table.into(),
                detail: format!("stream specification: {e}"),
            })?;
        self.dynamodb
            .update_table()
            .table_name(table)
            .stream_specification(spec)
            .send()
            .await
            .map_err(|e| self.error("UpdateTable", table, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_the_sdk_types() {
        let item: Item = serde_json::from_str(
            r#"{"a":{"S":"x"},"b":{"N":"1.50"},"c":{"B":"AAEC"},"d":{"SS":["p"]},"e":{"NS":["1"]},
                "f":{"BS":["AA=="]},"g":{"M":{"h":{"L":[{"BOOL":false},{"NULL":true}]}}}}"#,
        )
        .unwrap();
        let back = from_sdk_item(to_sdk_item(&item)).unwrap();
        assert_eq!(back, item);
        let Value::N(n) = &back["b"] else { panic!() };
        assert_eq!(n, "1.50");
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;
    use aws_sdk_dynamodb::operation::scan::ScanError;
    use aws_sdk_dynamodbstreams::operation::describe_stream::DescribeStreamError;
    use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError;
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    /// An SDK error as the SDK builds it from a service answer with this code.
    fn service_error(code: &str, message: &str) -> SdkError<ScanError, Response> {
        let meta = ErrorMetadata::builder().code(code).message(message).build();
        let raw = Response::new(StatusCode::try_from(400).unwrap(), SdkBody::empty());
        SdkError::service_error(ScanError::generic(meta), raw)
    }

    fn at(service: Service, url: &str, source: Source) -> Arc<Endpoint> {
        Arc::new(Endpoint {
            service,
            url: url.into(),
            source,
        })
    }

    fn scan_error(endpoint: &Arc<Endpoint>, err: SdkError<ScanError, Response>) -> String {
        classify(endpoint, "eu-west-1", "Scan", "orders", err).to_string()
    }

    #[test]
    fn service_errors_name_the_action_table_region_and_endpoint() {
        let ddb = at(Service::DynamoDb, "http://127.0.0.1:9", Source::Flag);
        let e = scan_error(
            &ddb,
            service_error("AccessDeniedException", "User: x is not authorized"),
        );
        assert_eq!(
            e,
            "permission denied for Scan on `orders`: User: x is not authorized \
             (the IAM policy needs dynamodb:Scan) — DynamoDB at http://127.0.0.1:9 (from --endpoint-url)"
        );
        let e = scan_error(
            &ddb,
            service_error("ResourceNotFoundException", "not found"),
        );
        assert_eq!(
            e,
            "table `orders` does not exist in region eu-west-1 at http://127.0.0.1:9 (from --endpoint-url)"
        );
        let e = classify(
            &ddb,
            "eu-west-1",
            "Scan",
            "orders",
            service_error("ProvisionedThroughputExceededException", "slow down"),
        );
        assert!(e.is_throttle());
        let e = scan_error(&ddb, service_error("ValidationException", "bad"));
        assert_eq!(
            e,
            "Scan on `orders` failed (ValidationException): bad — DynamoDB at http://127.0.0.1:9 (from --endpoint-url)"
        );
    }

    /// An SDK error for a request that never reached the server.
    fn unreachable<E>() -> SdkError<E, Response> {
        use aws_smithy_runtime_api::client::result::ConnectorError;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        SdkError::dispatch_failure(ConnectorError::io(Box::new(io)))
    }

    #[tokio::test]
    async fn streams_errors_name_the_streams_endpoint_not_dynamodbs() {
        let mut clients = Clients::connect(&AwsOptions {
            endpoint_url: Some("http://127.0.0.1:9".into()),
            region: Some("eu-west-1".into()),
            static_credentials: Some(("k".into(), "s".into())),
            ..Default::default()
        })
        .await
        .unwrap();
        clients.endpoints.streams = at(
            Service::Streams,
            "http://127.0.0.1:7",
            Source::Env(endpoint::STREAMS),
        );
        let e = clients.streams_error::<GetRecordsError, _>("GetRecords", "arn:s", unreachable());
        let text = e.to_string();
        assert!(
            text.starts_with(
                "cannot reach DynamoDB Streams at http://127.0.0.1:7 \
                 (from the AWS_ENDPOINT_URL_DYNAMODB_STREAMS environment variable): "
            ),
            "{text}"
        );
        assert!(e.is_transient());
        let e = clients.error::<ScanError, _>("Scan", "orders", unreachable());
        assert!(
            e.to_string()
                .starts_with("cannot reach DynamoDB at http://127.0.0.1:9 (from --endpoint-url): "),
            "{e}"
        );
        let e = clients.streams_error(
            "DescribeStream",
            "arn:s",
            SdkError::service_error(
                DescribeStreamError::generic(
                    ErrorMetadata::builder()
                        .code("ResourceNotFoundException")
                        .build(),
                ),
                Response::new(StatusCode::try_from(400).unwrap(), SdkBody::empty()),
            ),
        );
        assert_eq!(
            e.to_string(),
            "stream `arn:s` does not exist in region eu-west-1 at http://127.0.0.1:7 \
             (from the AWS_ENDPOINT_URL_DYNAMODB_STREAMS environment variable)"
        );
    }
}
