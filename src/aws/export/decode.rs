//! A data file's bytes turned into items: gzip, lines, DynamoDB JSON, then
//! the checks that prove the file whole.
//!
//! This runs on a blocking thread (gzip and JSON are CPU work, and the S3
//! body arrives through [`ChunkReader`]) and sends the parsed lines into a
//! bounded channel, so memory stays bounded whatever the file's size. Lines
//! go in batches ([`lines_channel`]): a message, and a wake-up of the
//! consumer's thread, per line was about a tenth of an export's read time. The MD5 is taken of the compressed bytes as they go by, so the
//! checksum costs no second read; it and the line count are known only at the
//! end, which is why they are errors after the lines were sent.

use std::io::{self, BufRead, BufReader, Read};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest as _, Md5};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::core::itemline::parse_line;
use crate::core::value::Item;

use super::error::ExportError;

/// One line of a data file.
#[derive(Debug)]
pub struct ExportLine {
    /// 1-based line number in the (decompressed) data file.
    pub line: u64,
    /// The item, or why the line is not one.
    pub item: Result<Item, String>,
}

/// The most lines in one message. Batches start at one line and double up
/// to this, so a file's first lines reach the consumer at once.
const MAX_BATCH: usize = 256;

/// A channel of [`ExportLine`]s holding about `lines` lines (at least one
/// batch of up to [`MAX_BATCH`]), sent and received in batches.
pub fn lines_channel(lines: usize) -> (LineSender, LineReceiver) {
    let (tx, rx) = mpsc::channel(lines.div_ceil(MAX_BATCH).max(1));
    (
        LineSender {
            tx,
            batch: Vec::new(),
            size: 1,
        },
        LineReceiver {
            rx,
            batch: Vec::new().into_iter(),
        },
    )
}

/// The decoder's end of [`lines_channel`].
pub struct LineSender {
    tx: mpsc::Sender<Vec<ExportLine>>,
    batch: Vec<ExportLine>,
    size: usize,
}

impl LineSender {
    /// Queues `line`, sending the batch when full; Err when the receiver is
    /// gone, with the first line that did not reach it.
    fn push(&mut self, line: ExportLine) -> Result<(), u64> {
        self.batch.push(line);
        if self.batch.len() >= self.size {
            self.size = (self.size * 2).min(MAX_BATCH);
            return self.flush();
        }
        Ok(())
    }

    /// Sends what is queued (from a blocking thread).
    fn flush(&mut self) -> Result<(), u64> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let first = batch[0].line;
        self.tx.blocking_send(batch).map_err(|_| first)
    }
}

/// The consumer's end of [`lines_channel`]: one line at a time.
pub struct LineReceiver {
    rx: mpsc::Receiver<Vec<ExportLine>>,
    batch: std::vec::IntoIter<ExportLine>,
}

impl LineReceiver {
    /// The next line, or None once the sender is gone and every line taken.
    pub async fn recv(&mut self) -> Option<ExportLine> {
        loop {
            if let Some(line) = self.batch.next() {
                return Some(line);
            }
            self.batch = self.rx.recv().await?.into_iter();
        }
    }
}

/// What [`ExportReader::read_file`](super::ExportReader::read_file) found in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSummary {
    /// Lines in the whole file, skipped ones included.
    pub lines: u64,
    /// Lines sent as `Err` (skipped lines are not parsed, so not counted).
    pub malformed: u64,
}

/// What [`decode_lines`] needs to know of the file it reads.
pub(super) struct FileCtx {
    /// For messages: `s3://bucket/key` or a path.
    pub(super) name: String,
    /// Lines the manifest says the file has.
    pub(super) expected: u64,
    /// Lines to pass over without parsing or sending them (a resume).
    pub(super) skip: u64,
    /// The manifest's `md5Checksum`, when it is to be checked.
    pub(super) md5: Option<String>,
}

impl FileCtx {
    fn io(&self, source: io::Error) -> ExportError {
        ExportError::Io {
            path: self.name.clone(),
            source,
        }
    }
}

/// The result of a blocking decode; its panic, if it panicked.
pub(super) async fn join_blocking(
    task: tokio::task::JoinHandle<Result<FileSummary, ExportError>>,
) -> Result<FileSummary, ExportError> {
    match task.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ExportError::Io {
            path: String::new(),
            source: io::Error::other(e),
        }),
    }
}

/// Decompresses, splits and parses a data file on the current (blocking)
/// thread, sending each line after the first `ctx.skip` to `tx`.
pub(super) fn decode_lines<R: Read>(
    raw: R,
    ctx: &FileCtx,
    tx: &mut LineSender,
) -> Result<FileSummary, ExportError> {
    let mut compressed = BufReader::with_capacity(
        64 * 1024,
        HashingReader {
            inner: raw,
            md5: Md5::new(),
        },
    );
    let mut summary = FileSummary {
        lines: 0,
        malformed: 0,
    };
    // DynamoDB writes an empty file for an empty partition: no gzip header.
    if !compressed.fill_buf().map_err(|e| ctx.io(e))?.is_empty() {
        let text = flate2::bufread::MultiGzDecoder::new(&mut compressed);
        send_lines(text, ctx, tx, &mut summary)?;
    }
    // Hash whatever the decoder left unread (normally nothing).
    io::copy(&mut compressed, &mut io::sink()).map_err(|e| ctx.io(e))?;
    check_whole(ctx, summary.lines, compressed.into_inner().md5)?;
    Ok(summary)
}

/// Splits the decompressed `text` into lines and sends each one after the
/// first `ctx.skip`, parsed, counting lines and malformed ones in `summary`.
/// The lines before a failure are sent before it is returned.
fn send_lines(
    text: impl Read,
    ctx: &FileCtx,
    tx: &mut LineSender,
    summary: &mut FileSummary,
) -> Result<(), ExportError> {
    let result = read_lines(text, ctx, tx, summary);
    let flushed = tx.flush();
    result?;
    flushed.map_err(|line| closed(ctx, line))
}

fn closed(ctx: &FileCtx, first_unsent: u64) -> ExportError {
    ExportError::Closed {
        file: ctx.name.clone(),
        line: first_unsent - 1,
    }
}

fn read_lines(
    text: impl Read,
    ctx: &FileCtx,
    tx: &mut LineSender,
    summary: &mut FileSummary,
) -> Result<(), ExportError> {
    let mut text = BufReader::with_capacity(64 * 1024, text);
    let mut buf = Vec::with_capacity(4096);
    loop {
        buf.clear();
        if text.read_until(b'\n', &mut buf).map_err(|e| ctx.io(e))? == 0 {
            return Ok(());
        }
        summary.lines += 1;
        if summary.lines <= ctx.skip {
            continue;
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        let item = match std::str::from_utf8(&buf) {
            Ok(s) if s.trim().is_empty() => Err("empty line".to_string()),
            Ok(s) => parse_export_line(s),
            Err(e) => Err(format!("not UTF-8: {e}")),
        };
        if item.is_err() {
            summary.malformed += 1;
        }
        let line = summary.lines;
        tx.push(ExportLine { line, item })
            .map_err(|first| closed(ctx, first))?;
    }
}

/// At the end of the file: its MD5 (of the compressed bytes, `md5`) and its
/// line count are the manifest's, and a resume did not skip past its end.
fn check_whole(ctx: &FileCtx, lines: u64, md5: Md5) -> Result<(), ExportError> {
    if let Some(expected) = &ctx.md5 {
        let digest = md5.finalize();
        let b64 = BASE64.encode(digest.as_slice());
        if *expected != b64 && !expected.eq_ignore_ascii_case(&to_hex(digest.as_slice())) {
            return Err(ExportError::Checksum {
                file: ctx.name.clone(),
                expected: expected.clone(),
                got: b64,
            });
        }
    }
    if ctx.skip > lines {
        return Err(ExportError::SkipPastEnd {
            file: ctx.name.clone(),
            skip: ctx.skip,
            lines,
        });
    }
    if lines != ctx.expected {
        return Err(ExportError::CountMismatch {
            file: ctx.name.clone(),
            expected: ctx.expected,
            got: lines,
        });
    }
    Ok(())
}

#[derive(Deserialize)]
struct WrappedItem {
    #[serde(rename = "Item")]
    item: Item,
}

/// [`parse_line`], but a bad `{"Item":…}` line is explained as such:
/// `parse_line` falls back to reading a bare item and would report that
/// `Item` is not a type tag instead of what is wrong inside the item.
fn parse_export_line(s: &str) -> Result<Item, String> {
    match parse_line(s) {
        Err(_) if s.trim_start().starts_with("{\"Item\"") => serde_json::from_str::<WrappedItem>(s)
            .map(|w| w.item)
            .map_err(|e| e.to_string()),
        result => result,
    }
}

/// MD5 of everything read through it.
struct HashingReader<R> {
    inner: R,
    md5: Md5,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.md5.update(&buf[..n]);
        Ok(n)
    }
}

/// A blocking `Read` over chunks sent from an async task: the bridge from an
/// S3 `ByteStream` to the (synchronous) gzip decoder. End of input when the
/// sender is dropped; an `Err` chunk is a read error.
pub(super) struct ChunkReader<B> {
    rx: mpsc::Receiver<Result<B, String>>,
    current: Option<B>,
    pos: usize,
}

impl<B> ChunkReader<B> {
    pub(super) fn new(rx: mpsc::Receiver<Result<B, String>>) -> Self {
        ChunkReader {
            rx,
            current: None,
            pos: 0,
        }
    }
}

impl<B: AsRef<[u8]>> Read for ChunkReader<B> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some(chunk) = &self.current {
                let rest = &chunk.as_ref()[self.pos..];
                if !rest.is_empty() {
                    let n = rest.len().min(buf.len());
                    buf[..n].copy_from_slice(&rest[..n]);
                    self.pos += n;
                    return Ok(n);
                }
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.current = Some(chunk);
                    self.pos = 0;
                }
                Some(Err(msg)) => return Err(io::Error::other(msg)),
                None => return Ok(0),
            }
        }
    }
}

/// Lower-case hex of `bytes`: an MD5 as S3 ETags write it, which
/// `md5Checksum` is also accepted as.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
