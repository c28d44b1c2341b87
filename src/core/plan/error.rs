//! How a plan's problems are reported: each at its `file:line:col`, all of
//! them at once.
//!
//! An operator fixing a plan should see every mistake in one run, not one per
//! run, so no check stops at the first error: each reports to [`Cx`] and goes
//! on with a stand-in value. Positions are in characters, not bytes, so that
//! they match what an editor shows for a line with `é` in it.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::core::template::SyntaxError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    pub path: PathBuf,
    /// 1-based line and column (in characters); None when the file could not be read.
    pub position: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => {
                write!(f, "{}:{line}:{col}: {}", self.path.display(), self.message)
            }
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

/// All the problems found in one plan file. Callers branch on this type to
/// choose exit code 2 (bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PlanErrors(pub Vec<PlanError>);

impl fmt::Display for PlanErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = &src[..src.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The plan's text and the errors found in it so far. Every check of
/// `validate` and `rule` is a method on it, so that each can report and go on.
pub(super) struct Cx<'a> {
    pub(super) src: &'a str,
    pub(super) path: &'a Path,
    pub(super) errors: Vec<PlanError>,
}

impl Cx<'_> {
    pub(super) fn error(&mut self, offset: usize, message: impl Into<String>) {
        let position = Some(line_col(self.src, offset));
        self.errors.push(PlanError {
            path: self.path.to_path_buf(),
            position,
            message: message.into(),
        });
    }

    /// Offset in the file of byte `inner` of a string value whose span is `span`.
    /// Exact for plain one-line strings; otherwise the string's start.
    pub(super) fn inner_offset(&self, span: Range<usize>, text: &str, inner: usize) -> usize {
        let raw = self.src.get(span.clone()).unwrap_or("");
        let body = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
        if body == text && raw.len() >= 2 && !raw.starts_with("\"\"\"") && !raw.starts_with("'''") {
            span.start + 1 + inner
        } else {
            span.start
        }
    }

    pub(super) fn syntax(&mut self, span: Range<usize>, text: &str, e: SyntaxError) {
        let at = self.inner_offset(span, text, e.offset);
        self.error(at, e.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncdé f", 0), (1, 1));
        assert_eq!(line_col("ab\ncdé f", 3), (2, 1));
        assert_eq!(line_col("ab\ncdé f", 7), (2, 4)); // after the two-byte é
    }
}
