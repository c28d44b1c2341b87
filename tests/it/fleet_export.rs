//! The fleet's backfill from an S3 export (issue 15): `rekey worker
//! --from-export s3://…` processes share the export's data files as leased
//! units — one killed -9 mid-file, another started — and the target is the
//! export's contents transformed, exactly; workers started with another
//! export, or with none, are refused.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Stdio};

use rekey::core::value::encode_key;
use rekey::state::fleet::{Checkpoint, Snapshot};
use rekey_testkit::export::write_export;

use crate::backfill::{export_orders, export_setup};
use crate::fleet::{LEASE_SECONDS, committed_rejects, control_table, kill_9, snapshot, wait_for};
use crate::support::*;

const FILES: usize = 8;
const ITEMS: usize = 1200;
const EXPORT_ID: &str = "01733000000000-f1ee7001";
const OTHER_ID: &str = "01733000000001-0bbe7002";
const TABLE_ARN: &str = "arn:aws:dynamodb:us-east-1:000000000000:table/src";

/// `rekey ARGS` as a child process, with S3 (the export) at `s3`.
fn spawn_with_s3(env: &TestEnv, s3: &str, args: &[&str]) -> Child {
    env.command(args, &[("AWS_ENDPOINT_URL_S3", s3)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rekey")
}

/// A unit `w` holds whose data file it has committed past line 0, not done.
fn mid_file(s: &Snapshot, w: &str) -> bool {
    s.units.iter().any(|u| {
        !u.done
            && u.owner.as_deref() == Some(w)
            && matches!(u.checkpoint, Checkpoint::Lines(n) if n > 0)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_an_exports_files_one_killed_the_target_is_the_export_exactly() {
    let env = TestEnv::start().await;
    let (target, plan, plan_path) = export_setup(&env).await;
    let items = export_orders(ITEMS);
    let dir = env.dir.path().join("export");
    let m = write_export(
        &dir,
        EXPORT_ID,
        TABLE_ARN,
        items.iter().cloned(),
        FILES,
        1_733_000_000_000,
    )
    .unwrap();
    // Line 5 of file 2 is not an item: rejected, naming its file and line.
    let lost = RefCell::new(None);
    crate::support::export::rewrite_data_file(&dir, EXPORT_ID, &m.files[2].key, |n, text| {
        if n == 5 {
            *lost.borrow_mut() = Some(text);
            "{\"Item\": not json".to_string()
        } else {
            text
        }
    });
    let lost = rekey::core::itemline::parse_line(&lost.into_inner().unwrap()).unwrap();
    // Another export, at another prefix: a worker started with it is refused.
    let other = env.dir.path().join("other");
    write_export(
        &other,
        OTHER_ID,
        TABLE_ARN,
        items.iter().take(10).cloned(),
        2,
        1,
    )
    .unwrap();
    let bucket = format!("fleet-export-{}", std::process::id());
    let s3 = crate::support::export::bucket(&bucket).await;
    crate::support::export::upload_dir(&s3, &bucket, "team/orders", &dir).await;
    crate::support::export::upload_dir(&s3, &bucket, "other/orders", &other).await;
    let moto = shared_server().await.endpoint().to_string();
    let export_url = format!("s3://{bucket}/team/orders");

    let (fleet, url, _) = control_table(&env, "fx");
    let plan_s = plan_path.to_str().unwrap();
    let work = env.dir.path().to_path_buf();
    let rejects = |w: &str| work.join(format!("rejects-{w}.jsonl"));
    let args = |w: &str, from: Option<&str>| -> Vec<String> {
        let local = work.join(format!("state-{w}"));
        let mut a: Vec<String> = [
            "worker",
            plan_s,
            "--state",
            &url,
            "--worker-id",
            w,
            "--lease-seconds",
            LEASE_SECONDS,
            "--state-dir",
            local.to_str().unwrap(),
            "--rejects",
            rejects(w).to_str().unwrap(),
            "--page-size",
            "20",
            "--write-rate",
            "150",
            "--max-units",
            "3",
            "--json",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        if let Some(f) = from {
            a.extend(["--from-export".to_string(), f.to_string()]);
        }
        a
    };
    let start = |w: &str| {
        let a = args(w, Some(&export_url));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        spawn_with_s3(&env, &moto, &a)
    };
    let mut w1 = start("w1");
    let (w2, w3) = (start("w2"), start("w3"));
    wait_for(&fleet, "w1 to commit lines of a file it holds", |s| {
        mid_file(s, "w1")
    })
    .await;
    kill_9(&mut w1);
    let w4 = start("w4");
    let mut reports = Vec::new();
    for (id, child) in [("w2", w2), ("w3", w3), ("w4", w4)] {
        let out = wait_output(child).await;
        assert!(out.status.success(), "{id}: {}", stderr(&out));
        let r = report(&out);
        assert_eq!(r["backfill_done"], true, "{id}: {r}");
        assert_eq!(r["export"]["export_id"], EXPORT_ID, "{id}: {r}");
        reports.push(r);
    }

    // The target is transform(the export's items), the bad line's item aside.
    let names = plan.source_key.names();
    let lost_key = encode_key(&lost, &names);
    let kept: Vec<_> = items
        .iter()
        .filter(|i| encode_key(i, &names) != lost_key)
        .cloned()
        .collect();
    let actual = env.table_map(&target, &["PK", "SK"]).await;
    assert_eq!(actual.len(), ITEMS - 1);
    assert!(
        actual == expected_target(&plan, &kept),
        "target == transform(export)"
    );

    // One unit per data file, each done, its lines counted exactly once.
    let s = snapshot(&fleet).await;
    assert!(s.all_done() && s.meta.as_ref().unwrap().done_ms.is_some());
    let meta_export = s.meta.as_ref().unwrap().export.clone().unwrap();
    assert_eq!(
        (meta_export.export_id.as_str(), meta_export.files),
        (EXPORT_ID, FILES as u32)
    );
    assert_eq!(s.units.len(), FILES);
    for (u, f) in s.units.iter().zip(&m.files) {
        assert_eq!(u.file.as_deref(), Some(f.key.as_str()), "unit {}", u.n);
        assert_eq!(u.checkpoint, Checkpoint::Done, "unit {}", u.n);
        let c = u.counts;
        assert_eq!(c.scanned, f.item_count, "unit {}: each line once", u.n);
        assert_eq!(
            c.scanned,
            c.written + c.rejected + c.skipped,
            "unit {}",
            u.n
        );
    }
    let t = s.totals();
    assert_eq!(
        (t.scanned, t.written, t.rejected, t.skipped),
        (ITEMS as u64, ITEMS as u64 - 1, 1, 0)
    );
    // No unit finished by two workers; w1's unit was taken over mid-file.
    let mut finished = BTreeSet::new();
    for r in &reports {
        for u in r["units_finished"].as_array().unwrap() {
            assert!(
                finished.insert(u.as_u64().unwrap()),
                "unit {u} finished twice"
            );
        }
    }
    let taken_over: Vec<_> = s
        .grants
        .iter()
        .filter(|g| g.owner == "w1" && !g.released)
        .filter(|g| {
            s.grants
                .iter()
                .any(|h| h.unit == g.unit && h.lease > g.lease)
        })
        .collect();
    assert!(
        !taken_over.is_empty(),
        "w1 died holding a unit, taken over: {:?}",
        s.grants
    );
    for u in &s.units {
        let mut gs: Vec<_> = s.grants.iter().filter(|g| g.unit == u.n).collect();
        gs.sort_by_key(|g| g.lease);
        for p in gs.windows(2) {
            assert!(p[1].granted_ms >= p[0].until_ms, "unit {}: {p:?}", u.n);
        }
    }
    // The bad line once across the workers' files, with its file and line.
    let files: Vec<_> = ["w1", "w2", "w3", "w4"]
        .iter()
        .map(|w| rejects(w))
        .collect();
    let files: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let lines = committed_rejects(&files, &s);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let reason = lines[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("{}:5: ", m.files[2].key)),
        "{reason}"
    );

    // status shows the file units like segments.
    let out = env.rekey(&["status", plan_s, "--state", &url, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["export"]["export_id"], EXPORT_ID, "{st}");
    assert_eq!(st["backfill_done"], true);
    let units = st["units"].as_array().unwrap();
    assert_eq!(units.len(), FILES);
    assert!(
        units
            .iter()
            .all(|u| u["done"] == true && u["file"].is_string()),
        "{st}"
    );

    // cutover --state: the backfill gate holds, naming the export (the
    // other gates, no tail and no verify here, do not).
    let state = work.join("state-cutover");
    let out = env.rekey(&[
        "cutover",
        plan_s,
        "--state-dir",
        state.to_str().unwrap(),
        "--state",
        &url,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gate = r["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "backfill complete")
        .unwrap()
        .clone();
    assert_eq!(gate["ok"], true, "{r}");
    let detail = gate["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("from export {EXPORT_ID} at {export_url}"))
            && detail.contains(&format!("{} scanned", ITEMS)),
        "{detail}"
    );

    // Another export, or none, on this migration: refused before reading.
    let other_url = format!("s3://{bucket}/other/orders");
    for (w, from, says) in [
        ("x1", Some(other_url.as_str()), other_url.as_str()),
        ("x2", None, "no --from-export"),
    ] {
        let a = args(w, from);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = wait_output(spawn_with_s3(&env, &moto, &a)).await;
        assert_eq!(out.status.code(), Some(1), "{w}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("reads export {EXPORT_ID} at {export_url}"))
                && err.contains(says),
            "{w}: {err}"
        );
    }
    let after = snapshot(&fleet).await;
    assert_eq!(after.units, s.units, "the refused workers changed nothing");
}
