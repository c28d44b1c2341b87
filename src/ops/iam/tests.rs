//! The policy's tests: what each command and option grants — fixture files,
//! `tests/fixtures/iam/<case>.toml` (a plan and options) → `<case>.json`
//! (the whole policy) — and, as code, that the list of actions is the SDK
//! calls of `src/aws`, both ways, and that no policy grants what is never called.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::core::fixture;

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
    ("src/aws/trace.rs", include_str!("../../aws/trace.rs")),
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
        PolicyCommand::Loadtest,
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

/// A fixture's command name, as `--command` spells it.
fn command(name: &str) -> PolicyCommand {
    match name {
        "analyze" => PolicyCommand::Analyze,
        "backfill" => PolicyCommand::Backfill,
        "tail" => PolicyCommand::Tail,
        "verify" => PolicyCommand::Verify,
        "drain" => PolicyCommand::Drain,
        "cutover" => PolicyCommand::Cutover,
        "query" => PolicyCommand::Query,
        "reverse" => PolicyCommand::Reverse,
        "rollback" => PolicyCommand::Rollback,
        "worker" => PolicyCommand::Worker,
        "loadtest" => PolicyCommand::Loadtest,
        other => panic!("unknown command `{other}`"),
    }
}

/// A fixture: `plan` ("rekey" or "in_place") and the policy's options.
fn fixture_case(path: &Path) -> (Plan, PolicyOptions) {
    let text = std::fs::read_to_string(path).unwrap();
    let t: toml::Table =
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let s = |k: &str| t.get(k).map(|v| v.as_str().expect(k).to_string());
    let plan = match s("plan").as_deref() {
        Some("rekey") => rekey(),
        Some("in_place") => in_place(),
        other => panic!("{}: plan = {other:?}", path.display()),
    };
    let commands = t.get("commands").map_or_else(Vec::new, |c| {
        c.as_array()
            .expect("commands")
            .iter()
            .map(|n| command(n.as_str().expect("a command name")))
            .collect()
    });
    let location = |k: &str| s(k).map(|l| ExportLocation::parse(&l).unwrap());
    let opts = PolicyOptions {
        commands,
        export: location("export"),
        import: location("import"),
        region: s("region"),
        account: s("account"),
        control_table: s("control_table"),
    };
    (plan, opts)
}

/// Every fixture's policy, whole: `tests/fixtures/iam/<case>.toml` →
/// `<case>.json`. Each also grants only actions the code calls, and
/// CreateTable only to a worker and to the load test, DeleteTable only
/// on the load test's scratch tables.
#[test]
fn fixtures_each_command_and_option_gets_exactly_its_policy() {
    let known: BTreeSet<&str> = ACTIONS_USED
        .iter()
        .map(|a| a.action)
        .chain(IMPORT_ON_BEHALF.iter().copied())
        .collect();
    let cases = fixture::cases(&fixture::dir("iam"), ".toml");
    let mut failures = fixture::strays(&fixture::dir("iam"), ".toml", ".json");
    for case in &cases {
        let (plan, opts) = fixture_case(case);
        let p = policy(&plan, &opts);
        let (m, _) = by_resource(&p);
        for a in m.values().flatten() {
            assert!(
                known.contains(a.as_str()),
                "{}: {a} is granted but never called",
                case.display()
            );
        }
        let creates = m.values().flatten().any(|a| a == "dynamodb:CreateTable");
        assert_eq!(
            creates,
            opts.commands.contains(&PolicyCommand::Worker) && opts.control_table.is_some()
                || opts.commands.contains(&PolicyCommand::Loadtest),
            "{}: CreateTable only for a worker's control table and loadtest's scratch tables",
            case.display()
        );
        for (resource, actions) in &m {
            assert!(
                !actions.iter().any(|a| a == "dynamodb:DeleteTable")
                    || resource.contains("-loadtest-"),
                "{}: DeleteTable on {resource}, not a scratch table",
                case.display()
            );
        }
        let got = serde_json::to_string_pretty(&p).unwrap() + "\n";
        failures.extend(fixture::compare(
            &fixture::sibling(case, ".toml", ".json"),
            &got,
        ));
    }
    fixture::finish("IAM policy fixtures", cases.len(), 17, &failures);
}
