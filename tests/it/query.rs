//! `rekey query`, the read path of the new design, on the local server: a
//! target table sharded eight ways over a skewed tenant mix, read a page at
//! a time — through the phase in-process for the many-page walks, through
//! the binary for its output and its exit codes.

use std::collections::{BTreeMap, BTreeSet};

use rekey::core::plan::Plan;
use rekey::core::query::{Order, SkCondition, TimeRange};
use rekey::core::value::{Item, Value};
use rekey::phase::query::{QueryOptions, run};

use crate::support::*;

/// Orders per tenant: one takes most, some a few, one none at all.
const TENANTS: [(&str, usize); 4] = [("big", 230), ("mid", 31), ("small", 3), ("idle", 0)];

fn source_order(t: &str, id: usize) -> Item {
    item(&format!(
        r#"{{"PK":{{"S":"T#{t}"}},"SK":{{"S":"O#{id:05}"}},"total":{{"N":"{id}"}}}}"#
    ))
}

/// The tenants' orders in the new shape, written straight into the target.
struct Sharded {
    env: TestEnv,
    plan: Plan,
    plan_path: String,
    target: String,
}

impl Sharded {
    async fn start() -> Sharded {
        let env = TestEnv::start().await;
        let (source, target) = (env.table_name("q-src"), env.table_name("q-dst"));
        env.create_table(&target, &pk_sk()).await;
        let (plan_path, plan) = plan::tenant_shards(&source, &target).write(&env);
        let orders: Vec<Item> = TENANTS
            .iter()
            .flat_map(|(t, n)| (0..*n).map(move |i| source_order(t, i)))
            .collect();
        let items: Vec<Item> = expected_target(&plan, &orders).into_values().collect();
        env.put(&target, &items).await;
        Sharded {
            env,
            plan,
            plan_path: plan_path.to_str().unwrap().to_string(),
            target,
        }
    }

    fn options(&self, tenant: &str, limit: usize) -> QueryOptions {
        QueryOptions {
            rule: None,
            where_: BTreeMap::from([("t".to_string(), tenant.to_string())]),
            time: None,
            condition: SkCondition::Any,
            order: Order::Ascending,
            limit,
            cursor: None,
            read_rate: None,
            consistent_read: true,
        }
    }

    /// Every page of a read, through the phase: the sort keys in the order returned, and the page sizes.
    async fn walk(
        &self,
        mut o: QueryOptions,
        between: impl AsyncFnMut(),
    ) -> (Vec<String>, Vec<usize>) {
        let mut between = between;
        let (mut sks, mut sizes) = (Vec::new(), Vec::new());
        loop {
            let r = run(&self.env.clients, &self.plan, &o).await.unwrap();
            sizes.push(r.items.len());
            sks.extend(r.items.iter().map(|i| sk(i).to_string()));
            match r.next_cursor {
                Some(c) => o.cursor = Some(c),
                None => return (sks, sizes),
            }
            between().await;
        }
    }

    async fn delete(&self, tenant: &str, id: usize) {
        let key = rekey::aws::to_sdk_item(&self.target_key(tenant, id));
        self.env
            .clients
            .dynamodb
            .delete_item()
            .table_name(&self.target)
            .set_key(Some(key))
            .send()
            .await
            .unwrap();
    }

    fn target_key(&self, tenant: &str, id: usize) -> Item {
        let mut it = expected_target(&self.plan, &[source_order(tenant, id)])
            .into_values()
            .next()
            .unwrap();
        it.retain(|k, _| k == "PK" || k == "SK");
        it
    }
}

fn sk(i: &Item) -> &str {
    match i.get("SK") {
        Some(Value::S(s)) => s,
        other => panic!("SK {other:?}"),
    }
}

fn sks(tenant_orders: impl IntoIterator<Item = usize>) -> Vec<String> {
    tenant_orders
        .into_iter()
        .map(|i| format!("O#{i:05}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_every_tenant_with_pages_of_1_7_and_100_returns_its_orders_in_sort_order() {
    let s = Sharded::start().await;
    for (tenant, n) in TENANTS {
        for limit in [1, 7, 100] {
            let (got, sizes) = s.walk(s.options(tenant, limit), async || {}).await;
            assert_eq!(got, sks(0..n), "tenant {tenant}, pages of {limit}");
            let (last, full) = sizes.split_last().unwrap();
            assert!(
                full.iter().all(|&p| p == limit),
                "{tenant}/{limit}: {sizes:?}"
            );
            assert!(
                *last > 0 || n == 0,
                "a last page is empty only for an empty read"
            );
        }
    }
    // Descending, and the sort-key conditions, over the skewed tenant.
    let desc = QueryOptions {
        order: Order::Descending,
        ..s.options("big", 7)
    };
    assert_eq!(s.walk(desc, async || {}).await.0, sks((0..230).rev()));
    let prefix = QueryOptions {
        condition: SkCondition::BeginsWith("O#0001".into()),
        ..s.options("big", 4)
    };
    assert_eq!(s.walk(prefix, async || {}).await.0, sks(10..20));
    let between = QueryOptions {
        condition: SkCondition::Between("O#00050".into(), "O#00120".into()),
        order: Order::Descending,
        ..s.options("big", 9)
    };
    assert_eq!(s.walk(between, async || {}).await.0, sks((50..=120).rev()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_inserting_and_deleting_between_pages_causes_no_repeat_and_no_miss() {
    let s = Sharded::start().await;
    let mut rng = Rng(7);
    let deleted = std::cell::RefCell::new(BTreeSet::new());
    let inserted = std::cell::RefCell::new(BTreeSet::new());
    let (got, _) = s
        .walk(s.options("big", 7), async || {
            // Each gap: three new orders anywhere in the key range (behind
            // the page just read and ahead of it), in any shard; two deletions.
            let new: Vec<Item> = (0..3)
                .map(|_| {
                    let (id, shard) = (rng.below(230) as usize, rng.below(8));
                    let mut ins = inserted.borrow_mut();
                    let sk = format!("O#{id:05}x{}", ins.len());
                    ins.insert(sk.clone());
                    item(&format!(
                        r#"{{"PK":{{"S":"T#big#S#{shard}"}},"SK":{{"S":"{sk}"}}}}"#
                    ))
                })
                .collect();
            s.env.put(&s.target, &new).await;
            for _ in 0..2 {
                let id = rng.below(230) as usize;
                s.delete("big", id).await;
                deleted.borrow_mut().insert(id);
            }
        })
        .await;
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), got.len(), "an order came twice");
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted, "the read went back in sort order");
    let deleted = deleted.into_inner();
    let stayed = sks((0..230).filter(|i| !deleted.contains(i)));
    let returned: BTreeSet<&String> = got.iter().collect();
    let missed: Vec<&String> = stayed.iter().filter(|k| !returned.contains(k)).collect();
    assert!(
        missed.is_empty(),
        "orders there throughout were missed: {missed:?}"
    );
    let inserted = inserted.into_inner();
    let allowed: BTreeSet<String> = sks(0..230)
        .into_iter()
        .chain(inserted.iter().cloned())
        .collect();
    assert!(
        got.iter().all(|k| allowed.contains(k)),
        "an order that never existed"
    );
    assert!(!deleted.is_empty());
    let new_seen = got.iter().filter(|k| inserted.contains(*k)).count();
    assert!(
        new_seen > 0 && new_seen < inserted.len(),
        "some inserts land ahead of the cursor, some behind: {new_seen} of {}",
        inserted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_pages_with_its_cursor_and_refuses_a_corrupt_or_foreign_one_with_exit_2() {
    let s = Sharded::start().await;
    let p = s.plan_path.as_str();
    let page = |args: &[&str]| {
        let mut all = vec![
            "--show-keys",
            "query",
            p,
            "--where",
            "t=mid",
            "--limit",
            "7",
            "--json",
        ];
        all.extend_from_slice(args);
        let out = s.env.rekey(&all);
        assert!(out.status.success(), "{}", stderr(&out));
        let lines: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (last, items) = lines.split_last().unwrap();
        let sks: Vec<String> = items
            .iter()
            .map(|i| i["SK"]["S"].as_str().unwrap().to_string())
            .collect();
        (sks, last["next_cursor"].as_str().map(str::to_string))
    };
    let (mut got, mut cursor) = page(&[]);
    while let Some(c) = cursor {
        let (more, next) = page(&["--cursor", &c]);
        got.extend(more);
        cursor = next;
    }
    assert_eq!(got, sks(0..31));

    // The table, with the next page's cursor.
    let out = s.env.rekey(&[
        "--show-keys",
        "query",
        p,
        "--where",
        "t=small",
        "--limit",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.lines().next().unwrap().starts_with("PK"), "{text}");
    assert!(
        text.contains("T#small#S#") && text.contains("O#00001"),
        "{text}"
    );
    let cursor = text
        .lines()
        .find_map(|l| l.strip_prefix("next page: --cursor "))
        .unwrap_or_else(|| panic!("no cursor in {text}"))
        .to_string();
    // Key values are hashed without --show-keys.
    let hidden = stdout(&s.env.rekey(&["query", p, "--where", "t=small"]));
    assert!(
        !hidden.contains("small") && hidden.contains("‹"),
        "{hidden}"
    );

    let mut flipped = cursor.clone().into_bytes();
    flipped[10] = if flipped[10] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let bad = [
        (cursor.as_str(), "t=mid", "belongs to another query"),
        (&cursor[..cursor.len() - 5], "t=small", "not a rekey cursor"),
        (flipped.as_str(), "t=small", "--cursor"),
        ("%%%", "t=small", "not a rekey cursor"),
    ];
    for (c, w, want) in bad {
        let out = s
            .env
            .rekey(&["query", p, "--where", w, "--limit", "2", "--cursor", c]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{c}: {err}");
        assert!(
            err.contains(want) && !err.contains("panicked"),
            "{c}: {err}"
        );
    }
    // The cursor of a descending read is not one of an ascending read.
    let out = s.env.rekey(&[
        "query", p, "--where", "t=small", "--desc", "--cursor", &cursor,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // A --where the plan's key does not read.
    let out = s.env.rekey(&["query", p, "--where", "tenant=small"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("`t` for rule"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_bucketed_key_is_read_over_every_bucket_from_from_to_to() {
    let env = TestEnv::start().await;
    let (source, target) = (env.table_name("q-ev"), env.table_name("q-evh"));
    env.create_table(&target, &pk_sk()).await;
    let text = PlanText::new(&source, &target)
        .source_sort_key("SK")
        .rule(Rule::new(
            &[("PK", "SRC#{s}"), ("SK", "E#{ts}#{id}")],
            &[
                ("PK", "SRC#{s}#H#{bucket(@at, hour)}#{shard(id, 4)}"),
                ("SK", "E#{ts}#{id}"),
            ],
        ));
    let (_, plan) = text.write(&env);
    // An event every 10 minutes from 09:00 to 13:50 on 2026-07-07.
    let start = 1_783_414_800; // 2026-07-07T09:00:00Z
    let events: Vec<Item> = (0..30)
        .map(|i| {
            let ts = start + i * 600;
            item(&format!(
                r#"{{"PK":{{"S":"SRC#pos"}},"SK":{{"S":"E#{ts}#{i}"}},"at":{{"N":"{ts}"}}}}"#
            ))
        })
        .collect();
    let items: Vec<Item> = expected_target(&plan, &events).into_values().collect();
    env.put(&target, &items).await;
    let mut o = QueryOptions {
        rule: None,
        where_: BTreeMap::from([("s".to_string(), "pos".to_string())]),
        time: Some(TimeRange {
            from: "2026-07-07T10:30:00Z".into(),
            to: "2026-07-07T11:59:59Z".into(),
        }),
        condition: SkCondition::Any,
        order: Order::Ascending,
        limit: 5,
        cursor: None,
        read_rate: Some(50.0),
        consistent_read: false,
    };
    let mut got = Vec::new();
    loop {
        let r = run(&env.clients, &plan, &o).await.unwrap();
        assert_eq!(r.keys, 8, "2 hours × 4 shards");
        got.extend(r.items.iter().map(|i| sk(i).to_string()));
        match r.next_cursor {
            Some(c) => o.cursor = Some(c),
            None => break,
        }
    }
    // The whole of hours 10 and 11: six events each.
    let want: Vec<String> = (6..18)
        .map(|i| format!("E#{}#{i}", start + i * 600))
        .collect();
    assert_eq!(got, want);
}
