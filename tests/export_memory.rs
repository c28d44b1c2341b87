//! Streaming a large data file keeps memory flat. Alone in its test binary
//! (so in its own process) because it measures the process's peak RSS.

mod export_support;

use std::time::Instant;

use export_support::*;
use rekey::aws::export::{ExportLine, ExportLocation, ExportReader};
use rekey::core::value::{Item, Value};
use rekey_testkit::export::write_export;

const ITEMS: u64 = 200_000;
/// Holding the file's items would take well over 100 MB (200k items with a
/// 200-byte string each); streaming needs a few buffers.
const MAX_GROWTH_KB: u64 = 48 * 1024;

fn big_item(i: u64) -> Item {
    let mut m = Item::new();
    m.insert("pk".into(), Value::S(format!("customer#{i:08}")));
    m.insert("sk".into(), Value::N(format!("{}", i * 7919)));
    m.insert("payload".into(), Value::S(format!("{i:0>200}")));
    m
}

fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resets the peak RSS to the current RSS; false if the kernel cannot.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Streams the file, counting lines without keeping them; returns
/// (lines, peak RSS growth in KiB).
async fn stream_count(
    reader: &ExportReader,
    manifest: &rekey::aws::export::Manifest,
) -> (u64, u64) {
    let before = status_kb("VmRSS:");
    let reset = reset_peak();
    let base = if reset { before } else { status_kb("VmHWM:") };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<ExportLine>(256);
    let count = async {
        let (mut n, mut last) = (0u64, 0u64);
        while let Some(line) = rx.recv().await {
            assert!(line.item.is_ok(), "line {}", line.line);
            assert_eq!(line.line, last + 1);
            last = line.line;
            n += 1;
        }
        n
    };
    let (summary, n) = tokio::join!(reader.read_file(&manifest.files[0], 0, tx), count);
    let summary = summary.unwrap();
    assert_eq!((summary.lines, summary.malformed), (ITEMS, 0));
    (n, status_kb("VmHWM:").saturating_sub(base))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200k_item_file_streams_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let written = write_export(
        dir.path(),
        "01-big",
        TABLE_ARN,
        (0..ITEMS).map(big_item),
        1,
        1_767_225_600_000,
    )
    .unwrap();
    let gz_bytes = std::fs::metadata(dir.path().join(&written.files[0].key))
        .unwrap()
        .len();
    eprintln!(
        "wrote {ITEMS} items ({gz_bytes} bytes gzip) in {:?}",
        t.elapsed()
    );

    let (reader, manifest) = ExportReader::open(ExportLocation::Local(dir.path().into()), None)
        .await
        .unwrap();
    let t = Instant::now();
    let (n, growth) = stream_count(&reader, &manifest).await;
    eprintln!(
        "local: {n} lines in {:?}, peak RSS +{growth} KiB",
        t.elapsed()
    );
    assert_eq!(n, ITEMS);
    assert!(
        growth < MAX_GROWTH_KB,
        "local read grew peak RSS by {growth} KiB"
    );

    let client = bucket("big").await;
    upload_dir(&client, "big", "exports", dir.path()).await;
    let (reader, manifest) = ExportReader::open(
        ExportLocation::parse("s3://big/exports").unwrap(),
        Some(client),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let (n, growth) = stream_count(&reader, &manifest).await;
    eprintln!("s3: {n} lines in {:?}, peak RSS +{growth} KiB", t.elapsed());
    assert_eq!(n, ITEMS);
    assert!(
        growth < MAX_GROWTH_KB,
        "S3 read grew peak RSS by {growth} KiB"
    );
}
