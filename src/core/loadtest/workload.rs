//! The application's requests for one plan: source items in the rule's
//! `match` shapes, and reads of one logical key, drawn from a [`Scenario`].
//!
//! The plan says what the keys look like, not what the pieces mean, so each
//! capture of the rule gets a role from where it stands: the first capture
//! of the source partition key is the tenant (the skewed dimension), the
//! partition key's other captures are the period (a day), the sort key's
//! are ids; a capture or attribute a `bucket()` reads is a time inside the
//! drawn day, and any other attribute the rule's templates read gets a
//! status. The new design's item is never built here: it is
//! `transform(plan, item)`, the same function the migration uses, and a new
//! design's read is the read path's own fan-out ([`keys::render`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::core::loadtest::scenario::{CLASSES, Items, Rng, Scenario, Tenants, days};
use crate::core::plan::{Plan, Rule};
use crate::core::query::keys::{self, KeyError, TimeRange};
use crate::core::template::{Expr, Part, Template};
use crate::core::transform::{Outcome, transform};
use crate::core::value::{Item, ScalarType, Value};

/// Why a plan cannot drive a load test (bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WorkloadError {
    #[error("the plan has no rule named `{0}`")]
    UnknownRule(String),
    #[error("the source's {role} key `{name}` is {ty}: loadtest writes string (S) keys")]
    NotString {
        role: &'static str,
        name: String,
        ty: ScalarType,
    },
    #[error("rule `{0}` does not match the source's partition key: loadtest cannot draw its keys")]
    NoKeyShape(String),
    #[error("rule `{rule}`: a drawn item {why}; choose another rule with --rule")]
    NotThisRule { rule: String, why: String },
    #[error("rule `{rule}`: its reads cannot be rendered: {error}")]
    Read { rule: String, error: KeyError },
}

/// The roles of a rule's captures and attributes, and the shapes to fill.
#[derive(Debug, Clone)]
pub(crate) struct KeyModel {
    pub rule: String,
    rule_index: usize,
    /// (attribute, its match shape as a template of literals and captures).
    shapes: Vec<(String, Template)>,
    pk: String,
    /// The source's sort key, when the rule does not match it.
    free_sk: Option<String>,
    tenant: Option<String>,
    periods: BTreeSet<String>,
    times: BTreeSet<String>,
    time_attrs: BTreeSet<String>,
    status_attrs: BTreeSet<String>,
    /// What the new partition key template reads outside `shard()` and
    /// `bucket()`, and whether it has a `bucket()`.
    read_names: BTreeSet<String>,
    bucketed: bool,
}

/// Every capture and attribute a template reads, each with whether a
/// `bucket()` reads it.
fn reads(t: &Template, out: &mut Vec<(Expr, bool)>) {
    fn walk(e: &Expr, in_bucket: bool, out: &mut Vec<(Expr, bool)>) {
        match e {
            Expr::Capture(_) | Expr::Attr(_) => out.push((e.clone(), in_bucket)),
            Expr::Shard { arg, .. } => walk(arg, in_bucket, out),
            Expr::Bucket { arg, .. } => walk(arg, true, out),
            Expr::Text(t) => {
                for p in &t.parts {
                    if let Part::Expr { expr, .. } = p {
                        walk(expr, in_bucket, out);
                    }
                }
            }
        }
    }
    for p in &t.parts {
        if let Part::Expr { expr, .. } = p {
            walk(expr, false, out);
        }
    }
}

/// The rule `--rule` names; else the first whose new partition key spreads
/// (a `shard()` or `bucket()`); else the first.
fn pick_rule<'p>(plan: &'p Plan, name: Option<&str>) -> Result<(usize, &'p Rule), WorkloadError> {
    if let Some(name) = name {
        return plan
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.name == name)
            .ok_or_else(|| WorkloadError::UnknownRule(name.to_string()));
    }
    let spreads = |r: &Rule| {
        keys::pk_template(plan, r).is_some_and(|t| {
            t.parts.iter().any(|p| {
                matches!(
                    p,
                    Part::Expr {
                        expr: Expr::Shard { .. } | Expr::Bucket { .. },
                        ..
                    }
                )
            })
        })
    };
    plan.rules
        .iter()
        .enumerate()
        .find(|(_, r)| spreads(r))
        .or_else(|| plan.rules.iter().enumerate().next())
        .ok_or_else(|| WorkloadError::UnknownRule("(none: the plan has no rules)".into()))
}

impl KeyModel {
    /// The model of `rule` (or the plan's spreading rule), checked: items
    /// it draws are the rule's, and their reads render.
    pub(crate) fn new(plan: &Plan, rule: Option<&str>) -> Result<KeyModel, WorkloadError> {
        for (role, attr) in [("partition", Some(&plan.source_key.partition_key))]
            .into_iter()
            .chain([("sort", plan.source_key.sort_key.as_ref())])
        {
            if let Some(a) = attr.filter(|a| a.ty != ScalarType::S) {
                return Err(WorkloadError::NotString {
                    role,
                    name: a.name.clone(),
                    ty: a.ty,
                });
            }
        }
        let (rule_index, r) = pick_rule(plan, rule)?;
        let pk = plan.source_key.partition_key.name.clone();
        let shape_of = |attr: &str| r.matchers.iter().find(|(a, _)| a == attr);
        let pk_shape = shape_of(&pk).ok_or_else(|| WorkloadError::NoKeyShape(r.name.clone()))?;
        let mut pk_captures = pk_shape.1.captures.iter().map(|(n, _)| n.clone());
        let tenant = pk_captures.next();
        let periods: BTreeSet<String> = pk_captures.collect();
        let mut used = Vec::new();
        for (_, t) in &r.key {
            reads(t, &mut used);
        }
        for s in &r.set {
            reads(&s.template, &mut used);
        }
        let (mut times, mut time_attrs, mut status_attrs) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        let key_names = plan.source_key.names();
        for (e, in_bucket) in used {
            match (e, in_bucket) {
                (Expr::Capture(c), true) => {
                    times.insert(c);
                }
                (Expr::Attr(a), _) if key_names.contains(&a.as_str()) => {}
                (Expr::Attr(a), true) => {
                    time_attrs.insert(a);
                }
                (Expr::Attr(a), false) => {
                    status_attrs.insert(a);
                }
                _ => {}
            }
        }
        let shapes = r
            .matchers
            .iter()
            .map(|(a, s)| Template::parse(&s.text).map(|t| (a.clone(), t)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| WorkloadError::NotThisRule {
                rule: r.name.clone(),
                why: format!("has a shape that does not parse: {e}"),
            })?;
        let free_sk = plan
            .source_key
            .sort_key
            .as_ref()
            .filter(|sk| shape_of(&sk.name).is_none())
            .map(|sk| sk.name.clone());
        let (read_names, bucketed) = keys::pk_template(plan, r).map_or_else(
            || (BTreeSet::new(), false),
            |t| {
                let (names, bucketed) = keys::needs(t);
                (names.into_iter().map(str::to_string).collect(), bucketed)
            },
        );
        let model = KeyModel {
            rule: r.name.clone(),
            rule_index,
            shapes,
            pk,
            free_sk,
            tenant,
            periods,
            times,
            time_attrs,
            status_attrs,
            read_names,
            bucketed,
        };
        model.check(plan)?;
        Ok(model)
    }

    /// Items drawn from every tenant class and period are the rule's, and
    /// their reads render.
    fn check(&self, plan: &Plan) -> Result<(), WorkloadError> {
        let scenario = crate::core::loadtest::scenario::DEFAULT;
        let mut g = Generator::new(self.clone(), scenario, 1);
        for n in 0..64 {
            let (item, read) = g.draw_item(n);
            let bad = |why: String| WorkloadError::NotThisRule {
                rule: self.rule.clone(),
                why,
            };
            match transform(plan, &item) {
                Outcome::Put { rule: Some(i), .. } if i == self.rule_index => {}
                Outcome::Put { .. } => return Err(bad("matches an earlier rule".into())),
                Outcome::Skip => return Err(bad("is skipped by the plan".into())),
                Outcome::Reject(r) => return Err(bad(format!("is rejected: {r}"))),
            }
            if plan.target_key.sort_key.is_some() {
                self.target_keys(plan, &read)
                    .map_err(|error| WorkloadError::Read {
                        rule: self.rule.clone(),
                        error,
                    })?;
            }
        }
        Ok(())
    }

    /// The new design's partition keys one read fans out to (the read
    /// path's keys); the source key itself when the rule keeps it.
    pub(crate) fn target_keys(&self, plan: &Plan, read: &Read) -> Result<Vec<String>, KeyError> {
        let rule = &plan.rules[self.rule_index];
        if keys::pk_template(plan, rule).is_none() {
            return Ok(vec![read.source_key.clone()]);
        }
        keys::render(plan, rule, &read.where_, read.time.as_ref()).map(|k| k.keys)
    }
}

/// One read of a logical key: its old partition key, and what the read
/// path needs to find its new ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    pub source_key: String,
    /// The values the new partition key template reads outside `shard()`
    /// and `bucket()` (`rekey query --where`).
    pub where_: BTreeMap<String, String>,
    /// The time bucket's range, when the new key has one: the drawn time.
    pub time: Option<TimeRange>,
}

/// One request of the application.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    /// Write this source item (the new design writes its transform).
    Write(Item),
    Read(Read),
}

/// A request and the class of the tenant it is for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Draw {
    pub class: &'static str,
    pub op: Op,
}

const STATUSES: [&str; 4] = ["OPEN", "PAID", "SHIPPED", "DELIVERED"];

/// The request sequence of one scenario, a function of its seed: both
/// designs of a run replay the same requests.
#[derive(Debug, Clone)]
pub(crate) struct Generator {
    model: KeyModel,
    scenario: Scenario,
    rng: Rng,
    /// (tenant name, class name), in [`CLASSES`] order; the hot one last.
    tenants: Vec<(String, &'static str)>,
    tenant_weights: Vec<u32>,
    days: Vec<(String, u32)>,
    day_weights: Vec<u32>,
    /// Writes so far: new items' ids.
    written: u64,
}

impl Generator {
    pub(crate) fn new(model: KeyModel, scenario: Scenario, seed: u64) -> Generator {
        let mut tenants = Vec::new();
        let mut tenant_weights = Vec::new();
        for c in &CLASSES {
            for i in 0..c.tenants {
                tenants.push((format!("{}-{i:02}", c.name), c.name));
                tenant_weights.push(match scenario.tenants {
                    Tenants::Skewed => c.weight,
                    Tenants::Uniform => 1,
                    Tenants::Hot => 0,
                });
            }
        }
        if scenario.tenants == Tenants::Hot
            && let Some(last) = tenant_weights.last_mut()
        {
            *last = 1;
        }
        let days = days(scenario.periods);
        let day_weights = days.iter().map(|d| d.1).collect();
        Generator {
            model,
            scenario,
            rng: Rng(seed),
            tenants,
            tenant_weights,
            days,
            day_weights,
            written: 0,
        }
    }

    /// The next request.
    pub(crate) fn next(&mut self) -> Draw {
        let read = self.rng.unit() < self.scenario.reads;
        let id = match self.scenario.items {
            Items::New if read => 0,
            Items::New => {
                self.written += 1;
                self.written
            }
            Items::Pool(n) => self.rng.next() % u64::from(n.max(1)),
        };
        let tenant = self.rng.pick(&self.tenant_weights);
        let class = self.tenants[tenant].1;
        let (item, r) = self.item(tenant, id);
        Draw {
            class,
            op: if read { Op::Read(r) } else { Op::Write(item) },
        }
    }

    /// Item `id` of a drawn tenant, for the model's check.
    fn draw_item(&mut self, id: u64) -> (Item, Read) {
        let tenant = self.rng.pick(&self.tenant_weights);
        self.item(tenant, id)
    }

    /// Item `id` of `tenant` on a drawn day, and the read of its key.
    fn item(&mut self, tenant: usize, id: u64) -> (Item, Read) {
        let m = &self.model;
        let day = self.days[self.rng.pick(&self.day_weights)].0.clone();
        let secs = self.rng.next() % 86_400;
        let time = format!(
            "{day}T{:02}:{:02}:{:02}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        // A bijection of the id on 32 bits: ids look random, never collide.
        let id_text = |k: usize| {
            let x = id.wrapping_mul(2_654_435_761).wrapping_add(k as u64) % (1 << 32);
            format!("{x:08x}")
        };
        let status = STATUSES[(self.rng.next() % 4) as usize];
        let mut captures: BTreeMap<&str, String> = BTreeMap::new();
        let mut item = Item::new();
        for (attr, shape) in &m.shapes {
            let mut text = String::new();
            let mut k = 0;
            for part in &shape.parts {
                match part {
                    Part::Lit(l) => text.push_str(l),
                    Part::Expr {
                        expr: Expr::Capture(c),
                        ..
                    } => {
                        let value = if Some(c) == m.tenant.as_ref() {
                            self.tenants[tenant].0.clone()
                        } else if m.times.contains(c) {
                            time.clone()
                        } else if m.periods.contains(c) {
                            day.clone()
                        } else {
                            k += 1;
                            id_text(k)
                        };
                        text.push_str(&value);
                        captures.insert(c.as_str(), value);
                    }
                    Part::Expr { .. } => {}
                }
            }
            item.insert(attr.clone(), Value::S(text));
        }
        if let Some(sk) = &m.free_sk {
            item.insert(sk.clone(), Value::S(format!("ITEM#{}", id_text(0))));
        }
        for a in &m.time_attrs {
            item.insert(a.clone(), Value::S(time.clone()));
        }
        for a in &m.status_attrs {
            item.entry(a.clone())
                .or_insert_with(|| Value::S(status.to_string()));
        }
        item.entry("status".into())
            .or_insert_with(|| Value::S(status.to_string()));
        let read = self.read_of(&item, &captures, &time);
        (item, read)
    }

    /// The read of the logical key `item` belongs to.
    fn read_of(&self, item: &Item, captures: &BTreeMap<&str, String>, time: &str) -> Read {
        let text = |name: &str| {
            captures
                .get(name)
                .cloned()
                .or_else(|| item.get(name).and_then(Value::as_text).map(str::to_string))
        };
        let source_key = text(&self.model.pk).unwrap_or_default();
        Read {
            source_key,
            where_: self
                .model
                .read_names
                .iter()
                .filter_map(|n| Some((n.clone(), text(n)?)))
                .collect(),
            time: self.model.bucketed.then(|| TimeRange {
                from: time.to_string(),
                to: time.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;
    use crate::core::loadtest::scenario::{DEFAULT, PRESETS, Periods};

    fn plan(name: &str) -> Plan {
        let path = format!("{}/plans/{name}.toml", env!("CARGO_MANIFEST_DIR"));
        Plan::load(std::path::Path::new(&path)).unwrap()
    }

    fn text(item: &Item, attr: &str) -> String {
        item[attr].as_text().unwrap().to_string()
    }

    /// 100,000 requests of the default scenario from one seed: the tenant
    /// classes' shares of the traffic are their weights' (70×1 : 20×5 :
    /// 9×25 : 1×400), a fifth reads, and the hot tenant's today key takes
    /// 0.503 × 0.7 ≈ 35 % of the writes.
    #[test]
    fn a_seeded_run_has_the_articles_skew_within_a_per_cent() {
        let plan = plan("tenant-day-shard");
        let model = KeyModel::new(&plan, None).unwrap();
        assert_eq!(model.rule, "order");
        let mut g = Generator::new(model, DEFAULT, 42);
        let n = 100_000;
        let (mut by_class, mut reads, mut writes, mut hot) = (BTreeMap::new(), 0, 0, 0);
        let mut tenants: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for _ in 0..n {
            let d = g.next();
            *by_class.entry(d.class).or_insert(0u32) += 1;
            match d.op {
                Op::Read(_) => reads += 1,
                Op::Write(item) => {
                    writes += 1;
                    let pk = text(&item, "PK");
                    hot += u32::from(pk == "TENANT#pathological-00#DAY#2026-07-07");
                    let tenant = pk.split('#').nth(1).unwrap().to_string();
                    tenants.entry(d.class).or_default().insert(tenant);
                }
            }
        }
        let share = |c: u32, of: u32| f64::from(c) / f64::from(of);
        for (class, weight) in [
            ("normal", 70.0),
            ("large", 100.0),
            ("enterprise", 225.0),
            ("pathological", 400.0),
        ] {
            let got = share(by_class[class], n);
            assert!((got - weight / 795.0).abs() < 0.01, "{class}: {got}");
        }
        let population: Vec<usize> = ["normal", "large", "enterprise", "pathological"]
            .iter()
            .map(|c| tenants[c].len())
            .collect();
        assert_eq!(population, [70, 20, 9, 1]);
        assert!((share(reads, n) - 0.2).abs() < 0.01, "{reads}");
        assert!(
            (share(hot, writes) - 400.0 / 795.0 * 0.7).abs() < 0.01,
            "{hot}"
        );
    }

    #[test]
    fn a_seed_names_its_sequence() {
        let model = KeyModel::new(&plan("tenant-day-shard"), None).unwrap();
        let draw = |seed| {
            let mut g = Generator::new(model.clone(), DEFAULT, seed);
            (0..200).map(|_| g.next()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    /// Each preset's data shows in what it draws: whose key, which day,
    /// which items, what share reads.
    #[test]
    fn each_preset_draws_as_its_data_says() {
        let plan = plan("tenant-day-shard");
        let model = KeyModel::new(&plan, None).unwrap();
        for s in PRESETS {
            let mut g = Generator::new(model.clone(), s, 3);
            let (mut reads, mut classes, mut days, mut ids) = (
                0,
                BTreeSet::new(),
                BTreeSet::new(),
                BTreeMap::<String, BTreeSet<String>>::new(),
            );
            for _ in 0..5_000 {
                let d = g.next();
                classes.insert(d.class);
                match d.op {
                    Op::Read(r) => {
                        reads += 1;
                        assert_eq!(
                            r.source_key,
                            format!("TENANT#{}#DAY#{}", r.where_["tenant"], r.where_["day"])
                        );
                    }
                    Op::Write(item) => {
                        let pk = text(&item, "PK");
                        days.insert(pk.rsplit('#').next().unwrap().to_string());
                        ids.entry(pk).or_default().insert(text(&item, "SK"));
                        assert!(
                            matches!(transform(&plan, &item), Outcome::Put { rule: Some(0), .. }),
                            "{}: {item:?}",
                            s.name
                        );
                    }
                }
            }
            let share = f64::from(reads) / 5_000.0;
            assert!((share - s.reads).abs() < 0.03, "{}: {share}", s.name);
            match s.tenants {
                Tenants::Hot => assert_eq!(classes, BTreeSet::from(["pathological"]), "{}", s.name),
                _ => assert_eq!(classes.len(), 4, "{}", s.name),
            }
            if s.reads < 1.0 {
                let want = match s.periods {
                    Periods::Today => 1,
                    Periods::Recent => 3,
                    Periods::Spread => 30,
                };
                assert_eq!(days.len(), want, "{}", s.name);
            }
            if let Items::Pool(n) = s.items {
                let most = ids.values().map(BTreeSet::len).max().unwrap_or(0);
                assert!(most <= n as usize, "{}: {most} items on one key", s.name);
            } else {
                let all: usize = ids.values().map(BTreeSet::len).sum();
                assert_eq!(
                    all,
                    5_000 - reads as usize,
                    "{}: every write a new item",
                    s.name
                );
            }
        }
    }

    /// A read of the new design is the read path's fan-out: 16 shards of a
    /// tenant-day; for a bucketed key, the drawn time's bucket and its
    /// shards, the time also in the attribute `bucket()` reads.
    #[test]
    fn reads_fan_out_over_the_new_designs_shards_and_buckets() {
        let plan = plan("tenant-day-shard");
        let model = KeyModel::new(&plan, None).unwrap();
        let mut g = Generator::new(
            model.clone(),
            crate::core::loadtest::scenario::preset("dashboard").unwrap(),
            5,
        );
        let Op::Read(r) = g.next().op else { panic!() };
        let keys = model.target_keys(&plan, &r).unwrap();
        assert_eq!(keys.len(), 16);
        assert!(
            keys.iter()
                .all(|k| k.starts_with(&format!("{}#SHARD#", r.source_key)))
        );

        let plan = super::tests::plan("event-hour-shard");
        let model = KeyModel::new(&plan, None).unwrap();
        let mut g = Generator::new(model.clone(), DEFAULT, 5);
        let (mut read, mut write) = (None, None);
        while read.is_none() || write.is_none() {
            match g.next().op {
                Op::Read(r) => read = Some(r),
                Op::Write(i) => write = Some(i),
            }
        }
        let r = read.unwrap();
        let t = r.time.clone().unwrap();
        assert_eq!(t.from, t.to);
        assert_eq!(model.target_keys(&plan, &r).unwrap().len(), 8);
        let item = write.unwrap();
        assert!(text(&item, "occurred_at").ends_with('Z'), "{item:?}");
    }

    /// Every example plan drives a load test, or says why not.
    #[test]
    fn every_example_plan_gives_a_model_or_a_reason() {
        let dir = format!("{}/plans", env!("CARGO_MANIFEST_DIR"));
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let plan = Plan::load(&path).unwrap();
            match KeyModel::new(&plan, None) {
                Ok(m) => assert!(!m.rule.is_empty()),
                Err(e) => assert!(!e.to_string().is_empty(), "{}", path.display()),
            }
        }
        let plan = plan("tenant-day-shard");
        assert_eq!(
            KeyModel::new(&plan, Some("nope")).unwrap_err(),
            WorkloadError::UnknownRule("nope".into())
        );
        // The profile rule's items match it; its key is kept, so a read is the key itself.
        let m = KeyModel::new(&plan, Some("tenant-profile")).unwrap();
        let mut g = Generator::new(m.clone(), DEFAULT, 1);
        let r = loop {
            if let Op::Read(r) = g.next().op {
                break r;
            }
        };
        let keys = m.target_keys(&plan, &r).unwrap();
        assert_eq!((keys.len(), &keys[0]), (1, &r.source_key));
    }

    proptest! {
        /// Whatever the seed and preset, every write is the rule's and every
        /// read renders.
        #[test]
        fn every_draw_is_the_rules(seed in any::<u64>(), p in 0..PRESETS.len()) {
            let plan = plan("tenant-day-shard");
            let model = KeyModel::new(&plan, None).unwrap();
            let mut g = Generator::new(model.clone(), PRESETS[p], seed);
            for _ in 0..50 {
                match g.next().op {
                    Op::Write(item) => prop_assert!(
                        matches!(transform(&plan, &item), Outcome::Put { rule: Some(0), .. }),
                        "{:?}", item
                    ),
                    Op::Read(r) => prop_assert_eq!(model.target_keys(&plan, &r).unwrap().len(), 16),
                }
            }
        }
    }
}
