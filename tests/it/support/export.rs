//! DynamoDB exports for the export and backfill tests: buckets on the
//! shared local server, uploads, sample items of every type, draining
//! `read_file`, and edits of an export written by `rekey_testkit::export`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use aws_sdk_s3::primitives::ByteStream;
use base64::Engine as _;
use rekey::aws::export::{
    DataFile, ExportError, ExportLine, ExportReader, FileSummary, S3Client, lines_channel,
};
use rekey::aws::{Endpoint, Service, Source};
use rekey::core::value::{Item, Value};

pub const TABLE_ARN: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/Orders";

/// A client for the shared local server (as rekey's export reader takes it),
/// and a new bucket on it.
pub async fn bucket(name: &str) -> S3Client {
    let url = super::shared_server().await.endpoint();
    let client = super::client::s3(url).await;
    client
        .create_bucket()
        .bucket(name)
        .send()
        .await
        .expect("create bucket");
    S3Client {
        client,
        endpoint: Endpoint {
            service: Service::S3,
            url: url.to_string(),
            source: Source::Client,
        }
        .into(),
    }
}

/// Uploads every file under `dir` to `bucket` under `prefix` (may be empty).
pub async fn upload_dir(s3: &S3Client, bucket: &str, prefix: &str, dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let key = if prefix.is_empty() {
                rel
            } else {
                format!("{prefix}/{rel}")
            };
            s3.client
                .put_object()
                .bucket(bucket)
                .key(&key)
                .body(ByteStream::from(std::fs::read(&path).unwrap()))
                .send()
                .await
                .unwrap_or_else(|e| panic!("upload {key}: {}", rekey::aws::error_chain(&e)));
        }
    }
}

/// An item with every DynamoDB type, nested maps and lists, numbers of 38
/// digits, binary that is not UTF-8 and strings that need JSON escapes.
pub fn item(i: usize) -> Item {
    let s = |x: &str| Value::S(x.to_string());
    let n = |x: &str| Value::N(x.to_string());
    let mut inner = Item::new();
    inner.insert(
        "deep".into(),
        Value::L(vec![
            n("0.000000000000000000000000000000000001"),
            Value::Null,
            Value::M(Item::new()),
            Value::L(vec![]),
        ]),
    );
    inner.insert(
        "bytes".into(),
        Value::B((0..=255u8).rev().take(17 + i % 5).collect()),
    );
    let mut m = Item::new();
    m.insert("pk".into(), s(&format!("user#{i:06}")));
    m.insert("sk".into(), n(&i.to_string()));
    m.insert(
        "big".into(),
        n(&format!(
            "-1234567890123456789012345678901234.{:04}",
            i % 10_000
        )),
    );
    m.insert(
        "huge".into(),
        n("98765432109876543210987654321098765432E+50"),
    );
    m.insert("tiny".into(), n("1.5E-130"));
    m.insert(
        "bin".into(),
        Value::B(vec![0, 0xff, b'\n', b'\r', i as u8, 0x80, 0xc3]),
    );
    m.insert(
        "text".into(),
        s(&format!("line one\nline \"two\"\t\\ ünïcødé 🦀 #{i}")),
    );
    m.insert("empty".into(), s(""));
    m.insert(
        "ss".into(),
        Value::Ss(vec!["b".into(), "a\nz".into(), format!("v{i}")]),
    );
    m.insert(
        "ns".into(),
        Value::Ns(vec![
            "3".into(),
            "-12345678901234567890123456789012.345678".into(),
            "1E+125".into(),
        ]),
    );
    m.insert(
        "bs".into(),
        Value::Bs(vec![vec![1, 2, 3], vec![0xfe, 0xff], vec![i as u8]]),
    );
    m.insert("flag".into(), Value::Bool(i.is_multiple_of(2)));
    m.insert("nothing".into(), Value::Null);
    m.insert(
        "map".into(),
        Value::M({
            let mut mm = Item::new();
            mm.insert("inner".into(), Value::M(inner));
            mm.insert(
                "list".into(),
                Value::L(vec![
                    s("x"),
                    n("42"),
                    Value::Bool(false),
                    Value::Ss(vec!["only".into()]),
                ]),
            );
            mm
        }),
    );
    m.insert(
        "list".into(),
        Value::L(vec![
            Value::M(Item::new()),
            Value::L(vec![Value::Null, n("-0")]),
        ]),
    );
    m
}

pub fn items(n: usize) -> Vec<Item> {
    (0..n).map(item).collect()
}

/// DynamoDB JSON text of an item: equal text means nothing was lost.
pub fn json(item: &Item) -> String {
    serde_json::to_string(item).unwrap()
}

/// The items `write_export` put in data file `f` of `files`, in order.
pub fn expected_in_file(all: &[Item], f: usize, files: usize) -> Vec<String> {
    all.iter()
        .enumerate()
        .filter(|(i, _)| i % files == f)
        .map(|(_, it)| json(it))
        .collect()
}

/// Runs `read_file` while draining its channel (capacity 16).
pub async fn read_all(
    reader: &ExportReader,
    file: &DataFile,
    skip: u64,
) -> (Vec<ExportLine>, Result<FileSummary, ExportError>) {
    let (tx, mut rx) = lines_channel(16);
    let collect = async {
        let mut lines = Vec::new();
        while let Some(l) = rx.recv().await {
            lines.push(l);
        }
        lines
    };
    let (summary, lines) = tokio::join!(reader.read_file(file, skip, tx), collect);
    (lines, summary)
}

/// Rewrites data file `key` (relative to `dir`) line by line with `edit`, and
/// fixes its MD5 in manifest-files.json so that only the content changes.
pub fn rewrite_data_file(
    dir: &Path,
    export_id: &str,
    key: &str,
    edit: impl Fn(u64, String) -> String,
) {
    let path = dir.join(key);
    let text = BufReader::new(flate2::read::MultiGzDecoder::new(
        std::fs::File::open(&path).unwrap(),
    ));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for (i, line) in text.lines().enumerate() {
        writeln!(gz, "{}", edit(i as u64 + 1, line.unwrap())).unwrap();
    }
    let bytes = gz.finish().unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let md5 = base64::engine::general_purpose::STANDARD.encode(md5_of(&bytes));
    edit_files_manifest(dir, export_id, |v| {
        if v["dataFileS3Key"] == key {
            v["md5Checksum"] = md5.clone().into();
        }
    });
}

pub fn md5_of(bytes: &[u8]) -> Vec<u8> {
    use md5::Digest as _;
    md5::Md5::digest(bytes).to_vec()
}

pub fn edit_files_manifest(dir: &Path, export_id: &str, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join(format!("AWSDynamoDB/{export_id}/manifest-files.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        edit(&mut v);
        out.push_str(&v.to_string());
        out.push('\n');
    }
    std::fs::write(&path, out).unwrap();
}

pub fn edit_summary(dir: &Path, export_id: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(format!("AWSDynamoDB/{export_id}/manifest-summary.json"));
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}
