//! Where DynamoDB keeps an item: its partition key value hashed onto a
//! 64-bit ring, and the ring cut into contiguous ranges, one a partition.
//! The partition model (`partitions`) and the stream front
//! (`streams`) place items with these same functions, so a
//! partition and its open stream shard hold the same keys.
//!
//! DynamoDB's own hash is not public; any uniform hash of the value's type
//! and bytes behaves the same for rekey (which never computes it).

use md5::{Digest as _, Md5};
use serde_json::Value;

/// The ring position of a partition key value given as a wire
/// AttributeValue (`{"S": "…"}`, `{"N": "…"}`, `{"B": "<base64>"}`).
/// Numbers hash by their text, which the SDK sends normalised.
pub fn key_hash(value: &Value) -> u64 {
    let mut h = Md5::new();
    match value.as_object().and_then(|o| o.iter().next()) {
        Some((tag, v)) => {
            h.update(tag.as_bytes());
            h.update([0]);
            h.update(v.as_str().unwrap_or_default().as_bytes());
        }
        None => h.update(value.to_string().as_bytes()),
    }
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("an MD5 digest has 16 bytes"))
}

/// `n` equal ranges covering the ring: `(start, end)` with `end` exclusive,
/// the last ending at `u64::MAX` inclusive (as `None`).
pub fn equal_ranges(n: u32) -> Vec<(u64, Option<u64>)> {
    let n = u128::from(n.max(1));
    let span = (u128::from(u64::MAX) + 1) / n;
    (0..n)
        .map(|i| {
            let start = (i * span) as u64;
            let end = (i + 1 < n).then(|| ((i + 1) * span) as u64);
            (start, end)
        })
        .collect()
}

/// Whether `hash` falls in `range`.
pub fn in_range(hash: u64, range: (u64, Option<u64>)) -> bool {
    hash >= range.0 && range.1.is_none_or(|end| hash < end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ranges_cover_the_ring_once_and_keys_spread_over_them() {
        let ranges = equal_ranges(16);
        assert_eq!(ranges.len(), 16);
        assert_eq!(ranges[0].0, 0);
        for w in ranges.windows(2) {
            assert_eq!(w[0].1, Some(w[1].0));
        }
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            let h = key_hash(&json!({"S": format!("TENANT#{i}")}));
            let hits: Vec<usize> = (0..16).filter(|&r| in_range(h, ranges[r])).collect();
            assert_eq!(hits.len(), 1, "each hash in exactly one range");
            counts[hits[0]] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn the_type_is_part_of_the_key() {
        assert_ne!(key_hash(&json!({"S": "7"})), key_hash(&json!({"N": "7"})));
        assert_eq!(key_hash(&json!({"S": "a"})), key_hash(&json!({"S": "a"})));
    }
}
