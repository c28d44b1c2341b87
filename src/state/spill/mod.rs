//! External, memory-bounded sort-aggregate for `rekey analyze`.
//!
//! `analyze` has to say *exactly* whether a new key schema makes two source
//! items land on the same target key, and how many items each key gets.
//! Sampling cannot give that answer: the one pair of items that would
//! silently overwrite each other during a re-key is precisely what a sample
//! misses. So every item is aggregated, and because tables can be far larger
//! than RAM the aggregation cannot simply live in a `HashMap`.
//!
//! The approach is the classic external sort-aggregate:
//!
//! * Partial aggregates are folded into an in-memory map until its estimated
//!   size passes [`SpillOptions::memory_bytes`]; the map is then written out
//!   as a *run* sorted by key, and emptied. Folding before spilling means hot
//!   keys cost one entry per run rather than one per item.
//! * [`ExternalAggregator::finish`] k-way merges the runs with a heap, folding
//!   equal keys from different runs, so every key comes out exactly once, in
//!   ascending byte order, fully merged. That order makes the output
//!   deterministic and lets callers stream it into reports without buffering.
//! * Everything streams: runs are written and read through buffered I/O, no
//!   run is ever held in memory whole, and the result is an iterator. At most
//!   64 files are open at once; more runs are merged down in extra passes
//!   first, so huge tables never hit the process's file-descriptor limit.
//!
//! Memory outside the budget: the sort index built while spilling (about 24
//! bytes per entry) and one I/O buffer per open run during merges (sized from
//! the budget, 8–256 KiB each).
//!
//! Run files are private to one aggregator and live in a temporary directory
//! that is removed when the [`Merged`] iterator (or an unfinished aggregator)
//! is dropped. They are still read defensively: a truncated or corrupt run is
//! reported as [`SpillError::Corrupt`] rather than a panic or a silently wrong
//! count, because an "exact" answer that is quietly wrong is worse than none.
//!
//! The parts: `aggregator` (the fold and its result), `run` (the run file
//! format), `merge` (the k-way merge), `varint` and `aggregates` (the
//! encodings and the aggregates `analyze` uses).

mod aggregates;
mod aggregator;
mod merge;
mod run;
mod varint;

use std::io;
use std::path::{Path, PathBuf};

pub use aggregates::Claimants;
#[cfg(test)]
pub use aggregates::CountBytes;
pub use aggregator::ExternalAggregator;
pub use varint::{get_varint, put_varint};

/// A value that can be folded per key, and written to / read from a run.
pub trait Aggregate: Sized {
    /// Fold another partial aggregate for the same key into this one. Must be associative and commutative.
    fn merge(&mut self, other: Self);
    fn encode(&self, out: &mut Vec<u8>);
    /// Decode one value from the front of `buf`, returning it and the bytes consumed.
    fn decode(buf: &[u8]) -> Result<(Self, usize), SpillError>;
    /// Approximate heap bytes held (for the memory bound).
    fn heap_bytes(&self) -> usize {
        0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    #[error("spill file I/O in {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("corrupt spill run: {0}")]
    Corrupt(String),
}

impl SpillError {
    fn io(dir: &Path) -> impl FnOnce(io::Error) -> SpillError {
        move |source| SpillError::Io {
            dir: dir.to_path_buf(),
            source,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SpillOptions {
    /// Budget for the in-memory map before a run is spilled.
    pub memory_bytes: usize,
    /// Parent of the temporary spill directory; `None` = the system temp dir.
    pub dir: Option<PathBuf>,
}

/// What the unit tests of the aggregator and of the run format share: a
/// reference result to compare with, and inputs that spill.
#[cfg(test)]
mod test_support {
    use std::collections::BTreeMap;

    use super::{Aggregate, CountBytes, SpillOptions};

    pub(super) fn opts(memory_bytes: usize) -> SpillOptions {
        SpillOptions {
            memory_bytes,
            dir: None,
        }
    }

    pub(super) fn reference<V: Aggregate + Clone>(items: &[(Vec<u8>, V)]) -> Vec<(Vec<u8>, V)> {
        let mut m: BTreeMap<Vec<u8>, V> = BTreeMap::new();
        for (k, v) in items {
            match m.get_mut(k) {
                Some(slot) => slot.merge(v.clone()),
                None => {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
        m.into_iter().collect()
    }

    pub(super) fn numbered_items(n: u64, distinct: u64) -> Vec<(Vec<u8>, CountBytes)> {
        (0..n)
            .map(|i| {
                let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % distinct;
                (format!("k{k}").into_bytes(), CountBytes::one(i % 97))
            })
            .collect()
    }
}
