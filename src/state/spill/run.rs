//! Run files: one spilled, sorted slice of the aggregate, written once and
//! read back once by the merge.
//!
//! ```text
//! magic "RKSPILL\x01"
//! { 0x01, varint key_len, key, varint value_len, value }*   keys strictly ascending
//! 0x00, varint record_count, EOF
//! ```
//!
//! The value is length-prefixed so a run can be streamed without the
//! `Aggregate` impl having to know where it ends, and so a decoder that reads
//! too much or too little is caught. The trailer makes truncation at a record
//! boundary detectable; without it a short run would just look like fewer keys.
//! A run is private to its aggregator, but it is still read defensively: a
//! malformation that can be detected is [`SpillError::Corrupt`], never a panic
//! or a huge allocation.

use std::fmt::Display;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::varint::{VarintAcc, encode_varint_array, put_varint};
use super::{Aggregate, SpillError};

const MAGIC: &[u8; 8] = b"RKSPILL\x01";
const TAG_RECORD: u8 = 1;
const TAG_END: u8 = 0;

/// Largest chunk read at once for a length-prefixed field, so a corrupt
/// length costs at most what the file actually holds, not a huge allocation.
const READ_CHUNK: usize = 64 * 1024;

/// Writes one run; [`finish`](Self::finish) writes the trailer and flushes.
pub(super) struct RunWriter {
    w: BufWriter<File>,
    records: u64,
    hdr: Vec<u8>,
    val: Vec<u8>,
    dir: PathBuf,
}

impl RunWriter {
    pub(super) fn create(path: &Path, io_buf: usize, dir: &Path) -> Result<Self, SpillError> {
        let file = File::create(path).map_err(SpillError::io(dir))?;
        let mut w = BufWriter::with_capacity(io_buf, file);
        w.write_all(MAGIC).map_err(SpillError::io(dir))?;
        Ok(RunWriter {
            w,
            records: 0,
            hdr: Vec::with_capacity(16),
            val: Vec::new(),
            dir: dir.to_path_buf(),
        })
    }

    pub(super) fn write<V: Aggregate>(&mut self, key: &[u8], value: &V) -> Result<(), SpillError> {
        self.val.clear();
        value.encode(&mut self.val);
        self.hdr.clear();
        self.hdr.push(TAG_RECORD);
        put_varint(&mut self.hdr, key.len() as u64);
        let w = &mut self.w;
        (|| {
            w.write_all(&self.hdr)?;
            w.write_all(key)?;
            let mut len = [0u8; 10];
            let n = encode_varint_array(self.val.len() as u64, &mut len);
            w.write_all(&len[..n])?;
            w.write_all(&self.val)
        })()
        .map_err(SpillError::io(&self.dir))?;
        self.records += 1;
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<(), SpillError> {
        self.hdr.clear();
        self.hdr.push(TAG_END);
        put_varint(&mut self.hdr, self.records);
        self.w
            .write_all(&self.hdr)
            .map_err(SpillError::io(&self.dir))?;
        // Flush explicitly: BufWriter's drop swallows write errors (e.g. a
        // full disk), which would surface later as a confusing "corrupt run".
        self.w.flush().map_err(SpillError::io(&self.dir))
    }
}

/// Reads one run back, record by record, checking it as it goes.
pub(super) struct RunReader {
    r: BufReader<File>,
    path: PathBuf,
    dir: PathBuf,
    pos: u64,
    records: u64,
    val: Vec<u8>,
}

impl RunReader {
    pub(super) fn open(path: PathBuf, io_buf: usize, dir: &Path) -> Result<Self, SpillError> {
        let file = File::open(&path).map_err(SpillError::io(dir))?;
        let mut rd = RunReader {
            r: BufReader::with_capacity(io_buf, file),
            path,
            dir: dir.to_path_buf(),
            pos: 0,
            records: 0,
            val: Vec::new(),
        };
        let mut magic = Vec::new();
        rd.read_bytes(MAGIC.len(), &mut magic)?;
        if magic != MAGIC {
            return Err(rd.corrupt("bad magic"));
        }
        Ok(rd)
    }

    pub(super) fn corrupt(&self, what: impl Display) -> SpillError {
        SpillError::Corrupt(format!(
            "{}: {what} at byte {}",
            self.path.display(),
            self.pos
        ))
    }

    fn fill(&mut self) -> Result<&[u8], SpillError> {
        self.r.fill_buf().map_err(SpillError::io(&self.dir))
    }

    fn read_u8(&mut self) -> Result<Option<u8>, SpillError> {
        let b = self.fill()?.first().copied();
        if b.is_some() {
            self.r.consume(1);
            self.pos += 1;
        }
        Ok(b)
    }

    fn read_varint(&mut self) -> Result<u64, SpillError> {
        let mut acc = VarintAcc::default();
        loop {
            let Some(b) = self.read_u8()? else {
                return Err(self.corrupt("truncated varint"));
            };
            match acc.push(b) {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(m) => return Err(self.corrupt(m)),
            }
        }
    }

    fn read_len(&mut self) -> Result<usize, SpillError> {
        let len = self.read_varint()?;
        usize::try_from(len).map_err(|_| self.corrupt(format!("length {len} too large")))
    }

    /// Read exactly `len` bytes into `out`, growing it only as data arrives.
    fn read_bytes(&mut self, len: usize, out: &mut Vec<u8>) -> Result<(), SpillError> {
        out.clear();
        out.reserve(len.min(READ_CHUNK));
        while out.len() < len {
            let want = len - out.len();
            let buf = self.fill()?;
            if buf.is_empty() {
                return Err(self.corrupt(format!("truncated: {want} more bytes expected")));
            }
            let n = buf.len().min(want);
            out.extend_from_slice(&buf[..n]);
            self.r.consume(n);
            self.pos += n as u64;
        }
        Ok(())
    }

    /// Next record, or `None` after a verified trailer.
    pub(super) fn next<V: Aggregate>(&mut self) -> Result<Option<(Vec<u8>, V)>, SpillError> {
        match self.read_u8()? {
            None => Err(self.corrupt("missing end marker (truncated run)")),
            Some(TAG_END) => {
                let n = self.read_varint()?;
                if n != self.records {
                    return Err(
                        self.corrupt(format!("trailer says {n} records, read {}", self.records))
                    );
                }
                if !self.fill()?.is_empty() {
                    return Err(self.corrupt("trailing bytes after end marker"));
                }
                Ok(None)
            }
            Some(TAG_RECORD) => {
                let klen = self.read_len()?;
                let mut key = Vec::new();
                self.read_bytes(klen, &mut key)?;
                let vlen = self.read_len()?;
                let mut val = std::mem::take(&mut self.val);
                let res = self.read_bytes(vlen, &mut val).and_then(|()| {
                    // Re-anchor decoder errors to this file and offset, and
                    // never trust its byte count blindly.
                    match V::decode(&val) {
                        Ok((v, used)) if used == val.len() => Ok(v),
                        Ok((_, used)) => Err(self.corrupt(format!(
                            "value decoder consumed {used} of {} bytes",
                            val.len()
                        ))),
                        Err(SpillError::Corrupt(m)) => Err(self.corrupt(m)),
                        Err(e) => Err(e),
                    }
                });
                self.val = val;
                self.records += 1;
                Ok(Some((key, res?)))
            }
            Some(tag) => Err(self.corrupt(format!("unknown record tag {tag:#04x}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use proptest::prelude::*;

    use super::super::aggregator::{ExternalAggregator, FAN_IN};
    use super::super::test_support::{numbered_items, opts, reference};
    use super::super::{CountBytes, SpillError};
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn flipped_byte_never_panics(pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let items = numbered_items(150, 37);
            let mut agg = ExternalAggregator::new(opts(1024)).unwrap();
            for (k, v) in &items {
                agg.add(k, *v).unwrap();
            }
            let path = agg.runs()[0].clone();
            let mut data = fs::read(&path).unwrap();
            let i = pos.index(data.len());
            data[i] = byte;
            fs::write(&path, &data).unwrap();
            // Any outcome but a panic is acceptable: some flips are undetectable
            // (a count digit), the rest must surface as errors.
            if let Ok(merged) = agg.finish_with_fan_in(4) {
                let _ = merged.collect::<Vec<_>>();
            }
        }
    }

    /// Build an aggregator with several spilled runs, let `damage` edit the
    /// first run's bytes, and return the outcome of finishing and draining it.
    fn with_damaged_run(
        fan_in: usize,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Vec<(Vec<u8>, CountBytes)>, SpillError> {
        let mut agg = ExternalAggregator::new(opts(512)).unwrap();
        for (k, v) in numbered_items(200, 200) {
            agg.add(&k, v).unwrap();
        }
        assert!(agg.spilled_runs() >= 5);
        let path = agg.runs()[0].clone();
        let mut data = fs::read(&path).unwrap();
        damage(&mut data);
        fs::write(&path, &data).unwrap();
        agg.finish_with_fan_in(fan_in)?.collect()
    }

    fn assert_corrupt(r: Result<Vec<(Vec<u8>, CountBytes)>, SpillError>, what: &str) {
        match r {
            Err(SpillError::Corrupt(_)) => {}
            Err(e) => panic!("{what}: expected Corrupt, got {e}"),
            Ok(_) => panic!("{what}: damaged run was accepted"),
        }
    }

    #[test]
    fn every_truncation_is_corrupt_not_panic() {
        let full = with_damaged_run(FAN_IN, |_| {}).unwrap();
        assert_eq!(full, reference(&numbered_items(200, 200)));
        let len = {
            let mut n = 0;
            let _ = with_damaged_run(FAN_IN, |d| n = d.len());
            n
        };
        for cut in 0..len {
            // Final streaming merge, and an intermediate pass, both detect it.
            for fan_in in [FAN_IN, 3] {
                assert_corrupt(
                    with_damaged_run(fan_in, |d| d.truncate(cut)),
                    &format!("cut at {cut}/{len}, fan_in {fan_in}"),
                );
            }
        }
    }

    #[test]
    fn other_damage_is_corrupt() {
        assert_corrupt(with_damaged_run(FAN_IN, |d| d.push(0)), "trailing byte");
        assert_corrupt(with_damaged_run(FAN_IN, |d| d[0] ^= 1), "bad magic");
        assert_corrupt(
            with_damaged_run(FAN_IN, |d| d[MAGIC.len()] = 7),
            "bad record tag",
        );
        // A huge key length must not allocate its claimed size.
        assert_corrupt(
            with_damaged_run(FAN_IN, |d| {
                d.splice(
                    MAGIC.len() + 1..MAGIC.len() + 2,
                    [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
                );
            }),
            "huge key length",
        );
        // Keys out of order within a run.
        assert_corrupt(
            with_damaged_run(FAN_IN, |d| {
                let mut w = MAGIC.to_vec();
                for k in [b"b", b"a"] {
                    w.extend_from_slice(&[TAG_RECORD, 1, k[0], 2, 1, 1]);
                }
                w.extend_from_slice(&[TAG_END, 2]);
                *d = w;
            }),
            "unsorted run",
        );
    }

    /// An `Aggregate` whose decoder lies about how much it consumed.
    #[derive(Clone)]
    struct Liar;
    impl Aggregate for Liar {
        fn merge(&mut self, _: Self) {}
        fn encode(&self, out: &mut Vec<u8>) {
            out.push(0);
        }
        fn decode(buf: &[u8]) -> Result<(Self, usize), SpillError> {
            Ok((Liar, buf.len() + 5))
        }
    }

    #[test]
    fn lying_decoder_is_corrupt() {
        let mut agg = ExternalAggregator::new(opts(0)).unwrap();
        agg.add(b"a", Liar).unwrap();
        agg.add(b"b", Liar).unwrap();
        // The first record of each run is read when the merge opens it.
        let r = agg.finish().and_then(|m| m.collect::<Result<Vec<_>, _>>());
        assert!(matches!(r, Err(SpillError::Corrupt(_))));
    }
}
