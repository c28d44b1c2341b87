//! The item model: every DynamoDB attribute type, held without loss.
//!
//! rekey owns its own value type instead of passing the SDK's `AttributeValue`
//! around so that the pure core (plan, transform, analyze aggregates) compiles
//! and tests without the SDK, and so that DynamoDB JSON (sample files, exports)
//! decodes straight into it. Numbers stay decimal text end to end: a float would
//! silently lose digits past the 15th, and DynamoDB keeps 38.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An item: attribute name → value. A BTreeMap so that printing, hashing and
/// serialising an item is deterministic.
pub type Item = BTreeMap<String, Value>;

/// The largest item DynamoDB stores (400 KB, attribute names included).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// DynamoDB's limits on a single key attribute value, in bytes.
pub(crate) const MAX_PARTITION_KEY_BYTES: usize = 2048;
pub(crate) const MAX_SORT_KEY_BYTES: usize = 1024;

#[derive(Debug, Clone)]
pub enum Value {
    S(String),
    /// Decimal text exactly as DynamoDB gave it.
    N(String),
    B(Vec<u8>),
    Ss(Vec<String>),
    Ns(Vec<String>),
    Bs(Vec<Vec<u8>>),
    M(Item),
    L(Vec<Value>),
    Bool(bool),
    Null,
}

/// The scalar types a key attribute may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScalarType {
    S,
    N,
    B,
}

impl ScalarType {
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "S" => Some(Self::S),
            "N" => Some(Self::N),
            "B" => Some(Self::B),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::S => "S",
            Self::N => "N",
            Self::B => "B",
        }
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Value {
    /// DynamoDB's name for the type: `S`, `N`, `BOOL`, …
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::S(_) => "S",
            Value::N(_) => "N",
            Value::B(_) => "B",
            Value::Ss(_) => "SS",
            Value::Ns(_) => "NS",
            Value::Bs(_) => "BS",
            Value::M(_) => "M",
            Value::L(_) => "L",
            Value::Bool(_) => "BOOL",
            Value::Null => "NULL",
        }
    }

    pub(crate) fn scalar_type(&self) -> Option<ScalarType> {
        match self {
            Value::S(_) => Some(ScalarType::S),
            Value::N(_) => Some(ScalarType::N),
            Value::B(_) => Some(ScalarType::B),
            _ => None,
        }
    }

    /// The text a template sees for this value: strings and numbers only.
    pub(crate) fn as_text(&self) -> Option<&str> {
        match self {
            Value::S(s) | Value::N(s) => Some(s),
            _ => None,
        }
    }

    /// Size of the value by DynamoDB's accounting (without the attribute name).
    pub fn size(&self) -> usize {
        match self {
            Value::S(s) => s.len(),
            Value::N(n) => number_size(n),
            Value::B(b) => b.len(),
            Value::Ss(v) => v.iter().map(String::len).sum(),
            Value::Ns(v) => v.iter().map(|n| number_size(n)).sum(),
            Value::Bs(v) => v.iter().map(Vec::len).sum(),
            // Maps and lists: 3 bytes of overhead plus 1 byte per element.
            Value::M(m) => 3 + m.iter().map(|(k, v)| 1 + k.len() + v.size()).sum::<usize>(),
            Value::L(l) => 3 + l.iter().map(|v| 1 + v.size()).sum::<usize>(),
            Value::Bool(_) | Value::Null => 1,
        }
    }

    /// Text for reports: strings as they are, numbers as text, binary as base64.
    pub fn display_text(&self) -> String {
        match self {
            Value::S(s) | Value::N(s) => s.clone(),
            Value::B(b) => BASE64.encode(b),
            other => serde_json::to_string(other).unwrap_or_default(),
        }
    }
}

/// Item size by DynamoDB's rules: the sum over attributes of name bytes plus value size.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + v.size()).sum()
}

/// Write capacity units one put of an item of `bytes` consumes (1 KB steps, at least 1).
pub fn write_units(bytes: usize) -> u64 {
    (bytes.div_ceil(1024)).max(1) as u64
}

/// A number costs about one byte per two significant digits, plus one.
fn number_size(n: &str) -> usize {
    match parse_number(n) {
        Some(d) => d.digits.len().div_ceil(2) + 1,
        None => n.len(),
    }
}

/// A decimal number reduced to sign, significant digits and exponent, so that
/// `1.50`, `1.5` and `15E-1` compare equal, as DynamoDB treats them.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Decimal {
    negative: bool,
    digits: String,
    /// value = 0.digits × 10^exponent
    exponent: i64,
}

fn parse_number(text: &str) -> Option<Decimal> {
    let t = text.trim();
    let (negative, rest) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let all: String = format!("{int_part}{frac_part}");
    let leading = all.bytes().take_while(|&b| b == b'0').count();
    let digits = all[leading..].trim_end_matches('0').to_string();
    if digits.is_empty() {
        return Some(Decimal {
            negative: false,
            digits,
            exponent: 0,
        });
    }
    let exponent = int_part.len() as i64 - leading as i64 + exp;
    Some(Decimal {
        negative,
        digits,
        exponent,
    })
}

/// Whether `text` is a number DynamoDB accepts: decimal, at most 38 significant digits.
pub(crate) fn is_valid_number(text: &str) -> bool {
    matches!(parse_number(text), Some(d) if d.digits.len() <= 38)
}

/// Whether DynamoDB stores `text` as a number: [`is_valid_number`], and a
/// magnitude from 1E-130 up to (not including) 1E+126, or zero. (A value
/// `0.d × 10^e` lies in [10^(e-1), 10^e).)
pub(crate) fn is_storable_number(text: &str) -> bool {
    match parse_number(text) {
        Some(d) if d.digits.is_empty() => true,
        Some(d) => d.digits.len() <= 38 && (-129..=126).contains(&d.exponent),
        None => false,
    }
}

/// Why DynamoDB would refuse to store `value` (at attribute path `path`):
/// a number out of its range, an empty set, a set holding an element twice.
/// None when it stores it. BatchWriteItem answers these with a
/// ValidationException; an import counts them as errors and skips the item.
pub(crate) fn storage_refusal(path: &str, value: &Value) -> Option<String> {
    fn dup<T: std::hash::Hash + Eq>(keys: impl Iterator<Item = T>) -> bool {
        let mut seen = std::collections::HashSet::new();
        keys.into_iter().any(|k| !seen.insert(k))
    }
    let empty = |n: usize| (n == 0).then(|| format!("`{path}` is an empty set"));
    let twice = |d: bool| d.then(|| format!("`{path}` holds an element twice"));
    let bad_number = |n: &str| {
        (!is_storable_number(n)).then(|| format!("`{path}`: {n} is out of DynamoDB's number range"))
    };
    match value {
        Value::N(n) => bad_number(n),
        Value::Ss(v) => empty(v.len()).or_else(|| twice(dup(v.iter()))),
        Value::Bs(v) => empty(v.len()).or_else(|| twice(dup(v.iter()))),
        Value::Ns(v) => empty(v.len())
            .or_else(|| v.iter().find_map(|n| bad_number(n)))
            .or_else(|| twice(dup(v.iter().filter_map(|n| parse_number(n))))),
        Value::M(m) => m
            .iter()
            .find_map(|(k, v)| storage_refusal(&format!("{path}.{k}"), v)),
        Value::L(l) => l
            .iter()
            .enumerate()
            .find_map(|(i, v)| storage_refusal(&format!("{path}[{i}]"), v)),
        Value::S(_) | Value::B(_) | Value::Bool(_) | Value::Null => None,
    }
}

fn numbers_equal(a: &str, b: &str) -> bool {
    match (parse_number(a), parse_number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn same_set<T, F: Fn(&T, &T) -> bool>(a: &[T], b: &[T], eq: F) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.iter().any(|y| eq(x, y)))
}

/// Equality as DynamoDB means it: sets are unordered, numbers compare by value.
impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::S(a), Value::S(b)) => a == b,
            (Value::N(a), Value::N(b)) => numbers_equal(a, b),
            (Value::B(a), Value::B(b)) => a == b,
            (Value::Ss(a), Value::Ss(b)) => same_set(a, b, |x, y| x == y),
            (Value::Ns(a), Value::Ns(b)) => same_set(a, b, |x, y| numbers_equal(x, y)),
            (Value::Bs(a), Value::Bs(b)) => same_set(a, b, |x, y| x == y),
            (Value::M(a), Value::M(b)) => a == b,
            (Value::L(a), Value::L(b)) => a == b,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Null, Value::Null) => true,
            _ => false,
        }
    }
}

/// A key (one or two scalar attributes) encoded as bytes that sort and compare
/// exactly: a type tag, the value's length, the value. Used to find collisions
/// and to count keys without holding items.
pub fn encode_key(item: &Item, names: &[&str]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    for name in names {
        let v = item.get(*name)?;
        let (tag, bytes): (u8, &[u8]) = match v {
            Value::S(s) => (b'S', s.as_bytes()),
            Value::N(n) => (b'N', n.as_bytes()),
            Value::B(b) => (b'B', b),
            _ => return None,
        };
        out.push(tag);
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(bytes);
    }
    Some(out)
}

/// The inverse of [`encode_key`], for reports: each part as display text.
pub fn decode_key(bytes: &[u8]) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 5 {
        let tag = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let Some(body) = rest.get(5..5 + len) else {
            break;
        };
        parts.push(match tag {
            b'B' => BASE64.encode(body),
            _ => String::from_utf8_lossy(body).into_owned(),
        });
        rest = &rest[5 + len..];
    }
    parts
}

// ---- DynamoDB JSON -------------------------------------------------------
//
// `{"S":"x"}`, `{"N":"1"}`, `{"B":"<base64>"}`, `{"M":{…}}`, … — the form the
// CLI, Scan output and S3 exports use. Decoded by a visitor, not through
// serde_json::Value, because exports hold millions of items.

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut m = ser.serialize_map(Some(1))?;
        match self {
            Value::S(s) => m.serialize_entry("S", s)?,
            Value::N(n) => m.serialize_entry("N", n)?,
            Value::B(b) => m.serialize_entry("B", &BASE64.encode(b))?,
            Value::Ss(v) => m.serialize_entry("SS", v)?,
            Value::Ns(v) => m.serialize_entry("NS", v)?,
            Value::Bs(v) => {
                let enc: Vec<String> = v.iter().map(|b| BASE64.encode(b)).collect();
                m.serialize_entry("BS", &enc)?
            }
            Value::M(map) => m.serialize_entry("M", map)?,
            Value::L(l) => m.serialize_entry("L", l)?,
            Value::Bool(b) => m.serialize_entry("BOOL", b)?,
            Value::Null => m.serialize_entry("NULL", &true)?,
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_map(ValueVisitor)
    }
}

struct ValueVisitor;

struct Base64Bytes(Vec<u8>);
impl<'de> Deserialize<'de> for Base64Bytes {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(de)?;
        BASE64
            .decode(s.as_bytes())
            .map(Base64Bytes)
            .map_err(|e| de::Error::custom(format!("binary value is not base64: {e}")))
    }
}

struct NumberText(String);
impl<'de> Deserialize<'de> for NumberText {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let s = String::deserialize(de)?;
        if is_valid_number(&s) {
            Ok(NumberText(s))
        } else {
            Err(de::Error::custom(format!("`{s}` is not a DynamoDB number")))
        }
    }
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a DynamoDB JSON value such as {\"S\": \"text\"}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let tag: std::borrow::Cow<'de, str> = map
            .next_key()?
            .ok_or_else(|| de::Error::custom("empty DynamoDB JSON value: expected one type tag"))?;
        let v = match tag.as_ref() {
            "S" => Value::S(map.next_value()?),
            "N" => Value::N(map.next_value::<NumberText>()?.0),
            "B" => Value::B(map.next_value::<Base64Bytes>()?.0),
            "SS" => Value::Ss(map.next_value()?),
            "NS" => Value::Ns(
                map.next_value::<Vec<NumberText>>()?
                    .into_iter()
                    .map(|n| n.0)
                    .collect(),
            ),
            "BS" => Value::Bs(
                map.next_value::<Vec<Base64Bytes>>()?
                    .into_iter()
                    .map(|b| b.0)
                    .collect(),
            ),
            "M" => Value::M(map.next_value()?),
            "L" => Value::L(map.next_value()?),
            "BOOL" => Value::Bool(map.next_value()?),
            "NULL" => {
                let _: bool = map.next_value()?;
                Value::Null
            }
            other => {
                return Err(de::Error::custom(format!(
                    "unknown DynamoDB type tag `{other}` (expected S, N, B, SS, NS, BS, M, L, BOOL or NULL)"
                )));
            }
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "a DynamoDB JSON value has exactly one type tag",
            ));
        }
        Ok(v)
    }
    // Lists inside L arrive as sequences of values; nothing else is a sequence.
    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<Value, A::Error> {
        Err(de::Error::custom(
            "expected a DynamoDB JSON value, found an array",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(json: &str) -> Item {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn every_type_round_trips_through_dynamodb_json() {
        let text = r#"{"a":{"S":"x"},"b":{"N":"123456789012345678901234567890.12345678"},"c":{"B":"AAEC"},
            "d":{"SS":["p","q"]},"e":{"NS":["1","2.5"]},"f":{"BS":["AA=="]},
            "g":{"M":{"h":{"L":[{"BOOL":true},{"NULL":true},{"N":"-0.001"}]}}}}"#;
        let it = item(text);
        assert_eq!(
            it["b"],
            Value::N("123456789012345678901234567890.12345678".into())
        );
        assert_eq!(it["c"], Value::B(vec![0, 1, 2]));
        let again: Item = serde_json::from_str(&serde_json::to_string(&it).unwrap()).unwrap();
        assert_eq!(it, again);
        // Numbers keep every digit: no float in between.
        let Value::N(n) = &again["b"] else { panic!() };
        assert_eq!(n, "123456789012345678901234567890.12345678");
    }

    #[test]
    fn bad_dynamodb_json_is_an_error_not_a_panic() {
        for bad in [
            r#"{"a":{"X":"1"}}"#,
            r#"{"a":{"N":"12abc"}}"#,
            r#"{"a":{"B":"***"}}"#,
            r#"{"a":{}}"#,
            r#"{"a":{"S":"x","N":"1"}}"#,
            r#"{"a":[1]}"#,
        ] {
            assert!(serde_json::from_str::<Item>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn equality_follows_dynamodb_semantics() {
        assert_eq!(Value::N("1.50".into()), Value::N("1.5".into()));
        assert_eq!(Value::N("15E-1".into()), Value::N("1.5".into()));
        assert_eq!(Value::N("0".into()), Value::N("-0.0".into()));
        assert_ne!(Value::N("1".into()), Value::N("10".into()));
        assert_eq!(
            Value::Ss(vec!["a".into(), "b".into()]),
            Value::Ss(vec!["b".into(), "a".into()])
        );
        assert_ne!(Value::S("1".into()), Value::N("1".into()));
    }

    #[test]
    fn sizes_follow_dynamodb_rules() {
        assert_eq!(Value::S("héllo".into()).size(), 6); // UTF-8 bytes
        assert_eq!(Value::N("12345".into()).size(), 4); // 5 digits → 3 + 1
        assert_eq!(Value::N("0.00100".into()).size(), 2); // one significant digit
        assert_eq!(Value::Bool(true).size(), 1);
        assert_eq!(Value::Null.size(), 1);
        assert_eq!(Value::L(vec![Value::S("ab".into())]).size(), 3 + 1 + 2);
        let mut m = Item::new();
        m.insert("k".into(), Value::S("vv".into()));
        assert_eq!(Value::M(m.clone()).size(), 3 + 1 + 1 + 2);
        assert_eq!(item_size(&m), 3);
        assert_eq!(write_units(0), 1);
        assert_eq!(write_units(1024), 1);
        assert_eq!(write_units(1025), 2);
    }

    #[test]
    fn number_validation() {
        assert!(is_valid_number("-12.5e3"));
        assert!(is_valid_number(".5"));
        assert!(!is_valid_number("1.2.3"));
        assert!(!is_valid_number(""));
        assert!(!is_valid_number("1".repeat(39).as_str()));
        for ok in [
            "0",
            "-0.0",
            "9.9999999999999999999999999999999999999E+125",
            "1E-130",
            "-1E-130",
            "12.5",
        ] {
            assert!(is_storable_number(ok), "{ok}");
        }
        for bad in ["1E+126", "1E+200", "-1E+126", "1E-131", "0.1E-130", "x"] {
            assert!(!is_storable_number(bad), "{bad}");
        }
    }

    #[test]
    fn storage_refusals_name_the_attribute() {
        let it = item(
            r#"{"a":{"NS":["1","1.0"]},"b":{"M":{"c":{"L":[{"N":"1E+200"}]}}},"d":{"SS":["x","y"]},"e":{"N":"5"}}"#,
        );
        let why = |k: &str| storage_refusal(k, &it[k]);
        assert_eq!(why("a").unwrap(), "`a` holds an element twice");
        assert_eq!(
            why("b").unwrap(),
            "`b.c[0]`: 1E+200 is out of DynamoDB's number range"
        );
        assert_eq!(why("d"), None);
        assert_eq!(why("e"), None);
        assert_eq!(
            storage_refusal("s", &Value::Ss(vec![])).unwrap(),
            "`s` is an empty set"
        );
    }

    #[test]
    fn key_encoding_round_trips_and_separates_types() {
        let it = item(r#"{"PK":{"S":"a"},"SK":{"N":"1"}}"#);
        let k = encode_key(&it, &["PK", "SK"]).unwrap();
        assert_eq!(decode_key(&k), vec!["a".to_string(), "1".to_string()]);
        let other = item(r#"{"PK":{"S":"a"},"SK":{"S":"1"}}"#);
        assert_ne!(k, encode_key(&other, &["PK", "SK"]).unwrap());
        assert!(encode_key(&it, &["missing"]).is_none());
    }
}
