//! The rejects file: every item the plan cannot map, with the reason, so that
//! nothing is lost silently. JSON lines of `{"reason": "...", "item": {…}}`
//! where the item is DynamoDB JSON, ready to be fixed and fed back.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use crate::value::Item;

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

    pub fn write(&mut self, item: &Item, reason: &str) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, &Line { reason, item })
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"))
            .with_context(|| format!("cannot write rejects file {}", self.path.display()))?;
        self.written += 1;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("cannot write rejects file {}", self.path.display()))
    }
}
