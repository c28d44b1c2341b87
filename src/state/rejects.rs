//! The rejects file: every item the plan cannot map, with the reason, so that
//! nothing is lost silently. JSON lines of `{"reason": "...", "item": {…}}`
//! where the item is DynamoDB JSON, ready to be fixed and fed back.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use crate::core::value::Item;

pub struct RejectsFile {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
}

#[derive(Serialize)]
struct Line<'a> {
    reason: &'a str,
    item: &'a Item,
}

impl RejectsFile {
    /// Appends: a resumed run adds to what the first run wrote.
    pub fn open(path: &Path) -> anyhow::Result<RejectsFile> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open rejects file {}", path.display()))?;
        Ok(RejectsFile {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
            written: 0,
        })
    }

    /// Open for a resumed run: everything past `committed` bytes was written
    /// for pages whose checkpoint never landed, and will be written again.
    pub fn open_truncated(path: &Path, committed: u64) -> anyhow::Result<RejectsFile> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open rejects file {}", path.display()))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len > committed {
            f.set_len(committed)
                .with_context(|| format!("cannot truncate rejects file {}", path.display()))?;
        }
        Ok(RejectsFile {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
            written: 0,
        })
    }

    /// Flush to the OS and return the file's length: what a checkpoint records.
    pub fn flush_len(&mut self) -> anyhow::Result<u64> {
        self.out
            .flush()
            .with_context(|| format!("cannot write rejects file {}", self.path.display()))?;
        let f = self.out.get_ref();
        f.sync_data()
            .with_context(|| format!("cannot sync rejects file {}", self.path.display()))?;
        Ok(f.metadata().map(|m| m.len()).unwrap_or(0))
    }

    pub fn write(&mut self, item: &Item, reason: &str) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, &Line { reason, item })
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"))
            .with_context(|| format!("cannot write rejects file {}", self.path.display()))?;
        self.written += 1;
        Ok(())
    }

    /// A line with `tag` beside the reason and item: a fleet worker's
    /// (unit, lease, page), by which a reader keeps only committed pages'
    /// lines (`state::fleet::committed_lease`).
    pub fn write_tagged(
        &mut self,
        item: &Item,
        reason: &str,
        tag: &serde_json::Value,
    ) -> anyhow::Result<()> {
        let line = serde_json::json!({ "reason": reason, "item": item, "fleet": tag });
        serde_json::to_writer(&mut self.out, &line)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"))
            .with_context(|| format!("cannot write rejects file {}", self.path.display()))?;
        self.written += 1;
        Ok(())
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("cannot write rejects file {}", self.path.display()))
    }
}
