//! A target value against a template of the plan: which parts are plan text
//! or a shard number (shown) and which are data (hashed), counted so that a
//! value that splits more than one way is hashed whole.

use super::{shape_redacted, token};
use crate::core::template::{Expr, Part, Shape, Template};

/// One part of a target template, as redaction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Plan text: shown.
    Lit(String),
    /// `shard(…, n)`, zero-padded to `width`: a number below `n`, shown.
    Shard { n: u32, width: usize },
    /// Item data — a capture, an `@attribute`, a `bucket()`, a quoted
    /// template: hashed. Shapes capture one character or more, so only a
    /// capture is known not to be empty; the rest may be.
    Data { may_be_empty: bool },
}

impl Piece {
    fn of(part: &Part) -> Piece {
        match part {
            Part::Lit(l) => Piece::Lit(l.clone()),
            Part::Expr {
                expr: Expr::Shard { n, .. },
                pad,
                ..
            } => Piece::Shard {
                n: *n,
                width: pad.unwrap_or(0),
            },
            Part::Expr { expr, .. } => Piece::Data {
                may_be_empty: !matches!(expr, Expr::Capture(_)),
            },
        }
    }

    /// Where a literal or shard starting at byte `start` of `value` can end.
    /// (Data can end anywhere; the split handles it apart.)
    fn ends<'v>(&'v self, value: &'v str, start: usize) -> Box<dyn Iterator<Item = usize> + 'v> {
        let rest = &value[start..];
        match self {
            Piece::Lit(l) => Box::new(
                rest.starts_with(l.as_str())
                    .then_some(start + l.len())
                    .into_iter(),
            ),
            Piece::Shard { n, width } => {
                // Digits are one byte each, so every prefix of a run of digits ends on a char boundary.
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                Box::new(
                    (1..=digits.min(shard_text_max(*n, *width)))
                        .filter(move |&len| is_shard_text(&rest[..len], *n, *width))
                        .map(move |len| start + len),
                )
            }
            Piece::Data { .. } => Box::new(std::iter::empty()),
        }
    }
}

/// The longest text `shard(…, n)` padded to `width` renders.
fn shard_text_max(n: u32, width: usize) -> usize {
    n.saturating_sub(1).to_string().len().max(width)
}

/// Whether `text` is exactly what a shard below `n` renders as, padded to
/// `width` — so `07` for `:02` but not for no padding, and never `16` of 16.
fn is_shard_text(text: &str, n: u32, width: usize) -> bool {
    text.parse::<u32>()
        .is_ok_and(|k| k < n && format!("{k:0width$}") == text)
}

/// In how many ways a suffix of the pieces fits a suffix of the value:
/// 0, 1, or [`MANY`].
type Ways = u8;

/// Two or more ways: all that matters is that the split is not unique.
const MANY: Ways = 2;

fn add(a: Ways, b: Ways) -> Ways {
    (a + b).min(MANY)
}

/// A target template as redaction reads it: which parts to show, which to hash.
#[derive(Debug, Clone)]
pub(super) struct TargetShape {
    pieces: Vec<Piece>,
}

impl TargetShape {
    pub(super) fn new(t: &Template) -> TargetShape {
        TargetShape {
            pieces: t.parts.iter().map(Piece::of).collect(),
        }
    }

    /// `value` with its data hashed, if it fits the template; hashed whole if
    /// it fits in more than one way, as then the shown parts might be data.
    fn redacted(&self, value: &str) -> Option<String> {
        let ways = self.ways(value);
        match ways[0][0] {
            0 => None,
            1 => Some(
                self.split(value, &ways)
                    .map_or_else(|| token(value), |ends| self.show(value, &ends)),
            ),
            _ => Some(token(value)),
        }
    }

    /// `ways[i][p]`: in how many ways `pieces[i..]` fit `value[p..]`, counted
    /// from the right so that each cell is computed once (a backtracking
    /// search can take exponential time on many `#`s).
    fn ways(&self, value: &str) -> Vec<Vec<Ways>> {
        let len = value.len();
        let mut ways = vec![vec![0; len + 1]; self.pieces.len() + 1];
        ways[self.pieces.len()][len] = 1;
        for (i, piece) in self.pieces.iter().enumerate().rev() {
            let (row, next) = {
                let (left, right) = ways.split_at_mut(i + 1);
                (&mut left[i], &right[0])
            };
            match piece {
                Piece::Data { may_be_empty } => {
                    // Data ends anywhere: a running sum of the ways from its possible ends.
                    let mut from_here: Ways = 0;
                    for p in (0..=len).rev().filter(|&p| value.is_char_boundary(p)) {
                        let after_here = from_here;
                        from_here = add(from_here, next[p]);
                        row[p] = if *may_be_empty { from_here } else { after_here };
                    }
                }
                fixed => {
                    for p in (0..=len).filter(|&p| value.is_char_boundary(p)) {
                        row[p] = fixed.ends(value, p).fold(0, |acc, e| add(acc, next[e]));
                    }
                }
            }
        }
        ways
    }

    /// The end of each piece in the one split `ways` counted. None cannot
    /// happen when `ways[0][0]` is 1; the caller hashes the whole value then.
    fn split(&self, value: &str, ways: &[Vec<Ways>]) -> Option<Vec<usize>> {
        let mut ends = Vec::with_capacity(self.pieces.len());
        let mut at = 0;
        for (i, piece) in self.pieces.iter().enumerate() {
            let next = &ways[i + 1];
            let end = match piece {
                Piece::Data { may_be_empty } => {
                    let first = at + usize::from(!may_be_empty);
                    (first..=value.len()).find(|&e| value.is_char_boundary(e) && next[e] > 0)
                }
                fixed => fixed.ends(value, at).find(|&e| next[e] > 0),
            }?;
            ends.push(end);
            at = end;
        }
        Some(ends)
    }

    /// The value, piece by piece: literals and shards as they are, data hashed.
    fn show(&self, value: &str, ends: &[usize]) -> String {
        let mut out = String::new();
        let mut at = 0;
        for (piece, &end) in self.pieces.iter().zip(ends) {
            let text = &value[at..end];
            match piece {
                Piece::Data { .. } => out.push_str(&token(text)),
                Piece::Lit(_) | Piece::Shard { .. } => out.push_str(text),
            }
            at = end;
        }
        out
    }
}

/// How the plan says a value of one attribute is built.
#[derive(Debug, Clone)]
pub(super) enum Form {
    /// A rule's `match` shape (a source key, kept or copied).
    Source(Shape),
    /// A rule's key or `set` template.
    Target(TargetShape),
}

impl Form {
    /// The value redacted by this form, if it fits.
    pub(super) fn redacted(&self, value: &str) -> Option<String> {
        match self {
            Form::Source(shape) => shape_redacted(shape, value),
            Form::Target(t) => t.redacted(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::value::{Item, Value};
    use crate::ops::redact::tests::{HIDE, tokens_in};

    fn by_template(template: &str, value: &str) -> String {
        let form = Form::Target(TargetShape::new(&Template::parse(template).unwrap()));
        HIDE.formed(value, &[form])
    }

    #[test]
    fn target_values_show_literals_and_shards_and_hash_the_rest() {
        let cases = [
            // Literals and the shard are shown; captures are hashed.
            (
                "T#{t}#D#{d}#S#{shard(id, 16):02}",
                "T#acme#D#2026-07-07#S#07",
                "T#‹acme›#D#‹2026-07-07›#S#07",
            ),
            ("T#{t}#S#{shard(id, 16):02}", "T#日本#S#03", "T#‹日本›#S#03"),
            // Widths: none, :02, :03, and wider than the padding when n needs it.
            ("S#{shard(id, 16)}", "S#7", "S#7"),
            ("S#{shard(id, 16)}", "S#15", "S#15"),
            ("S#{shard(id, 1000):03}", "S#007", "S#007"),
            ("S#{shard(id, 256):02}", "S#255", "S#255"),
            ("S#{shard(id, 1)}", "S#0", "S#0"),
            // Not what the shard renders: the value does not fit, hashed whole.
            ("S#{shard(id, 16)}", "S#07", "‹S#07›"),
            ("S#{shard(id, 16):02}", "S#7", "‹S#7›"),
            ("S#{shard(id, 16):02}", "S#16", "‹S#16›"),
            ("S#{shard(id, 256):02}", "S#055", "‹S#055›"),
            ("S#{shard(id, 16):02}", "S#+7", "‹S#+7›"),
            ("S#{shard(id, 16):02}", "S#0x", "‹S#0x›"),
            // Every hash function renders the shard in decimal.
            ("S#{shard(id, 20, java31)}", "S#13", "S#13"),
            ("S#{shard(id, 64, murmur3_32):02}", "S#42", "S#42"),
            ("S#{shard(id, 8, fnv1a32)}", "S#0", "S#0"),
            // A capture may hold `#`, even plan text, when only one split fits.
            (
                "T#{t}#S#{shard(id, 16):02}",
                "T#a#S#01#S#02",
                "T#‹a#S#01›#S#02",
            ),
            ("T#{t}#D#{d}", "T#a#D#b#D#c", "‹T#a#D#b#D#c›"),
            // Two splits: the digits shown could be data, so all is hashed.
            ("A#{t}#{shard(id, 100)}#{d}", "A#x#12#34#y", "‹A#x#12#34#y›"),
            ("{t}{shard(id, 100)}", "x12", "‹x12›"),
            // Touching parts are fine when only one reading works.
            ("{t}{shard(id, 16):02}", "acme07", "‹acme›07"),
            ("{t}{shard(id, 16):02}", "ab1207", "‹ab12›07"),
            // `@attributes`, buckets and quoted templates are data.
            ("{@status}#{shard(id, 4)}", "OPEN#3", "‹OPEN›#3"),
            ("{@status}#{shard(id, 4)}", "#3", "‹›#3"),
            (
                "D#{bucket(@ts, day)}#S#{shard(id, 4)}",
                "D#2026-07-07#S#3",
                "D#‹2026-07-07›#S#3",
            ),
            (
                "{\"{@PK}#{@SK}\"}#{shard(\"{@PK}\", 4)}",
                "A#B#3",
                "‹A#B›#3",
            ),
            ("{@n:05}", "00042", "‹00042›"),
            // Literal braces are plan text.
            ("{{{t}}}#{shard(id, 4)}", "{a}#2", "{‹a›}#2"),
            // No fit: hashed whole. A capture is never empty.
            ("T#{t}#S#{shard(id, 16):02}", "other", "‹other›"),
            ("T#{t}", "T#", "‹T#›"),
            ("T#{t}", "X#a", "‹X#a›"),
            // Only plan text: shown.
            ("PROFILE", "PROFILE", "PROFILE"),
        ];
        for (template, value, expected) in cases {
            assert_eq!(
                by_template(template, value),
                tokens_in(expected),
                "{template} on {value}: expected {expected}"
            );
        }
    }

    #[test]
    fn a_long_value_of_many_separators_splits_in_linear_passes() {
        // Backtracking would try every placement of the three captures.
        let value = format!("A#{}#9", "x#".repeat(1500));
        let out = by_template("A#{a}#{b}#{c}#{shard(id, 10)}", &value);
        assert_eq!(out, token(&value), "many splits: hashed whole");
        let value = format!("A#{}#B#9", "x".repeat(2000));
        let out = by_template("A#{a}#B#{shard(id, 10)}", &value);
        assert_eq!(out, format!("A#{}#B#9", token(&"x".repeat(2000))));
    }

    /// A template of literals, captures, attributes and shards, its rendering,
    /// and what redaction should show if it can tell the parts apart.
    fn rendered_case(
        lits: &[String],
        kinds: &[(u8, String, u32, usize)],
    ) -> (String, String, String, Vec<String>) {
        let mut template = String::new();
        let mut expected = String::new();
        let mut captures = vec![("key".to_string(), "k".to_string())];
        let mut item = Item::new();
        let mut data = Vec::new();
        for (i, (lit, (kind, v, n, width))) in lits.iter().zip(kinds).enumerate() {
            template.push_str(lit);
            expected.push_str(lit);
            match kind % 3 {
                0 => {
                    template.push_str(&format!("{{c{i}}}"));
                    captures.push((format!("c{i}"), v.clone()));
                    expected.push_str(&token(v));
                    data.push(v.clone());
                }
                1 => {
                    template.push_str(&format!("{{@a{i}}}"));
                    item.insert(format!("a{i}"), Value::S(v.clone()));
                    expected.push_str(&token(v));
                    data.push(v.clone());
                }
                _ => {
                    let pad = if *width > 0 {
                        format!(":0{width}")
                    } else {
                        String::new()
                    };
                    template.push_str(&format!("{{shard(key, {n}){pad}}}"));
                    let k = crate::core::hash::shard(crate::core::hash::HashFn::Fnv1a32, "k", *n);
                    expected.push_str(&format!("{k:0width$}"));
                }
            }
        }
        let scope = crate::core::template::Scope {
            captures: &captures
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            item: &item,
            default_hash: crate::core::hash::HashFn::Fnv1a32,
        };
        let value = Template::parse(&template).unwrap().render(&scope).unwrap();
        (template, value, expected, data)
    }

    proptest::proptest! {
        /// Whatever the captures hold (`#`, digits, plan text), redaction shows
        /// either the true split or nothing: never a captured value.
        #[test]
        fn no_captured_value_is_ever_shown(
            lits in proptest::collection::vec("[A-C#]{0,3}", 1..6),
            kinds in proptest::collection::vec(
                (0u8..3, "[g-i0-9#A-C]{1,6}", 1u32..300, 0usize..4),
                1..6,
            ),
        ) {
            let (template, value, expected, data) = rendered_case(&lits, &kinds);
            let out = by_template(&template, &value);
            proptest::prop_assert!(
                out == expected || out == token(&value),
                "{} on {}: {} (want {} or the whole hashed)", template, value, out, expected
            );
            // Lowercase g-i cannot come from plan text, digits or a hex token.
            for v in data.iter().filter(|v| v.contains(|c: char| ('g'..='i').contains(&c))) {
                proptest::prop_assert!(!out.contains(v.as_str()), "{} shows {}: {}", template, v, out);
            }
        }
    }
}
