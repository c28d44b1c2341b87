//! Writes DynamoDB S3 exports for tests and benchmarks: the layout, manifests
//! and data files `rekey::aws::export::ExportReader` reads, as DynamoDB writes them.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest as _, Md5};
use rekey::aws::export::{
    DataFile, EXPORTS_DIR, FILES_MANIFEST, Manifest, SUMMARY_FILE, format_rfc3339_ms, to_hex,
};
use rekey::core::value::Item;

/// Writes a valid full export of `items` into `dir` in the local layout
/// (`dir/AWSDynamoDB/<export_id>/…`, as if exported with no prefix to bucket
/// `rekey-test-export`) and returns its [`Manifest`], as
/// `ExportReader::open` would read it.
///
/// Item `i` goes to data file `i % files`, so a file's items keep their
/// relative order. A file that gets no item is written as an empty gzip
/// stream. Everything is streamed: `items` may be long.
pub fn write_export(
    dir: &Path,
    export_id: &str,
    table_arn: &str,
    items: impl Iterator<Item = Item>,
    files: usize,
    export_time_ms: i64,
) -> io::Result<Manifest> {
    if files == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "files must be at least 1",
        ));
    }
    if export_id.is_empty() || export_id.contains(['/', '\\']) || export_id.starts_with('.') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{export_id}` cannot be an export id"),
        ));
    }
    let rel_dir = format!("{EXPORTS_DIR}/{export_id}");
    let export_dir = dir.join(&rel_dir);
    std::fs::create_dir_all(export_dir.join("data"))?;
    std::fs::write(export_dir.join("_started"), b"")?;

    struct Out {
        key: String,
        gz: flate2::write::GzEncoder<HashingWriter<BufWriter<std::fs::File>>>,
        count: u64,
    }
    let mut outs = Vec::with_capacity(files);
    for i in 0..files {
        let key = format!("{rel_dir}/data/{}.json.gz", file_name(export_id, i));
        let f = std::fs::File::create(dir.join(&key))?;
        let w = HashingWriter {
            inner: BufWriter::with_capacity(64 * 1024, f),
            md5: Md5::new(),
        };
        outs.push(Out {
            key,
            gz: flate2::write::GzEncoder::new(w, flate2::Compression::fast()),
            count: 0,
        });
    }
    let mut billed = 0u64;
    let mut line = Vec::with_capacity(1024);
    for (i, item) in items.enumerate() {
        line.clear();
        line.extend_from_slice(b"{\"Item\":");
        serde_json::to_writer(&mut line, &item)?;
        line.extend_from_slice(b"}\n");
        billed += line.len() as u64;
        let out = &mut outs[i % files];
        out.gz.write_all(&line)?;
        out.count += 1;
    }

    let mut data_files = Vec::with_capacity(files);
    let mut files_manifest = Vec::new();
    for out in outs {
        let mut w = out.gz.finish()?;
        w.inner.flush()?;
        let digest = w.md5.finalize();
        let md5 = BASE64.encode(digest.as_slice());
        serde_json::to_writer(
            &mut files_manifest,
            &serde_json::json!({
                "itemCount": out.count,
                "md5Checksum": md5,
                "etag": to_hex(digest.as_slice()),
                "dataFileS3Key": out.key,
            }),
        )?;
        files_manifest.push(b'\n');
        data_files.push(DataFile {
            key: out.key,
            item_count: out.count,
            md5: Some(md5),
        });
    }
    let files_key = format!("{rel_dir}/{FILES_MANIFEST}");
    std::fs::write(dir.join(&files_key), &files_manifest)?;

    let item_count: u64 = data_files.iter().map(|f| f.item_count).sum();
    let export_time = format_rfc3339_ms(export_time_ms);
    let export_arn = format!("{table_arn}/export/{export_id}");
    let summary = serde_json::json!({
        "version": "2020-06-30",
        "exportArn": export_arn,
        "startTime": export_time,
        "endTime": format_rfc3339_ms(export_time_ms + 60_000),
        "tableArn": table_arn,
        "tableId": "00000000-0000-0000-0000-000000000000",
        "exportTime": export_time,
        "s3Bucket": "rekey-test-export",
        "s3Prefix": null,
        "s3SseAlgorithm": "AES256",
        "s3SseKmsKeyId": null,
        "manifestFilesS3Key": files_key,
        "billedSizeBytes": billed,
        "itemCount": item_count,
        "outputFormat": "DYNAMODB_JSON",
        "exportType": "FULL_EXPORT",
    });
    std::fs::write(
        export_dir.join(SUMMARY_FILE),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    Ok(Manifest {
        export_id: export_id.to_string(),
        export_arn,
        export_time,
        export_time_epoch_ms: export_time_ms,
        item_count,
        table_arn: table_arn.to_string(),
        files: data_files,
        other_exports: Vec::new(),
    })
}

/// A data file name like DynamoDB's (26 lowercase base-32 characters),
/// derived from the export id and index, so names do not sort in manifest order.
fn file_name(export_id: &str, index: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    // FNV-1a, then splitmix64 steps for more characters.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in export_id.bytes().chain((index as u64).to_le_bytes()) {
        h = (h ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
    }
    let mut name = String::with_capacity(26);
    while name.len() < 26 {
        h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        for k in 0..12 {
            if name.len() < 26 {
                name.push(ALPHABET[((z >> (5 * k)) & 31) as usize] as char);
            }
        }
    }
    name
}

/// MD5 of everything written through it.
struct HashingWriter<W> {
    inner: W,
    md5: Md5,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.md5.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_look_like_dynamodbs() {
        let a = file_name("01-ab", 0);
        assert_eq!(a.len(), 26);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(&c))
        );
        assert_ne!(a, file_name("01-ab", 1));
    }
}
