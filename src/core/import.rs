//! The pure half of `rekey backfill --via-import`: how target items become
//! the S3 objects DynamoDB's ImportTable reads, which items an import would
//! refuse, and how long reading and importing may take.
//!
//! Why an import: ImportTable creates a *new* table from gzip DynamoDB JSON in
//! S3 (one `{"Item":{…}}` per line). It is billed per GB of input and spends
//! no write capacity, so nothing throttles; BatchWriteItem pays a write unit
//! per KB of every item.
//!
//! # Objects
//!
//! A backfill reads *streams* of pages, one after the other: a Scan segment,
//! or one data file of an export. Each stream's target items go into
//! numbered *parts*, `<prefix>/data/<stream>-part-<n>.json.gz`, a part
//! holding consecutive pages until it reaches a size (`--import-object-size`,
//! [`DEFAULT_OBJECT_BYTES`]). The pages' checkpoints are committed, with the
//! next part number, only once the part's object is written. A kill -9
//! therefore re-reads at most the pages of one open part per stream, from the
//! same checkpoint, into the same part number: the object is overwritten,
//! never duplicated, and no other object can be stale (a stream writes part
//! n + 1 only after part n was committed).
//!
//! Why parts and not one object per page: an import takes at most 50,000
//! objects ([`MAX_OBJECTS`], DynamoDB's quota), and a Scan page is at most
//! 1 MB, which would cap an import near 50 GB. DynamoDB reads every object
//! under the prefix it is given, so the data objects have a folder of their
//! own ([`data_prefix`]) and nothing else is ever written there.
//!
//! # Refusals
//!
//! DynamoDB's import skips an item it cannot store, counts it in
//! `ErrorCount` and logs it to CloudWatch only; BatchWriteItem would have
//! refused it with a ValidationException, which the backfill turns into a
//! reject. [`import_refusal`] finds those items first (an index key of the
//! wrong type, empty or too long; a number out of range; an empty set or one
//! holding an element twice), so they become rejects with a reason, as in
//! the other backfills.

use std::io::Write as _;
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde::Serialize;

use crate::core::hash::HashFn;
use crate::core::plan::Plan;
use crate::core::value::{
    Item, MAX_PARTITION_KEY_BYTES, MAX_SORT_KEY_BYTES, Value, storage_refusal,
};

/// The folder under the operator's prefix that holds the data objects.
pub const DATA_DIR: &str = "data";
/// DynamoDB's quota of S3 objects per import.
pub const MAX_OBJECTS: u64 = 50_000;
/// Uncompressed bytes per object by default: 50,000 of them hold 1.6 TB,
/// beyond the largest import DynamoDB takes (15 TB compressed in three
/// regions, 1 TB elsewhere, is its other limit), and each is a few MB once
/// compressed, held in memory per stream while it fills.
pub const DEFAULT_OBJECT_BYTES: u64 = 32 * 1024 * 1024;

/// `<prefix>/data/` (or `data/` at the bucket's root): the S3KeyPrefix the
/// import reads, everything under it rekey's.
pub fn data_prefix(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        format!("{DATA_DIR}/")
    } else {
        format!("{p}/{DATA_DIR}/")
    }
}

/// The stream of Scan segment `n`.
pub fn segment_stream(n: u32) -> String {
    format!("seg-{n:04}")
}

/// The stream of an export's data file: its name (letters, digits, `-`,
/// `_` kept) and a hash of its whole key, so two files never share one.
pub fn export_stream(file_key: &str) -> String {
    let name = file_key.rsplit('/').next().unwrap_or(file_key);
    let stem = name.strip_suffix(".json.gz").unwrap_or(name);
    let clean: String = stem
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("exp-{clean}-{:08x}", HashFn::Fnv1a32.hash(file_key))
}

/// The object of part `part` of `stream`.
pub fn object_key(data_prefix: &str, stream: &str, part: u64) -> String {
    format!("{data_prefix}{stream}-part-{part:06}.json.gz")
}

#[derive(Serialize)]
struct Line<'a> {
    #[serde(rename = "Item")]
    item: &'a Item,
}

/// One object being filled: gzip DynamoDB JSON, one `{"Item":{…}}` a line.
pub struct ObjectBuilder {
    gz: GzEncoder<Vec<u8>>,
    items: u64,
    raw_bytes: u64,
}

impl Default for ObjectBuilder {
    fn default() -> Self {
        ObjectBuilder::new()
    }
}

impl ObjectBuilder {
    pub fn new() -> ObjectBuilder {
        ObjectBuilder {
            gz: GzEncoder::new(Vec::new(), Compression::default()),
            items: 0,
            raw_bytes: 0,
        }
    }

    pub fn add(&mut self, item: &Item) {
        let mut line = serde_json::to_vec(&Line { item }).unwrap_or_default();
        line.push(b'\n');
        // Writing into memory cannot fail.
        let _ = self.gz.write_all(&line);
        self.items += 1;
        self.raw_bytes += line.len() as u64;
    }

    pub fn items(&self) -> u64 {
        self.items
    }

    /// Bytes before compression (what an import is billed on).
    pub fn raw_bytes(&self) -> u64 {
        self.raw_bytes
    }

    /// The gzip file.
    pub fn finish(self) -> Vec<u8> {
        self.gz.finish().unwrap_or_default()
    }
}

/// Why DynamoDB's import would not store `item` (a target item of `plan`),
/// or None. See the module documentation.
pub fn import_refusal(plan: &Plan, item: &Item) -> Option<String> {
    let skipped = "DynamoDB's import would skip the item";
    for index in &plan.indexes {
        for (n, attr) in index.key.attrs().enumerate() {
            let Some(v) = item.get(&attr.name) else {
                continue; // not in the index: allowed
            };
            if v.scalar_type() != Some(attr.ty) {
                return Some(format!(
                    "index `{}` key `{}` is {}, the index declares {}: {skipped}",
                    index.name,
                    attr.name,
                    v.type_name(),
                    attr.ty
                ));
            }
            let limit = if n == 0 {
                MAX_PARTITION_KEY_BYTES
            } else {
                MAX_SORT_KEY_BYTES
            };
            let bytes = v.size();
            let empty = matches!(v, Value::S(s) if s.is_empty())
                || matches!(v, Value::B(b) if b.is_empty());
            if empty || bytes > limit {
                return Some(format!(
                    "index `{}` key `{}` is {bytes} bytes (1 to {limit}): {skipped}",
                    index.name, attr.name
                ));
            }
        }
    }
    item.iter()
        .find_map(|(k, v)| storage_refusal(k, v))
        .map(|why| format!("{why}: {skipped}"))
}

// ---- how long: the stream-retention warning ----------------------------------

/// How long DynamoDB Streams keeps a change.
pub const STREAM_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A rough estimate of a `--via-import` backfill's duration, from
/// DescribeTable's size and item count (refreshed about every six hours).
/// The assumptions, none of them published by AWS:
///
/// * a Scan under `--read-rate R` reads 8 KiB per RCU (eventually
///   consistent: 4 KiB per half unit), so R × 8 KiB a second;
/// * rekey turns at most [`ITEMS_PER_SEC`] items a second into objects (the
///   backfill's measured rate on one core, BENCHMARKS.md), however fast the
///   reads or the export;
/// * DynamoDB imports [`IMPORT_BYTES_PER_SEC`] of uncompressed input a second,
///   after [`IMPORT_SETUP`] to create the table: a deliberately low guess
///   (AWS says only that import time depends on size, key distribution and
///   object count), so that the warning errs on the side of warning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub read: Duration,
    pub import: Duration,
}

pub const ITEMS_PER_SEC: f64 = 10_000.0;
pub const SCAN_BYTES_PER_RCU: f64 = 8192.0;
pub const IMPORT_BYTES_PER_SEC: f64 = 4.0 * 1024.0 * 1024.0;
pub const IMPORT_SETUP: Duration = Duration::from_secs(600);

impl Estimate {
    /// For a table of `bytes` and `items`, read under `read_rate` RCU/s
    /// (None: unlimited, or an export, which reads no capacity).
    pub fn of(bytes: u64, items: u64, read_rate: Option<f64>) -> Estimate {
        let by_items = items as f64 / ITEMS_PER_SEC;
        let by_rate = read_rate
            .filter(|r| *r > 0.0)
            .map_or(0.0, |r| bytes as f64 / (r * SCAN_BYTES_PER_RCU));
        Estimate {
            read: Duration::from_secs_f64(by_items.max(by_rate)),
            import: IMPORT_SETUP + Duration::from_secs_f64(bytes as f64 / IMPORT_BYTES_PER_SEC),
        }
    }

    pub fn total(&self) -> Duration {
        self.read + self.import
    }

    /// The estimate could be off by half either way: past half the stream's
    /// retention, changes made when the backfill started may be trimmed
    /// before a tail that is not running yet reads them.
    pub fn risks_retention(&self) -> bool {
        self.total() * 2 > STREAM_RETENTION
    }
}

/// `95 min`, `3.4 h`.
pub fn show_duration(d: Duration) -> String {
    let mins = d.as_secs_f64() / 60.0;
    if mins < 120.0 {
        format!("{mins:.0} min")
    } else {
        format!("{:.1} h", mins / 60.0)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::path::Path;

    use super::*;

    fn item(json: &str) -> Item {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn objects_are_named_by_stream_and_part_under_the_data_folder() {
        let data = data_prefix("/exports/orders/");
        assert_eq!(data, "exports/orders/data/");
        assert_eq!(data_prefix(""), "data/");
        assert_eq!(
            object_key(&data, &segment_stream(3), 42),
            "exports/orders/data/seg-0003-part-000042.json.gz"
        );
        // The same page re-read after a crash lands in the same object.
        assert_eq!(
            object_key(&data, &segment_stream(3), 42),
            object_key(&data, &segment_stream(3), 42)
        );
        let a = export_stream("AWSDynamoDB/0170-ab/data/k3x9 q.json.gz");
        assert!(a.starts_with("exp-k3x9_q-"), "{a}");
        assert_eq!(a.len(), "exp-k3x9_q-".len() + 8);
        // Same name, other folder: another stream.
        assert_ne!(a, export_stream("other/data/k3x9 q.json.gz"));
    }

    #[test]
    fn an_object_is_gzip_dynamodb_json_one_item_a_line() {
        let items = [
            item(
                r#"{"PK":{"S":"a"},"n":{"N":"1.50"},"b":{"B":"AAEC"},"m":{"M":{"l":{"L":[{"NULL":true},{"BOOL":false}]}}}}"#,
            ),
            item(
                r#"{"PK":{"S":"b"},"ss":{"SS":["x","y"]},"ns":{"NS":["1","2"]},"bs":{"BS":["AQ=="]}}"#,
            ),
        ];
        let mut o = ObjectBuilder::new();
        for i in &items {
            o.add(i);
        }
        assert_eq!(o.items(), 2);
        let raw = o.raw_bytes();
        let gz = o.finish();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text.len() as u64, raw);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with(r#"{"Item":{"#), "{}", lines[0]);
        assert!(lines[0].contains(r#""n":{"N":"1.50"}"#), "numbers as text");
        for (line, want) in lines.iter().zip(&items) {
            #[derive(serde::Deserialize)]
            struct Wrapped {
                #[serde(rename = "Item")]
                item: Item,
            }
            let back: Wrapped = serde_json::from_str(line).unwrap();
            assert_eq!(&back.item, want);
        }
        // An empty object is a valid gzip file of nothing.
        let mut empty = String::new();
        flate2::read::GzDecoder::new(&ObjectBuilder::new().finish()[..])
            .read_to_string(&mut empty)
            .unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn what_the_import_would_skip_is_refused_with_a_reason() {
        let plan = Plan::parse(
            "[source]\ntable = \"a\"\npartition_key = \"PK\"\n\
             [target]\ntable = \"b\"\npartition_key = \"PK\"\n\
             [[target.index]]\nname = \"G\"\npartition_key = \"GPK\"\nsort_key = \"GSK:N\"\n\
             [[rule]]\nname = \"x\"\n",
            Path::new("p.toml"),
        )
        .unwrap();
        let why = |json: &str| import_refusal(&plan, &item(json));
        assert_eq!(
            why(r#"{"PK":{"S":"a"},"GPK":{"S":"g"},"GSK":{"N":"1"}}"#),
            None
        );
        assert_eq!(why(r#"{"PK":{"S":"a"}}"#), None, "not in the index");
        let wrong = why(r#"{"PK":{"S":"a"},"GSK":{"S":"1"}}"#).unwrap();
        assert_eq!(
            wrong,
            "index `G` key `GSK` is S, the index declares N: DynamoDB's import would skip the item"
        );
        assert!(
            why(r#"{"PK":{"S":"a"},"GPK":{"S":""}}"#)
                .unwrap()
                .contains("0 bytes (1 to 2048)")
        );
        let big = why(r#"{"PK":{"S":"a"},"v":{"N":"1E+200"}}"#).unwrap();
        assert!(big.contains("out of DynamoDB's number range"), "{big}");
    }

    #[test]
    fn the_estimate_warns_past_half_the_retention() {
        let gib = 1024 * 1024 * 1024;
        let small = Estimate::of(gib, 1_000_000, None);
        assert_eq!(small.read, Duration::from_secs(100));
        assert_eq!(small.import, IMPORT_SETUP + Duration::from_secs(256));
        assert!(!small.risks_retention());
        // 200 GiB at 1,000 RCU/s: 7.3 h of reads, 14.4 h of import.
        let big = Estimate::of(200 * gib, 200_000_000, Some(1000.0));
        assert!(
            (big.read.as_secs_f64() / 3600.0 - 7.28).abs() < 0.01,
            "{big:?}"
        );
        assert!(big.risks_retention());
        assert_eq!(show_duration(Duration::from_secs(95 * 60)), "95 min");
        assert_eq!(show_duration(big.total()), "21.7 h");
    }
}
