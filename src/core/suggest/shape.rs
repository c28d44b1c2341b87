//! Key shapes from key values: the delimiter, literal and variable segments,
//! capture names, and which variables are times.
//!
//! Each value is split on a delimiter of its own, not its attribute's: a
//! single-table design keys `{day}|STORE|{store}` beside `DEVICE:{device}`,
//! and one delimiter for both would leave one shape a single variable. Of
//! `#`, `|`, `:`, `/`, a value splits on the one that leaves the most
//! upper-case words (`TENANT`, `STORE`: the single-table convention for plan
//! text), so `EVENT#2026-07-07T10:00` splits on `#`; then the most whole
//! times; then the one the most values of the attribute hold; then that order. A time's own `:`s
//! never split it (`READING:2026-07-07T10:00:00Z` is two segments).
//!
//! Values are grouped by delimiter and number of segments; in a group
//! a position is **literal** when it holds few distinct values
//! ([`LITERAL_MAX`]), each an upper-case word, or one lower-case word in
//! every value; otherwise it is **variable**. So a handful of tenants
//! (`acme`, `globex`) stay data, not plan text. Distinct values are counted
//! up to a cap, so memory stays bounded whatever the sample.

use std::collections::{BTreeSet, HashMap};

use crate::core::bucket::{BucketUnit, TimeInput, bucket};

/// The delimiters keys are split on, in order of preference.
pub const DELIMITERS: [char; 4] = ['#', '|', ':', '/'];
/// A position with more distinct values than this is variable.
pub const LITERAL_MAX: usize = 8;
/// Distinct values counted per variable (past it: "at least this many").
pub const DISTINCT_CAP: usize = 4096;
/// Pieces a time can be cut into by its `:`s (`HH:MM:SS+hh:mm`).
const TIME_PIECES: usize = 4;

/// One segment of a shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seg {
    Lit(String),
    Var,
}

/// The shape of one key value: its segments and what joins them. Two shapes
/// with the same segments but different delimiters are different shapes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyShape {
    pub segs: Vec<Seg>,
    /// None for a value of one segment.
    pub delimiter: Option<char>,
}

/// `value` split on `delimiter` (one segment when there is none), with a
/// time cut by it joined back whole.
pub fn split(value: &str, delimiter: Option<char>) -> Vec<&str> {
    let Some(d) = delimiter else {
        return vec![value];
    };
    let mut bounds = Vec::new();
    let mut start = 0;
    for (i, c) in value.char_indices() {
        if c == d {
            bounds.push((start, i));
            start = i + c.len_utf8();
        }
    }
    bounds.push((start, value.len()));
    let mut out = Vec::with_capacity(bounds.len());
    let mut i = 0;
    while i < bounds.len() {
        let (s, mut e) = bounds[i];
        let mut next = i + 1;
        if starts_with_date(&value[s..e]) && time_kind(&value[s..e]).is_none() {
            // The longest join that is a time: `…T10:00:00+02:00`, not `…T10:00`.
            if let Some(j) = (i + 1..bounds.len().min(i + TIME_PIECES))
                .rev()
                .find(|&j| time_kind(&value[s..bounds[j].1]).is_some())
            {
                e = bounds[j].1;
                next = j + 1;
            }
        }
        out.push(&value[s..e]);
        i = next;
    }
    out
}

/// `YYYY-`: a cheap test before parsing joins as times.
fn starts_with_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic() || c == '_')
}

fn is_upper_word(s: &str) -> bool {
    is_word(s) && !s.chars().any(|c| c.is_ascii_lowercase())
}

/// Per delimiter and number of segments, which positions are literal.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Values holding each of [`DELIMITERS`]: a value's tie-break.
    held: [u64; DELIMITERS.len()],
    literal: HashMap<(Option<char>, usize), Vec<bool>>,
}

#[derive(Default)]
struct Position {
    distinct: BTreeSet<String>,
    overflow: bool,
    words: bool,
    upper: bool,
}

impl Layout {
    /// Learn the layout of one attribute from its values.
    pub fn learn<'a>(values: impl Iterator<Item = &'a str> + Clone) -> Layout {
        let mut held = [0u64; DELIMITERS.len()];
        for v in values.clone() {
            for (n, d) in held.iter_mut().zip(DELIMITERS) {
                *n += u64::from(v.contains(d));
            }
        }
        let mut layout = Layout {
            held,
            literal: HashMap::new(),
        };
        let mut groups: HashMap<(Option<char>, usize), (u64, Vec<Position>)> = HashMap::new();
        for v in values {
            let (delimiter, segs) = layout.split(v);
            let (count, positions) = groups.entry((delimiter, segs.len())).or_insert_with(|| {
                (
                    0,
                    (0..segs.len())
                        .map(|_| Position {
                            words: true,
                            upper: true,
                            ..Position::default()
                        })
                        .collect(),
                )
            });
            *count += 1;
            for (p, s) in positions.iter_mut().zip(&segs) {
                p.words &= is_word(s);
                p.upper &= is_upper_word(s);
                if !p.overflow && !p.distinct.contains(*s) {
                    if p.distinct.len() == LITERAL_MAX {
                        p.overflow = true;
                    } else {
                        p.distinct.insert((*s).to_string());
                    }
                }
            }
        }
        layout.literal = groups
            .into_iter()
            .map(|(group, (count, positions))| {
                let lit = positions
                    .iter()
                    .map(|p| {
                        let n = p.distinct.len() as u64;
                        !p.overflow
                            && ((p.upper && (n == 1 || count >= 2 * n))
                                || (p.words && n == 1 && count >= 2))
                    })
                    .collect();
                (group, lit)
            })
            .collect();
        layout
    }

    /// Whether any value splits into more than one segment.
    pub fn has_delimiter(&self) -> bool {
        self.literal.keys().any(|(d, _)| d.is_some())
    }

    /// `value`'s delimiter (None when no split leaves two segments) and its segments.
    pub fn split<'v>(&self, value: &'v str) -> (Option<char>, Vec<&'v str>) {
        DELIMITERS
            .iter()
            .zip(self.held)
            .enumerate()
            .filter(|(_, (d, _))| value.contains(**d))
            .map(|(i, (d, held))| (i, held, *d, split(value, Some(*d))))
            .filter(|(.., segs)| segs.len() > 1)
            .max_by_key(|(i, held, _, segs)| {
                let words = segs.iter().filter(|s| is_upper_word(s)).count();
                // A split that cuts no time (`device-1#2026-…T10:00Z` on `#`), before the most held.
                let times = segs.iter().filter(|s| time_kind(s).is_some()).count();
                (words, times, *held, std::cmp::Reverse(*i))
            })
            .map_or((None, vec![value]), |(.., d, segs)| (Some(d), segs))
    }

    /// The shape of one value under this layout, and its segments.
    pub fn parts<'v>(&self, value: &'v str) -> (KeyShape, Vec<&'v str>) {
        let (delimiter, segs) = self.split(value);
        let lit = self.literal.get(&(delimiter, segs.len()));
        let shape = segs
            .iter()
            .enumerate()
            .map(|(i, s)| match lit.and_then(|l| l.get(i)) {
                Some(true) => Seg::Lit((*s).to_string()),
                _ => Seg::Var,
            })
            .collect();
        (
            KeyShape {
                segs: shape,
                delimiter,
            },
            segs,
        )
    }

    /// The shape of one value under this layout.
    pub fn shape(&self, value: &str) -> KeyShape {
        self.parts(value).0
    }
}

/// What a variable's values are, as far as time buckets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeKind {
    /// `YYYY-MM-DD`: a day bucket at most.
    Date,
    /// An ISO date-time or epoch seconds/milliseconds: an hour bucket.
    Instant,
}

impl TimeKind {
    /// The bucket this kind of time suggests, with the literal that names it.
    pub fn bucket(self) -> (BucketUnit, &'static str) {
        match self {
            TimeKind::Date => (BucketUnit::Day, "DAY"),
            TimeKind::Instant => (BucketUnit::Hour, "HOUR"),
        }
    }
}

/// The time kind of one value: a date, a date-time, or epoch seconds (10
/// digits) or milliseconds (13 digits) between the years 2000 and 2100.
pub fn time_kind(v: &str) -> Option<TimeKind> {
    let plausible = |label: &str| {
        label
            .get(..4)
            .and_then(|y| y.parse::<u32>().ok())
            .is_some_and(|y| (2000..=2100).contains(&y))
    };
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return (matches!(v.len(), 10 | 13)
            && bucket(TimeInput::Number(v), BucketUnit::Day).is_ok_and(|l| plausible(&l)))
        .then_some(TimeKind::Instant);
    }
    let label = bucket(TimeInput::Text(v), BucketUnit::Day).ok()?;
    if !plausible(&label) {
        return None;
    }
    Some(if v.len() == 10 {
        TimeKind::Date
    } else {
        TimeKind::Instant
    })
}

/// What is known of one variable of a shape.
#[derive(Debug, Clone, Default)]
pub struct VarStats {
    distinct: std::collections::HashSet<String>,
    overflow: bool,
    /// None once a value is not a time; `Some(kind)` while all are.
    time: Option<Option<TimeKind>>,
    prefix: Option<Option<String>>,
}

impl VarStats {
    pub fn add(&mut self, v: &str) {
        if !self.overflow && !self.distinct.contains(v) {
            if self.distinct.len() == DISTINCT_CAP {
                self.overflow = true;
            } else {
                self.distinct.insert(v.to_string());
            }
        }
        let t = time_kind(v);
        self.time = Some(match self.time {
            None => t,
            Some(None) => None,
            // Dates and instants mixed: instants (an hour bucket reads a date too).
            Some(Some(k)) => t.map(|t| if t == k { k } else { TimeKind::Instant }),
        });
        let p = word_prefix(v);
        self.prefix = Some(match self.prefix.take() {
            None => p,
            Some(old) => old.filter(|o| p.as_deref() == Some(o)),
        });
    }

    /// Distinct values seen (at most [`DISTINCT_CAP`]).
    pub fn distinct(&self) -> u64 {
        self.distinct.len() as u64
    }

    pub fn time(&self) -> Option<TimeKind> {
        self.time.flatten()
    }

    /// The word every value starts with (`device` of `device-17`).
    pub fn common_prefix(&self) -> Option<&str> {
        self.prefix.as_ref().and_then(|p| p.as_deref())
    }
}

/// The letters a value starts with, when a `-` or `_` follows them.
fn word_prefix(v: &str) -> Option<String> {
    let end = v.find(|c: char| !c.is_ascii_alphabetic())?;
    let rest = &v[end..];
    (end >= 2 && (rest.starts_with('-') || rest.starts_with('_')))
        .then(|| v[..end].to_ascii_lowercase())
}

/// A capture name from the literal before it (`TENANT` → `tenant`), else
/// from what its values are; made unique against `taken`.
pub fn capture_name(before: Option<&str>, stats: &VarStats, taken: &mut Vec<String>) -> String {
    let base = match before {
        Some(l) => {
            let n: String = l
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_lowercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            n.trim_matches('_').to_string()
        }
        None => match (stats.time(), stats.common_prefix()) {
            (Some(TimeKind::Date), _) => "day".to_string(),
            (Some(TimeKind::Instant), _) => "ts".to_string(),
            (None, Some(p)) => format!("{p}_id"),
            (None, None) => "id".to_string(),
        },
    };
    let base = if base.is_empty() || matches!(base.as_str(), "shard" | "bucket") {
        format!("{base}_value").trim_start_matches('_').to_string()
    } else {
        base
    };
    let mut name = base.clone();
    let mut i = 2;
    while taken.contains(&name) {
        name = format!("{base}{i}");
        i += 1;
    }
    taken.push(name.clone());
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_splits_on_its_own_delimiter() {
        // Most values of this attribute hold `:`, so a tie goes to it.
        let l = Layout::learn(["a:b", "c:d", "e:f", "g|h"].into_iter());
        let cases: [(&str, Option<char>, &[&str]); 14] = [
            // The split that leaves upper-case words wins, wherever it is.
            ("TENANT#t-1", Some('#'), &["TENANT", "t-1"]),
            (
                "2026-07-07|STORE|s-1",
                Some('|'),
                &["2026-07-07", "STORE", "s-1"],
            ),
            ("DEVICE:d-1", Some(':'), &["DEVICE", "d-1"]),
            (
                "CATALOG/c-1/ITEM/x",
                Some('/'),
                &["CATALOG", "c-1", "ITEM", "x"],
            ),
            // A time's `:` is not the key's delimiter.
            (
                "EVENT#2026-07-07T10:00",
                Some('#'),
                &["EVENT", "2026-07-07T10:00"],
            ),
            (
                "EVENT#2026-07-07T10:00:00Z#e1",
                Some('#'),
                &["EVENT", "2026-07-07T10:00:00Z", "e1"],
            ),
            (
                "2026-07-07T10:00|STORE|s-1",
                Some('|'),
                &["2026-07-07T10:00", "STORE", "s-1"],
            ),
            // Split on `:`, a time is joined back whole, its offset too.
            (
                "READING:2026-07-07T10:00:00+02:00",
                Some(':'),
                &["READING", "2026-07-07T10:00:00+02:00"],
            ),
            (
                "2026-07-07T10:00:STORE:s-1",
                Some(':'),
                &["2026-07-07T10:00", "STORE", "s-1"],
            ),
            // Another delimiter inside a variable does not win over the literals'.
            ("ORDER#a/b:c", Some('#'), &["ORDER", "a/b:c"]),
            // No words either way: the split that keeps the time whole.
            (
                "d-1#2026-07-07T10:00:00Z",
                Some('#'),
                &["d-1", "2026-07-07T10:00:00Z"],
            ),
            // A true tie: the delimiter most values hold.
            ("x|y:z", Some(':'), &["x|y", "z"]),
            // Only a time's `:`, or none at all: one segment.
            ("2026-07-07T10:00:00Z", None, &["2026-07-07T10:00:00Z"]),
            ("plain", None, &["plain"]),
        ];
        for (value, delimiter, segs) in cases {
            assert_eq!(l.split(value), (delimiter, segs.to_vec()), "{value}");
        }
        assert!(l.has_delimiter());
        assert!(!Layout::learn(["abc", "2026-07-07T10:00:00Z"].into_iter()).has_delimiter());
    }

    #[test]
    fn the_same_segments_under_two_delimiters_are_two_shapes() {
        let vals = ["DEVICE:d-1", "DEVICE:d-2", "DEVICE#d-1", "DEVICE#d-2"];
        let l = Layout::learn(vals.into_iter());
        let (a, b) = (l.shape("DEVICE:d-1"), l.shape("DEVICE#d-1"));
        assert_eq!(a.segs, vec![Seg::Lit("DEVICE".into()), Seg::Var]);
        assert_eq!(a.segs, b.segs);
        assert_ne!(a, b);
    }

    #[test]
    fn literals_are_few_distinct_words() {
        let mut vals: Vec<String> = Vec::new();
        for i in 0..40 {
            vals.push(format!("CASE#c{i}#TASK#t{i}"));
            vals.push(format!("CASE#c{i}#EVENT#2026-07-0{}", 1 + i % 9));
            vals.push(format!("CASE#c{i}"));
        }
        let l = Layout::learn(vals.iter().map(String::as_str));
        let lit = |s: &str| Seg::Lit(s.to_string());
        assert_eq!(
            l.shape("CASE#c1#TASK#t1").segs,
            vec![lit("CASE"), Seg::Var, lit("TASK"), Seg::Var]
        );
        assert_eq!(l.shape("CASE#c9").segs, vec![lit("CASE"), Seg::Var]);
        // The date has few values but digits: variable.
        assert_eq!(
            l.shape("CASE#c1#EVENT#2026-07-01").segs,
            vec![lit("CASE"), Seg::Var, lit("EVENT"), Seg::Var]
        );
        // A few lower-case tenants are data; one lower-case word everywhere is a literal.
        let vals = [
            "tenant#acme",
            "tenant#globex",
            "tenant#acme",
            "tenant#initech",
        ];
        let l = Layout::learn(vals.into_iter());
        assert_eq!(l.shape("tenant#acme").segs, vec![lit("tenant"), Seg::Var]);
    }

    #[test]
    fn times_and_names() {
        assert_eq!(time_kind("2026-07-07"), Some(TimeKind::Date));
        assert_eq!(time_kind("2026-07-07T10:11:12Z"), Some(TimeKind::Instant));
        assert_eq!(time_kind("1783400000"), Some(TimeKind::Instant));
        assert_eq!(time_kind("1783400000123"), Some(TimeKind::Instant));
        assert_eq!(time_kind("12345"), None);
        assert_eq!(time_kind("0000000001"), None);
        assert_eq!(time_kind("device-1"), None);
        let mut s = VarStats::default();
        s.add("device-1");
        s.add("device-22");
        let mut taken = vec![];
        assert_eq!(capture_name(None, &s, &mut taken), "device_id");
        assert_eq!(capture_name(Some("TENANT"), &s, &mut taken), "tenant");
        assert_eq!(capture_name(Some("TENANT"), &s, &mut taken), "tenant2");
        assert_eq!(capture_name(Some("SHARD"), &s, &mut taken), "shard_value");
        let mut t = VarStats::default();
        t.add("1783400000");
        assert_eq!(capture_name(None, &t, &mut taken), "ts");
    }
}
