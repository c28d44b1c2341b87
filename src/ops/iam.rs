//! `rekey iam-policy`: the least-privilege IAM policy a plan's commands need.
//!
//! The policy is built from [`ACTIONS_USED`], the AWS API actions the code
//! calls, each with the SDK method that calls it and the module it is called
//! in (a unit test checks that the method really appears there). Nothing else
//! is ever granted.
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
//!
//!
//! In place (source = target), backfill, `undo` and tail write with
//! UpdateItem instead, and read an item back with GetItem after a failed
//! condition; they need neither BatchWriteItem nor PutItem nor DeleteItem.
//!
//! ¹ not with `--export`: the backfill then reads `s3:GetObject` under the
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
//! No index ARN is granted: rekey never reads an index, and DynamoDB
//! maintains a table's indexes on writes without index permissions.
//! `dynamodb:CreateTable` (and `dynamodb:UpdateTable`, with which the demo
//! enables its source table's stream) is called only by the demo and the
//! tests, against the local server, so it is never granted either.

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
    /// `*` when not given.
    pub region: Option<String>,
    /// `*` when not given.
    pub account: Option<String>,
}

/// One AWS action the code calls: the IAM action, the SDK method that makes
/// the call, and the source files it is called from.
#[derive(Debug, Clone, Copy)]
pub struct ActionUse {
    pub action: &'static str,
    pub sdk_method: &'static str,
    pub called_in: &'static [&'static str],
}

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
pub const ACTIONS_USED: &[ActionUse] = &[
    used(
        "dynamodb:DescribeTable",
        ".describe_table()",
        &["src/aws/mod.rs"],
    ),
    used("dynamodb:Scan", ".scan()", &["src/aws/scan.rs"]),
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
        &["src/aws/write.rs", "src/aws/item.rs"],
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
        &["src/aws/export.rs"],
    ),
];

/// The partition-key prefix of the drain barrier's marker items.
use crate::core::marker::MARKER_PREFIX;

/// Statement ids, one per purpose.
pub mod sid {
    pub const SOURCE: &str = "SourceTable";
    pub const TARGET: &str = "TargetTable";
    /// In place: the source is the target.
    pub const TABLE: &str = "SourceAndTargetTable";
    pub const STREAM: &str = "SourceStream";
    pub const MARKER: &str = "DrainBarrierMarker";
    pub const EXPORT_OBJECTS: &str = "ReadExport";
    pub const EXPORT_LIST: &str = "ListExport";
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
    export: bool,
}

/// What of the plan and the options changes the actions needed.
struct Scope {
    /// The backfill reads an S3 export instead of scanning.
    export: bool,
    /// The plan sets attributes on its own table, with conditional UpdateItem
    /// (and a consistent GetItem after a failed condition) instead of puts
    /// and deletes; `rekey undo` needs what the backfill needs.
    in_place: bool,
}

fn needs(commands: &[PolicyCommand], scope: &Scope) -> Needs {
    use PolicyCommand::*;
    let Scope { export, in_place } = *scope;
    let mut n = Needs::default();
    for c in commands {
        match c {
            Analyze => n.source.extend(["dynamodb:DescribeTable", "dynamodb:Scan"]),
            Backfill => {
                n.source.insert("dynamodb:DescribeTable");
                if export {
                    n.export = true;
                } else {
                    n.source.insert("dynamodb:Scan");
                }
                if in_place {
                    n.target.extend([
                        "dynamodb:DescribeTable",
                        "dynamodb:UpdateItem",
                        "dynamodb:GetItem",
                    ]);
                } else {
                    n.target.extend([
                        "dynamodb:DescribeTable",
                        "dynamodb:BatchWriteItem",
                        "dynamodb:PutItem",
                    ]);
                }
            }
            Tail => {
                n.source.insert("dynamodb:DescribeTable");
                n.stream.extend([
                    "dynamodb:DescribeStream",
                    "dynamodb:GetShardIterator",
                    "dynamodb:GetRecords",
                ]);
                if in_place {
                    n.target.extend(["dynamodb:UpdateItem", "dynamodb:GetItem"]);
                } else {
                    n.target.extend([
                        "dynamodb:BatchWriteItem",
                        "dynamodb:PutItem",
                        "dynamodb:DeleteItem",
                    ]);
                }
            }
            Verify => {
                n.source.extend([
                    "dynamodb:DescribeTable",
                    "dynamodb:Scan",
                    "dynamodb:BatchGetItem",
                ]);
                n.stream.extend([
                    "dynamodb:DescribeStream",
                    "dynamodb:GetShardIterator",
                    "dynamodb:GetRecords",
                ]);
                n.target.extend([
                    "dynamodb:DescribeTable",
                    "dynamodb:BatchGetItem",
                    "dynamodb:Scan",
                ]);
            }
            Drain => n.marker.extend(["dynamodb:PutItem", "dynamodb:DeleteItem"]),
            Cutover => {
                n.source.insert("dynamodb:DescribeTable");
                n.target.insert("dynamodb:DescribeTable");
                n.marker.extend(["dynamodb:PutItem", "dynamodb:DeleteItem"]);
            }
        }
    }
    n
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
pub fn policy(plan: &Plan, opts: &PolicyOptions) -> Json {
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
            in_place: plan.mode == crate::core::plan::Mode::InPlace,
        },
    );
    let source = table_arn(opts, &plan.source_table);
    let target = table_arn(opts, &plan.target_table);
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
    if !n.marker.is_empty() {
        let mut s = statement(sid::MARKER, &n.marker, source.clone());
        s.condition = Some(json!({
            "ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [format!("{MARKER_PREFIX}*")]
            }
        }));
        statements.push(s);
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
    PolicyDocument {
        version: "2012-10-17",
        statements,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    fn plan(target: &str, body: &str) -> Plan {
        let src = format!(
            "version = 1\n[source]\ntable = \"orders\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n\
             [target]\ntable = \"{target}\"\npartition_key = \"PK\"\nsort_key = \"SK\"\n{body}"
        );
        Plan::parse(&src, Path::new("t.toml")).unwrap()
    }

    fn rekey() -> Plan {
        plan(
            "orders_v2",
            "[[rule]]\nmatch = { PK = \"T#{t}\" }\nkey = { PK = \"T#{t}#S#{shard(t, 4)}\", SK = \"{@SK}\" }\n",
        )
    }

    fn in_place() -> Plan {
        plan("orders", "[[rule]]\nset = { GSI1PK = \"X#{@SK}\" }\n")
    }

    /// Resource → actions, and the Sids, of a policy.
    fn by_resource(p: &Json) -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
        assert_eq!(p["Version"], "2012-10-17");
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut sids = Vec::new();
        for s in p["Statement"].as_array().unwrap() {
            assert_eq!(s["Effect"], "Allow");
            sids.push(s["Sid"].as_str().unwrap().to_string());
            let key = match s.get("Condition") {
                Some(_) => format!("{}?{}", s["Resource"].as_str().unwrap(), s["Sid"]),
                None => s["Resource"].as_str().unwrap().to_string(),
            };
            let e = m.entry(key).or_default();
            for a in s["Action"].as_array().unwrap() {
                e.insert(a.as_str().unwrap().to_string());
            }
        }
        (m, sids)
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_rekey_plan_gets_read_on_the_source_and_write_on_the_target() {
        let opts = PolicyOptions {
            region: Some("eu-west-1".into()),
            account: Some("123456789012".into()),
            ..Default::default()
        };
        let (m, sids) = by_resource(&policy(&rekey(), &opts));
        let src = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders";
        let tgt = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders_v2";
        assert_eq!(
            m[src],
            set(&[
                "dynamodb:BatchGetItem",
                "dynamodb:DescribeTable",
                "dynamodb:Scan"
            ])
        );
        assert_eq!(
            m[tgt],
            set(&[
                "dynamodb:BatchGetItem",
                "dynamodb:BatchWriteItem",
                "dynamodb:DeleteItem",
                "dynamodb:DescribeTable",
                "dynamodb:PutItem",
                "dynamodb:Scan"
            ])
        );
        assert_eq!(
            m[&format!("{src}/stream/*")],
            set(&[
                "dynamodb:DescribeStream",
                "dynamodb:GetRecords",
                "dynamodb:GetShardIterator"
            ])
        );
        assert_eq!(
            m[&format!("{src}?\"DrainBarrierMarker\"")],
            set(&["dynamodb:DeleteItem", "dynamodb:PutItem"])
        );
        assert_eq!(m.len(), 4);
        assert_eq!(
            sids,
            [
                "SourceTable",
                "TargetTable",
                "SourceStream",
                "DrainBarrierMarker"
            ]
        );
    }

    #[test]
    fn the_marker_statement_is_limited_to_rekey_leading_keys() {
        let p = policy(&rekey(), &PolicyOptions::default());
        let marker = p["Statement"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["Sid"] == sid::MARKER)
            .unwrap();
        assert_eq!(marker["Resource"], "arn:aws:dynamodb:*:*:table/orders");
        assert_eq!(
            marker["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"],
            json!(["__rekey__#barrier#*"])
        );
    }

    #[test]
    fn an_in_place_plan_merges_into_one_table_statement() {
        let (m, sids) = by_resource(&policy(&in_place(), &PolicyOptions::default()));
        let t = "arn:aws:dynamodb:*:*:table/orders";
        assert_eq!(
            m[t],
            set(&[
                "dynamodb:BatchGetItem",
                "dynamodb:DescribeTable",
                "dynamodb:GetItem",
                "dynamodb:Scan",
                "dynamodb:UpdateItem"
            ])
        );
        // In place, backfill and tail only update: no BatchWriteItem, and
        // PutItem/DeleteItem only for the drain marker, limited to its keys.
        assert_eq!(
            sids,
            ["SourceAndTargetTable", "SourceStream", "DrainBarrierMarker"]
        );
    }

    #[test]
    fn tail_gets_only_what_the_tail_calls() {
        let opts = PolicyOptions {
            commands: vec![PolicyCommand::Tail],
            ..Default::default()
        };
        let (m, _) = by_resource(&policy(&rekey(), &opts));
        let src = "arn:aws:dynamodb:*:*:table/orders";
        assert_eq!(m[src], set(&["dynamodb:DescribeTable"]));
        assert_eq!(
            m["arn:aws:dynamodb:*:*:table/orders_v2"],
            set(&[
                "dynamodb:BatchWriteItem",
                "dynamodb:DeleteItem",
                "dynamodb:PutItem"
            ])
        );
        assert_eq!(
            m[&format!("{src}/stream/*")],
            set(&[
                "dynamodb:DescribeStream",
                "dynamodb:GetRecords",
                "dynamodb:GetShardIterator"
            ])
        );
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn a_backfill_from_an_s3_export_reads_the_prefix_instead_of_scanning() {
        let opts = PolicyOptions {
            commands: vec![PolicyCommand::Backfill],
            export: Some(ExportLocation::parse("s3://exports/orders/2026").unwrap()),
            ..Default::default()
        };
        let p = policy(&rekey(), &opts);
        let (m, _) = by_resource(&p);
        assert_eq!(
            m["arn:aws:dynamodb:*:*:table/orders"],
            set(&["dynamodb:DescribeTable"])
        );
        assert_eq!(
            m["arn:aws:s3:::exports/orders/2026/*"],
            set(&["s3:GetObject"])
        );
        let list = &p["Statement"].as_array().unwrap().last().unwrap();
        assert_eq!(list["Resource"], "arn:aws:s3:::exports");
        assert_eq!(
            list["Condition"]["StringLike"]["s3:prefix"],
            json!(["orders/2026/*"])
        );
        // A local export needs no S3 permission and no Scan either.
        let local = PolicyOptions {
            export: Some(ExportLocation::parse("/tmp/export").unwrap()),
            ..opts
        };
        let (m, _) = by_resource(&policy(&rekey(), &local));
        assert!(m.keys().all(|r| !r.contains(":s3:")));
        assert!(!m["arn:aws:dynamodb:*:*:table/orders"].contains("dynamodb:Scan"));
    }

    #[test]
    fn the_output_is_valid_json() {
        let p = policy(&rekey(), &PolicyOptions::default());
        let text = serde_json::to_string_pretty(&p).unwrap();
        let back: Json = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
    }

    /// Every file of `src/aws`: the only code that calls the SDK
    /// (tests/architecture.rs checks that).
    const AWS_SOURCES: &[(&str, &str)] = &[
        ("src/aws/mod.rs", include_str!("../aws/mod.rs")),
        ("src/aws/endpoint.rs", include_str!("../aws/endpoint.rs")),
        ("src/aws/export.rs", include_str!("../aws/export.rs")),
        ("src/aws/item.rs", include_str!("../aws/item.rs")),
        ("src/aws/rate.rs", include_str!("../aws/rate.rs")),
        ("src/aws/retry.rs", include_str!("../aws/retry.rs")),
        ("src/aws/scan.rs", include_str!("../aws/scan.rs")),
        ("src/aws/streams.rs", include_str!("../aws/streams.rs")),
        ("src/aws/write.rs", include_str!("../aws/write.rs")),
    ];

    fn source_of(file: &str) -> &'static str {
        AWS_SOURCES
            .iter()
            .find(|(f, _)| *f == file)
            .map(|(_, text)| *text)
            .unwrap_or_else(|| panic!("no source for {file}: add it to AWS_SOURCES"))
    }

    /// A new SDK call in `src/aws` must be in the list, or the policy would
    /// not grant it.
    #[test]
    fn no_action_is_called_where_the_list_does_not_say() {
        for a in ACTIONS_USED {
            for (file, text) in AWS_SOURCES {
                if text.contains(a.sdk_method) {
                    assert!(
                        a.called_in.contains(file),
                        "{}: {} is called in {file}, which the list does not name",
                        a.action,
                        a.sdk_method
                    );
                }
            }
        }
        let listed: usize = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/aws"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "rs")
            })
            .count();
        assert_eq!(
            listed,
            AWS_SOURCES.len(),
            "every src/aws file is in AWS_SOURCES"
        );
    }

    #[test]
    fn every_used_action_is_called_where_the_list_says() {
        for a in ACTIONS_USED {
            for file in a.called_in {
                assert!(
                    source_of(file).contains(a.sdk_method),
                    "{}: {} not found in {file}",
                    a.action,
                    a.sdk_method
                );
            }
        }
    }

    #[test]
    fn no_policy_grants_an_action_the_code_does_not_call() {
        let known: BTreeSet<&str> = ACTIONS_USED.iter().map(|a| a.action).collect();
        assert_eq!(known.len(), ACTIONS_USED.len(), "an action is listed twice");
        let all = [
            PolicyCommand::Analyze,
            PolicyCommand::Backfill,
            PolicyCommand::Tail,
            PolicyCommand::Verify,
            PolicyCommand::Cutover,
        ];
        for plan in [rekey(), in_place()] {
            for export in [None, Some("s3://b/p")] {
                let opts = PolicyOptions {
                    commands: all.to_vec(),
                    export: export.map(|e| ExportLocation::parse(e).unwrap()),
                    ..Default::default()
                };
                let (m, _) = by_resource(&policy(&plan, &opts));
                for a in m.values().flatten() {
                    assert!(
                        known.contains(a.as_str()),
                        "{a} is granted but never called"
                    );
                }
            }
        }
    }
}
