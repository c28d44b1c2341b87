//! The stream front through the real AWS SDK streams client, over the local
//! server's stream: a reader that follows lineage gets every write once and
//! in order per item although records are spread over partitions, come
//! late, behind empty pages and across a split; with its knobs off the
//! front answers what the local server answers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue as AV, KeySchemaElement, KeyType, ProvisionedThroughput,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use aws_sdk_dynamodbstreams::Client as StreamsClient;
use aws_sdk_dynamodbstreams::types::{Record, ShardIteratorType};
use rekey::aws::error_chain;
use rekey::local::{LocalOptions, LocalServer};
use rekey_testkit::streams::{StreamsFront, StreamsOptions};
use serde_json::json;

const TABLE: &str = "orders";
/// The partition key value isolated before the last round of writes.
const HOT: u32 = 8;
/// Long enough for a slow CI machine, short enough to fail a hung reader.
const READ_DEADLINE: Duration = Duration::from_secs(60);

/// Unwraps an SDK answer, or fails with the error's chain.
fn ok<T, E: std::error::Error + 'static>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", error_chain(&e)))
}

/// Unwraps a front's answer, or fails with its chain.
fn must<T>(r: anyhow::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e:#}"))
}

async fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(rekey::aws::https_client())
        .endpoint_url(endpoint)
        .region("us-east-1")
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .retry_config(RetryConfig::disabled())
        .load()
        .await
}

/// The local server, a DynamoDB client to it, and `orders` (PK, SK) with a
/// NEW_AND_OLD_IMAGES stream, whose ARN is returned.
async fn setup() -> (LocalServer, aws_sdk_dynamodb::Client, String) {
    let server = ok(
        LocalServer::start(&LocalOptions::default()).await,
        "start the local server",
    );
    let db = aws_sdk_dynamodb::Client::new(&sdk_config(server.endpoint()).await);
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let key = |n: &str, t| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .unwrap()
    };
    let created = db
        .create_table()
        .table_name(TABLE)
        .attribute_definitions(attr("PK"))
        .attribute_definitions(attr("SK"))
        .key_schema(key("PK", KeyType::Hash))
        .key_schema(key("SK", KeyType::Range))
        .provisioned_throughput(
            ProvisionedThroughput::builder()
                .read_capacity_units(100)
                .write_capacity_units(100)
                .build()
                .unwrap(),
        )
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap(),
        )
        .send()
        .await;
    let arn = ok(created, "CreateTable")
        .table_description()
        .and_then(|t| t.latest_stream_arn())
        .expect("a stream ARN")
        .to_string();
    (server, db, arn)
}

fn s(v: &str) -> AV {
    AV::S(v.to_string())
}

/// Puts version `v` of item `i` (a MODIFY once the item exists).
async fn put(db: &aws_sdk_dynamodb::Client, i: u32, v: u32) {
    let r = db
        .put_item()
        .table_name(TABLE)
        .item("PK", s(&pk(i)))
        .item("SK", s(&format!("S#{i:03}")))
        .item("v", AV::N(v.to_string()))
        .item("pad", s(&"x".repeat(100)))
        .send()
        .await;
    ok(r, "PutItem");
}

/// Forty partition key values over two hundred items.
fn pk(i: u32) -> String {
    format!("P#{:02}", i % 40)
}

/// A write as its record shows it: (event, PK, SK, version).
type Write = (String, String, String, u32);

fn write_of(r: &Record) -> Write {
    let d = r.dynamodb().expect("a stream record");
    let image = d.new_image().or(d.old_image()).expect("an image");
    let text = |k: &str| match image.get(k) {
        Some(aws_sdk_dynamodbstreams::types::AttributeValue::S(s)) => s.clone(),
        Some(aws_sdk_dynamodbstreams::types::AttributeValue::N(n)) => n.clone(),
        _ => panic!("no {k} in a record's image"),
    };
    let event = r.event_name().expect("an event name").as_str().to_string();
    (event, text("PK"), text("SK"), text("v").parse().unwrap())
}

/// What a lineage-following reader saw.
#[derive(Default)]
struct Reading {
    /// Records in the order read.
    records: Vec<Record>,
    /// Shard of each record.
    shard_of: Vec<String>,
    /// Empty pages from an open shard after which the same shard gave records.
    empty_then_records: u32,
    /// Shards listed with a parent.
    children: u32,
}

struct ShardState {
    parent: Option<String>,
    iterator: Option<String>,
    finished: bool,
    empty_seen: bool,
}

/// Every shard of the stream, read as a DynamoDB Streams client must:
/// DescribeStream in pages, again and again (shards show late), a child only
/// once its parent is read to its end (no NextShardIterator), empty pages
/// not taken for an end. Stops when `expected` records have been read.
async fn read_all(streams: &StreamsClient, arn: &str, expected: usize) -> Reading {
    let mut shards: BTreeMap<String, ShardState> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut out = Reading::default();
    let start = Instant::now();
    while out.records.len() < expected {
        assert!(
            start.elapsed() < READ_DEADLINE,
            "read {} of {expected} records in {READ_DEADLINE:?}; shards: {:?}",
            out.records.len(),
            shards
                .iter()
                .map(|(id, s)| (id, s.finished))
                .collect::<Vec<_>>()
        );
        let mut from: Option<String> = None;
        loop {
            let page = streams
                .describe_stream()
                .stream_arn(arn)
                .limit(7)
                .set_exclusive_start_shard_id(from.clone())
                .send()
                .await;
            let page = ok(page, "DescribeStream");
            let desc = page.stream_description().expect("a description");
            for sh in desc.shards() {
                let id = sh.shard_id().unwrap().to_string();
                if shards.contains_key(&id) {
                    continue;
                }
                let parent = sh.parent_shard_id().map(str::to_string);
                if let Some(p) = &parent {
                    assert!(shards.contains_key(p), "{id} listed before its parent {p}");
                    out.children += 1;
                }
                order.push(id.clone());
                let state = ShardState {
                    parent,
                    iterator: None,
                    finished: false,
                    empty_seen: false,
                };
                shards.insert(id, state);
            }
            from = desc.last_evaluated_shard_id().map(str::to_string);
            if from.is_none() {
                break;
            }
        }
        let mut progressed = false;
        for id in &order {
            let ready = {
                let st = &shards[id];
                !st.finished && st.parent.as_ref().is_none_or(|p| shards[p].finished)
            };
            if !ready {
                continue;
            }
            progressed |= read_page(streams, arn, id, shards.get_mut(id).unwrap(), &mut out).await;
        }
        if !progressed {
            // Nothing readable yet: the front's delays are in time.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    out
}

/// One GetRecords on a shard; whether it gave records.
async fn read_page(
    streams: &StreamsClient,
    arn: &str,
    id: &str,
    st: &mut ShardState,
    out: &mut Reading,
) -> bool {
    let iterator = match st.iterator.take() {
        Some(it) => it,
        None => {
            let r = streams
                .get_shard_iterator()
                .stream_arn(arn)
                .shard_id(id)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await;
            ok(r, "GetShardIterator")
                .shard_iterator()
                .unwrap()
                .to_string()
        }
    };
    let page = streams
        .get_records()
        .shard_iterator(iterator)
        .limit(60)
        .send()
        .await;
    let page = ok(page, "GetRecords");
    let records = page.records();
    if records.is_empty() && page.next_shard_iterator().is_some() {
        st.empty_seen = true;
    } else if !records.is_empty() && st.empty_seen {
        out.empty_then_records += 1;
        st.empty_seen = false;
    }
    for r in records {
        out.records.push(r.clone());
        out.shard_of.push(id.to_string());
    }
    st.iterator = page.next_shard_iterator().map(str::to_string);
    st.finished = st.iterator.is_none();
    !records.is_empty()
}

#[tokio::test]
async fn a_lineage_following_reader_gets_every_write_once_in_order_per_item() {
    let (server, db, arn) = setup().await;
    let front = must(
        StreamsFront::start(StreamsOptions {
            upstream: server.endpoint().to_string(),
            partitions: 16,
            delay_min: Duration::ZERO,
            delay_max: Duration::from_millis(1500),
            empty_run_ratio: 0.3,
            empty_run_max: 3,
            describe_delay: Duration::from_millis(300),
            seed: 11,
            ..StreamsOptions::default()
        })
        .await,
        "start the front",
    );
    must(front.watch(&arn).await, "watch the stream");
    let mut expected: Vec<Write> = Vec::new();
    let item = |event: &str, i: u32, v: u32| (event.to_string(), pk(i), format!("S#{i:03}"), v);
    for i in 0..200 {
        put(&db, i, 0).await;
        expected.push(item("INSERT", i, 0));
    }
    // Taken by the pump before the split: the parents have records.
    must(front.sync().await, "sync");
    assert_eq!(front.split(3), 1);
    for v in 1..3 {
        if v == 2 {
            assert_eq!(front.isolate(&json!({"S": pk(HOT)})), 1);
        }
        for i in (0..200).filter(|i| v == 1 || i % 2 == 0) {
            put(&db, i, v).await;
            expected.push(item("MODIFY", i, v));
        }
    }
    let key = json!({"PK": {"S": pk(1)}, "SK": {"S": "S#001"}});
    assert!(must(front.ttl_delete(TABLE, &key).await, "ttl_delete"));
    expected.push(item("REMOVE", 1, 1));

    let streams = StreamsClient::new(&sdk_config(&front.endpoint()).await);
    let reading = read_all(&streams, &arn, expected.len()).await;

    let got: Vec<Write> = reading.records.iter().map(write_of).collect();
    let unique: HashSet<&Write> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "a write read twice");
    assert_eq!(unique, expected.iter().collect::<HashSet<_>>());
    let mut last: HashMap<(String, String), (u32, bool)> = HashMap::new();
    for (event, pk, sk, v) in &got {
        let removed = event == "REMOVE";
        if let Some(&(before, _)) = last.get(&(pk.clone(), sk.clone())) {
            assert!(
                before < *v || removed,
                "{pk}/{sk}: v{v} read after v{before}"
            );
        }
        last.insert((pk.clone(), sk.clone()), (*v, removed));
    }
    for r in &reading.records {
        let t = r
            .dynamodb()
            .unwrap()
            .approximate_creation_date_time()
            .unwrap();
        assert_eq!(
            t.subsec_nanos(),
            0,
            "ApproximateCreationDateTime in whole seconds"
        );
        let ttl = r.user_identity().is_some_and(|u| {
            u.r#type() == Some("Service") && u.principal_id() == Some("dynamodb.amazonaws.com")
        });
        assert_eq!(
            ttl,
            write_of(r).0 == "REMOVE",
            "only the TTL deletion is tagged"
        );
    }
    // The hot key's last writes are alone in their shard.
    let hot: HashSet<&String> = got
        .iter()
        .zip(&reading.shard_of)
        .filter(|(w, _)| w.1 == pk(HOT) && w.3 == 2)
        .map(|(_, shard)| shard)
        .collect();
    assert_eq!(hot.len(), 1);
    assert!(
        got.iter()
            .zip(&reading.shard_of)
            .all(|(w, shard)| !hot.contains(shard) || w.1 == pk(HOT))
    );

    let stats = front.stats();
    assert_eq!((stats.splits, stats.isolations), (1, 1));
    assert!(reading.children >= 3, "split and isolation children listed");
    assert_eq!(stats.records_pumped, expected.len() as u64);
    assert!(stats.per_shard.len() > 8, "{:?}", stats.per_shard);
    assert!(stats.empty_pages_forced > 0, "{stats:?}");
    assert!(stats.empty_pages_pending > 0, "{stats:?}");
    assert!(
        reading.empty_then_records > 0,
        "no empty page was followed by records of its shard"
    );
}

/// The id of the stream's one shard (the local server's, or a knob-free front's).
async fn only_shard(streams: &StreamsClient, arn: &str) -> String {
    let desc = ok(
        streams.describe_stream().stream_arn(arn).send().await,
        "DescribeStream",
    );
    let shards = desc.stream_description().unwrap().shards();
    assert_eq!(shards.len(), 1);
    shards[0].shard_id().unwrap().to_string()
}

/// Every record of the stream at `endpoint`'s one shard, to its current
/// end (an empty page: the local server and a knob-free front are fresh).
async fn read_one_shard(streams: &StreamsClient, arn: &str) -> Vec<Record> {
    let shard = only_shard(streams, arn).await;
    let it = streams
        .get_shard_iterator()
        .stream_arn(arn)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await;
    let mut it = ok(it, "GetShardIterator")
        .shard_iterator()
        .map(str::to_string);
    let mut out = Vec::new();
    while let Some(i) = it {
        let page = ok(
            streams
                .get_records()
                .shard_iterator(i)
                .limit(25)
                .send()
                .await,
            "GetRecords",
        );
        if page.records().is_empty() {
            break;
        }
        out.extend(page.records().iter().cloned());
        it = page.next_shard_iterator().map(str::to_string);
    }
    out
}

#[tokio::test]
async fn with_its_knobs_off_the_front_answers_what_the_local_server_answers() {
    let (server, db, arn) = setup().await;
    let front = must(
        StreamsFront::start(StreamsOptions {
            upstream: server.endpoint().to_string(),
            ..StreamsOptions::default()
        })
        .await,
        "start the front",
    );
    for i in 0..40 {
        put(&db, i, 0).await;
    }
    for i in (0..40).step_by(3) {
        put(&db, i, 1).await;
    }
    for i in (0..40).step_by(5) {
        let r = db
            .delete_item()
            .table_name(TABLE)
            .key("PK", s(&pk(i)))
            .key("SK", s(&format!("S#{i:03}")))
            .send()
            .await;
        ok(r, "DeleteItem");
    }
    let direct = StreamsClient::new(&sdk_config(server.endpoint()).await);
    let fronted = StreamsClient::new(&sdk_config(&front.endpoint()).await);
    let want = read_one_shard(&direct, &arn).await;
    let got = read_one_shard(&fronted, &arn).await;
    assert_eq!(want.len(), 40 + 14 + 8);
    assert_eq!(got.len(), want.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.event_id(), g.event_id());
        assert_eq!(w.event_name(), g.event_name());
        assert_eq!(w.event_source(), g.event_source());
        assert_eq!(w.aws_region(), g.aws_region());
        let (wd, gd) = (w.dynamodb().unwrap(), g.dynamodb().unwrap());
        assert_eq!(wd.keys(), gd.keys());
        assert_eq!(wd.new_image(), gd.new_image());
        assert_eq!(wd.old_image(), gd.old_image());
        assert_eq!(wd.size_bytes(), gd.size_bytes());
        assert_eq!(wd.stream_view_type(), gd.stream_view_type());
        let (wt, gt) = (
            wd.approximate_creation_date_time().unwrap(),
            gd.approximate_creation_date_time().unwrap(),
        );
        assert_eq!(wt.secs(), gt.secs(), "rounded down to the second");
    }
}

#[tokio::test]
async fn iterators_expire_records_trim_and_shards_roll_over_on_the_fronts_clock() {
    let (server, db, arn) = setup().await;
    let front = must(
        StreamsFront::start(StreamsOptions {
            upstream: server.endpoint().to_string(),
            retention: Duration::from_secs(3600),
            rollover_every: Some(Duration::from_secs(4 * 3600)),
            ..StreamsOptions::default()
        })
        .await,
        "start the front",
    );
    for i in 0..3 {
        put(&db, i, 0).await;
    }
    let streams = StreamsClient::new(&sdk_config(&front.endpoint()).await);
    let shard = only_shard(&streams, &arn).await;
    let iterator = |kind: ShardIteratorType, seq: Option<String>| {
        streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(&shard)
            .shard_iterator_type(kind)
            .set_sequence_number(seq)
            .send()
    };
    let it = ok(
        iterator(ShardIteratorType::TrimHorizon, None).await,
        "GetShardIterator",
    );
    let it = it.shard_iterator().unwrap().to_string();
    let page = ok(
        streams.get_records().shard_iterator(&it).send().await,
        "GetRecords",
    );
    assert_eq!(page.records().len(), 3);
    let first = page.records()[0]
        .dynamodb()
        .unwrap()
        .sequence_number()
        .unwrap()
        .to_string();

    front.advance(Duration::from_secs(15 * 60 + 1));
    let e = streams
        .get_records()
        .shard_iterator(&it)
        .send()
        .await
        .unwrap_err();
    assert!(e.into_service_error().is_expired_iterator_exception());

    front.advance(Duration::from_secs(3600));
    let e = iterator(ShardIteratorType::AtSequenceNumber, Some(first))
        .await
        .unwrap_err();
    assert!(e.into_service_error().is_trimmed_data_access_exception());
    let it = ok(
        iterator(ShardIteratorType::TrimHorizon, None).await,
        "GetShardIterator",
    );
    let page = ok(
        streams
            .get_records()
            .shard_iterator(it.shard_iterator().unwrap())
            .send()
            .await,
        "GetRecords",
    );
    assert!(page.records().is_empty(), "trimmed after retention");

    front.advance(Duration::from_secs(5 * 3600));
    let desc = ok(
        streams.describe_stream().stream_arn(&arn).send().await,
        "DescribeStream",
    );
    let shards = desc.stream_description().unwrap().shards();
    let parent = shards.iter().find(|s| s.shard_id() == Some(shard.as_str()));
    let parent = parent.expect("the rolled-over shard is still listed");
    assert!(
        parent
            .sequence_number_range()
            .unwrap()
            .ending_sequence_number()
            .is_some()
    );
    assert!(
        shards
            .iter()
            .any(|s| s.parent_shard_id() == Some(shard.as_str()))
    );
    assert!(front.stats().rollovers >= 1);
}

/// Readers that ask at once share the front's sync with the local server
/// (one sync per caller made a turn over many shards seconds long), and
/// still each see every write acknowledged before it asked.
#[tokio::test]
async fn concurrent_readers_each_see_every_write_acknowledged_before_they_asked() {
    let (server, db, arn) = setup().await;
    let front = must(
        StreamsFront::start(StreamsOptions {
            upstream: server.endpoint().to_string(),
            // Only the readers' own calls sync: the pump stays out of the way.
            pump_interval: Duration::from_secs(3600),
            ..StreamsOptions::default()
        })
        .await,
        "start the front",
    );
    let streams = StreamsClient::new(&sdk_config(&front.endpoint()).await);
    let shard = only_shard(&streams, &arn).await;
    let mut iterators = Vec::new();
    for _ in 0..16 {
        let it = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(&shard)
            .shard_iterator_type(ShardIteratorType::Latest)
            .send()
            .await;
        iterators.push(
            ok(it, "GetShardIterator")
                .shard_iterator()
                .unwrap()
                .to_string(),
        );
    }
    for round in 0..5 {
        put(&db, round, round).await;
        let asked: Vec<_> = (iterators.iter())
            .map(|it| tokio::spawn(streams.get_records().shard_iterator(it).limit(1000).send()))
            .collect();
        let mut pages = Vec::new();
        for a in asked {
            pages.push(a.await.expect("a reader"));
        }
        iterators.clear();
        for (reader, page) in pages.into_iter().enumerate() {
            let page = ok(page, "GetRecords");
            let got: Vec<Write> = page.records().iter().map(write_of).collect();
            assert_eq!(
                got.iter().map(|w| (w.1.clone(), w.3)).collect::<Vec<_>>(),
                vec![(pk(round), round)],
                "reader {reader}, round {round}"
            );
            iterators.push(page.next_shard_iterator().unwrap().to_string());
        }
    }
}
