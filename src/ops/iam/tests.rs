//! The policy's tests: what each command and option grants, and that the
//! list of actions is the SDK calls of `src/aws`, both ways.

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
    // Its probes: markers into the source, limited to the marker's keys.
    assert_eq!(
        m[&format!("{src}?\"DrainBarrierMarker\"")],
        set(&["dynamodb:DeleteItem", "dynamodb:PutItem"])
    );
    assert_eq!(m.len(), 4);
}

#[test]
fn query_gets_only_query_on_the_target() {
    let opts = PolicyOptions {
        commands: vec![PolicyCommand::Query],
        ..Default::default()
    };
    let (m, _) = by_resource(&policy(&rekey(), &opts));
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/orders_v2"],
        set(&["dynamodb:Query"])
    );
    assert_eq!(m.len(), 1);
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
fn a_worker_from_an_s3_export_reads_the_prefix_instead_of_scanning() {
    let opts = PolicyOptions {
        commands: vec![PolicyCommand::Worker],
        export: Some(ExportLocation::parse("s3://exports/orders/2026").unwrap()),
        control_table: Some("rekey-control".into()),
        ..Default::default()
    };
    let (m, sids) = by_resource(&policy(&rekey(), &opts));
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/orders"],
        set(&["dynamodb:DescribeTable"])
    );
    assert_eq!(
        m["arn:aws:s3:::exports/orders/2026/*"],
        set(&["s3:GetObject"])
    );
    let list = m
        .iter()
        .find(|(r, _)| r.starts_with("arn:aws:s3:::exports?"))
        .map(|(_, a)| a);
    assert_eq!(list, Some(&set(&["s3:ListBucket"])), "{m:?}");
    assert!(sids.contains(&sid::CONTROL.to_string()), "{sids:?}");
    assert!(m["arn:aws:dynamodb:*:*:table/rekey-control"].contains("dynamodb:CreateTable"));
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
    ("src/aws/mod.rs", include_str!("../../aws/mod.rs")),
    ("src/aws/control.rs", include_str!("../../aws/control.rs")),
    ("src/aws/endpoint.rs", include_str!("../../aws/endpoint.rs")),
    ("src/aws/export.rs", include_str!("../../aws/export.rs")),
    ("src/aws/import.rs", include_str!("../../aws/import.rs")),
    ("src/aws/item.rs", include_str!("../../aws/item.rs")),
    ("src/aws/query.rs", include_str!("../../aws/query.rs")),
    ("src/aws/rate.rs", include_str!("../../aws/rate.rs")),
    ("src/aws/retry.rs", include_str!("../../aws/retry.rs")),
    ("src/aws/scan.rs", include_str!("../../aws/scan.rs")),
    ("src/aws/streams.rs", include_str!("../../aws/streams.rs")),
    ("src/aws/write.rs", include_str!("../../aws/write.rs")),
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
fn a_backfill_via_import_writes_objects_and_imports_instead_of_writing_items() {
    let opts = PolicyOptions {
        commands: vec![PolicyCommand::Backfill],
        import: Some(ExportLocation::parse("s3://staging/orders").unwrap()),
        region: Some("eu-west-1".into()),
        account: Some("123456789012".into()),
        ..Default::default()
    };
    let p = policy(&rekey(), &opts);
    let (m, sids) = by_resource(&p);
    let tgt = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders_v2";
    assert_eq!(
        m[tgt],
        set(&["dynamodb:DescribeTable", "dynamodb:ImportTable"]),
        "no item writes on the target"
    );
    assert_eq!(
        m[&format!("{tgt}/import/*")],
        set(&["dynamodb:DescribeImport"])
    );
    assert_eq!(
        m["arn:aws:s3:::staging/orders/data/*"],
        set(&["s3:DeleteObject", "s3:GetObject", "s3:PutObject"])
    );
    let list = p["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["Sid"] == sid::IMPORT_LIST)
        .unwrap();
    assert_eq!(list["Resource"], "arn:aws:s3:::staging");
    assert_eq!(
        list["Condition"]["StringLike"]["s3:prefix"],
        json!(["orders/data/*"])
    );
    assert!(
        m["arn:aws:logs:eu-west-1:123456789012:log-group:/aws-dynamodb/*"]
            .contains("logs:PutLogEvents")
    );
    assert_eq!(
        sids,
        [
            "SourceTable",
            "TargetTable",
            "ImportJob",
            "ImportObjects",
            "ListImportObjects",
            "ImportLogs"
        ]
    );
    // The tail still writes items into the imported table.
    let tail = PolicyOptions {
        commands: vec![PolicyCommand::Tail],
        ..opts
    };
    let (m, _) = by_resource(&policy(&rekey(), &tail));
    assert!(
        m.keys()
            .all(|r| !r.contains(":s3:") && !r.contains("/import/"))
    );
}

#[test]
fn no_policy_grants_an_action_the_code_does_not_call() {
    let mut known: BTreeSet<&str> = ACTIONS_USED.iter().map(|a| a.action).collect();
    assert_eq!(known.len(), ACTIONS_USED.len(), "an action is listed twice");
    known.extend(IMPORT_ON_BEHALF);
    let all = [
        PolicyCommand::Analyze,
        PolicyCommand::Backfill,
        PolicyCommand::Tail,
        PolicyCommand::Verify,
        PolicyCommand::Cutover,
        PolicyCommand::Query,
        PolicyCommand::Reverse,
        PolicyCommand::Rollback,
    ];
    for plan in [rekey(), in_place()] {
        for (export, import) in [(None, None), (Some("s3://b/p"), Some("s3://b/i"))] {
            let opts = PolicyOptions {
                commands: all.to_vec(),
                export: export.map(|e| ExportLocation::parse(e).unwrap()),
                import: import.map(|e| ExportLocation::parse(e).unwrap()),
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

#[test]
fn reverse_reads_the_targets_stream_and_writes_the_source_and_rollback_only_marks_the_target() {
    let opts = PolicyOptions {
        commands: vec![PolicyCommand::Reverse, PolicyCommand::Rollback],
        ..Default::default()
    };
    let (m, sids) = by_resource(&policy(&rekey(), &opts));
    let src = "arn:aws:dynamodb:*:*:table/orders";
    let dst = "arn:aws:dynamodb:*:*:table/orders_v2";
    assert_eq!(
        m[src],
        set(&[
            "dynamodb:BatchWriteItem",
            "dynamodb:DeleteItem",
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
        ])
    );
    assert_eq!(m[dst], set(&["dynamodb:DescribeTable", "dynamodb:GetItem"]));
    assert_eq!(
        m[&format!("{dst}/stream/*")],
        set(&[
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator",
        ])
    );
    assert_eq!(
        m[&format!("{dst}?\"{}\"", sid::TARGET_MARKER)],
        set(&["dynamodb:DeleteItem", "dynamodb:PutItem"])
    );
    assert!(!sids.contains(&sid::STREAM.to_string()), "{sids:?}");
}

#[test]
fn a_worker_gets_the_backfills_calls_and_the_control_table_alone_may_be_created() {
    let opts = PolicyOptions {
        commands: vec![PolicyCommand::Worker],
        control_table: Some("rekey-control".into()),
        ..Default::default()
    };
    let (m, sids) = by_resource(&policy(&rekey(), &opts));
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/orders"],
        set(&["dynamodb:DescribeTable", "dynamodb:Scan"])
    );
    // DeleteItem on the target and the control table, and the source's
    // stream: for `--tail` (the fleet's tail; its applied buffer chunks are deleted).
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/orders_v2"],
        set(&[
            "dynamodb:BatchWriteItem",
            "dynamodb:DeleteItem",
            "dynamodb:DescribeTable",
            "dynamodb:PutItem"
        ])
    );
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/rekey-control"],
        set(&[
            "dynamodb:CreateTable",
            "dynamodb:DeleteItem",
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem"
        ])
    );
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/orders/stream/*"],
        set(&[
            "dynamodb:DescribeStream",
            "dynamodb:GetRecords",
            "dynamodb:GetShardIterator",
        ])
    );
    assert_eq!(m.len(), 4);
    assert!(sids.contains(&sid::CONTROL.to_string()));
    // Every action granted is one the code calls.
    let known: BTreeSet<&str> = ACTIONS_USED.iter().map(|a| a.action).collect();
    assert!(m.values().flatten().all(|a| known.contains(a.as_str())));
    // CreateTable is granted nowhere else, whatever the commands.
    let all = PolicyOptions {
        commands: PolicyCommand::MIGRATION.to_vec(),
        control_table: Some("rekey-control".into()),
        ..Default::default()
    };
    let (m, _) = by_resource(&policy(&rekey(), &all));
    assert!(m.values().flatten().all(|a| a != "dynamodb:CreateTable"));
    // tail --fleet reads the backfill-done record and publishes its
    // progress; the fleet verify leases its units; cutover reads.
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/rekey-control"],
        set(&[
            "dynamodb:DescribeTable",
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem"
        ])
    );
    let tail = PolicyOptions {
        commands: vec![PolicyCommand::Tail],
        control_table: Some("rekey-control".into()),
        ..Default::default()
    };
    let (m, _) = by_resource(&policy(&rekey(), &tail));
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/rekey-control"],
        set(&["dynamodb:GetItem", "dynamodb:PutItem"])
    );
}

#[test]
fn a_drain_through_the_fleets_tail_reads_the_shards_units_and_lists_the_stream() {
    let opts = PolicyOptions {
        commands: vec![PolicyCommand::Drain],
        control_table: Some("rekey-control".into()),
        ..Default::default()
    };
    let (m, _) = by_resource(&policy(&rekey(), &opts));
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/rekey-control"],
        set(&["dynamodb:Query"])
    );
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/orders/stream/*"],
        set(&["dynamodb:DescribeStream"])
    );
    // Without a control table, a drain writes its marker and nothing else.
    let local = PolicyOptions {
        commands: vec![PolicyCommand::Drain],
        ..Default::default()
    };
    let (m, _) = by_resource(&policy(&rekey(), &local));
    assert!(!m.contains_key("arn:aws:dynamodb:*:*:table/orders/stream/*"));
    // finish --state (granted with cutover) records the end.
    let cutover = PolicyOptions {
        commands: vec![PolicyCommand::Cutover],
        control_table: Some("rekey-control".into()),
        ..Default::default()
    };
    let (m, _) = by_resource(&policy(&rekey(), &cutover));
    assert_eq!(
        m["arn:aws:dynamodb:*:*:table/rekey-control"],
        set(&["dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem"])
    );
}
