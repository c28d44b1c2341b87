//! Which export to read when a location holds several.
//!
//! An operator usually gives the prefix they exported to, under which every
//! export of the table piles up (`AWSDynamoDB/<exportId>/`), finished or not.
//! Reading the wrong one would silently copy stale data, so the choice is
//! spelled out: the export named by id if one was asked for, else the newest
//! finished full export, with the others listed so the operator can see what
//! was passed over ([`Manifest::selection_note`](super::Manifest::selection_note)).

use super::error::ExportError;
use super::manifest::{SummaryJson, read_summary};
use super::{EXPORTS_DIR, Loc, SUMMARY_FILE, Store};

/// The export chosen, with its summary.
pub(super) struct Chosen {
    pub(super) dir: Loc,
    pub(super) id: String,
    pub(super) summary: SummaryJson,
    /// The summary's name, for messages.
    pub(super) summary_file: String,
    /// The exports not chosen, as [`Manifest::other_exports`](super::Manifest::other_exports).
    pub(super) others: Vec<String>,
}

impl Chosen {
    fn new(dir: Loc, id: String, (summary, summary_file): (SummaryJson, String)) -> Chosen {
        Chosen {
            dir,
            id,
            summary,
            summary_file,
            others: Vec::new(),
        }
    }
}

/// An export id, from an id or an export ARN (`…:table/T/export/<id>`).
pub(super) fn normalize_export_id(s: &str) -> Result<String, ExportError> {
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

/// The export at `start`: `start` itself if it is an export's folder, else
/// export `wanted` under it, else the newest.
pub(super) async fn find_export(
    store: &Store,
    start: &Loc,
    wanted: Option<&str>,
) -> Result<Chosen, ExportError> {
    // The location is one export's folder.
    if let Some(summary) = read_summary(store, start).await? {
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
        return Ok(Chosen::new(start.clone(), id, summary));
    }
    let root = if start.name() == Some(EXPORTS_DIR) {
        start.clone()
    } else {
        start.join(EXPORTS_DIR)
    };
    match wanted {
        Some(id) => by_id(store, &root, id).await,
        None => newest(store, start, &root).await,
    }
}

/// Export `id` under `root` (an `AWSDynamoDB` folder).
async fn by_id(store: &Store, root: &Loc, id: &str) -> Result<Chosen, ExportError> {
    let dir = root.join(id);
    match read_summary(store, &dir).await? {
        Some(summary) => Ok(Chosen::new(dir, id.to_string(), summary)),
        None => Err(ExportError::NotFound {
            what: format!(
                "export {id}: no {} (missing, or the export has not finished)",
                store.show(&dir.join(SUMMARY_FILE))
            ),
            endpoint: store.endpoint(),
        }),
    }
}

/// The newest finished full export under `root` (an `AWSDynamoDB` folder),
/// the others listed in its `others`.
async fn newest(store: &Store, start: &Loc, root: &Loc) -> Result<Chosen, ExportError> {
    let mut found: Vec<(i64, Chosen)> = Vec::new();
    let mut unfinished: Vec<String> = Vec::new();
    for id in store.list_dirs(root).await? {
        let dir = root.join(&id);
        match read_summary(store, &dir).await? {
            None => unfinished.push(id),
            Some((summary, summary_file)) => {
                let ms = summary.export_time_ms(&summary_file)?;
                found.push((ms, Chosen::new(dir, id, (summary, summary_file))));
            }
        }
    }
    if found.is_empty() {
        let mut what = format!(
            "no finished export under {}: nothing matches {}/<exportId>/{SUMMARY_FILE}",
            store.show(start),
            store.show(root)
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
        .map(|(_, c)| passed_over(c))
        .chain(
            unfinished
                .iter()
                .map(|id| format!("{id} (unfinished or failed)")),
        )
        .collect();
    Ok(chosen)
}

/// `id (exportTime[, what it is])` of an export not chosen.
fn passed_over(c: &Chosen) -> String {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
