//! Why an export could not be read, in words an operator can act on.
//!
//! File names in messages are what the operator can look at
//! (`s3://bucket/key` or a local path), and an S3 failure names the endpoint
//! the request went to and where that endpoint came from (`--endpoint-url`,
//! an environment variable, the profile), since that is what a person can
//! check and fix. SDK errors become these here and never leave as the SDK's
//! `Debug` dump.

use std::fmt;
use std::io;
use std::sync::Arc;

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use crate::aws::{Endpoint, error_chain};

use super::S3Client;

/// Why an export could not be read. File names in messages are
/// `s3://bucket/key` or local paths.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("invalid export location `{input}`: {reason}")]
    Location { input: String, reason: String },
    #[error("{location} is on S3 but no S3 client was given")]
    NoS3Client { location: String },
    #[error(
        "export {export_id} is in ION format; ION exports are not supported: \
         export again with --export-format DYNAMODB_JSON"
    )]
    Ion { export_id: String },
    #[error(
        "export {export_id} is an incremental export (changes, not the table): \
         rekey needs a full export; export again with --export-type FULL_EXPORT"
    )]
    Incremental { export_id: String },
    /// `endpoint` is S3's when the thing was looked for on S3.
    #[error("not found: {what}{}", on_s3(endpoint))]
    NotFound {
        what: String,
        endpoint: Option<Arc<Endpoint>>,
    },
    /// A manifest that cannot be used; `line` is 1-based, for JSON-lines files.
    #[error("{file}{}: {msg}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Manifest {
        file: String,
        line: Option<u64>,
        msg: String,
    },
    /// The data file does not have as many lines as the manifest says: the
    /// export (or its copy) is incomplete or altered. The lines read before
    /// this was found have been sent already.
    #[error(
        "{file}: the manifest says {expected} items, the file has {got} lines; \
         the export is incomplete or was altered"
    )]
    CountMismatch {
        file: String,
        expected: u64,
        got: u64,
    },
    /// The data file's MD5 differs from the manifest's `md5Checksum`.
    #[error(
        "{file}: MD5 is {got}, the manifest says {expected}; the file is corrupt or was altered"
    )]
    Checksum {
        file: String,
        expected: String,
        got: String,
    },
    /// `skip_lines` (from a checkpoint) is past the end of the file.
    #[error("{file}: asked to skip {skip} lines but the file has only {lines}")]
    SkipPastEnd { file: String, skip: u64, lines: u64 },
    /// The receiver of the lines was dropped before the end of the file.
    #[error("{file}: reading stopped after line {line}: the receiver was dropped")]
    Closed { file: String, line: u64 },
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    /// The request never got an answer: the network, or the endpoint.
    #[error("cannot reach S3 at {endpoint} ({action} of s3://{bucket}/{key}): {detail}")]
    S3Unreachable {
        action: &'static str,
        bucket: String,
        key: String,
        detail: String,
        endpoint: Arc<Endpoint>,
    },
    #[error("S3 {action} of s3://{bucket}/{key} failed: {detail} — S3 at {endpoint}")]
    S3 {
        action: &'static str,
        bucket: String,
        key: String,
        detail: String,
        endpoint: Arc<Endpoint>,
    },
}

impl ExportError {
    /// An S3 call failed (as opposed to the export's content, or a local
    /// file): the AWS exit code applies.
    pub(crate) fn is_s3_call(&self) -> bool {
        matches!(
            self,
            ExportError::S3 { .. } | ExportError::S3Unreachable { .. }
        )
    }
}

fn on_s3(endpoint: &Option<Arc<Endpoint>>) -> String {
    match endpoint {
        Some(e) => format!(" — {} at {e}", e.service),
        None => String::new(),
    }
}

/// An SDK error as an [`ExportError`] naming the S3 endpoint: a missing
/// bucket or key is [`ExportError::NotFound`], no answer at all
/// [`ExportError::S3Unreachable`]; anything else keeps S3's code and message
/// (or the error's Display chain, never its Debug dump).
pub(super) fn s3_error<E, R>(
    s3: &S3Client,
    action: &'static str,
    bucket: &str,
    key: &str,
    err: SdkError<E, R>,
) -> ExportError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let endpoint = s3.endpoint.clone();
    let (bucket, key) = (bucket.to_string(), key.to_string());
    if let SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) = &err {
        return ExportError::S3Unreachable {
            action,
            bucket,
            key,
            detail: error_chain(&err),
            endpoint,
        };
    }
    let what = match err.code() {
        Some("NoSuchBucket") => format!("S3 bucket {bucket}"),
        Some("NoSuchKey") => format!("s3://{bucket}/{key}"),
        code => {
            let detail = match (code, err.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => code.to_string(),
                (None, _) => error_chain(&err),
            };
            return ExportError::S3 {
                action,
                bucket,
                key,
                detail,
                endpoint,
            };
        }
    };
    ExportError::NotFound {
        what,
        endpoint: Some(endpoint),
    }
}
