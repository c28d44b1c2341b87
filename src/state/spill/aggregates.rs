//! Ready-made aggregates for `rekey analyze`: per-key counts and sizes, and
//! the source items that claim each target key.
//!
//! Both saturate instead of overflowing, and both merge associatively and
//! commutatively, which is what makes the result independent of the order
//! items arrive in and of where runs were cut.

use super::varint::{get_bytes, get_varint, put_varint};
use super::{Aggregate, SpillError};

/// Count and total bytes for one key (the tests' aggregate).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CountBytes {
    pub count: u64,
    pub bytes: u64,
}

#[cfg(test)]
impl CountBytes {
    /// One item of `bytes` size.
    pub fn one(bytes: u64) -> Self {
        CountBytes { count: 1, bytes }
    }
}

#[cfg(test)]
impl Aggregate for CountBytes {
    fn merge(&mut self, other: Self) {
        // Saturate rather than wrap or panic: a pegged counter is obviously
        // wrong in a report, a wrapped one is not.
        self.count = self.count.saturating_add(other.count);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.count);
        put_varint(out, self.bytes);
    }

    fn decode(buf: &[u8]) -> Result<(Self, usize), SpillError> {
        let (count, a) = get_varint(buf)?;
        let (bytes, b) = get_varint(&buf[a..])?;
        Ok((CountBytes { count, bytes }, a + b))
    }
}

/// For collision detection: how many source items map to one target key, and up to 3 example source keys (the smallest by byte order, so the result is deterministic regardless of insertion/spill order).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claimants {
    pub count: u64,
    pub examples: Vec<Vec<u8>>,
}

impl Claimants {
    /// Most example source keys kept per target key: enough to show a user
    /// what collides without letting a hot key's examples grow unbounded.
    pub const MAX_EXAMPLES: usize = 3;

    /// One source item, identified by its (encoded) source key.
    pub fn one(source_key: &[u8]) -> Self {
        Claimants {
            count: 1,
            examples: vec![source_key.to_vec()],
        }
    }
}

impl Aggregate for Claimants {
    fn merge(&mut self, other: Self) {
        self.count = self.count.saturating_add(other.count);
        // "Smallest N distinct of the union" is associative and commutative,
        // which is what makes the examples independent of insertion and spill
        // order. At most 2*N short entries, so a plain sort is cheapest, and
        // it does not rely on callers having kept `examples` sorted.
        self.examples.extend(other.examples);
        self.examples.sort_unstable();
        self.examples.dedup();
        self.examples.truncate(Self::MAX_EXAMPLES);
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.count);
        put_varint(out, self.examples.len() as u64);
        for e in &self.examples {
            put_varint(out, e.len() as u64);
            out.extend_from_slice(e);
        }
    }

    fn decode(buf: &[u8]) -> Result<(Self, usize), SpillError> {
        let (count, mut pos) = get_varint(buf)?;
        let (n, used) = get_varint(&buf[pos..])?;
        pos += used;
        // Bound the example count before allocating for it.
        if n > Self::MAX_EXAMPLES as u64 {
            return Err(SpillError::Corrupt(format!(
                "{n} claimant examples (max {})",
                Self::MAX_EXAMPLES
            )));
        }
        let mut examples = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let (bytes, used) = get_bytes(&buf[pos..])?;
            examples.push(bytes.to_vec());
            pos += used;
        }
        Ok((Claimants { count, examples }, pos))
    }

    fn heap_bytes(&self) -> usize {
        self.examples.capacity() * size_of::<Vec<u8>>()
            + self.examples.iter().map(Vec::capacity).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoders_refuse_corrupt_values() {
        assert!(CountBytes::decode(&[5]).is_err());
        assert!(Claimants::decode(&[1, 4]).is_err(), "too many examples");
        assert!(
            Claimants::decode(&[1, 1, 9, 0]).is_err(),
            "example overruns"
        );
    }
}
