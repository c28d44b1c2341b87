//! Each attempt of each AWS request as one tracing event, for `--log-format
//! json` (and `-vv`): what a log pipeline needs to follow a request into
//! AWS's own records and to see capacity and throttles as they happen.
//!
//! The seam is the SDK's interceptor ([`Intercept`]), registered on every
//! client [`super::Clients::connect`] builds, so no call site can forget it
//! and retries the SDK makes inside one `.send()` are each seen:
//! `read_before_attempt` stamps the attempt's start into the config bag,
//! `read_after_attempt` (called for every attempt, failed or not) emits the
//! event. Its fields: `service`, `operation`, `table` (DynamoDB's endpoint
//! parameters name it), `request_id` (`x-amzn-RequestId`, S3's
//! `x-amz-request-id`), `status`, `attempt` (1-based), `latency_ms`,
//! `consumed_capacity` (the units the answer reports, where rekey asked for
//! them), `unprocessed` (a batch's items or keys handed back), `throttled`,
//! `throttle_reason` (DynamoDB's ThrottlingReasons, else the error code, or
//! `UnprocessedItems`) and `error_code`. Throttled attempts are at info (`-v`),
//! the others at debug (`-vv`). No key values: the event reads the answer's
//! metadata, never its items.

use std::time::Instant;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::ConsumedCapacity;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::endpoint::EndpointResolverParams;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeTransmitInterceptorContextRef, Error, FinalizerInterceptorContextRef, Output,
};
use aws_smithy_runtime_api::client::orchestrator::{Metadata, OrchestratorError};
use aws_smithy_runtime_api::client::retries::RequestAttempts;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

use super::{THROTTLE_CODES, ThrottleReasons};

/// The interceptor; `service` names the client's service in the event.
#[derive(Debug)]
pub(crate) struct RequestLog {
    pub(crate) service: &'static str,
}

/// When the attempt in flight started.
#[derive(Debug, Clone, Copy)]
struct AttemptStart(Instant);

impl Storable for AttemptStart {
    type Storer = StoreReplace<Self>;
}

impl Intercept for RequestLog {
    fn name(&self) -> &'static str {
        "rekey: each request attempt in the log"
    }

    fn read_before_attempt(
        &self,
        _: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state()
            .store_put(AttemptStart(Instant::now()));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        ctx: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // Nothing listens (no -v, no --log-format json with a filter that takes it): no work.
        if !tracing::enabled!(tracing::Level::INFO) {
            return Ok(());
        }
        let latency_ms = cfg
            .load::<AttemptStart>()
            .map(|s| s.0.elapsed().as_secs_f64() * 1000.0);
        let response = ctx.response();
        let answer = match ctx.output_or_error() {
            Some(Ok(output)) => Answer::of_output(output),
            Some(Err(error)) => Answer::of_error(error),
            None => Answer::default(),
        };
        let attempt = Attempt {
            service: self.service,
            operation: cfg.load::<Metadata>().map(Metadata::name),
            table: table(cfg),
            request_id: response.and_then(|r| {
                let h = r.headers();
                h.get("x-amzn-requestid")
                    .or_else(|| h.get("x-amz-request-id"))
            }),
            status: response.map(|r| r.status().as_u16()),
            attempt: cfg.load::<RequestAttempts>().map_or(1, |a| a.attempts()),
            latency_ms,
            answer,
        };
        attempt.emit();
        Ok(())
    }
}

/// What the event says of one attempt.
struct Attempt<'a> {
    service: &'static str,
    operation: Option<&'a str>,
    table: Option<String>,
    request_id: Option<&'a str>,
    status: Option<u16>,
    attempt: u32,
    latency_ms: Option<f64>,
    answer: Answer,
}

impl Attempt<'_> {
    fn emit(&self) {
        let a = &self.answer;
        let reason = a.throttle_reason();
        macro_rules! event {
            ($level:ident, $message:literal) => {
                tracing::$level!(
                    service = self.service,
                    operation = self.operation,
                    table = self.table.as_deref(),
                    request_id = self.request_id,
                    status = self.status,
                    attempt = self.attempt,
                    latency_ms = self.latency_ms,
                    consumed_capacity = a.consumed,
                    unprocessed = a.unprocessed,
                    throttled = reason.is_some(),
                    throttle_reason = reason.as_deref(),
                    error_code = a.code.as_deref(),
                    $message
                )
            };
        }
        if reason.is_some() {
            event!(info, "aws request throttled");
        } else {
            event!(debug, "aws request");
        }
    }
}

/// What the answer (or its error) reports.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    /// Capacity units consumed, summed over a batch's tables.
    consumed: Option<f64>,
    /// A batch's items or keys handed back (UnprocessedItems/Keys).
    unprocessed: Option<u64>,
    code: Option<String>,
    reasons: Vec<String>,
}

impl Answer {
    /// Why the attempt was throttled, or None: DynamoDB's reasons, the
    /// throttle's error code, or a batch's unprocessed items.
    fn throttle_reason(&self) -> Option<String> {
        let code = self.code.as_deref().unwrap_or("");
        if THROTTLE_CODES.contains(&code) {
            return Some(if self.reasons.is_empty() {
                code.to_string()
            } else {
                self.reasons.join(",")
            });
        }
        self.unprocessed
            .filter(|n| *n > 0)
            .map(|_| "UnprocessedItems".to_string())
    }

    fn of_output(output: &Output) -> Answer {
        use aws_sdk_dynamodb::operation as op;
        let sum = |c: &[ConsumedCapacity]| -> Option<f64> {
            (!c.is_empty()).then(|| c.iter().filter_map(ConsumedCapacity::capacity_units).sum())
        };
        // The answers with one ConsumedCapacity.
        macro_rules! single {
            ($($t:ty),*) => {
                $(if let Some(o) = output.downcast_ref::<$t>() {
                    return Answer::consumed(o.consumed_capacity().and_then(ConsumedCapacity::capacity_units));
                })*
            };
        }
        single!(
            op::scan::ScanOutput,
            op::query::QueryOutput,
            op::get_item::GetItemOutput,
            op::put_item::PutItemOutput,
            op::delete_item::DeleteItemOutput,
            op::update_item::UpdateItemOutput
        );
        if let Some(o) = output.downcast_ref::<op::transact_write_items::TransactWriteItemsOutput>()
        {
            return Answer::consumed(sum(o.consumed_capacity()));
        }
        if let Some(o) = output.downcast_ref::<op::batch_write_item::BatchWriteItemOutput>() {
            let left = o
                .unprocessed_items()
                .map_or(0, |m| m.values().map(Vec::len).sum());
            return Answer {
                unprocessed: Some(left as u64),
                ..Answer::consumed(sum(o.consumed_capacity()))
            };
        }
        if let Some(o) = output.downcast_ref::<op::batch_get_item::BatchGetItemOutput>() {
            let left = o
                .unprocessed_keys()
                .map_or(0, |m| m.values().map(|k| k.keys().len()).sum());
            return Answer {
                unprocessed: Some(left as u64),
                ..Answer::consumed(sum(o.consumed_capacity()))
            };
        }
        Answer::default()
    }

    fn consumed(consumed: Option<f64>) -> Answer {
        Answer {
            consumed,
            ..Answer::default()
        }
    }

    /// The error's code and throttling reasons, for the operations rekey
    /// calls (those [`ThrottleReasons`] knows); a transport failure has none.
    fn of_error(error: &OrchestratorError<Error>) -> Answer {
        let Some(e) = error.as_operation_error() else {
            return Answer::default();
        };
        macro_rules! facts {
            ($($t:ty),* $(,)?) => {
                $(if let Some(e) = e.downcast_ref::<$t>() {
                    return Answer {
                        code: e.code().map(str::to_string),
                        reasons: e.reasons(),
                        ..Answer::default()
                    };
                })*
            };
        }
        facts!(
            aws_sdk_dynamodb::operation::scan::ScanError,
            aws_sdk_dynamodb::operation::put_item::PutItemError,
            aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemError,
            aws_sdk_dynamodb::operation::update_item::UpdateItemError,
            aws_sdk_dynamodb::operation::delete_item::DeleteItemError,
            aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemError,
            aws_sdk_dynamodb::operation::get_item::GetItemError,
            aws_sdk_dynamodb::operation::query::QueryError,
            aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
            aws_sdk_dynamodb::operation::describe_table::DescribeTableError,
            aws_sdk_dynamodb::operation::create_table::CreateTableError,
            aws_sdk_dynamodb::operation::update_table::UpdateTableError,
            aws_sdk_dynamodb::operation::import_table::ImportTableError,
            aws_sdk_dynamodb::operation::describe_import::DescribeImportError,
            aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError,
            aws_sdk_dynamodbstreams::operation::describe_stream::DescribeStreamError,
            aws_sdk_dynamodbstreams::operation::get_shard_iterator::GetShardIteratorError,
            aws_sdk_s3::operation::put_object::PutObjectError,
            aws_sdk_s3::operation::delete_object::DeleteObjectError,
            aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Error,
        );
        Answer::default()
    }
}

/// The table a DynamoDB request names: its endpoint parameters carry it
/// (`ResourceArn`, a batch's `ResourceArnList`), for every operation on a
/// table.
fn table(cfg: &ConfigBag) -> Option<String> {
    let params = cfg
        .load::<EndpointResolverParams>()?
        .get::<aws_sdk_dynamodb::config::endpoint::Params>()?;
    match (params.resource_arn(), params.resource_arn_list()) {
        (Some(t), _) => Some(t.to_string()),
        (None, Some(list)) if !list.is_empty() => Some(list.join(",")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::operation::batch_write_item::{
        BatchWriteItemError, BatchWriteItemOutput,
    };
    use aws_sdk_dynamodb::operation::scan::ScanOutput;
    use aws_sdk_dynamodb::types::error::ProvisionedThroughputExceededException;
    use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, ThrottlingReason, WriteRequest};
    use aws_smithy_types::error::ErrorMetadata;

    use super::*;

    fn units(table: &str, n: f64) -> ConsumedCapacity {
        ConsumedCapacity::builder()
            .table_name(table)
            .capacity_units(n)
            .build()
    }

    #[test]
    fn an_answer_gives_its_capacity_and_a_batch_its_unprocessed_items() {
        let put = PutRequest::builder()
            .item("PK", AttributeValue::S("x".into()))
            .build()
            .unwrap();
        let left = vec![WriteRequest::builder().put_request(put).build(); 2];
        let out = BatchWriteItemOutput::builder()
            .consumed_capacity(units("t", 3.0))
            .consumed_capacity(units("u", 2.0))
            .unprocessed_items("t", left)
            .build();
        let a = Answer::of_output(&Output::erase(out));
        assert_eq!((a.consumed, a.unprocessed), (Some(5.0), Some(2)));
        assert_eq!(a.throttle_reason().as_deref(), Some("UnprocessedItems"));
        // All written, no capacity asked for: neither throttled nor a number.
        let a = Answer::of_output(&Output::erase(BatchWriteItemOutput::builder().build()));
        assert_eq!((a.consumed, a.unprocessed), (None, Some(0)));
        assert_eq!(a.throttle_reason(), None);
        let scan = ScanOutput::builder()
            .consumed_capacity(units("t", 1.5))
            .build();
        assert_eq!(Answer::of_output(&Output::erase(scan)).consumed, Some(1.5));
        // An answer of an operation the list does not know: nothing read from it.
        assert_eq!(Answer::of_output(&Output::erase(7_u8)), Answer::default());
    }

    fn throttle(reasons: &[&str]) -> OrchestratorError<Error> {
        let code = "ProvisionedThroughputExceededException";
        let mut e = ProvisionedThroughputExceededException::builder()
            .message("slow down")
            .meta(ErrorMetadata::builder().code(code).build());
        for r in reasons {
            e = e.throttling_reasons(ThrottlingReason::builder().reason(*r).build());
        }
        let e = BatchWriteItemError::ProvisionedThroughputExceededException(e.build());
        OrchestratorError::operation(Error::erase(e))
    }

    #[test]
    fn a_throttle_gives_dynamodbs_reasons_or_its_code() {
        let a = Answer::of_error(&throttle(&["TableWriteKeyRangeThroughputExceeded"]));
        assert_eq!(
            a.code.as_deref(),
            Some("ProvisionedThroughputExceededException")
        );
        assert_eq!(
            a.throttle_reason().as_deref(),
            Some("TableWriteKeyRangeThroughputExceeded")
        );
        let a = Answer::of_error(&throttle(&[]));
        assert_eq!(
            a.throttle_reason().as_deref(),
            Some("ProvisionedThroughputExceededException")
        );
        // Another error is not a throttle; a transport failure has no code.
        let other = BatchWriteItemError::generic(
            ErrorMetadata::builder().code("ValidationException").build(),
        );
        let a = Answer::of_error(&OrchestratorError::operation(Error::erase(other)));
        assert_eq!(
            (a.code.as_deref(), a.throttle_reason()),
            (Some("ValidationException"), None)
        );
        let timeout = OrchestratorError::<Error>::timeout("slow".into());
        assert_eq!(Answer::of_error(&timeout), Answer::default());
    }
}
