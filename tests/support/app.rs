//! The application the live-write tests run against the source: orders whose
//! target key depends on their status, so an update can move an item to
//! another target key; inserts, updates, deletes and re-inserts at random.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use rekey::core::plan::{KeyAttr, KeySchema};
use rekey::core::value::{Item, ScalarType};

use std::path::PathBuf;

use rekey::core::plan::Plan;

use super::{Rng, TestEnv, item};

pub fn source_key() -> KeySchema {
    KeySchema {
        partition_key: KeyAttr {
            name: "PK".into(),
            ty: ScalarType::S,
        },
        sort_key: None,
    }
}

pub fn target_key() -> KeySchema {
    KeySchema {
        partition_key: KeyAttr {
            name: "PK".into(),
            ty: ScalarType::S,
        },
        sort_key: Some(KeyAttr {
            name: "SK".into(),
            ty: ScalarType::S,
        }),
    }
}

/// The target key depends on `status`: an update of the status moves the item.
pub fn plan_text(source: &str, target: &str) -> String {
    format!(
        r#"
[source]
table = "{source}"
partition_key = "PK"
[target]
table = "{target}"
partition_key = "PK"
sort_key = "SK"
[[rule]]
match = {{ PK = "O#{{id}}" }}
key = {{ PK = "ST#{{@status}}#{{shard(id, 4)}}", SK = "O#{{id}}" }}
"#
    )
}

pub fn order(id: u64, status: &str, v: u64) -> Item {
    item(&format!(
        r#"{{"PK":{{"S":"O#{id}"}},"status":{{"S":"{status}"}},"v":{{"N":"{v}"}}}}"#
    ))
}

pub const STATUSES: [&str; 3] = ["OPEN", "PAID", "SHIPPED"];

/// The application: `ops` random writes against the source, as fast as DynamoDB Local takes them.
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
        env.clients
            .create_table(&source, &source_key(), true)
            .await
            .unwrap();
        env.create_table(&target, &target_key()).await;
        env.put(&source, &seed).await;
        let text = plan_text(&source, &target);
        let plan_path = env.file("plan.toml", &text);
        let plan = Plan::parse(&text, &plan_path).unwrap();
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
