//! The analyze report for people: old and new key side by side, and a
//! terminal histogram of per-key load.

use std::fmt::Write as _;

use super::{Distribution, HotKey, Load, PARTITION_WCU, Report};

const BAR: usize = 28;

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let w = &mut o;
    counts(w, r);
    side_by_side(w, &r.old, &r.new, "old", "new");
    lists(w, &r.old, &r.new, "old", "new");
    for ix in &r.indexes {
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "Index {} ({}): {} items carry the key, {} do not (sparse)",
            ix.index, ix.distribution.attribute, ix.distribution.items, ix.items_without_key
        );
        let d = &ix.distribution;
        for warning in &ix.warnings {
            let _ = match warning {
                super::IndexWarning::LowCardinality { distinct } => writeln!(
                    w,
                    "  warning: only {distinct} distinct values — a low-cardinality index key concentrates writes"
                ),
                super::IndexWarning::DominantValue { share } => writeln!(
                    w,
                    "  warning: `{}` holds {:.0}% of the index",
                    d.hottest_by_items.first().map_or("", |h| h.key.as_str()),
                    share * 100.0
                ),
            };
        }
        distribution(w, d);
    }
    o
}

/// The verdict without the lists and histograms: counts, collisions, and
/// old vs new key side by side (`rekey demo` shows this before migrating).
pub fn short(r: &Report) -> String {
    let mut o = String::new();
    counts(&mut o, r);
    side_by_side(&mut o, &r.old, &r.new, "old", "new");
    o
}

/// Items scanned, per rule, rejects and collisions.
fn counts(w: &mut String, r: &Report) {
    let _ = writeln!(w, "rekey analyze: {} → {}", r.source_table, r.target_table);
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "Items scanned     {:>12}   ({:.1} RCU consumed)",
        r.scanned, r.consumed_rcu
    );
    for m in &r.matched {
        let _ = writeln!(
            w,
            "  rule {:<24} {:>10}  {:>6}",
            format!("`{}`", m.rule),
            m.items,
            pct(m.items, r.scanned)
        );
    }
    if r.copied_unmatched > 0 {
        let _ = writeln!(
            w,
            "  copied unmatched {:>19}  {:>6}",
            r.copied_unmatched,
            pct(r.copied_unmatched, r.scanned)
        );
    }
    if r.skipped > 0 {
        let _ = writeln!(
            w,
            "  skipped {:>28}  {:>6}",
            r.skipped,
            pct(r.skipped, r.scanned)
        );
    }
    let _ = writeln!(
        w,
        "  rejected {:>27}  {:>6}",
        r.rejected,
        pct(r.rejected, r.scanned)
    );
    if r.unreadable > 0 {
        let _ = writeln!(w, "  unreadable (unknown type) {:>10}", r.unreadable);
    }
    for reason in &r.reject_reasons {
        let _ = writeln!(w, "    {} × {}", reason.count, reason.reason);
        for e in &reason.examples {
            let _ = writeln!(
                w,
                "        e.g. {}: {}",
                e.source_key.join(" / "),
                e.message
            );
        }
    }
    let _ = writeln!(w);
    if r.collisions.target_keys == 0 {
        let _ = writeln!(
            w,
            "Collisions        none: every target key comes from exactly one source item"
        );
    } else {
        let _ = writeln!(
            w,
            "Collisions        {} target keys claimed by {} source items — the backfill would overwrite",
            r.collisions.target_keys, r.collisions.source_items
        );
        for c in &r.collisions.examples {
            let srcs: Vec<String> = c.source_keys.iter().map(|k| k.join(" / ")).collect();
            let _ = writeln!(
                w,
                "    {} ← {} items, e.g. {}",
                c.target_key.join(" / "),
                c.source_items,
                srcs.join(", ")
            );
        }
    }
    let _ = writeln!(w);
}

fn pct(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.1}%", a as f64 * 100.0 / b as f64)
    }
}

fn side_by_side(w: &mut String, old: &Distribution, new: &Distribution, a: &str, b: &str) {
    let _ = writeln!(
        w,
        "{:<28}{:>22}{:>22}",
        "Partition key",
        format!("{a}: {}", old.attribute),
        format!("{b}: {}", new.attribute)
    );
    let row = |w: &mut String, label: &str, x: String, y: String| {
        let _ = writeln!(w, "  {label:<26}{x:>22}{y:>22}");
    };
    row(w, "items", old.items.to_string(), new.items.to_string());
    row(
        w,
        "distinct keys",
        old.cardinality.to_string(),
        new.cardinality.to_string(),
    );
    let top = |d: &Distribution| {
        d.hottest_by_items
            .first()
            .map_or("-".into(), |h| format!("{:.2}%", h.item_share * 100.0))
    };
    row(w, "hottest key's share", top(old), top(new));
    let big = |d: &Distribution| {
        d.largest_by_bytes
            .first()
            .map_or("-".into(), |h| human_bytes(h.bytes))
    };
    row(w, "largest item collection", big(old), big(new));
    row(
        w,
        "collections near 10 GB",
        old.collections_near_10gb.to_string(),
        new.collections_near_10gb.to_string(),
    );
    for (lo, ln) in old.load.iter().zip(&new.load) {
        let _ = writeln!(w, "  at {} {} ({}):", lo.rate, lo.rate_unit, lo.scenario);
        row(
            w,
            "  max WCU/s on one key",
            format!("{:.0}", lo.max_key_wcu),
            format!("{:.0}", ln.max_key_wcu),
        );
        row(w, "  keys over 1,000 WCU/s", flag(lo), flag(ln));
    }
}

/// The hottest keys of each design, and the per-key load histograms.
fn lists(w: &mut String, old: &Distribution, new: &Distribution, a: &str, b: &str) {
    let _ = writeln!(w);
    let _ = writeln!(w, "Hottest keys by items, {a} design");
    hot_list(w, &old.hottest_by_items);
    let _ = writeln!(w, "Hottest keys by items, {b} design");
    hot_list(w, &new.hottest_by_items);
    for (lo, ln) in old.load.iter().zip(&new.load) {
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "Per-key load at {} {} ({}), keys per band — {a} | {b}",
            lo.rate, lo.rate_unit, lo.scenario
        );
        histogram(w, lo, ln);
    }
}

fn flag(l: &Load) -> String {
    if l.keys_over_limit == 0 {
        "0".into()
    } else {
        format!("{} THROTTLE", l.keys_over_limit)
    }
}

fn distribution(w: &mut String, d: &Distribution) {
    let _ = writeln!(w, "  distinct values {}, hottest:", d.cardinality);
    hot_list(w, &d.hottest_by_items);
    for l in &d.load {
        let _ = writeln!(
            w,
            "  at {} {} ({}): max {:.0} WCU/s on one key, {} keys over 1,000",
            l.rate, l.rate_unit, l.scenario, l.max_key_wcu, l.keys_over_limit
        );
    }
}

fn hot_list(w: &mut String, keys: &[HotKey]) {
    let max = keys.first().map_or(1, |k| k.items.max(1));
    for k in keys {
        let n = ((k.items as f64 / max as f64) * BAR as f64).round() as usize;
        let wcu = k.predicted_wcu.last().copied().unwrap_or(0.0);
        let mark = if wcu > PARTITION_WCU {
            " ← over 1,000 WCU/s"
        } else {
            ""
        };
        let _ = writeln!(
            w,
            "  {:<56} {:>9} {:>6.2}% {:<width$}{mark}",
            truncate(&k.key, 56),
            k.items,
            k.item_share * 100.0,
            "█".repeat(n.max(1)),
            width = BAR
        );
    }
}

fn histogram(w: &mut String, old: &Load, new: &Load) {
    let max = old
        .histogram
        .iter()
        .chain(&new.histogram)
        .map(|b| b.keys)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    // Log scale: one key and a million keys must both be visible.
    let len = |k: u64| {
        if k == 0 {
            0
        } else {
            (((k as f64).ln_1p() / max.ln_1p()) * 20.0).ceil() as usize
        }
    };
    for (bo, bn) in old.histogram.iter().zip(&new.histogram) {
        let label = match bo.to_wcu {
            Some(to) => format!("{:>5}–{:<5}", bo.from_wcu, to),
            None => format!("≥{:<5} !!  ", bo.from_wcu),
        };
        let _ = writeln!(
            w,
            "  {label} WCU/s {:>8} {:<20} | {:>8} {:<20}",
            bo.keys,
            "▇".repeat(len(bo.keys)),
            bn.keys,
            "▇".repeat(len(bn.keys))
        );
    }
}

/// Long keys lose their middle: the prefix names the entity, the suffix the shard.
fn truncate(s: &str, n: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= n {
        return s.to_string();
    }
    let head = (n - 1) / 2;
    let tail = n - 1 - head;
    let mut t: String = chars[..head].iter().collect();
    t.push('…');
    t.extend(&chars[chars.len() - tail..]);
    t
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
