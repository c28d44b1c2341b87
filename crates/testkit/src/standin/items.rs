//! The stand-in's items: rekey's demo orders, generated from an index.
//!
//! Item `i` is a pure function of `(seed, i)`: the tenant (the demo's skewed
//! mix: 70 normal, 20 large, 9 enterprise tenants and 1 pathological one,
//! each class writing far more per tenant) and the day (mostly today) are
//! drawn from a SplitMix64 stream seeded by the index, so any item can be
//! made again from its key alone, in O(1), without holding any. The index
//! is in the sort key (`SK = ORDER#<index as 8+ hex digits>`), so a key read
//! back from a request names the item it belongs to.
//!
//! Attributes: `PK = TENANT#<tenant>#DAY#<day>`, `SK`, `status` (S), `total`
//! (N, two decimals), `lines` (N), and `pad` (S) filling the item up to the
//! requested size by DynamoDB's rules.

use rekey::core::value::{Item, Value};

use super::wire;

/// A tenant class: tenants in it, and how heavily each writes.
const CLASSES: [(&str, u32, u32); 4] = [
    ("normal", 70, 1),
    ("large", 20, 5),
    ("enterprise", 9, 25),
    ("pathological", 1, 400),
];

/// Three days; most orders are today's.
const DAYS: [(&str, u32); 3] = [("2026-07-05", 1), ("2026-07-06", 2), ("2026-07-07", 7)];

/// Longest pad: items stay under DynamoDB's 400 KB.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

const ORDER_PREFIX: &str = "ORDER#";

/// Makes items from their index.
#[derive(Debug, Clone)]
pub struct Generator {
    items: u64,
    item_bytes: usize,
    seed: u64,
    tenants: Vec<String>,
    /// One entry per unit of weight: a draw modulo its length picks a tenant.
    tenant_draw: Vec<u16>,
    day_draw: Vec<u8>,
    pad: String,
}

/// One generated order, before it is written out or made an [`Item`].
#[derive(Debug, Clone, Copy)]
pub struct Order<'g> {
    g: &'g Generator,
    pub index: u64,
    tenant: u16,
    day: u8,
    open: bool,
    /// Cents.
    total: u64,
    lines: u64,
    /// 0: as in the table; 1: as the stream's MODIFY leaves it.
    rev: u8,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Generator {
    /// `items` items of about `item_bytes` each (at least what the
    /// attributes other than `pad` take, ~80 bytes).
    pub fn new(items: u64, item_bytes: usize, seed: u64) -> Generator {
        let mut tenants = Vec::new();
        let mut tenant_draw = Vec::new();
        for (name, count, weight) in CLASSES {
            for i in 0..count {
                let t = tenants.len() as u16;
                tenants.push(format!("{name}-{i:02}"));
                tenant_draw.extend(std::iter::repeat_n(t, weight as usize));
            }
        }
        let day_draw = DAYS
            .iter()
            .enumerate()
            .flat_map(|(d, &(_, w))| std::iter::repeat_n(d as u8, w as usize))
            .collect();
        let item_bytes = item_bytes.min(MAX_ITEM_BYTES - 1024);
        let pad = (0..item_bytes)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        Generator {
            items,
            item_bytes,
            seed,
            tenants,
            tenant_draw,
            day_draw,
            pad,
        }
    }

    /// Items in the table (the stream's items come after them).
    pub fn items(&self) -> u64 {
        self.items
    }

    pub fn item_bytes(&self) -> usize {
        self.item_bytes
    }

    /// Item `index` (any index: the stream uses those past the table's).
    pub fn order(&self, index: u64) -> Order<'_> {
        let mut rng = Rng(self.seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let tenant = self.tenant_draw[(rng.next() % self.tenant_draw.len() as u64) as usize];
        let day = self.day_draw[(rng.next() % self.day_draw.len() as u64) as usize];
        let open = rng.next().is_multiple_of(5);
        let total = rng.next() % 50_000;
        let lines = 1 + rng.next() % 9;
        Order {
            g: self,
            index,
            tenant,
            day,
            open,
            total,
            lines,
            rev: 0,
        }
    }

    /// The index a key names: the hex digits after `ORDER#` in any of its
    /// string values (the source's `SK`, and any target key that keeps the
    /// order id).
    pub fn index_of_key(key: &Item) -> Option<u64> {
        key.values().find_map(|v| match v {
            Value::S(s) => index_in(s),
            _ => None,
        })
    }
}

/// The index in `ORDER#<hex>`, anywhere in `text`.
pub fn index_in(text: &str) -> Option<u64> {
    let at = text.find(ORDER_PREFIX)? + ORDER_PREFIX.len();
    let hex: &str = &text[at..];
    let end = hex
        .find(|c: char| !c.is_ascii_hexdigit())
        .unwrap_or(hex.len());
    u64::from_str_radix(&hex[..end], 16).ok()
}

impl<'g> Order<'g> {
    /// The same order as a MODIFY leaves it (`status` DELIVERED).
    pub fn modified(self) -> Order<'g> {
        Order { rev: 1, ..self }
    }

    fn tenant(&self) -> &'g str {
        &self.g.tenants[self.tenant as usize]
    }

    fn day(&self) -> &'static str {
        DAYS[self.day as usize].0
    }

    fn status(&self) -> &'static str {
        match (self.rev, self.open) {
            (1, _) => "DELIVERED",
            (_, true) => "OPEN",
            _ => "SHIPPED",
        }
    }

    fn pk_len(&self) -> usize {
        "TENANT#".len() + self.tenant().len() + "#DAY#".len() + self.day().len()
    }

    fn sk_len(&self) -> usize {
        ORDER_PREFIX.len() + hex_digits(self.index)
    }

    /// DynamoDB's size of `total` (`int.cc`): a byte per two significant
    /// digits, plus one.
    fn total_size(&self) -> usize {
        let mut digits = self.total;
        while digits > 0 && digits.is_multiple_of(10) {
            digits /= 10; // trailing zeros are not significant
        }
        let n = if digits == 0 { 0 } else { dec_digits(digits) };
        n.div_ceil(2) + 1
    }

    /// DynamoDB's size of everything but `pad`, attribute names included.
    fn base_size(&self) -> usize {
        2 + self.pk_len()
            + 2
            + self.sk_len()
            + "status".len()
            + self.status().len()
            + "total".len()
            + self.total_size()
            + "lines".len()
            + 2 // 1..9: one digit
    }

    fn pad_len(&self) -> usize {
        self.g
            .item_bytes
            .saturating_sub(self.base_size() + "pad".len())
    }

    /// The item's size by DynamoDB's rules.
    pub fn size(&self) -> usize {
        let pad = self.pad_len();
        self.base_size() + if pad > 0 { "pad".len() + pad } else { 0 }
    }

    pub fn pk(&self) -> String {
        format!("TENANT#{}#DAY#{}", self.tenant(), self.day())
    }

    pub fn sk(&self) -> String {
        format!("{ORDER_PREFIX}{:08x}", self.index)
    }

    fn total_text(&self) -> String {
        format!("{}.{:02}", self.total / 100, self.total % 100)
    }

    /// The item, for the transform and for tests.
    pub fn item(&self) -> Item {
        let mut it = Item::new();
        it.insert("PK".into(), Value::S(self.pk()));
        it.insert("SK".into(), Value::S(self.sk()));
        it.insert("status".into(), Value::S(self.status().into()));
        it.insert("total".into(), Value::N(self.total_text()));
        it.insert("lines".into(), Value::N(self.lines.to_string()));
        let pad = self.pad_len();
        if pad > 0 {
            it.insert("pad".into(), Value::S(self.g.pad[..pad].to_string()));
        }
        it
    }

    /// The key alone.
    pub fn key(&self) -> Item {
        let mut it = Item::new();
        it.insert("PK".into(), Value::S(self.pk()));
        it.insert("SK".into(), Value::S(self.sk()));
        it
    }

    /// Whether `key` (PK and SK) is this order's.
    pub fn has_key(&self, key: &Item) -> bool {
        let (Some(Value::S(pk)), Some(Value::S(sk))) = (key.get("PK"), key.get("SK")) else {
            return false;
        };
        key.len() == 2
            && index_in(sk) == Some(self.index)
            && sk.len() == self.sk_len()
            && pk.len() == self.pk_len()
            && *pk == self.pk()
    }

    fn write_pk(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"S":"TENANT#"#);
        out.extend_from_slice(self.tenant().as_bytes());
        out.extend_from_slice(b"#DAY#");
        out.extend_from_slice(self.day().as_bytes());
        out.extend_from_slice(br#""}"#);
    }

    fn write_sk(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"S":"ORDER#"#);
        wire::push_hex8(out, self.index);
        out.extend_from_slice(br#""}"#);
    }

    /// `{"PK":…,"SK":…}` in DynamoDB JSON.
    pub fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"PK":"#);
        self.write_pk(out);
        out.extend_from_slice(br#","SK":"#);
        self.write_sk(out);
        out.push(b'}');
    }

    /// The whole item in DynamoDB JSON, straight into `out` (no item built).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"PK":"#);
        self.write_pk(out);
        out.extend_from_slice(br#","SK":"#);
        self.write_sk(out);
        out.extend_from_slice(br#","status":{"S":""#);
        out.extend_from_slice(self.status().as_bytes());
        out.extend_from_slice(br#""},"total":{"N":""#);
        wire::push_u64(out, self.total / 100);
        out.push(b'.');
        let cents = self.total % 100;
        out.push(b'0' + (cents / 10) as u8);
        out.push(b'0' + (cents % 10) as u8);
        out.extend_from_slice(br#""},"lines":{"N":""#);
        wire::push_u64(out, self.lines);
        out.extend_from_slice(br#""}"#);
        let pad = self.pad_len();
        if pad > 0 {
            out.extend_from_slice(br#","pad":{"S":""#);
            out.extend_from_slice(&self.g.pad.as_bytes()[..pad]);
            out.extend_from_slice(br#""}"#);
        }
        out.push(b'}');
    }
}

fn hex_digits(n: u64) -> usize {
    let bits = 64 - n.leading_zeros() as usize;
    bits.div_ceil(4).max(8)
}

fn dec_digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use rekey::core::value::item_size;

    #[test]
    fn items_are_reproducible_sized_and_skewed() {
        let g = Generator::new(10_000, 500, 7);
        let mut hot = 0;
        for i in 0..10_000 {
            let o = g.order(i);
            let item = o.item();
            assert_eq!(o.size(), item_size(&item), "{item:?}");
            assert_eq!(o.size(), 500);
            let mut json = Vec::new();
            o.write_json(&mut json);
            let back: Item = serde_json::from_slice(&json).unwrap();
            assert_eq!(back, item);
            assert_eq!(Generator::index_of_key(&o.key()), Some(i));
            assert!(o.has_key(&o.key()));
            assert!(!g.order(i + 1).has_key(&o.key()));
            let mut key = Vec::new();
            o.write_key(&mut key);
            assert_eq!(serde_json::from_slice::<Item>(&key).unwrap(), o.key());
            if o.pk() == "TENANT#pathological-00#DAY#2026-07-07" {
                hot += 1;
            }
        }
        assert!((3_300..4_200).contains(&hot), "{hot}: the demo's skew");
        assert_eq!(g.order(5).item(), Generator::new(1, 500, 7).order(5).item());
        let m = g.order(3).modified();
        assert_eq!(m.item()["status"], Value::S("DELIVERED".into()));
        assert_eq!(m.size(), item_size(&m.item()));
        // Small items: no pad, still exact.
        let small = Generator::new(10, 10, 1);
        let o = small.order(0x1_2345_6789);
        assert_eq!(o.size(), item_size(&o.item()));
        assert!(!o.item().contains_key("pad"));
        assert_eq!(index_in("TENANT#x#SHARD#03|ORDER#00ff"), Some(255));
    }
}
