//! LEB128 varints: the lengths and counts of run files, and what the
//! ready-made aggregates encode.
//!
//! Public so that `Aggregate` impls elsewhere in rekey encode the same
//! compact way without duplicating the overflow checks. The slice decoder
//! here and the streaming one of the run reader share one state machine
//! ([`VarintAcc`]), so they reject exactly the same malformed input.

use super::SpillError;

/// Append `v` as an unsigned LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Decode an unsigned LEB128 varint from the front of `buf`, returning it and
/// the bytes consumed. Truncated or over-long input is `Corrupt`.
pub fn get_varint(buf: &[u8]) -> Result<(u64, usize), SpillError> {
    let mut acc = VarintAcc::default();
    for (i, &b) in buf.iter().enumerate() {
        if let Some(v) = acc.push(b).map_err(|m| SpillError::Corrupt(m.to_owned()))? {
            return Ok((v, i + 1));
        }
    }
    Err(SpillError::Corrupt("truncated varint".to_owned()))
}

/// Decode a varint-prefixed byte string from the front of `buf`.
pub(super) fn get_bytes(buf: &[u8]) -> Result<(&[u8], usize), SpillError> {
    let (len, n) = get_varint(buf)?;
    let rest = &buf[n..];
    match usize::try_from(len) {
        Ok(len) if len <= rest.len() => Ok((&rest[..len], n + len)),
        _ => Err(SpillError::Corrupt(format!(
            "byte string of {len} bytes overruns its {}-byte value",
            rest.len()
        ))),
    }
}

/// Shared varint state machine, so the slice decoder and the streaming run
/// reader reject exactly the same malformed input.
#[derive(Default)]
pub(super) struct VarintAcc {
    value: u64,
    index: u32,
}

impl VarintAcc {
    pub(super) fn push(&mut self, b: u8) -> Result<Option<u64>, &'static str> {
        // The 10th byte may only carry the single top bit of a u64; anything
        // more is a corrupt length that would otherwise wrap silently.
        if self.index == 9 && b > 1 {
            return Err("varint overflows u64");
        }
        self.value |= u64::from(b & 0x7f) << (7 * self.index);
        self.index += 1;
        Ok((b & 0x80 == 0).then_some(self.value))
    }
}

/// `v` as a varint into a stack buffer; returns the bytes used.
pub(super) fn encode_varint_array(mut v: u64, out: &mut [u8; 10]) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            buf.push(0xAA);
            assert_eq!(get_varint(&buf).unwrap(), (v, buf.len() - 1));
        }
        assert!(get_varint(&[]).is_err());
        assert!(get_varint(&[0x80, 0x80]).is_err());
        assert!(get_varint(&[0xff; 11]).is_err());
        assert!(get_varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]).is_err());
    }
}
