//! Key values out of terminal and `--json` output, unless `--show-keys`.
//!
//! Keys are often customer data (tenant names, e-mail addresses, order ids),
//! and terminal output ends up in CI logs, tickets and screen shares. So by
//! default every key value rekey prints is replaced by a token: the first 8
//! hex digits of the MD5 of its text, `‹3f9a1c2e›`. The token is stable across
//! runs and machines, so an operator can find the item in the files of the
//! owner-only state directory (rejects, mismatches), which keep the real
//! values: `printf '%s' 'TENANT#acme' | md5sum | cut -c1-8`. A key of several
//! attributes is shown as its attributes joined by ` / `, each redacted on its
//! own ([`Redactor::key`], which knows no plan, hashes the joined text whole).
//! The token pseudonymises, it does not encrypt: a guessable value (a small
//! tenant list) can be found by hashing the guesses.
//!
//! Where the plan knows how a key value is built, what the plan wrote stays
//! readable and only what came from the item is hashed:
//! * a **source** key is matched against the rules' `match` shapes: the
//!   literals stay, each capture is hashed (`TENANT#acme#DAY#2026-07-07` shows
//!   as `TENANT#‹a1b2c3d4›#DAY#‹5e6f7a8b›`);
//! * a **target** key (or an attribute a rule's `set` builds, such as an index
//!   key) is split against the rules' templates: the literals and what
//!   `shard()` computed stay, so the shard a key landed on can be read
//!   (`TENANT#‹a1b2c3d4›#DAY#‹5e6f7a8b›#SHARD#07`); captures, `{@attributes}`
//!   and `bucket()` are hashed. A shard number is a few bits of a hash of a
//!   value whose token is shown anyway, and the shard is what an operator
//!   needs to see to judge the new design. A bucket is hashed: it is a captured
//!   or attribute time at a coarser grain, so it still dates the item, as the
//!   `day` capture of the same design does.
//!
//! A shard number is shown only when the value splits against the template
//! in exactly one way, so a captured value that happens to look like plan
//! text and digits (`a#SHARD#07`) cannot pass for them: with two or more
//! splits, the whole value is hashed. A value that fits none of the plan's
//! shapes and templates is hashed whole too. An attribute's templates are
//! tried in rule order, as rules match (specific rules first), and the first
//! that fits decides; the source shapes come last, for a kept or copied source
//! key no template fits. What rule order cannot tell apart: a value built
//! another way (a copied source key) that fits an earlier template exactly,
//! with a valid shard number where its shard goes, reads as that template's.
//!
//! The parts: this module (the token, [`Redactor`], source shapes),
//! `target` (how a value splits against a target template: what is plan text
//! or a shard number, what is data) and `plan` ([`PlanRedactor`], which knows
//! a plan's shapes and templates and redacts each command's report).

mod plan;
mod target;

use std::collections::BTreeSet;

use md5::{Digest as _, Md5};

use crate::core::template::Shape;

pub use plan::PlanRedactor;
use target::Form;

/// The token for `text`: `‹` + the first 8 hex digits of its MD5 + `›`.
pub fn token(text: &str) -> String {
    let d = Md5::digest(text.as_bytes());
    format!("‹{:02x}{:02x}{:02x}{:02x}›", d[0], d[1], d[2], d[3])
}

/// Redacts key values unless `show`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Redactor {
    pub show: bool,
}

impl Redactor {
    /// A whole key, from its decoded attribute values.
    pub fn key(&self, decoded_parts: &[String]) -> String {
        let joined = decoded_parts.join(" / ");
        if self.show { joined } else { token(&joined) }
    }

    /// One value, keeping the literal text of the first shape it matches.
    pub fn shaped(&self, value: &str, shapes: &[Shape]) -> String {
        if self.show {
            return value.to_string();
        }
        shapes
            .iter()
            .find_map(|shape| shape_redacted(shape, value))
            .unwrap_or_else(|| token(value))
    }

    /// One value, by the first of `forms` it fits.
    fn formed(&self, value: &str, forms: &[Form]) -> String {
        if self.show {
            return value.to_string();
        }
        forms
            .iter()
            .find_map(|form| form.redacted(value))
            .unwrap_or_else(|| token(value))
    }

    /// A message: every `backticked` span that is not one of `names` (the
    /// plan's attribute names) is hashed, as it may quote a value.
    pub fn message(&self, msg: &str, names: &BTreeSet<String>) -> String {
        if self.show {
            return msg.to_string();
        }
        let mut out = String::new();
        let mut rest = msg;
        while let Some(open) = rest.find('`') {
            let Some(len) = rest[open + 1..].find('`') else {
                break;
            };
            let span = &rest[open + 1..open + 1 + len];
            out.push_str(&rest[..=open]);
            if names.contains(span) {
                out.push_str(span);
            } else {
                out.push_str(&token(span));
            }
            out.push('`');
            rest = &rest[open + len + 2..];
        }
        out.push_str(rest);
        out
    }
}

/// `value` with the captures of `shape` hashed, if the shape matches it.
fn shape_redacted(shape: &Shape, value: &str) -> Option<String> {
    let ranges = shape.capture_ranges(value)?;
    let mut out = String::new();
    let mut at = 0;
    for r in ranges {
        out.push_str(&value[at..r.start]);
        out.push_str(&token(&value[r.clone()]));
        at = r.end;
    }
    out.push_str(&value[at..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    pub(super) const HIDE: Redactor = Redactor { show: false };
    pub(super) const SHOW: Redactor = Redactor { show: true };

    #[test]
    fn tokens_are_stable_short_and_distinct() {
        let parts = vec!["TENANT#acme".to_string(), "ORDER#1".to_string()];
        let a = HIDE.key(&parts);
        assert_eq!(a, HIDE.key(&parts));
        // MD5("TENANT#acme / ORDER#1"), first 8 hex digits: reproducible with md5sum.
        let d = Md5::digest(b"TENANT#acme / ORDER#1");
        assert_eq!(
            a,
            format!("‹{:02x}{:02x}{:02x}{:02x}›", d[0], d[1], d[2], d[3])
        );
        assert_eq!(a.chars().count(), 10);
        assert_ne!(a, HIDE.key(&["TENANT#acme".into(), "ORDER#2".into()]));
        assert!(!a.contains("acme"));
        assert_eq!(token("acme"), token("acme"));
        assert_ne!(token("acme"), token("acmf"));
    }

    #[test]
    fn show_passes_keys_through() {
        let parts = vec!["TENANT#acme".to_string(), "ORDER#1".to_string()];
        assert_eq!(SHOW.key(&parts), "TENANT#acme / ORDER#1");
        let shape = Shape::parse("TENANT#{t}").unwrap();
        assert_eq!(SHOW.shaped("TENANT#acme", &[shape]), "TENANT#acme");
        assert_eq!(
            SHOW.message("renders `abc`", &BTreeSet::new()),
            "renders `abc`"
        );
    }

    #[test]
    fn a_known_shape_keeps_its_literals_and_hashes_the_captures() {
        let shapes = [
            Shape::parse("USER#{u}").unwrap(),
            Shape::parse("TENANT#{t}#DAY#{d}").unwrap(),
        ];
        assert_eq!(
            HIDE.shaped("TENANT#acme#DAY#2026-07-07", &shapes),
            format!("TENANT#{}#DAY#{}", token("acme"), token("2026-07-07"))
        );
        // No shape matches: the whole value is hashed.
        assert_eq!(HIDE.shaped("other", &shapes), token("other"));
    }

    #[test]
    fn messages_keep_attribute_names_and_hash_quoted_values() {
        let names: BTreeSet<String> = ["total".to_string()].into();
        assert_eq!(
            HIDE.message("`total` is a number attribute but renders `x1`", &names),
            format!(
                "`total` is a number attribute but renders `{}`",
                token("x1")
            )
        );
        assert_eq!(HIDE.message("no rule matched", &names), "no rule matched");
        assert_eq!(HIDE.message("odd ` quote", &names), "odd ` quote");
    }

    /// `expected` in a short notation: each `‹text›` stands for `token("text")`.
    pub(super) fn tokens_in(expected: &str) -> String {
        let mut out = String::new();
        let mut rest = expected;
        while let Some(open) = rest.find('‹') {
            let body = &rest[open + '‹'.len_utf8()..];
            let close = body.find('›').expect("‹ without ›");
            out.push_str(&rest[..open]);
            out.push_str(&token(&body[..close]));
            rest = &body[close + '›'.len_utf8()..];
        }
        out.push_str(rest);
        out
    }
}
