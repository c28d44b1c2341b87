//! The source table's generated stream: `records` records over `shards`
//! open shards, each a pure function of its place.
//!
//! Record `k` of shard `s` is the stream's record number `g = k × shards + s`
//! (so numbers interleave across shards and every shard has `records /
//! shards` of them, give or take one); its sequence number is `10^18 + g`,
//! 21 digits, increasing along each shard and across the stream.
//!
//! Each shard's items are new orders (indices past the table's), each
//! written three times on its own shard, in order: INSERT, MODIFY (`status`
//! DELIVERED), REMOVE. Items go in windows of [`WINDOW`]: the window's
//! INSERTs, then its MODIFYs, then its REMOVEs, so records of different
//! items interleave as they do in a live table and one GetRecords page holds
//! several records of some items. The last window may stop short of a phase.

use super::items::{Generator, Order};
use super::wire;

/// Items written at once on a shard.
pub const WINDOW: u64 = 100;
const SEQ_BASE: u64 = 1_000_000_000_000_000_000;
/// Records per GetRecords call (DynamoDB's limit).
pub const MAX_RECORDS: u64 = 1000;
/// Bytes per GetRecords call (DynamoDB's limit).
pub const MAX_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Insert,
    Modify,
    Remove,
}

impl Event {
    pub fn name(self) -> &'static str {
        match self {
            Event::Insert => "INSERT",
            Event::Modify => "MODIFY",
            Event::Remove => "REMOVE",
        }
    }
}

/// One record, before it is written out.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub shard: u32,
    /// Place in the shard.
    pub k: u64,
    /// Place in the stream.
    pub number: u64,
    pub event: Event,
    /// The order's index in the generator.
    pub index: u64,
}

#[derive(Debug, Clone)]
pub struct StreamGen {
    pub shards: u32,
    pub records: u64,
    /// Where the stream's orders start: the table's item count.
    first_index: u64,
    /// ApproximateCreationDateTime of every record, epoch seconds (whole ms).
    pub created: f64,
}

impl StreamGen {
    pub fn new(shards: u32, records: u64, first_index: u64, created: f64) -> StreamGen {
        StreamGen {
            shards: shards.max(1),
            records,
            first_index,
            created,
        }
    }

    /// Records on shard `s`.
    pub fn shard_len(&self, s: u32) -> u64 {
        let n = u64::from(self.shards);
        self.records / n + u64::from(u64::from(s) < self.records % n)
    }

    pub fn shard_id(s: u32) -> String {
        format!("shardId-00000001767225600000-{s:08x}")
    }

    /// The shard an id names.
    pub fn shard_of(&self, id: &str) -> Option<u32> {
        let hex = id.strip_prefix("shardId-00000001767225600000-")?;
        let s = u32::from_str_radix(hex, 16).ok()?;
        (s < self.shards && Self::shard_id(s) == id).then_some(s)
    }

    pub fn sequence_number(number: u64) -> String {
        format!("{:021}", SEQ_BASE + number)
    }

    /// The first sequence number of shard `s` (whether or not it has records).
    pub fn first_sequence(&self, s: u32) -> String {
        Self::sequence_number(u64::from(s))
    }

    /// The shard and place a sequence number of this stream names.
    pub fn place_of(&self, seq: &str) -> Option<(u32, u64)> {
        let number = seq.parse::<u64>().ok()?.checked_sub(SEQ_BASE)?;
        let n = u64::from(self.shards);
        Some(((number % n) as u32, number / n))
    }

    pub fn record(&self, s: u32, k: u64) -> Record {
        let n = u64::from(self.shards);
        let (phase, slot, cycle) = ((k / WINDOW) % 3, k % WINDOW, k / (3 * WINDOW));
        let local = cycle * WINDOW + slot;
        Record {
            shard: s,
            k,
            number: k * n + u64::from(s),
            event: match phase {
                0 => Event::Insert,
                1 => Event::Modify,
                _ => Event::Remove,
            },
            index: self.first_index + local * n + u64::from(s),
        }
    }

    /// The images of a record: (old, new).
    pub fn images<'g>(
        &self,
        generator: &'g Generator,
        r: &Record,
    ) -> (Option<Order<'g>>, Option<Order<'g>>) {
        let o = generator.order(r.index);
        match r.event {
            Event::Insert => (None, Some(o)),
            Event::Modify => (Some(o), Some(o.modified())),
            Event::Remove => (Some(o.modified()), None),
        }
    }

    /// The record as GetRecords gives it; returns its `SizeBytes`.
    pub fn write_record(&self, generator: &Generator, r: &Record, out: &mut Vec<u8>) -> usize {
        let (old, new) = self.images(generator, r);
        let any = old.or(new).expect("a record has an image");
        // DynamoDB: the key and the images, by its item size rules.
        let key_size = 2 + any.pk().len() + 2 + any.sk().len();
        let size = key_size + old.map_or(0, |o| o.size()) + new.map_or(0, |o| o.size());
        out.extend_from_slice(
            br#"{"awsRegion":"us-east-1","dynamodb":{"ApproximateCreationDateTime":"#,
        );
        wire::push_f64(out, self.created);
        out.extend_from_slice(br#","Keys":"#);
        any.write_key(out);
        if let Some(n) = new {
            out.extend_from_slice(br#","NewImage":"#);
            n.write_json(out);
        }
        if let Some(o) = old {
            out.extend_from_slice(br#","OldImage":"#);
            o.write_json(out);
        }
        out.extend_from_slice(br#","SequenceNumber":""#);
        wire::push_u64(out, SEQ_BASE + r.number);
        out.extend_from_slice(br#"","SizeBytes":"#);
        wire::push_u64(out, size as u64);
        out.extend_from_slice(br#","StreamViewType":"NEW_AND_OLD_IMAGES"},"eventID":""#);
        wire::push_hex8(out, r.number);
        out.extend_from_slice(br#"","eventName":""#);
        out.extend_from_slice(r.event.name().as_bytes());
        out.extend_from_slice(br#"","eventSource":"aws:dynamodb","eventVersion":"1.1"}"#);
        size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn records_cover_the_stream_once_with_each_items_changes_in_order_on_one_shard() {
        let g = StreamGen::new(3, 1000, 50, 0.0);
        assert_eq!((0..3).map(|s| g.shard_len(s)).sum::<u64>(), 1000);
        let mut numbers = Vec::new();
        let mut per_item: HashMap<u64, Vec<(u32, u64, Event)>> = HashMap::new();
        for s in 0..3 {
            let mut last = None;
            for k in 0..g.shard_len(s) {
                let r = g.record(s, k);
                assert!(last.is_none_or(|l| l < r.number), "increasing on a shard");
                last = Some(r.number);
                numbers.push(r.number);
                assert!(r.index >= 50);
                per_item.entry(r.index).or_default().push((s, k, r.event));
                let seq = StreamGen::sequence_number(r.number);
                assert_eq!(seq.len(), 21);
                assert_eq!(g.place_of(&seq), Some((s, k)));
            }
            assert_eq!(g.shard_of(&StreamGen::shard_id(s)), Some(s));
        }
        numbers.sort_unstable();
        assert_eq!(numbers, (0..1000).collect::<Vec<_>>());
        for changes in per_item.values() {
            let events: Vec<Event> = changes.iter().map(|c| c.2).collect();
            assert!(changes.iter().all(|c| c.0 == changes[0].0), "one shard");
            assert!(changes.windows(2).all(|w| w[0].1 < w[1].1));
            assert_eq!(
                events,
                [Event::Insert, Event::Modify, Event::Remove][..events.len()]
            );
        }
        assert_eq!(g.shard_of("shardId-00000001767225600000-00000003"), None);
    }
}
