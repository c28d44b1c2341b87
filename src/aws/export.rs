//! Reading a DynamoDB table export (`ExportTableToPointInTime`) from S3 or
//! from a local copy.
//!
//! Why an export instead of a Scan: an export reads the table's
//! point-in-time-recovery backup, so it consumes no read capacity on the live
//! table, and every item in it is as of one instant, `exportTime`, so the copy
//! is consistent. Changes made after that instant are not in the export: the
//! stream tail that replays them must start at or before
//! [`Manifest::export_time_epoch_ms`] (and DynamoDB Streams keeps records for
//! 24 hours only, so the export must be younger than that when the tail
//! starts). `exportTime` is the point in time of the data, not when the
//! export job ran (`startTime`): they differ for an export of a past time.
//!
//! # Layout
//!
//! What DynamoDB writes under the prefix given to the export:
//!
//! ```text
//! <prefix>/AWSDynamoDB/<exportId>/manifest-summary.json   one JSON object
//! <prefix>/AWSDynamoDB/<exportId>/manifest-files.json     one JSON object per line
//! <prefix>/AWSDynamoDB/<exportId>/data/<name>.json.gz     gzip, one {"Item":{…}} per line
//! <prefix>/AWSDynamoDB/<exportId>/_started, *.checksum    ignored
//! ```
//!
//! [`ExportLocation`] is `s3://bucket/prefix` or a local directory holding a
//! downloaded export with the same relative layout. Either may name the
//! prefix given to the export (then the newest completed export under it is
//! used, see [`Manifest::selection_note`]), its `AWSDynamoDB` folder, or one
//! export's folder. [`ExportReader::open_export`] also takes an export id (or
//! export ARN) to choose one.
//!
//! `dataFileS3Key` in `manifest-files.json` is a full key of the bucket the
//! export was written to. It is re-rooted on the folder actually read (the
//! part from `AWSDynamoDB/<exportId>/` on is kept; failing that, the
//! manifest's `s3Prefix` is stripped), so an export copied to another bucket,
//! prefix or directory reads the same.
//!
//! Only full exports in DynamoDB JSON are read: ION exports and incremental
//! exports are refused with an error that says what to do.
//!
//! # Reading
//!
//! [`ExportReader::read_file`] streams one data file: bytes (an S3
//! `ByteStream`, or a local file) → gzip decoder → lines → items, sent through
//! a bounded Tokio channel that the caller provides, so memory stays bounded
//! whatever the file's size. Decoding and parsing run on a blocking thread.
//! At the end of the file the number of lines is checked against the
//! manifest's `itemCount`, and the gzip file's MD5 against `md5Checksum`.
//!
//! # S3 clients for local servers
//!
//! The caller builds the S3 client and gives it as an [`S3Client`], with the
//! endpoint it sends to, which S3 errors name (rekey's comes from
//! [`Clients`](crate::aws::Clients)). A local S3 server (moto, MinIO) needs
//! path-style addressing, as bucket-named hosts do not resolve on 127.0.0.1:
//!
//! ```no_run
//! # async fn client(endpoint: &str) -> aws_sdk_s3::Client {
//! let sdk_config = aws_config::defaults(aws_config::BehaviorVersion::latest())
//!     .http_client(rekey::aws::https_client())
//!     .endpoint_url(endpoint) // e.g. "http://127.0.0.1:PORT"
//!     .region(aws_config::Region::new("us-east-1"))
//!     .credentials_provider(aws_sdk_s3::config::Credentials::new(
//!         "test", "test", None, None, "local",
//!     ))
//!     .load()
//!     .await;
//! let s3_config = aws_sdk_s3::config::Builder::from(&sdk_config)
//!     .force_path_style(true)
//!     .build();
//! aws_sdk_s3::Client::from_conf(s3_config)
//! # }
//! ```
//!
//! # Where things are
//!
//! `find` chooses the export at a location, `manifest` reads its manifests,
//! `decode` turns a data file into items and checks it whole, `reader` ties
//! them together as [`ExportReader`], and `error` says what went wrong.
//!
//! This file reads the files themselves, from S3 or a local directory. That
//! code is here, in `export.rs` rather than in an `export/mod.rs` or a
//! submodule, because `ops::iam` names the file each S3 action it grants is
//! called in (`src/aws/export.rs` for `s3:GetObject` and `s3:ListBucket`), and
//! its tests read that file to check the claim: every S3 call that reads an
//! export stays in this one file (the writes of `--via-import` are in
//! `import.rs`).

mod decode;
mod error;
mod find;
mod manifest;
mod reader;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use aws_sdk_s3::error::ProvideErrorMetadata;
use tokio::sync::mpsc;

use crate::aws::{Endpoint, error_chain};

use decode::{ChunkReader, FileCtx, decode_lines, join_blocking};
use error::s3_error;

pub use decode::{ExportLine, FileSummary, LineReceiver, LineSender, lines_channel, to_hex};
pub use error::ExportError;
pub use manifest::{DataFile, Manifest, format_rfc3339_ms};
pub use reader::ExportReader;

/// The folder DynamoDB puts every export in, under the export's prefix.
pub const EXPORTS_DIR: &str = "AWSDynamoDB";
pub const SUMMARY_FILE: &str = "manifest-summary.json";
pub const FILES_MANIFEST: &str = "manifest-files.json";

/// An S3 client and the endpoint it sends requests to, so that an S3 error
/// can say which endpoint failed and where it came from.
#[derive(Debug, Clone)]
pub struct S3Client {
    pub client: aws_sdk_s3::Client,
    pub endpoint: Arc<Endpoint>,
}

/// Where an export is: `s3://bucket/prefix` or a local directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportLocation {
    /// `prefix` has no leading or trailing `/`; empty for the bucket's root.
    S3 {
        bucket: String,
        prefix: String,
    },
    Local(PathBuf),
}

impl ExportLocation {
    /// `s3://bucket[/prefix]`, else a local directory. Other URL schemes are
    /// refused rather than taken for directory names.
    pub fn parse(s: &str) -> Result<Self, ExportError> {
        let bad = |reason: &str| ExportError::Location {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if let Some((scheme, rest)) = t.split_once("://") {
            if !scheme.eq_ignore_ascii_case("s3") {
                return Err(bad("only s3:// URLs and local directories are supported"));
            }
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket name after s3://"));
            }
            let prefix = prefix.trim_matches('/');
            if prefix.contains("//") {
                return Err(bad("empty path segment (`//`) in the prefix"));
            }
            return Ok(ExportLocation::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        Ok(ExportLocation::Local(PathBuf::from(t)))
    }
}

impl fmt::Display for ExportLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportLocation::S3 { bucket, prefix } if prefix.is_empty() => {
                write!(f, "s3://{bucket}")
            }
            ExportLocation::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            ExportLocation::Local(p) => write!(f, "{}", p.display()),
        }
    }
}

// ---- storage: S3 or local ---------------------------------------------------
//
// Everything else in this module works on `Loc`s and asks the `Store` to
// read, list or stream them, so finding an export, reading its manifests and
// checking its data files are written once for both kinds of location.

/// Chunks of compressed bytes in flight between the S3 body and the decoder.
const CHUNKS_IN_FLIGHT: usize = 8;

/// Where the files are read from.
enum Store {
    S3 { s3: S3Client, bucket: String },
    Local,
}

/// A file or folder: an S3 key (no leading or trailing `/`; empty for the
/// bucket's root) or a local path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Loc {
    S3(String),
    Local(PathBuf),
}

impl Loc {
    fn join(&self, rel: &str) -> Loc {
        match self {
            Loc::S3(k) if k.is_empty() => Loc::S3(rel.to_string()),
            Loc::S3(k) => Loc::S3(format!("{k}/{rel}")),
            Loc::Local(p) => Loc::Local(p.join(rel)),
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            Loc::S3(k) if k.is_empty() => None,
            Loc::S3(k) => k.rsplit('/').next(),
            Loc::Local(p) => p.file_name().and_then(|n| n.to_str()),
        }
    }

    fn parent(&self) -> Loc {
        match self {
            Loc::S3(k) => Loc::S3(k.rsplit_once('/').map(|(p, _)| p).unwrap_or("").to_string()),
            Loc::Local(p) => Loc::Local(match p.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
                _ => p.join(".."),
            }),
        }
    }
}

impl Store {
    /// The store `loc` is in, and where in it `loc` points. `s3` is required
    /// for an S3 location; a local one must be a directory.
    fn open(loc: ExportLocation, s3: Option<S3Client>) -> Result<(Store, Loc), ExportError> {
        match loc {
            ExportLocation::S3 { bucket, prefix } => {
                let Some(s3) = s3 else {
                    return Err(ExportError::NoS3Client {
                        location: ExportLocation::S3 { bucket, prefix }.to_string(),
                    });
                };
                Ok((Store::S3 { s3, bucket }, Loc::S3(prefix)))
            }
            ExportLocation::Local(path) => {
                if !path.is_dir() {
                    return Err(ExportError::NotFound {
                        what: format!("directory {}", path.display()),
                        endpoint: None,
                    });
                }
                Ok((Store::Local, Loc::Local(path)))
            }
        }
    }

    /// S3's endpoint, for messages about what is not there.
    fn endpoint(&self) -> Option<Arc<Endpoint>> {
        match self {
            Store::S3 { s3, .. } => Some(s3.endpoint.clone()),
            Store::Local => None,
        }
    }

    fn show(&self, loc: &Loc) -> String {
        match (self, loc) {
            (Store::S3 { bucket, .. }, Loc::S3(k)) => format!("s3://{bucket}/{k}"),
            (_, Loc::Local(p)) => p.display().to_string(),
            (Store::Local, Loc::S3(k)) => k.clone(),
        }
    }

    /// A whole (small) file; `None` if it does not exist.
    async fn read_small(&self, loc: &Loc) -> Result<Option<Vec<u8>>, ExportError> {
        match (self, loc) {
            (Store::S3 { s3, bucket }, Loc::S3(key)) => {
                let resp = match s3.client.get_object().bucket(bucket).key(key).send().await {
                    Ok(resp) => resp,
                    Err(e) => {
                        if e.code() == Some("NoSuchKey") {
                            return Ok(None);
                        }
                        return Err(s3_error(s3, "GetObject", bucket, key, e));
                    }
                };
                let data = resp.body.collect().await.map_err(|e| ExportError::S3 {
                    action: "GetObject (reading the body)",
                    bucket: bucket.clone(),
                    key: key.clone(),
                    detail: error_chain(&e),
                    endpoint: s3.endpoint.clone(),
                })?;
                Ok(Some(data.into_bytes().to_vec()))
            }
            (_, Loc::Local(path)) => match std::fs::read(path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(ExportError::Io {
                    path: path.display().to_string(),
                    source,
                }),
            },
            (Store::Local, Loc::S3(_)) => unreachable!("a local store has local paths"),
        }
    }

    /// Names of the sub-folders of `loc`; none if it does not exist.
    async fn list_dirs(&self, loc: &Loc) -> Result<Vec<String>, ExportError> {
        match (self, loc) {
            (Store::S3 { s3, bucket }, Loc::S3(key)) => {
                let prefix = if key.is_empty() {
                    String::new()
                } else {
                    format!("{key}/")
                };
                let mut names = Vec::new();
                let mut pages = s3
                    .client
                    .list_objects_v2()
                    .bucket(bucket)
                    .prefix(&prefix)
                    .delimiter("/")
                    .into_paginator()
                    .send();
                while let Some(page) = pages.next().await {
                    let page =
                        page.map_err(|e| s3_error(s3, "ListObjectsV2", bucket, &prefix, e))?;
                    for cp in page.common_prefixes() {
                        if let Some(name) = cp
                            .prefix()
                            .and_then(|p| p.strip_prefix(prefix.as_str()))
                            .map(|p| p.trim_end_matches('/'))
                            .filter(|p| !p.is_empty())
                        {
                            names.push(name.to_string());
                        }
                    }
                }
                Ok(names)
            }
            (_, Loc::Local(path)) => {
                let entries = match std::fs::read_dir(path) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(source) => {
                        return Err(ExportError::Io {
                            path: path.display().to_string(),
                            source,
                        });
                    }
                };
                let mut names: Vec<String> = entries
                    .filter_map(Result::ok)
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect();
                names.sort();
                Ok(names)
            }
            (Store::Local, Loc::S3(_)) => unreachable!("a local store has local paths"),
        }
    }

    /// Streams data file `loc` through [`decode_lines`] into `tx`: the bytes
    /// are read on this task, decoded on a blocking thread.
    async fn decode(
        &self,
        loc: Loc,
        ctx: FileCtx,
        tx: LineSender,
    ) -> Result<FileSummary, ExportError> {
        match (self, loc) {
            (Store::Local, Loc::Local(path)) => decode_local(path, ctx, tx).await,
            (Store::S3 { s3, bucket }, Loc::S3(key)) => {
                decode_s3(S3Object { s3, bucket, key }, ctx, tx).await
            }
            _ => unreachable!("a reader's locations match its store"),
        }
    }
}

/// One object of a bucket, with the client that reads it.
struct S3Object<'a> {
    s3: &'a S3Client,
    bucket: &'a String,
    key: String,
}

/// A local file is opened and read on the decoder's blocking thread.
async fn decode_local(
    path: PathBuf,
    ctx: FileCtx,
    tx: LineSender,
) -> Result<FileSummary, ExportError> {
    let task = tokio::task::spawn_blocking(move || {
        let mut tx = tx;
        let f = std::fs::File::open(&path).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                ExportError::NotFound {
                    what: format!("data file {}", ctx.name),
                    endpoint: None,
                }
            } else {
                ExportError::Io {
                    path: ctx.name.clone(),
                    source,
                }
            }
        })?;
        decode_lines(f, &ctx, &mut tx)
    });
    join_blocking(task).await
}

/// The object's body comes in chunks on this task and goes, through a
/// bounded channel, to the decoder's blocking thread as a [`ChunkReader`].
async fn decode_s3(
    obj: S3Object<'_>,
    ctx: FileCtx,
    tx: LineSender,
) -> Result<FileSummary, ExportError> {
    let S3Object { s3, bucket, key } = obj;
    let resp = s3
        .client
        .get_object()
        .bucket(bucket)
        .key(&key)
        .send()
        .await
        .map_err(|e| s3_error(s3, "GetObject", bucket, &key, e))?;
    let mut body = resp.body;
    let (chunk_tx, chunk_rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let pump = async move {
        loop {
            match body.next().await {
                None => return Ok(()),
                Some(Ok(chunk)) => {
                    if chunk_tx.send(Ok(chunk)).await.is_err() {
                        // The decoder stopped; it has the reason.
                        return Ok(());
                    }
                }
                Some(Err(e)) => {
                    let detail = error_chain(&e);
                    let _ = chunk_tx.send(Err(detail.clone())).await;
                    return Err(ExportError::S3 {
                        action: "GetObject (reading the body)",
                        bucket: bucket.clone(),
                        key: key.clone(),
                        detail,
                        endpoint: s3.endpoint.clone(),
                    });
                }
            }
        }
    };
    let decode = tokio::task::spawn_blocking(move || {
        let mut tx = tx;
        decode_lines(ChunkReader::new(chunk_rx), &ctx, &mut tx)
    });
    let (pumped, decoded) = tokio::join!(pump, join_blocking(decode));
    // A broken download also breaks the decoding: report its cause.
    pumped?;
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        assert_eq!(
            ExportLocation::parse("s3://b/p/q/").unwrap(),
            ExportLocation::S3 {
                bucket: "b".into(),
                prefix: "p/q".into()
            }
        );
        assert_eq!(
            ExportLocation::parse("s3://b").unwrap(),
            ExportLocation::S3 {
                bucket: "b".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            ExportLocation::parse("S3://b/").unwrap().to_string(),
            "s3://b"
        );
        assert_eq!(
            ExportLocation::parse("./exports").unwrap(),
            ExportLocation::Local(PathBuf::from("./exports"))
        );
        for bad in ["", "s3://", "s3:///p", "https://x/y", "s3://b/a//c"] {
            let e = ExportLocation::parse(bad).unwrap_err();
            assert!(matches!(e, ExportError::Location { .. }), "{bad}: {e}");
        }
    }
}
