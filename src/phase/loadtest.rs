//! `rekey loadtest`: the application's skewed traffic, run against the old
//! design, the new one, or both, measured as DynamoDB answers it.
//!
//! The promise of a new key design is "the old key throttles and the new one
//! does not"; `analyze` predicts it from item counts, this measures it. Each
//! design gets the same requests (one seeded sequence, `core::loadtest`) at
//! the same rate for the same time, one design after the other, on scratch
//! tables shaped by the plan (or a given pair): the old design writes the
//! source item and reads its partition key; the new one writes
//! `transform(plan, item)` and reads the logical key through the read path,
//! fanning out over its shards and buckets and merging a page.
//!
//! Every measured call is made once (`aws::item::put_once`,
//! `aws::query::query_once`): a throttle the SDK retried would be a slow
//! request, not a throttle. Requests go out open-loop at the rate (a slow
//! answer does not slow the schedule) with a cap on those in flight.
//! Scratch tables are deleted at the end, after an error and after a stop.

use std::time::{Duration, Instant};

use futures::stream::{self, FuturesUnordered, StreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::aws::item::put_once;
use crate::aws::query::{QueryCall, query_once};
use crate::aws::{AwsError, Clients};
use crate::core::loadtest::cost::Traffic;
use crate::core::loadtest::report::{Answer, DesignReport, Ending, Kind, Tally};
use crate::core::loadtest::scenario::Scenario;
use crate::core::loadtest::workload::{Generator, KeyModel, Op, Read};
use crate::core::plan::Plan;
use crate::core::query::{KeyCondition, Order, PageRun, SkCondition};
use crate::core::transform::{Outcome, transform};
use crate::core::value::Value;
use crate::phase::error::InputError;
use crate::phase::progress::Progress;

/// Query calls in flight at once for one read of the new design.
const PARALLEL: usize = 32;

/// Which designs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Designs {
    Old,
    New,
    Both,
}

impl Designs {
    fn runs(self, design: Design) -> bool {
        matches!(
            (self, design),
            (Designs::Both, _) | (Designs::Old, Design::Old) | (Designs::New, Design::New)
        )
    }
}

/// One key design: the plan's source shape, or its target shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Design {
    Old,
    New,
}

impl Design {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Design::Old => "old",
            Design::New => "new",
        }
    }
}

/// An existing pair of tables to run against (not deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenTables {
    pub old: String,
    pub new: String,
}

#[derive(Debug, Clone)]
pub struct LoadtestOptions {
    pub scenario: Scenario,
    /// The plan's rule whose keys are drawn (default: the one that spreads).
    pub rule: Option<String>,
    pub designs: Designs,
    /// Requests per second.
    pub rate: f64,
    /// How long each design runs.
    pub duration: Duration,
    /// Requests in flight at most.
    pub concurrency: usize,
    pub seed: u64,
    /// Items per read (one Query page; the new design merges one page from its keys).
    pub page: usize,
    /// Keys per hottest-keys list.
    pub top: usize,
    /// None: scratch tables, created and deleted.
    pub tables: Option<GivenTables>,
}

/// The whole run: the scenario, then each design's report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LoadReport {
    pub scenario: Scenario,
    pub rule: String,
    pub seed: u64,
    /// Requests per second asked for, and seconds per design.
    pub rate: f64,
    pub duration_seconds: f64,
    /// Scratch tables were created and deleted (false: a given pair, kept).
    pub scratch_tables: bool,
    /// Stopped by the operator before the end: the reports cover what ran.
    pub stopped: bool,
    pub designs: Vec<DesignReport>,
}

/// What a run needs, checked before any AWS call: the key model and, for
/// the cost estimate, each design's traffic.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub model: KeyModel,
    pub traffic: Vec<Traffic>,
}

/// The plan drives this workload, or the reason it cannot (bad input).
pub(crate) fn prepare(plan: &Plan, o: &LoadtestOptions) -> Result<Prepared, InputError> {
    let model = KeyModel::new(plan, o.rule.as_deref()).map_err(|e| InputError(e.to_string()))?;
    if o.scenario.reads > 0.0 && plan.target_key.sort_key.is_none() && o.designs != Designs::Old {
        return Err(InputError(
            "the target has no sort key: the new design's reads go through the read path, \
             which needs one; give --mix 0:1 (writes only) or --design old"
                .into(),
        ));
    }
    let mut keys_per_read = 1;
    if o.scenario.reads > 0.0 && o.designs != Designs::Old {
        let mut g = Generator::new(model.clone(), o.scenario, o.seed);
        // The first read the run makes: its fan-out is every read's.
        let first = (0..10_000).find_map(|_| match g.next().op {
            Op::Read(r) => Some(r),
            Op::Write(_) => None,
        });
        if let Some(read) = first {
            keys_per_read = model
                .target_keys(plan, &read)
                .map_err(|e| InputError(format!("rule `{}`: {e}", model.rule)))?
                .len();
        }
    }
    let traffic = |design| Traffic {
        rate: o.rate,
        seconds: o.duration.as_secs_f64(),
        reads: o.scenario.reads,
        keys_per_read: if design == Design::New {
            keys_per_read
        } else {
            1
        },
        tables_per_write: if design == Design::New {
            1 + plan.indexes.len()
        } else {
            1
        },
    };
    let traffic = [Design::Old, Design::New]
        .into_iter()
        .filter(|d| o.designs.runs(*d))
        .map(traffic)
        .collect();
    Ok(Prepared { model, traffic })
}

/// The tables of the run: each design's, and whether they are scratch.
struct Tables {
    old: Option<String>,
    new: Option<String>,
    scratch: bool,
}

impl Tables {
    fn of(&self, d: Design) -> Option<&str> {
        match d {
            Design::Old => self.old.as_deref(),
            Design::New => self.new.as_deref(),
        }
    }

    /// The given pair, checked against the plan; or scratch tables shaped by
    /// it. On an error, the scratch tables already made are deleted.
    async fn prepare(
        clients: &Clients,
        plan: &Plan,
        o: &LoadtestOptions,
    ) -> anyhow::Result<Tables> {
        let wanted = |d| o.designs.runs(d);
        if let Some(given) = &o.tables {
            for (d, table, key, role) in [
                (Design::Old, &given.old, &plan.source_key, "source"),
                (Design::New, &given.new, &plan.target_key, "target"),
            ] {
                if wanted(d) {
                    clients.describe_table(table).await?.check_key(key, role)?;
                }
            }
            return Ok(Tables {
                old: wanted(Design::Old).then(|| given.old.clone()),
                new: wanted(Design::New).then(|| given.new.clone()),
                scratch: false,
            });
        }
        let suffix = scratch_suffix();
        let mut t = Tables {
            old: None,
            new: None,
            scratch: true,
        };
        if wanted(Design::Old) {
            let name = scratch_table(plan, Design::Old, &suffix);
            let made = clients
                .create_table_with(&name, &plan.source_key, false, &[])
                .await;
            t.old = Some(name);
            if let Err(e) = made {
                let _ = t.delete(clients).await;
                return Err(e.into());
            }
        }
        if wanted(Design::New) {
            let name = scratch_table(plan, Design::New, &suffix);
            let made = clients
                .create_table_with(&name, &plan.target_key, false, &plan.indexes)
                .await;
            t.new = Some(name);
            if let Err(e) = made {
                let _ = t.delete(clients).await;
                return Err(e.into());
            }
        }
        Ok(t)
    }

    /// Deletes the scratch tables; a given pair is kept. What could not be
    /// deleted is named in the error.
    async fn delete(&self, clients: &Clients) -> Result<(), AwsError> {
        if !self.scratch {
            return Ok(());
        }
        let mut first = Ok(());
        for t in [&self.old, &self.new].into_iter().flatten() {
            if let Err(e) = clients.delete_table(t).await {
                tracing::warn!(table = %t, error = %e, "a scratch table was not deleted");
                first = first.and(Err(e));
            }
        }
        first
    }
}

/// A scratch table's name: the plan's table of the design, and `suffix`
/// (`*` in the IAM policy's resource pattern).
pub(crate) fn scratch_table(plan: &Plan, design: Design, suffix: &str) -> String {
    match design {
        Design::Old => format!("{}-loadtest-old-{suffix}", plan.source_table),
        Design::New => format!("{}-loadtest-new-{suffix}", plan.target_table),
    }
}

/// Eight hex digits from the clock and the process: scratch names of two
/// runs never meet.
fn scratch_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = crate::core::loadtest::scenario::Rng(nanos ^ u64::from(std::process::id()));
    format!("{:08x}", rng.next() as u32)
}

/// Run every design asked for, one after the other; the scratch tables are
/// deleted whatever happens. A stop ends the design running (its report
/// covers what ran) and skips the rest.
pub(crate) async fn run(
    clients: &Clients,
    plan: &Plan,
    o: &LoadtestOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<LoadReport> {
    let prepared = prepare(plan, o)?;
    let tables = Tables::prepare(clients, plan, o).await?;
    let mut designs = Vec::new();
    let mut outcome = Ok(());
    for design in [Design::Old, Design::New] {
        let Some(table) = tables.of(design) else {
            continue;
        };
        if stop.is_cancelled() {
            break;
        }
        let ctx = Ctx {
            clients,
            plan,
            model: &prepared.model,
            design,
            table,
            page: o.page,
        };
        let expected = (o.rate * o.duration.as_secs_f64()).ceil() as u64;
        progress.start(
            &format!("{} design on {table}", design.name()),
            Some(expected),
        );
        let ran = run_design(&ctx, o, progress, stop).await;
        progress.finish();
        match ran {
            Ok((tally, seconds)) => {
                designs.push(tally.report(design.name(), table, seconds, o.top))
            }
            Err(e) => {
                outcome = Err(e.context(format!("the {} design on `{table}`", design.name())));
                break;
            }
        }
    }
    let deleted = tables.delete(clients).await;
    outcome?;
    deleted?;
    Ok(LoadReport {
        scenario: o.scenario,
        rule: prepared.model.rule.clone(),
        seed: o.seed,
        rate: o.rate,
        duration_seconds: o.duration.as_secs_f64(),
        scratch_tables: tables.scratch,
        stopped: stop.is_cancelled(),
        designs,
    })
}

/// What one design's requests need.
struct Ctx<'a> {
    clients: &'a Clients,
    plan: &'a Plan,
    model: &'a KeyModel,
    design: Design,
    table: &'a str,
    page: usize,
}

/// How one request went: its calls' answers, by partition key value.
struct Done {
    kind: Kind,
    ending: Ending,
    micros: u64,
    calls: Vec<(String, Answer)>,
}

impl Done {
    /// The capacity its calls consumed.
    fn consumed(&self) -> f64 {
        self.calls
            .iter()
            .map(|(_, a)| match a {
                Answer::Served { consumed } => *consumed,
                _ => 0.0,
            })
            .sum()
    }
}

/// The requests of one design at the rate, for the duration (or until the
/// stop); the tally, and the seconds the requests were sent over.
async fn run_design(
    ctx: &Ctx<'_>,
    o: &LoadtestOptions,
    progress: &Progress,
    stop: &CancellationToken,
) -> anyhow::Result<(Tally, f64)> {
    let mut generator = Generator::new(ctx.model.clone(), o.scenario, o.seed);
    let mut tally = Tally::default();
    let mut in_flight = FuturesUnordered::new();
    let started = tokio::time::Instant::now();
    let end = started + o.duration;
    let mut sent: u64 = 0;
    let (mut requests, mut units) = (0u64, 0.0);
    let mut count = |tally: &mut Tally, d: Done| {
        requests += 1;
        units += d.consumed();
        record(tally, d);
        progress.update(requests, units);
    };
    loop {
        // Open loop: request n is due at n / rate, however the others fare.
        let due = started + Duration::from_secs_f64(sent as f64 / o.rate);
        if due >= end || stop.is_cancelled() {
            break;
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some(done) = in_flight.next() => count(&mut tally, done?),
            () = tokio::time::sleep_until(due), if in_flight.len() < o.concurrency => {
                in_flight.push(request(ctx, generator.next().op));
                sent += 1;
            }
        }
    }
    let seconds = started
        .elapsed()
        .as_secs_f64()
        .min(o.duration.as_secs_f64());
    while let Some(done) = in_flight.next().await {
        count(&mut tally, done?);
    }
    Ok((tally, seconds))
}

fn record(tally: &mut Tally, done: Done) {
    for (key, answer) in &done.calls {
        tally.call(done.kind, key, answer);
    }
    tally.request(done.kind, done.ending, done.micros);
}

/// A throttle or a transient failure is an answer to count; anything else
/// (no such table, no permission, a request DynamoDB refuses) ends the run.
fn answer(e: AwsError) -> anyhow::Result<Answer> {
    match e {
        AwsError::Throttled { reasons, .. } => Ok(Answer::Throttled { reasons }),
        e if e.is_transient() => Ok(Answer::Failed),
        e => Err(e.into()),
    }
}

fn ending(a: &Answer) -> Ending {
    match a {
        Answer::Served { .. } => Ending::Served,
        Answer::Throttled { .. } => Ending::Throttled,
        Answer::Failed => Ending::Failed,
    }
}

async fn request(ctx: &Ctx<'_>, op: Op) -> anyhow::Result<Done> {
    match op {
        Op::Write(item) => write(ctx, item).await,
        Op::Read(read) => match ctx.design {
            Design::Old => read_old(ctx, &read).await,
            Design::New => read_new(ctx, &read).await,
        },
    }
}

/// The partition key value of `item` in `attr` (a string: the model draws
/// string keys, and the plan's templates render strings).
fn key_text(item: &crate::core::value::Item, attr: &str) -> String {
    item.get(attr).map(Value::display_text).unwrap_or_default()
}

async fn write(ctx: &Ctx<'_>, source: crate::core::value::Item) -> anyhow::Result<Done> {
    let (item, pk) = match ctx.design {
        Design::Old => (source, &ctx.plan.source_key.partition_key.name),
        Design::New => match transform(ctx.plan, &source) {
            Outcome::Put { item, .. } => (item, &ctx.plan.target_key.partition_key.name),
            Outcome::Reject(r) => anyhow::bail!("a drawn item was rejected by the plan: {r}"),
            Outcome::Skip => anyhow::bail!("a drawn item was skipped by the plan"),
        },
    };
    let key = key_text(&item, pk);
    let started = Instant::now();
    let a = match put_once(ctx.clients, ctx.table, &item).await {
        Ok(consumed) => Answer::Served { consumed },
        Err(e) => answer(e)?,
    };
    Ok(Done {
        kind: Kind::Write,
        ending: ending(&a),
        micros: started.elapsed().as_micros() as u64,
        calls: vec![(key, a)],
    })
}

/// The old design's read: one Query page of the source partition key.
async fn read_old(ctx: &Ctx<'_>, read: &Read) -> anyhow::Result<Done> {
    let key = &ctx.plan.source_key;
    let sort_key = key.sort_key.as_ref().map_or("", |s| s.name.as_str());
    let call = QueryCall {
        table: ctx.table,
        partition_key: &key.partition_key.name,
        sort_key,
        key: &read.source_key,
        condition: &KeyCondition::None,
        ascending: true,
        start: None,
        limit: i32::try_from(ctx.page).unwrap_or(i32::MAX),
        consistent_read: false,
    };
    let started = Instant::now();
    let a = match query_once(ctx.clients, &call).await {
        Ok(page) => Answer::Served {
            consumed: page.consumed,
        },
        Err(e) => answer(e)?,
    };
    Ok(Done {
        kind: Kind::Read,
        ending: ending(&a),
        micros: started.elapsed().as_micros() as u64,
        calls: vec![(read.source_key.clone(), a)],
    })
}

/// The new design's read, as `rekey query` reads a page: every partition
/// key of the logical key, queried in parallel and merged by sort key. A
/// throttled or failed call ends the read (the application would retry it).
async fn read_new(ctx: &Ctx<'_>, read: &Read) -> anyhow::Result<Done> {
    let keys = ctx
        .model
        .target_keys(ctx.plan, read)
        .map_err(|e| InputError(e.to_string()))?;
    let target = &ctx.plan.target_key;
    let sort_key = target.sort_key.as_ref().map_or("", |s| s.name.as_str());
    let mut page: PageRun<()> = PageRun::new(
        keys.len(),
        &SkCondition::Any,
        Order::Ascending,
        ctx.page,
        None,
    );
    let mut starts: Vec<Option<crate::core::value::Item>> = vec![None; keys.len()];
    let mut calls = Vec::new();
    let mut end = Ending::Served;
    let started = Instant::now();
    while end == Ending::Served {
        let wants = page.step();
        if wants.is_empty() {
            break;
        }
        let limit = i32::try_from(page.fetch_limit()).unwrap_or(i32::MAX);
        let conditions: Vec<KeyCondition> = wants
            .iter()
            .map(|&k| page.range(k).key_condition())
            .collect();
        let answers: Vec<_> = stream::iter(wants.iter().zip(&conditions))
            .map(|(&k, condition)| {
                let call = QueryCall {
                    table: ctx.table,
                    partition_key: &target.partition_key.name,
                    sort_key,
                    key: &keys[k],
                    condition,
                    ascending: true,
                    start: starts[k].as_ref(),
                    limit,
                    consistent_read: false,
                };
                async move { (k, query_once(ctx.clients, &call).await) }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (k, got) in answers {
            let a = match got {
                Ok(p) => {
                    let items = p
                        .items
                        .iter()
                        .map(|i| (key_text(i, sort_key), ()))
                        .collect();
                    page.feed(k, items, p.next.is_some());
                    starts[k] = p.next;
                    Answer::Served {
                        consumed: p.consumed,
                    }
                }
                Err(e) => answer(e)?,
            };
            if end == Ending::Served {
                end = ending(&a);
            }
            calls.push((keys[k].clone(), a));
        }
    }
    Ok(Done {
        kind: Kind::Read,
        ending: end,
        micros: started.elapsed().as_micros() as u64,
        calls,
    })
}
