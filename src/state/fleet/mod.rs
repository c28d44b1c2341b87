//! The state a fleet of workers shares (issue 15): one migration, keyed by
//! its id, in a DynamoDB control table (`--state dynamodb://TABLE[/ID]`).
//! It is `state`'s second store beside the local sled one: what survives a
//! worker's death must not live on one machine's disk. Every request goes
//! through [`crate::aws::control`]; this module only knows the items and
//! the conditions that make them a lease protocol (docs/fleet.md, "How
//! it works").
//!
//! Items, all under `pk = MIG#<id>` (one Query reads a migration):
//! - `META`: plan fingerprint, segment count (fixed at creation), the
//!   export the backfill reads when it reads one ([`export::ExportSource`]),
//!   `done_ms` once every unit is done ("backfill done"), and `finished_ms`
//!   once `rekey finish --state` has drained the fleet's tail a last time
//!   (the `worker --tail` processes stop then);
//! - `UNIT#<n>`: one Scan segment, or one data file of the export (its key
//!   in `file`) — owner, lease counter, beat, checkpoint (the encoded
//!   LastEvaluatedKey, or the file's lines read), committed page count,
//!   counters, done,
//!   and `grants`: the history of its leases, one entry per lease, added by
//!   the take itself and updated only by that lease's own conditional
//!   writes (owner, when granted, the page it started from, until when its
//!   holder could write, released) — so that a test can prove no two
//!   leases overlapped;
//! - `WORKER#<id>`: heartbeat, units held, rates (for `status`);
//! - `TAIL`: the fleet's tail — `applied_through_ms` (every source write
//!   before it is applied to the target; absent while it only buffers) and
//!   `updated_ms` — published by `rekey tail --fleet`, read by the fleet's
//!   verify re-check ([`Fleet::applied_through`]) instead of the tail's local
//!   `status.json`.
//!
//! Target-key claims are `pk = CLAIM#<id>#<md5 of the encoded target key>`
//! ([`claims`]).

pub(crate) mod claims;
pub(crate) mod export;
pub(crate) mod held;
pub(crate) mod lease;
pub mod shard;
pub(crate) mod verify;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::aws::AwsError;
use crate::aws::control::{Cond, ControlTable, PK, SK};
use crate::aws::item::Expressions;
use crate::core::plan::Plan;
use crate::core::value::{Item, Value};
pub use crate::state::Counters;

/// Where a fleet's state lives: `dynamodb://TABLE[/MIGRATION]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetRef {
    pub table: String,
    pub migration: String,
}

impl FleetRef {
    /// `dynamodb://TABLE[/MIGRATION]`; the migration defaults to `default_id`.
    pub fn parse(s: &str, default_id: &str) -> Result<FleetRef, String> {
        let rest = s.strip_prefix("dynamodb://").ok_or_else(|| {
            format!("--state {s}: give dynamodb://TABLE or dynamodb://TABLE/MIGRATION")
        })?;
        let (table, migration) = match rest.split_once('/') {
            Some((t, m)) => (t, m),
            None => (rest, default_id),
        };
        let ok = |x: &str| {
            !x.is_empty()
                && x.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        };
        if !ok(table) || table.len() < 3 || table.len() > 255 {
            return Err(format!(
                "--state {s}: `{table}` is not a DynamoDB table name (3–255 of a-z A-Z 0-9 _ - .)"
            ));
        }
        if !ok(migration) || migration.contains('#') {
            return Err(format!(
                "--state {s}: `{migration}` is not a migration id (a-z A-Z 0-9 _ - .)"
            ));
        }
        Ok(FleetRef {
            table: table.into(),
            migration: migration.into(),
        })
    }

    pub fn display(&self) -> String {
        format!("dynamodb://{}/{}", self.table, self.migration)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(
        "the plan differs from the one migration `{migration}` started with (fingerprint {stored}, now {current}); \
         a worker with another plan would mix two plans' items. Run the same plan, or use another migration id"
    )]
    PlanChanged {
        migration: String,
        stored: String,
        current: String,
    },
    #[error(
        "migration `{migration}` reads {stored}, but this worker was started to read {given}; \
         a worker with another source would mix two sources' items. Start it as the migration's \
         other workers were, or use another migration id"
    )]
    SourceChanged {
        migration: String,
        stored: String,
        given: String,
    },
    #[error("control table `{table}`: item {what} is malformed: {detail}")]
    Malformed {
        table: String,
        what: String,
        detail: String,
    },
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// A failure that passes: a throttle or a transient error of an AWS call
/// (the control table's or the data's). A worker carries on: a unit or shard
/// it hit is given up and taken again, a turn is tried again.
pub fn passing(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let aws = c
            .downcast_ref::<AwsError>()
            .or(match c.downcast_ref::<FleetError>() {
                Some(FleetError::Aws(a)) => Some(a),
                _ => None,
            });
        aws.is_some_and(|a| a.is_transient() || a.is_throttle())
    })
}

/// Where a unit resumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Checkpoint {
    Beginning,
    /// Resume after this key (the LastEvaluatedKey of the last committed page).
    After(Item),
    /// An export data file's unit: resume after this many lines (the
    /// position `rekey backfill --from-export` checkpoints, too).
    Lines(u64),
    /// A Scan unit stopped mid-page: read again from `from` (None: the
    /// segment's beginning), skipping the items named in `done` (MD5s of
    /// their source keys, hex), already written and counted.
    Partial {
        from: Option<Item>,
        done: Vec<String>,
    },
    Done,
}

/// A unit's counters move only with its checkpoint, as they are stored.
impl Counters {
    const NAMES: [&'static str; 5] = ["scanned", "written", "rejected", "skipped", "collisions"];
    fn values(&self) -> [u64; 5] {
        [
            self.scanned,
            self.written,
            self.rejected,
            self.skipped,
            self.collisions,
        ]
    }
}

/// One unit of work: a Scan segment, or an export's data file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unit {
    pub n: u32,
    /// The data file this unit reads (its `dataFileS3Key`); None: a Scan segment.
    pub file: Option<String>,
    pub owner: Option<String>,
    /// Bumped by every take: the fence.
    pub lease: u64,
    /// Bumped by every renewal: what a taker watches.
    pub beat: u64,
    pub checkpoint: Checkpoint,
    /// Pages committed.
    pub page: u64,
    pub counts: Counters,
    pub done: bool,
}

/// A lease this worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub unit: u32,
    pub lease: u64,
}

/// The migration's record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Meta {
    pub fingerprint: String,
    pub segments: u32,
    /// The export the backfill reads (its units are the export's data
    /// files); None: the source table, by Scan.
    pub export: Option<export::ExportSource>,
    /// Every unit done: the tail may apply (epoch ms of the worker that saw it).
    pub done_ms: Option<i64>,
    /// `rekey finish --state` drained the fleet's tail a last time: its
    /// holders stop (epoch ms, the finishing machine's clock).
    pub finished_ms: Option<i64>,
}

/// A worker as it last reported itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub heartbeat_ms: i64,
    pub units: Vec<u32>,
    pub write_rate: f64,
    pub read_rate: f64,
    /// running, stopped or done.
    pub state: String,
}

/// The fleet tail's progress, as its `TAIL` item holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TailMark {
    /// Every source write before this instant (epoch ms) is applied; None
    /// while the backfill runs and the tail only buffers.
    pub applied_through_ms: Option<i64>,
    /// When the tail last published (epoch ms, the tail's clock).
    pub updated_ms: i64,
    /// The tail has stopped (its mark no longer moves).
    pub stopped: bool,
}

/// One lease as granted (the unit's append-only history).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grant {
    pub unit: u32,
    pub lease: u64,
    pub owner: String,
    pub granted_ms: i64,
    pub from_page: u64,
    /// The latest time its holder could write (its fence), as it last said.
    pub until_ms: i64,
    pub released: bool,
}

/// Everything under one migration, read at once.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub meta: Option<Meta>,
    pub units: Vec<Unit>,
    pub workers: Vec<WorkerInfo>,
    pub grants: Vec<Grant>,
    /// The fleet's tail (`rekey worker --tail`): one unit per stream shard.
    pub shards: Vec<shard::ShardUnit>,
}

impl Snapshot {
    pub fn totals(&self) -> Counters {
        let mut t = Counters::default();
        for u in &self.units {
            t.add(&u.counts);
        }
        t
    }
    pub fn all_done(&self) -> bool {
        !self.units.is_empty() && self.units.iter().all(|u| u.done)
    }
}

/// What a take was judged on: the item, and the lease counter, owner and
/// page count read (the take's condition).
#[derive(Debug, Clone)]
pub(crate) struct Judged {
    pub sk: String,
    pub owner: Option<String>,
    pub lease: u64,
    pub page: u64,
}

/// The migration in a control table, as one worker sees it.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub control: ControlTable,
    pub at: FleetRef,
    pub worker: String,
    /// The sort-key prefix of the units this handle leases: `UNIT#` (the
    /// backfill's Scan segments) or `VUNIT#` (the verify's, [`Fleet::verify`]).
    pub units: &'static str,
}
fn s(v: &str) -> Value {
    Value::S(v.into())
}
fn n(v: impl ToString) -> Value {
    Value::N(v.to_string())
}

/// Expressions with `#name` placeholders for every attribute name used.
fn exprs(update: &str, condition: &str, names: &[&str], values: Vec<(&str, Value)>) -> Expressions {
    Expressions {
        update: update.into(),
        condition: condition.into(),
        names: names
            .iter()
            .map(|x| (format!("#{x}"), x.to_string()))
            .collect(),
        values: values.into_iter().map(|(k, v)| (k.into(), v)).collect(),
    }
}

fn num(it: &Item, name: &str) -> u64 {
    match it.get(name) {
        Some(Value::N(x)) => x.parse::<f64>().map(|f| f as u64).unwrap_or(0),
        _ => 0,
    }
}
fn inum(it: &Item, name: &str) -> i64 {
    match it.get(name) {
        Some(Value::N(x)) => x.parse::<i64>().unwrap_or(0),
        _ => 0,
    }
}
fn fnum(it: &Item, name: &str) -> f64 {
    match it.get(name) {
        Some(Value::N(x)) => x.parse::<f64>().unwrap_or(0.0),
        _ => 0.0,
    }
}
fn text<'a>(it: &'a Item, name: &str) -> Option<&'a str> {
    match it.get(name) {
        Some(Value::S(x)) => Some(x),
        _ => None,
    }
}

/// Milliseconds since the epoch on this machine's clock: recorded for
/// people and tests, never compared across machines by the protocol.
pub(crate) fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Fleet {
    pub fn new(control: ControlTable, at: FleetRef, worker: &str) -> Fleet {
        Fleet {
            control,
            at,
            worker: worker.to_string(),
            units: "UNIT#",
        }
    }

    /// The migration `at`, in its control table (at [`crate::aws::control::STATE_ENDPOINT`]
    /// when that is set), as process `who` sees it.
    pub fn open(clients: &crate::aws::Clients, at: &FleetRef, who: &str) -> Fleet {
        Fleet::new(ControlTable::new(clients, &at.table), at.clone(), who)
    }

    /// The same migration, leasing the verify's units (`VUNIT#<n>`): forward
    /// units `0..segments` (the source's Scan segments), then orphan units
    /// `segments..2 × segments` (the target's).
    pub fn verify(control: ControlTable, at: FleetRef, worker: &str) -> Fleet {
        Fleet {
            units: "VUNIT#",
            ..Fleet::new(control, at, worker)
        }
    }

    /// Where this handle's processes report themselves: the verify's
    /// processes apart from the workers (their rate shares, their `status`).
    fn workers_prefix(&self) -> &'static str {
        if self.units == "UNIT#" {
            "WORKER#"
        } else {
            "VWORKER#"
        }
    }

    pub(crate) fn unit_sk(&self, n: u32) -> String {
        format!("{}{n:05}", self.units)
    }

    fn pk(&self) -> String {
        format!("MIG#{}", self.at.migration)
    }

    fn malformed(&self, what: &str, detail: impl ToString) -> FleetError {
        FleetError::Malformed {
            table: self.control.table.clone(),
            what: what.into(),
            detail: detail.to_string(),
        }
    }

    /// Creates the control table and the migration if need be, refuses a
    /// different plan, and makes sure every unit item of this handle
    /// (`0..segments`) exists. Returns the segment count, fixed by whichever
    /// process created the migration. (The verify's join: it reads the
    /// source table whatever the backfill read.)
    pub async fn join(&self, plan: &Plan, segments: u32) -> Result<u32, FleetError> {
        let stored = self.open_migration(plan, segments, None).await?;
        self.create_units(stored.segments).await?;
        Ok(stored.segments)
    }

    /// The migration's record, created with `segments` and `export` unless
    /// it exists; refused when its plan is not `plan`.
    pub(crate) async fn open_migration(
        &self,
        plan: &Plan,
        segments: u32,
        export: Option<&export::ExportSource>,
    ) -> Result<Meta, FleetError> {
        self.control.ensure().await?;
        let mut meta = Item::new();
        meta.insert(PK.into(), s(&self.pk()));
        meta.insert(SK.into(), s("META"));
        meta.insert("fingerprint".into(), s(&plan.fingerprint));
        meta.insert("segments".into(), n(segments));
        meta.insert("source".into(), s(&plan.source_table));
        meta.insert("target".into(), s(&plan.target_table));
        if let Some(e) = export {
            e.write(&mut meta);
        }
        let first = exprs("", "attribute_not_exists(#pk)", &["pk"], vec![]);
        self.control.put_if(&meta, &first).await?;
        let stored = self
            .meta()
            .await?
            .ok_or_else(|| self.malformed("META", "missing after it was written"))?;
        if stored.fingerprint != plan.fingerprint {
            return Err(FleetError::PlanChanged {
                migration: self.at.migration.clone(),
                stored: stored.fingerprint,
                current: plan.fingerprint.clone(),
            });
        }
        Ok(stored)
    }

    /// Makes sure unit items `0..count` exist (under this handle's prefix).
    pub(crate) async fn create_units(&self, count: u32) -> Result<(), FleetError> {
        for u in 0..count {
            self.create_unit(u, None).await?;
        }
        Ok(())
    }

    /// Makes sure unit `u` exists, reading `file` if given (an export's).
    pub(crate) async fn create_unit(&self, u: u32, file: Option<&str>) -> Result<(), FleetError> {
        let first = exprs("", "attribute_not_exists(#pk)", &["pk"], vec![]);
        let mut it = Item::new();
        it.insert(PK.into(), s(&self.pk()));
        it.insert(SK.into(), s(&self.unit_sk(u)));
        it.insert("unit".into(), n(u));
        if let Some(f) = file {
            it.insert("file".into(), s(f));
        }
        it.insert("lease".into(), n(0));
        it.insert("beat".into(), n(0));
        it.insert("page".into(), n(0));
        it.insert("checkpoint".into(), s("\"beginning\""));
        it.insert("done".into(), Value::Bool(false));
        it.insert("grants".into(), Value::M(Item::new()));
        for name in Counters::NAMES {
            it.insert(name.into(), n(0));
        }
        self.control.put_if(&it, &first).await?;
        Ok(())
    }

    pub async fn meta(&self) -> Result<Option<Meta>, FleetError> {
        let Some(it) = self.control.get(&self.pk(), "META").await? else {
            return Ok(None);
        };
        Ok(Some(self.meta_of(&it)?))
    }

    fn meta_of(&self, it: &Item) -> Result<Meta, FleetError> {
        Ok(Meta {
            fingerprint: text(it, "fingerprint")
                .ok_or_else(|| self.malformed("META", "no fingerprint"))?
                .to_string(),
            segments: num(it, "segments") as u32,
            export: export::ExportSource::read(it),
            done_ms: it.contains_key("done_ms").then(|| inum(it, "done_ms")),
            finished_ms: it
                .contains_key("finished_ms")
                .then(|| inum(it, "finished_ms")),
        })
    }

    /// Everything under the migration: one consistent Query.
    pub async fn read(&self) -> Result<Snapshot, FleetError> {
        self.read_prefix("").await
    }

    /// The workers' records only (the heartbeat's rate shares): a Query of
    /// `WORKER#` items, not of every unit.
    pub(crate) async fn read_workers(&self) -> Result<Snapshot, FleetError> {
        self.read_prefix(self.workers_prefix()).await
    }

    async fn read_prefix(&self, prefix: &str) -> Result<Snapshot, FleetError> {
        let mut snap = Snapshot::default();
        for it in self.control.query_prefix(&self.pk(), prefix).await? {
            let sk = text(&it, SK).unwrap_or_default().to_string();
            if sk == "META" {
                snap.meta = Some(self.meta_of(&it)?);
            } else if sk.starts_with(self.units) {
                let u = self.unit_of(&it, &sk)?;
                snap.grants.extend(grants_of(&it, u.n));
                snap.units.push(u);
            } else if sk.starts_with("SHARD#") {
                snap.shards.push(shard::shard_of(&it));
            } else if let Some(id) = sk.strip_prefix(self.workers_prefix()) {
                snap.workers.push(WorkerInfo {
                    id: id.into(),
                    heartbeat_ms: inum(&it, "hb_ms"),
                    units: text(&it, "units")
                        .unwrap_or_default()
                        .split(',')
                        .filter_map(|x| x.parse().ok())
                        .collect(),
                    write_rate: fnum(&it, "write_rate"),
                    read_rate: fnum(&it, "read_rate"),
                    state: text(&it, "state").unwrap_or_default().into(),
                });
            }
        }
        Ok(snap)
    }

    fn unit_of(&self, it: &Item, sk: &str) -> Result<Unit, FleetError> {
        let checkpoint = serde_json::from_str(text(it, "checkpoint").unwrap_or("\"beginning\""))
            .map_err(|e| self.malformed(sk, e))?;
        let c = |x| num(it, x);
        Ok(Unit {
            n: c("unit") as u32,
            file: text(it, "file").map(str::to_string),
            owner: text(it, "owner").map(str::to_string),
            lease: c("lease"),
            beat: c("beat"),
            checkpoint,
            page: c("page"),
            counts: Counters {
                scanned: c("scanned"),
                written: c("written"),
                rejected: c("rejected"),
                skipped: c("skipped"),
                collisions: c("collisions"),
            },
            done: matches!(it.get("done"), Some(Value::Bool(true))),
        })
    }

    /// Takes `unit` if its lease counter (and, for an expired lease, its
    /// owner and beat) and its page count still hold what was judged,
    /// recording the grant (which starts at that page) in the same write. None: another worker got there first. `fence`: how
    /// long after the take was sent its holder may write without a renewal.
    pub async fn take(
        &self,
        unit: &Unit,
        expired: Option<u64>,
        fence: std::time::Duration,
    ) -> Result<Option<Lease>, FleetError> {
        let at = Judged {
            sk: self.unit_sk(unit.n),
            owner: unit.owner.clone(),
            lease: unit.lease,
            page: unit.page,
        };
        Ok(self.take_at(&at, expired, fence).await?.then_some(Lease {
            unit: unit.n,
            lease: unit.lease + 1,
        }))
    }

    /// The take of any leased item (a unit, a shard): see [`Fleet::take`].
    /// True when this worker now holds lease `at.lease + 1`.
    pub(crate) async fn take_at(
        &self,
        at: &Judged,
        expired: Option<u64>,
        fence: std::time::Duration,
    ) -> Result<bool, FleetError> {
        let sent = wall_ms();
        let next = at.lease + 1;
        let mut g = Item::new();
        g.insert("owner".into(), s(&self.worker));
        g.insert("granted_ms".into(), n(sent));
        g.insert("from_page".into(), n(at.page));
        g.insert("until_ms".into(), n(sent + fence.as_millis() as i64));
        let mut values = vec![
            (":me", s(&self.worker)),
            (":lease", n(at.lease)),
            (":next", n(next)),
            (":zero", n(0)),
            (":f", Value::Bool(false)),
            (":g", Value::M(g)),
            (":page", n(at.page)),
        ];
        let condition = match (expired, &at.owner) {
            (Some(beat), Some(old)) => {
                values.push((":old", s(old)));
                values.push((":beat", n(beat)));
                "#owner = :old AND #lease = :lease AND #beat = :beat AND #done = :f AND #page = :page"
            }
            _ => {
                "attribute_not_exists(#owner) AND #lease = :lease AND #done = :f AND #page = :page"
            }
        };
        let mut e = exprs(
            "SET #owner = :me, #lease = :next, #beat = :zero, #grants.#l = :g",
            condition,
            &["owner", "lease", "beat", "done", "grants", "page"],
            values,
        );
        e.names.insert("#l".into(), next.to_string());
        Ok(self.control.update_if(&self.pk(), &at.sk, &e).await? == Cond::Written)
    }

    /// Renews the lease on the item with sort key `sk`, recording on its
    /// grant, in the same write, that its holder may write until `until_ms`.
    /// Refused when the lease is no longer this worker's.
    pub(crate) async fn renew_at(
        &self,
        sk: &str,
        lease: u64,
        beat: u64,
        until_ms: i64,
    ) -> Result<Cond, FleetError> {
        let mut e = exprs(
            "SET #beat = :beat, #grants.#l.#until_ms = :u",
            "#owner = :me AND #lease = :lease",
            &["owner", "lease", "beat", "grants", "until_ms"],
            vec![
                (":me", s(&self.worker)),
                (":lease", n(lease)),
                (":beat", n(beat)),
                (":u", n(until_ms)),
            ],
        );
        e.names.insert("#l".into(), lease.to_string());
        Ok(self.control.update_if(&self.pk(), sk, &e).await?)
    }

    /// Commits a page of `l`'s unit: checkpoint, page count and counters in
    /// one write, conditioned on the lease (the fence). Refused: the lease
    /// was lost and nothing moved.
    pub async fn commit(
        &self,
        l: Lease,
        checkpoint: &Checkpoint,
        page: &Counters,
        next_page: u64,
    ) -> Result<Cond, FleetError> {
        let adds: Vec<(&str, u64)> = Counters::NAMES.into_iter().zip(page.values()).collect();
        self.commit_counts(l, checkpoint, next_page, &adds, &[])
            .await
    }

    /// [`Fleet::commit`] with any counters (`adds`: name, increment; an
    /// absent counter counts from 0) and `appended` added to the unit's
    /// `diffs` list (the verify's sample of confirmed differences).
    pub(crate) async fn commit_counts(
        &self,
        l: Lease,
        checkpoint: &Checkpoint,
        next_page: u64,
        adds: &[(&str, u64)],
        appended: &[String],
    ) -> Result<Cond, FleetError> {
        let cp = serde_json::to_string(checkpoint).map_err(|e| self.malformed("checkpoint", e))?;
        let mut update = String::from("SET #checkpoint = :cp, #page = :page, #done = :done");
        let mut values = vec![
            (":me".to_string(), s(&self.worker)),
            (":lease".into(), n(l.lease)),
            (":cp".into(), s(&cp)),
            (":page".into(), n(next_page)),
            (
                ":done".into(),
                Value::Bool(matches!(checkpoint, Checkpoint::Done)),
            ),
            (":zero".into(), n(0)),
        ];
        let mut names = vec!["owner", "lease", "checkpoint", "page", "done"];
        for (i, (name, v)) in adds.iter().enumerate() {
            update.push_str(&format!(
                ", #{name} = if_not_exists(#{name}, :zero) + :c{i}"
            ));
            values.push((format!(":c{i}"), n(v)));
            names.push(name);
        }
        if !appended.is_empty() {
            update.push_str(", #diffs = list_append(if_not_exists(#diffs, :empty), :d)");
            values.push((":empty".into(), Value::L(Vec::new())));
            values.push((
                ":d".into(),
                Value::L(appended.iter().map(|x| s(x)).collect()),
            ));
            names.push("diffs");
        }
        let values = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let e = exprs(&update, "#owner = :me AND #lease = :lease", &names, values);
        Ok(self
            .control
            .update_if(&self.pk(), &self.unit_sk(l.unit), &e)
            .await?)
    }

    /// Gives `l` back at once (a stop): the next worker need not wait. Its
    /// holder has stopped writing: the grant ends now, in the same write.
    pub async fn release(&self, l: Lease) -> Result<Cond, FleetError> {
        self.release_at(&self.unit_sk(l.unit), l.lease).await
    }

    /// The release of any leased item by its sort key: see [`Fleet::release`].
    pub(crate) async fn release_at(&self, sk: &str, lease: u64) -> Result<Cond, FleetError> {
        let mut e = exprs(
            "REMOVE #owner SET #grants.#l.#until_ms = :now, #grants.#l.#released_ms = :now",
            "#owner = :me AND #lease = :lease",
            &["owner", "lease", "grants", "until_ms", "released_ms"],
            vec![
                (":me", s(&self.worker)),
                (":lease", n(lease)),
                (":now", n(wall_ms())),
            ],
        );
        e.names.insert("#l".into(), lease.to_string());
        Ok(self.control.update_if(&self.pk(), sk, &e).await?)
    }

    /// This worker's record for `status` and the rate shares.
    pub(crate) async fn report_worker(
        &self,
        units: &[u32],
        write_rate: f64,
        read_rate: f64,
        state: &str,
    ) -> Result<(), FleetError> {
        let mut it = Item::new();
        it.insert(PK.into(), s(&self.pk()));
        it.insert(
            SK.into(),
            s(&format!("{}{}", self.workers_prefix(), self.worker)),
        );
        it.insert("hb_ms".into(), n(wall_ms()));
        let list: Vec<String> = units.iter().map(u32::to_string).collect();
        it.insert("units".into(), s(&list.join(",")));
        it.insert("write_rate".into(), n(write_rate));
        it.insert("read_rate".into(), n(read_rate));
        it.insert("state".into(), s(state));
        // Anyone may overwrite a worker's record only with its own id.
        let always = exprs(
            "",
            "attribute_not_exists(#pk) OR #sk = :sk",
            &["pk", "sk"],
            vec![(
                ":sk",
                s(&format!("{}{}", self.workers_prefix(), self.worker)),
            )],
        );
        self.control.put_if(&it, &always).await?;
        Ok(())
    }

    /// Records that every unit is done: from here the tail may apply.
    pub(crate) async fn mark_done(&self) -> Result<(), FleetError> {
        let e = exprs(
            "SET #done_ms = :now",
            "attribute_not_exists(#done_ms)",
            &["done_ms"],
            vec![(":now", n(wall_ms()))],
        );
        self.control.update_if(&self.pk(), "META", &e).await?;
        Ok(())
    }

    /// Records that the migration is finished (`rekey finish --state`, after
    /// its last barrier through the fleet's tail): the holders of the
    /// stream's shards stop. The first record stays.
    pub(crate) async fn mark_finished(&self) -> Result<(), FleetError> {
        let e = exprs(
            "SET #finished_ms = :now",
            "attribute_exists(#pk) AND attribute_not_exists(#finished_ms)",
            &["finished_ms", "pk"],
            vec![(":now", n(wall_ms()))],
        );
        self.control.update_if(&self.pk(), "META", &e).await?;
        Ok(())
    }

    /// Publishes the fleet tail's progress (`TAIL`), overwriting the last.
    pub(crate) async fn publish_tail(&self, mark: &TailMark) -> Result<(), FleetError> {
        let mut it = Item::new();
        it.insert(PK.into(), s(&self.pk()));
        it.insert(SK.into(), s("TAIL"));
        if let Some(t) = mark.applied_through_ms {
            it.insert("applied_through_ms".into(), n(t));
        }
        it.insert("updated_ms".into(), n(mark.updated_ms));
        it.insert("stopped".into(), Value::Bool(mark.stopped));
        let always = exprs(
            "",
            "attribute_not_exists(#pk) OR #sk = :sk",
            &["pk", "sk"],
            vec![(":sk", s("TAIL"))],
        );
        self.control.put_if(&it, &always).await?;
        Ok(())
    }

    /// The fleet's `applied_through`: what the fleet tail last published
    /// (None: no tail has published yet).
    pub async fn applied_through(&self) -> Result<Option<TailMark>, FleetError> {
        let Some(it) = self.control.get(&self.pk(), "TAIL").await? else {
            return Ok(None);
        };
        Ok(Some(TailMark {
            applied_through_ms: it
                .contains_key("applied_through_ms")
                .then(|| inum(&it, "applied_through_ms")),
            updated_ms: inum(&it, "updated_ms"),
            stopped: matches!(it.get("stopped"), Some(Value::Bool(true))),
        }))
    }
}

/// Workers whose heartbeat is recent (three lease durations, on this
/// machine's clock: only the rate shares depend on it).
pub(crate) fn live_workers(snap: &Snapshot, me: &str, duration: std::time::Duration) -> usize {
    let fresh = (duration.as_millis() as i64) * 3;
    let now = wall_ms();
    let others = snap
        .workers
        .iter()
        .filter(|w| w.id != me && w.state == "running" && now - w.heartbeat_ms < fresh)
        .count();
    others + 1
}

/// The grant history kept in a unit item.
fn grants_of(it: &Item, unit: u32) -> Vec<Grant> {
    let Some(Value::M(m)) = it.get("grants") else {
        return Vec::new();
    };
    m.iter()
        .filter_map(|(lease, g)| {
            let Value::M(g) = g else { return None };
            Some(Grant {
                unit,
                lease: lease.parse().ok()?,
                owner: text(g, "owner").unwrap_or_default().into(),
                granted_ms: inum(g, "granted_ms"),
                from_page: num(g, "from_page"),
                until_ms: inum(g, "until_ms"),
                released: g.contains_key("released_ms"),
            })
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// For reading a fleet's rejects files: the lease that committed each page
/// of a unit is the latest lease granted at or before that page (leases of a
/// unit start at non-decreasing pages, and a lease that started after page
/// p found it committed). A reject line tagged (unit, lease, page) counts
/// only if that lease committed that page: lines of a page whose holder died
/// before its commit are repeated by the next holder, and not counted twice.
pub fn committed_lease(grants: &[Grant], unit: u32, page: u64) -> Option<u64> {
    let mut of_unit: BTreeMap<u64, u64> = BTreeMap::new();
    for g in grants.iter().filter(|g| g.unit == unit) {
        of_unit.insert(g.lease, g.from_page);
    }
    of_unit
        .iter()
        .filter(|(_, from)| **from <= page)
        .map(|(lease, _)| *lease)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(unit: u32, lease: u64, from_page: u64) -> Grant {
        Grant {
            unit,
            lease,
            owner: "w".into(),
            granted_ms: 0,
            from_page,
            until_ms: 0,
            released: false,
        }
    }

    #[test]
    fn state_urls_parse_with_a_default_migration() {
        let r = FleetRef::parse("dynamodb://ctl", "orders").unwrap();
        assert_eq!((r.table.as_str(), r.migration.as_str()), ("ctl", "orders"));
        let r = FleetRef::parse("dynamodb://ctl/m-1", "orders").unwrap();
        assert_eq!(r.migration, "m-1");
        assert!(FleetRef::parse("s3://x", "m").is_err());
        assert!(FleetRef::parse("dynamodb://a", "m").is_err());
        assert!(FleetRef::parse("dynamodb://ctl/a#b", "m").is_err());
    }

    #[test]
    fn a_page_belongs_to_the_last_lease_that_started_at_or_before_it() {
        // Lease 1 committed pages 0..3 and died in page 3; lease 2 started at
        // page 3 and died before committing; lease 3 started at 3 too.
        let g = [
            grant(0, 1, 0),
            grant(0, 2, 3),
            grant(0, 3, 3),
            grant(1, 1, 0),
        ];
        assert_eq!(committed_lease(&g, 0, 2), Some(1));
        assert_eq!(committed_lease(&g, 0, 3), Some(3));
        assert_eq!(committed_lease(&g, 0, 9), Some(3));
        assert_eq!(committed_lease(&g, 1, 5), Some(1));
        assert_eq!(committed_lease(&g, 2, 0), None);
    }

    #[test]
    fn checkpoints_round_trip_through_json() {
        let mut k = Item::new();
        k.insert("PK".into(), Value::S("a".into()));
        for c in [
            Checkpoint::Beginning,
            Checkpoint::After(k.clone()),
            Checkpoint::Lines(500),
            Checkpoint::Partial {
                from: Some(k),
                done: vec!["0123".into()],
            },
            Checkpoint::Done,
        ] {
            let j = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<Checkpoint>(&j).unwrap(), c);
        }
        assert_eq!(
            serde_json::to_string(&Checkpoint::Beginning).unwrap(),
            "\"beginning\""
        );
    }
}
