//! The workload every test draws from: the application the live-write tests
//! run against the source (orders whose target key depends on their status,
//! so an update can move an item to another target key; inserts, updates,
//! deletes and re-inserts at random), the [`Orders`] fixture around it, and
//! the seeded item generators of the backfill, verify and analyze tests
//! (tenant orders of every attribute type, colliding pairs, unmatched items).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use rekey::core::plan::Plan;
use rekey::core::value::{Item, Value};

use super::plan::orders_by_status;
use super::{TestEnv, item, pk_only, pk_sk};

pub fn order(id: u64, status: &str, v: u64) -> Item {
    item(&format!(
        r#"{{"PK":{{"S":"O#{id}"}},"status":{{"S":"{status}"}},"v":{{"N":"{v}"}}}}"#
    ))
}

pub const STATUSES: [&str; 3] = ["OPEN", "PAID", "SHIPPED"];

/// The application: `ops` random writes against the source, as fast as the server takes them.
pub async fn writer(env: &TestEnv, table: String, ids: u64, ops: usize, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let c = &env.clients.dynamodb;
    let mut done = 0;
    for n in 0..ops {
        let id = rng.below(ids + ids / 4); // some ids are new
        let key = AttributeValue::S(format!("O#{id}"));
        let status = AttributeValue::S(STATUSES[rng.below(3) as usize].into());
        let v = AttributeValue::N(n.to_string());
        let r: Result<(), String> = match rng.below(10) {
            // Update that changes the target key.
            0..=3 => c
                .update_item()
                .table_name(&table)
                .key("PK", key)
                .update_expression("SET #s = :s, v = :v")
                .expression_attribute_names("#s", "status")
                .expression_attribute_values(":s", status)
                .expression_attribute_values(":v", v)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| rekey::aws::error_chain(&e)),
            // Update that keeps it (only of items that exist).
            4..=5 => match c
                .update_item()
                .table_name(&table)
                .key("PK", key)
                .update_expression("SET v = :v")
                .condition_expression("attribute_exists(PK)")
                .expression_attribute_values(":v", v)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
                {
                    Ok(())
                }
                Err(e) => Err(rekey::aws::error_chain(&e)),
            },
            // Delete.
            6..=7 => c
                .delete_item()
                .table_name(&table)
                .key("PK", key)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| rekey::aws::error_chain(&e)),
            // (Re-)insert a whole item.
            _ => {
                let it = order(id, STATUSES[rng.below(3) as usize], n as u64);
                c.put_item()
                    .table_name(&table)
                    .set_item(Some(rekey::aws::to_sdk_item(&it)))
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| rekey::aws::error_chain(&e))
            }
        };
        r.unwrap_or_else(|e| panic!("writer: {e}"));
        done += 1;
        if n % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    done
}

/// Puts orders with ids from `first` on, one at a time (each acknowledged), until told to stop.
pub async fn side_writer(
    env: &TestEnv,
    table: &str,
    first: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let it = order(first + n % 200, STATUSES[(n % 3) as usize], n);
        env.clients
            .dynamodb
            .put_item()
            .table_name(table)
            .set_item(Some(rekey::aws::to_sdk_item(&it)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("side writer: {}", rekey::aws::error_chain(&e)));
        n += 1;
    }
    n
}

/// `n` orders, statuses in turn.
pub fn seed(n: u64) -> Vec<Item> {
    (0..n)
        .map(|i| order(i, STATUSES[(i % 3) as usize], i))
        .collect()
}

/// A migration's fixtures: a stream-enabled source holding `seed`, an empty
/// target, the plan between them, and a state directory.
pub struct Orders {
    pub env: TestEnv,
    pub source: String,
    pub target: String,
    pub plan: Plan,
    pub plan_path: PathBuf,
    pub state: PathBuf,
}

impl Orders {
    pub async fn start(seed: Vec<Item>) -> Orders {
        Orders::on(TestEnv::start().await, seed).await
    }

    /// On the local server whatever `REKEY_TEST_ENDPOINT` says: for tests
    /// of endpoints that are not AWS's.
    pub async fn start_local(seed: Vec<Item>) -> Orders {
        Orders::on(TestEnv::start_local().await, seed).await
    }

    async fn on(env: TestEnv, seed: Vec<Item>) -> Orders {
        let source = env.table_name("src");
        let target = env.table_name("dst");
        env.create_streamed_table(&source, &pk_only()).await;
        env.create_table(&target, &pk_sk()).await;
        env.put(&source, &seed).await;
        let (plan_path, plan) = orders_by_status(&source, &target).write(&env);
        let state = env.dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        Orders {
            env,
            source,
            target,
            plan,
            plan_path,
            state,
        }
    }
}

/// A cheap reproducible random sequence for kill points and workloads.
pub struct Rng(pub u64);

impl Rng {
    pub fn from_time() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        eprintln!("random seed {seed}");
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Order `i` of tenant `tenant` (plans of [`super::plan::tenant_days`]),
/// with every attribute type: its day, status (every fourth OPEN), `total`,
/// a 36-digit number, sets, binary, a nested map and list, and a `scratch`
/// attribute plans drop.
pub fn tenant_order(tenant: &str, i: usize, total: &str) -> Item {
    let text = format!(
        r#"{{"PK":{{"S":"T#{tenant}#D#2026-07-0{}"}},"SK":{{"S":"O#{i:06}"}},"status":{{"S":"{}"}},
            "total":{{"N":"{total}"}},"big":{{"N":"123456789012345678901234567890.{i}"}},
            "tags":{{"SS":["a","b{}"]}},"ns":{{"NS":["-1","{i}"]}},"raw":{{"B":"AAECAw=="}},
            "nested":{{"M":{{"l":{{"L":[{{"BOOL":true}},{{"NULL":true}},{{"S":"ü"}}]}}}}}},
            "scratch":{{"S":"dropped"}}}}"#,
        1 + i % 3,
        if i.is_multiple_of(4) { "OPEN" } else { "DONE" },
        i % 7
    );
    item(&text.replace('\n', ""))
}

/// Order `i` of the backfill tests: every third of one hot tenant, the
/// others spread over 50.
pub fn skewed_order(i: usize) -> Item {
    let tenant = if i.is_multiple_of(3) {
        "hot".to_string()
    } else {
        format!("t{}", i % 50)
    };
    tenant_order(&tenant, i, &format!("{i}.{:02}", i % 100))
}

/// Order `i` of the verify tests: tenants in turn, one of 50.
pub fn even_order(i: usize) -> Item {
    tenant_order(&format!("t{}", i % 50), i, &format!("{i}.50"))
}

/// Items `C#{x}` (sort keys `0`…): under [`super::plan::tenant_days`] all
/// items of one `x` map to one target key. `groups` is (x, items).
pub fn colliding(groups: &[(&str, usize)]) -> Vec<Item> {
    groups
        .iter()
        .flat_map(|(x, n)| {
            (0..*n).map(move |y| item(&format!(r#"{{"PK":{{"S":"C#{x}"}},"SK":{{"S":"{y}"}}}}"#)))
        })
        .collect()
}

/// `n` items no rule matches (`X#{i}`).
pub fn unmatched(n: usize) -> Vec<Item> {
    (0..n)
        .map(|i| item(&format!(r#"{{"PK":{{"S":"X#{i}"}},"SK":{{"S":"?"}}}}"#)))
        .collect()
}

/// `orders`, then five colliding pairs (one of each pair is rejected) and
/// seven unmatched items: what the backfill and verify tests seed.
pub fn with_collisions_and_unmatched(mut orders: Vec<Item>) -> Vec<Item> {
    orders.extend(colliding(&[
        ("0", 2),
        ("1", 2),
        ("2", 2),
        ("3", 2),
        ("4", 2),
    ]));
    orders.extend(unmatched(7));
    orders
}

/// The application: puts order `1000 + n % ids` with `v = n` (its status
/// fixed by its id, so its target key never moves), one at a time, and logs
/// each acknowledged put: id → the last `v` acknowledged.
pub async fn app(
    env: &TestEnv,
    table: &str,
    ids: u64,
    stop: &AtomicBool,
    acked: &Mutex<BTreeMap<u64, u64>>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let id = 1000 + n % ids;
        let it = order(id, STATUSES[(id % 3) as usize], n);
        env.clients
            .dynamodb
            .put_item()
            .table_name(table)
            .set_item(Some(rekey::aws::to_sdk_item(&it)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("application: {}", rekey::aws::error_chain(&e)));
        acked.lock().unwrap().insert(id, n);
        n += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every put of `before` is in the target: the item of each id holds that
/// `v` or a later one.
pub async fn check_covered(env: &TestEnv, target: &str, before: &BTreeMap<u64, u64>) {
    let mut got: BTreeMap<u64, u64> = BTreeMap::new();
    for it in env.scan_all(target).await {
        let (Some(Value::S(sk)), Some(Value::N(v))) = (it.get("SK"), it.get("v")) else {
            continue;
        };
        let id: u64 = sk.trim_start_matches("O#").parse().unwrap();
        let v: u64 = v.parse().unwrap();
        let e = got.entry(id).or_default();
        *e = (*e).max(v);
    }
    let behind: Vec<_> = before
        .iter()
        .filter(|(id, v)| got.get(id).is_none_or(|g| g < v))
        .map(|(id, v)| (id, v, got.get(id)))
        .collect();
    assert!(
        behind.is_empty(),
        "acknowledged before the barrier, missing from the target once it was met (id, v, target's v): {behind:?}"
    );
}
