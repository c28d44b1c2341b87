//! The k-way merge of sorted runs, which is what makes the output exact:
//! equal keys from different runs meet at the top of the heap and are folded
//! into one, so each key comes out once, in ascending byte order. Each run is
//! checked to be strictly ascending as it is read, since a mis-sorted run
//! would otherwise report a key twice.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::collections::binary_heap::PeekMut;
use std::path::{Path, PathBuf};

use super::run::{RunReader, RunWriter};
use super::{Aggregate, SpillError};

struct HeapEntry<V> {
    key: Vec<u8>,
    src: usize,
    value: V,
}

// Reversed so `BinaryHeap` (a max-heap) pops the smallest key first; `src`
// only breaks ties so the pop order is deterministic.
impl<V> Ord for HeapEntry<V> {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .key
            .cmp(&self.key)
            .then_with(|| other.src.cmp(&self.src))
    }
}
impl<V> PartialOrd for HeapEntry<V> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<V> PartialEq for HeapEntry<V> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<V> Eq for HeapEntry<V> {}

/// Merges sorted runs; the heap holds one head record per run, so each
/// output costs O(log k) and memory is one record plus one buffer per run.
pub(super) struct KWay<V> {
    /// `None` once a run is exhausted, closing its file and freeing its buffer early.
    readers: Vec<Option<RunReader>>,
    heap: BinaryHeap<HeapEntry<V>>,
}

impl<V: Aggregate> KWay<V> {
    pub(super) fn open(paths: Vec<PathBuf>, io_buf: usize, dir: &Path) -> Result<Self, SpillError> {
        let mut kw = KWay {
            readers: Vec::with_capacity(paths.len()),
            heap: BinaryHeap::with_capacity(paths.len()),
        };
        for p in paths {
            kw.readers.push(Some(RunReader::open(p, io_buf, dir)?));
        }
        for src in 0..kw.readers.len() {
            kw.advance(src, None)?;
        }
        Ok(kw)
    }

    /// Pull the next record of run `src` into the heap. `prev` is the key just
    /// taken from that run: checking strict order here is free and turns a
    /// mis-sorted run into an error instead of a key reported twice.
    fn advance(&mut self, src: usize, prev: Option<&[u8]>) -> Result<(), SpillError> {
        let Some(reader) = self.readers[src].as_mut() else {
            return Ok(());
        };
        match reader.next::<V>()? {
            Some((key, value)) => {
                if let Some(prev) = prev
                    && key.as_slice() <= prev
                {
                    return Err(reader.corrupt("keys not strictly ascending"));
                }
                self.heap.push(HeapEntry { key, src, value });
            }
            None => self.readers[src] = None,
        }
        Ok(())
    }

    pub(super) fn next_merged(&mut self) -> Result<Option<(Vec<u8>, V)>, SpillError> {
        let Some(HeapEntry {
            key,
            src,
            mut value,
        }) = self.heap.pop()
        else {
            return Ok(None);
        };
        self.advance(src, Some(&key))?;
        loop {
            let Some(top) = self.heap.peek_mut() else {
                break;
            };
            if top.key != key {
                break;
            }
            let HeapEntry {
                src, value: other, ..
            } = PeekMut::pop(top);
            value.merge(other);
            self.advance(src, Some(&key))?;
        }
        Ok(Some((key, value)))
    }
}

/// Merges the runs `inputs` into one new run `out` (a pass that reduces the
/// number of runs to what may be open at once).
pub(super) fn merge_to_run<V: Aggregate>(
    inputs: Vec<PathBuf>,
    out: &Path,
    io_buf: usize,
    dir: &Path,
) -> Result<(), SpillError> {
    let mut kway = KWay::<V>::open(inputs, io_buf, dir)?;
    let mut w = RunWriter::create(out, io_buf, dir)?;
    while let Some((k, v)) = kway.next_merged()? {
        w.write(&k, &v)?;
    }
    w.finish()
}
