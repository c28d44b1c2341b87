//! Key shapes from key values: the delimiter, literal and variable segments,
//! capture names, and which variables are times.
//!
//! A value is split on its attribute's delimiter (the one of `#`, `|`, `:`,
//! `/` found in the most values; ties in that order, so `EVENT#2026-07-07T10:00`
//! splits on `#`). Values are grouped by their number of segments; in a group
//! a position is **literal** when it holds few distinct values
//! ([`LITERAL_MAX`]), each an upper-case word (`TENANT`, `CASE`, `PROFILE`,
//! the single-table convention), or one lower-case word in every value;
//! otherwise it is **variable**. So a handful of tenants (`acme`, `globex`)
//! stay data, not plan text. Distinct values are counted up to
//! a cap, so memory stays bounded whatever the sample.

use std::collections::{BTreeSet, HashMap};

use crate::core::bucket::{BucketUnit, TimeInput, bucket};

/// The delimiters keys are split on, in order of preference.
pub const DELIMITERS: [char; 4] = ['#', '|', ':', '/'];
/// A position with more distinct values than this is variable.
pub const LITERAL_MAX: usize = 8;
/// Distinct values counted per variable (past it: "at least this many").
pub const DISTINCT_CAP: usize = 4096;

/// One segment of a shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seg {
    Lit(String),
    Var,
}

/// The delimiter found in the most values (ties by [`DELIMITERS`] order), or
/// none when no value holds any.
pub fn choose_delimiter<'a>(values: impl Iterator<Item = &'a str>) -> Option<char> {
    let mut counts = [0u64; DELIMITERS.len()];
    for v in values {
        for (i, d) in DELIMITERS.iter().enumerate() {
            if v.contains(*d) {
                counts[i] += 1;
            }
        }
    }
    let best = (0..DELIMITERS.len())
        .filter(|&i| counts[i] > 0)
        .max_by_key(|&i| (counts[i], std::cmp::Reverse(i)))?;
    Some(DELIMITERS[best])
}

/// Split `value` on `delimiter` (one segment when there is none).
pub fn split(value: &str, delimiter: Option<char>) -> Vec<&str> {
    match delimiter {
        Some(d) => value.split(d).collect(),
        None => vec![value],
    }
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic() || c == '_')
}

fn is_upper_word(s: &str) -> bool {
    is_word(s) && !s.chars().any(|c| c.is_ascii_lowercase())
}

/// Per number of segments, which positions are literal.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    pub delimiter: Option<char>,
    literal: HashMap<usize, Vec<bool>>,
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
        let delimiter = choose_delimiter(values.clone());
        let mut groups: HashMap<usize, (u64, Vec<Position>)> = HashMap::new();
        for v in values {
            let segs = split(v, delimiter);
            let (count, positions) = groups.entry(segs.len()).or_insert_with(|| {
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
        let literal = groups
            .into_iter()
            .map(|(n, (count, positions))| {
                let lit = positions
                    .iter()
                    .map(|p| {
                        let n = p.distinct.len() as u64;
                        !p.overflow
                            && ((p.upper && (n == 1 || count >= 2 * n))
                                || (p.words && n == 1 && count >= 2))
                    })
                    .collect();
                (n, lit)
            })
            .collect();
        Layout { delimiter, literal }
    }

    /// The shape of one value under this layout.
    pub fn shape(&self, value: &str) -> Vec<Seg> {
        let segs = split(value, self.delimiter);
        let lit = self.literal.get(&segs.len());
        segs.iter()
            .enumerate()
            .map(|(i, s)| match lit.and_then(|l| l.get(i)) {
                Some(true) => Seg::Lit((*s).to_string()),
                _ => Seg::Var,
            })
            .collect()
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
    fn the_delimiter_is_the_one_most_values_hold() {
        let vals = [
            "EVENT#2026-07-07T10:00:00Z#e1",
            "EVENT#2026-07-07T10:00:01Z#e2",
        ];
        assert_eq!(choose_delimiter(vals.iter().copied()), Some('#'));
        assert_eq!(
            choose_delimiter(["a|b", "c|d", "e:f"].into_iter()),
            Some('|')
        );
        assert_eq!(choose_delimiter(["abc", "123"].into_iter()), None);
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
            l.shape("CASE#c1#TASK#t1"),
            vec![lit("CASE"), Seg::Var, lit("TASK"), Seg::Var]
        );
        assert_eq!(l.shape("CASE#c9"), vec![lit("CASE"), Seg::Var]);
        // The date has few values but digits: variable.
        assert_eq!(
            l.shape("CASE#c1#EVENT#2026-07-01"),
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
        assert_eq!(l.shape("tenant#acme"), vec![lit("tenant"), Seg::Var]);
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
