//! The model on a stepped clock: every number below follows from the rates,
//! the burst and the steps, so the bounds are tight and nothing sleeps.

use super::*;
use crate::keyspace::key_hash;
use crate::limits::throttle_body;
use serde_json::json;

const STEP: Duration = Duration::from_millis(100);
const HALF: u64 = 1 << 63;

/// Small numbers so a test's arithmetic is readable: 10 WCU/s and 30 RCU/s
/// a partition, 1 s of burst, no splits unless a test asks.
fn small(partitions: u32) -> PartitionOptions {
    PartitionOptions {
        mode: Mode::on_demand(),
        partitions: Some(partitions),
        partition_write: 10.0,
        partition_read: 30.0,
        burst_seconds: 1.0,
        split_after: Duration::from_secs(3600),
        ..PartitionOptions::default()
    }
}

fn hash(key: &str) -> u64 {
    key_hash(&json!({ "S": key }))
}

/// The first key `prefix{i}` whose hash lies in `range`.
fn key_in(prefix: &str, range: Range) -> u64 {
    (0..10_000)
        .map(|i| hash(&format!("{prefix}{i}")))
        .find(|&h| in_range(h, range))
        .expect("a key in every range")
}

/// Every `STEP` for `secs` from `from`, offers `per_step` one-unit writes
/// for each key in turn; returns the units admitted per key.
fn drive(
    m: &mut PartitionModel,
    keys: &[u64],
    per_step: usize,
    from: Instant,
    secs: u32,
) -> Vec<f64> {
    let mut admitted = vec![0.0; keys.len()];
    for step in 0..secs * 10 {
        let now = from + STEP * step;
        for _ in 0..per_step {
            for (i, &k) in keys.iter().enumerate() {
                if m.admit(Kind::Write, &[Charge::table("t", Some(k), 1.0)], now)
                    .is_ok()
                {
                    admitted[i] += 1.0;
                }
            }
        }
    }
    admitted
}

fn within(x: f64, lo: f64, hi: f64) {
    assert!((lo..=hi).contains(&x), "{x} not in {lo}..={hi}");
}

#[test]
fn a_partition_admits_its_rate_plus_its_burst_and_saves_no_more() {
    let mut m = PartitionModel::new(small(1));
    let t0 = Instant::now();
    // 20 WCU/s offered for 10 s: the full bucket (10) plus 10/s.
    let got = drive(&mut m, &[hash("a")], 2, t0, 10);
    within(got[0], 108.0, 111.0);
    // Idle for a minute: only one second of burst is kept.
    let later = t0 + Duration::from_secs(70);
    let burst = (0..100)
        .filter(|_| {
            m.admit(
                Kind::Write,
                &[Charge::table("t", Some(hash("a")), 1.0)],
                later,
            )
            .is_ok()
        })
        .count();
    assert_eq!(burst, 10);
    let refused = m
        .admit(
            Kind::Write,
            &[Charge::table("t", Some(hash("a")), 1.0)],
            later,
        )
        .unwrap_err();
    assert_eq!(refused.reason, "TableWriteKeyRangeThroughputExceeded");
    assert_eq!(refused.exception, "ProvisionedThroughputExceededException");
    assert_eq!(
        refused.resource,
        "arn:aws:dynamodb:us-east-1:000000000000:table/t"
    );
    // Reads have their own limit (30 RCU/s) and reason.
    let read = |m: &mut PartitionModel| {
        m.admit(
            Kind::Read,
            &[Charge::table("t", Some(hash("a")), 1.0)],
            later,
        )
    };
    assert_eq!((0..40).filter(|_| read(&mut m).is_ok()).count(), 30);
    assert_eq!(
        read(&mut m).unwrap_err().reason,
        "TableReadKeyRangeThroughputExceeded"
    );
    assert!(m.splits().is_empty(), "one key's heat never splits");
}

#[test]
fn keys_in_one_partition_share_its_limit_keys_in_two_each_get_one() {
    let (first, second) = (equal_ranges(2)[0], equal_ranges(2)[1]);
    let (a, b, c) = (key_in("a", first), key_in("b", first), key_in("c", second));
    let t0 = Instant::now();

    let mut m = PartitionModel::new(small(2));
    let shared = drive(&mut m, &[a, b], 2, t0, 10);
    // Together they get one limit (which of them gets it is the order of
    // arrival: `a` asks first each step).
    within(shared[0] + shared[1], 108.0, 111.0);

    let mut m = PartitionModel::new(small(2));
    let apart = drive(&mut m, &[a, c], 2, t0, 10);
    within(apart[0], 108.0, 111.0);
    within(apart[1], 108.0, 111.0);
}

#[test]
fn adaptive_capacity_borrows_unused_table_capacity_up_to_one_partitions_limit() {
    // 20 WCU/s provisioned over 4 partitions: a share of 5 each.
    let opts = PartitionOptions {
        mode: Mode::Provisioned {
            write: 20.0,
            read: 60.0,
        },
        ..small(4)
    };
    let t0 = Instant::now();
    let hot = hash("hot");

    // 30 WCU/s offered to one partition: it borrows the table's unused 15,
    // but only up to its own hard limit of 10.
    let mut m = PartitionModel::new(opts.clone());
    let got = drive(&mut m, &[hot], 3, t0, 10);
    within(got[0], 108.0, 111.0);

    // Without adaptive capacity it keeps to its share.
    let mut m = PartitionModel::new(PartitionOptions {
        adaptive: false,
        ..opts.clone()
    });
    let got = drive(&mut m, &[hot], 3, t0, 10);
    within(got[0], 53.0, 56.0);

    // What it borrows is what the table has unused: with a second hot
    // partition the table's 20 WCU/s (and 20 of burst) is all there is.
    let mut m = PartitionModel::new(opts);
    let other = key_in("other", equal_ranges(4)[(m_part(hot, 4) + 1) % 4]);
    let got = drive(&mut m, &[hot, other], 3, t0, 10);
    within(got[0] + got[1], 216.0, 221.0);
    let refused = m
        .admit(
            Kind::Write,
            &[Charge::table("t", Some(hash("third")), 1.0)],
            t0 + STEP * 99,
        )
        .unwrap_err();
    assert_eq!(refused.reason, "TableWriteProvisionedThroughputExceeded");
    assert_eq!(refused.exception, "ProvisionedThroughputExceededException");
}

/// The partition of `n` equal ones that holds `hash`.
fn m_part(hash: u64, n: u32) -> usize {
    equal_ranges(n)
        .iter()
        .position(|&r| in_range(hash, r))
        .unwrap()
}

/// One partition, two keys (one in each half of the ring) offered 10 WCU/s
/// each, split after 5 s hot: the model at the split, and its time.
fn split_once() -> (PartitionModel, Instant, [u64; 2]) {
    let mut m = PartitionModel::new(PartitionOptions {
        split_after: Duration::from_secs(5),
        ..small(1)
    });
    let keys = [key_in("a", (0, Some(HALF))), key_in("b", (HALF, None))];
    let t0 = Instant::now();
    let before = drive(&mut m, &keys, 1, t0, 5);
    within(before[0] + before[1], 58.0, 61.0);
    assert!(m.splits().is_empty(), "hot for less than 5 s");
    drive(&mut m, &keys, 1, t0 + Duration::from_secs(5), 1);
    (m, t0, keys)
}

#[test]
fn a_sustained_hot_partition_splits_in_halves_and_each_half_gets_a_full_limit() {
    let (mut m, t0, keys) = split_once();
    // The first window [0 s, 1 s) was hot; at 5 s it had been hot for 5 s.
    let expected = Split {
        table: "t".into(),
        index: None,
        parent: (0, None),
        children: [(0, Some(HALF)), (HALF, None)],
        at: t0 + Duration::from_secs(5),
    };
    assert_eq!(m.splits(), [expected]);
    assert_eq!(m.partitions("t", None), [(0, Some(HALF)), (HALF, None)]);

    // Each key now has a partition of its own: all of its 10 WCU/s fits,
    // 200 WCU in 10 s where one partition would admit 110 at most.
    let after = drive(&mut m, &keys, 1, t0 + Duration::from_secs(6), 10);
    within(after[0], 99.0, 100.0);
    within(after[1], 99.0, 100.0);
    assert_eq!(
        m.splits().len(),
        1,
        "a partition hot with one key does not split"
    );
}

#[test]
fn one_hot_key_gets_one_partitions_limit_however_often_the_table_split() {
    let (mut m, t0, keys) = split_once();
    // 50 WCU/s for one key for 10 s: its half's 10/s, from an empty bucket.
    let got = drive(&mut m, &keys[..1], 5, t0 + Duration::from_secs(6), 10);
    within(got[0], 98.0, 101.0);
    assert_eq!(m.splits().len(), 1);
}

#[test]
fn a_full_gsi_partition_refuses_the_base_write_with_the_index_reason() {
    let mut m = PartitionModel::new(small(8));
    let t0 = Instant::now();
    // Items spread over the table, all with the same GSI key: the index
    // partition fills first (10 WCU), the base partitions have room.
    let open = hash("OPEN");
    let put = |i: u32| {
        Charge::table("t", Some(hash(&format!("item{i}"))), 1.0).and_index("by_status", open)
    };
    let results: Vec<_> = (0..11)
        .map(|i| m.admit(Kind::Write, &[put(i)], t0))
        .collect();
    assert!(results[..10].iter().all(Result::is_ok));
    let refused = results[10].clone().unwrap_err();
    assert_eq!(refused.reason, "IndexWriteKeyRangeThroughputExceeded");
    assert_eq!(refused.exception, "ProvisionedThroughputExceededException");
    assert_eq!(
        refused.resource,
        "arn:aws:dynamodb:us-east-1:000000000000:table/t/index/by_status"
    );
    assert_eq!(
        m.stats.write_units, 10.0,
        "the refused base write took nothing"
    );
    assert_eq!(m.partitions("t", Some("by_status")).len(), 8);
    // A put the index does not hold (no GSI key) still fits the base table.
    let sparse = Charge::table("t", Some(hash("item99")), 1.0);
    assert!(m.admit(Kind::Write, &[sparse], t0).is_ok());
}

#[test]
fn the_on_demand_maximum_answers_throttling_exception() {
    let mut m = PartitionModel::new(PartitionOptions {
        mode: Mode::OnDemand {
            max_write: Some(5.0),
            max_read: None,
            warm_write: 40.0,
            warm_read: 120.0,
        },
        partitions: None,
        ..small(1)
    });
    let t0 = Instant::now();
    let put = |i: u32| Charge::table("t", Some(hash(&format!("k{i}"))), 1.0);
    assert!((0..5).all(|i| m.admit(Kind::Write, &[put(i)], t0).is_ok()));
    assert_eq!(
        m.partitions("t", None).len(),
        4,
        "sized from warm throughput"
    );
    let refused = m.admit(Kind::Write, &[put(5)], t0).unwrap_err();
    assert_eq!(refused.reason, "TableWriteMaxOnDemandThroughputExceeded");
    assert_eq!(refused.exception, "ThrottlingException");
    let body: serde_json::Value = serde_json::from_str(&refused.body()).unwrap();
    assert_eq!(
        body["__type"],
        "com.amazonaws.dynamodb.v20120810#ThrottlingException"
    );
    assert_eq!(
        body["throttlingReasons"][0]["reason"],
        "TableWriteMaxOnDemandThroughputExceeded"
    );
}

#[test]
fn provisioned_throughput_answers_provisioned_throughput_exceeded() {
    let mut m = PartitionModel::new(PartitionOptions {
        mode: Mode::Provisioned {
            write: 3.0,
            read: 3.0,
        },
        partitions: None,
        ..small(1)
    });
    let t0 = Instant::now();
    assert_eq!(
        m.partitions("t", None),
        [] as [Range; 0],
        "created on first use"
    );
    let put = |i: u32| Some(Charge::table("t", Some(hash(&format!("k{i}"))), 1.0));
    let (admitted, first) = m.admit_each(
        Kind::Write,
        [put(0), None, put(1), put(2), put(3), put(4)],
        t0,
    );
    assert_eq!(admitted, [true, true, true, true, false, false]);
    let refused = first.unwrap();
    assert_eq!(refused.reason, "TableWriteProvisionedThroughputExceeded");
    assert_eq!(refused.exception, "ProvisionedThroughputExceededException");
    assert_eq!(m.partitions("t", None).len(), 1, "3 WCU need one partition");

    // A scan is charged after the fact; the next is refused while in debt.
    assert!(m.scan_allowed("t", t0).is_ok());
    m.charge_scan("t", 10.0, t0);
    let refused = m
        .scan_allowed("t", t0 + Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(refused.reason, "TableReadProvisionedThroughputExceeded");
    assert!(m.scan_allowed("t", t0 + Duration::from_secs(4)).is_ok());
}

#[test]
fn the_key_limiters_refusals_keep_their_words() {
    let r = Refused {
        table: "orders".into(),
        reason: "TableWriteKeyRangeThroughputExceeded",
    };
    assert_eq!(Throttle::from(r.clone()).body(), throttle_body(&r));
}

#[test]
fn ranges_halve_until_one_position_is_left() {
    assert_eq!(halve((0, None)), Some([(0, Some(HALF)), (HALF, None)]));
    assert_eq!(halve((4, Some(8))), Some([(4, Some(6)), (6, Some(8))]));
    assert_eq!(halve((u64::MAX, None)), None);
    assert_eq!(halve((5, Some(6))), None);
}
