//! The stand-in's JSON: answers written straight into pre-sized buffers, and
//! write requests read without building their items.
//!
//! A write needs only its item's DynamoDB size (for the units) and, when
//! limits are enforced, its partition key's value; [`parse_batch_write`] and
//! [`parse_single`] walk the request with serde visitors that add sizes up
//! as they go and keep nothing else (strings are borrowed from the request
//! unless they hold escapes).

use std::fmt;
use std::ops::Deref;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rekey::core::value::{Item, Value};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

// ---- writing ----------------------------------------------------------------

pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// At least 8 lower-case hex digits.
pub fn push_hex8(out: &mut Vec<u8>, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (64 - n.leading_zeros() as usize).div_ceil(4).max(8);
    for d in (0..digits).rev() {
        out.push(HEX[((n >> (4 * d)) & 0xf) as usize]);
    }
}

/// A JSON number for a float (units: whole or halves).
pub fn push_f64(out: &mut Vec<u8>, x: f64) {
    use std::io::Write as _;
    let _ = write!(out, "{x:?}");
}

/// A JSON string.
pub fn push_str(out: &mut Vec<u8>, s: &str) {
    // No early exit: the loop vectorizes.
    let plain = !s.bytes().fold(false, |esc, b| {
        esc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// An item in DynamoDB JSON: strings and numbers written here, other types
/// through rekey's serializer.
pub fn push_item(out: &mut Vec<u8>, item: &Item) {
    out.push(b'{');
    for (i, (name, value)) in item.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, name);
        out.push(b':');
        match value {
            Value::S(s) => {
                out.extend_from_slice(br#"{"S":"#);
                push_str(out, s);
                out.push(b'}');
            }
            Value::N(n) => {
                out.extend_from_slice(br#"{"N":"#);
                push_str(out, n);
                out.push(b'}');
            }
            other => {
                let _ = serde_json::to_writer(&mut *out, other);
            }
        }
    }
    out.push(b'}');
}

/// What `ReturnConsumedCapacity` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Capacity {
    #[default]
    None,
    Total,
    Indexes,
}

impl Capacity {
    pub fn from_name(s: Option<&str>) -> Capacity {
        match s {
            Some("TOTAL") => Capacity::Total,
            Some("INDEXES") => Capacity::Indexes,
            _ => Capacity::None,
        }
    }

    fn from_raw(s: &[u8]) -> Capacity {
        Capacity::from_name(std::str::from_utf8(s).ok())
    }
}

/// One `ConsumedCapacity` entry: `{"TableName":…,"CapacityUnits":…}`, with
/// the table's own share when INDEXES was asked for (as the proxy gives it).
pub fn push_capacity(out: &mut Vec<u8>, table: &str, units: f64, cap: Capacity) {
    out.extend_from_slice(br#"{"TableName":"#);
    push_str(out, table);
    out.extend_from_slice(br#","CapacityUnits":"#);
    push_f64(out, units);
    if cap == Capacity::Indexes {
        out.extend_from_slice(br#","Table":{"CapacityUnits":"#);
        push_f64(out, units);
        out.push(b'}');
    }
    out.push(b'}');
}

/// Reads of `bytes` in 4 KB steps (at least one), halved unless consistent.
pub fn read_units(bytes: usize, consistent: bool) -> f64 {
    let units = bytes.div_ceil(4096).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

/// DynamoDB's size of a number: a byte per two significant digits, plus one
/// (as `rekey::core::value::Value::size`).
pub fn number_size(text: &str) -> usize {
    number_size_bytes(text.as_bytes())
}

fn number_size_bytes(text: &[u8]) -> usize {
    let t = text.trim_ascii();
    let t = t
        .strip_prefix(b"-")
        .or_else(|| t.strip_prefix(b"+"))
        .unwrap_or(t);
    let digits = t
        .split(|&b| b == b'e' || b == b'E')
        .next()
        .unwrap_or_default();
    let first = digits.iter().position(|&b| b != b'0' && b != b'.');
    let last = digits.iter().rposition(|&b| b != b'0' && b != b'.');
    let significant = match (first, last) {
        (Some(f), Some(l)) => digits[f..=l].iter().filter(|&&b| b != b'.').count(),
        _ => 0,
    };
    significant.div_ceil(2) + 1
}

// ---- reading ------------------------------------------------------------------

/// A string from the request, unescaped, as bytes: borrowed unless it had
/// escapes, and not checked for UTF-8 (serde_json's `deserialize_bytes`),
/// which a size does not need and which costs as much as the rest.
pub enum Raw<'de> {
    Borrowed(&'de [u8]),
    Owned(Vec<u8>),
}

impl Deref for Raw<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Raw::Borrowed(s) => s,
            Raw::Owned(s) => s,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Raw<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Raw<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_bytes<E>(self, v: &'de [u8]) -> Result<Raw<'de>, E> {
                Ok(Raw::Borrowed(v))
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Raw<'de>, E> {
                Ok(Raw::Owned(v.to_vec()))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Raw<'de>, E> {
                Ok(Raw::Borrowed(v.as_bytes()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Raw<'de>, E> {
                Ok(Raw::Owned(v.as_bytes().to_vec()))
            }
        }
        de.deserialize_bytes(V)
    }
}

/// What a write needs of an item (or a key).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ItemInfo {
    /// DynamoDB's size, attribute names included.
    pub size: usize,
    /// `(i, encoding)` for each attribute named `capture[i]` that holds a
    /// scalar, encoded as `rekey::core::value::encode_key` encodes one attribute.
    pub keys: Vec<(usize, Vec<u8>)>,
}

impl ItemInfo {
    /// The encoding of `capture[i]`, if the item had it.
    pub fn key(&self, i: usize) -> Option<&[u8]> {
        self.keys
            .iter()
            .find(|(j, _)| *j == i)
            .map(|(_, k)| k.as_slice())
    }
}

/// An item: sizes added up, the `capture` attributes' values kept.
#[derive(Clone, Copy)]
struct ItemSeed<'a> {
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = ItemInfo;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<ItemInfo, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = ItemInfo;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an item in DynamoDB JSON")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ItemInfo, A::Error> {
        let mut info = ItemInfo::default();
        while let Some(name) = map.next_key::<Raw>()? {
            let want = self.capture.iter().position(|c| c.as_bytes() == &*name);
            let (size, key) = map.next_value_seed(AttrSeed {
                capture: want.is_some(),
            })?;
            info.size += name.len() + size;
            if let (Some(i), Some(k)) = (want, key) {
                info.keys.push((i, k));
            }
        }
        Ok(info)
    }
}

fn encode(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + bytes.len());
    out.push(tag);
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

fn base64_len(t: &[u8]) -> usize {
    let pad = t.iter().rev().take_while(|&&b| b == b'=').count();
    (t.len() * 3 / 4).saturating_sub(pad)
}

/// One attribute value: its size, and its key encoding when asked and scalar.
struct AttrSeed {
    capture: bool,
}

impl<'de> DeserializeSeed<'de> for AttrSeed {
    type Value = (usize, Option<Vec<u8>>);
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AttrSeed {
    type Value = (usize, Option<Vec<u8>>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a DynamoDB JSON value such as {\"S\": \"text\"}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let tag: Raw = map
            .next_key()?
            .ok_or_else(|| de::Error::custom("empty DynamoDB JSON value"))?;
        let out = match &*tag {
            b"S" => {
                let t: Raw = map.next_value()?;
                (t.len(), self.capture.then(|| encode(b'S', &t)))
            }
            b"N" => {
                let t: Raw = map.next_value()?;
                (
                    number_size_bytes(&t),
                    self.capture.then(|| encode(b'N', &t)),
                )
            }
            b"B" => {
                let t: Raw = map.next_value()?;
                let key = match self.capture {
                    true => Some(encode(
                        b'B',
                        &BASE64.decode(&*t).map_err(de::Error::custom)?,
                    )),
                    false => None,
                };
                (base64_len(&t), key)
            }
            b"SS" => (map.next_value_seed(SetSeed(|t: &[u8]| t.len()))?, None),
            b"NS" => (map.next_value_seed(SetSeed(number_size_bytes))?, None),
            b"BS" => (map.next_value_seed(SetSeed(base64_len))?, None),
            b"M" => (3 + map.next_value_seed(MapSeed)?, None),
            b"L" => (3 + map.next_value_seed(ListSeed)?, None),
            b"BOOL" | b"NULL" => {
                map.next_value::<IgnoredAny>()?;
                (1, None)
            }
            other => {
                return Err(de::Error::custom(format!(
                    "unknown DynamoDB type tag `{}`",
                    String::from_utf8_lossy(other)
                )));
            }
        };
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "a DynamoDB JSON value has exactly one type tag",
            ));
        }
        Ok(out)
    }
}

/// A set: the sum of its members' sizes.
struct SetSeed<F>(F);

impl<'de, F: Fn(&[u8]) -> usize> DeserializeSeed<'de> for SetSeed<F> {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<usize, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de, F: Fn(&[u8]) -> usize> Visitor<'de> for SetSeed<F> {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of strings")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut sum = 0;
        while let Some(t) = seq.next_element::<Raw>()? {
            sum += (self.0)(&t);
        }
        Ok(sum)
    }
}

/// A map's members: 1 byte each plus name and value (the 3 bytes of the map
/// itself are the caller's).
struct MapSeed;

impl<'de> DeserializeSeed<'de> for MapSeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<usize, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MapSeed {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of DynamoDB JSON values")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut sum = 0;
        while let Some(name) = map.next_key::<Raw>()? {
            let (size, _) = map.next_value_seed(AttrSeed { capture: false })?;
            sum += 1 + name.len() + size;
        }
        Ok(sum)
    }
}

struct ListSeed;

impl<'de> DeserializeSeed<'de> for ListSeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<usize, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ListSeed {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of DynamoDB JSON values")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut sum = 0;
        while let Some((size, _)) = seq.next_element_seed(AttrSeed { capture: false })? {
            sum += 1 + size;
        }
        Ok(sum)
    }
}

/// One entry of a BatchWriteItem.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteEntry {
    /// A put (`Item`); otherwise a delete (`Key`).
    pub put: bool,
    pub info: ItemInfo,
}

#[derive(Debug, Default)]
pub struct BatchWrite {
    /// Per table, in request order.
    pub tables: Vec<(String, Vec<WriteEntry>)>,
    pub capacity: Capacity,
}

/// A BatchWriteItem request: each entry's size and captured key values.
pub fn parse_batch_write(body: &[u8], capture: &[&str]) -> serde_json::Result<BatchWrite> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let out = BatchWriteSeed { capture }.deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

struct BatchWriteSeed<'a> {
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for BatchWriteSeed<'_> {
    type Value = BatchWrite;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<BatchWrite, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BatchWriteSeed<'_> {
    type Value = BatchWrite;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a BatchWriteItem request")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BatchWrite, A::Error> {
        let mut out = BatchWrite::default();
        while let Some(field) = map.next_key::<Raw>()? {
            match &*field {
                b"RequestItems" => {
                    out.tables = map.next_value_seed(TablesSeed {
                        capture: self.capture,
                    })?
                }
                b"ReturnConsumedCapacity" => {
                    let t: Raw = map.next_value()?;
                    out.capacity = Capacity::from_raw(&t);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

struct TablesSeed<'a> {
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for TablesSeed<'_> {
    type Value = Vec<(String, Vec<WriteEntry>)>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TablesSeed<'_> {
    type Value = Vec<(String, Vec<WriteEntry>)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("RequestItems")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(table) = map.next_key::<String>()? {
            let entries = map.next_value_seed(EntriesSeed {
                capture: self.capture,
            })?;
            out.push((table, entries));
        }
        Ok(out)
    }
}

struct EntriesSeed<'a> {
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for EntriesSeed<'_> {
    type Value = Vec<WriteEntry>;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EntriesSeed<'_> {
    type Value = Vec<WriteEntry>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of write requests")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(25));
        while let Some(e) = seq.next_element_seed(EntrySeed {
            capture: self.capture,
        })? {
            out.push(e);
        }
        Ok(out)
    }
}

struct EntrySeed<'a> {
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = WriteEntry;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<WriteEntry, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = WriteEntry;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("{\"PutRequest\": …} or {\"DeleteRequest\": …}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WriteEntry, A::Error> {
        let mut out = None;
        while let Some(kind) = map.next_key::<Raw>()? {
            let (put, field) = match &*kind {
                b"PutRequest" => (true, "Item"),
                b"DeleteRequest" => (false, "Key"),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let info = map.next_value_seed(FieldSeed {
                field,
                capture: self.capture,
            })?;
            out = Some(WriteEntry { put, info });
        }
        out.ok_or_else(|| de::Error::custom("a write request needs PutRequest or DeleteRequest"))
    }
}

/// `{field: <item>}` (other members skipped).
struct FieldSeed<'a> {
    field: &'static str,
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = ItemInfo;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<ItemInfo, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed<'_> {
    type Value = ItemInfo;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object with `{}`", self.field)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ItemInfo, A::Error> {
        let mut out = None;
        while let Some(name) = map.next_key::<Raw>()? {
            if &*name == self.field.as_bytes() {
                out = Some(map.next_value_seed(ItemSeed {
                    capture: self.capture,
                })?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        out.ok_or_else(|| de::Error::missing_field(self.field))
    }
}

/// A PutItem, DeleteItem or UpdateItem request: its table, its `Item` or
/// `Key`, and `ReturnConsumedCapacity`; the rest (expressions) is skipped.
#[derive(Debug, Default)]
pub struct Single {
    pub table: String,
    pub item: Option<ItemInfo>,
    pub capacity: Capacity,
}

pub fn parse_single(
    body: &[u8],
    field: &'static str,
    capture: &[&str],
) -> serde_json::Result<Single> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let out = SingleSeed { field, capture }.deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

struct SingleSeed<'a> {
    field: &'static str,
    capture: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for SingleSeed<'_> {
    type Value = Single;
    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Single, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SingleSeed<'_> {
    type Value = Single;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a single-item request")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Single, A::Error> {
        let mut out = Single::default();
        while let Some(name) = map.next_key::<Raw>()? {
            match &*name {
                b"TableName" => out.table = map.next_value()?,
                b"ReturnConsumedCapacity" => {
                    let t: Raw = map.next_value()?;
                    out.capacity = Capacity::from_raw(&t);
                }
                n if n == self.field.as_bytes() => {
                    out.item = Some(map.next_value_seed(ItemSeed {
                        capture: self.capture,
                    })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rekey::core::value::{encode_key, item_size};

    #[test]
    fn sizes_and_keys_match_rekeys_item_model() {
        let text = r#"{"PK":{"S":"a\"b"},"SK":{"N":"-0012.3400e5"},"c":{"B":"AAEC"},
            "d":{"SS":["p","qq"]},"e":{"NS":["1","2.5"]},"f":{"BS":["AA=="]},
            "g":{"M":{"h":{"L":[{"BOOL":true},{"NULL":true},{"N":"-0.001"}]}}},"h":{"S":"héllo"}}"#;
        let item: Item = serde_json::from_str(text).unwrap();
        let body = format!(
            r#"{{"ReturnConsumedCapacity":"INDEXES","RequestItems":{{"t":[{{"PutRequest":{{"Item":{text}}}}},{{"DeleteRequest":{{"Key":{{"PK":{{"B":"AAEC"}}}}}}}}]}}}}"#
        );
        let req = parse_batch_write(body.as_bytes(), &["SK", "PK"]).unwrap();
        assert_eq!(req.capacity, Capacity::Indexes);
        let (table, entries) = &req.tables[0];
        assert_eq!(table, "t");
        assert!(entries[0].put && !entries[1].put);
        assert_eq!(entries[0].info.size, item_size(&item));
        assert_eq!(
            entries[0].info.key(1),
            encode_key(&item, &["PK"]).as_deref()
        );
        assert_eq!(
            entries[0].info.key(0),
            encode_key(&item, &["SK"]).as_deref()
        );
        let key = Item::from([("PK".to_string(), Value::B(vec![0, 1, 2]))]);
        assert_eq!(entries[1].info.key(1), encode_key(&key, &["PK"]).as_deref());
        assert_eq!(entries[1].info.size, item_size(&key));

        for n in [
            "0",
            "-0.0",
            "100",
            "0.00100",
            "12345",
            "1.5e10",
            "9".repeat(38).as_str(),
        ] {
            assert_eq!(number_size(n), Value::N(n.into()).size(), "{n}");
        }

        let single = parse_single(
            br#"{"Key":{"PK":{"S":"k"}},"UpdateExpression":"SET a = :a","TableName":"t"}"#,
            "Key",
            &["PK"],
        )
        .unwrap();
        assert_eq!(single.table, "t");
        assert_eq!(single.capacity, Capacity::None);
        assert_eq!(single.item.unwrap().size, 3);
        assert!(parse_batch_write(br#"{"RequestItems":{"t":[{"X":1}]}}"#, &[]).is_err());
    }

    #[test]
    fn numbers_and_strings_are_written_as_json() {
        let mut out = Vec::new();
        push_u64(&mut out, 0);
        out.push(b' ');
        push_u64(&mut out, 18_446_744_073_709_551_615);
        out.push(b' ');
        push_hex8(&mut out, 255);
        out.push(b' ');
        push_hex8(&mut out, 0x1_0000_0000);
        out.push(b' ');
        push_f64(&mut out, 2.0);
        out.push(b' ');
        push_f64(&mut out, 0.5);
        out.push(b' ');
        push_str(&mut out, "a\"b");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"0 18446744073709551615 000000ff 100000000 2.0 0.5 "a\"b""#
        );
        let item: Item = serde_json::from_str(
            r#"{"a\n":{"S":"x\u0001"},"b":{"N":"1.50"},"c":{"L":[{"B":"AAEC"},{"NULL":true}]}}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        push_item(&mut out, &item);
        let back: Item = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, item);
        let Value::N(n) = &back["b"] else { panic!() };
        assert_eq!(n, "1.50");
    }
}
