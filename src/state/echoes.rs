//! The echo ledger: how each of two tails running in opposite directions
//! (issue 13, a rollback's deploy window) recognises its own writes coming
//! back through the other table's stream.
//!
//! Before a guarded tail writes an image (or deletes a key) it appends one
//! line — the MD5 of the key written and of the image, `-` for a delete — to
//! its own ledger (`tail/written.jsonl`, `reverse/written.jsonl`; named in
//! `StateDir`). The other tail reads that file as it grows and, when a
//! record of its stream carries exactly such a key and image, knows it is
//! the echo of that write and takes one entry instead of writing it back.
//! A line is flushed to the file before the write it announces is sent, so
//! the other process can always see it before the write's stream record.
//!
//! Taking an entry is recorded in the taker's own ledger (`T` lines), so a
//! tail restarted after kill -9 does not count the entries it took again.
//!
//! Content hashes, not positions: the two stores have one driver each, and
//! only a file written in order can be read by the other process while both
//! run. A ledger only grows during the window; `rekey finish` ends it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use md5::{Digest as _, Md5};

use crate::core::value::Item;

/// One write: hashes of its key and of its image (None: a delete).
pub type Entry = ([u8; 16], Option<[u8; 16]>);

/// Hash of an item (keys sorted: `Item` is a BTreeMap).
fn digest(item: &Item) -> [u8; 16] {
    let bytes = serde_json::to_vec(item).unwrap_or_default();
    Md5::digest(&bytes).into()
}

/// The entry for writing `image` (None: deleting) at `key`.
pub fn entry(key: &Item, image: Option<&Item>) -> Entry {
    (digest(key), image.map(digest))
}

fn hex(d: &[u8; 16]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// `A` announces a write, `T` records taking the other side's entry.
fn line(tag: char, e: &Entry) -> String {
    let h = e.1.as_ref().map_or("-".to_string(), hex);
    format!("{tag} {} {h}\n", hex(&e.0))
}

fn parse(line: &str) -> Option<(char, Entry)> {
    let (tag, rest) = line.trim_end().split_once(' ')?;
    let tag = tag.chars().next()?;
    let (k, h) = rest.split_once(' ')?;
    let image = match h {
        "-" => None,
        h => Some(unhex(h)?),
    };
    Some((tag, (unhex(k)?, image)))
}

/// This tail's ledger (appended) and the other direction's (read as it grows).
pub struct Echoes {
    own: File,
    other_path: PathBuf,
    other: Option<BufReader<File>>,
    /// Bytes of the other ledger read (whole lines only).
    offset: u64,
    pending: HashMap<Entry, u32>,
    /// Entries this side took before it last started: not pending again.
    taken: HashMap<Entry, u32>,
}

impl Echoes {
    pub fn open(own: &Path, other: &Path) -> anyhow::Result<Echoes> {
        Echoes::open_after(own, other, 0, &[])
    }

    /// Reading the other ledger from byte `from` on, with `taken` (entries of
    /// records this side read before it began) already taken where announced.
    pub fn open_after(
        own: &Path,
        other: &Path,
        from: u64,
        taken_before: &[Entry],
    ) -> anyhow::Result<Echoes> {
        if let Some(dir) = own.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut taken: HashMap<Entry, u32> = HashMap::new();
        if let Ok(f) = File::open(own) {
            for text in BufReader::new(f).lines() {
                let text = text.with_context(|| format!("cannot read {}", own.display()))?;
                if let Some(('T', e)) = parse(&text) {
                    *taken.entry(e).or_default() += 1;
                }
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(own)
            .with_context(|| format!("cannot open {}", own.display()))?;
        let mut echoes = Echoes {
            own: file,
            other_path: other.to_path_buf(),
            other: None,
            offset: from,
            pending: HashMap::new(),
            taken,
        };
        // Their announcements precede their records, so they are read by now.
        echoes.read_other()?;
        for e in taken_before {
            echoes.take_pending(e);
        }
        Ok(echoes)
    }

    /// Announce a write before it is sent.
    pub fn announce(&mut self, e: &Entry) -> anyhow::Result<()> {
        self.append('A', e)
    }

    fn append(&mut self, tag: char, e: &Entry) -> anyhow::Result<()> {
        self.own
            .write_all(line(tag, e).as_bytes())
            .context("cannot append to the echo ledger")?;
        self.own.flush().context("cannot flush the echo ledger")
    }

    /// True (and the entry taken) if the other tail announced this write.
    pub fn take(&mut self, e: &Entry) -> anyhow::Result<bool> {
        self.read_other()?;
        if !self.take_pending(e) {
            return Ok(false);
        }
        self.append('T', e)?;
        Ok(true)
    }

    /// One pending announcement of `e` taken, if there is one.
    fn take_pending(&mut self, e: &Entry) -> bool {
        match self.pending.get_mut(e) {
            Some(n) if *n > 0 => {
                *n -= 1;
                if *n == 0 {
                    self.pending.remove(e);
                }
                true
            }
            _ => false,
        }
    }

    /// New whole lines of the other ledger.
    fn read_other(&mut self) -> anyhow::Result<()> {
        if self.other.is_none() {
            match File::open(&self.other_path) {
                Ok(mut f) => {
                    f.seek(SeekFrom::Start(self.offset))
                        .context("cannot read the echo ledger")?;
                    self.other = Some(BufReader::new(f));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot read {}", self.other_path.display()));
                }
            }
        }
        let Some(r) = self.other.as_mut() else {
            return Ok(());
        };
        loop {
            let mut text = String::new();
            let n = r
                .read_line(&mut text)
                .context("cannot read the echo ledger")?;
            if n == 0 {
                break;
            }
            if !text.ends_with('\n') {
                // A line being written: read it again whole next time.
                r.seek(SeekFrom::Start(self.offset))
                    .context("cannot read the echo ledger")?;
                break;
            }
            self.offset += n as u64;
            if let Some(('A', e)) = parse(&text) {
                match self.taken.get_mut(&e) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => *self.pending.entry(e).or_default() += 1,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::Value;

    fn it(v: &str) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S("k".into()));
        i.insert("v".into(), Value::S(v.into()));
        i
    }

    #[test]
    fn a_write_announced_by_one_side_is_taken_once_by_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a/w"), dir.path().join("b/w"));
        let mut fwd = Echoes::open(&a, &b).unwrap();
        let mut rev = Echoes::open(&b, &a).unwrap();
        let key = it("key");
        let e = entry(&key, Some(&it("x")));
        assert!(!rev.take(&e).unwrap(), "nothing announced yet");
        fwd.announce(&e).unwrap();
        fwd.announce(&entry(&key, None)).unwrap();
        assert!(rev.take(&e).unwrap());
        assert!(!rev.take(&e).unwrap(), "taken once");
        assert!(rev.take(&entry(&key, None)).unwrap());
        assert!(!rev.take(&entry(&key, Some(&it("y")))).unwrap());
        // Not its own announcements.
        assert!(!fwd.take(&e).unwrap());
        // Reopened (a restart after kill -9): what was taken stays taken.
        fwd.announce(&e).unwrap();
        drop(rev);
        let mut rev = Echoes::open(&b, &a).unwrap();
        assert!(rev.take(&e).unwrap(), "the new announcement");
        assert!(!rev.take(&e).unwrap(), "the one taken before the restart");
    }
}
