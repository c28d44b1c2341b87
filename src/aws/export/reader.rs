//! [`ExportReader`]: one export, opened, and its data files read.
//!
//! Opening does all the checking that can be done before any data is read
//! (the export's format and type, both manifests, that their counts agree
//! and that every data file's key can be found), so that a backfill that
//! opened an export does not fail on the manifest hours later.

use std::fmt;
use std::path::{Component, Path};

use super::decode::FileCtx;
use super::error::ExportError;
use super::find::{Chosen, find_export, normalize_export_id};
use super::manifest::{SummaryJson, parse_files_manifest};
use super::{
    DataFile, EXPORTS_DIR, ExportLocation, FILES_MANIFEST, FileSummary, LineSender, Loc, Manifest,
    S3Client, Store,
};

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
        let (store, start) = Store::open(loc, s3)?;
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
        let export_time_epoch_ms = summary.export_time_ms(&summary_file)?;

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
        let files = reader.data_files(&summary, &summary_file).await?;
        let manifest = Manifest {
            export_arn: summary.export_arn.clone().unwrap_or_default(),
            export_id: id,
            export_time: summary.export_time,
            export_time_epoch_ms,
            item_count: files.iter().map(|f| f.item_count).sum(),
            table_arn: summary.table_arn,
            files,
            other_exports: others,
        };
        Ok((reader, manifest))
    }

    /// The data files `manifest-files.json` lists, which must hold as many
    /// items as the summary (`summary_file`) says.
    async fn data_files(
        &self,
        summary: &SummaryJson,
        summary_file: &str,
    ) -> Result<Vec<DataFile>, ExportError> {
        let files_loc = match &summary.manifest_files_s3_key {
            Some(key) if !key.is_empty() => {
                self.resolve(key).map_err(|msg| ExportError::Manifest {
                    file: summary_file.to_string(),
                    line: None,
                    msg: format!("manifestFilesS3Key: {msg}"),
                })?
            }
            _ => self.dir.join(FILES_MANIFEST),
        };
        let files_name = self.store.show(&files_loc);
        let Some(bytes) = self.store.read_small(&files_loc).await? else {
            return Err(ExportError::NotFound {
                what: format!("{files_name} (the export's list of data files)"),
                endpoint: self.store.endpoint(),
            });
        };
        let files = parse_files_manifest(&files_name, &bytes, |key| self.resolve(key).map(drop))?;
        let listed: u64 = files.iter().map(|f| f.item_count).sum();
        if let Some(total) = summary.item_count
            && total != listed
        {
            return Err(ExportError::Manifest {
                file: summary_file.to_string(),
                line: None,
                msg: format!(
                    "itemCount is {total} but {files_name} lists {listed} items in {} files",
                    files.len()
                ),
            });
        }
        Ok(files)
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
        tx: LineSender,
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
        self.store.decode(loc, ctx, tx).await
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
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

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
