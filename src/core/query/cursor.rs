//! The cursor: where a page ended, opaque to the reader, checked on return.
//!
//! A cursor is base64url (no padding) of a compact JSON object, in this
//! field order: `{"v":1,"q":"<16 hex>","k":<key index>,"s":"<sort key>"}`.
//!
//! * `v` is the format version; a cursor of another version is refused.
//! * `q` identifies the query the cursor belongs to ([`QueryId`]): a cursor
//!   from another table, rule, `--where`, time range, sort-key condition or
//!   order is refused rather than read as a position it is not.
//! * `k` and `s` are the merge position of the last item returned: the
//!   index of its partition key in the logical key's list, and its sort key.
//!   The merge orders items by (sort key, key index), so this one pair says
//!   exactly which items came before it, in every partition key at once; a
//!   per-key "last evaluated key" would add nothing and could be ahead of
//!   what was returned (`docs/read-path.md`).
//!
//! The JSON is written by hand-rolled rules every reference implementation
//! follows byte for byte (serde_json's compact form: `"` `\` and control
//! characters escaped, `\n`-style where JSON has one, `\u00XX` otherwise,
//! nothing else), so the same page gives the same cursor in every language.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;

use super::keys::LogicalKey;
use super::range::{Order, SkCondition, SkRange};

pub(crate) const VERSION: u64 = 1;

/// Why a `--cursor` cannot be used; bad input (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("--cursor is not a rekey cursor (not base64url JSON): was it cut short or changed?")]
    Malformed,
    #[error("--cursor has version {0}; this rekey reads version {VERSION}")]
    Version(u64),
    #[error(
        "--cursor belongs to another query: the same plan, --rule, --where, --from/--to, sort-key condition and order must be given with it"
    )]
    Foreign,
    #[error("--cursor points outside its query (was it changed?)")]
    OutOfRange,
}

/// FNV-1a 64 of the query's canonical form, as 16 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryId(pub String);

impl QueryId {
    /// The canonical form is the JSON array of strings
    /// `["rekey-query/1", table, partition key attr, sort key attr, rule, order,
    /// condition kind, condition a, condition b, key 0, key 1, …]`
    /// (`any`/`begins_with`/`between`; unused condition values are "").
    pub fn of(key: &LogicalKey, cond: &SkCondition, order: Order) -> QueryId {
        let (kind, a, b) = match cond {
            SkCondition::Any => ("any", "", ""),
            SkCondition::BeginsWith(p) => ("begins_with", p.as_str(), ""),
            SkCondition::Between(a, b) => ("between", a.as_str(), b.as_str()),
        };
        let mut parts: Vec<&str> = vec![
            "rekey-query/1",
            &key.table,
            &key.partition_key,
            &key.sort_key,
            &key.rule,
            order.name(),
            kind,
            a,
            b,
        ];
        parts.extend(key.keys.iter().map(String::as_str));
        let mut text = String::from("[");
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            json_string(&mut text, p);
        }
        text.push(']');
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        QueryId(format!("{h:016x}"))
    }
}

/// A merge position: the last item a page returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub key: usize,
    pub sk: String,
}

impl Cursor {
    pub fn encode(&self, query: &QueryId) -> String {
        let mut json = format!("{{\"v\":{VERSION},\"q\":");
        json_string(&mut json, &query.0);
        json.push_str(&format!(",\"k\":{},\"s\":", self.key));
        json_string(&mut json, &self.sk);
        json.push('}');
        BASE64URL.encode(json)
    }

    /// The position in `text`, checked against the query it must belong to:
    /// its id, its number of keys and its sort-key condition.
    pub fn decode(
        text: &str,
        query: &QueryId,
        keys: usize,
        cond: &SkCondition,
    ) -> Result<Cursor, CursorError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            v: u64,
            q: String,
            k: usize,
            s: String,
        }
        let bytes = BASE64URL
            .decode(text.trim())
            .map_err(|_| CursorError::Malformed)?;
        let version: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|_| CursorError::Malformed)?;
        match version.get("v").and_then(serde_json::Value::as_u64) {
            Some(VERSION) => {}
            Some(v) => return Err(CursorError::Version(v)),
            None => return Err(CursorError::Malformed),
        }
        let raw: Raw = serde_json::from_value(version).map_err(|_| CursorError::Malformed)?;
        debug_assert_eq!(raw.v, VERSION);
        if raw.q != query.0 {
            return Err(CursorError::Foreign);
        }
        if raw.k >= keys || !SkRange::of(cond).contains(&raw.s) {
            return Err(CursorError::OutOfRange);
        }
        Ok(Cursor {
            key: raw.k,
            sk: raw.s,
        })
    }
}

/// `s` as a JSON string, the way serde_json writes it compactly.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(keys: &[&str]) -> LogicalKey {
        LogicalKey {
            rule: "order".into(),
            table: "t".into(),
            partition_key: "PK".into(),
            sort_key: "SK".into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn the_json_escapes_are_serde_jsons() {
        for s in [
            "plain",
            "quote\" back\\ nl\n tab\t \u{1} \u{7f} é 😀 \u{2028} /",
            "",
        ] {
            let mut mine = String::new();
            json_string(&mut mine, s);
            assert_eq!(mine, serde_json::to_string(s).unwrap());
        }
    }

    #[test]
    fn a_cursor_round_trips_and_a_foreign_or_broken_one_is_refused() {
        let k = key(&["A#0", "A#1"]);
        let cond = SkCondition::BeginsWith("ORDER#".into());
        let q = QueryId::of(&k, &cond, Order::Ascending);
        let c = Cursor {
            key: 1,
            sk: "ORDER#\"7\"".into(),
        };
        let text = c.encode(&q);
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(Cursor::decode(&text, &q, 2, &cond), Ok(c.clone()));

        let other = QueryId::of(&key(&["B#0", "B#1"]), &cond, Order::Ascending);
        assert_eq!(
            Cursor::decode(&text, &other, 2, &cond),
            Err(CursorError::Foreign)
        );
        let desc = QueryId::of(&k, &cond, Order::Descending);
        assert_eq!(
            Cursor::decode(&text, &desc, 2, &cond),
            Err(CursorError::Foreign)
        );
        assert_eq!(
            Cursor::decode(&text, &q, 1, &cond),
            Err(CursorError::OutOfRange)
        );
        assert_eq!(
            Cursor::decode(&text[..text.len() - 3], &q, 2, &cond),
            Err(CursorError::Malformed)
        );
        assert_eq!(
            Cursor::decode("!!", &q, 2, &cond),
            Err(CursorError::Malformed)
        );
        let v2 = BASE64URL.encode(r#"{"v":2,"q":"x","k":0,"s":""}"#);
        assert_eq!(
            Cursor::decode(&v2, &q, 2, &cond),
            Err(CursorError::Version(2))
        );
        let outside = Cursor {
            key: 0,
            sk: "PROFILE".into(),
        }
        .encode(&q);
        assert_eq!(
            Cursor::decode(&outside, &q, 2, &cond),
            Err(CursorError::OutOfRange)
        );
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics(text in ".{0,120}", bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            let k = key(&["A"]);
            let q = QueryId::of(&k, &SkCondition::Any, Order::Ascending);
            let _ = Cursor::decode(&text, &q, 1, &SkCondition::Any);
            let _ = Cursor::decode(&BASE64URL.encode(&bytes), &q, 1, &SkCondition::Any);
        }
    }
}
