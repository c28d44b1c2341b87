//! The demo's last, independent check: both tables scanned after `finish`,
//! the target compared with the plan applied to the source.

use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde::Serialize;

use super::SEGMENTS;
use crate::aws::Clients;
use crate::aws::rate::Control;
use crate::aws::scan::{self, ScanOptions};
use crate::core::plan::Plan;
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, encode_key};
use crate::phase::progress::Progress;

/// Both tables scanned after `finish`, compared independently of verify.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct FinalCheck {
    pub source_items: u64,
    /// Source items the plan puts in the target (the rest it rejects or skips).
    pub expected: u64,
    pub target_items: u64,
    /// Expected but not in the target.
    pub missing: u64,
    /// In the target but not expected.
    pub extra: u64,
    /// In both, with other attributes.
    pub different: u64,
    /// The target is exactly the plan applied to the source.
    pub equal: bool,
    /// The hottest partition key's share of the items, measured in each table.
    pub source_hottest_share: f64,
    pub target_hottest_share: f64,
}

pub(super) async fn final_check(
    clients: &Clients,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<FinalCheck> {
    let source = scan_all(clients, &plan.source_table, "check old", progress).await?;
    let target = scan_all(clients, &plan.target_table, "check new", progress).await?;
    Ok(compare(plan, &source, &target))
}

/// The target against transform(source), item by item.
pub(crate) fn compare(plan: &Plan, source: &[Item], target: &[Item]) -> FinalCheck {
    use std::collections::BTreeMap;
    let names = plan.target_key.names();
    let expected: BTreeMap<Vec<u8>, Item> = source
        .iter()
        .filter_map(|i| match transform(plan, i) {
            Outcome::Put { item, .. } => Some((encode_key(&item, &names)?, item)),
            _ => None,
        })
        .collect();
    let actual: BTreeMap<Vec<u8>, &Item> = target
        .iter()
        .filter_map(|i| Some((encode_key(i, &names)?, i)))
        .collect();
    let missing = expected.keys().filter(|k| !actual.contains_key(*k)).count() as u64;
    let extra = actual.keys().filter(|k| !expected.contains_key(*k)).count() as u64;
    let different = expected
        .iter()
        .filter(|(k, v)| actual.get(*k).is_some_and(|a| a != v))
        .count() as u64;
    FinalCheck {
        source_items: source.len() as u64,
        expected: expected.len() as u64,
        target_items: target.len() as u64,
        missing,
        extra,
        different,
        // Items without the key attributes would be neither expected nor actual.
        equal: missing + extra + different == 0 && actual.len() == target.len(),
        source_hottest_share: hottest_share(source, &plan.source_key.partition_key.name),
        target_hottest_share: hottest_share(target, &plan.target_key.partition_key.name),
    }
}

fn hottest_share(items: &[Item], partition_key: &str) -> f64 {
    let mut counts: std::collections::HashMap<Vec<u8>, u64> = std::collections::HashMap::new();
    for key in items.iter().filter_map(|i| encode_key(i, &[partition_key])) {
        *counts.entry(key).or_default() += 1;
    }
    let max = counts.values().copied().max().unwrap_or(0);
    max as f64 / items.len().max(1) as f64
}

/// Every item of `table`, through a parallel Scan.
async fn scan_all(
    clients: &Clients,
    table: &str,
    label: &str,
    progress: &Progress,
) -> anyhow::Result<Vec<Item>> {
    let items = Arc::new(Mutex::new(Vec::new()));
    progress.start(label, None);
    let opts = ScanOptions {
        table: table.to_string(),
        segments: SEGMENTS,
        page_limit: None,
        consistent_read: true,
    };
    let (sink, shown) = (items.clone(), progress.clone());
    scan::scan(
        clients,
        &opts,
        Vec::new(),
        Arc::new(Control::new(None, None)),
        // The final check reads to the end: the demo ends at a signal.
        &tokio_util::sync::CancellationToken::new(),
        move |page| {
            let mut all = sink.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(page.items);
            shown.update(all.len() as u64, page.consumed);
            async { anyhow::Ok(()) }
        },
    )
    .await
    .with_context(|| format!("scanning `{table}` for the final check"))?;
    progress.finish();
    let mut items = items.lock().unwrap_or_else(|e| e.into_inner());
    Ok(std::mem::take(&mut *items))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::core::value::Value;
    use crate::ops::demo::DEMO_PLAN;
    use crate::ops::demo::workload::generate;

    #[test]
    fn the_final_check_finds_each_kind_of_difference() {
        let plan = Plan::parse(DEMO_PLAN, Path::new("demo.toml")).unwrap();
        let source = generate(100);
        let target: Vec<Item> = source
            .iter()
            .map(|i| match transform(&plan, i) {
                Outcome::Put { item, .. } => item,
                other => panic!("{other:?}"),
            })
            .collect();
        let c = compare(&plan, &source, &target);
        assert!(c.equal, "{c:?}");
        assert_eq!(
            (c.source_items, c.expected, c.target_items),
            (200, 200, 200)
        );
        assert!(c.source_hottest_share > c.target_hottest_share, "{c:?}");

        let mut damaged = target[1..].to_vec(); // one missing
        damaged[0].insert("status".into(), Value::S("LOST".into())); // one different
        let mut extra = target[2].clone();
        extra.insert("SK".into(), Value::S("ORDER#ffffffff".into()));
        damaged.push(extra); // one extra
        let c = compare(&plan, &source, &damaged);
        assert_eq!((c.missing, c.different, c.extra, c.equal), (1, 1, 1, false));
    }
}
