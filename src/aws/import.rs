//! Creating the target table with DynamoDB's ImportTable, and writing the S3
//! objects it reads (`rekey backfill --via-import`).
//!
//! The objects are gzip DynamoDB JSON (`core::import` builds them). The
//! import is asked for exactly what the plan declares: the target's key
//! schema, its indexes (projecting every attribute: a plan names an index's
//! keys, not a projection) and on-demand billing. It runs in DynamoDB's
//! background; [`describe_import`] follows it.
//!
//! A `ClientToken` makes ImportTable idempotent for 8 hours: a process killed
//! after the call and before it recorded the import's ARN calls again with
//! the same token and gets the same import, instead of a second one (which
//! would fail: the table exists).
//!
//! Every S3 call rekey makes for an import is in this file (`ops::iam`
//! checks that), as every call reading an export is in `export.rs`.

use std::fmt;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, ImportTableDescription,
    InputCompressionType, InputFormat, KeySchemaElement, KeyType, Projection, ProjectionType,
    S3BucketSource, ScalarAttributeType, TableCreationParameters,
};
use aws_sdk_s3::primitives::ByteStream;

use crate::aws::retry::{backoff, jitter};
use crate::aws::{AwsError, Clients, Endpoint, ThrottleReasons, classify};
use crate::core::plan::{IndexSpec, KeySchema};
use crate::core::value::ScalarType;

/// What to import, and into which new table.
#[derive(Debug, Clone)]
pub struct ImportSpec<'a> {
    pub table: &'a str,
    pub key: &'a KeySchema,
    pub indexes: &'a [IndexSpec],
    pub bucket: &'a str,
    /// The prefix every data object's key starts with (ends with `/`).
    pub key_prefix: &'a str,
    /// The same for every call of one migration (see the module docs).
    pub client_token: &'a str,
}

/// Where an import is, as DescribeImport says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportStatus {
    InProgress,
    Completed,
    Cancelling,
    Cancelled,
    Failed,
    /// A status this SDK does not know: treated as still running.
    Unknown,
}

impl fmt::Display for ImportStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImportStatus::InProgress => "IN_PROGRESS",
            ImportStatus::Completed => "COMPLETED",
            ImportStatus::Cancelling => "CANCELLING",
            ImportStatus::Cancelled => "CANCELLED",
            ImportStatus::Failed => "FAILED",
            ImportStatus::Unknown => "UNKNOWN",
        })
    }
}

/// An import as DescribeImport (or ImportTable) describes it.
#[derive(Debug, Clone)]
pub struct ImportInfo {
    pub arn: String,
    pub status: ImportStatus,
    pub table_arn: String,
    pub processed_items: u64,
    pub processed_bytes: u64,
    pub imported_items: u64,
    /// Items DynamoDB could not import (logged to CloudWatch only).
    pub errors: u64,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub log_group: Option<String>,
}

impl ImportInfo {
    /// The table the import creates, from its ARN (`…:table/NAME`).
    pub fn table_name(&self) -> &str {
        self.table_arn.rsplit('/').next().unwrap_or("")
    }
}

fn info(d: ImportTableDescription) -> ImportInfo {
    use aws_sdk_dynamodb::types::ImportStatus as S;
    let count = |n: i64| n.max(0) as u64;
    ImportInfo {
        arn: d.import_arn.unwrap_or_default(),
        status: match d.import_status {
            Some(S::InProgress) => ImportStatus::InProgress,
            Some(S::Completed) => ImportStatus::Completed,
            Some(S::Cancelling) => ImportStatus::Cancelling,
            Some(S::Cancelled) => ImportStatus::Cancelled,
            Some(S::Failed) => ImportStatus::Failed,
            _ => ImportStatus::Unknown,
        },
        table_arn: d.table_arn.unwrap_or_default(),
        processed_items: count(d.processed_item_count),
        processed_bytes: count(d.processed_size_bytes.unwrap_or(0)),
        imported_items: count(d.imported_item_count),
        errors: count(d.error_count),
        failure_code: d.failure_code,
        failure_message: d.failure_message,
        log_group: d.cloud_watch_log_group_arn,
    }
}

/// An import that ended without creating the table's data: FAILED or
/// CANCELLED, with DynamoDB's reason.
#[derive(Debug, thiserror::Error)]
#[error(
    "the import into table `{table}` ended {status}: {code}: {message} (import {arn}{}) — DynamoDB at {endpoint}",
    log_group.as_ref().map(|g| format!(", CloudWatch log group {g}")).unwrap_or_default()
)]
pub struct ImportFailed {
    pub table: String,
    pub arn: String,
    pub status: ImportStatus,
    pub code: String,
    pub message: String,
    pub log_group: Option<String>,
    pub endpoint: Arc<Endpoint>,
}

impl ImportFailed {
    pub fn new(clients: &Clients, table: &str, i: &ImportInfo) -> ImportFailed {
        ImportFailed {
            table: table.to_string(),
            arn: i.arn.clone(),
            status: i.status,
            code: i.failure_code.clone().unwrap_or_else(|| "no code".into()),
            message: i
                .failure_message
                .clone()
                .unwrap_or_else(|| "no message".into()),
            log_group: i.log_group.clone(),
            endpoint: clients.endpoints.dynamodb.clone(),
        }
    }
}

fn schema_error(table: &str, what: &str, e: impl fmt::Display) -> AwsError {
    AwsError::Schema {
        table: table.into(),
        detail: format!("{what}: {e}"),
    }
}

/// Attribute definitions (each name once) and key schema elements of `key`.
fn key_elements(
    table: &str,
    key: &KeySchema,
    defs: &mut Vec<AttributeDefinition>,
) -> Result<Vec<KeySchemaElement>, AwsError> {
    let mut elements = Vec::new();
    for (attr, kt) in std::iter::once((&key.partition_key, KeyType::Hash))
        .chain(key.sort_key.iter().map(|s| (s, KeyType::Range)))
    {
        if !defs.iter().any(|d| d.attribute_name() == attr.name) {
            let ty = match attr.ty {
                ScalarType::S => ScalarAttributeType::S,
                ScalarType::N => ScalarAttributeType::N,
                ScalarType::B => ScalarAttributeType::B,
            };
            defs.push(
                AttributeDefinition::builder()
                    .attribute_name(&attr.name)
                    .attribute_type(ty)
                    .build()
                    .map_err(|e| schema_error(table, "attribute definition", e))?,
            );
        }
        elements.push(
            KeySchemaElement::builder()
                .attribute_name(&attr.name)
                .key_type(kt)
                .build()
                .map_err(|e| schema_error(table, "key schema", e))?,
        );
    }
    Ok(elements)
}

fn creation_parameters(spec: &ImportSpec<'_>) -> Result<TableCreationParameters, AwsError> {
    let table = spec.table;
    let mut defs = Vec::new();
    let key = key_elements(table, spec.key, &mut defs)?;
    let mut indexes = Vec::new();
    for index in spec.indexes {
        let key = key_elements(table, &index.key, &mut defs)?;
        let projection = Projection::builder()
            .projection_type(ProjectionType::All)
            .build();
        indexes.push(
            GlobalSecondaryIndex::builder()
                .index_name(&index.name)
                .set_key_schema(Some(key))
                .projection(projection)
                .build()
                .map_err(|e| schema_error(table, "index", e))?,
        );
    }
    TableCreationParameters::builder()
        .table_name(table)
        .set_attribute_definitions(Some(defs))
        .set_key_schema(Some(key))
        .billing_mode(BillingMode::PayPerRequest)
        .set_global_secondary_indexes((!indexes.is_empty()).then_some(indexes))
        .build()
        .map_err(|e| schema_error(table, "table creation parameters", e))
}

/// ImportTable: DynamoDB JSON, gzip, on-demand billing.
pub async fn import_table(
    clients: &Clients,
    spec: &ImportSpec<'_>,
) -> Result<ImportInfo, AwsError> {
    let source = S3BucketSource::builder()
        .s3_bucket(spec.bucket)
        .s3_key_prefix(spec.key_prefix)
        .build()
        .map_err(|e| schema_error(spec.table, "S3 source", e))?;
    let out = clients
        .dynamodb
        .import_table()
        .client_token(spec.client_token)
        .input_format(InputFormat::DynamodbJson)
        .input_compression_type(InputCompressionType::Gzip)
        .s3_bucket_source(source)
        .table_creation_parameters(creation_parameters(spec)?)
        .send()
        .await
        .map_err(|e| clients.error("ImportTable", spec.table, e))?;
    let d = out
        .import_table_description
        .ok_or_else(|| schema_error(spec.table, "ImportTable", "the answer held no description"))?;
    Ok(info(d))
}

/// DescribeImport of `arn`.
pub async fn describe_import(clients: &Clients, arn: &str) -> Result<ImportInfo, AwsError> {
    let out = clients
        .dynamodb
        .describe_import()
        .import_arn(arn)
        .send()
        .await
        .map_err(|e| clients.error("DescribeImport", arn, e))?;
    let d = out
        .import_table_description
        .ok_or_else(|| AwsError::Other {
            action: "DescribeImport",
            resource: arn.to_string(),
            detail: "the answer held no description".into(),
            endpoint: clients.endpoints.dynamodb.clone(),
        })?;
    Ok(info(d))
}

/// Waits until the table an import created is ACTIVE.
pub async fn wait_table_active(clients: &Clients, table: &str) -> Result<(), AwsError> {
    clients.wait_active(table).await
}

/// An S3 call's SDK error, naming the S3 endpoint and the object.
fn s3_error<E, R>(
    clients: &Clients,
    action: &'static str,
    bucket: &str,
    key: &str,
    err: aws_sdk_s3::error::SdkError<E, R>,
) -> AwsError
where
    E: aws_sdk_s3::error::ProvideErrorMetadata
        + ThrottleReasons
        + std::error::Error
        + Send
        + Sync
        + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let resource = format!("s3://{bucket}/{key}");
    classify(
        &clients.endpoints.s3,
        &clients.region,
        action,
        &resource,
        err,
    )
}

/// PutObject, retrying a transient failure up to `max_retries` times (the
/// SDK has retried each attempt already).
pub async fn put_object(
    clients: &Clients,
    bucket: &str,
    key: &str,
    body: bytes::Bytes,
    max_retries: u32,
) -> Result<(), AwsError> {
    let mut attempt = 0;
    loop {
        let sent = clients
            .s3
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type("application/gzip")
            .body(ByteStream::from(body.clone()))
            .send()
            .await;
        match sent.map_err(|e| s3_error(clients, "PutObject", bucket, key, e)) {
            Ok(_) => return Ok(()),
            Err(e) if (e.is_transient() || e.is_throttle()) && attempt < max_retries => {
                tracing::info!(action = "PutObject", bucket, key, attempt, error = %e, "retrying");
                tokio::time::sleep(backoff(attempt, jitter())).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// DeleteObject (S3 answers success for a key that is not there).
pub async fn delete_object(clients: &Clients, bucket: &str, key: &str) -> Result<(), AwsError> {
    clients
        .s3
        .delete_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| s3_error(clients, "DeleteObject", bucket, key, e))?;
    Ok(())
}

/// The first object under `prefix`, if any.
pub async fn first_object(
    clients: &Clients,
    bucket: &str,
    prefix: &str,
) -> Result<Option<String>, AwsError> {
    let out = clients
        .s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .max_keys(1)
        .send()
        .await
        .map_err(|e| s3_error(clients, "ListObjectsV2", bucket, prefix, e))?;
    Ok(out
        .contents()
        .first()
        .and_then(|o| o.key())
        .map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::KeyAttr;

    fn key(pk: (&str, ScalarType), sk: Option<(&str, ScalarType)>) -> KeySchema {
        let attr = |(name, ty): (&str, ScalarType)| KeyAttr {
            name: name.into(),
            ty,
        };
        KeySchema {
            partition_key: attr(pk),
            sort_key: sk.map(attr),
        }
    }

    #[test]
    fn the_table_gets_the_plan_s_keys_and_indexes_each_attribute_defined_once() {
        let target = key(("PK", ScalarType::S), Some(("SK", ScalarType::S)));
        let indexes = [IndexSpec {
            name: "GSI1".into(),
            key: key(("GSI1PK", ScalarType::S), Some(("SK", ScalarType::S))),
        }];
        let spec = ImportSpec {
            table: "orders_v2",
            key: &target,
            indexes: &indexes,
            bucket: "b",
            key_prefix: "p/data/",
            client_token: "t",
        };
        let p = creation_parameters(&spec).unwrap();
        let defs: Vec<&str> = p
            .attribute_definitions()
            .iter()
            .map(|d| d.attribute_name())
            .collect();
        assert_eq!(defs, ["PK", "SK", "GSI1PK"]);
        assert_eq!(p.key_schema().len(), 2);
        assert_eq!(p.billing_mode(), Some(&BillingMode::PayPerRequest));
        let g = &p.global_secondary_indexes()[0];
        assert_eq!(g.index_name(), "GSI1");
        assert_eq!(
            g.projection().and_then(|p| p.projection_type()),
            Some(&ProjectionType::All)
        );
        let none = ImportSpec {
            indexes: &[],
            ..spec
        };
        assert!(
            creation_parameters(&none)
                .unwrap()
                .global_secondary_indexes
                .is_none()
        );
    }
}
