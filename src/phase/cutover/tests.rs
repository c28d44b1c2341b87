//! The gates on evidence written by hand: each fails on its own evidence,
//! in both directions and for a fleet.

use std::path::PathBuf;
use std::time::Duration;

use super::evidence::{Evidence, FleetEvidence, FleetTail};
use super::gates::gates;
use super::*;
use crate::state::fleet::Counters;
use crate::state::fleet::shard::ShardUnit;
use crate::state::snapshot::{TailStatus, VerifyResult};

fn opts() -> CutoverOptions {
    CutoverOptions {
        state_dir: StateDir::new("s"),
        max_lag: 5.0,
        max_verify_age: Duration::from_secs(3600),
        accept_rejects: false,
        postpone_file: PathBuf::from("s/postpone"),
        wait: Duration::ZERO,
        drain_timeout: Duration::from_secs(1),
        fleet: None,
    }
}

fn ready(now: chrono::DateTime<chrono::Utc>) -> Evidence {
    Evidence {
        flow: Flow::Forward,
        cut_over: false,
        cut_over_at: None,
        backfill_done: true,
        backfill: None,
        tail: Some(TailStatus {
            updated_at: now,
            lag_seconds: Some(0.4),
            applied_through: Some(now),
            ..Default::default()
        }),
        tail_running: true,
        verify: Some(verify_result(true, now - chrono::Duration::seconds(60))),
        rejects: 0,
        fleet: None,
    }
}

fn verify_result(clean: bool, finished_at: chrono::DateTime<chrono::Utc>) -> VerifyResult {
    VerifyResult {
        source_table: "a".into(),
        target_table: "b".into(),
        plan_fingerprint: "f".into(),
        started_at: finished_at,
        finished_at,
        clean,
        sample_percent: None,
        reverse: false,
        counts: Default::default(),
    }
}

fn failing(g: &[Gate]) -> Vec<String> {
    g.iter().filter(|g| !g.ok).map(|g| g.name.clone()).collect()
}

#[test]
fn a_rollback_needs_a_cutover_and_the_reverse_tail_caught_up() {
    let now = chrono::Utc::now();
    let back = Evidence {
        flow: Flow::Reverse,
        cut_over: true,
        cut_over_at: Some(now - chrono::Duration::seconds(120)),
        backfill_done: false,
        verify: Some(VerifyResult {
            reverse: true,
            ..verify_result(true, now - chrono::Duration::seconds(60))
        }),
        ..ready(now)
    };
    assert!(failing(&gates(&back, &opts(), now)).is_empty());
    let none = Evidence {
        cut_over: false,
        ..back.clone()
    };
    assert_eq!(failing(&gates(&none, &opts(), now)), ["cut over"]);
    let behind = Evidence {
        tail: Some(TailStatus {
            updated_at: now,
            lag_seconds: Some(60.0),
            ..Default::default()
        }),
        ..back
    };
    assert_eq!(
        failing(&gates(&behind, &opts(), now)),
        ["reverse tail caught up"]
    );
}

#[test]
fn a_rollback_needs_a_reverse_verify_started_after_the_cutover() {
    let now = chrono::Utc::now();
    let verified = |reverse, secs_ago| {
        Some(VerifyResult {
            reverse,
            ..verify_result(true, now - chrono::Duration::seconds(secs_ago))
        })
    };
    let back = Evidence {
        flow: Flow::Reverse,
        cut_over: true,
        cut_over_at: Some(now - chrono::Duration::seconds(120)),
        ..ready(now)
    };
    for (reverse, secs_ago, ok) in [(true, 60, true), (false, 60, false), (true, 300, false)] {
        let e = Evidence {
            verify: verified(reverse, secs_ago),
            ..back.clone()
        };
        let g = gates(&e, &opts(), now);
        assert_eq!(
            failing(&g).is_empty(),
            ok,
            "reverse {reverse}, {secs_ago} s ago: {g:?}"
        );
    }
    // A cutover's gate takes either direction.
    let e = Evidence {
        verify: verified(false, 60),
        ..ready(now)
    };
    assert!(failing(&gates(&e, &opts(), now)).is_empty());
}

#[test]
fn every_gate_holds_on_a_ready_migration() {
    let now = chrono::Utc::now();
    assert!(failing(&gates(&ready(now), &opts(), now)).is_empty());
}

#[test]
fn each_gate_fails_on_its_own_evidence() {
    let now = chrono::Utc::now();
    let mut e = ready(now);
    e.backfill_done = false;
    assert_eq!(failing(&gates(&e, &opts(), now)), ["backfill complete"]);

    let mut e = ready(now);
    e.tail.as_mut().unwrap().lag_seconds = Some(9.0);
    assert_eq!(failing(&gates(&e, &opts(), now)), ["tail caught up"]);
    let mut e = ready(now);
    e.tail_running = false;
    assert_eq!(failing(&gates(&e, &opts(), now)), ["tail caught up"]);
    let later = now + chrono::Duration::seconds(45);
    let e = ready(now);
    assert!(
        failing(&gates(&e, &opts(), later)).contains(&"tail caught up".to_string()),
        "stale status"
    );

    let mut e = ready(now);
    e.verify = Some(verify_result(false, now));
    assert_eq!(failing(&gates(&e, &opts(), now)), ["clean verify"]);
    let e = ready(now);
    let much_later = now + chrono::Duration::seconds(7200);
    let f = failing(&gates(&e, &opts(), much_later));
    assert!(f.contains(&"clean verify".to_string()), "too old: {f:?}");

    let mut e = ready(now);
    e.rejects = 3;
    assert_eq!(failing(&gates(&e, &opts(), now)), ["no unresolved rejects"]);
    let accept = CutoverOptions {
        accept_rejects: true,
        ..opts()
    };
    assert!(failing(&gates(&e, &accept, now)).is_empty());
}

#[test]
fn with_its_own_tail_a_fleet_cutover_gates_on_the_shards_not_on_a_local_tail() {
    let now = chrono::Utc::now();
    let tail = FleetTail {
        open: 2,
        unheld: 0,
        buffering: 0,
        lag: Some(1.0),
    };
    let with = |t: FleetTail| Evidence {
        tail: None,
        tail_running: false,
        fleet: Some(FleetEvidence {
            tail: Some(t),
            ..Default::default()
        }),
        ..ready(now)
    };
    let g = gates(&with(tail.clone()), &opts(), now);
    assert!(failing(&g).is_empty(), "no local tail needed: {g:?}");
    for (t, why) in [
        (
            FleetTail {
                unheld: 1,
                ..tail.clone()
            },
            "no holder",
        ),
        (
            FleetTail {
                buffering: 1,
                ..tail.clone()
            },
            "still buffer",
        ),
        (
            FleetTail {
                lag: Some(9.0),
                ..tail.clone()
            },
            "lag 9.0 s >",
        ),
        (
            FleetTail {
                lag: None,
                ..tail.clone()
            },
            "lag unknown",
        ),
    ] {
        let g = gates(&with(t), &opts(), now);
        assert_eq!(failing(&g), ["tail caught up"], "{g:?}");
        assert!(g[1].detail.contains(why), "{g:?}");
    }
}

#[test]
fn the_fleet_tail_is_read_from_the_shards_units() {
    use crate::state::fleet::shard::ShardCheckpoint;
    let unit = |id: &str, owner: Option<&str>, cp: ShardCheckpoint| ShardUnit {
        id: id.into(),
        // "old" is done, the parent of a: a child of a done shard.
        parent: (id == "a").then(|| "old".to_string()),
        owner: owner.map(str::to_string),
        lease: 1,
        beat: 0,
        page: 0,
        cp,
        first_apply_ms: None,
        done_ms: None,
        grants: vec![],
        barriers: Default::default(),
        rejected: 0,
    };
    assert_eq!(FleetTail::of(&[], 100.0), None);
    let live = |r: f64| ShardCheckpoint {
        live: true,
        record_at: Some(r),
        ..Default::default()
    };
    let done = ShardCheckpoint {
        done: true,
        ..Default::default()
    };
    let t = FleetTail::of(
        &[
            unit("a", Some("w1"), live(90.0)),
            unit("b", Some("w2"), live(97.0)),
            unit("old", None, done),
            unit("c", None, ShardCheckpoint::default()),
        ],
        100.0,
    )
    .unwrap();
    assert_eq!(
        t,
        FleetTail {
            open: 3,
            unheld: 1,
            buffering: 1,
            lag: Some(10.0),
        }
    );
}

#[test]
fn a_fleet_cutover_gates_on_the_fleets_backfill_rejects_and_a_verify_after_it() {
    let now = chrono::Utc::now();
    let fleet = FleetEvidence {
        at: "dynamodb://ctl/m".into(),
        totals: Counters {
            scanned: 10,
            written: 8,
            rejected: 2,
            ..Default::default()
        },
        export: None,
        verify_before_done: false,
        tail: None,
    };
    let e = Evidence {
        rejects: 2,
        fleet: Some(fleet.clone()),
        ..ready(now)
    };
    let g = gates(&e, &opts(), now);
    assert!(
        g[0].ok && g[0].detail.contains("fleet dynamodb://ctl/m"),
        "{g:?}"
    );
    assert!(
        !g[3].ok && g[3].detail.contains("the fleet's units"),
        "{g:?}"
    );
    let accepted = CutoverOptions {
        accept_rejects: true,
        ..opts()
    };
    assert!(gates(&e, &accepted, now).iter().all(|g| g.ok));
    // From an export: the gate names it and the time of its data.
    let from_export = Evidence {
        fleet: Some(FleetEvidence {
            export: Some("export 01-a at s3://b/p, data as of 2026-12-01T00:00:00.000Z".into()),
            ..fleet.clone()
        }),
        ..e.clone()
    };
    let g = gates(&from_export, &opts(), now);
    assert!(
        g[0].ok
            && g[0]
                .detail
                .contains("(from export 01-a at s3://b/p, data as of 2026-12-01"),
        "{g:?}"
    );
    // A verify that started before the backfill was done proves nothing.
    let early = Evidence {
        fleet: Some(FleetEvidence {
            verify_before_done: true,
            ..fleet
        }),
        ..e
    };
    let g = gates(&early, &accepted, now);
    assert!(
        !g[2].ok && g[2].detail.contains("before its backfill"),
        "{g:?}"
    );
}
