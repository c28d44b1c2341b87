//! Reading a rendered value back into the pieces a template put in it.
//!
//! `template.rs` compiles a shape to an anchored regex and takes its one
//! leftmost-shortest match: right for a shape, whose captures are what the
//! plan says they are. A key template read backwards is different: the value
//! may split in several ways (`{a}#{b}` on `x#y#z`), and taking the first
//! would silently pick a source key that is not the one the item came from.
//! So this reader finds *every* split, in order, shortest first, and the
//! inverse keeps those that hold up. It is bounded: past [`MAX_SPLITS`]
//! splits or [`MAX_STEPS`] steps the value is "too ambiguous", never guessed.
//!
//! Also here: the text of a template part for messages (`{shard(id, 16):02}`).

use std::borrow::Cow;

use crate::core::bucket::BucketUnit;
use crate::core::template::{Expr, Part, Template};

/// More splits than this of one value, or of one item's values together, and
/// the item is rejected as too ambiguous to read back.
pub(super) const MAX_SPLITS: usize = 32;
/// Steps of the search for one value (a step is one token tried at one position).
const MAX_STEPS: usize = 20_000;

/// What text a computed part can render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Class {
    /// Any text of at least `min` characters.
    Any { min: usize },
    /// ASCII digits, between `min` and `max` of them (`shard()`, padded or not).
    Digits { min: usize, max: usize },
    /// A fixed layout: `d` is a digit, any other byte itself (`bucket()`: `dddd-Wdd`).
    Format(String),
}

impl Class {
    /// Whether one item's values of this part can differ in length, so that
    /// two such parts side by side, with no literal between, split ambiguously.
    pub(super) fn variable_width(&self) -> bool {
        match self {
            Class::Any { .. } => true,
            Class::Digits { min, max } => min != max,
            Class::Format(_) => false,
        }
    }
}

/// The layout `bucket(…, unit)` renders, zero-padded to `pad`.
pub(super) fn bucket_format(unit: BucketUnit, pad: Option<usize>) -> String {
    let f = match unit {
        BucketUnit::Hour => "dddd-dd-ddTdd",
        BucketUnit::Day => "dddd-dd-dd",
        BucketUnit::Week => "dddd-Wdd",
        BucketUnit::Month => "dddd-dd",
    };
    let zeros = pad.unwrap_or(0).saturating_sub(f.len());
    format!("{}{f}", "0".repeat(zeros))
}

/// One piece of a value to read: literal text, or a part whose text is to be found.
#[derive(Debug)]
pub(super) enum Tok<'a> {
    Lit(Cow<'a, str>),
    /// The part's index in its template, and what it can render.
    Var(usize, Cow<'a, Class>),
}

/// The value was too ambiguous to read back within the bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooMany;

/// A split: the text of each `Var` token, with the token's part index.
pub(super) type Split<'t> = Vec<(usize, &'t str)>;

/// Every way `text` reads as `toks`, shortest variable parts first.
pub(super) fn splits<'t>(toks: &[Tok<'_>], text: &'t str) -> Result<Vec<Split<'t>>, TooMany> {
    let mut w = Walk {
        toks,
        text,
        acc: Vec::new(),
        out: Vec::new(),
        steps: 0,
    };
    w.go(0, 0)?;
    Ok(w.out)
}

struct Walk<'a, 'b, 't> {
    toks: &'a [Tok<'b>],
    text: &'t str,
    acc: Split<'t>,
    out: Vec<Split<'t>>,
    steps: usize,
}

impl<'t> Walk<'_, '_, 't> {
    fn go(&mut self, i: usize, pos: usize) -> Result<(), TooMany> {
        self.steps += 1;
        if self.steps > MAX_STEPS || self.out.len() > MAX_SPLITS {
            return Err(TooMany);
        }
        let Some(tok) = self.toks.get(i) else {
            if pos == self.text.len() {
                self.out.push(self.acc.clone());
            }
            return Ok(());
        };
        match tok {
            Tok::Lit(l) => {
                if self.text[pos..].starts_with(l.as_ref()) {
                    self.go(i + 1, pos + l.len())?;
                }
            }
            Tok::Var(part, class) => {
                for end in self.ends(i, class, pos) {
                    self.acc.push((*part, &self.text[pos..end]));
                    self.go(i + 1, end)?;
                    self.acc.pop();
                }
            }
        }
        Ok(())
    }

    /// Where the text of token `i`, starting at `pos`, can end.
    fn ends(&self, i: usize, class: &Class, pos: usize) -> Vec<usize> {
        let rest = &self.text[pos..];
        match class {
            Class::Digits { min, max } => {
                let run = rest.bytes().take_while(u8::is_ascii_digit).count();
                (*min..=run.min(*max)).map(|n| pos + n).collect()
            }
            Class::Format(f) => {
                let fits = rest.len() >= f.len()
                    && rest.bytes().zip(f.bytes()).all(|(r, c)| {
                        if c == b'd' {
                            r.is_ascii_digit()
                        } else {
                            r == c
                        }
                    });
                if fits { vec![pos + f.len()] } else { vec![] }
            }
            Class::Any { min } => {
                let last = i + 1 == self.toks.len();
                let next = match self.toks.get(i + 1) {
                    Some(Tok::Lit(l)) if !l.is_empty() => Some(l.as_ref()),
                    _ => None,
                };
                rest.char_indices()
                    .map(|(b, _)| b)
                    .chain(std::iter::once(rest.len()))
                    .enumerate()
                    .filter(|&(chars, b)| {
                        chars >= *min
                            && (!last || b == rest.len())
                            && next.is_none_or(|l| rest[b..].starts_with(l))
                    })
                    .map(|(_, b)| pos + b)
                    .collect()
            }
        }
    }
}

/// The text of one template part as a plan writes it: `{shard(order_id, 16):02}`.
pub(super) fn part_text(part: &Part) -> String {
    match part {
        Part::Lit(l) => l.replace('{', "{{").replace('}', "}}"),
        Part::Expr { expr, pad, .. } => match pad {
            Some(w) => format!("{{{}:0{w}}}", expr_text(expr)),
            None => format!("{{{}}}", expr_text(expr)),
        },
    }
}

/// The text of a whole template.
pub(super) fn template_text(t: &Template) -> String {
    t.parts.iter().map(part_text).collect()
}

fn expr_text(e: &Expr) -> String {
    match e {
        Expr::Capture(c) => c.clone(),
        Expr::Attr(a) if a.chars().all(|c| c.is_alphanumeric() || "_-.".contains(c)) => {
            format!("@{a}")
        }
        Expr::Attr(a) => format!("@\"{}\"", a.replace('\\', "\\\\").replace('"', "\\\"")),
        Expr::Shard { arg, n, hash } => match hash {
            Some(h) => format!("shard({}, {n}, {})", expr_text(arg), h.name()),
            None => format!("shard({}, {n})", expr_text(arg)),
        },
        Expr::Bucket { arg, unit } => format!("bucket({}, {})", expr_text(arg), unit.name()),
        Expr::Text(t) => format!("\"{}\"", template_text(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(part: usize) -> Tok<'static> {
        Tok::Var(part, Cow::Owned(Class::Any { min: 1 }))
    }
    fn lit(s: &str) -> Tok<'_> {
        Tok::Lit(Cow::Borrowed(s))
    }
    fn texts<'t>(s: Vec<Split<'t>>) -> Vec<Vec<&'t str>> {
        s.into_iter()
            .map(|v| v.into_iter().map(|(_, t)| t).collect())
            .collect()
    }

    #[test]
    fn every_split_is_found_shortest_first() {
        let toks = [any(0), lit("#"), any(2)];
        assert_eq!(
            texts(splits(&toks, "x#y#z").unwrap()),
            vec![vec!["x", "y#z"], vec!["x#y", "z"]]
        );
        assert_eq!(
            texts(splits(&toks, "xyz").unwrap()),
            Vec::<Vec<&str>>::new()
        );
        // Unicode inside a part, and a literal at both ends.
        let toks = [lit("É#"), any(1), lit("#日")];
        assert_eq!(texts(splits(&toks, "É#🦀é#日").unwrap()), vec![vec!["🦀é"]]);
    }

    #[test]
    fn digits_and_formats_take_only_their_layout() {
        let shard = Tok::Var(0, Cow::Owned(Class::Digits { min: 1, max: 2 }));
        let toks = [shard, any(1)];
        assert_eq!(
            texts(splits(&toks, "12ab").unwrap()),
            vec![vec!["1", "2ab"], vec!["12", "ab"]]
        );
        let week = Tok::Var(
            0,
            Cow::Owned(Class::Format(bucket_format(BucketUnit::Week, None))),
        );
        let toks = [week, lit("#"), any(2)];
        assert_eq!(
            texts(splits(&toks, "2026-W28#x").unwrap()),
            vec![vec!["2026-W28", "x"]]
        );
        assert!(splits(&toks, "2026-28#x").unwrap().is_empty());
        assert_eq!(bucket_format(BucketUnit::Month, Some(9)), "00dddd-dd");
    }

    #[test]
    fn a_value_with_too_many_splits_is_refused_not_guessed() {
        let toks = [any(0), lit("#"), any(1), lit("#"), any(2), lit("#"), any(3)];
        let text = "#"
            .repeat(40)
            .chars()
            .flat_map(|c| ['a', c])
            .collect::<String>();
        assert_eq!(splits(&toks, &text), Err(TooMany));
    }

    #[test]
    fn parts_print_as_the_plan_writes_them() {
        let t = Template::parse(
            "A{{#{x}#{@\"odd name\"}#{shard(id, 16, java31):02}#{bucket(@ts, week)}#{shard(\"{@PK}#{@SK}\", 4)}",
        )
        .unwrap();
        assert_eq!(
            template_text(&t),
            "A{{#{x}#{@\"odd name\"}#{shard(id, 16, java31):02}#{bucket(@ts, week)}#{shard(\"{@PK}#{@SK}\", 4)}"
        );
    }
}
