use std::time::Duration;

use super::*;

const ARN: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2026-01-01T00:00:00.000";

fn opts() -> StreamsOptions {
    StreamsOptions {
        upstream: "http://unused".into(),
        ..StreamsOptions::default()
    }
}

fn model(o: StreamsOptions) -> Model {
    let mut m = Model::new(&o);
    m.add_stream(ARN, "PK", 0);
    m
}

fn rec(pk: &str, v: u32, size: u64) -> Json {
    json!({"eventID": format!("{pk}-{v}"), "eventName": "MODIFY", "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1", "dynamodb": {"Keys": {"PK": {"S": pk}},
        "NewImage": {"PK": {"S": pk}, "v": {"N": v.to_string()}},
        "ApproximateCreationDateTime": 1_767_225_600.75, "SequenceNumber": "1", "SizeBytes": size,
        "StreamViewType": "NEW_AND_OLD_IMAGES"}})
}

/// (shard id, parent, ending sequence number) of every listed shard.
fn shards(m: &mut Model, now: Ms) -> Vec<(String, Option<String>, Option<String>)> {
    let (list, last) = m.describe(ARN, None, None, now).unwrap();
    assert!(last.is_none());
    list.iter()
        .map(|s| {
            (
                s["ShardId"].as_str().unwrap().to_string(),
                s["ParentShardId"].as_str().map(str::to_string),
                s["SequenceNumberRange"]["EndingSequenceNumber"]
                    .as_str()
                    .map(str::to_string),
            )
        })
        .collect()
}

fn horizon(m: &mut Model, shard: &str, now: Ms) -> String {
    m.shard_iterator(ARN, shard, "TRIM_HORIZON", None, now)
        .unwrap()
}

/// Reads a shard to its end or until an empty page: records, next iterator.
fn read(m: &mut Model, it: &str, now: Ms) -> (Vec<Json>, Option<String>) {
    let out = m.get_records(it, None, now).unwrap();
    let next = out["NextShardIterator"].as_str().map(str::to_string);
    (out["Records"].as_array().unwrap().clone(), next)
}

fn v(r: &Json) -> u64 {
    r["dynamodb"]["NewImage"]["v"]["N"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn pages_are_cut_at_the_limit_at_1000_records_and_at_1_mb() {
    let mut m = model(opts());
    for i in 0..1500 {
        m.ingest(ARN, rec("a", i, 100), 0);
    }
    let id = shards(&mut m, 0)[0].0.clone();
    let it = horizon(&mut m, &id, 0);
    let out = m.get_records(&it, Some(7), 0).unwrap();
    assert_eq!(out["Records"].as_array().unwrap().len(), 7);
    let (page, next) = read(&mut m, &it, 0);
    assert_eq!(page.len(), 1000);
    let (page, next) = read(&mut m, &next.unwrap(), 0);
    assert_eq!(page.len(), 500);
    assert_eq!(v(&page[0]), 1000);
    assert!(read(&mut m, &next.unwrap(), 0).0.is_empty());

    let mut m = model(opts());
    for i in 0..10 {
        m.ingest(ARN, rec("a", i, 300_000), 0);
    }
    let id = id_of(&mut m);
    let it = horizon(&mut m, &id, 0);
    let (page, _) = read(&mut m, &it, 0);
    assert_eq!(page.len(), 3, "3 × 300 KB fit in 1 MB, 4 do not");
    assert!(
        m.get_records(&it, Some(0), 0).is_err(),
        "Limit 0 is refused"
    );
}

fn id_of(m: &mut Model) -> String {
    shards(m, 0)[0].0.clone()
}

#[test]
fn sequence_numbers_are_long_decimal_unique_and_increasing_per_shard() {
    let mut m = model(StreamsOptions {
        partitions: 4,
        ..opts()
    });
    for i in 0..200 {
        m.ingest(ARN, rec(&format!("k{}", i % 13), i, 10), 0);
    }
    let mut all = std::collections::BTreeSet::new();
    for (id, _, _) in shards(&mut m, 0) {
        let it = horizon(&mut m, &id, 0);
        let (page, _) = read(&mut m, &it, 0);
        let seqs: Vec<u128> = page
            .iter()
            .map(|r| {
                let s = r["dynamodb"]["SequenceNumber"].as_str().unwrap();
                assert!(s.len() >= 21, "{s}");
                s.parse().unwrap()
            })
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]));
        all.extend(seqs);
    }
    assert_eq!(all.len(), 200);
}

#[test]
fn an_item_stays_in_one_shard_in_order_whatever_the_delays() {
    let mut m = model(StreamsOptions {
        partitions: 8,
        delay_min: Duration::ZERO,
        delay_max: Duration::from_secs(6),
        ..opts()
    });
    for i in 0..400 {
        m.ingest(ARN, rec(&format!("k{}", i % 17), i, 10), u64::from(i) * 10);
    }
    // Read every shard at several times: a shard never shows a record
    // before an earlier one of its own.
    let ids: Vec<String> = shards(&mut m, 0).into_iter().map(|s| s.0).collect();
    let mut seen: HashMapVec = Default::default();
    for id in &ids {
        let mut it = horizon(&mut m, id, 0);
        for now in (0..12_000).step_by(500) {
            let (page, next) = read(&mut m, &it, now);
            for r in page {
                let pk = r["dynamodb"]["Keys"]["PK"]["S"]
                    .as_str()
                    .unwrap()
                    .to_string();
                seen.entry(pk).or_default().push((v(&r), id.clone()));
            }
            it = next.unwrap();
        }
    }
    let total: usize = seen.values().map(Vec::len).sum();
    assert_eq!(total, 400);
    for (pk, writes) in seen {
        assert!(
            writes.windows(2).all(|w| w[0].0 < w[1].0),
            "{pk} out of order"
        );
        assert!(
            writes.iter().all(|w| w.1 == writes[0].1),
            "{pk} in two shards"
        );
    }
}

type HashMapVec = std::collections::HashMap<String, Vec<(u64, String)>>;

#[test]
fn records_are_readable_only_after_their_shards_delay() {
    let mut m = model(StreamsOptions {
        delay_min: Duration::from_secs(2),
        delay_max: Duration::from_secs(2),
        ..opts()
    });
    m.ingest(ARN, rec("a", 1, 10), 1000);
    let id = id_of(&mut m);
    let it = horizon(&mut m, &id, 1000);
    let (page, next) = read(&mut m, &it, 2999);
    assert!(page.is_empty());
    assert_eq!(m.counters.empty_pending, 1);
    let (page, _) = read(&mut m, &next.unwrap(), 3000);
    assert_eq!(page.len(), 1);
}

#[test]
fn empty_runs_hold_the_position_and_end() {
    let mut m = model(StreamsOptions {
        empty_run_ratio: 1.0,
        empty_run_max: 3,
        seed: 5,
        ..opts()
    });
    for i in 0..5 {
        m.ingest(ARN, rec("a", i, 10), 0);
    }
    let id = id_of(&mut m);
    let mut it = horizon(&mut m, &id, 0);
    let mut got = Vec::new();
    let mut run = 0;
    while got.len() < 5 {
        let (page, next) = read(&mut m, &it, 0);
        it = next.expect("an open shard always gives a next iterator");
        if page.is_empty() {
            run += 1;
            assert!(run <= 3, "a run is at most empty_run_max calls");
        } else {
            assert!(run >= 1, "ratio 1: every position starts with a run");
            run = 0;
            got.extend(page.iter().map(v));
        }
    }
    assert_eq!(got, vec![0, 1, 2, 3, 4]);
    assert!(m.counters.empty_forced >= 1);
}

#[test]
fn rollover_closes_the_shard_and_opens_one_child_listed_late() {
    let mut m = model(StreamsOptions {
        rollover_every: Some(Duration::from_secs(100)),
        describe_delay: Duration::from_secs(5),
        ..opts()
    });
    m.ingest(ARN, rec("a", 1, 10), 0);
    let parent = id_of(&mut m);
    let it = horizon(&mut m, &parent, 0);
    // Jitter ±25 %: rolled over by 125 s.
    m.ingest(ARN, rec("a", 2, 10), 126_000);
    assert_eq!(m.counters.rollovers, 1);
    let listed = shards(&mut m, 126_000);
    assert_eq!(listed.len(), 1, "the child is not listed yet");
    assert!(listed[0].2.is_some(), "the parent is closed");
    let listed = shards(&mut m, 131_000);
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].1.as_deref(), Some(parent.as_str()));
    let (page, next) = read(&mut m, &it, 131_000);
    assert_eq!(page.iter().map(v).collect::<Vec<_>>(), vec![1]);
    assert!(next.is_none(), "the parent is read to its end");
    let it = horizon(&mut m, &listed[1].0, 131_000);
    let (page, next) = read(&mut m, &it, 131_000);
    assert_eq!(page.iter().map(v).collect::<Vec<_>>(), vec![2]);
    assert!(next.is_some(), "the child is open");
}

#[test]
fn a_closed_shard_with_pending_records_is_not_at_its_end() {
    let mut m = model(StreamsOptions {
        delay_min: Duration::from_secs(3),
        delay_max: Duration::from_secs(3),
        ..opts()
    });
    m.ingest(ARN, rec("a", 1, 10), 0);
    let parent = id_of(&mut m);
    assert!(m.split(ARN, 0, 0));
    let it = horizon(&mut m, &parent, 0);
    let (page, next) = read(&mut m, &it, 1000);
    assert!(page.is_empty());
    let (page, next) = read(&mut m, &next.expect("records pending"), 3000);
    assert_eq!(page.len(), 1);
    assert!(next.is_none());
}

#[test]
fn split_halves_the_range_and_isolate_carves_one_hash() {
    let mut m = model(StreamsOptions {
        partitions: 2,
        ..opts()
    });
    assert!(m.split(ARN, 1, 0));
    assert!(!m.split(ARN, 7, 0));
    let listed = shards(&mut m, 0);
    assert_eq!(listed.len(), 4);
    assert!(listed[1].2.is_some());
    assert_eq!(listed[2].1, Some(listed[1].0.clone()));
    assert_eq!(listed[3].1, Some(listed[1].0.clone()));
    assert_eq!(m.counters.splits, 1);

    let hot = json!({"S": "hot"});
    assert!(m.isolate(ARN, key_hash(&hot), 0));
    assert!(!m.isolate(ARN, key_hash(&hot), 0), "already alone");
    for i in 0..50 {
        m.ingest(ARN, rec(&format!("k{i}"), i, 10), 0);
    }
    m.ingest(ARN, rec("hot", 99, 10), 0);
    let alone: Vec<_> = m.streams[ARN]
        .shards
        .iter()
        .filter(|s| s.range.1 == s.range.0.checked_add(1))
        .collect();
    assert_eq!(alone.len(), 1);
    assert_eq!(alone[0].records.len(), 1, "no other key reaches it");
    assert_eq!(v(&alone[0].records[0].json), 99);
}

#[test]
fn describe_pages_by_exclusive_start_shard_id() {
    let mut m = model(StreamsOptions {
        partitions: 5,
        ..opts()
    });
    let (page, last) = m.describe(ARN, None, Some(2), 0).unwrap();
    assert_eq!(page.len(), 2);
    let last = last.unwrap();
    assert_eq!(page[1]["ShardId"], json!(last));
    let (page2, last2) = m.describe(ARN, Some(&last), Some(2), 0).unwrap();
    let (page3, last3) = m.describe(ARN, last2.as_deref(), Some(2), 0).unwrap();
    assert_eq!((page2.len(), page3.len()), (2, 1));
    assert!(last3.is_none());
    assert!(m.describe(ARN, None, Some(101), 0).is_err());
}

#[test]
fn iterators_expire_after_their_ttl() {
    let mut m = model(StreamsOptions {
        iterator_ttl: Duration::from_secs(900),
        ..opts()
    });
    let id = id_of(&mut m);
    let it = horizon(&mut m, &id, 0);
    let (_, next) = read(&mut m, &it, 899_000);
    let e = m.get_records(&it, None, 900_001).unwrap_err();
    assert_eq!(e.kind, "ExpiredIteratorException");
    assert!(
        m.get_records(&next.unwrap(), None, 900_001).is_ok(),
        "a NextShardIterator is issued fresh"
    );
}

#[test]
fn records_past_retention_are_trimmed() {
    let mut m = model(StreamsOptions {
        retention: Duration::from_secs(100),
        ..opts()
    });
    m.ingest(ARN, rec("a", 1, 10), 0);
    m.ingest(ARN, rec("a", 2, 10), 50_000);
    let id = id_of(&mut m);
    let old = horizon(&mut m, &id, 60_000);
    let (page, _) = read(&mut m, &old, 60_000);
    let first = page[0]["dynamodb"]["SequenceNumber"]
        .as_str()
        .unwrap()
        .to_string();
    let e = m.get_records(&old, None, 100_000).unwrap_err();
    assert_eq!(e.kind, "TrimmedDataAccessException");
    let e = m
        .shard_iterator(ARN, &id, "AT_SEQUENCE_NUMBER", Some(&first), 100_000)
        .unwrap_err();
    assert_eq!(e.kind, "TrimmedDataAccessException");
    let it = horizon(&mut m, &id, 100_000);
    let (page, _) = read(&mut m, &it, 100_000);
    assert_eq!(page.iter().map(v).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn iterator_types_position_as_dynamodb_does() {
    let mut m = model(opts());
    for i in 0..3 {
        m.ingest(ARN, rec("a", i, 10), 0);
    }
    let id = id_of(&mut m);
    let it = horizon(&mut m, &id, 0);
    let (page, _) = read(&mut m, &it, 0);
    let seq1 = page[1]["dynamodb"]["SequenceNumber"]
        .as_str()
        .unwrap()
        .to_string();
    let at = m
        .shard_iterator(ARN, &id, "AT_SEQUENCE_NUMBER", Some(&seq1), 0)
        .unwrap();
    assert_eq!(
        read(&mut m, &at, 0).0.iter().map(v).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let after = m
        .shard_iterator(ARN, &id, "AFTER_SEQUENCE_NUMBER", Some(&seq1), 0)
        .unwrap();
    assert_eq!(
        read(&mut m, &after, 0).0.iter().map(v).collect::<Vec<_>>(),
        vec![2]
    );
    let latest = m.shard_iterator(ARN, &id, "LATEST", None, 0).unwrap();
    m.ingest(ARN, rec("a", 3, 10), 0);
    assert_eq!(
        read(&mut m, &latest, 0).0.iter().map(v).collect::<Vec<_>>(),
        vec![3]
    );
    let e = m
        .shard_iterator(ARN, "shardId-nope", "TRIM_HORIZON", None, 0)
        .unwrap_err();
    assert_eq!(e.kind, "ResourceNotFoundException");
}

#[test]
fn creation_time_is_rounded_down_to_the_second() {
    let mut m = model(opts());
    m.ingest(ARN, rec("a", 1, 10), 0);
    let id = id_of(&mut m);
    let it = horizon(&mut m, &id, 0);
    let (page, _) = read(&mut m, &it, 0);
    assert_eq!(
        page[0]["dynamodb"]["ApproximateCreationDateTime"],
        json!(1_767_225_600)
    );
}

#[test]
fn iterators_round_trip() {
    let it = Iter {
        arn: ARN.into(),
        shard: "shardId-1".into(),
        pos: FIRST_SEQ + 5,
        issued: 42,
        run: Some(2),
    };
    assert_eq!(Iter::decode(&it.encode()), Some(it.clone()));
    let it = Iter { run: None, ..it };
    assert_eq!(Iter::decode(&it.encode()), Some(it));
    assert_eq!(Iter::decode("garbage"), None);
}
