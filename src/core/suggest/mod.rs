//! `rekey suggest`: a plan from the data — the key shapes a table holds, how
//! hot its hottest keys are at a given traffic, and the rules that would cool
//! them.
//!
//! Pure: a [`Sample`] of key values in, a [`Suggestion`] (the shapes, the
//! numbers that justify each shard count, the plan as commented TOML) out.
//! The phase layer fills the sample from a Scan.
//!
//! Memory is bounded by a **sample cap**: the sample keeps the key values of
//! at most `cap` items (the Scan stops there), and every count below runs over
//! that sample; per-position distinct values are counted up to a cap too
//! (`shape::DISTINCT_CAP`). A parallel Scan's first pages come from every
//! segment, each a hash range of the partition keys, so a stopped Scan is a
//! fair sample of keys, not of the table's first keys.
//!
//! The load model is `rekey analyze`'s: the application's writes (items/s)
//! land on keys as the items do, each costing its write units; reads likewise,
//! one read unit per item. A key's load divided by N shards must stay under
//! the per-partition limit less the headroom ([`shard::shard_count`]).
//!
//! The parts: `shape` (delimiters, literal or variable segments, capture
//! names, times), `shard` (the count), `render` (the plan's TOML).

pub(crate) mod render;
pub(crate) mod shape;
pub(crate) mod shard;

use std::collections::HashMap;

use serde::Serialize;

use crate::core::plan::KeySchema;
use crate::core::value::{Item, ScalarType, Value, item_size, write_units};
use shape::{KeyShape, Layout, Seg, VarStats, capture_name};
pub use shard::ShardRounding;

/// More shapes than this (or about one per item) is not a key design.
pub const MAX_SHAPES: usize = 64;
/// The hottest partition-key values listed, whatever their shape.
pub const HOT_KEYS: usize = 5;

/// One sampled item's key: its values and the write units a put of it costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampledKey {
    pub pk: String,
    pub sk: Option<String>,
    pub wcu: u64,
}

/// The key values of at most `cap` items.
#[derive(Debug, Clone)]
pub struct Sample {
    cap: usize,
    keys: Vec<SampledKey>,
    /// Items whose key is not a string (numeric or binary key attributes).
    pub non_string: u64,
}

impl Sample {
    pub fn new(cap: usize) -> Sample {
        Sample {
            cap: cap.max(1),
            keys: Vec::new(),
            non_string: 0,
        }
    }

    /// Keep `item`'s key, unless the sample is full.
    pub fn add(&mut self, item: &Item, key: &KeySchema) {
        if self.is_full() {
            return;
        }
        let text = |name: &str| match item.get(name) {
            Some(Value::S(s)) => Ok(Some(s.clone())),
            None => Ok(None),
            Some(_) => Err(()),
        };
        let sk = match &key.sort_key {
            Some(a) => text(&a.name),
            None => Ok(None),
        };
        match (text(&key.partition_key.name), sk) {
            (Ok(Some(pk)), Ok(sk)) => self.keys.push(SampledKey {
                pk,
                sk,
                wcu: write_units(item_size(item)),
            }),
            _ => self.non_string += 1,
        }
    }

    pub fn is_full(&self) -> bool {
        self.keys.len() as u64 + self.non_string >= self.cap as u64
    }

    /// Items sampled.
    pub fn len(&self) -> u64 {
        self.keys.len() as u64 + self.non_string
    }

    pub fn keys(&self) -> &[SampledKey] {
        &self.keys
    }
}

/// A partition's ceilings, units per second (the caller names DynamoDB's).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub write_units: f64,
    pub read_units: f64,
}

#[derive(Debug, Clone)]
pub struct SuggestOptions {
    /// The application's writes, items/s.
    pub write_rate: f64,
    /// The application's reads, items/s.
    pub read_rate: Option<f64>,
    /// Share of each limit kept free (0.5: plan for half a partition).
    pub headroom: f64,
    pub rounding: ShardRounding,
    pub limits: Limits,
    /// The target table's name (default: `<source>_rekeyed`).
    pub target_table: Option<String>,
}

/// What suggest concluded.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Verdict {
    /// Some shape needs a rule: the plan is in [`Suggestion::plan`].
    Plan,
    /// Every shape's hottest key fits: nothing to re-key at this rate.
    NoRuleNeeded,
    /// Hot keys that no rule can spread (see each shape's notes).
    CannotFix,
    Empty,
    /// A key attribute is a number or binary: plans match string keys.
    NonStringKeys {
        attribute: String,
        ty: String,
    },
    /// No key value holds a delimiter: there are no shapes to name.
    NoDelimiters,
    /// About one shape per item: the keys share no structure.
    ShapePerItem {
        shapes: u64,
        items: u64,
    },
}

impl Verdict {
    /// The one-line answer for the operator.
    pub fn message(&self) -> String {
        match self {
            Verdict::Plan => "a plan is suggested".into(),
            Verdict::NoRuleNeeded => {
                "no rule needed: every shape's hottest key stays under the limits at this rate"
                    .into()
            }
            Verdict::CannotFix => {
                "hot keys found, but no rule can spread them (see the notes); no plan written"
                    .into()
            }
            Verdict::Empty => {
                "the table is empty: nothing to infer shapes from; no plan written".into()
            }
            Verdict::NonStringKeys { attribute, ty } => format!(
                "the key attribute `{attribute}` is {} ({ty}): plans re-key string keys by their shapes, \
                 so there is no shape to suggest; no plan written",
                if ty == "N" { "numeric" } else { "binary" }
            ),
            Verdict::NoDelimiters => format!(
                "no key value holds a delimiter ({}): keys without structure have no shapes to \
                 re-key; no plan written",
                shape::DELIMITERS.map(|d| format!("`{d}`")).join(", ")
            ),
            Verdict::ShapePerItem { shapes, items } => format!(
                "{shapes} key shapes among {items} items: about one per item, so the keys share no \
                 structure a rule could name; no plan written"
            ),
        }
    }
}

/// What suggest does with one shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Action {
    /// The hottest key fits: no rule (copied unchanged).
    NoRule,
    /// Split by a hash of `capture` into `shards`.
    Shard { shards: u32, capture: String },
    /// A rule that keeps the key as it is, so a broader rule does not take its items.
    Keep,
    /// Hot, but no rule can spread it (the reason is in the notes).
    CannotShard,
}

/// A rule's four templates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleText {
    pub name: String,
    pub match_pk: String,
    pub match_sk: Option<String>,
    pub key_pk: String,
    pub key_sk: Option<String>,
}

/// One shape of the table and its numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeReport {
    pub pk: String,
    pub sk: Option<String>,
    pub items: u64,
    /// Of the sampled items.
    pub share: f64,
    /// The partition-key value of this shape with the most write units (real value).
    pub hottest_key: String,
    /// That key's share of the application's writes (its write units per sampled item).
    pub hottest_write_share: f64,
    /// That key's share of the reads (its items per sampled item).
    pub hottest_read_share: f64,
    /// WCU/s on the key at the write rate.
    pub write_load: f64,
    /// RCU/s on the key at the read rate.
    pub read_load: Option<f64>,
    /// load / budget, the larger of writes and reads: the shards needed before rounding.
    pub needed: f64,
    pub action: Action,
    pub rule: Option<RuleText>,
    /// Times in this shape: the bucket that is offered, as template text.
    pub bucket: Option<String>,
    pub notes: Vec<String>,
}

/// One of the table's hottest partition-key values.
#[derive(Debug, Clone, Serialize)]
pub struct HotKey {
    /// The real value (the command layer redacts it).
    pub key: String,
    /// Its shape, as in [`ShapeReport::pk`].
    pub shape: String,
    pub items: u64,
    /// Its share of the writes: its write units per sampled item.
    pub write_share: f64,
    /// WCU/s on it at the write rate.
    pub write_load: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Suggestion {
    pub table: String,
    pub target_table: String,
    pub sampled: u64,
    /// The sample holds every item of the table (the Scan was not stopped at the cap).
    pub whole_table: bool,
    pub write_rate: f64,
    pub read_rate: Option<f64>,
    pub headroom: f64,
    /// Units/s one key (one shard) may take: the limits less the headroom.
    pub write_budget: f64,
    pub read_budget: f64,
    pub rounding: ShardRounding,
    pub verdict: Verdict,
    pub shapes: Vec<ShapeReport>,
    /// The hottest keys, most write units first.
    pub hot_keys: Vec<HotKey>,
    /// The plan's TOML when the verdict is [`Verdict::Plan`].
    pub plan: Option<String>,
}

/// One shape's accumulated numbers.
struct ShapeAcc<'s> {
    pk: KeyShape,
    sk: Option<KeyShape>,
    items: u64,
    pk_vars: Vec<VarStats>,
    sk_vars: Vec<VarStats>,
    hottest: Option<(u64, &'s str)>,
    example: &'s SampledKey,
}

fn add_vars(stats: &mut Vec<VarStats>, shape: &KeyShape, parts: &[&str]) {
    let vars = parts
        .iter()
        .zip(&shape.segs)
        .filter(|(_, s)| **s == Seg::Var)
        .map(|(v, _)| v);
    for (i, v) in vars.enumerate() {
        if stats.len() <= i {
            stats.push(VarStats::default());
        }
        stats[i].add(v);
    }
}

/// The shapes of the sampled keys, most items first (ties in shape order).
fn shapes<'s>(
    sample: &'s Sample,
    pk_layout: &Layout,
    sk_layout: &Layout,
    totals: &HashMap<&'s str, (u64, u64)>,
) -> Vec<ShapeAcc<'s>> {
    let mut by_shape: HashMap<(KeyShape, Option<KeyShape>), ShapeAcc<'s>> = HashMap::new();
    for k in sample.keys() {
        let (pk, pk_parts) = pk_layout.parts(&k.pk);
        let (sk, sk_parts) = k.sk.as_deref().map(|s| sk_layout.parts(s)).unzip();
        let acc = by_shape
            .entry((pk.clone(), sk.clone()))
            .or_insert_with(|| ShapeAcc {
                pk,
                sk,
                items: 0,
                pk_vars: Vec::new(),
                sk_vars: Vec::new(),
                hottest: None,
                example: k,
            });
        acc.items += 1;
        add_vars(&mut acc.pk_vars, &acc.pk, &pk_parts);
        if let (Some(sk), Some(parts)) = (&acc.sk, &sk_parts) {
            add_vars(&mut acc.sk_vars, sk, parts);
        }
        let wcu = totals.get(k.pk.as_str()).map_or(0, |t| t.1);
        let cand = (wcu, k.pk.as_str());
        // Most write units; among equals the smallest key, so the result is deterministic.
        if acc
            .hottest
            .is_none_or(|h| cand.0 > h.0 || (cand.0 == h.0 && cand.1 < h.1))
        {
            acc.hottest = Some(cand);
        }
    }
    let mut v: Vec<_> = by_shape.into_values().collect();
    v.sort_by(|a, b| {
        b.items
            .cmp(&a.items)
            .then_with(|| (&a.pk, &a.sk).cmp(&(&b.pk, &b.sk)))
    });
    v
}

/// The suggestion for `table` (keyed `key`) from `sample`.
pub fn suggest(table: &str, key: &KeySchema, sample: &Sample, opts: &SuggestOptions) -> Suggestion {
    let mut s = Suggestion {
        table: table.to_string(),
        target_table: opts
            .target_table
            .clone()
            .unwrap_or_else(|| format!("{table}_rekeyed")),
        sampled: sample.len(),
        whole_table: !sample.is_full(),
        write_rate: opts.write_rate,
        read_rate: opts.read_rate,
        headroom: opts.headroom,
        write_budget: shard::budget(opts.limits.write_units, opts.headroom),
        read_budget: shard::budget(opts.limits.read_units, opts.headroom),
        rounding: opts.rounding,
        verdict: Verdict::Empty,
        shapes: Vec::new(),
        hot_keys: Vec::new(),
        plan: None,
    };
    if let Some(a) = key.attrs().find(|a| a.ty != ScalarType::S) {
        s.verdict = Verdict::NonStringKeys {
            attribute: a.name.clone(),
            ty: a.ty.name().to_string(),
        };
        return s;
    }
    if sample.keys().is_empty() {
        return s;
    }
    let pk_layout = Layout::learn(sample.keys().iter().map(|k| k.pk.as_str()));
    let sk_layout = Layout::learn(sample.keys().iter().filter_map(|k| k.sk.as_deref()));
    if !pk_layout.has_delimiter() && !sk_layout.has_delimiter() {
        s.verdict = Verdict::NoDelimiters;
        return s;
    }
    let mut totals: HashMap<&str, (u64, u64)> = HashMap::new();
    for k in sample.keys() {
        let t = totals.entry(k.pk.as_str()).or_default();
        t.0 += 1;
        t.1 += k.wcu;
    }
    let accs = shapes(sample, &pk_layout, &sk_layout, &totals);
    let items = sample.keys().len() as u64;
    if accs.len() > MAX_SHAPES || (items >= 10 && accs.len() as u64 * 2 > items) {
        s.verdict = Verdict::ShapePerItem {
            shapes: accs.len() as u64,
            items,
        };
        return s;
    }
    let mut names = Vec::new();
    s.shapes = accs
        .iter()
        .map(|a| report(a, items, &totals, &s, &mut names))
        .collect();
    protect_unruled(&mut s.shapes, &accs);
    s.hot_keys = hot_keys(&totals, items, opts.write_rate, |k| {
        let pk = pk_layout.shape(k);
        accs.iter()
            .zip(&s.shapes)
            .find(|(a, _)| a.pk == pk)
            .map(|(_, r)| r.pk.clone())
            .unwrap_or_default()
    });
    let hot = s.shapes.iter().any(|r| r.needed > 1.0);
    s.verdict = if s
        .shapes
        .iter()
        .any(|r| matches!(r.action, Action::Shard { .. }))
    {
        s.plan = Some(render::plan(&s, key));
        Verdict::Plan
    } else if hot {
        Verdict::CannotFix
    } else {
        Verdict::NoRuleNeeded
    };
    s
}

/// The [`HOT_KEYS`] partition-key values with the most write units (ties:
/// the smaller value first, so the list does not depend on the Scan's order).
fn hot_keys(
    totals: &HashMap<&str, (u64, u64)>,
    items: u64,
    write_rate: f64,
    shape_of: impl Fn(&str) -> String,
) -> Vec<HotKey> {
    let mut v: Vec<(&str, (u64, u64))> = totals.iter().map(|(k, t)| (*k, *t)).collect();
    v.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(b.0)));
    v.into_iter()
        .take(HOT_KEYS)
        .map(|(k, (n, wcu))| {
            let share = wcu as f64 / items as f64;
            HotKey {
                key: k.to_string(),
                shape: shape_of(k),
                items: n,
                write_share: share,
                write_load: write_rate * share,
            }
        })
        .collect()
}

/// A shape's text with capture names; records each capture's stats by name.
fn named<'a>(
    shape: &KeyShape,
    stats: &'a [VarStats],
    taken: &mut Vec<String>,
    captures: &mut Vec<(String, &'a VarStats)>,
) -> String {
    let mut parts = Vec::new();
    let mut vars = stats.iter();
    let mut before: Option<&str> = None;
    for seg in &shape.segs {
        match seg {
            Seg::Lit(l) => {
                parts.push(l.clone());
                before = Some(l);
            }
            Seg::Var => {
                let st = vars.next().expect("one stats entry per variable");
                let name = capture_name(before, st, taken);
                parts.push(format!("{{{name}}}"));
                captures.push((name, st));
                before = None;
            }
        }
    }
    parts.join(&shape.delimiter.map(String::from).unwrap_or_default())
}

fn report(
    a: &ShapeAcc<'_>,
    items: u64,
    totals: &HashMap<&str, (u64, u64)>,
    s: &Suggestion,
    rule_names: &mut Vec<String>,
) -> ShapeReport {
    let mut taken = Vec::new();
    let (mut pk_caps, mut sk_caps) = (Vec::new(), Vec::new());
    let pk = named(&a.pk, &a.pk_vars, &mut taken, &mut pk_caps);
    let sk =
        a.sk.as_ref()
            .map(|sk| named(sk, &a.sk_vars, &mut taken, &mut sk_caps));
    let (hot_key, (hot_items, hot_wcu)) = a
        .hottest
        .map(|(_, k)| (k, totals.get(k).copied().unwrap_or_default()))
        .unwrap_or_default();
    let ratio = |n: u64| n as f64 / items as f64;
    let write_load = s.write_rate * ratio(hot_wcu);
    let read_load = s.read_rate.map(|r| r * ratio(hot_items));
    let needed = (write_load / s.write_budget).max(read_load.map_or(0.0, |l| l / s.read_budget));
    let mut r = ShapeReport {
        pk,
        sk,
        items: a.items,
        share: ratio(a.items),
        hottest_key: hot_key.to_string(),
        hottest_write_share: ratio(hot_wcu),
        hottest_read_share: ratio(hot_items),
        write_load,
        read_load,
        needed,
        action: Action::NoRule,
        rule: None,
        bucket: None,
        notes: Vec::new(),
    };
    // The bucket and the shards join the partition key, so they take its
    // delimiter; a key of one segment borrows its sort key's.
    let delim =
        a.pk.delimiter
            .or(a.sk.as_ref().and_then(|sk| sk.delimiter))
            .unwrap_or('#');
    // A time in the sort key, none in the partition key: a bucket can join the key.
    let pk_has_time = pk_caps.iter().any(|(_, st)| st.time().is_some());
    let time = sk_caps
        .iter()
        .find_map(|(n, st)| st.time().map(|t| (n.clone(), t)))
        .filter(|_| !pk_has_time);
    r.bucket = time.map(|(n, t)| {
        let (unit, lit) = t.bucket();
        format!("{lit}{delim}{{bucket({n}, {})}}", unit.name())
    });
    let count = match (
        shard::shard_count(write_load, s.write_budget, s.rounding),
        read_load.map(|l| shard::shard_count(l, s.read_budget, s.rounding)),
    ) {
        (Some(w), None) => Some(w),
        (Some(w), Some(Some(r))) => Some(w.max(r)),
        _ => None,
    };
    match count {
        Some(1) => {
            if let Some(b) = &r.bucket {
                r.notes.push(format!(
                    "no rule needed at this rate; if its item collections grow, a time bucket \
                     (`{}{delim}{b}`) would cap them",
                    r.pk
                ));
            }
        }
        None => {
            r.action = Action::CannotShard;
            r.notes.push(format!(
                "its hottest key would need more than {} shards: it needs another key design",
                shard::MAX_SHARDS
            ));
        }
        Some(n) => shard_rule(&mut r, n, &sk_caps, delim, rule_names),
    }
    r
}

/// Turn a hot shape into a shard rule (with the bucket when one is offered).
fn shard_rule(
    r: &mut ShapeReport,
    n: u32,
    sk_caps: &[(String, &VarStats)],
    delim: char,
    rule_names: &mut Vec<String>,
) {
    // The id that varies most within a key: the sort key's variable with the
    // most distinct values, times last (later ids win ties: the most specific).
    let Some((capture, _)) = sk_caps
        .iter()
        .max_by_key(|(_, st)| (st.time().is_none(), st.distinct()))
    else {
        r.action = Action::CannotShard;
        r.notes.push(
            "its sort key is constant (or there is none): there is no id to shard by, so each \
             key is one item and no rule can spread it"
                .into(),
        );
        return;
    };
    let pad = if n > 10 {
        format!(":0{}", (n - 1).to_string().len())
    } else {
        String::new()
    };
    let mut key_pk = r.pk.clone();
    if let Some(b) = &r.bucket {
        key_pk.push(delim);
        key_pk.push_str(b);
        r.notes
            .push("the bucket keeps old keys cold; it does not lower the current key's rate, the shards do".into());
    }
    key_pk.push_str(&format!(
        "{delim}SHARD{delim}{{shard({capture}, {n}){pad}}}"
    ));
    r.action = Action::Shard {
        shards: n,
        capture: capture.clone(),
    };
    r.notes.push(format!(
        "each logical read of a `{}` key becomes {n} queries (one per shard), merged",
        r.pk
    ));
    r.rule = Some(RuleText {
        name: rule_name(&r.pk, r.sk.as_deref(), rule_names),
        match_pk: r.pk.clone(),
        match_sk: r.sk.clone(),
        key_pk,
        key_sk: r.sk.clone(),
    });
}

/// A rule name from the shape's literals (`tenant-day-order`), unique.
fn rule_name(pk: &str, sk: Option<&str>, taken: &mut Vec<String>) -> String {
    let mut words = Vec::new();
    let mut depth = 0;
    let mut word = String::new();
    for c in pk
        .chars()
        .chain(['#'])
        .chain(sk.unwrap_or("").chars())
        .chain(['#'])
    {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            c if depth == 0 && c.is_ascii_alphanumeric() => word.push(c.to_ascii_lowercase()),
            _ if depth == 0 => {
                if !word.is_empty() && !words.contains(&word) {
                    words.push(std::mem::take(&mut word));
                }
                word.clear();
            }
            _ => {}
        }
    }
    let base = if words.is_empty() {
        "shape".to_string()
    } else {
        words.join("-")
    };
    let mut name = base.clone();
    let mut i = 2;
    while taken.contains(&name) {
        name = format!("{base}-{i}");
        i += 1;
    }
    taken.push(name.clone());
    name
}

/// A shape without a rule whose keys an emitted rule's shapes would match
/// (captures match `#` too) gets a rule that keeps its key as it is.
fn protect_unruled(reports: &mut [ShapeReport], accs: &[ShapeAcc<'_>]) {
    use crate::core::template::Shape;
    let rules: Vec<(Shape, Option<Shape>)> = reports
        .iter()
        .filter_map(|r| r.rule.as_ref())
        .filter_map(|t| {
            let pk = Shape::parse(&t.match_pk).ok()?;
            let sk = match &t.match_sk {
                Some(s) => Some(Shape::parse(s).ok()?),
                None => None,
            };
            Some((pk, sk))
        })
        .collect();
    let mut names: Vec<String> = reports
        .iter()
        .filter_map(|r| r.rule.as_ref().map(|t| t.name.clone()))
        .collect();
    for (r, a) in reports.iter_mut().zip(accs) {
        if r.rule.is_some() {
            continue;
        }
        let ex = a.example;
        let taken = rules.iter().any(|(pk, sk)| {
            pk.matches(&ex.pk).is_some()
                && match (sk, &ex.sk) {
                    (Some(sk), Some(v)) => sk.matches(v).is_some(),
                    (None, _) => true,
                    (Some(_), None) => false,
                }
        });
        if taken {
            r.action = Action::Keep;
            r.notes.push(
                "kept as it is by its own rule, so that a broader rule's shape does not take its items"
                    .into(),
            );
            r.rule = Some(RuleText {
                name: rule_name(&r.pk, r.sk.as_deref(), &mut names),
                match_pk: r.pk.clone(),
                match_sk: r.sk.clone(),
                key_pk: r.pk.clone(),
                key_sk: r.sk.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests;
