//! The stand-in is faithful where rekey depends on it, through the real AWS
//! SDK clients (retries off, so every throttle is seen): segmented Scan,
//! throttled BatchWriteItem (compared with the proxy's answers), the stream,
//! and target reads as transform(source).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials};
use aws_sdk_dynamodb::types::{
    AttributeValue as AV, KeysAndAttributes, PutRequest, ReturnConsumedCapacity, WriteRequest,
};
use aws_sdk_dynamodbstreams::types::{OperationType, ShardIteratorType};
use rekey::aws::{from_sdk_item, to_sdk_item};
use rekey::core::transform::{Outcome, transform};
use rekey::core::value::{Item, Value, item_size};
use rekey_testkit::limits::Limits;
use rekey_testkit::proxy::{Proxy, ProxyOptions};
use rekey_testkit::standin::items::Generator;
use rekey_testkit::standin::{Standin, StandinOptions};

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

async fn dynamodb(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config(endpoint).await)
}

async fn streams(endpoint: &str) -> aws_sdk_dynamodbstreams::Client {
    aws_sdk_dynamodbstreams::Client::new(&sdk_config(endpoint).await)
}

fn s(v: &str) -> AV {
    AV::S(v.to_string())
}

#[tokio::test]
async fn segmented_scan_returns_every_item_once_across_segments_and_pages() {
    let n = 3001;
    let mut opts = StandinOptions::new(n);
    opts.item_bytes = 1500; // ~700 items fill a 1 MB page
    let standin = Standin::start(opts).await.unwrap();
    let c = dynamodb(&standin.endpoint()).await;
    let model = standin.model();

    let table = c
        .describe_table()
        .table_name("orders")
        .send()
        .await
        .unwrap();
    let t = table.table().unwrap();
    assert_eq!(t.item_count(), Some(n as i64));
    assert_eq!(
        t.latest_stream_arn(),
        Some(model.stream_arn().as_str()),
        "the source has a stream"
    );
    let target = c
        .describe_table()
        .table_name("orders_by_shard")
        .send()
        .await
        .unwrap();
    assert!(target.table().unwrap().latest_stream_arn().is_none());
    let missing = c
        .describe_table()
        .table_name("nope")
        .send()
        .await
        .unwrap_err();
    assert!(
        missing
            .into_service_error()
            .is_resource_not_found_exception()
    );

    let mut seen: BTreeMap<u64, Item> = BTreeMap::new();
    let (mut pages, mut full_pages) = (0, 0);
    for (segments, limit) in [(3, None), (4, Some(250))] {
        seen.clear();
        for segment in 0..segments {
            let mut start = None;
            loop {
                let out = c
                    .scan()
                    .table_name("orders")
                    .segment(segment)
                    .total_segments(segments)
                    .set_limit(limit)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .unwrap();
                pages += 1;
                let items: Vec<Item> = out
                    .items()
                    .iter()
                    .map(|i| from_sdk_item(i.clone()).unwrap())
                    .collect();
                assert_eq!(out.count() as usize, items.len());
                assert_eq!(out.scanned_count() as usize, items.len());
                let bytes: usize = items.iter().map(item_size).sum();
                assert!(bytes <= 1024 * 1024, "1 MB pages");
                if let Some(l) = limit {
                    assert!(items.len() <= l as usize);
                } else if out.last_evaluated_key().is_some() {
                    full_pages += 1;
                    assert!(bytes + 1500 > 1024 * 1024, "a page stops at 1 MB: {bytes}");
                }
                let units = out.consumed_capacity().unwrap().capacity_units().unwrap();
                assert_eq!(units, (bytes.div_ceil(4096).max(1) as f64) / 2.0);
                for item in items {
                    let i = Generator::index_of_key(&item).unwrap();
                    assert_eq!(item, model.source_item(i));
                    assert!(seen.insert(i, item).is_none(), "item {i} twice");
                }
                match out.last_evaluated_key() {
                    Some(k) => start = Some(k.clone()),
                    None => break,
                }
            }
        }
        assert_eq!(seen.len() as u64, n, "{segments} segments, limit {limit:?}");
        assert_eq!(
            seen.keys().copied().collect::<Vec<_>>(),
            (0..n).collect::<Vec<_>>()
        );
    }
    assert!(full_pages >= 3, "{full_pages} pages cut by size");
    let stats = standin.stats();
    assert_eq!(stats.scanned_items, 2 * n);
    assert_eq!(stats.requests["Scan"], pages);
}

/// Posts one DynamoDB request over a raw connection: the whole answer, head included.
async fn raw_post(endpoint: &str, op: &str, body: &str) -> String {
    let addr = endpoint.trim_start_matches("http://").to_string();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: DynamoDB_20120810.{op}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // Blocking I/O off the runtime's thread, which serves the answer.
    tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    })
    .await
    .unwrap()
}

/// What one service answered to the same requests.
#[derive(Debug, PartialEq)]
struct Seen {
    consumed: f64,
    unprocessed: Vec<String>,
    throttle: (Option<String>, Vec<(String, String)>),
    put_body: String,
}

#[tokio::test]
async fn batch_write_over_a_per_key_limit_is_answered_as_the_proxy_answers() {
    // 10 WCU of burst that refills at 0.01 WCU/s: the same admissions
    // however slow this machine is.
    let limits = Limits {
        key_write: 0.01,
        burst: 1000.0,
        ..Limits::unlimited()
    };
    let mut limited = StandinOptions::new(10);
    limited.limits = Some(limits);
    let standin = Standin::start(limited).await.unwrap();
    // The proxy, limiting the same way, in front of an unlimited stand-in.
    let upstream = Standin::start(StandinOptions::new(10)).await.unwrap();
    let proxy = Proxy::start(ProxyOptions {
        key_write_units: 0.01,
        burst_seconds: 1000.0,
        ..ProxyOptions::pass_through(&upstream.endpoint())
    })
    .await
    .unwrap();

    let batch = |prefix: &str| -> Vec<WriteRequest> {
        (0..25)
            .map(|i| {
                let put = PutRequest::builder()
                    .item("PK", s("one"))
                    .item("SK", s(&format!("{prefix}{i:02}")))
                    .build()
                    .unwrap();
                WriteRequest::builder().put_request(put).build()
            })
            .collect()
    };
    let mut seen = Vec::new();
    for endpoint in [standin.endpoint(), proxy.endpoint()] {
        let c = dynamodb(&endpoint).await;
        let out = c
            .batch_write_item()
            .request_items("orders_by_shard", batch("a"))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .unwrap();
        let consumed = out.consumed_capacity()[0].capacity_units().unwrap();
        let unprocessed = out.unprocessed_items().unwrap()["orders_by_shard"]
            .iter()
            .map(|w| {
                w.put_request().unwrap().item()["SK"]
                    .as_s()
                    .unwrap()
                    .clone()
            })
            .collect();
        // Nothing fits now: the whole batch is refused.
        let e = c
            .batch_write_item()
            .request_items("orders_by_shard", batch("b"))
            .send()
            .await
            .unwrap_err();
        let e = e.into_service_error();
        let aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemError::ProvisionedThroughputExceededException(x) = e else {
            panic!("expected a throttle, got {e:?}");
        };
        let reasons = x
            .throttling_reasons()
            .iter()
            .map(|r| {
                (
                    r.reason().unwrap().to_string(),
                    r.resource().unwrap().to_string(),
                )
            })
            .collect();
        let put = r#"{"TableName":"orders_by_shard","Item":{"PK":{"S":"one"},"SK":{"S":"z"}}}"#;
        let answer = raw_post(&endpoint, "PutItem", put).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        assert!(
            answer
                .to_lowercase()
                .contains("\r\nx-amzn-errortype: provisionedthroughputexceededexception\r\n")
        );
        seen.push(Seen {
            consumed,
            unprocessed,
            throttle: (x.message().map(str::to_string), reasons),
            put_body: answer.split("\r\n\r\n").nth(1).unwrap().to_string(),
        });
    }
    assert_eq!(seen[0], seen[1], "the stand-in answers as the proxy does");
    assert_eq!(seen[0].consumed, 10.0);
    assert_eq!(seen[0].unprocessed.len(), 15);
    assert_eq!(
        seen[0].throttle.1,
        [(
            "TableWriteKeyRangeThroughputExceeded".to_string(),
            "arn:aws:dynamodb:us-east-1:000000000000:table/orders_by_shard".to_string()
        )]
    );
    assert_eq!(
        seen[0].put_body,
        r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.","ThrottlingReasons":[{"reason":"TableWriteKeyRangeThroughputExceeded","resource":"arn:aws:dynamodb:us-east-1:000000000000:table/orders_by_shard"}]}"#
    );
    let stats = standin.stats();
    assert_eq!(stats.written_items, 10);
    assert_eq!(stats.write_units, 10.0);
    assert_eq!(
        (stats.throttled_requests, stats.throttled_items),
        (3, 15 + 25 + 1)
    );
    assert_eq!(proxy.stats().write_units, 10.0);
    assert_eq!(
        stats
            .windows
            .iter()
            .map(|w| w.throttled_requests)
            .sum::<u64>(),
        3
    );
}

#[tokio::test]
async fn get_records_returns_every_record_once_in_order_per_shard() {
    let mut opts = StandinOptions::new(100);
    opts.shards = 3;
    opts.stream_records = 2500;
    let standin = Standin::start(opts).await.unwrap();
    let model = standin.model();
    let c = streams(&standin.endpoint()).await;
    let arn = model.stream_arn();

    // Two shards a page: the shard list is paginated.
    let mut shards = Vec::new();
    let mut start = None;
    loop {
        let out = c
            .describe_stream()
            .stream_arn(&arn)
            .limit(2)
            .set_exclusive_start_shard_id(start.take())
            .send()
            .await
            .unwrap();
        let d = out.stream_description().unwrap();
        assert_eq!(d.stream_view_type().unwrap().as_str(), "NEW_AND_OLD_IMAGES");
        for sh in d.shards() {
            assert!(
                sh.sequence_number_range()
                    .unwrap()
                    .ending_sequence_number()
                    .is_none(),
                "open"
            );
            shards.push(sh.shard_id().unwrap().to_string());
        }
        match d.last_evaluated_shard_id() {
            Some(last) => start = Some(last.to_string()),
            None => break,
        }
    }
    assert_eq!(shards.len(), 3);

    let mut all = BTreeSet::new();
    let mut events: HashMap<u64, Vec<Change>> = HashMap::new();
    let mut item_shard = HashMap::new();
    for (s, shard) in shards.iter().enumerate() {
        let mut it = c
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator
            .unwrap();
        let mut seqs: Vec<u128> = Vec::new();
        loop {
            let out = c
                .get_records()
                .shard_iterator(&it)
                .limit(300)
                .send()
                .await
                .unwrap();
            assert!(out.records().len() <= 300);
            for r in out.records() {
                let d = r.dynamodb().unwrap();
                assert!(d.approximate_creation_date_time().is_some());
                seqs.push(d.sequence_number().unwrap().parse().unwrap());
                let old = d.old_image().map(|i| streams_item(i.clone()));
                let new = d.new_image().map(|i| streams_item(i.clone()));
                let index =
                    Generator::index_of_key(old.as_ref().or(new.as_ref()).unwrap()).unwrap();
                assert!(index >= 100, "the stream's orders are new ones");
                assert_eq!(
                    *item_shard.entry(index).or_insert(s),
                    s,
                    "an item on one shard"
                );
                events
                    .entry(index)
                    .or_default()
                    .push((r.event_name().unwrap().clone(), old, new));
            }
            it = out.next_shard_iterator().unwrap().to_string();
            if out.records().is_empty() {
                break;
            }
        }
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "shard {s}: increasing"
        );
        assert_eq!(seqs.len() as u64, model.stream.shard_len(s as u32));
        for q in &seqs {
            assert!(all.insert(*q), "record {q} twice");
        }

        // Resume after, and at, a record in the middle; LATEST reads nothing.
        let mid = seqs[seqs.len() / 2].to_string();
        for (kind, first) in [
            (
                ShardIteratorType::AfterSequenceNumber,
                seqs[seqs.len() / 2 + 1],
            ),
            (ShardIteratorType::AtSequenceNumber, seqs[seqs.len() / 2]),
        ] {
            let it = c
                .get_shard_iterator()
                .stream_arn(&arn)
                .shard_id(shard)
                .shard_iterator_type(kind)
                .sequence_number(&mid)
                .send()
                .await
                .unwrap()
                .shard_iterator
                .unwrap();
            let out = c
                .get_records()
                .shard_iterator(&it)
                .limit(1)
                .send()
                .await
                .unwrap();
            let got: u128 = out.records()[0]
                .dynamodb()
                .unwrap()
                .sequence_number()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(got, first);
        }
        let latest = c
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard)
            .shard_iterator_type(ShardIteratorType::Latest)
            .send()
            .await
            .unwrap()
            .shard_iterator
            .unwrap();
        let out = c
            .get_records()
            .shard_iterator(&latest)
            .send()
            .await
            .unwrap();
        assert!(out.records().is_empty() && out.next_shard_iterator().is_some());
    }
    assert_eq!(all.len(), 2500);

    // Each item: INSERT, MODIFY, REMOVE in that order, images consistent.
    let (mut inserts, mut modifies, mut removes) = (0, 0, 0);
    for (index, changes) in &events {
        let base = model.source_item(*index);
        for (n, (kind, old, new)) in changes.iter().enumerate() {
            match (n, kind) {
                (0, OperationType::Insert) => {
                    inserts += 1;
                    assert_eq!((old.as_ref(), new.as_ref()), (None, Some(&base)));
                }
                (1, OperationType::Modify) => {
                    modifies += 1;
                    assert_eq!(old.as_ref(), Some(&base));
                    assert_eq!(
                        new.as_ref().unwrap()["status"],
                        Value::S("DELIVERED".into())
                    );
                }
                (2, OperationType::Remove) => {
                    removes += 1;
                    assert!(new.is_none());
                    assert_eq!(
                        old.as_ref().unwrap()["status"],
                        Value::S("DELIVERED".into())
                    );
                }
                other => panic!("item {index}: change {other:?}"),
            }
        }
    }
    assert_eq!(inserts + modifies + removes, 2500);
    assert_eq!(
        (inserts, modifies, removes),
        (900, 900, 700),
        "windows of 100 a shard"
    );
}

/// A record as read: its event and images (old, new).
type Change = (OperationType, Option<Item>, Option<Item>);

/// A stream image (the stand-in's items hold strings and numbers only).
fn streams_item(m: HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>) -> Item {
    use aws_sdk_dynamodbstreams::types::AttributeValue as A;
    m.into_iter()
        .map(|(k, v)| {
            let v = match v {
                A::S(s) => Value::S(s),
                A::N(n) => Value::N(n),
                other => panic!("{k}: unexpected {other:?}"),
            };
            (k, v)
        })
        .collect()
}

#[tokio::test]
async fn target_reads_are_the_transform_of_the_source() {
    let n = 1000;
    let mut opts = StandinOptions::new(n);
    opts.corrupt_every = Some(7);
    let plan = opts.plan.clone();
    let standin = Standin::start(opts).await.unwrap();
    let model = standin.model();
    let c = dynamodb(&standin.endpoint()).await;

    // What a correct backfill wrote, computed here from the source item.
    let expected = |i: u64| -> Item {
        let Outcome::Put { item, .. } = transform(&plan, &model.source_item(i)) else {
            panic!("item {i} is not copied");
        };
        item
    };
    let key_of = |item: &Item| -> Item {
        item.iter()
            .filter(|(k, _)| *k == "PK" || *k == "SK")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let indices: Vec<u64> = (0..n).step_by(9).take(100).collect();
    let mut keys: Vec<Item> = indices.iter().map(|&i| key_of(&expected(i))).collect();
    keys.push(Item::from([
        (
            "PK".to_string(),
            Value::S("TENANT#nobody#DAY#x#SHARD#00".into()),
        ),
        ("SK".to_string(), Value::S("ORDER#00000001".into())),
    ]));
    keys.remove(0);
    let ka = KeysAndAttributes::builder()
        .set_keys(Some(keys.iter().map(to_sdk_item).collect()))
        .build()
        .unwrap();
    let out = c
        .batch_get_item()
        .request_items("orders_by_shard", ka)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .unwrap();
    let got: Vec<Item> = out.responses().unwrap()["orders_by_shard"]
        .iter()
        .map(|i| from_sdk_item(i.clone()).unwrap())
        .collect();
    assert_eq!(got.len(), 99, "every key but the bogus one");
    let (mut same, mut corrupt) = (0, 0);
    for item in &got {
        let i = Generator::index_of_key(item).unwrap();
        assert_eq!(
            item.get("src_SK"),
            model.source_item(i).get("SK"),
            "the source key is kept"
        );
        if i.is_multiple_of(7) {
            corrupt += 1;
            assert_ne!(*item, expected(i));
            assert_eq!(item["status"], Value::S("CORRUPTED".into()));
        } else {
            same += 1;
            assert_eq!(*item, expected(i));
        }
    }
    assert!(same > 0 && corrupt > 0, "{same} / {corrupt}");
    let units: f64 = got
        .iter()
        .map(|i| item_size(i).div_ceil(4096).max(1) as f64 / 2.0)
        .sum();
    assert_eq!(out.consumed_capacity()[0].capacity_units(), Some(units));

    // The source, by key (verify's backward pass reads it).
    let src_keys: Vec<Item> = [3u64, 500, 999]
        .iter()
        .map(|&i| {
            let it = model.source_item(i);
            key_of(&it)
        })
        .collect();
    let ka = KeysAndAttributes::builder()
        .set_keys(Some(src_keys.iter().map(to_sdk_item).collect()))
        .consistent_read(true)
        .build()
        .unwrap();
    let out = c
        .batch_get_item()
        .request_items("orders", ka)
        .send()
        .await
        .unwrap();
    let mut got: Vec<Item> = out.responses().unwrap()["orders"]
        .iter()
        .map(|i| from_sdk_item(i.clone()).unwrap())
        .collect();
    got.sort_by_key(Generator::index_of_key);
    assert_eq!(got, [3u64, 500, 999].map(|i| model.source_item(i)));

    // A Scan of the target holds every item once, as transform(source) (or corrupt).
    let mut count = 0;
    let mut start = None;
    loop {
        let out = c
            .scan()
            .table_name("orders_by_shard")
            .limit(300)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .unwrap();
        for it in out.items() {
            let item = from_sdk_item(it.clone()).unwrap();
            let i = Generator::index_of_key(&item).unwrap();
            assert_eq!(i, count, "in index order");
            assert_eq!(Some(item), model.target_item(i));
            count += 1;
        }
        match out.last_evaluated_key() {
            Some(k) => start = Some(k.clone()),
            None => break,
        }
    }
    assert_eq!(count, n);
}
