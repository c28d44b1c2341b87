//! The two manifests DynamoDB writes for an export, read into a
//! [`Manifest`], and the time format they use.
//!
//! `manifest-summary.json` says what the export is (its time, format, type
//! and where its file list is); `manifest-files.json` lists the data files
//! with their item counts and checksums. The counts and checksums are what
//! later proves a data file complete, so a manifest that does not add up is
//! refused here rather than trusted.

use serde::Deserialize;

use super::error::ExportError;
use super::{Loc, SUMMARY_FILE, Store};

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

/// `manifest-summary.json`: what the export is.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SummaryJson {
    pub(super) export_arn: Option<String>,
    pub(super) export_time: String,
    pub(super) table_arn: String,
    pub(super) item_count: Option<u64>,
    pub(super) output_format: Option<String>,
    export_type: Option<String>,
    pub(super) s3_prefix: Option<String>,
    pub(super) manifest_files_s3_key: Option<String>,
}

impl SummaryJson {
    pub(super) fn is_incremental(&self) -> bool {
        self.export_type.as_deref() == Some("INCREMENTAL_EXPORT")
    }

    /// `exportTime` in milliseconds since the epoch; `file` names the summary.
    pub(super) fn export_time_ms(&self, file: &str) -> Result<i64, ExportError> {
        parse_rfc3339_ms(&self.export_time).map_err(|msg| ExportError::Manifest {
            file: file.to_string(),
            line: None,
            msg: format!("exportTime `{}`: {msg}", self.export_time),
        })
    }
}

/// One line of `manifest-files.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilesLine {
    item_count: u64,
    md5_checksum: Option<String>,
    data_file_s3_key: String,
}

/// The data files `manifest-files.json` (named `name` in messages) lists.
/// `check_key` says why a `dataFileS3Key` cannot be read, if it cannot, so
/// that a bad key is reported with its line now, not when its file is read.
pub(super) fn parse_files_manifest(
    name: &str,
    bytes: &[u8],
    check_key: impl Fn(&str) -> Result<(), String>,
) -> Result<Vec<DataFile>, ExportError> {
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
        check_key(&entry.data_file_s3_key).map_err(|msg| {
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

/// The summary in export folder `dir`, and its name for messages; `None`
/// if there is none (not an export's folder, or the export has not finished).
pub(super) async fn read_summary(
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

/// Milliseconds since the epoch of an export's RFC 3339 time
/// (`2020-11-04T07:28:34.028Z`, `…+02:00`); digits past milliseconds are cut.
pub(crate) fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
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
}
