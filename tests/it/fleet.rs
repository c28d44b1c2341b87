//! More than one machine (issue 15): worker processes sharing one
//! migration's backfill through a DynamoDB control table, under a live
//! writer, with kill -9 of two of them at points chosen from what the
//! control table acknowledges, and `rekey tail --fleet` beside them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use md5::{Digest, Md5};
use rekey::aws::control::ControlTable;
use rekey::core::value::Item;
use rekey::state::StateDir;
use rekey::state::fleet::{Fleet, FleetError, FleetRef, Snapshot, committed_lease};

/// Long enough that a renewal lands inside the fence (half of it) on a
/// loaded 2-core CI machine; at 4 s, renewals queued behind a starved moto
/// and units changed hands dozens of times. Each kill -9 costs a lease of
/// waiting before the unit is taken over.
pub(crate) const LEASE_SECONDS: &str = "8";

use crate::support::plan::orders_by_status;
use crate::support::workload::*;
use crate::support::*;

/// Orders re-keyed by status, plus `C#{x}#{y}` items that all map to one
/// target key per `x` (collisions).
fn fleet_plan(source: &str, target: &str) -> PlanText {
    orders_by_status(source, target).rule(
        Rule::new(&[("PK", "C#{x}#{y}")], &[("PK", "C"), ("SK", "SAME#{x}")]).named("collide"),
    )
}

/// moto's Scan segment of a partition key: the first byte of its MD5, mod
/// the segment count (ARCHITECTURE.md, "Test backend").
fn moto_segment(pk: &str, segments: u8) -> u8 {
    Md5::digest(pk.as_bytes())[0] % segments
}

/// `n` colliding pairs whose two items are in different segments (on moto;
/// elsewhere segments are key ranges and the pair is as likely split).
fn split_pairs(n: usize, segments: u8) -> Vec<(String, String)> {
    (0..)
        .map(|x| (format!("C#{x}#a"), format!("C#{x}#b")))
        .filter(|(a, b)| moto_segment(a, segments) != moto_segment(b, segments))
        .take(n)
        .collect()
}

fn pk_item(pk: &str) -> Item {
    item(&format!(r#"{{"PK":{{"S":"{pk}"}}}}"#))
}

/// What the control table holds (nothing before the first worker made it).
pub(crate) async fn snapshot(fleet: &Fleet) -> Snapshot {
    match fleet.read().await {
        Ok(s) => s,
        Err(FleetError::Aws(rekey::aws::AwsError::NotFound { .. })) => Snapshot::default(),
        Err(e) => panic!("control table: {e}"),
    }
}

/// A unit `worker` holds whose checkpoint it has committed at least once.
fn has_committed(s: &Snapshot, worker: &str) -> bool {
    s.units.iter().any(|u| {
        !u.done
            && u.owner.as_deref() == Some(worker)
            && s.grants
                .iter()
                .any(|g| g.unit == u.n && g.lease == u.lease && g.from_page < u.page)
    })
}

/// Every rejects line of `files` whose page was committed by the lease that
/// wrote it: each reject once, however many workers died mid-page.
fn committed_rejects(files: &[&Path], s: &Snapshot) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for f in files {
        for line in std::fs::read_to_string(f).unwrap_or_default().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let tag = &v["fleet"];
            let (unit, lease, page) = (
                tag["unit"].as_u64().unwrap() as u32,
                tag["lease"].as_u64().unwrap(),
                tag["page"].as_u64().unwrap(),
            );
            if committed_lease(&s.grants, unit, page) == Some(lease) {
                out.push(v);
            }
        }
    }
    out
}

/// A control table for migration `id`: the fleet handle the test reads
/// it through, the `--state` URL the processes are given, the table's name.
pub(crate) fn control_table(env: &TestEnv, id: &str) -> (Fleet, String, String) {
    let ctl = env.table_name("ctl");
    let url = format!("dynamodb://{ctl}/{id}");
    let at = FleetRef::parse(&url, "unused").unwrap();
    let fleet = Fleet::new(ControlTable::new(&env.clients, &ctl), at, "test");
    (fleet, url, ctl)
}

/// `rekey tail --fleet`, once it has published its first status (it has
/// captured the stream's position before any worker reads).
async fn fleet_tail(env: &TestEnv, plan: &str, state: &Path, url: &str) -> Child {
    let tail = env.spawn(&[
        "tail",
        plan,
        "--state-dir",
        state.to_str().unwrap(),
        "--fleet",
        url,
        "--exit-when-idle",
        "4",
        "--json",
    ]);
    let tail_status = StateDir::new(state).tail_snapshot();
    poll_until("the tail's first status", Duration::from_secs(60), || {
        tail_status.exists()
    })
    .await;
    tail
}

pub(crate) fn kill_9(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_two_killed_two_started_under_a_live_writer_converge_exactly() {
    const SEGMENTS: u8 = 16;
    let Orders {
        env,
        source,
        target,
        state,
        ..
    } = Orders::start(seed(2000)).await;
    let (plan_path, plan) = fleet_plan(&source, &target).write(&env);
    let pairs = split_pairs(3, SEGMENTS);
    let mut extra: Vec<Item> = pairs
        .iter()
        .flat_map(|(a, b)| [pk_item(a), pk_item(b)])
        .collect();
    extra.extend((0..7).map(|i| pk_item(&format!("X#{i}"))));
    env.put(&source, &extra).await;

    let (fleet, url, _) = control_table(&env, "m1");
    let plan_s = plan_path.to_str().unwrap();
    // The tail captures first, from before any worker reads.
    let tail = fleet_tail(&env, plan_s, &state, &url).await;

    let dir = env.dir.path().to_path_buf();
    let rejects = |w: &str| dir.join(format!("rejects-{w}.jsonl"));
    let start = |w: &str| {
        let r = rejects(w);
        let local = dir.join(format!("state-{w}"));
        env.spawn(&[
            "worker",
            plan_s,
            "--state",
            &url,
            "--worker-id",
            w,
            "--segments",
            &SEGMENTS.to_string(),
            "--page-size",
            "40",
            "--lease-seconds",
            LEASE_SECONDS,
            "--max-units",
            "4",
            "--rejects",
            r.to_str().unwrap(),
            "--state-dir",
            local.to_str().unwrap(),
            "--json",
        ])
    };
    let app = writer(&env, source.clone(), 2000, 1500, Rng::from_time().next());
    let fleet_run = async {
        let mut w: BTreeMap<&str, Child> = ["w1", "w2", "w3", "w4"]
            .into_iter()
            .map(|id| (id, start(id)))
            .collect();
        // Kill -9 each of two workers once it holds a unit it has
        // checkpointed: mid-unit, with its lease still live.
        for victim in ["w1", "w2"] {
            wait_for(&fleet, &format!("{victim} to commit a page"), |s| {
                has_committed(s, victim)
            })
            .await;
            kill_9(w.get_mut(victim).unwrap());
            eprintln!("{victim} killed");
        }
        for id in ["w5", "w6"] {
            w.insert(id, start(id));
        }
        let mut outs = BTreeMap::new();
        for id in ["w3", "w4", "w5", "w6"] {
            let child = w.remove(id).unwrap();
            outs.insert(id, wait_output(child).await);
        }
        outs
    };
    let (ops, outs) = tokio::join!(app, fleet_run);
    eprintln!("application wrote {ops} changes during the fleet's backfill");
    for (id, out) in &outs {
        assert!(out.status.success(), "{id}: {}", stderr(out));
        let r = report(out);
        assert_eq!(r["backfill_done"], true, "{id}: {r}");
    }
    let out = wait_output(tail).await;
    assert!(out.status.success(), "tail: {}", stderr(&out));
    assert!(report(&out)["buffered"].as_u64().unwrap() > 0);

    // Exactly transform(source), under the live writer.
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "nothing lost, nothing extra, nothing stale"
    );

    let s = snapshot(&fleet).await;
    assert!(
        s.meta.as_ref().unwrap().done_ms.is_some(),
        "backfill done recorded"
    );
    assert_eq!(s.units.len(), SEGMENTS as usize);
    assert!(s.units.iter().all(|u| u.done), "every unit done");
    check_grants(&s);

    // Counters add up per unit and in total.
    for u in &s.units {
        let c = u.counts;
        assert_eq!(
            c.scanned,
            c.written + c.rejected + c.skipped,
            "unit {}",
            u.n
        );
    }
    let t = s.totals();
    assert_eq!(t.scanned, t.written + t.rejected + t.skipped);
    assert_eq!(t.collisions, pairs.len() as u64, "{t:?}");

    // Each reject once across the workers' files, the collisions naming both keys.
    let files: Vec<_> = ["w1", "w2", "w3", "w4", "w5", "w6"]
        .iter()
        .map(|w| rejects(w))
        .collect();
    let files: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let lines = committed_rejects(&files, &s);
    assert_eq!(
        lines.len() as u64,
        t.rejected,
        "one line per committed reject"
    );
    let collisions: Vec<(String, &str)> = lines
        .iter()
        .filter_map(|v| {
            Some((
                v["item"]["PK"]["S"].as_str()?.to_string(),
                v["reason"].as_str()?,
            ))
        })
        .filter(|(_, r)| r.starts_with("collision"))
        .collect();
    assert_eq!(collisions.len(), pairs.len(), "{collisions:?}");
    for (a, b) in &pairs {
        // The rejected item is one of the pair; its reason names the other,
        // which holds the target key.
        let named: Vec<_> = collisions
            .iter()
            .filter(|(pk, r)| {
                (pk == a && r.contains(b.as_str())) || (pk == b && r.contains(a.as_str()))
            })
            .collect();
        assert_eq!(
            named.len(),
            1,
            "pair {a} / {b} reported once: {collisions:?}"
        );
    }
}

/// Polls the control table until `ack` holds of what it reads.
pub(crate) async fn wait_for(fleet: &Fleet, what: &str, ack: impl Fn(&Snapshot) -> bool) {
    poll_until_async(what, Duration::from_secs(180), || async {
        ack(&snapshot(fleet).await)
    })
    .await;
}

/// From the grant history: every lease of every unit was recorded, and no
/// lease began before the one before it could last write.
fn check_grants(s: &Snapshot) {
    let mut by_unit: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for g in &s.grants {
        by_unit.entry(g.unit).or_default().push(g);
    }
    let mut takeovers = 0;
    for u in &s.units {
        let mut gs = by_unit.remove(&u.n).unwrap_or_default();
        gs.sort_by_key(|g| g.lease);
        let leases: BTreeSet<u64> = gs.iter().map(|g| g.lease).collect();
        assert_eq!(
            leases,
            (1..=u.lease).collect(),
            "unit {}: every lease granted is recorded",
            u.n
        );
        for pair in gs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                b.granted_ms >= a.until_ms,
                "unit {}: lease {} ({}) granted at {} while lease {} ({}) could write until {}",
                u.n,
                b.lease,
                b.owner,
                b.granted_ms,
                a.lease,
                a.owner,
                a.until_ms
            );
            if !a.released {
                takeovers += 1;
            }
        }
    }
    assert!(takeovers >= 2, "the killed workers' units were taken over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_units_and_another_worker_resumes_each_item_counted_once() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        ..
    } = Orders::start(seed(1200)).await;
    let ctl = env.table_name("ctl");
    let url = format!("dynamodb://{ctl}");
    // The migration id defaults to the plan's target table.
    let at = FleetRef::parse(&url, &target).unwrap();
    let fleet = Fleet::new(ControlTable::new(&env.clients, &ctl), at, "test");
    let plan_s = plan_path.to_str().unwrap();
    let dir = env.dir.path().to_path_buf();
    let args = |w: &str, rate: &str| -> Vec<String> {
        [
            "worker",
            plan_s,
            "--state",
            &url,
            "--worker-id",
            w,
            "--segments",
            "6",
            "--page-size",
            "30",
            "--write-rate",
            rate,
            "--lease-seconds",
            LEASE_SECONDS,
            "--json",
            "--state-dir",
        ]
        .iter()
        .map(|x| x.to_string())
        .chain([dir.join(w).to_str().unwrap().to_string()])
        .collect()
    };
    let first = args("a", "150");
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let child = env.spawn(&first);
    wait_for(&fleet, "a's first commit", |s| has_committed(s, "a")).await;
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let out = wait_output(child).await;
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));

    // Released at once: no owner left, every grant of `a` ended, `a` stopped.
    let s = snapshot(&fleet).await;
    assert!(
        s.units.iter().all(|u| u.owner.is_none() || u.done),
        "{:?}",
        s.units
    );
    assert!(
        s.grants
            .iter()
            .all(|g| g.released || s.units[g.unit as usize].done)
    );
    assert_eq!(
        s.workers.iter().find(|w| w.id == "a").unwrap().state,
        "stopped"
    );
    assert!(s.totals().scanned > 0 && !s.all_done(), "stopped mid-way");

    // status shows the fleet, without key values.
    let out = env.rekey(&["status", plan_s, "--state", &url, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["segments"], 6);
    assert_eq!(st["workers"][0]["id"], "a");
    assert!(
        !stdout(&out).contains("O#"),
        "no key values: {}",
        stdout(&out)
    );

    // A worker with another plan is refused (exit 1, as a local resume under a
    // changed plan is); the same plan resumes.
    let (other_path, _) = orders_by_status(&source, &target)
        .rule(Rule::new(&[("PK", "Z#{z}")], &[("PK", "Z"), ("SK", "{z}")]))
        .write(&env);
    let out = env.rekey(&[
        "worker",
        other_path.to_str().unwrap(),
        "--state",
        &url,
        "--state-dir",
        dir.join("c").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("plan differs"), "{}", stderr(&out));
    let (plan_path, _) = orders_by_status(&source, &target).write(&env);
    assert_eq!(plan_path.to_str().unwrap(), plan_s, "the plan is back");

    let second = args("b", "2000");
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let out = env.rekey(&second);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(report(&out)["backfill_done"], true);
    let s = snapshot(&fleet).await;
    let t = s.totals();
    assert_eq!(
        t.scanned, 1200,
        "every item counted once across the stop: {t:?}"
    );
    assert_eq!(t.written, 1200);
    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0)
    );
}

/// The plan of [`Orders`] proves that a target key determines its source key
/// (`O#{id}` is held whole in `SK`): two workers and a live writer, and not one
/// `CLAIM#` item in the control table — the claims were one conditional write
/// per item, for collisions that cannot happen — yet the target converges
/// exactly, with the tail beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injective_plan_claims_nothing_in_the_control_table_and_converges_exactly() {
    let Orders {
        env,
        source,
        target,
        plan,
        plan_path,
        state,
    } = Orders::start(seed(1500)).await;
    assert_eq!(rekey::core::inverse::key_injective(&plan), Ok(()));
    let (fleet, url, ctl) = control_table(&env, "inj");
    let plan_s = plan_path.to_str().unwrap();
    // The tail captures first, from before any worker reads.
    let tail = fleet_tail(&env, plan_s, &state, &url).await;

    let dir = env.dir.path().to_path_buf();
    let start = |w: &str| {
        let local = dir.join(format!("state-{w}"));
        env.spawn(&[
            "worker",
            plan_s,
            "--state",
            &url,
            "--worker-id",
            w,
            "--segments",
            "8",
            "--page-size",
            "40",
            "--lease-seconds",
            LEASE_SECONDS,
            "--state-dir",
            local.to_str().unwrap(),
            "--json",
        ])
    };
    let app = writer(&env, source.clone(), 1500, 800, Rng::from_time().next());
    let fleet_run = async {
        let children = [("a", start("a")), ("b", start("b"))];
        let mut outs = Vec::new();
        for (id, child) in children {
            outs.push((id, wait_output(child).await));
        }
        outs
    };
    let (_, outs) = tokio::join!(app, fleet_run);
    let mut requests = 0;
    for (id, out) in &outs {
        assert!(out.status.success(), "{id}: {}", stderr(out));
        let r = report(out);
        assert_eq!(r["backfill_done"], true, "{id}: {r}");
        assert_eq!(r["claims"], false, "{id}: {r}");
        requests += r["control_calls"]["total"].as_u64().unwrap();
    }
    let out = wait_output(tail).await;
    assert!(out.status.success(), "tail: {}", stderr(&out));

    assert_eq!(
        target_vs_transform(&env, &plan, &source, &target).await,
        (0, 0, 0),
        "nothing lost, nothing extra, nothing stale"
    );
    let claims: Vec<Item> = env
        .scan_all(&ctl)
        .await
        .into_iter()
        .filter(|it| matches!(it.get("pk"), Some(rekey::core::value::Value::S(pk)) if pk.starts_with("CLAIM#")))
        .collect();
    assert!(
        claims.is_empty(),
        "no claim written: {} found",
        claims.len()
    );
    let s = snapshot(&fleet).await;
    assert!(s.all_done() && s.meta.as_ref().unwrap().done_ms.is_some());
    let t = s.totals();
    assert_eq!(t.scanned, t.written + t.rejected + t.skipped, "{t:?}");
    // Not 1,500: the writer deletes some items before the Scan reaches them.
    assert!(t.scanned > 0 && t.collisions == 0, "{t:?}");
    // The workers counted what they asked of the control table: at least
    // one commit per unit, and a read to find it.
    assert!(requests >= 2 * 8, "{requests} control-table requests");
}
