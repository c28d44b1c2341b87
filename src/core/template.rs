//! Key-shape templates: the small language plans are written in.
//!
//! Two forms share one syntax:
//! * a **shape** (`TENANT#{tenant}#DAY#{day}`) matches an old key value and
//!   names the pieces it captures; it holds only literal text and captures;
//! * a **template** (`DAY#{day}#SHARD#{shard(order_id,16):02}`) renders a new
//!   value from captures, item attributes (`{@status}`, or `{@"odd name"}`) and
//!   functions (`shard`, `bucket`), with optional zero padding (`:02`).
//!
//! `{{` and `}}` stand for literal braces. Parse errors carry the byte offset in
//! the template text so the plan loader can point at `file:line:col`.
//!
//! Matching rule (documented in the README): each capture matches one or more
//! characters, as few as possible, and the whole value must match. So
//! `{a}#{b}` against `x#y#z` gives a=`x`, b=`y#z`.

use std::fmt;

use regex::Regex;

use crate::core::bucket::{BucketUnit, TimeInput, bucket};
use crate::core::hash::{HashFn, shard};
use crate::core::value::{Item, Value};

/// A parse error at a byte offset inside the template text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

fn err<T>(offset: usize, message: impl Into<String>) -> Result<T, SyntaxError> {
    Err(SyntaxError {
        offset,
        message: message.into(),
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Capture(String),
    Attr(String),
    Shard {
        arg: Box<Expr>,
        n: u32,
        hash: Option<HashFn>,
    },
    Bucket {
        arg: Box<Expr>,
        unit: BucketUnit,
    },
    /// A quoted template as a function argument: `shard("{@PK}#{@SK}", 16)`
    /// hashes the whole source key.
    Text(Template),
}

impl Expr {
    fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        match self {
            Expr::Shard { arg, .. } | Expr::Bucket { arg, .. } => arg.walk(f),
            Expr::Text(t) => {
                for p in &t.parts {
                    if let Part::Expr { expr, .. } = p {
                        expr.walk(f);
                    }
                }
            }
            Expr::Capture(_) | Expr::Attr(_) => {}
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Lit(String),
    Expr {
        expr: Expr,
        /// Zero-pad to this many characters.
        pad: Option<usize>,
        /// Byte offset of the `{` in the template text.
        offset: usize,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub parts: Vec<Part>,
}

/// Why a template could not render for one item. These are per-item rejects,
/// never plan errors: the plan is structurally sound, the data is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    MissingAttribute(String),
    WrongType { attr: String, found: &'static str },
    BadTime { input: String, message: String },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderError::MissingAttribute(a) => write!(f, "attribute `{a}` is missing"),
            RenderError::WrongType { attr, found } => {
                write!(f, "attribute `{attr}` is {found}, a template needs S or N")
            }
            RenderError::BadTime { input, message } => write!(f, "bucket of `{input}`: {message}"),
        }
    }
}

/// What a template renders from: the captures of the matching rule and the source item.
pub struct Scope<'a> {
    /// Capture name → captured text (borrowed: matching allocates nothing).
    pub captures: &'a [(&'a str, &'a str)],
    pub item: &'a Item,
    pub default_hash: HashFn,
}

/// The value an expression evaluated to, remembering whether it was a number
/// so that `bucket` knows epoch numbers from ISO text.
enum Evaluated<'a> {
    Text(std::borrow::Cow<'a, str>),
    Number(std::borrow::Cow<'a, str>),
}

impl<'a> Evaluated<'a> {
    fn text(&self) -> &str {
        match self {
            Evaluated::Text(t) | Evaluated::Number(t) => t,
        }
    }
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, SyntaxError> {
        let mut p = Parser { src: text, pos: 0 };
        p.template()
    }

    /// Every capture name the template reads.
    pub fn captures(&self) -> Vec<(&str, usize)> {
        self.exprs(|e| match e {
            Expr::Capture(c) => Some(c.as_str()),
            _ => None,
        })
    }

    /// Every item attribute the template reads.
    pub fn attributes(&self) -> Vec<(&str, usize)> {
        self.exprs(|e| match e {
            Expr::Attr(a) => Some(a.as_str()),
            _ => None,
        })
    }

    fn exprs<'a>(&'a self, pick: impl Fn(&'a Expr) -> Option<&'a str>) -> Vec<(&'a str, usize)> {
        let mut out = Vec::new();
        for part in &self.parts {
            if let Part::Expr { expr, offset, .. } = part {
                expr.walk(&mut |e| {
                    if let Some(name) = pick(e) {
                        out.push((name, *offset));
                    }
                });
            }
        }
        out
    }

    /// Whether the template is one `{…}` and nothing else (so it can render a number).
    pub fn is_single_expr(&self) -> bool {
        matches!(self.parts.as_slice(), [Part::Expr { .. }])
    }

    /// The literal text, if any, that would make a number attribute invalid.
    pub fn literal_text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Lit(l) => Some(l.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn render(&self, scope: &Scope<'_>) -> Result<String, RenderError> {
        // Sized once for the usual key (a reallocation per part showed in profiles).
        let mut out = String::with_capacity(64);
        for part in &self.parts {
            match part {
                Part::Lit(l) => out.push_str(l),
                Part::Expr { expr, pad, .. } => {
                    let v = eval(expr, scope)?;
                    push_padded(&mut out, v.text(), *pad);
                }
            }
        }
        Ok(out)
    }
}

/// Append `t` to `out`, zero-padded to `pad` characters (`:02`) if given.
pub fn push_padded(out: &mut String, t: &str, pad: Option<usize>) {
    if let Some(width) = pad {
        let len = t.chars().count();
        if len < width {
            // Zero padding goes after a sign, as format!("{:03}", -5) does.
            let (sign, digits) = match t.strip_prefix('-') {
                Some(rest) => ("-", rest),
                None => ("", t),
            };
            out.push_str(sign);
            out.extend(std::iter::repeat_n('0', width - len));
            out.push_str(digits);
            return;
        }
    }
    out.push_str(t);
}

fn eval<'a>(expr: &'a Expr, scope: &'a Scope<'a>) -> Result<Evaluated<'a>, RenderError> {
    use std::borrow::Cow;
    Ok(match expr {
        Expr::Capture(name) => {
            // The plan validator guarantees every capture a template reads is
            // produced by its rule's shapes, and a matched rule binds them all.
            let v = scope
                .captures
                .iter()
                .find(|(n, _)| *n == name.as_str())
                .map(|(_, v)| *v)
                .unwrap_or("");
            Evaluated::Text(Cow::Borrowed(v))
        }
        Expr::Attr(name) => match scope.item.get(name) {
            None => return Err(RenderError::MissingAttribute(name.clone())),
            Some(Value::S(s)) => Evaluated::Text(Cow::Borrowed(s)),
            Some(Value::N(n)) => Evaluated::Number(Cow::Borrowed(n)),
            Some(other) => {
                return Err(RenderError::WrongType {
                    attr: name.clone(),
                    found: other.type_name(),
                });
            }
        },
        Expr::Shard { arg, n, hash } => {
            let v = eval(arg, scope)?;
            let h = hash.unwrap_or(scope.default_hash);
            Evaluated::Number(Cow::Owned(shard(h, v.text(), *n).to_string()))
        }
        Expr::Text(t) => Evaluated::Text(Cow::Owned(t.render(scope)?)),
        Expr::Bucket { arg, unit } => {
            let v = eval(arg, scope)?;
            let input = match &v {
                Evaluated::Number(n) => TimeInput::Number(n),
                // A capture such as `{ts}` out of `EVENT#1720000000` is text that holds a number.
                Evaluated::Text(t) if crate::core::value::is_valid_number(t) => {
                    TimeInput::Number(t)
                }
                Evaluated::Text(t) => TimeInput::Text(t),
            };
            let b = bucket(input, *unit).map_err(|e| RenderError::BadTime {
                input: v.text().to_string(),
                message: e.to_string(),
            })?;
            Evaluated::Text(Cow::Owned(b))
        }
    })
}

/// A compiled shape: literal text and captures, matched as a whole value.
#[derive(Debug, Clone)]
pub struct Shape {
    pub text: String,
    /// Capture names in order, with their byte offsets in the shape text.
    pub captures: Vec<(String, usize)>,
    /// The literal text around the captures: one more than there are
    /// captures (the first and last may be empty, the others never are).
    lits: Vec<String>,
    /// `^lit(?s:(.+?))lit…$`: the definition of a match. [`Shape::ranges`]
    /// finds the same match by searching for the literals, which is several
    /// times faster on keys; the regex answers where that search could be slow.
    regex: Regex,
}

/// The byte offset of the character after the one at `at`.
fn next_char(value: &str, at: usize) -> usize {
    at + value[at..].chars().next().map_or(1, char::len_utf8)
}

/// Above this many bytes, a shape with three or more captures is matched by
/// the regex, whose time is linear; the literal search can be quadratic there.
const LITERAL_SEARCH_MAX_BYTES: usize = 4096;

impl Shape {
    pub fn parse(text: &str) -> Result<Shape, SyntaxError> {
        let t = Template::parse(text)?;
        let mut pattern = String::from("^");
        let mut captures: Vec<(String, usize)> = Vec::new();
        let mut lits = vec![String::new()];
        let mut prev_was_capture = false;
        for part in &t.parts {
            match part {
                Part::Lit(l) => {
                    pattern.push_str(&regex::escape(l));
                    lits.last_mut().expect("never empty").push_str(l);
                    prev_was_capture = false;
                }
                Part::Expr {
                    expr: Expr::Capture(name),
                    pad: None,
                    offset,
                } => {
                    if prev_was_capture {
                        return err(
                            *offset,
                            "two captures in a row are ambiguous: put literal text between them",
                        );
                    }
                    if captures.iter().any(|(n, _)| n == name) {
                        return err(
                            *offset,
                            format!("capture `{name}` appears twice in one shape"),
                        );
                    }
                    pattern.push_str("(?s:(.+?))");
                    captures.push((name.clone(), *offset));
                    lits.push(String::new());
                    prev_was_capture = true;
                }
                Part::Expr { offset, .. } => {
                    return err(
                        *offset,
                        "a match shape holds only literal text and {captures}: no @attributes, functions or padding",
                    );
                }
            }
        }
        pattern.push('$');
        let regex = Regex::new(&pattern).map_err(|e| SyntaxError {
            offset: 0,
            message: e.to_string(),
        })?;
        Ok(Shape {
            text: text.to_string(),
            captures,
            lits,
            regex,
        })
    }

    /// The byte ranges of the captures in `value`, in order, if the whole
    /// value matches.
    pub fn capture_ranges(&self, value: &str) -> Option<Vec<std::ops::Range<usize>>> {
        if self.captures.len() >= 3 && value.len() > LITERAL_SEARCH_MAX_BYTES {
            return self.regex_ranges(value);
        }
        let (first, last) = (&self.lits[0], &self.lits[self.lits.len() - 1]);
        if self.captures.is_empty() {
            return (value == first.as_str()).then(Vec::new);
        }
        if !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
            || value.len() < first.len() + last.len()
        {
            return None;
        }
        let mut ranges = Vec::with_capacity(self.captures.len());
        let mut failed = Vec::new();
        let end = value.len() - last.len();
        self.search(value, 0, first.len(), end, &mut ranges, &mut failed)
            .then_some(ranges)
    }

    /// Capture `i` starts at `at`; the last one ends at `end`. Each capture is
    /// as short as it can be (at least one character) with the rest still
    /// matching — the lazy `.+?`'s leftmost-first order, tried in the same
    /// order. `failed` remembers starts that cannot match, so no start is
    /// searched twice.
    fn search(
        &self,
        value: &str,
        i: usize,
        at: usize,
        end: usize,
        ranges: &mut Vec<std::ops::Range<usize>>,
        failed: &mut Vec<(usize, usize)>,
    ) -> bool {
        if i + 1 == self.captures.len() {
            if end > at {
                ranges.push(at..end);
                return true;
            }
            return false;
        }
        let lit = self.lits[i + 1].as_str();
        // The capture holds at least one character; a literal is found only
        // at a character boundary (UTF-8 never matches mid-character).
        let mut from = next_char(value, at);
        while from + lit.len() <= end {
            let Some(found) = value[..end].get(from..).and_then(|v| v.find(lit)) else {
                return false;
            };
            let stop = from + found;
            let next = stop + lit.len();
            if !failed.contains(&(i + 1, next)) {
                ranges.push(at..stop);
                if self.search(value, i + 1, next, end, ranges, failed) {
                    return true;
                }
                ranges.pop();
                failed.push((i + 1, next));
            }
            from = next_char(value, stop);
        }
        false
    }

    fn regex_ranges(&self, value: &str) -> Option<Vec<std::ops::Range<usize>>> {
        let caps = self.regex.captures(value)?;
        Some(
            (1..caps.len())
                .filter_map(|i| caps.get(i).map(|m| m.range()))
                .collect(),
        )
    }

    /// The captures, in order, if the whole value matches.
    pub fn matches(&self, value: &str) -> Option<Vec<String>> {
        Some(
            self.capture_ranges(value)?
                .into_iter()
                .map(|r| value[r].to_string())
                .collect(),
        )
    }
}

struct Parser<'s> {
    src: &'s str,
    pos: usize,
}

const FUNCTIONS: &str = "shard(value, N[, hash]) and bucket(time, hour|day|week|month)";

impl<'s> Parser<'s> {
    fn rest(&self) -> &'s str {
        &self.src[self.pos..]
    }
    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }
    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(c) if c == ' ' || c == '\t') {
            self.pos += 1;
        }
    }
    fn expect(&mut self, want: char) -> Result<(), SyntaxError> {
        self.skip_ws();
        match self.peek() {
            Some(c) if c == want => {
                self.pos += c.len_utf8();
                Ok(())
            }
            Some(c) => err(self.pos, format!("expected `{want}`, found `{c}`")),
            None => err(
                self.pos,
                format!("expected `{want}`, found the end of the template"),
            ),
        }
    }

    fn template(&mut self) -> Result<Template, SyntaxError> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        while let Some(c) = self.peek() {
            let here = self.pos;
            if self.rest().starts_with("{{") {
                lit.push('{');
                self.pos += 2;
            } else if self.rest().starts_with("}}") {
                lit.push('}');
                self.pos += 2;
            } else if c == '}' {
                return err(here, "unmatched `}`: write `}}` for a literal brace");
            } else if c == '{' {
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                self.pos += 1;
                let expr = self.expr()?;
                self.skip_ws();
                let pad = if self.peek() == Some(':') {
                    self.pos += 1;
                    Some(self.pad()?)
                } else {
                    None
                };
                self.expect('}')?;
                parts.push(Part::Expr {
                    expr,
                    pad,
                    offset: here,
                });
            } else {
                lit.push(c);
                self.pos += c.len_utf8();
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template { parts })
    }

    fn pad(&mut self) -> Result<usize, SyntaxError> {
        let start = self.pos;
        let spec: String = self
            .rest()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        self.pos += spec.len();
        match spec.strip_prefix('0') {
            Some(w) if !w.is_empty() => match w.parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => Ok(n),
                _ => err(start, "padding width must be between 1 and 64"),
            },
            _ => err(start, "format must be zero padding such as `:02`"),
        }
    }

    fn ident(&mut self) -> Result<String, SyntaxError> {
        self.skip_ws();
        let start = self.pos;
        let id: String = self
            .rest()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == '.')
            .collect();
        if id.is_empty() {
            return match self.peek() {
                Some(c) => err(start, format!("expected a name, found `{c}`")),
                None => err(start, "expected a name, found the end of the template"),
            };
        }
        self.pos += id.len();
        Ok(id)
    }

    fn quoted(&mut self) -> Result<String, SyntaxError> {
        let start = self.pos;
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return err(start, "unterminated quoted name"),
                Some('"') => return Ok(out),
                Some('\\') => match self.bump() {
                    Some(c @ ('"' | '\\')) => out.push(c),
                    _ => {
                        return err(
                            self.pos.saturating_sub(1),
                            "only \\\" and \\\\ escape inside a quoted name",
                        );
                    }
                },
                Some(c) => out.push(c),
            }
        }
    }

    fn expr(&mut self) -> Result<Expr, SyntaxError> {
        self.skip_ws();
        let start = self.pos;
        if self.peek() == Some('"') {
            // A nested template runs to the next quote; its offsets are made
            // absolute so errors inside it still point at the right column.
            let body_start = self.pos + 1;
            let Some(len) = self.src[body_start..].find('"') else {
                return err(start, "unterminated quoted template");
            };
            let body = &self.src[body_start..body_start + len];
            let mut t = Template::parse(body).map_err(|e| SyntaxError {
                offset: e.offset + body_start,
                ..e
            })?;
            for p in &mut t.parts {
                if let Part::Expr { offset, .. } = p {
                    *offset += body_start;
                }
            }
            self.pos = body_start + len + 1;
            return Ok(Expr::Text(t));
        }
        if self.peek() == Some('@') {
            self.pos += 1;
            let name = if self.peek() == Some('"') {
                self.quoted()?
            } else {
                self.ident()?
            };
            if name.is_empty() {
                return err(start, "empty attribute name");
            }
            return Ok(Expr::Attr(name));
        }
        let name = self.ident()?;
        self.skip_ws();
        if self.peek() != Some('(') {
            return Ok(Expr::Capture(name));
        }
        self.pos += 1;
        match name.as_str() {
            "shard" => {
                let arg = self.expr()?;
                self.expect(',')?;
                self.skip_ws();
                let n_at = self.pos;
                let n = self.integer()?;
                if n == 0 {
                    return err(n_at, "shard count must be at least 1");
                }
                self.skip_ws();
                let hash = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.skip_ws();
                    let at = self.pos;
                    let h = self.ident()?;
                    Some(HashFn::from_name(&h).ok_or(SyntaxError {
                        offset: at,
                        message: format!("unknown hash `{h}` (known: fnv1a32, murmur3_32, java31)"),
                    })?)
                } else {
                    None
                };
                self.expect(')')?;
                Ok(Expr::Shard {
                    arg: Box::new(arg),
                    n,
                    hash,
                })
            }
            "bucket" => {
                let arg = self.expr()?;
                self.expect(',')?;
                self.skip_ws();
                let at = self.pos;
                let u = self.ident()?;
                let unit = BucketUnit::from_name(&u).ok_or(SyntaxError {
                    offset: at,
                    message: format!("unknown bucket unit `{u}` (known: hour, day, week, month)"),
                })?;
                self.expect(')')?;
                Ok(Expr::Bucket {
                    arg: Box::new(arg),
                    unit,
                })
            }
            other => err(
                start,
                format!("unknown function `{other}` (known: {FUNCTIONS})"),
            ),
        }
    }

    fn integer(&mut self) -> Result<u32, SyntaxError> {
        self.skip_ws();
        let start = self.pos;
        let digits: String = self
            .rest()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        self.pos += digits.len();
        if digits.is_empty() {
            return err(start, "expected a whole number");
        }
        digits
            .parse::<u32>()
            .or_else(|_| err(start, "number too large"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scope_render(t: &str, caps: &[(&str, &str)], item: &Item) -> Result<String, RenderError> {
        let captures: Vec<(String, String)> = caps
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        Template::parse(t).unwrap().render(&Scope {
            captures: &captures
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            item,
            default_hash: HashFn::Fnv1a32,
        })
    }

    #[test]
    fn renders_captures_attributes_functions_and_padding() {
        let mut item = Item::new();
        item.insert("status".into(), Value::S("OPEN".into()));
        item.insert("ts".into(), Value::N("1783418400".into())); // 2026-07-07T10:00:00Z
        item.insert("odd name".into(), Value::S("x".into()));
        let out = scope_render(
            "T#{tenant}#{@status}#{bucket(@ts, day)}#{shard(order_id,16):02}#{@\"odd name\"}{{}}",
            &[("tenant", "acme"), ("order_id", "o-1")],
            &item,
        )
        .unwrap();
        let s = shard(HashFn::Fnv1a32, "o-1", 16);
        assert_eq!(out, format!("T#acme#OPEN#2026-07-07#{s:02}#x{{}}"));
    }

    #[test]
    fn a_quoted_template_hashes_several_attributes_together() {
        let mut item = Item::new();
        item.insert("PK".into(), Value::S("A".into()));
        item.insert("SK".into(), Value::S("B".into()));
        let out = scope_render("{shard(\"{@PK}#{@SK}\", 64):02}", &[], &item).unwrap();
        assert_eq!(out, format!("{:02}", shard(HashFn::Fnv1a32, "A#B", 64)));
        let e = Template::parse("X{shard(\"{nope(a)}\", 4)}").unwrap_err();
        assert_eq!(e.offset, 10, "{e}");
        assert!(Template::parse("{shard(\"{@PK}, 4)}").is_err());
    }

    #[test]
    fn hash_can_be_chosen_per_call() {
        let item = Item::new();
        let out = scope_render("{shard(id, 20, java31)}", &[("id", "abc")], &item).unwrap();
        assert_eq!(out, shard(HashFn::Java31, "abc", 20).to_string());
    }

    #[test]
    fn missing_and_wrong_type_attributes_are_render_errors() {
        let mut item = Item::new();
        item.insert("flag".into(), Value::Bool(true));
        assert_eq!(
            scope_render("{@nope}", &[], &item),
            Err(RenderError::MissingAttribute("nope".into()))
        );
        assert_eq!(
            scope_render("{@flag}", &[], &item),
            Err(RenderError::WrongType {
                attr: "flag".into(),
                found: "BOOL"
            })
        );
    }

    #[test]
    fn syntax_errors_point_at_the_offending_byte() {
        let cases = [
            ("A#{nope(x)}", 3, "unknown function `nope`"),
            ("A#{shard(x, 0)}", 12, "shard count must be at least 1"),
            ("A#{shard(x, 4, sha1)}", 15, "unknown hash `sha1`"),
            ("A#{bucket(t, year)}", 13, "unknown bucket unit `year`"),
            ("A#}", 2, "unmatched `}`"),
            ("A#{x", 4, "expected `}`"),
            ("A#{x:2}", 5, "zero padding"),
        ];
        for (text, offset, msg) in cases {
            let e = Template::parse(text).unwrap_err();
            assert_eq!(e.offset, offset, "{text}: {e}");
            assert!(e.message.contains(msg), "{text}: {e}");
        }
    }

    #[test]
    fn shapes_reject_what_cannot_be_matched() {
        assert!(
            Shape::parse("{a}{b}")
                .unwrap_err()
                .message
                .contains("in a row")
        );
        assert!(
            Shape::parse("{a}#{a}")
                .unwrap_err()
                .message
                .contains("twice")
        );
        assert!(
            Shape::parse("{shard(a,2)}")
                .unwrap_err()
                .message
                .contains("only literal")
        );
        assert!(Shape::parse("A#{@x}").is_err());
    }

    #[test]
    fn shapes_match_whole_values_with_shortest_captures() {
        let s = Shape::parse("TENANT#{tenant}#DAY#{day}").unwrap();
        assert_eq!(
            s.matches("TENANT#acme#DAY#2026-07-07"),
            Some(vec!["acme".into(), "2026-07-07".into()])
        );
        assert_eq!(s.matches("TENANT#acme#DAY#"), None);
        assert_eq!(s.matches("XTENANT#acme#DAY#1"), None);
        let s = Shape::parse("{a}#{b}").unwrap();
        assert_eq!(s.matches("x#y#z"), Some(vec!["x".into(), "y#z".into()]));
        let s = Shape::parse("A.{x}*").unwrap(); // regex metacharacters are literal
        assert_eq!(s.matches("A.1*"), Some(vec!["1".into()]));
        assert_eq!(s.matches("AB1*"), None);
        let s = Shape::parse("{{{x}}}").unwrap();
        assert_eq!(s.matches("{v}"), Some(vec!["v".into()]));
        // Long values with three captures go to the regex; the answer is the same.
        let s = Shape::parse("{a}#{b}#{c}").unwrap();
        let long = format!("{}#{}#z", "x#".repeat(3000), "y");
        assert!(long.len() > LITERAL_SEARCH_MAX_BYTES);
        assert_eq!(s.capture_ranges(&long), s.regex_ranges(&long));
        assert_eq!(s.matches(&long).unwrap()[0], "x");
        // Each capture holds at least one character, multi-byte ones too.
        let s = Shape::parse("{a}#{b}").unwrap();
        assert_eq!(
            s.matches("\u{e9}#\u{65e5}"),
            Some(vec!["\u{e9}".into(), "\u{65e5}".into()])
        );
        assert_eq!(s.matches("#x"), None);
        assert_eq!(s.matches("x#"), None);
        assert_eq!(s.matches("##"), None);
        assert_eq!(s.matches("###"), Some(vec!["#".into(), "#".into()]));
    }

    fn literal() -> impl Strategy<Value = String> {
        "[A-Z#]{1,6}"
    }

    proptest! {
        /// Rendering a shape's captures into it and matching back gives the captures,
        /// as long as a capture does not contain the literal text that follows it.
        #[test]
        fn render_then_match_gives_the_captures(
            lits in proptest::collection::vec(literal(), 1..5),
            vals in proptest::collection::vec("[a-z0-9\u{e9}\u{65e5}-]{1,8}", 1..5),
            leading in any::<bool>(),
        ) {
            let n = lits.len().min(vals.len());
            let mut shape = String::new();
            let mut caps = Vec::new();
            for i in 0..n {
                if leading || i > 0 { shape.push_str(&lits[i]); }
                shape.push_str(&format!("{{c{i}}}"));
                caps.push((format!("c{i}"), vals[i].clone()));
            }
            shape.push_str(&lits[0]);
            let t = Template::parse(&shape).unwrap();
            let item = Item::new();
            let rendered = t.render(&Scope { captures: &caps.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect::<Vec<_>>(), item: &item, default_hash: HashFn::Fnv1a32 }).unwrap();
            let s = Shape::parse(&shape).unwrap();
            let got = s.matches(&rendered).unwrap();
            let want: Vec<String> = caps.iter().map(|(_, v)| v.clone()).collect();
            prop_assert_eq!(got, want);
        }

        /// The literal search finds exactly the regex's match (the lazy
        /// captures' leftmost-first choice) or none when it finds none, on
        /// values built from the shapes' own literals, so captures that
        /// swallow delimiters and values that almost match are common.
        #[test]
        fn the_literal_search_matches_exactly_as_the_regex(
            lits in proptest::collection::vec("(#|##|A#|\u{e9}|)", 1..6),
            pieces in proptest::collection::vec("(#|##|A|A#|b|\u{e9}|\u{65e5})", 0..14),
        ) {
            let mut shape = String::new();
            for (i, l) in lits.iter().enumerate() {
                // Between two captures a literal is required: `#` stands in for an empty one.
                let l = if i > 0 && i + 1 < lits.len() && l.is_empty() { "#" } else { l };
                shape.push_str(l);
                if i + 1 < lits.len() {
                    shape.push_str(&format!("{{c{i}}}"));
                }
            }
            let s = Shape::parse(&shape).unwrap();
            let value = pieces.concat();
            prop_assert_eq!(s.capture_ranges(&value), s.regex_ranges(&value), "shape {:?} value {:?}", shape, value);
        }

        #[test]
        fn parsing_never_panics(text in ".{0,40}") {
            let _ = Template::parse(&text);
            let _ = Shape::parse(&text);
        }
    }
}
