//! `rekey demo`, small: it loads the skewed table, migrates it while its
//! application writes, cuts over, finishes, and prints the before/after as
//! one JSON object. Against the test environment's local server, through
//! its proxy, so every request the demo sends is strictly validated (the
//! demo starting a server of its own is `rekey demo` without
//! `--endpoint-url`, the same code as `TestEnv`'s `LocalServer::start`).

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_migrates_a_skewed_table_under_live_writes_and_says_so() {
    let env = TestEnv::start_local().await;
    let endpoint = env.endpoint();
    let args = [
        "demo",
        "--items",
        "1500",
        "--json",
        "--endpoint-url",
        &endpoint,
    ];
    let out = output(env.command(&args, &[])).await;
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(&out),
        stderr(&out)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("one JSON object expected ({e}): {}", stdout(&out)));

    assert_eq!(s["completed"], true, "{s:#}");
    assert_eq!(
        s["items_loaded"], 1600,
        "1,500 orders and 100 tenant profiles"
    );
    // Cut over and finished: both recorded.
    for at in ["cut_over_at", "finished_at"] {
        assert!(s[at].as_str().is_some_and(|t| !t.is_empty()), "{at}: {s:#}");
    }
    assert_eq!(s["verify_clean"], true, "{:#}", s["verify"]);

    // The backfill copied every item it found, with the application writing meanwhile.
    let b = &s["backfill"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    assert_eq!(
        n(&b["scanned"]),
        n(&b["written"]) + n(&b["rejected"]) + n(&b["skipped"]),
        "{b}"
    );
    assert_eq!((n(&b["rejected"]), n(&b["skipped"])), (0, 0), "{b}");
    assert!(n(&b["written"]) > 0, "{b}");

    // The application wrote, and the tail carried its writes.
    let a = &s["application"];
    assert!(
        n(&a["inserts"]) + n(&a["updates"]) + n(&a["deletes"]) > 0,
        "{a}"
    );
    assert!(
        n(&s["tail"]["puts"]) + n(&s["tail"]["deletes"]) > 0,
        "{}",
        s["tail"]
    );

    // The independent check: the target is the plan applied to the source.
    let c = &s["check"];
    assert_eq!(c["equal"], true, "{c}");
    assert_eq!(
        (n(&c["missing"]), n(&c["extra"]), n(&c["different"])),
        (0, 0, 0),
        "{c}"
    );
    assert_eq!(n(&c["target_items"]), n(&c["expected"]), "{c}");

    // The point of it all: the hottest key holds a smaller share in the new design.
    let share = |side: &str| s["hottest"][side]["item_share"].as_f64().unwrap();
    assert!(
        share("old") > share("new"),
        "old {} new {}",
        share("old"),
        share("new")
    );
    assert!(
        c["source_hottest_share"].as_f64() > c["target_hottest_share"].as_f64(),
        "{c}"
    );
    // Every phase is timed.
    let phases: Vec<&str> = s["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    for p in ["load", "analyze", "backfill", "verify", "cutover", "finish"] {
        assert!(phases.contains(&p), "{p} not in {phases:?}");
    }
}
