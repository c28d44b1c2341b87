//! stdout, in one place: every byte rekey prints there (reports, `--json`
//! documents and event lines) goes through these functions, which return the
//! write's error instead of panicking as `println!` does.
//!
//! A closed stdout (`rekey status PLAN | head -1`) is not a failure: the write
//! fails with [`io::ErrorKind::BrokenPipe`], the error propagates like any
//! other, and `main` recognises it with [`is_closed`] and exits quietly with
//! status 0 (ripgrep's approach). A write error is marked as stdout's, so a
//! broken pipe met elsewhere (a connection to AWS) is never taken for it.
//!
//! Each call writes its text whole and flushes, so a report is either printed
//! or its error returned, and lines from the progress events (another
//! thread) never interleave with it.

use std::io::{self, Write as _};

use serde::Serialize;

/// Marks an I/O error as a failed write to stdout (the `io::Error` keeps the
/// original kind; its source is the original error).
#[derive(Debug)]
struct StdoutError(io::Error);

impl std::fmt::Display for StdoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cannot write to stdout")
    }
}

impl std::error::Error for StdoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// `text` as it is.
pub fn text(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| io::Error::new(e.kind(), StdoutError(e)))
}

/// `line` and a newline.
pub fn line(line: &str) -> io::Result<()> {
    text(&format!("{line}\n"))
}

/// A `--json` document: pretty-printed, then a newline.
pub fn json<T: Serialize>(value: &T) -> io::Result<()> {
    line(&serde_json::to_string_pretty(value)?)
}

/// The last line of a `--json` event stream: the report on one line, marked
/// `"event": "done"`.
pub(crate) fn json_done<T: Serialize>(report: &T) -> io::Result<()> {
    let mut v = serde_json::to_value(report)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("event".into(), "done".into());
    }
    line(&v.to_string())
}

/// Whether `err` is a write to stdout that failed because its reader went
/// away: the process then exits quietly, with status 0.
pub fn is_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<io::Error>().is_some_and(|e| {
            e.kind() == io::ErrorKind::BrokenPipe
                && e.get_ref().is_some_and(|inner| inner.is::<StdoutError>())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdout_error(kind: io::ErrorKind) -> io::Error {
        io::Error::new(kind, StdoutError(io::Error::from(kind)))
    }

    #[test]
    fn only_a_broken_pipe_on_stdout_counts_as_closed() {
        let closed = anyhow::Error::from(stdout_error(io::ErrorKind::BrokenPipe));
        assert!(is_closed(&closed));
        assert!(is_closed(&closed.context("printing the report")));
        // Elsewhere (a socket to AWS), a broken pipe is a failure like any other.
        let socket = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(!is_closed(&socket));
        // stdout, but full: a failure, shown with its cause.
        let full = anyhow::Error::from(stdout_error(io::ErrorKind::StorageFull));
        assert!(!is_closed(&full));
        assert_eq!(
            format!("{full:#}"),
            format!(
                "cannot write to stdout: {}",
                io::Error::from(io::ErrorKind::StorageFull)
            )
        );
    }
}
