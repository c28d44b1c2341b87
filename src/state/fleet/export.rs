//! A fleet's backfill from an S3 export (`rekey worker --from-export`): one
//! unit per data file of the export instead of one per Scan segment.
//!
//! Why files: a data file is the export's own piece of work — DynamoDB
//! writes several, each read from its start, with a line count and an MD5
//! in the manifest that prove it whole — so it is the smallest piece a
//! worker can take over, as a segment is for a Scan. A file's unit resumes
//! after the lines its holder committed (`Checkpoint::Lines`), the position
//! the single-machine export backfill checkpoints.
//!
//! `META` records which export the migration reads (the location every
//! worker must be started with, and the export's id and time): a location
//! may hold several exports (the newest is chosen), and a worker that came
//! later must not read a newer one, nor a worker with another source (or
//! none: a Scan) join at all — two sources' items would mix in the target,
//! as two plans' would. Unit `n` records its file's key (`file`), so a
//! joining worker maps units to files by key, not by the manifest's order.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use crate::aws::export::DataFile;
use crate::core::plan::Plan;
use crate::core::value::Item;

use super::{Fleet, FleetError, Meta, Unit, inum, n, num, s, text};

/// The export a migration's backfill reads, as `META` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportSource {
    /// `--from-export`, normalised (`s3://bucket/prefix` or a directory):
    /// what every worker of the migration is started with.
    pub location: String,
    pub export_id: String,
    /// The export's point in time (epoch ms): the tail must capture the
    /// stream from before it.
    pub export_time_ms: i64,
    /// Its data files: the migration's units.
    pub files: u32,
}

impl ExportSource {
    pub(super) fn write(&self, meta: &mut Item) {
        meta.insert("export".into(), s(&self.location));
        meta.insert("export_id".into(), s(&self.export_id));
        meta.insert("export_time_ms".into(), n(self.export_time_ms));
        meta.insert("files".into(), n(self.files));
    }

    pub(super) fn read(it: &Item) -> Option<ExportSource> {
        Some(ExportSource {
            location: text(it, "export")?.to_string(),
            export_id: text(it, "export_id").unwrap_or_default().to_string(),
            export_time_ms: inum(it, "export_time_ms"),
            files: num(it, "files") as u32,
        })
    }

    /// `export ID at LOCATION`, for people.
    pub fn describe(&self) -> String {
        format!("export {} at {}", self.export_id, self.location)
    }
}

/// What a worker was started to read: `--from-export` (normalised) and,
/// once opened, the export's id; None: the source table by Scan.
pub type Given<'a> = Option<(&'a str, Option<&'a str>)>;

/// Refuses a worker whose source is not the migration's (`stored`, from
/// `META`; None: a Scan), as a worker with another plan is refused.
pub fn check_source(
    migration: &str,
    stored: Option<&ExportSource>,
    given: Given<'_>,
) -> Result<(), FleetError> {
    let same = match (stored, given) {
        (None, None) => true,
        (Some(s), Some((location, id))) => {
            s.location == location && id.is_none_or(|id| id == s.export_id)
        }
        _ => false,
    };
    if same {
        return Ok(());
    }
    let stored = match stored {
        None => "the source table by Scan (its workers run without --from-export)".to_string(),
        Some(s) => format!(
            "{} (its workers run with --from-export {})",
            s.describe(),
            s.location
        ),
    };
    let given = match given {
        None => "the source table by Scan (no --from-export)".to_string(),
        Some((location, None)) => format!("--from-export {location}"),
        Some((location, Some(id))) => format!("export {id} at {location}"),
    };
    Err(FleetError::SourceChanged {
        migration: migration.to_string(),
        stored,
        given,
    })
}

/// The units of an export, from its manifest: unit `n` reads data file
/// `n` in manifest order, named by its key. Refused: no file at all (a
/// fleet with no unit would never be done), or a key listed twice.
pub fn file_units(files: &[DataFile]) -> Result<Vec<String>, String> {
    if files.is_empty() {
        return Err(
            "the export lists no data file (an empty table): there is nothing for a \
                    fleet to share; run rekey backfill --from-export on one machine"
                .into(),
        );
    }
    if u32::try_from(files.len()).is_err() {
        return Err(format!("{} data files: too many units", files.len()));
    }
    let mut seen = BTreeSet::new();
    for f in files {
        if !seen.insert(f.key.as_str()) {
            return Err(format!(
                "data file {} is listed twice in the manifest",
                f.key
            ));
        }
    }
    Ok(files.iter().map(|f| f.key.clone()).collect())
}

/// Each unit's data file, by the key the unit records. Refused: a unit with
/// no file (a Scan segment's), or a file the manifest read does not list.
pub fn unit_files(units: &[Unit], files: &[DataFile]) -> Result<HashMap<u32, DataFile>, String> {
    let by_key: HashMap<&str, &DataFile> = files.iter().map(|f| (f.key.as_str(), f)).collect();
    let mut out = HashMap::with_capacity(units.len());
    for u in units {
        let Some(key) = u.file.as_deref() else {
            return Err(format!(
                "unit {} reads no data file (a Scan segment's unit)",
                u.n
            ));
        };
        let Some(f) = by_key.get(key) else {
            return Err(format!(
                "unit {} reads data file {key}, which the export's manifest does not list",
                u.n
            ));
        };
        out.insert(u.n, (*f).clone());
    }
    if out.len() != files.len() {
        return Err(format!(
            "{} units for the export's {} data files",
            out.len(),
            files.len()
        ));
    }
    Ok(out)
}

impl Fleet {
    /// The backfill's join: the migration as [`Fleet::join`] opens it
    /// (created with `export` when this worker is the first), a worker with
    /// another source refused ([`check_source`]), then every unit item made
    /// sure of — the Scan's segments, or one per data file of the export
    /// (`files`, from [`file_units`]). Returns the migration's record.
    pub async fn join_backfill(
        &self,
        plan: &Plan,
        segments: u32,
        export: Option<(&ExportSource, &[String])>,
    ) -> Result<Meta, FleetError> {
        let source = export.map(|(e, _)| e);
        let stored = self.open_migration(plan, segments, source).await?;
        let given = source.map(|e| (e.location.as_str(), Some(e.export_id.as_str())));
        check_source(&self.at.migration, stored.export.as_ref(), given)?;
        match export {
            None => self.create_units(stored.segments).await?,
            Some((_, files)) => {
                for (u, key) in files.iter().enumerate() {
                    self.create_unit(u as u32, Some(key)).await?;
                }
            }
        }
        Ok(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::fleet::{Checkpoint, Counters};

    fn file(key: &str) -> DataFile {
        DataFile {
            key: key.into(),
            item_count: 3,
            md5: None,
        }
    }

    fn export(location: &str, id: &str) -> ExportSource {
        ExportSource {
            location: location.into(),
            export_id: id.into(),
            export_time_ms: 1,
            files: 2,
        }
    }

    fn unit(n: u32, file: Option<&str>) -> Unit {
        Unit {
            n,
            file: file.map(str::to_string),
            owner: None,
            lease: 0,
            beat: 0,
            checkpoint: Checkpoint::Beginning,
            page: 0,
            counts: Counters::default(),
            done: false,
        }
    }

    #[test]
    fn a_manifest_gives_one_unit_per_data_file_in_its_order() {
        let files = [
            file("AWSDynamoDB/x/data/b.json.gz"),
            file("AWSDynamoDB/x/data/a.json.gz"),
        ];
        assert_eq!(
            file_units(&files).unwrap(),
            [
                "AWSDynamoDB/x/data/b.json.gz",
                "AWSDynamoDB/x/data/a.json.gz"
            ]
        );
        assert!(file_units(&[]).unwrap_err().contains("no data file"));
        let twice = [file("k"), file("k")];
        assert!(file_units(&twice).unwrap_err().contains("listed twice"));
    }

    #[test]
    fn units_find_their_files_by_key_whatever_the_order() {
        let files = [file("a"), file("b")];
        let units = [unit(0, Some("b")), unit(1, Some("a"))];
        let m = unit_files(&units, &files).unwrap();
        assert_eq!((m[&0].key.as_str(), m[&1].key.as_str()), ("b", "a"));
        let unknown = [unit(0, Some("a")), unit(1, Some("c"))];
        assert!(
            unit_files(&unknown, &files)
                .unwrap_err()
                .contains("does not list")
        );
        let scan = [unit(0, Some("a")), unit(1, None)];
        assert!(
            unit_files(&scan, &files)
                .unwrap_err()
                .contains("Scan segment")
        );
        let fewer = [unit(0, Some("a"))];
        assert!(unit_files(&fewer, &files).unwrap_err().contains("1 units"));
    }

    #[test]
    fn a_worker_with_another_source_or_none_is_refused() {
        let e = export("s3://b/exports", "01-a");
        assert!(check_source("m", None, None).is_ok());
        assert!(check_source("m", Some(&e), Some(("s3://b/exports", None))).is_ok());
        assert!(check_source("m", Some(&e), Some(("s3://b/exports", Some("01-a")))).is_ok());
        let refused = |stored, given| match check_source("m", stored, given) {
            Err(FleetError::SourceChanged { stored, given, .. }) => format!("{stored} / {given}"),
            other => panic!("not refused: {other:?}"),
        };
        let msg = refused(Some(&e), None);
        assert!(
            msg.contains("--from-export s3://b/exports") && msg.contains("by Scan"),
            "{msg}"
        );
        let msg = refused(Some(&e), Some(("s3://b/other", None)));
        assert!(
            msg.contains("export 01-a at s3://b/exports") && msg.contains("s3://b/other"),
            "{msg}"
        );
        // The same location holding a newer export: the migration's is read, not it.
        let msg = refused(Some(&e), Some(("s3://b/exports", Some("02-b"))));
        assert!(msg.contains("02-b"), "{msg}");
        let msg = refused(None, Some(("s3://b/exports", None)));
        assert!(msg.starts_with("the source table by Scan"), "{msg}");
    }

    #[test]
    fn the_export_goes_into_meta_and_back() {
        let e = export("s3://b/p", "01-a");
        let mut it = Item::new();
        e.write(&mut it);
        assert_eq!(ExportSource::read(&it), Some(e));
        assert_eq!(ExportSource::read(&Item::new()), None);
    }
}
