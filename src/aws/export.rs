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

use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest as _, Md5};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::aws::{Endpoint, error_chain};
use crate::core::value::Item;
use crate::state::itemfile::parse_line;

/// The folder DynamoDB puts every export in, under the export's prefix.
pub const EXPORTS_DIR: &str = "AWSDynamoDB";
pub const SUMMARY_FILE: &str = "manifest-summary.json";
pub const FILES_MANIFEST: &str = "manifest-files.json";
/// Chunks of compressed bytes in flight between the S3 body and the decoder.
const CHUNKS_IN_FLIGHT: usize = 8;

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
    pub fn is_s3_call(&self) -> bool {
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

/// One export, as its manifests describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub export_id: String,
    pub export_arn: String,
    /// The point in time of the data, exactly as in `manifest-summary.json`
    /// (RFC 3339, e.g. `2020-11-04T07:28:34.028Z`).
    pub export_time: String,
    /// `export_time` in milliseconds since the Unix epoch.
    pub export_time_epoch_ms: i64,
    /// Items in the whole export (the sum over `files`).
    pub item_count: u64,
    pub table_arn: String,
    /// The data files, in manifest order.
    pub files: Vec<DataFile>,
    /// Exports also found at the location but not chosen, newest first, as
    /// `id (exportTime[, what it is])`; empty when the location named one export.
    pub other_exports: Vec<String>,
}

impl Manifest {
    /// A sentence for the user when the export was chosen among several.
    pub fn selection_note(&self) -> Option<String> {
        if self.other_exports.is_empty() {
            return None;
        }
        Some(format!(
            "using the newest export, {} ({}); also found: {}",
            self.export_id,
            self.export_time,
            self.other_exports.join(", ")
        ))
    }
}

/// One data file of an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    /// `dataFileS3Key` as the manifest gives it: stable across copies of the
    /// export, so it is what checkpoints should record.
    pub key: String,
    pub item_count: u64,
    /// `md5Checksum`: base64 of the gzip file's MD5.
    pub md5: Option<String>,
}

/// One line of a data file.
#[derive(Debug)]
pub struct ExportLine {
    /// 1-based line number in the (decompressed) data file.
    pub line: u64,
    /// The item, or why the line is not one.
    pub item: Result<Item, String>,
}

/// What [`ExportReader::read_file`] found in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSummary {
    /// Lines in the whole file, skipped ones included.
    pub lines: u64,
    /// Lines sent as `Err` (skipped lines are not parsed, so not counted).
    pub malformed: u64,
}

/// Reads the files of one export. Cheap to share: `read_file` takes `&self`,
/// so several files may be read at once.
pub struct ExportReader {
    store: Store,
    /// The folder holding `AWSDynamoDB/` (used only for keys that do not
    /// contain `AWSDynamoDB/<exportId>/`).
    base: Loc,
    /// The export's own folder, `…/AWSDynamoDB/<exportId>`.
    dir: Loc,
    export_id: String,
    s3_prefix: String,
    verify_checksums: bool,
}

impl fmt::Debug for ExportReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportReader")
            .field("dir", &self.store.show(&self.dir))
            .field("export_id", &self.export_id)
            .finish_non_exhaustive()
    }
}

impl ExportReader {
    /// Finds the export at `loc` (the newest if there are several) and reads
    /// its manifests. `s3` is required for an S3 location.
    pub async fn open(
        loc: ExportLocation,
        s3: Option<S3Client>,
    ) -> Result<(ExportReader, Manifest), ExportError> {
        Self::open_export(loc, s3, None).await
    }

    /// As [`open`](Self::open), choosing the export by id
    /// (`01234567890123-a1b2c3d4`) or export ARN when `export_id` is given.
    pub async fn open_export(
        loc: ExportLocation,
        s3: Option<S3Client>,
        export_id: Option<&str>,
    ) -> Result<(ExportReader, Manifest), ExportError> {
        let (store, start) = match loc {
            ExportLocation::S3 { bucket, prefix } => {
                let Some(s3) = s3 else {
                    return Err(ExportError::NoS3Client {
                        location: ExportLocation::S3 { bucket, prefix }.to_string(),
                    });
                };
                (Store::S3 { s3, bucket }, Loc::S3(prefix))
            }
            ExportLocation::Local(path) => {
                if !path.is_dir() {
                    return Err(ExportError::NotFound {
                        what: format!("directory {}", path.display()),
                        endpoint: None,
                    });
                }
                (Store::Local, Loc::Local(path))
            }
        };
        let wanted = export_id.map(normalize_export_id).transpose()?;
        let chosen = find_export(&store, &start, wanted.as_deref()).await?;
        let Chosen {
            dir,
            id,
            summary,
            summary_file,
            others,
        } = chosen;

        if summary.output_format.as_deref().unwrap_or("DYNAMODB_JSON") == "ION" {
            return Err(ExportError::Ion { export_id: id });
        }
        if summary.is_incremental() {
            return Err(ExportError::Incremental { export_id: id });
        }
        let export_time_epoch_ms =
            parse_rfc3339_ms(&summary.export_time).map_err(|msg| ExportError::Manifest {
                file: summary_file.clone(),
                line: None,
                msg: format!("exportTime `{}`: {msg}", summary.export_time),
            })?;

        let parent = dir.parent();
        let base = if parent.name() == Some(EXPORTS_DIR) {
            parent.parent()
        } else {
            parent
        };
        let reader = ExportReader {
            store,
            base,
            dir,
            export_id: id.clone(),
            s3_prefix: summary.s3_prefix.clone().unwrap_or_default(),
            verify_checksums: true,
        };

        let files_loc = match &summary.manifest_files_s3_key {
            Some(key) if !key.is_empty() => {
                reader.resolve(key).map_err(|msg| ExportError::Manifest {
                    file: summary_file.clone(),
                    line: None,
                    msg: format!("manifestFilesS3Key: {msg}"),
                })?
            }
            _ => reader.dir.join(FILES_MANIFEST),
        };
        let files_name = reader.store.show(&files_loc);
        let Some(bytes) = reader.store.read_small(&files_loc).await? else {
            return Err(ExportError::NotFound {
                what: format!("{files_name} (the export's list of data files)"),
                endpoint: reader.store.endpoint(),
            });
        };
        let files = reader.parse_files_manifest(&files_name, &bytes)?;
        let listed: u64 = files.iter().map(|f| f.item_count).sum();
        if let Some(total) = summary.item_count
            && total != listed
        {
            return Err(ExportError::Manifest {
                file: summary_file,
                line: None,
                msg: format!(
                    "itemCount is {total} but {files_name} lists {listed} items in {} files",
                    files.len()
                ),
            });
        }

        let manifest = Manifest {
            export_arn: summary.export_arn.clone().unwrap_or_default(),
            export_id: id,
            export_time: summary.export_time,
            export_time_epoch_ms,
            item_count: listed,
            table_arn: summary.table_arn,
            files,
            other_exports: others,
        };
        Ok((reader, manifest))
    }

    /// Whether `read_file` checks each file's MD5 against the manifest
    /// (default: yes). The check costs little: the bytes are read anyway.
    pub fn verify_checksums(&mut self, on: bool) {
        self.verify_checksums = on;
    }

    /// The export's folder, `s3://…/AWSDynamoDB/<id>` or a local path.
    pub fn export_dir(&self) -> String {
        self.store.show(&self.dir)
    }

    /// Where `file` is read from: `s3://bucket/key` or a local path.
    pub fn locate(&self, file: &DataFile) -> String {
        match self.resolve(&file.key) {
            Ok(loc) => self.store.show(&loc),
            Err(_) => file.key.clone(),
        }
    }

    /// Streams one data file's items into `tx`, skipping the first
    /// `skip_lines` lines (to resume from a checkpoint: they are decompressed
    /// but not parsed or sent).
    ///
    /// Lines are sent in file order, each with its 1-based line number, as
    /// `Ok(item)` or `Err(why the line is not an item)`; a bad line does not
    /// stop the file. Memory is bounded: the compressed bytes come in chunks,
    /// and `tx`'s capacity bounds the lines in flight. So the receiver must
    /// be drained while this runs (`tokio::join!`, or spawn one side):
    /// awaiting this first with a full channel never finishes.
    ///
    /// Ends, after the last line was sent, with the file's
    /// [`FileSummary`], or an error. [`ExportError::CountMismatch`] and
    /// [`ExportError::Checksum`] are found only at the end of the file, when
    /// its lines have been sent already. A failure in the middle (network,
    /// corrupt gzip) is an error after the lines before it were sent: resume
    /// with `skip_lines` = the last line handled. A dropped receiver ends the
    /// read with [`ExportError::Closed`].
    pub async fn read_file(
        &self,
        file: &DataFile,
        skip_lines: u64,
        tx: mpsc::Sender<ExportLine>,
    ) -> Result<FileSummary, ExportError> {
        let loc = self
            .resolve(&file.key)
            .map_err(|msg| ExportError::Manifest {
                file: self.store.show(&self.dir.join(FILES_MANIFEST)),
                line: None,
                msg: format!("dataFileS3Key `{}`: {msg}", file.key),
            })?;
        let ctx = FileCtx {
            name: self.store.show(&loc),
            expected: file.item_count,
            skip: skip_lines,
            md5: file.md5.clone().filter(|_| self.verify_checksums),
        };
        match (&self.store, loc) {
            (Store::Local, Loc::Local(path)) => {
                let task = tokio::task::spawn_blocking(move || {
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
                    decode_lines(f, &ctx, &tx)
                });
                join_blocking(task).await
            }
            (Store::S3 { s3, bucket }, Loc::S3(key)) => {
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
                    decode_lines(ChunkReader::new(chunk_rx), &ctx, &tx)
                });
                let (pumped, decoded) = tokio::join!(pump, join_blocking(decode));
                // A broken download also breaks the decoding: report its cause.
                pumped?;
                decoded
            }
            _ => unreachable!("a reader's locations match its store"),
        }
    }

    /// Where a key of the manifest is in the folder being read.
    fn resolve(&self, key: &str) -> Result<Loc, String> {
        let marker = format!("{EXPORTS_DIR}/{}/", self.export_id);
        let found = key
            .match_indices(&marker)
            .find(|(i, _)| *i == 0 || key.as_bytes()[i - 1] == b'/')
            .map(|(i, _)| i);
        let (root, rel) = match found {
            Some(i) => (&self.dir, &key[i + marker.len()..]),
            None => {
                let prefix = self.s3_prefix.trim_matches('/');
                let rel = if prefix.is_empty() {
                    key
                } else {
                    key.strip_prefix(prefix)
                        .and_then(|r| r.strip_prefix('/'))
                        .unwrap_or(key)
                };
                (&self.base, rel)
            }
        };
        let rel = rel.trim_start_matches('/');
        if rel.is_empty() {
            return Err("names no file".into());
        }
        if let Loc::Local(_) = root
            && Path::new(rel)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err("leaves the export's directory".into());
        }
        Ok(root.join(rel))
    }

    fn parse_files_manifest(&self, name: &str, bytes: &[u8]) -> Result<Vec<DataFile>, ExportError> {
        let bad = |line: u64, msg: String| ExportError::Manifest {
            file: name.to_string(),
            line: Some(line),
            msg,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| ExportError::Manifest {
            file: name.to_string(),
            line: None,
            msg: format!("not UTF-8: {e}"),
        })?;
        let mut files = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i as u64 + 1;
            if line.trim().is_empty() {
                continue;
            }
            let entry: FilesLine = serde_json::from_str(line).map_err(|e| bad(n, e.to_string()))?;
            self.resolve(&entry.data_file_s3_key).map_err(|msg| {
                bad(
                    n,
                    format!("dataFileS3Key `{}`: {msg}", entry.data_file_s3_key),
                )
            })?;
            files.push(DataFile {
                key: entry.data_file_s3_key,
                item_count: entry.item_count,
                md5: entry.md5_checksum.filter(|s| !s.is_empty()),
            });
        }
        Ok(files)
    }
}

// ---- finding the export ----------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SummaryJson {
    export_arn: Option<String>,
    export_time: String,
    table_arn: String,
    item_count: Option<u64>,
    output_format: Option<String>,
    export_type: Option<String>,
    s3_prefix: Option<String>,
    manifest_files_s3_key: Option<String>,
}

impl SummaryJson {
    fn is_incremental(&self) -> bool {
        self.export_type.as_deref() == Some("INCREMENTAL_EXPORT")
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilesLine {
    item_count: u64,
    md5_checksum: Option<String>,
    data_file_s3_key: String,
}

struct Chosen {
    dir: Loc,
    id: String,
    summary: SummaryJson,
    summary_file: String,
    others: Vec<String>,
}

/// An export id, from an id or an export ARN (`…:table/T/export/<id>`).
fn normalize_export_id(s: &str) -> Result<String, ExportError> {
    let id = match s.rsplit_once("/export/") {
        Some((_, id)) => id,
        None => s,
    }
    .trim();
    if id.is_empty() || id.contains('/') || id == "." || id == ".." {
        return Err(ExportError::Location {
            input: s.to_string(),
            reason: "not an export id (like 01234567890123-a1b2c3d4) or export ARN".into(),
        });
    }
    Ok(id.to_string())
}

async fn read_summary(
    store: &Store,
    dir: &Loc,
) -> Result<Option<(SummaryJson, String)>, ExportError> {
    let loc = dir.join(SUMMARY_FILE);
    let name = store.show(&loc);
    let Some(bytes) = store.read_small(&loc).await? else {
        return Ok(None);
    };
    let summary = serde_json::from_slice(&bytes).map_err(|e| ExportError::Manifest {
        file: name.clone(),
        line: None,
        msg: e.to_string(),
    })?;
    Ok(Some((summary, name)))
}

async fn find_export(
    store: &Store,
    start: &Loc,
    wanted: Option<&str>,
) -> Result<Chosen, ExportError> {
    // The location is one export's folder.
    if let Some((summary, summary_file)) = read_summary(store, start).await? {
        let id = start.name().unwrap_or_default().to_string();
        if let Some(w) = wanted
            && w != id
        {
            return Err(ExportError::NotFound {
                what: format!(
                    "export {w}: {} is the folder of export {id}",
                    store.show(start)
                ),
                endpoint: store.endpoint(),
            });
        }
        return Ok(Chosen {
            dir: start.clone(),
            id,
            summary,
            summary_file,
            others: Vec::new(),
        });
    }
    let root = if start.name() == Some(EXPORTS_DIR) {
        start.clone()
    } else {
        start.join(EXPORTS_DIR)
    };
    if let Some(id) = wanted {
        let dir = root.join(id);
        return match read_summary(store, &dir).await? {
            Some((summary, summary_file)) => Ok(Chosen {
                dir,
                id: id.to_string(),
                summary,
                summary_file,
                others: Vec::new(),
            }),
            None => Err(ExportError::NotFound {
                what: format!(
                    "export {id}: no {} (missing, or the export has not finished)",
                    store.show(&dir.join(SUMMARY_FILE))
                ),
                endpoint: store.endpoint(),
            }),
        };
    }

    let ids = store.list_dirs(&root).await?;
    let mut found: Vec<(i64, Chosen)> = Vec::new();
    let mut unfinished: Vec<String> = Vec::new();
    for id in ids {
        let dir = root.join(&id);
        match read_summary(store, &dir).await? {
            None => unfinished.push(id),
            Some((summary, summary_file)) => {
                let ms = parse_rfc3339_ms(&summary.export_time).map_err(|msg| {
                    ExportError::Manifest {
                        file: summary_file.clone(),
                        line: None,
                        msg: format!("exportTime `{}`: {msg}", summary.export_time),
                    }
                })?;
                found.push((
                    ms,
                    Chosen {
                        dir,
                        id,
                        summary,
                        summary_file,
                        others: Vec::new(),
                    },
                ));
            }
        }
    }
    if found.is_empty() {
        let mut what = format!(
            "no finished export under {}: nothing matches {}/<exportId>/{SUMMARY_FILE}",
            store.show(start),
            store.show(&root)
        );
        if !unfinished.is_empty() {
            what.push_str(&format!(
                " (unfinished or failed: {})",
                unfinished.join(", ")
            ));
        }
        return Err(ExportError::NotFound {
            what,
            endpoint: store.endpoint(),
        });
    }
    // Newest first; among equal times, by id, for a stable choice.
    found.sort_by(|(ta, a), (tb, b)| tb.cmp(ta).then_with(|| b.id.cmp(&a.id)));
    // Only a full export can be used; if there is none, refuse the newest.
    let pick = found
        .iter()
        .position(|(_, c)| !c.summary.is_incremental())
        .unwrap_or(0);
    let (_, mut chosen) = found.remove(pick);
    chosen.others = found
        .iter()
        .map(|(_, c)| {
            let mut kind = Vec::new();
            if c.summary.is_incremental() {
                kind.push("incremental");
            }
            if c.summary.output_format.as_deref() == Some("ION") {
                kind.push("ION");
            }
            if kind.is_empty() {
                format!("{} ({})", c.id, c.summary.export_time)
            } else {
                format!("{} ({}, {})", c.id, c.summary.export_time, kind.join(", "))
            }
        })
        .chain(
            unfinished
                .iter()
                .map(|id| format!("{id} (unfinished or failed)")),
        )
        .collect();
    Ok(chosen)
}

// ---- storage: S3 or local ----------------------------------------------------

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
}

/// An SDK error as an [`ExportError`] naming the S3 endpoint: a missing
/// bucket or key is [`ExportError::NotFound`], no answer at all
/// [`ExportError::S3Unreachable`]; anything else keeps S3's code and message
/// (or the error's Display chain, never its Debug dump).
fn s3_error<E, R>(
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

// ---- decoding a data file ----------------------------------------------------

struct FileCtx {
    /// For messages: `s3://bucket/key` or a path.
    name: String,
    expected: u64,
    skip: u64,
    md5: Option<String>,
}

async fn join_blocking(
    task: tokio::task::JoinHandle<Result<FileSummary, ExportError>>,
) -> Result<FileSummary, ExportError> {
    match task.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ExportError::Io {
            path: String::new(),
            source: io::Error::other(e),
        }),
    }
}

/// Decompresses, splits and parses a data file on the current (blocking)
/// thread, sending each line after the first `ctx.skip` to `tx`.
fn decode_lines<R: Read>(
    raw: R,
    ctx: &FileCtx,
    tx: &mpsc::Sender<ExportLine>,
) -> Result<FileSummary, ExportError> {
    let io_err = |source: io::Error| ExportError::Io {
        path: ctx.name.clone(),
        source,
    };
    let mut compressed = BufReader::with_capacity(
        64 * 1024,
        HashingReader {
            inner: raw,
            md5: Md5::new(),
        },
    );
    let mut lines = 0u64;
    let mut malformed = 0u64;
    // DynamoDB writes an empty file for an empty partition: no gzip header.
    if !compressed.fill_buf().map_err(io_err)?.is_empty() {
        let mut text = BufReader::with_capacity(
            64 * 1024,
            flate2::bufread::MultiGzDecoder::new(&mut compressed),
        );
        let mut buf = Vec::with_capacity(4096);
        loop {
            buf.clear();
            if text.read_until(b'\n', &mut buf).map_err(io_err)? == 0 {
                break;
            }
            lines += 1;
            if lines <= ctx.skip {
                continue;
            }
            if buf.last() == Some(&b'\n') {
                buf.pop();
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
            }
            let item = match std::str::from_utf8(&buf) {
                Ok(s) if s.trim().is_empty() => Err("empty line".to_string()),
                Ok(s) => parse_export_line(s),
                Err(e) => Err(format!("not UTF-8: {e}")),
            };
            if item.is_err() {
                malformed += 1;
            }
            if tx.blocking_send(ExportLine { line: lines, item }).is_err() {
                return Err(ExportError::Closed {
                    file: ctx.name.clone(),
                    line: lines - 1,
                });
            }
        }
    }
    // Hash whatever the decoder left unread (normally nothing).
    io::copy(&mut compressed, &mut io::sink()).map_err(io_err)?;

    if let Some(expected) = &ctx.md5 {
        let digest = compressed.into_inner().md5.finalize();
        let b64 = BASE64.encode(digest.as_slice());
        if *expected != b64 && !expected.eq_ignore_ascii_case(&to_hex(digest.as_slice())) {
            return Err(ExportError::Checksum {
                file: ctx.name.clone(),
                expected: expected.clone(),
                got: b64,
            });
        }
    }
    if ctx.skip > lines {
        return Err(ExportError::SkipPastEnd {
            file: ctx.name.clone(),
            skip: ctx.skip,
            lines,
        });
    }
    if lines != ctx.expected {
        return Err(ExportError::CountMismatch {
            file: ctx.name.clone(),
            expected: ctx.expected,
            got: lines,
        });
    }
    Ok(FileSummary { lines, malformed })
}

#[derive(Deserialize)]
struct WrappedItem {
    #[serde(rename = "Item")]
    item: Item,
}

/// [`parse_line`], but a bad `{"Item":…}` line is explained as such:
/// `parse_line` falls back to reading a bare item and would report that
/// `Item` is not a type tag instead of what is wrong inside the item.
fn parse_export_line(s: &str) -> Result<Item, String> {
    match parse_line(s) {
        Err(_) if s.trim_start().starts_with("{\"Item\"") => serde_json::from_str::<WrappedItem>(s)
            .map(|w| w.item)
            .map_err(|e| e.to_string()),
        result => result,
    }
}

/// MD5 of everything read through it.
struct HashingReader<R> {
    inner: R,
    md5: Md5,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.md5.update(&buf[..n]);
        Ok(n)
    }
}

/// A blocking `Read` over chunks sent from an async task: the bridge from an
/// S3 `ByteStream` to the (synchronous) gzip decoder. End of input when the
/// sender is dropped; an `Err` chunk is a read error.
struct ChunkReader<B> {
    rx: mpsc::Receiver<Result<B, String>>,
    current: Option<B>,
    pos: usize,
}

impl<B> ChunkReader<B> {
    fn new(rx: mpsc::Receiver<Result<B, String>>) -> Self {
        ChunkReader {
            rx,
            current: None,
            pos: 0,
        }
    }
}

impl<B: AsRef<[u8]>> Read for ChunkReader<B> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some(chunk) = &self.current {
                let rest = &chunk.as_ref()[self.pos..];
                if !rest.is_empty() {
                    let n = rest.len().min(buf.len());
                    buf[..n].copy_from_slice(&rest[..n]);
                    self.pos += n;
                    return Ok(n);
                }
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.current = Some(chunk);
                    self.pos = 0;
                }
                Some(Err(msg)) => return Err(io::Error::other(msg)),
                None => return Ok(0),
            }
        }
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---- time ----------------------------------------------------------------

/// Milliseconds since the epoch of an export's RFC 3339 time
/// (`2020-11-04T07:28:34.028Z`, `…+02:00`); digits past milliseconds are cut.
pub fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("`{s}` is not an RFC 3339 time: {e}"))
}

/// `2020-11-04T07:28:34.028Z` (DynamoDB's manifest format) for milliseconds
/// since the epoch.
pub fn format_rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
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

    #[test]
    fn export_ids_from_ids_and_arns() {
        assert_eq!(normalize_export_id("0123-ab").unwrap(), "0123-ab");
        assert_eq!(
            normalize_export_id("arn:aws:dynamodb:us-east-1:1:table/T/export/0123-ab").unwrap(),
            "0123-ab"
        );
        assert!(normalize_export_id("a/b").is_err());
        assert!(normalize_export_id("..").is_err());
    }

    #[test]
    fn rfc3339_round_trip() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(
            parse_rfc3339_ms("2020-11-04T07:28:34.028Z").unwrap(),
            1_604_474_914_028
        );
        assert_eq!(
            parse_rfc3339_ms("2020-11-04T09:28:34.0289Z").unwrap()
                - parse_rfc3339_ms("2020-11-04T11:28:34.028+02:00").unwrap(),
            0
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T23:59:59.5Z").unwrap() % 1000,
            500
        );
        for ms in [
            0,
            1_604_474_914_028,
            951_782_400_000,
            -86_400_001,
            4_102_444_800_000,
        ] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)).unwrap(), ms);
        }
        for bad in [
            "2020-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2020-11-04",
            "2020-11-04T07:28:34",
            "2020-11-04T07:28:34.Z",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad}");
        }
    }

    fn reader(s3_prefix: &str) -> ExportReader {
        ExportReader {
            store: Store::Local,
            base: Loc::Local(PathBuf::from("/x")),
            dir: Loc::Local(PathBuf::from("/x/AWSDynamoDB/01-ab")),
            export_id: "01-ab".into(),
            s3_prefix: s3_prefix.into(),
            verify_checksums: true,
        }
    }

    #[test]
    fn data_keys_are_rerooted_on_the_folder_read() {
        let r = reader("exports/daily");
        let at = |k: &str| r.resolve(k).map(|l| r.store.show(&l));
        assert_eq!(
            at("exports/daily/AWSDynamoDB/01-ab/data/f.json.gz").unwrap(),
            "/x/AWSDynamoDB/01-ab/data/f.json.gz"
        );
        assert_eq!(
            at("AWSDynamoDB/01-ab/data/f.json.gz").unwrap(),
            "/x/AWSDynamoDB/01-ab/data/f.json.gz"
        );
        // Not the export's folder: strip s3Prefix, relative to the base.
        assert_eq!(at("exports/daily/other/f.gz").unwrap(), "/x/other/f.gz");
        assert!(at("exports/daily/../../etc/passwd").is_err());
        assert!(at("AWSDynamoDB/01-ab/").is_err());
        // A look-alike folder name does not match.
        assert_eq!(
            at("xAWSDynamoDB/01-ab/data/f.gz").unwrap(),
            "/x/xAWSDynamoDB/01-ab/data/f.gz"
        );
    }
}
