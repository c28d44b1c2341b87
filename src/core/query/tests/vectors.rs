//! `vectors/read-path-vectors.json`: a data set, reads over it, and the
//! pages and cursors each read gives, computed here by the Rust read path.
//! `scripts/check_read_refs.sh` checks the reference implementations in
//! `docs/ref/` against the same file. Regenerate it after a deliberate
//! change with `REKEY_WRITE_VECTORS=1 cargo test --lib core::query::`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use serde_json::{Value as Json, json};

use super::super::cursor::{Cursor, CursorError, QueryId};
use super::super::keys::LogicalKey;
use super::super::memory::{MemTable, Read};
use super::super::range::{Order, SkCondition};

const FILE: &str = include_str!("../../../../vectors/read-path-vectors.json");
const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/vectors/read-path-vectors.json"
);

/// A skewed tenant over 4 shards, with equal sort keys in several shards,
/// characters JSON escapes, and sort keys whose UTF-8 order is not their
/// UTF-16 order (U+FFFD sorts before U+1F600 in UTF-8, after it in UTF-16).
fn data() -> MemTable {
    let mut t = MemTable::default();
    let mut put = |shard: usize, sk: &str| {
        t.0.entry(format!("TENANT#acme#SHARD#{shard}"))
            .or_default()
            .insert(sk.to_string(), format!("{shard}:{sk}"));
    };
    for i in 0..40 {
        let shard = if i % 10 < 7 { 0 } else { i % 4 };
        put(shard, &format!("ORDER#{i:04}"));
    }
    for shard in [0, 2, 3] {
        put(shard, "ORDER#0015");
    }
    for sk in [
        "ORDER#\u{e9}",
        "ORDER#\u{fffd}",
        "ORDER#\u{1f600}",
        "ORDER#\"q\"",
        "ORDER#a\\b",
        "ORDER#tab\there\u{1}",
        "PROFILE",
        "A-FIRST",
    ] {
        put(1, sk);
    }
    t
}

fn keys() -> Vec<String> {
    // The fifth key holds nothing: a shard no order hashed to.
    (0..5).map(|s| format!("TENANT#acme#SHARD#{s}")).collect()
}

fn logical() -> LogicalKey {
    LogicalKey {
        rule: "order".into(),
        table: "orders_by_shard".into(),
        partition_key: "PK".into(),
        sort_key: "SK".into(),
        keys: keys(),
    }
}

fn cond_json(c: &SkCondition) -> Json {
    match c {
        SkCondition::Any => json!({"kind": "any"}),
        SkCondition::BeginsWith(p) => json!({"kind": "begins_with", "a": p}),
        SkCondition::Between(a, b) => json!({"kind": "between", "a": a, "b": b}),
    }
}

fn cases() -> Vec<(SkCondition, Order, usize)> {
    use Order::{Ascending as A, Descending as D};
    let between = SkCondition::Between("ORDER#0010".into(), "ORDER#0030".into());
    let orders = SkCondition::BeginsWith("ORDER#".into());
    vec![
        (SkCondition::Any, A, 1),
        (SkCondition::Any, A, 7),
        (SkCondition::Any, D, 100),
        (orders.clone(), A, 7),
        (orders, D, 5),
        (between.clone(), A, 4),
        (between, D, 3),
        (SkCondition::BeginsWith("NONE#".into()), A, 3),
    ]
}

fn error_name(e: &CursorError) -> &'static str {
    match e {
        CursorError::Malformed => "malformed",
        CursorError::Version(_) => "version",
        CursorError::Foreign => "foreign",
        CursorError::OutOfRange => "out_of_range",
    }
}

fn generate() -> Json {
    let table = data();
    let key = logical();
    let mut out_cases = Vec::new();
    let mut first_cursors = Vec::new();
    for (cond, order, limit) in cases() {
        let id = QueryId::of(&key, &cond, order);
        let read = Read {
            keys: &key.keys,
            cond: &cond,
            order,
            limit,
        };
        let pages: Vec<Json> = table
            .pages(&read, &id)
            .into_iter()
            .map(|(page, cursor)| {
                json!({
                    "items": page.iter().map(|e| json!([e.key, e.sk, e.item])).collect::<Vec<_>>(),
                    "cursor": cursor,
                })
            })
            .collect();
        first_cursors.push(pages[0]["cursor"].clone());
        out_cases.push(json!({
            "condition": cond_json(&cond),
            "order": order.name(),
            "limit": limit,
            "query_id": id.0,
            "pages": pages,
        }));
    }
    let c1 = first_cursors[1].as_str().unwrap().to_string();
    let id1 = QueryId::of(&key, &cases()[1].0, cases()[1].1);
    let bad = [
        (2, c1.clone()),
        (1, c1[..c1.len() - 2].to_string()),
        (1, "not a cursor!".to_string()),
        (1, BASE64URL.encode(r#"{"v":2,"q":"0","k":0,"s":""}"#)),
        (
            1,
            BASE64URL.encode(format!(r#"{{"v":1,"q":"{}","k":5,"s":"A"}}"#, id1.0)),
        ),
        (
            3,
            Cursor {
                key: 1,
                sk: "PROFILE".into(),
            }
            .encode(&QueryId::of(&key, &cases()[3].0, cases()[3].1)),
        ),
    ];
    let bad: Vec<Json> = bad
        .iter()
        .map(|(case, text)| {
            let (cond, order, _) = &cases()[*case];
            let id = QueryId::of(&key, cond, *order);
            let err = Cursor::decode(text, &id, key.keys.len(), cond).unwrap_err();
            json!({"case": case, "cursor": text, "error": error_name(&err)})
        })
        .collect();
    json!({
        "comment": "Generated by src/core/query/tests/vectors.rs (REKEY_WRITE_VECTORS=1 cargo test --lib core::query::); see docs/read-path.md.",
        "table": key.table,
        "partition_key": key.partition_key,
        "sort_key": key.sort_key,
        "rule": key.rule,
        "keys": key.keys,
        "data": table.0,
        "cases": out_cases,
        "bad_cursors": bad,
    })
}

#[test]
fn the_committed_read_path_vectors_are_what_the_read_path_gives() {
    let want = generate();
    if std::env::var_os("REKEY_WRITE_VECTORS").is_some() {
        let text = serde_json::to_string_pretty(&want).unwrap() + "\n";
        std::fs::write(PATH, text).unwrap();
        return;
    }
    let got: Json = serde_json::from_str(FILE).expect("vectors/read-path-vectors.json parses");
    assert!(
        got == want,
        "vectors/read-path-vectors.json is stale: REKEY_WRITE_VECTORS=1 cargo test --lib core::query::"
    );
}
