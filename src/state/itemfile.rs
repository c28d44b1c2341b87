//! Items from DynamoDB JSON files: sample files for `rekey check`, and the
//! line format S3 exports use.
//!
//! Accepted, detected from the content:
//! * one item per line, bare (`{"PK":{"S":"a"}}`) or wrapped as exports write
//!   it (`{"Item":{"PK":{"S":"a"}}}`); blank lines are ignored;
//! * the output of `aws dynamodb scan` (`{"Items":[…], "Count": …}`), which is
//!   one pretty-printed document.
//!
//! A bad line is an error for that line only, with its number; the rest is read.
//! A line is read by [`parse_line`], the pure parser the export reader uses too.

use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;

use crate::core::itemline::parse_line;
use crate::core::value::Item;

#[derive(Deserialize)]
struct ScanOutput {
    #[serde(rename = "Items")]
    items: Vec<Item>,
}

/// One item read from a file, or why its line could not be read.
pub struct Entry {
    /// 1-based line number; for scan output, the item's 1-based position in `Items`.
    pub line: usize,
    pub item: Result<Item, String>,
}

/// Read a whole sample file. Sample files are small; exports stream through
/// [`parse_line`] instead.
pub fn read_file(path: &Path) -> anyhow::Result<Vec<Entry>> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| BufReader::new(f).read_to_string(&mut text))
        .with_context(|| format!("cannot read {}", path.display()))?;
    if text.trim_start().starts_with('{') && !text.trim().contains('\n')
        || looks_line_delimited(&text)
    {
        return Ok(text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| Entry {
                line: i + 1,
                item: parse_line(l),
            })
            .collect());
    }
    let scan: ScanOutput = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: neither one DynamoDB JSON item per line nor `aws dynamodb scan` output",
            path.display()
        )
    })?;
    Ok(scan
        .items
        .into_iter()
        .enumerate()
        .map(|(i, item)| Entry {
            line: i + 1,
            item: Ok(item),
        })
        .collect())
}

/// Line-delimited when the first non-empty line is a whole JSON object.
fn looks_line_delimited(text: &str) -> bool {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.is_object()))
}

/// Stream items from any reader of line-delimited DynamoDB JSON.
#[cfg(test)]
pub(crate) fn lines<R: Read>(r: R) -> impl Iterator<Item = Entry> {
    use std::io::BufRead as _;
    BufReader::new(r)
        .lines()
        .enumerate()
        .filter_map(|(i, l)| match l {
            Ok(l) if l.trim().is_empty() => None,
            Ok(l) => Some(Entry {
                line: i + 1,
                item: parse_line(&l),
            }),
            Err(e) => Some(Entry {
                line: i + 1,
                item: Err(e.to_string()),
            }),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_bare_wrapped_and_scan_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        std::fs::write(
            &p,
            "{\"PK\":{\"S\":\"a\"}}\n\n{\"Item\":{\"PK\":{\"S\":\"b\"}}}\n{\"PK\":{\"Q\":\"c\"}}\n",
        )
        .unwrap();
        let e = read_file(&p).unwrap();
        assert_eq!(e.len(), 3);
        assert!(e[0].item.is_ok() && e[1].item.is_ok());
        assert_eq!(e[2].line, 4);
        assert!(
            e[2].item
                .as_ref()
                .unwrap_err()
                .contains("unknown DynamoDB type tag `Q`")
        );

        let p = dir.path().join("scan.json");
        let mut f = std::fs::File::create(&p).unwrap();
        writeln!(f, "{{\n  \"Items\": [\n    {{\"PK\": {{\"S\": \"x\"}}}},\n    {{\"PK\": {{\"N\": \"1\"}}}}\n  ],\n  \"Count\": 2,\n  \"ScannedCount\": 2\n}}").unwrap();
        let e = read_file(&p).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].line, 2);
    }

    #[test]
    fn streams_lines_with_numbers() {
        let data = b"{\"Item\":{\"a\":{\"S\":\"1\"}}}\nnot json\n";
        let v: Vec<Entry> = lines(&data[..]).collect();
        assert_eq!(v.len(), 2);
        assert!(v[0].item.is_ok());
        assert_eq!(v[1].line, 2);
        assert!(v[1].item.is_err());
    }
}
