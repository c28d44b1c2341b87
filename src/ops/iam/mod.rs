//! `rekey iam-policy`: the least-privilege IAM policy a plan's commands need.
//!
//! Unit tests hold the policy to `ACTIONS_USED` (compiled for tests only), the
//! AWS API actions the code calls, each with the SDK method that calls it and
//! the module it is called in (a unit test checks that the method really
//! appears there). Nothing else is ever granted.
//!
//! What each command calls, by table:
//!
//! | command  | source table                 | stream                                        | target table                          |
//! | -------- | ---------------------------- | --------------------------------------------- | ------------------------------------- |
//! | analyze  | DescribeTable, Scan          |                                               |                                       |
//! | backfill | DescribeTable, Scan¹         |                                               | DescribeTable, BatchWriteItem, PutItem² |
//! | tail     | DescribeTable³               | DescribeStream, GetShardIterator, GetRecords  | BatchWriteItem, PutItem², DeleteItem² |
//! | verify   | DescribeTable, Scan, BatchGetItem | DescribeStream, GetShardIterator, GetRecords⁵ | DescribeTable, BatchGetItem, Scan |
//! | drain    | PutItem/DeleteItem of `__rekey__#barrier#*` markers only⁴ |                  |                                       |
//! | cutover  | DescribeTable, PutItem/DeleteItem of `__rekey__#barrier#*` markers only⁴ |   | DescribeTable                         |
//! | reverse  | BatchWriteItem, PutItem², DeleteItem², GetItem⁶ | the target's: DescribeStream, GetShardIterator, GetRecords | DescribeTable, GetItem⁶ |
//! | rollback | DescribeTable                |                                               | DescribeTable, PutItem/DeleteItem of `__rekey__#barrier#*` markers only⁴ |
//!
//! ⁶ the guarded writes of a rollback window (`phase::tail::guard`): each
//!   record's item is read again in the table it came from and the write
//!   compared with what the other table holds; the forward tail does the
//!   same once a reverse tail has run, so `reverse` grants GetItem on both
//!   tables. `rekey finish` after a rollback window also drains the reverse
//!   tail (the `rollback` marker).
//!
//! In place (source = target), backfill, `undo` and tail write with
//! UpdateItem instead, and read an item back with GetItem after a failed
//! condition; they need neither BatchWriteItem nor PutItem nor DeleteItem.
//!
//! ¹ not with `--export`: the backfill (or the worker, started with
//!   `--from-export`) then reads `s3:GetObject` under the
//!   prefix, and `s3:ListBucket` limited to the prefix (to find the newest
//!   export). ² PutItem (and DeleteItem, for the tail's deletes) isolates
//!   the request at fault when a batch fails validation. ³ the stream ARN
//!   comes from DescribeTable's `LatestStreamArn`, so
//!   `dynamodb:ListStreams` is never called.
//!   ⁴ the drain barrier: a marker item whose partition key starts with
//!   `__rekey__#barrier#`, enforced by a `dynamodb:LeadingKeys` condition
//!   (`ForAllValues:StringLike`, which takes wildcards). ⁵ the re-checks
//!   watch the stream for writes made while they run (watch.rs).
//!
//! With `--via-import` (a backfill into a table that does not exist yet), the
//! backfill calls no write on the target: it checks that the table is not
//! there (DescribeTable), writes objects under `<prefix>/data/`
//! (`s3:PutObject`; `s3:DeleteObject` of a part a killed run may have left
//! with nothing to go in it; `s3:ListBucket` to check the folder is empty
//! first), then calls `dynamodb:ImportTable` on the target and
//! `dynamodb:DescribeImport` on `table/<target>/import/*`. DynamoDB reads
//! the objects and logs to CloudWatch with the caller's permissions
//! ([`IMPORT_ON_BEHALF`]: `s3:GetObject`, `s3:ListBucket` and `logs:*` on
//! `/aws-dynamodb/*`), so those are granted too, though rekey never calls
//! them for an import.
//!
//! No index ARN is granted: rekey never reads an index, and DynamoDB
//! maintains a table's indexes on writes without index permissions.
//! `dynamodb:UpdateTable` (with which the demo enables its source table's
//! stream) is called only by the demo and the tests, against the local
//! server, so it is never granted. `dynamodb:CreateTable` is granted only
//! with `--command worker`, on the fleet's control table alone (`--state
//! dynamodb://TABLE`), which the first worker creates on demand; the workers
//! also read it (GetItem, Query, DescribeTable) and write it only with
//! conditional writes (PutItem, UpdateItem). `tail --fleet` reads it with
//! GetItem and publishes its progress with PutItem; `verify --state` leases
//! and commits its units there (the workers' calls but CreateTable);
//! `cutover --state` reads it (GetItem, Query); a barrier through the
//! fleet's own tail (`drain`, `cutover`, `finish --state`) also queries the
//! shards' units and describes the source's stream, and `finish --state`
//! records the end (UpdateItem).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Value as Json, json};

use crate::aws::export::ExportLocation;
use crate::core::plan::Plan;

/// A command whose permissions the policy covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyCommand {
    Analyze,
    Backfill,
    Tail,
    Verify,
    /// `rekey drain`: the barrier's marker item, written and deleted.
    Drain,
    Cutover,
    /// `rekey query`: reads the target's partition keys.
    Query,
    /// `rekey reverse`: the target's stream back to the source (issue 13).
    Reverse,
    /// `rekey rollback`: the reverse tail's barrier marker in the target.
    Rollback,
    /// `rekey worker`: a backfill by Scan (or from an export, with
    /// `--export`), and the fleet's control table.
    Worker,
    /// `rekey loadtest`: its scratch tables, created, written, read and
    /// deleted (`<source>-loadtest-old-*`, `<target>-loadtest-new-*`).
    Loadtest,
}

impl PolicyCommand {
    /// What `--command all` means: the migration, from backfill to cutover.
    /// (`analyze` needs nothing a scanning backfill does not.)
    pub const MIGRATION: [PolicyCommand; 5] = [
        PolicyCommand::Backfill,
        PolicyCommand::Tail,
        PolicyCommand::Verify,
        PolicyCommand::Drain,
        PolicyCommand::Cutover,
    ];
}

#[derive(Debug, Clone, Default)]
pub struct PolicyOptions {
    /// The commands to cover; empty means [`PolicyCommand::MIGRATION`].
    pub commands: Vec<PolicyCommand>,
    /// The backfill reads this export instead of scanning the source.
    pub export: Option<ExportLocation>,
    /// The backfill creates the target with ImportTable from objects here.
    pub import: Option<ExportLocation>,
    /// `*` when not given.
    pub region: Option<String>,
    /// `*` when not given.
    pub account: Option<String>,
    /// The fleet's control table (`--state dynamodb://TABLE`): `worker`
    /// creates and writes it, `tail --fleet` reads its "backfill done".
    pub control_table: Option<String>,
}

/// One AWS action the code calls: the IAM action, the SDK method that makes
/// the call, and the source files it is called from.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub struct ActionUse {
    pub action: &'static str,
    pub sdk_method: &'static str,
    pub called_in: &'static [&'static str],
}

#[cfg(test)]
const fn used(
    action: &'static str,
    sdk_method: &'static str,
    called_in: &'static [&'static str],
) -> ActionUse {
    ActionUse {
        action,
        sdk_method,
        called_in,
    }
}

/// Every AWS action rekey's commands call (the demo's and tests' CreateTable
/// and UpdateTable against the local server aside).
#[cfg(test)]
pub const ACTIONS_USED: &[ActionUse] = &[
    used(
        "dynamodb:DescribeTable",
        ".describe_table()",
        &["src/aws/mod.rs"],
    ),
    used("dynamodb:Scan", ".scan()", &["src/aws/scan.rs"]),
    used(
        "dynamodb:Query",
        ".query()",
        &["src/aws/query.rs", "src/aws/control.rs"],
    ),
    used(
        "dynamodb:UpdateItem",
        ".update_item()",
        &["src/aws/item.rs"],
    ),
    used("dynamodb:GetItem", ".get_item()", &["src/aws/item.rs"]),
    used(
        "dynamodb:BatchWriteItem",
        ".batch_write_item()",
        &["src/aws/write.rs"],
    ),
    used(
        "dynamodb:PutItem",
        ".put_item()",
        &["src/aws/write.rs", "src/aws/item.rs", "src/aws/control.rs"],
    ),
    used(
        "dynamodb:DeleteItem",
        ".delete_item()",
        &["src/aws/write.rs", "src/aws/item.rs"],
    ),
    used(
        "dynamodb:DescribeStream",
        ".describe_stream()",
        &["src/aws/streams.rs"],
    ),
    used(
        "dynamodb:GetShardIterator",
        ".get_shard_iterator()",
        &["src/aws/streams.rs"],
    ),
    used(
        "dynamodb:GetRecords",
        ".get_records()",
        &["src/aws/streams.rs"],
    ),
    used(
        "dynamodb:BatchGetItem",
        ".batch_get_item()",
        &["src/aws/item.rs"],
    ),
    used("s3:GetObject", ".get_object()", &["src/aws/export.rs"]),
    used(
        "s3:ListBucket",
        ".list_objects_v2()",
        &["src/aws/export.rs", "src/aws/import.rs"],
    ),
    used("s3:PutObject", ".put_object()", &["src/aws/import.rs"]),
    used(
        "s3:DeleteObject",
        ".delete_object()",
        &["src/aws/import.rs"],
    ),
    used(
        "dynamodb:ImportTable",
        ".import_table()",
        &["src/aws/import.rs"],
    ),
    used(
        "dynamodb:CreateTable",
        ".create_table()",
        &["src/aws/mod.rs"],
    ),
    // `rekey loadtest`'s scratch tables (with CreateTable above).
    used(
        "dynamodb:DeleteTable",
        ".delete_table()",
        &["src/aws/mod.rs"],
    ),
    used(
        "dynamodb:DescribeImport",
        ".describe_import()",
        &["src/aws/import.rs"],
    ),
];

/// What DynamoDB's ImportTable does with the caller's permissions (AWS's
/// guide to requesting an import): it reads the objects and writes its
/// CloudWatch log. Granted with `--via-import` only; rekey calls none of
/// these for an import.
pub const IMPORT_ON_BEHALF: &[&str] = &[
    "s3:GetObject",
    "s3:ListBucket",
    "logs:CreateLogGroup",
    "logs:CreateLogStream",
    "logs:DescribeLogGroups",
    "logs:DescribeLogStreams",
    "logs:PutLogEvents",
    "logs:PutRetentionPolicy",
];

/// The partition-key prefix of the drain barrier's marker items.
use crate::core::marker::MARKER_PREFIX;
use crate::phase::loadtest::{Design, scratch_table};

/// Statement ids, one per purpose.
pub(crate) mod sid {
    pub const SOURCE: &str = "SourceTable";
    pub const TARGET: &str = "TargetTable";
    /// In place: the source is the target.
    pub const TABLE: &str = "SourceAndTargetTable";
    pub const STREAM: &str = "SourceStream";
    pub const TARGET_STREAM: &str = "TargetStream";
    pub const MARKER: &str = "DrainBarrierMarker";
    pub const TARGET_MARKER: &str = "RollbackBarrierMarker";
    pub const CONTROL: &str = "FleetControlTable";
    pub const EXPORT_OBJECTS: &str = "ReadExport";
    pub const EXPORT_LIST: &str = "ListExport";
    pub const IMPORT_JOB: &str = "ImportJob";
    pub const IMPORT_OBJECTS: &str = "ImportObjects";
    pub const IMPORT_LIST: &str = "ListImportObjects";
    pub const IMPORT_LOGS: &str = "ImportLogs";
    pub const LOADTEST_OLD: &str = "LoadtestOldDesignTables";
    pub const LOADTEST_NEW: &str = "LoadtestNewDesignTables";
}

fn table_arn(o: &PolicyOptions, table: &str) -> String {
    format!(
        "arn:aws:dynamodb:{}:{}:table/{table}",
        o.region.as_deref().unwrap_or("*"),
        o.account.as_deref().unwrap_or("*")
    )
}

#[derive(Default)]
struct Needs {
    source: BTreeSet<&'static str>,
    target: BTreeSet<&'static str>,
    stream: BTreeSet<&'static str>,
    marker: BTreeSet<&'static str>,
    target_stream: BTreeSet<&'static str>,
    target_marker: BTreeSet<&'static str>,
    control: BTreeSet<&'static str>,
    /// `rekey loadtest`'s scratch tables, old design's and new design's alike.
    scratch: BTreeSet<&'static str>,
    export: bool,
    import: bool,
}

/// What of the plan and the options changes the actions needed.
struct Scope {
    /// The backfill reads an S3 export instead of scanning.
    export: bool,
    /// The backfill creates the target with ImportTable (never in place).
    import: bool,
    /// The plan sets attributes on its own table, with conditional UpdateItem
    /// (and a consistent GetItem after a failed condition) instead of puts
    /// and deletes; `rekey undo` needs what the backfill needs.
    in_place: bool,
    /// A fleet's control table is given (`--state`).
    fleet: bool,
}

fn needs(commands: &[PolicyCommand], scope: &Scope) -> Needs {
    let mut n = Needs::default();
    for &c in commands {
        n.command(c, scope);
    }
    n.together(commands, scope.fleet);
    n
}

/// Stream reads: the shards listed, an iterator per shard, its records.
const STREAM_READS: [&str; 3] = [
    "dynamodb:DescribeStream",
    "dynamodb:GetShardIterator",
    "dynamodb:GetRecords",
];

/// A barrier's or a probe's marker item, written and deleted.
const MARKER_WRITES: [&str; 2] = ["dynamodb:PutItem", "dynamodb:DeleteItem"];

impl Needs {
    /// What `c` calls, whatever runs beside it.
    fn command(&mut self, c: PolicyCommand, scope: &Scope) {
        match c {
            PolicyCommand::Analyze => self
                .source
                .extend(["dynamodb:DescribeTable", "dynamodb:Scan"]),
            PolicyCommand::Backfill => self.backfill(scope),
            PolicyCommand::Tail => self.tail(scope.in_place),
            PolicyCommand::Verify => self.verify(),
            PolicyCommand::Drain => self.marker.extend(MARKER_WRITES),
            PolicyCommand::Cutover => {
                self.source.insert("dynamodb:DescribeTable");
                self.target.insert("dynamodb:DescribeTable");
                self.marker.extend(MARKER_WRITES);
            }
            PolicyCommand::Query => {
                self.target.insert("dynamodb:Query");
            }
            PolicyCommand::Reverse => self.reverse(),
            PolicyCommand::Rollback => {
                self.source.insert("dynamodb:DescribeTable");
                self.target.insert("dynamodb:DescribeTable");
                self.target_marker.extend(MARKER_WRITES);
            }
            PolicyCommand::Worker => self.worker(scope.export),
            PolicyCommand::Loadtest => self.scratch.extend([
                "dynamodb:CreateTable",
                "dynamodb:DescribeTable",
                "dynamodb:PutItem",
                "dynamodb:Query",
                "dynamodb:DeleteTable",
            ]),
        }
    }

    fn backfill(&mut self, scope: &Scope) {
        self.source.insert("dynamodb:DescribeTable");
        if scope.export {
            self.export = true;
        } else {
            self.source.insert("dynamodb:Scan");
        }
        if scope.in_place {
            self.target.extend([
                "dynamodb:DescribeTable",
                "dynamodb:UpdateItem",
                "dynamodb:GetItem",
            ]);
        } else if scope.import {
            self.target
                .extend(["dynamodb:DescribeTable", "dynamodb:ImportTable"]);
            self.import = true;
        } else {
            self.target.extend([
                "dynamodb:DescribeTable",
                "dynamodb:BatchWriteItem",
                "dynamodb:PutItem",
            ]);
        }
    }

    fn tail(&mut self, in_place: bool) {
        self.source.insert("dynamodb:DescribeTable");
        // Probes: markers that make quiet stream shards show a record.
        self.marker.extend(MARKER_WRITES);
        self.stream.extend(STREAM_READS);
        if in_place {
            self.target
                .extend(["dynamodb:UpdateItem", "dynamodb:GetItem"]);
        } else {
            self.target.extend([
                "dynamodb:BatchWriteItem",
                "dynamodb:PutItem",
                "dynamodb:DeleteItem",
            ]);
        }
    }

    fn verify(&mut self) {
        // The stream watch's probes while it waits.
        self.marker.extend(MARKER_WRITES);
        self.source.extend([
            "dynamodb:DescribeTable",
            "dynamodb:Scan",
            "dynamodb:BatchGetItem",
        ]);
        self.stream.extend(STREAM_READS);
        self.target.extend([
            "dynamodb:DescribeTable",
            "dynamodb:BatchGetItem",
            "dynamodb:Scan",
        ]);
    }

    fn reverse(&mut self) {
        self.target
            .extend(["dynamodb:DescribeTable", "dynamodb:GetItem"]);
        self.target_stream.extend(STREAM_READS);
        self.source.extend([
            "dynamodb:BatchWriteItem",
            "dynamodb:PutItem",
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
        ]);
    }

    fn worker(&mut self, export: bool) {
        self.source.insert("dynamodb:DescribeTable");
        if export {
            // `--from-export`: the units are the export's data files.
            self.export = true;
        } else {
            self.source.insert("dynamodb:Scan");
        }
        self.target.extend([
            "dynamodb:DescribeTable",
            "dynamodb:BatchWriteItem",
            "dynamodb:PutItem",
        ]);
        // The control table: created on demand, then leases,
        // checkpoints, claims and the workers' records.
        self.control.extend([
            "dynamodb:CreateTable",
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:Query",
            // `--tail`: applied buffer chunks are deleted.
            "dynamodb:DeleteItem",
        ]);
        // `--tail`: the source's stream, and the tail's deletes.
        self.stream.extend(STREAM_READS);
        self.target.insert("dynamodb:DeleteItem");
    }

    /// What the commands call on a fleet's control table, and what a
    /// barrier through the fleet's tail needs (`fleet`: `--state` given).
    fn together(&mut self, commands: &[PolicyCommand], fleet: bool) {
        let has = |c| commands.contains(&c);
        if has(PolicyCommand::Tail) {
            // `tail --fleet` reads the fleet's "backfill done" record and
            // publishes its progress (`TAIL`).
            self.control
                .extend(["dynamodb:GetItem", "dynamodb:PutItem"]);
        }
        if has(PolicyCommand::Verify) {
            // `verify --state`: its units leased, committed and its verdict
            // written, in a control table the workers created.
            self.control.extend([
                "dynamodb:DescribeTable",
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:Query",
            ]);
        }
        if has(PolicyCommand::Cutover) {
            // `cutover --state`: the fleet's backfill and its verify's verdict.
            self.control.extend(["dynamodb:GetItem", "dynamodb:Query"]);
        }
        if fleet && (has(PolicyCommand::Drain) || has(PolicyCommand::Cutover)) {
            // A barrier through the fleet's own tail (`drain`, `cutover` and
            // `finish --state`): the shards' units read, the source's stream
            // listed once the marker is observed; `finish` records the end.
            self.source.insert("dynamodb:DescribeTable");
            self.stream.insert("dynamodb:DescribeStream");
            self.control.insert("dynamodb:Query");
            if has(PolicyCommand::Cutover) {
                self.control.insert("dynamodb:UpdateItem");
            }
        }
    }
}

/// A policy document, its fields in the order IAM's own examples use.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyDocument {
    #[serde(rename = "Version")]
    pub version: &'static str,
    #[serde(rename = "Statement")]
    pub statements: Vec<Statement>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Statement {
    #[serde(rename = "Sid")]
    pub sid: &'static str,
    #[serde(rename = "Effect")]
    pub effect: &'static str,
    #[serde(rename = "Action")]
    pub actions: Vec<&'static str>,
    #[serde(rename = "Resource")]
    pub resource: String,
    #[serde(rename = "Condition", skip_serializing_if = "Option::is_none")]
    pub condition: Option<Json>,
}

fn statement(sid: &'static str, actions: &BTreeSet<&'static str>, resource: String) -> Statement {
    Statement {
        sid,
        effect: "Allow",
        actions: actions.iter().copied().collect(),
        resource,
        condition: None,
    }
}

/// The policy for `opts.commands` on `plan`'s tables, as JSON.
#[cfg(test)]
pub(crate) fn policy(plan: &Plan, opts: &PolicyOptions) -> Json {
    serde_json::to_value(document(plan, opts)).unwrap_or(Json::Null)
}

/// The policy for `opts.commands` on `plan`'s tables.
pub fn document(plan: &Plan, opts: &PolicyOptions) -> PolicyDocument {
    let commands: &[PolicyCommand] = if opts.commands.is_empty() {
        &PolicyCommand::MIGRATION
    } else {
        &opts.commands
    };
    let mut n = needs(
        commands,
        &Scope {
            export: opts.export.is_some(),
            import: opts.import.is_some() && plan.mode != crate::core::plan::Mode::InPlace,
            in_place: plan.mode == crate::core::plan::Mode::InPlace,
            fleet: opts.control_table.is_some(),
        },
    );
    let source = table_arn(opts, &plan.source_table);
    let target = table_arn(opts, &plan.target_table);
    let target_arn = target.clone();
    let import_job = format!("{target}/import/*");
    let mut statements = Vec::new();
    if plan.source_table == plan.target_table {
        // In place: one table, one statement.
        n.source.extend(std::mem::take(&mut n.target));
        if n.marker.iter().all(|a| n.source.contains(a)) {
            n.marker.clear();
        }
        if !n.source.is_empty() {
            statements.push(statement(sid::TABLE, &n.source, source.clone()));
        }
    } else {
        if !n.source.is_empty() {
            statements.push(statement(sid::SOURCE, &n.source, source.clone()));
        }
        if !n.target.is_empty() {
            statements.push(statement(sid::TARGET, &n.target, target));
        }
    }
    if !n.stream.is_empty() {
        statements.push(statement(
            sid::STREAM,
            &n.stream,
            format!("{source}/stream/*"),
        ));
    }
    if !n.target_stream.is_empty() && plan.source_table != plan.target_table {
        statements.push(statement(
            sid::TARGET_STREAM,
            &n.target_stream,
            format!("{target_arn}/stream/*"),
        ));
    }
    let marker_only = json!({
        "ForAllValues:StringLike": {
            "dynamodb:LeadingKeys": [format!("{MARKER_PREFIX}*")]
        }
    });
    if !n.marker.is_empty() {
        let mut s = statement(sid::MARKER, &n.marker, source.clone());
        s.condition = Some(marker_only.clone());
        statements.push(s);
    }
    if !n.target_marker.is_empty() && plan.source_table != plan.target_table {
        let mut s = statement(sid::TARGET_MARKER, &n.target_marker, target_arn);
        s.condition = Some(marker_only);
        statements.push(s);
    }
    if let Some(table) = &opts.control_table
        && !n.control.is_empty()
    {
        statements.push(statement(sid::CONTROL, &n.control, table_arn(opts, table)));
    }
    if !n.scratch.is_empty() {
        // The names `phase::loadtest` gives its scratch tables.
        for (sid, design) in [
            (sid::LOADTEST_OLD, Design::Old),
            (sid::LOADTEST_NEW, Design::New),
        ] {
            let table = scratch_table(plan, design, "*");
            statements.push(statement(sid, &n.scratch, table_arn(opts, &table)));
        }
    }
    if n.export
        && let Some(ExportLocation::S3 { bucket, prefix }) = &opts.export
    {
        let objects = if prefix.is_empty() {
            format!("arn:aws:s3:::{bucket}/*")
        } else {
            format!("arn:aws:s3:::{bucket}/{prefix}/*")
        };
        statements.push(statement(
            sid::EXPORT_OBJECTS,
            &BTreeSet::from(["s3:GetObject"]),
            objects,
        ));
        let mut list = statement(
            sid::EXPORT_LIST,
            &BTreeSet::from(["s3:ListBucket"]),
            format!("arn:aws:s3:::{bucket}"),
        );
        if !prefix.is_empty() {
            // The reader lists `<folder>/` under the prefix, never the bucket.
            list.condition = Some(json!({
                "StringLike": { "s3:prefix": [format!("{prefix}/*")] }
            }));
        }
        statements.push(list);
    }
    if n.import
        && let Some(ExportLocation::S3 { bucket, prefix }) = &opts.import
    {
        statements.extend(import_statements(opts, import_job, bucket, prefix));
    }
    PolicyDocument {
        version: "2012-10-17",
        statements,
    }
}

/// `--via-import`: the import's own ARN, the objects under `<prefix>/data/`,
/// and what DynamoDB does with the caller's permissions ([`IMPORT_ON_BEHALF`]).
fn import_statements(
    opts: &PolicyOptions,
    import_job: String,
    bucket: &str,
    prefix: &str,
) -> Vec<Statement> {
    let data = crate::core::import::data_prefix(prefix);
    let on_behalf = |service: &str| -> BTreeSet<&'static str> {
        IMPORT_ON_BEHALF
            .iter()
            .copied()
            .filter(|a| a.starts_with(service))
            .collect()
    };
    let mut objects = on_behalf("s3:");
    objects.remove("s3:ListBucket");
    objects.extend(["s3:PutObject", "s3:DeleteObject"]);
    let mut list = statement(
        sid::IMPORT_LIST,
        &BTreeSet::from(["s3:ListBucket"]),
        format!("arn:aws:s3:::{bucket}"),
    );
    list.condition = Some(json!({ "StringLike": { "s3:prefix": [format!("{data}*")] } }));
    vec![
        statement(
            sid::IMPORT_JOB,
            &BTreeSet::from(["dynamodb:DescribeImport"]),
            import_job,
        ),
        statement(
            sid::IMPORT_OBJECTS,
            &objects,
            format!("arn:aws:s3:::{bucket}/{data}*"),
        ),
        list,
        statement(
            sid::IMPORT_LOGS,
            &on_behalf("logs:"),
            format!(
                "arn:aws:logs:{}:{}:log-group:/aws-dynamodb/*",
                opts.region.as_deref().unwrap_or("*"),
                opts.account.as_deref().unwrap_or("*")
            ),
        ),
    ]
}

#[cfg(test)]
mod tests;
