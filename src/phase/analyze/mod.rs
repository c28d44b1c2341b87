//! The staging dry run: what the plan would do to every item, and whether the
//! new key design really spreads the load.
//!
//! [`Analyzer`] takes items one at a time and keeps only counters and spill
//! aggregates, so it runs on tables far larger than memory; it does no network
//! I/O and is tested with plain items. [`run`] feeds it from a parallel Scan.
//!
//! Everything is exact: collisions are found by an external sort-aggregate over
//! every target key, not sampled; cardinalities are counts of distinct keys.

pub(crate) mod render;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::aws::rate::Control;
use crate::aws::scan::{self, Page, ScanOptions};
use crate::aws::{Clients, TableInfo};
use crate::core::plan::Plan;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, decode_key, encode_key, item_size, write_units};
use crate::phase::progress::Progress;
use crate::state::rejects::RejectsFile;
use crate::state::spill::{
    Aggregate, Claimants, ExternalAggregator, SpillError, SpillOptions, get_varint, put_varint,
};

/// DynamoDB's per-partition write ceiling.
pub const PARTITION_WCU: f64 = 1000.0;
/// DynamoDB's per-partition read ceiling (strongly consistent reads of 4 KB).
pub const PARTITION_RCU: f64 = 3000.0;
/// Item collections are capped at 10 GB on tables with local secondary indexes;
/// flag collections past 80 % of that.
pub const COLLECTION_WARN_BYTES: u64 = 8 * 1024 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct AnalyzeOptions {
    /// How many hottest keys to list.
    pub top: usize,
    /// Examples kept per reject reason and for collisions.
    pub examples: usize,
    /// The backfill's write budget, WCU/s, for the load estimate.
    pub backfill_write_rate: f64,
    /// The application's write rate, items/s, spread as the items are.
    pub app_write_rate: Option<f64>,
    /// Memory for each spill aggregate before it goes to disk.
    pub spill_memory_bytes: usize,
    pub spill_dir: Option<PathBuf>,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            top: 10,
            examples: 3,
            backfill_write_rate: 1000.0,
            app_write_rate: None,
            spill_memory_bytes: 64 * 1024 * 1024,
            spill_dir: None,
        }
    }
}

/// Per key: items, bytes, and the write units one put of each costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct KeyLoad {
    items: u64,
    bytes: u64,
    wcu: u64,
}

impl KeyLoad {
    fn of(bytes: usize) -> KeyLoad {
        KeyLoad {
            items: 1,
            bytes: bytes as u64,
            wcu: write_units(bytes),
        }
    }
}

impl Aggregate for KeyLoad {
    fn merge(&mut self, o: Self) {
        self.items += o.items;
        self.bytes += o.bytes;
        self.wcu += o.wcu;
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.items);
        put_varint(out, self.bytes);
        put_varint(out, self.wcu);
    }
    fn decode(buf: &[u8]) -> Result<(Self, usize), SpillError> {
        let (items, a) = get_varint(buf)?;
        let (bytes, b) = get_varint(&buf[a..])?;
        let (wcu, c) = get_varint(&buf[a + b..])?;
        Ok((KeyLoad { items, bytes, wcu }, a + b + c))
    }
}

/// One key attribute's distribution being collected.
struct Collector {
    attribute: String,
    keys: ExternalAggregator<KeyLoad>,
    total: KeyLoad,
}

impl Collector {
    fn new(attribute: &str, opts: &AnalyzeOptions) -> Result<Collector, SpillError> {
        Ok(Collector {
            attribute: attribute.to_string(),
            keys: ExternalAggregator::new(spill_opts(opts))?,
            total: KeyLoad::default(),
        })
    }

    fn add(&mut self, item: &Item, bytes: usize) -> Result<(), SpillError> {
        if let Some(k) = encode_key(item, &[&self.attribute]) {
            let load = KeyLoad::of(bytes);
            self.total.merge(load);
            self.keys.add(&k, load)?;
        }
        Ok(())
    }

    fn finish(self, opts: &AnalyzeOptions) -> Result<Distribution, SpillError> {
        let total = self.total;
        let scenarios: Vec<(String, f64)> =
            std::iter::once(("backfill".to_string(), opts.backfill_write_rate))
                .chain(opts.app_write_rate.map(|r| ("application".to_string(), r)))
                .collect();
        // WCU/s a key receives under each scenario.
        let per_key = |l: &KeyLoad, scenario: usize| -> f64 {
            let (name, rate) = &scenarios[scenario];
            if name == "backfill" {
                if total.wcu == 0 {
                    0.0
                } else {
                    rate * l.wcu as f64 / total.wcu as f64
                }
            } else if total.items == 0 {
                0.0
            } else {
                rate * l.wcu as f64 / total.items as f64
            }
        };
        let mut cardinality = 0u64;
        let mut by_items: BinaryHeap<Reverse<TopEntry>> = BinaryHeap::new();
        let mut by_bytes: BinaryHeap<Reverse<TopEntry>> = BinaryHeap::new();
        let mut near_limit = 0u64;
        let mut loads: Vec<LoadAcc> = scenarios.iter().map(|_| LoadAcc::default()).collect();
        let mut merged = self.keys.finish()?;
        for entry in &mut merged {
            let (key, l) = entry?;
            cardinality += 1;
            if l.bytes >= COLLECTION_WARN_BYTES {
                near_limit += 1;
            }
            for (i, acc) in loads.iter_mut().enumerate() {
                acc.add(per_key(&l, i), l.items);
            }
            push_top(&mut by_items, opts.top, (l.items, Reverse(key.clone()), l));
            push_top(&mut by_bytes, opts.top, (l.bytes, Reverse(key), l));
        }
        merged.close()?;
        let hot = |heap: BinaryHeap<Reverse<TopEntry>>| -> Vec<HotKey> {
            let mut v: Vec<_> = heap.into_iter().map(|Reverse(x)| x).collect();
            // Largest first; ties by key so output is deterministic.
            v.sort_by(|a, b| b.cmp(a));
            v.into_iter()
                .map(|(_, Reverse(key), l)| HotKey {
                    key: decode_key(&key).join(""),
                    items: l.items,
                    bytes: l.bytes,
                    item_share: ratio(l.items, total.items),
                    byte_share: ratio(l.bytes, total.bytes),
                    predicted_wcu: (0..scenarios.len()).map(|i| per_key(&l, i)).collect(),
                })
                .collect()
        };
        Ok(Distribution {
            attribute: self.attribute,
            items: total.items,
            bytes: total.bytes,
            cardinality,
            hottest_by_items: hot(by_items),
            largest_by_bytes: hot(by_bytes),
            collections_near_10gb: near_limit,
            load: scenarios
                .iter()
                .zip(loads)
                .map(|((name, rate), acc)| acc.finish(name, *rate))
                .collect(),
        })
    }
}

/// (value, key reversed, load): the heap's minimum is the entry to evict — the
/// smallest value, and among equal values the largest key, so the result does
/// not depend on the order keys arrive in.
type TopEntry = (u64, Reverse<Vec<u8>>, KeyLoad);

fn push_top(heap: &mut BinaryHeap<Reverse<TopEntry>>, n: usize, entry: TopEntry) {
    if n == 0 {
        return;
    }
    if heap.len() < n {
        heap.push(Reverse(entry));
    } else if let Some(Reverse(min)) = heap.peek()
        && (entry.0, &entry.1) > (min.0, &min.1)
    {
        heap.pop();
        heap.push(Reverse(entry));
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Histogram edges, WCU/s per key: <1, 1–10, 10–100, 100–1000, ≥1000 (throttles).
pub const LOAD_EDGES: [f64; 4] = [1.0, 10.0, 100.0, PARTITION_WCU];

#[derive(Default)]
struct LoadAcc {
    max: f64,
    over: u64,
    items_over: u64,
    keys: [u64; 5],
    items: [u64; 5],
}

impl LoadAcc {
    fn add(&mut self, wcu: f64, items: u64) {
        self.max = self.max.max(wcu);
        let b = LOAD_EDGES.iter().position(|e| wcu < *e).unwrap_or(4);
        self.keys[b] += 1;
        self.items[b] += items;
        if wcu > PARTITION_WCU {
            self.over += 1;
            self.items_over += items;
        }
    }
    fn finish(self, scenario: &str, rate: f64) -> Load {
        Load {
            scenario: scenario.to_string(),
            rate,
            rate_unit: if scenario == "backfill" {
                "WCU/s"
            } else {
                "items/s"
            }
            .to_string(),
            max_key_wcu: self.max,
            keys_over_limit: self.over,
            items_on_keys_over_limit: self.items_over,
            histogram: (0..5)
                .map(|i| Bin {
                    from_wcu: if i == 0 { 0.0 } else { LOAD_EDGES[i - 1] },
                    to_wcu: LOAD_EDGES.get(i).copied(),
                    keys: self.keys[i],
                    items: self.items[i],
                })
                .collect(),
        }
    }
}

// ---- the report ----------------------------------------------------------------

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub source_table: String,
    pub target_table: String,
    pub scanned: u64,
    /// Items the SDK could not decode (an attribute type it does not know).
    pub unreadable: u64,
    pub matched: Vec<RuleCount>,
    pub copied_unmatched: u64,
    pub skipped: u64,
    pub rejected: u64,
    pub reject_reasons: Vec<ReasonReport>,
    pub collisions: Collisions,
    pub old: Distribution,
    pub new: Distribution,
    pub indexes: Vec<IndexReport>,
    pub consumed_rcu: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RuleCount {
    pub rule: String,
    pub items: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReasonReport {
    pub reason: String,
    pub count: u64,
    pub examples: Vec<RejectExample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RejectExample {
    pub source_key: Vec<String>,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Collisions {
    /// Target keys claimed by more than one source item.
    pub target_keys: u64,
    /// Source items involved in those collisions.
    pub source_items: u64,
    pub examples: Vec<CollisionExample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CollisionExample {
    pub target_key: Vec<String>,
    pub source_items: u64,
    pub source_keys: Vec<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Distribution {
    pub attribute: String,
    pub items: u64,
    pub bytes: u64,
    /// Distinct values.
    pub cardinality: u64,
    pub hottest_by_items: Vec<HotKey>,
    /// Item collections (all items of one partition key value) by size.
    pub largest_by_bytes: Vec<HotKey>,
    pub collections_near_10gb: u64,
    pub load: Vec<Load>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HotKey {
    pub key: String,
    pub items: u64,
    pub bytes: u64,
    pub item_share: f64,
    pub byte_share: f64,
    /// WCU/s this key would receive in each load scenario, in `load` order.
    pub predicted_wcu: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Load {
    pub scenario: String,
    pub rate: f64,
    pub rate_unit: String,
    pub max_key_wcu: f64,
    pub keys_over_limit: u64,
    pub items_on_keys_over_limit: u64,
    pub histogram: Vec<Bin>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Bin {
    pub from_wcu: f64,
    pub to_wcu: Option<f64>,
    pub keys: u64,
    pub items: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct IndexReport {
    pub index: String,
    pub distribution: Distribution,
    /// Items that would carry no index key (sparse index).
    pub items_without_key: u64,
    /// Shape problems of the index's partition key (see [`index_warnings`]).
    pub warnings: Vec<IndexWarning>,
}

/// What is wrong with an index partition key's distribution: the case of a
/// GSI added in place to serve "open tasks" and keyed on the status alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum IndexWarning {
    /// Fewer distinct values than [`LOW_CARDINALITY`]: every index write lands
    /// on at most that many partition-key values.
    LowCardinality { distinct: u64 },
    /// One value (the hottest listed) holds more than [`DOMINANT_SHARE`] of the
    /// items that carry the key.
    DominantValue { share: f64 },
}

/// Index partition keys with fewer distinct values are flagged.
pub const LOW_CARDINALITY: u64 = 10;
/// An index partition-key value holding more than this share of the index is flagged.
pub const DOMINANT_SHARE: f64 = 0.5;

/// The warnings for an index's partition-key distribution (pure).
pub fn index_warnings(d: &Distribution) -> Vec<IndexWarning> {
    let mut w = Vec::new();
    if d.cardinality > 0 && d.cardinality < LOW_CARDINALITY {
        w.push(IndexWarning::LowCardinality {
            distinct: d.cardinality,
        });
    }
    if let Some(top) = d.hottest_by_items.first()
        && top.item_share > DOMINANT_SHARE
        && d.cardinality > 1
    {
        w.push(IndexWarning::DominantValue {
            share: top.item_share,
        });
    }
    w
}

// ---- the analyzer --------------------------------------------------------------

fn spill_opts(opts: &AnalyzeOptions) -> SpillOptions {
    SpillOptions {
        memory_bytes: opts.spill_memory_bytes,
        dir: opts.spill_dir.clone(),
    }
}

struct ReasonAcc {
    count: u64,
    examples: Vec<RejectExample>,
}

pub struct Analyzer<'p> {
    plan: &'p Plan,
    opts: AnalyzeOptions,
    scanned: u64,
    unreadable: u64,
    per_rule: Vec<u64>,
    copied: u64,
    skipped: u64,
    rejected: u64,
    reasons: BTreeMap<String, ReasonAcc>,
    old: Collector,
    new: Collector,
    indexes: Vec<Collector>,
    claims: ExternalAggregator<Claimants>,
    consumed_rcu: f64,
    rejects: Option<RejectsFile>,
}

impl<'p> Analyzer<'p> {
    pub fn new(
        plan: &'p Plan,
        opts: AnalyzeOptions,
        rejects: Option<RejectsFile>,
    ) -> Result<Analyzer<'p>, SpillError> {
        Ok(Analyzer {
            plan,
            old: Collector::new(&plan.source_key.partition_key.name, &opts)?,
            new: Collector::new(&plan.target_key.partition_key.name, &opts)?,
            indexes: plan
                .indexes
                .iter()
                .map(|ix| Collector::new(&ix.key.partition_key.name, &opts))
                .collect::<Result<_, _>>()?,
            claims: ExternalAggregator::new(spill_opts(&opts))?,
            per_rule: vec![0; plan.rules.len()],
            opts,
            scanned: 0,
            unreadable: 0,
            copied: 0,
            skipped: 0,
            rejected: 0,
            reasons: BTreeMap::new(),
            consumed_rcu: 0.0,
            rejects,
        })
    }

    pub fn add_unreadable(&mut self, n: u64) {
        self.scanned += n;
        self.unreadable += n;
    }

    pub fn add_consumed(&mut self, rcu: f64) {
        self.consumed_rcu += rcu;
    }

    pub fn add(&mut self, item: &Item) -> anyhow::Result<()> {
        self.scanned += 1;
        let plan = self.plan;
        let src_bytes = item_size(item);
        self.old.add(item, src_bytes)?;
        match transform(plan, item) {
            Outcome::Skip => self.skipped += 1,
            Outcome::Reject(r) => {
                self.rejected += 1;
                let key =
                    decode_key(&encode_key(item, &plan.source_key.names()).unwrap_or_default());
                let acc = self.reasons.entry(r.reason.kind()).or_insert(ReasonAcc {
                    count: 0,
                    examples: Vec::new(),
                });
                acc.count += 1;
                if acc.examples.len() < self.opts.examples {
                    acc.examples.push(RejectExample {
                        source_key: key,
                        message: r.to_string(),
                    });
                }
                if let Some(f) = &mut self.rejects {
                    f.write(item, &r.to_string())?;
                }
            }
            Outcome::Put { rule, item: out } => {
                match rule {
                    Some(i) => self.per_rule[i] += 1,
                    None => self.copied += 1,
                }
                let bytes = item_size(&out);
                self.new.add(&out, bytes)?;
                for ix in &mut self.indexes {
                    ix.add(&out, bytes)?;
                }
                // Target key → which source item claims it.
                let tk = encode_key(&out, &plan.target_key.names()).unwrap_or_default();
                let sk = encode_key(item, &plan.source_key.names()).unwrap_or_default();
                self.claims.add(&tk, Claimants::one(&sk))?;
            }
        }
        Ok(())
    }

    pub fn finish(self) -> anyhow::Result<Report> {
        let opts = self.opts;
        let mut collisions = Collisions {
            target_keys: 0,
            source_items: 0,
            examples: Vec::new(),
        };
        let mut merged = self.claims.finish()?;
        for entry in &mut merged {
            let (key, c) = entry?;
            if c.count > 1 {
                collisions.target_keys += 1;
                collisions.source_items += c.count;
                if collisions.examples.len() < opts.examples {
                    collisions.examples.push(CollisionExample {
                        target_key: decode_key(&key),
                        source_items: c.count,
                        source_keys: c.examples.iter().map(|k| decode_key(k)).collect(),
                    });
                }
            }
        }
        merged.close()?;
        if let Some(f) = self.rejects {
            f.finish()?;
        }
        let put = self.per_rule.iter().sum::<u64>() + self.copied;
        let indexes = self
            .plan
            .indexes
            .iter()
            .zip(self.indexes)
            .map(|(ix, c)| {
                let d = c.finish(&opts)?;
                Ok(IndexReport {
                    index: ix.name.clone(),
                    items_without_key: put - d.items,
                    warnings: index_warnings(&d),
                    distribution: d,
                })
            })
            .collect::<Result<Vec<_>, SpillError>>()?;
        Ok(Report {
            source_table: self.plan.source_table.clone(),
            target_table: self.plan.target_table.clone(),
            scanned: self.scanned,
            unreadable: self.unreadable,
            matched: self
                .plan
                .rules
                .iter()
                .zip(&self.per_rule)
                .map(|(r, n)| RuleCount {
                    rule: r.name.clone(),
                    items: *n,
                })
                .collect(),
            copied_unmatched: self.copied,
            skipped: self.skipped,
            rejected: self.rejected,
            reject_reasons: self
                .reasons
                .into_iter()
                .map(|(reason, a)| ReasonReport {
                    reason,
                    count: a.count,
                    examples: a.examples,
                })
                .collect(),
            collisions,
            old: self.old.finish(&opts)?,
            new: self.new.finish(&opts)?,
            indexes,
            consumed_rcu: self.consumed_rcu,
        })
    }
}

// ---- the driver ------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct ScanSettings {
    pub segments: Option<u32>,
    pub read_rate: Option<crate::aws::rate::Rate>,
    pub page_limit: Option<i32>,
}

/// Scan the source and analyze every item.
pub async fn run(
    clients: &Clients,
    plan: &Plan,
    scan_settings: &ScanSettings,
    opts: AnalyzeOptions,
    rejects: Option<RejectsFile>,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let info = clients.describe_table(&plan.source_table).await?;
    info.check_key(&plan.source_key, "source")?;
    let mut analyzer = Analyzer::new(plan, opts, rejects)?;
    let read = TableRead {
        table: &info,
        settings: scan_settings,
        label: "analyze",
    };
    read_table(clients, &read, progress, |page| {
        analyzer.add_unreadable(page.unreadable);
        analyzer.add_consumed(page.consumed);
        for item in &page.items {
            analyzer.add(item)?;
        }
        Ok(ControlFlow::Continue(()))
    })
    .await?;
    analyzer.finish()
}

/// One read of a whole table (or until the consumer has enough).
pub struct TableRead<'a> {
    pub table: &'a TableInfo,
    pub settings: &'a ScanSettings,
    /// The progress display's label.
    pub label: &'a str,
}

/// Scan a table under the read budget with progress, handing every page to
/// `on_page` on this task (its aggregates need no sharing). `on_page`
/// returning `Break` stops the Scan: no segment reads another page, and the
/// pages already read are dropped.
pub async fn read_table(
    clients: &Clients,
    read: &TableRead<'_>,
    progress: &Progress,
    mut on_page: impl FnMut(&Page) -> anyhow::Result<ControlFlow<()>>,
) -> anyhow::Result<()> {
    let info = read.table;
    let settings = read.settings;
    let segments = settings
        .segments
        .unwrap_or_else(|| scan::default_segments(info.size_bytes, 4));
    let stop = tokio_util::sync::CancellationToken::new();
    let scan_opts = ScanOptions {
        table: info.name.clone(),
        segments,
        page_limit: settings.page_limit,
        consistent_read: false,
    };
    progress.start(read.label, Some(info.item_count));
    let (tx, mut rx) = mpsc::channel::<Page>(segments as usize * 2);
    let read_rate = settings
        .read_rate
        .map(|r| r.resolve(&info.name, info.provisioned_read, "read"))
        .transpose()
        .map_err(crate::phase::error::InputError)?;
    let control = Arc::new(Control::new(read_rate, None));
    let scan_stop = stop.clone();
    let scanning = async move {
        scan::scan(
            clients,
            &scan_opts,
            Vec::new(),
            control,
            &scan_stop,
            move |page| {
                let tx = tx.clone();
                async move {
                    // A closed channel is a consumer that has enough: not an error.
                    let _ = tx.send(page).await;
                    Ok(())
                }
            },
        )
        .await
    };
    let consuming = async {
        let mut seen = 0u64;
        let mut flow = Ok(ControlFlow::Continue(()));
        while let Some(page) = rx.recv().await {
            seen += page.items.len() as u64 + page.unreadable;
            flow = on_page(&page);
            progress.update(seen, page.consumed);
            if !matches!(flow, Ok(ControlFlow::Continue(()))) {
                stop.cancel();
                break;
            }
        }
        // Segments waiting to hand over a page see the channel closed and stop.
        rx.close();
        flow.map(|_| ())
    };
    let (scanned, consumed) = tokio::join!(scanning, consuming);
    consumed?;
    scanned?;
    progress.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const PLAN: &str = r#"
[source]
table = "t"
partition_key = "PK"
sort_key = "SK"
[target]
table = "t2"
partition_key = "PK"
sort_key = "SK"
[[target.index]]
name = "ByStatus"
partition_key = "GSI1PK"
[[rule]]
name = "order"
match = { PK = "T#{t}", SK = "O#{id}" }
key = { PK = "T#{t}#S#{shard(id, 4)}", SK = "O#{id}" }
set = { GSI1PK = "{@status}" }
[[rule]]
name = "dup"
match = { PK = "D#{t}", SK = "X#{id}" }
key = { PK = "DUP", SK = "SAME" }
"#;

    fn item(pk: &str, sk: &str, status: Option<&str>) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), crate::core::value::Value::S(pk.into()));
        i.insert("SK".into(), crate::core::value::Value::S(sk.into()));
        if let Some(s) = status {
            i.insert("status".into(), crate::core::value::Value::S(s.into()));
        }
        i
    }

    #[test]
    fn counts_collisions_rejects_and_distributions_exactly_even_when_spilling() {
        let plan = Plan::parse(PLAN, Path::new("p")).unwrap();
        // A tiny spill budget forces many runs: the result must not change.
        for memory in [64 * 1024 * 1024, 512] {
            let opts = AnalyzeOptions {
                spill_memory_bytes: memory,
                top: 2,
                ..Default::default()
            };
            let mut a = Analyzer::new(&plan, opts, None).unwrap();
            for i in 0..300 {
                a.add(&item("T#hot", &format!("O#{i}"), Some("OPEN")))
                    .unwrap();
            }
            for t in 0..50 {
                a.add(&item(
                    &format!("T#t{t}"),
                    "O#x",
                    if t % 2 == 0 { Some("DONE") } else { None },
                ))
                .unwrap();
            }
            for i in 0..5 {
                a.add(&item("D#a", &format!("X#{i}"), None)).unwrap();
            }
            for i in 0..7 {
                a.add(&item("ZZZ", &format!("{i}"), None)).unwrap();
            }
            let r = a.finish().unwrap();
            assert_eq!(r.scanned, 362);
            assert_eq!(r.matched[0].items, 325);
            assert_eq!(r.matched[1].items, 5);
            // 25 orders lack the status their index key needs; 7 items match no rule.
            assert_eq!(r.rejected, 32);
            assert_eq!(
                r.reject_reasons[0].reason,
                "`GSI1PK`: attribute `status` is missing"
            );
            assert_eq!(r.reject_reasons[0].count, 25);
            assert_eq!(r.reject_reasons[1].reason, "no rule matched");
            assert_eq!(r.reject_reasons[1].count, 7);
            assert_eq!(r.reject_reasons[1].examples.len(), 3);
            assert_eq!(r.collisions.target_keys, 1);
            assert_eq!(r.collisions.source_items, 5);
            assert_eq!(r.collisions.examples[0].source_keys.len(), 3);
            assert_eq!(r.old.cardinality, 1 + 50 + 1 + 1);
            assert_eq!(r.old.hottest_by_items[0].key, "T#hot");
            assert_eq!(r.old.hottest_by_items[0].items, 300);
            // 300 hot items spread over 4 shards; the small tenants keep theirs.
            assert!(
                r.new.hottest_by_items[0].items < 100,
                "{:?}",
                r.new.hottest_by_items
            );
            assert_eq!(r.new.items, 330);
            let ix = &r.indexes[0];
            assert_eq!(ix.distribution.cardinality, 2);
            assert_eq!(ix.distribution.hottest_by_items[0].key, "OPEN");
            // The five `dup` items carry no index key: a sparse index.
            assert_eq!(ix.items_without_key, 5);
        }
    }

    #[test]
    fn in_place_the_new_gsi_key_is_analyzed_and_a_status_only_key_is_flagged() {
        let text = |gsi: &str| {
            format!(
                r#"
[source]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[target]
table = "tasks"
partition_key = "PK"
sort_key = "SK"
[[target.index]]
name = "GSI2"
partition_key = "GSI2PK"
[[rule]]
match = {{ PK = "T#{{t}}", SK = "TASK#{{id}}" }}
set = {{ GSI2PK = "{gsi}" }}
"#
            )
        };
        let run = |gsi: &str| {
            let plan = Plan::parse(&text(gsi), Path::new("p")).unwrap();
            let mut a = Analyzer::new(&plan, AnalyzeOptions::default(), None).unwrap();
            for i in 0..400 {
                let status = if i % 10 == 0 { "DONE" } else { "OPEN" };
                a.add(&item(
                    &format!("T#t{}", i % 8),
                    &format!("TASK#{i}"),
                    Some(status),
                ))
                .unwrap();
            }
            a.finish().unwrap()
        };
        // The status alone: two values, one with 90% of the items.
        let r = run("STATUS#{@status}");
        assert_eq!(
            r.collisions.target_keys, 0,
            "the key does not change in place"
        );
        assert_eq!(r.new.cardinality, r.old.cardinality);
        let ix = &r.indexes[0];
        assert_eq!(ix.distribution.cardinality, 2);
        assert_eq!(
            ix.warnings,
            vec![
                IndexWarning::LowCardinality { distinct: 2 },
                IndexWarning::DominantValue { share: 0.9 }
            ]
        );
        assert!(crate::phase::analyze::render::render(&r).contains("low-cardinality"));
        // Per tenant, status and 16 buckets: no warning.
        let r = run("T#{t}#STATUS#{@status}#BUCKET#{shard(id, 16):02}");
        assert!(r.indexes[0].distribution.cardinality > 100);
        assert!(
            r.indexes[0].warnings.is_empty(),
            "{:?}",
            r.indexes[0].warnings
        );
    }

    #[test]
    fn load_estimate_flags_keys_over_the_partition_limit() {
        let plan = Plan::parse(PLAN, Path::new("p")).unwrap();
        let opts = AnalyzeOptions {
            app_write_rate: Some(4000.0),
            ..Default::default()
        };
        let mut a = Analyzer::new(&plan, opts, None).unwrap();
        for i in 0..500 {
            a.add(&item("T#hot", &format!("O#{i}"), Some("OPEN")))
                .unwrap();
        }
        for t in 0..500 {
            a.add(&item(&format!("T#t{t}"), "O#1", Some("OPEN")))
                .unwrap();
        }
        let r = a.finish().unwrap();
        let app_old = &r.old.load[1];
        assert_eq!(app_old.scenario, "application");
        // Half of 4000 items/s land on T#hot: 2000 WCU/s, over the 1000 limit.
        assert_eq!(app_old.keys_over_limit, 1);
        assert!((app_old.max_key_wcu - 2000.0).abs() < 1e-6);
        let app_new = &r.new.load[1];
        assert_eq!(app_new.keys_over_limit, 0, "four shards of 500 WCU/s each");
        assert_eq!(
            app_new.histogram.iter().map(|b| b.keys).sum::<u64>(),
            r.new.cardinality
        );
        // The status index is one hot key: every write of the table lands on it.
        assert_eq!(r.indexes[0].distribution.load[1].keys_over_limit, 1);
    }
}
