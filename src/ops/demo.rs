//! `rekey demo`: the whole point of rekey in one command, on a fresh machine.
//!
//! Starts DynamoDB Local, loads an orders table with the tenant skew the load
//! testing advice calls for — 70 % normal tenants, 20 % large, 9 % enterprise,
//! 1 % pathological — keyed `TENANT#t#DAY#d`, and analyzes it with
//! `plans/tenant-day-shard.toml`: the hot tenant-day key before, the spread
//! after. The data is generated from a fixed seed, so every run shows the same
//! numbers.

use std::path::Path;

use crate::aws::{AwsOptions, Clients};
use crate::core::plan::Plan;
use crate::core::value::{Item, Value};
use crate::local::{LocalOptions, LocalServer};
use crate::phase::analyze::{self, AnalyzeOptions, Report, ScanSettings};
use crate::phase::progress::Progress;

pub const DEMO_PLAN: &str = include_str!("../../plans/tenant-day-shard.toml");
/// Items/s the demo's application writes, for the load estimate: enough that
/// the hot tenant-day key crosses 1,000 WCU/s in the old design.
pub const DEMO_APP_WRITE_RATE: f64 = 3000.0;

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub items: u64,
    pub moto_server: Option<std::path::PathBuf>,
    /// Use this DynamoDB instead of starting the local server.
    pub endpoint_url: Option<String>,
    pub analyze: AnalyzeOptions,
}

/// A tenant class of the skewed workload: how many tenants, and how heavily
/// each writes relative to a normal tenant.
struct Class {
    name: &'static str,
    tenants: u32,
    weight: u32,
}

/// 100 tenants: 70 / 20 / 9 / 1, each class writing far more per tenant.
const CLASSES: [Class; 4] = [
    Class {
        name: "normal",
        tenants: 70,
        weight: 1,
    },
    Class {
        name: "large",
        tenants: 20,
        weight: 5,
    },
    Class {
        name: "enterprise",
        tenants: 9,
        weight: 25,
    },
    Class {
        name: "pathological",
        tenants: 1,
        weight: 400,
    },
];

/// Three days; most orders are today's, as in any live system.
const DAYS: [(&str, u32); 3] = [("2026-07-05", 1), ("2026-07-06", 2), ("2026-07-07", 7)];

/// SplitMix64: a fixed, dependency-free sequence so the demo is reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
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

/// The demo's items: one profile per tenant, then `orders` orders.
pub fn generate(orders: u64) -> Vec<Item> {
    let mut tenants: Vec<(String, &'static str, u32)> = Vec::new();
    for c in &CLASSES {
        for i in 0..c.tenants {
            tenants.push((format!("{}-{:02}", c.name, i), c.name, c.weight));
        }
    }
    let weights: Vec<u32> = tenants.iter().map(|t| t.2).collect();
    let day_weights: Vec<u32> = DAYS.iter().map(|d| d.1).collect();
    let mut rng = Rng(0x5EED);
    let mut items = Vec::with_capacity(orders as usize + tenants.len());
    for (name, class, _) in &tenants {
        let mut it = Item::new();
        it.insert("PK".into(), Value::S(format!("TENANT#{name}")));
        it.insert("SK".into(), Value::S("PROFILE".into()));
        it.insert("class".into(), Value::S((*class).into()));
        items.push(it);
    }
    for n in 0..orders {
        let t = &tenants[rng.pick(&weights)].0;
        let day = DAYS[rng.pick(&day_weights)].0;
        let mut it = Item::new();
        it.insert("PK".into(), Value::S(format!("TENANT#{t}#DAY#{day}")));
        it.insert(
            "SK".into(),
            Value::S(format!(
                "ORDER#{:08x}",
                n.wrapping_mul(2_654_435_761) % (1 << 32)
            )),
        );
        it.insert(
            "status".into(),
            Value::S(
                if rng.next().is_multiple_of(5) {
                    "OPEN"
                } else {
                    "SHIPPED"
                }
                .into(),
            ),
        );
        it.insert(
            "total".into(),
            Value::N(format!("{}.{:02}", rng.next() % 500, rng.next() % 100)),
        );
        it.insert("lines".into(), Value::N((1 + rng.next() % 9).to_string()));
        items.push(it);
    }
    items
}

pub struct DemoRun {
    pub plan: Plan,
    pub report: Report,
    /// Keeps DynamoDB Local alive until the caller is done with the report.
    pub local: Option<LocalServer>,
}

pub async fn run(opts: &DemoOptions, progress: &Progress) -> anyhow::Result<DemoRun> {
    let (local, endpoint) = match &opts.endpoint_url {
        Some(url) => (None, url.clone()),
        None => {
            let l = LocalServer::start(&LocalOptions {
                server: opts.moto_server.clone(),
                port: None,
            })
            .await?;
            let e = l.endpoint().to_string();
            (Some(l), e)
        }
    };
    let clients = Clients::connect(&AwsOptions {
        endpoint_url: Some(endpoint),
        region: Some("us-east-1".into()),
        static_credentials: Some(("demo".into(), "demo".into())),
        ..Default::default()
    })
    .await?;
    let mut plan = Plan::parse(DEMO_PLAN, Path::new("plans/tenant-day-shard.toml"))?;
    // A fresh name, so the demo also runs against a DynamoDB that has tables.
    plan.source_table = format!("rekey-demo-orders-{}", std::process::id());
    clients
        .create_table(&plan.source_table, &plan.source_key, false)
        .await?;
    let items = generate(opts.items);
    progress.start("loading", Some(items.len() as u64));
    let mut loaded = 0;
    for chunk in items.chunks(2_000) {
        let wcu = crate::aws::write::put_all(&clients, &plan.source_table, chunk, 8).await?;
        loaded += chunk.len() as u64;
        progress.update(loaded, wcu);
    }
    progress.finish();
    let report = analyze::run(
        &clients,
        &plan,
        &ScanSettings {
            segments: Some(4),
            read_rate: None,
            page_limit: None,
        },
        opts.analyze.clone(),
        None,
        progress,
    )
    .await?;
    Ok(DemoRun {
        plan,
        report,
        local,
    })
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
