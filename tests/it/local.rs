//! Smoke tests of `local`: real moto servers. They fail (never skip) when
//! moto is missing: run scripts/install-deps first.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use rekey::local::{LocalError, LocalOptions, LocalServer};

use crate::support::client::{self as clients, create_plain_table};

async fn client(local: &LocalServer) -> Client {
    clients::dynamodb(local.endpoint()).await
}

/// A `pk`-keyed table.
async fn create_table(client: &Client, name: &str) {
    create_plain_table(client, name, &["pk"], false).await;
}

async fn table_names(client: &Client) -> Vec<String> {
    client
        .list_tables()
        .send()
        .await
        .unwrap()
        .table_names
        .unwrap_or_default()
}

/// True while `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X') | None
        ),
        Err(_) => false,
    }
}

fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
        .is_ok()
}

/// Polls until the process is gone and its port refuses connections.
fn wait_gone(pid: u32, port: u16, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let (is_alive, is_accepting) = (alive(pid), accepts(port));
        if !is_alive && !is_accepting {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "after {limit:?}: pid {pid} alive={is_alive}, port {port} accepting={is_accepting}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_side_by_side_and_drop_kills() {
    let opts = LocalOptions::default();
    let started = Instant::now();
    let (a, b) = tokio::join!(LocalServer::start(&opts), LocalServer::start(&opts));
    let (a, b) = (a.unwrap(), b.unwrap());
    eprintln!(
        "two instances ready in {:?}: {} (pid {}), {} (pid {})",
        started.elapsed(),
        a.endpoint(),
        a.pid(),
        b.endpoint(),
        b.pid()
    );
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    assert_eq!(a.endpoint(), format!("http://127.0.0.1:{}", a.port()));

    let (ca, cb) = (client(&a).await, client(&b).await);
    tokio::join!(create_table(&ca, "table-a"), create_table(&cb, "table-b"));
    assert_eq!(table_names(&ca).await, ["table-a"]);
    assert_eq!(table_names(&cb).await, ["table-b"]);

    let (pid, port) = (a.pid(), a.port());
    assert!(alive(pid));
    drop(a);
    let took = wait_gone(pid, port, Duration::from_secs(5)).unwrap();
    eprintln!("dropped instance gone after {took:?}");

    // The other one is unaffected.
    assert_eq!(table_names(&cb).await, ["table-b"]);
    let (pid, port) = (b.pid(), b.port());
    drop(b);
    wait_gone(pid, port, Duration::from_secs(5)).unwrap();
}

#[tokio::test]
async fn a_given_port_is_used() {
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = LocalOptions {
        port: Some(port),
        ..LocalOptions::default()
    };
    let started = Instant::now();
    let local = LocalServer::start(&opts).await.unwrap();
    eprintln!("one instance ready in {:?}", started.elapsed());
    assert_eq!(local.port(), port);
    assert_eq!(
        table_names(&client(&local).await).await,
        Vec::<String>::new()
    );

    // A second instance on the same port is refused up front (its readiness
    // probe would be answered by the first one).
    let err = LocalServer::start(&opts).await.unwrap_err();
    assert!(
        matches!(err, LocalError::PortInUse { port: p, .. } if p == port),
        "{err:?}"
    );
}

/// A fake install: `moto_server` with a `#!/bin/sh` line and `python3`
/// beside it holding `python`, so the launcher runs that instead of moto.
fn fake_install(name: &str, python: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rekey-fake-moto-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in [("moto_server", "#!/bin/sh\n"), ("python3", python)] {
        let p = dir.join(file);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

#[tokio::test]
async fn missing_install_is_not_installed() {
    let path = std::env::temp_dir().join(format!("no-moto-here-{}", std::process::id()));
    let opts = LocalOptions {
        server: Some(path.clone()),
        port: None,
    };
    let err = LocalServer::start(&opts).await.unwrap_err();
    let LocalError::NotInstalled { searched } = &err else {
        panic!("expected NotInstalled, got {err:?}");
    };
    assert_eq!(searched, &[path.display().to_string()]);
    let message = err.to_string();
    assert!(message.contains("scripts/install-deps"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");

    assert!(matches!(
        LocalServer::find_server(Some(Path::new("/nonexistent"))),
        Err(LocalError::NotInstalled { .. })
    ));
}

#[tokio::test]
async fn a_server_that_exits_is_reported_with_its_output() {
    let dir = fake_install(
        "exits",
        "#!/bin/sh\necho 'no module named moto' >&2\nexit 3\n",
    );
    let opts = LocalOptions {
        server: Some(dir.join("moto_server")),
        port: None,
    };
    let err = LocalServer::start(&opts).await.unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    let LocalError::Exited { status, output } = &err else {
        panic!("expected Exited, got {err:?}");
    };
    assert_eq!(status, "exit status: 3");
    assert!(output.contains("no module named moto"), "{err}");
}

#[test]
fn the_install_is_found() {
    let server: PathBuf = LocalServer::find_server(None).unwrap();
    assert!(server.ends_with("moto_server"), "{}", server.display());
}

const HELPER_ENV: &str = "LOCALLAUNCH_TEST_HELPER";

/// The helper's full name in the test binary, as `--exact` takes it.
const HELPER_TEST: &str = "local::owner_process_helper";

/// Not a test on its own: when `HELPER_ENV` is set, this is the body of the
/// subprocess that `the_server_dies_with_its_owner` starts and then ends.
#[test]
fn owner_process_helper() {
    let Ok(mode) = std::env::var(HELPER_ENV) else {
        return;
    };
    static KEEP: std::sync::OnceLock<LocalServer> = std::sync::OnceLock::new();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let local = runtime
        .block_on(LocalServer::start(&LocalOptions::default()))
        .unwrap();
    println!("SERVER pid={} port={}", local.pid(), local.port());
    // Statics are never dropped: `exit` leaves without killing it.
    let _ = KEEP.set(local);
    match mode.as_str() {
        "exit" => std::process::exit(0),
        _ => std::thread::sleep(Duration::from_secs(120)),
    }
}

/// Starts `owner_process_helper` in a subprocess; returns it and its server's
/// pid and port.
fn start_owner(mode: &str) -> (std::process::Child, u32, u16) {
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", HELPER_TEST, "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, mode)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(owner.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        // libtest prints "test local::owner_process_helper ... " before it.
        if let Some((_, rest)) = line.split_once("SERVER pid=") {
            let (pid, port) = rest.split_once(" port=").unwrap();
            return (owner, pid.parse().unwrap(), port.parse().unwrap());
        }
    }
    let status = owner.wait().unwrap();
    panic!("the helper process ended ({status}) without starting the local server");
}

#[test]
fn the_server_dies_with_its_owner() {
    // SIGKILLed owner: no destructor runs at all.
    let (mut owner, pid, port) = start_owner("sleep");
    assert!(alive(pid));
    owner.kill().unwrap();
    owner.wait().unwrap();
    let result = wait_gone(pid, port, Duration::from_secs(5));
    if result.is_err() {
        // Don't leave it behind if the test fails.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let took = result.unwrap();
    eprintln!("server of SIGKILLed owner gone after {took:?}");

    // Owner exits without dropping (the instance is in a static).
    let (mut owner, pid, port) = start_owner("exit");
    assert!(owner.wait().unwrap().success());
    let result = wait_gone(pid, port, Duration::from_secs(5));
    if result.is_err() {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    result.unwrap();
}

/// A client of the server's DynamoDB Streams.
async fn streams_client(local: &LocalServer) -> aws_sdk_dynamodbstreams::Client {
    clients::streams(local.endpoint()).await
}

/// A `pk`-keyed table with a NEW_AND_OLD_IMAGES stream; its stream ARN.
async fn table_with_stream(client: &Client, name: &str) -> String {
    create_plain_table(client, name, &["pk"], true)
        .await
        .expect("a stream ARN")
}

/// Every record of the stream's (one) shard, in order.
async fn records(
    streams: &aws_sdk_dynamodbstreams::Client,
    arn: &str,
) -> Vec<aws_sdk_dynamodbstreams::types::Record> {
    use aws_sdk_dynamodbstreams::types::ShardIteratorType;
    let desc = streams
        .describe_stream()
        .stream_arn(arn)
        .send()
        .await
        .unwrap();
    let shards = desc.stream_description().unwrap().shards();
    assert_eq!(shards.len(), 1, "moto keeps one shard per stream");
    let mut iterator = streams
        .get_shard_iterator()
        .stream_arn(arn)
        .shard_id(shards[0].shard_id().unwrap())
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .unwrap()
        .shard_iterator
        .unwrap();
    let mut all = Vec::new();
    loop {
        let page = streams
            .get_records()
            .shard_iterator(&iterator)
            .send()
            .await
            .unwrap();
        if page.records().is_empty() {
            return all;
        }
        all.extend(page.records().iter().cloned());
        iterator = page.next_shard_iterator.unwrap();
    }
}

fn av(s: &str) -> aws_sdk_dynamodb::types::AttributeValue {
    aws_sdk_dynamodb::types::AttributeValue::S(s.into())
}

/// What serve.py changes in moto's stream: one INSERT for an UpdateItem that
/// creates an item (moto records the bare key first), and no record for a
/// write that changes nothing (moto records a MODIFY with equal images).
#[tokio::test]
async fn the_stream_records_what_dynamodb_records() {
    use aws_sdk_dynamodbstreams::types::OperationType;
    let local = LocalServer::start(&LocalOptions::default()).await.unwrap();
    let (c, streams) = (client(&local).await, streams_client(&local).await);
    let arn = table_with_stream(&c, "t").await;
    let update = |v: &'static str| {
        c.update_item()
            .table_name("t")
            .key("pk", av("a"))
            .update_expression("SET v = :v")
            .expression_attribute_values(":v", av(v))
            .send()
    };
    update("1").await.unwrap(); // creates the item
    update("1").await.unwrap(); // changes nothing
    let put = c
        .put_item()
        .table_name("t")
        .item("pk", av("a"))
        .item("v", av("1"));
    put.send().await.unwrap(); // changes nothing
    update("2").await.unwrap();
    c.delete_item()
        .table_name("t")
        .key("pk", av("a"))
        .send()
        .await
        .unwrap();

    let seen: Vec<(OperationType, Option<String>, Option<String>)> = records(&streams, &arn)
        .await
        .iter()
        .map(|r| {
            let d = r.dynamodb().unwrap();
            let v = |img: Option<&std::collections::HashMap<_, _>>| {
                img.and_then(|i| i.get("v")).map(|v| match v {
                    aws_sdk_dynamodbstreams::types::AttributeValue::S(s) => s.clone(),
                    other => panic!("{other:?}"),
                })
            };
            (
                r.event_name().unwrap().clone(),
                v(d.old_image()),
                v(d.new_image()),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (OperationType::Insert, None, Some("1".into())),
            (OperationType::Modify, Some("1".into()), Some("2".into())),
            (OperationType::Remove, Some("2".into()), None),
        ]
    );
}

/// serve.py's lock: concurrent conditional increments of one counter never
/// both pass their check (DynamoDB applies each write to an item atomically),
/// and the stream holds every increment once, in order, with distinct
/// sequence numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_conditional_writes_are_atomic_and_recorded_in_order() {
    use aws_sdk_dynamodb::types::AttributeValue as AV;
    let local = LocalServer::start(&LocalOptions::default()).await.unwrap();
    let (c, streams) = (client(&local).await, streams_client(&local).await);
    let arn = table_with_stream(&c, "counter").await;
    c.put_item()
        .table_name("counter")
        .item("pk", av("n"))
        .item("n", AV::N("0".into()))
        .send()
        .await
        .unwrap();
    const WRITERS: usize = 8;
    const EACH: usize = 15;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let c = c.clone();
        tasks.spawn(async move {
            let mut done = 0;
            while done < EACH {
                let got = c
                    .get_item()
                    .table_name("counter")
                    .key("pk", av("n"))
                    .consistent_read(true)
                    .send()
                    .await
                    .unwrap();
                let AV::N(n) = &got.item().unwrap()["n"] else {
                    panic!("n is a number")
                };
                let n: u64 = n.parse().unwrap();
                let r = c
                    .update_item()
                    .table_name("counter")
                    .key("pk", av("n"))
                    .update_expression("SET n = :new")
                    .condition_expression("n = :old")
                    .expression_attribute_values(":old", AV::N(n.to_string()))
                    .expression_attribute_values(":new", AV::N((n + 1).to_string()))
                    .send()
                    .await;
                match r {
                    Ok(_) => done += 1,
                    Err(e)
                        if e.as_service_error()
                            .is_some_and(|e| e.is_conditional_check_failed_exception()) => {}
                    Err(e) => panic!(
                        "{}",
                        aws_smithy_types::error::display::DisplayErrorContext(&e)
                    ),
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let all = records(&streams, &arn).await;
    let total = WRITERS * EACH;
    assert_eq!(all.len(), 1 + total, "the insert and every increment, once");
    let mut last_seq: Option<u128> = None;
    for (i, r) in all.iter().enumerate() {
        let d = r.dynamodb().unwrap();
        let seq: u128 = d.sequence_number().unwrap().parse().unwrap();
        assert!(
            last_seq.is_none_or(|l| seq > l),
            "sequence numbers increase"
        );
        last_seq = Some(seq);
        let aws_sdk_dynamodbstreams::types::AttributeValue::N(n) = &d.new_image().unwrap()["n"]
        else {
            panic!("n is a number")
        };
        assert_eq!(n, &i.to_string(), "increments recorded in order");
    }
}

/// moto's own `moto_server`, without serve.py's changes: the reference the
/// fast paths are checked against. Killed on drop.
struct PlainMoto {
    child: std::process::Child,
    endpoint: String,
}

impl PlainMoto {
    fn start() -> PlainMoto {
        let server = LocalServer::find_server(None).expect("moto_server (scripts/install-deps)");
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let started = Instant::now();
        while !accepts(port) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "moto_server did not listen on {port} in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        PlainMoto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for PlainMoto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a Scan, paged and in segments, a Query, a BatchGetItem and a
/// DescribeTable answer, as comparable values.
async fn reads(client: &Client, table: &str) -> Vec<String> {
    use aws_sdk_dynamodb::types::{KeysAndAttributes, ReturnConsumedCapacity};
    let mut out = Vec::new();
    let item = |m: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
        format!("{:?}", rekey::aws::from_sdk_item(m.clone()))
    };
    for (segment, total, limit) in [
        (None, None, None),
        (Some(0), Some(3), Some(7)),
        (Some(2), Some(3), Some(5)),
    ] {
        let mut start = None;
        loop {
            let page = client
                .scan()
                .table_name(table)
                .set_segment(segment)
                .set_total_segments(total)
                .set_limit(limit)
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .unwrap();
            out.push(format!(
                "scan {segment:?}/{total:?}: count {} scanned {} capacity {:?} items {:?}",
                page.count,
                page.scanned_count,
                page.consumed_capacity
                    .as_ref()
                    .and_then(|c| c.capacity_units),
                page.items().iter().map(item).collect::<Vec<_>>()
            ));
            assert!(out.len() < 500, "Scan pages never end: {out:?}");
            match page.last_evaluated_key {
                Some(k) => {
                    out.push(format!("after {}", item(&k)));
                    start = Some(k);
                }
                None => break,
            }
        }
    }
    let q = client
        .query()
        .table_name(table)
        .key_condition_expression("pk = :p")
        .expression_attribute_values(":p", av("tenant-3"))
        .send()
        .await
        .unwrap();
    out.push(format!(
        "query {:?}",
        q.items().iter().map(item).collect::<Vec<_>>()
    ));
    let keys = (0..5u32).map(|i| {
        std::collections::HashMap::from([
            ("pk".to_string(), av(&format!("tenant-{i}"))),
            (
                "sk".to_string(),
                aws_sdk_dynamodb::types::AttributeValue::N(format!("{}", i * 7)),
            ),
        ])
    });
    let got = client
        .batch_get_item()
        .request_items(
            table,
            KeysAndAttributes::builder()
                .set_keys(Some(keys.collect()))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let mut batch: Vec<String> = got
        .responses
        .unwrap_or_default()
        .values()
        .flatten()
        .map(item)
        .collect();
    batch.sort();
    out.push(format!("batch get {batch:?}"));
    let d = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .unwrap();
    let t = d.table.unwrap();
    out.push(format!(
        "describe {:?} {:?} {:?}",
        t.item_count, t.key_schema, t.attribute_definitions
    ));
    out
}

/// serve.py makes moto faster in three places (the response serializer's
/// attribute lookup, Scan's sort, the backend lookup) and claims the answers
/// are unchanged: the same writes to serve.py's moto and to moto's own
/// `moto_server` read back the same, page by page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_paths_answer_as_moto_does() {
    let plain = PlainMoto::start();
    let ours = LocalServer::start(&LocalOptions::default()).await.unwrap();
    let mut answers = Vec::new();
    for endpoint in [plain.endpoint.as_str(), ours.endpoint()] {
        let c = clients::dynamodb(endpoint).await;
        c.create_table()
            .table_name("t")
            .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
            .set_key_schema(Some(vec![
                aws_sdk_dynamodb::types::KeySchemaElement::builder()
                    .attribute_name("pk")
                    .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                    .build()
                    .unwrap(),
                aws_sdk_dynamodb::types::KeySchemaElement::builder()
                    .attribute_name("sk")
                    .key_type(aws_sdk_dynamodb::types::KeyType::Range)
                    .build()
                    .unwrap(),
            ]))
            .set_attribute_definitions(Some(vec![
                aws_sdk_dynamodb::types::AttributeDefinition::builder()
                    .attribute_name("pk")
                    .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                    .build()
                    .unwrap(),
                aws_sdk_dynamodb::types::AttributeDefinition::builder()
                    .attribute_name("sk")
                    .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::N)
                    .build()
                    .unwrap(),
            ]))
            .send()
            .await
            .unwrap();
        // Numbers whose text order is not their numeric order; nested values.
        for i in 0..120u32 {
            c.put_item()
                .table_name("t")
                .item("pk", av(&format!("tenant-{}", i % 9)))
                .item(
                    "sk",
                    aws_sdk_dynamodb::types::AttributeValue::N(format!("{}", i * 7)),
                )
                .item(
                    "v",
                    aws_sdk_dynamodb::types::AttributeValue::N(format!("{}.5", i)),
                )
                .item(
                    "m",
                    aws_sdk_dynamodb::types::AttributeValue::M(std::collections::HashMap::from([
                        (
                            "l".to_string(),
                            aws_sdk_dynamodb::types::AttributeValue::L(vec![
                                av("x"),
                                av(&i.to_string()),
                            ]),
                        ),
                    ])),
                )
                .send()
                .await
                .unwrap();
        }
        answers.push(reads(&c, "t").await);
    }
    assert!(answers[0].len() > 20, "{:?}", answers[0]);
    for (n, (a, b)) in answers[0].iter().zip(&answers[1]).enumerate() {
        assert_eq!(a, b, "answer {n} differs");
    }
    assert_eq!(answers[0].len(), answers[1].len());
}

/// One TransactWriteItems' answer: Ok, or the error's code and message with
/// each cancellation reason.
#[derive(Debug, PartialEq)]
enum Answer {
    Ok,
    Err {
        code: Option<String>,
        message: Option<String>,
        reasons: Vec<Reason>,
    },
}

/// A cancellation reason: its code, message and item (ALL_OLD).
#[derive(Debug, PartialEq)]
struct Reason {
    code: Option<String>,
    message: Option<String>,
    item: Option<rekey::core::value::Item>,
}

async fn transact(
    client: &Client,
    actions: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
) -> Answer {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
    let err = match client
        .transact_write_items()
        .set_transact_items(Some(actions))
        .send()
        .await
    {
        Ok(_) => return Answer::Ok,
        Err(err) => err.into_service_error(),
    };
    let reasons = match &err {
        TransactWriteItemsError::TransactionCanceledException(c) => c
            .cancellation_reasons()
            .iter()
            .map(|r| Reason {
                code: r.code().map(String::from),
                message: r.message().map(String::from),
                item: r.item().cloned().and_then(rekey::aws::from_sdk_item),
            })
            .collect(),
        _ => Vec::new(),
    };
    Answer::Err {
        code: err.code().map(String::from),
        message: err.message().map(String::from),
        reasons,
    }
}

/// The item `pk`/`sk` = `k`/"x" with `v`.
fn tx_item(k: &str, v: &str) -> rekey::core::value::Item {
    use rekey::core::value::Value;
    ["pk", "sk", "v"]
        .into_iter()
        .zip([k, "x", v])
        .map(|(a, s)| (a.to_string(), Value::S(s.to_string())))
        .collect()
}

/// A Put of [`tx_item`] on "attribute_not_exists(pk)", asking for the item
/// on refusal when `all_old`.
fn tx_put(k: &str, v: &str, all_old: bool) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};
    let put = Put::builder()
        .table_name("t")
        .set_item(Some(rekey::aws::to_sdk_item(&tx_item(k, v))))
        .condition_expression("attribute_not_exists(pk)")
        .set_return_values_on_condition_check_failure(
            all_old.then_some(ReturnValuesOnConditionCheckFailure::AllOld),
        )
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

/// The key of `pk`/`sk` = `k`/"x".
fn tx_key(k: &str) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    std::collections::HashMap::from([("pk".to_string(), av(k)), ("sk".to_string(), av("x"))])
}

/// A Delete of `k` on "v = `v`", asking for the item on refusal.
fn tx_delete(k: &str, v: &str) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{Delete, ReturnValuesOnConditionCheckFailure, TransactWriteItem};
    let delete = Delete::builder()
        .table_name("t")
        .set_key(Some(tx_key(k)))
        .condition_expression("v = :v")
        .expression_attribute_values(":v", av(v))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
        .unwrap();
    TransactWriteItem::builder().delete(delete).build()
}

/// A ConditionCheck that `k` exists.
fn tx_exists(k: &str) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{ConditionCheck, TransactWriteItem};
    let check = ConditionCheck::builder()
        .table_name("t")
        .set_key(Some(tx_key(k)))
        .condition_expression("attribute_exists(pk)")
        .build()
        .unwrap();
    TransactWriteItem::builder().condition_check(check).build()
}

/// Every item of table "t", in `pk` order.
async fn table_items(client: &Client) -> Vec<rekey::core::value::Item> {
    let page = client.scan().table_name("t").send().await.unwrap();
    assert!(
        page.last_evaluated_key.is_none(),
        "one page holds the table"
    );
    let mut items: Vec<_> = page
        .items()
        .iter()
        .filter_map(|m| rekey::aws::from_sdk_item(m.clone()))
        .collect();
    items.sort_by_key(|i| format!("{:?}", i.get("pk")));
    items
}

/// A reason for an action that passed, or whose condition failed.
fn passed() -> Reason {
    Reason {
        code: Some("None".into()),
        message: None,
        item: None,
    }
}

fn refused(item: Option<rekey::core::value::Item>) -> Reason {
    Reason {
        code: Some("ConditionalCheckFailed".into()),
        message: Some("The conditional request failed".into()),
        item,
    }
}

/// serve.py answers TransactWriteItems of Puts, Deletes and ConditionChecks
/// itself (every action checked first, then the writes): moto's rollback, a
/// deep copy of every table the transaction touches, grew moto to 22 GB
/// under the fleet's claims. The same transactions to serve.py's moto and
/// to moto's own `moto_server` answer the same and leave the same items;
/// and the answers are DynamoDB's: a refused transaction writes nothing and
/// gives one reason per action, with the item where ALL_OLD asked for it
/// and there is one; a transaction naming one item twice is a
/// ValidationException.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_answer_as_moto_does() {
    let plain = PlainMoto::start();
    let ours = LocalServer::start(&LocalOptions::default()).await.unwrap();
    let mut runs = Vec::new();
    for endpoint in [plain.endpoint.as_str(), ours.endpoint()] {
        let c = clients::dynamodb(endpoint).await;
        create_plain_table(&c, "t", &["pk", "sk"], false).await;
        let steps = [
            // Written: three new items.
            vec![
                tx_put("a", "1", true),
                tx_put("b", "2", true),
                tx_put("c", "3", true),
            ],
            // Refused: "a" exists, "b" holds another v, "z" is absent (no
            // item to return); "d" and the check of "c" pass, unwritten.
            vec![
                tx_put("d", "4", true),
                tx_put("a", "9", true),
                tx_delete("b", "7"),
                tx_exists("c"),
                tx_delete("z", "1"),
            ],
            // Refused before any check: "d" twice.
            vec![tx_put("d", "4", true), tx_delete("d", "4")],
            // Written: "b" deleted, "d" put, "c" checked.
            vec![tx_delete("b", "2"), tx_put("d", "4", false), tx_exists("c")],
        ];
        let mut seen = Vec::new();
        for actions in steps {
            let answer = transact(&c, actions).await;
            seen.push((answer, table_items(&c).await));
        }
        runs.push(seen);
    }
    let (moto, served) = (&runs[0], &runs[1]);
    for (n, (a, b)) in moto.iter().zip(served).enumerate() {
        assert_eq!(a, b, "transaction {n} answers differently");
    }
    assert_eq!(moto.len(), served.len());

    let abc = vec![tx_item("a", "1"), tx_item("b", "2"), tx_item("c", "3")];
    assert_eq!(served[0], (Answer::Ok, abc.clone()));
    let Answer::Err { code, reasons, .. } = &served[1].0 else {
        panic!("refused: {:?}", served[1]);
    };
    assert_eq!(code.as_deref(), Some("TransactionCanceledException"));
    assert_eq!(
        reasons,
        &[
            passed(),
            refused(Some(tx_item("a", "1"))),
            refused(Some(tx_item("b", "2"))),
            passed(),
            refused(None),
        ]
    );
    assert_eq!(served[1].1, abc, "a refused transaction writes nothing");
    assert_eq!(
        served[2],
        (
            Answer::Err {
                code: Some("ValidationException".into()),
                message: Some(
                    "Transaction request cannot include multiple operations on one item".into()
                ),
                reasons: Vec::new(),
            },
            abc.clone()
        ),
        "nor does one naming an item twice"
    );
    assert_eq!(
        served[3],
        (
            Answer::Ok,
            vec![tx_item("a", "1"), tx_item("c", "3"), tx_item("d", "4")]
        )
    );
}
