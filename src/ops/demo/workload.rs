//! The demo's table and its application's orders: 100 tenants in four
//! classes of very different weight, three days, drawn from a fixed seed.

// The tenants' classes (70 / 20 / 9 / 1) are the ones `rekey loadtest` draws from.
use crate::core::loadtest::scenario::CLASSES;
use crate::core::value::{Item, Value};

/// Three days; most orders are today's, as in any live system.
const DAYS: [(&str, u32); 3] = [("2026-07-05", 1), ("2026-07-06", 2), ("2026-07-07", 7)];

const TABLE_SEED: u64 = 0x5EED;
pub(super) const WRITER_SEED: u64 = 0xA99;

/// SplitMix64: a fixed, dependency-free sequence so the demo is reproducible.
pub(super) struct Rng(u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut r = self.next() % total;
        for (i, &w) in weights.iter().enumerate() {
            if r < u64::from(w) {
                return i;
            }
            r -= u64::from(w);
        }
        weights.len() - 1
    }
}

/// The skewed tenants and days, and a random sequence to draw orders from.
pub(super) struct Workload {
    /// (name, class)
    tenants: Vec<(String, &'static str)>,
    weights: Vec<u32>,
    day_weights: Vec<u32>,
    pub(super) rng: Rng,
}

impl Workload {
    pub(super) fn new(seed: u64) -> Workload {
        let mut tenants = Vec::new();
        let mut weights = Vec::new();
        for c in &CLASSES {
            for i in 0..c.tenants {
                tenants.push((format!("{}-{:02}", c.name, i), c.name));
                weights.push(c.weight);
            }
        }
        Workload {
            tenants,
            weights,
            day_weights: DAYS.iter().map(|d| d.1).collect(),
            rng: Rng(seed),
        }
    }

    /// One profile item per tenant.
    pub(super) fn profiles(&self) -> Vec<Item> {
        self.tenants
            .iter()
            .map(|(name, class)| {
                let mut it = Item::new();
                it.insert("PK".into(), Value::S(format!("TENANT#{name}")));
                it.insert("SK".into(), Value::S("PROFILE".into()));
                it.insert("class".into(), Value::S((*class).into()));
                it
            })
            .collect()
    }

    /// Order number `n`: a distinct order id for every `n` below 2^32, its
    /// tenant and day drawn by weight.
    pub(super) fn order(&mut self, n: u64) -> Item {
        let rng = &mut self.rng;
        let t = &self.tenants[rng.pick(&self.weights)].0;
        let day = DAYS[rng.pick(&self.day_weights)].0;
        let mut it = Item::new();
        it.insert("PK".into(), Value::S(format!("TENANT#{t}#DAY#{day}")));
        it.insert(
            "SK".into(),
            // Multiplying by an odd number is a bijection mod 2^32.
            Value::S(format!(
                "ORDER#{:08x}",
                n.wrapping_mul(2_654_435_761) % (1 << 32)
            )),
        );
        let status = if rng.next().is_multiple_of(5) {
            "OPEN"
        } else {
            "SHIPPED"
        };
        it.insert("status".into(), Value::S(status.into()));
        let (units, cents) = (rng.next() % 500, rng.next() % 100);
        it.insert("total".into(), Value::N(format!("{units}.{cents:02}")));
        it.insert("lines".into(), Value::N((1 + rng.next() % 9).to_string()));
        it
    }
}

/// The demo's items: one profile per tenant, then `orders` orders.
pub fn generate(orders: u64) -> Vec<Item> {
    let mut w = Workload::new(TABLE_SEED);
    let mut items = w.profiles();
    items.reserve(orders as usize);
    for n in 0..orders {
        items.push(w.order(n));
    }
    items
}

/// An order's key: (PK, SK).
pub(super) type OrderKey = (String, String);

pub(super) fn order_key(item: &Item) -> Option<OrderKey> {
    match (item.get("PK"), item.get("SK")) {
        (Some(Value::S(pk)), Some(Value::S(sk))) if sk.starts_with("ORDER#") => {
            Some((pk.clone(), sk.clone()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_skewed_and_reproducible() {
        let a = generate(10_000);
        assert_eq!(a.len(), 10_100);
        let b = generate(10_000);
        assert!(a == b);
        let hot = a
            .iter()
            .filter(|i| matches!(&i["PK"], Value::S(s) if s.starts_with("TENANT#pathological-00#DAY#2026-07-07")))
            .count();
        // 400 of 745 weight units, 70 % of them today: about 38 % of all orders on one key.
        assert!((3_300..4_200).contains(&hot), "{hot}");
    }
}
