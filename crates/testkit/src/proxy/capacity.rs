//! DynamoDB's `ConsumedCapacity`, computed from the items of a request and
//! its answer.

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use rekey::core::value::{self, Item};

/// `Some(with_indexes)` when the request asks for ConsumedCapacity on an
/// operation the proxy knows how to charge.
pub fn wanted(op: &str, req: &Json) -> Option<bool> {
    let known = [
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "GetItem",
        "BatchWriteItem",
        "BatchGetItem",
        "Scan",
        "Query",
        "TransactWriteItems",
    ];
    match req.get("ReturnConsumedCapacity").and_then(Json::as_str) {
        Some("TOTAL") if known.contains(&op) => Some(false),
        Some("INDEXES") if known.contains(&op) => Some(true),
        _ => None,
    }
}

fn item(json: Option<&Json>) -> Option<Item> {
    Item::deserialize(json?).ok()
}

fn write_units(json: Option<&Json>) -> f64 {
    item(json).map_or(1.0, |i| value::write_units(value::item_size(&i)) as f64)
}

/// Reads of `bytes` in 4 KB steps (at least one), halved unless consistent.
fn read_units(bytes: usize, consistent: bool) -> f64 {
    let units = bytes.div_ceil(4096).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

fn items_size(items: Option<&Json>) -> usize {
    items.and_then(Json::as_array).map_or(0, |list| {
        list.iter()
            .filter_map(|i| item(Some(i)))
            .map(|i| value::item_size(&i))
            .sum()
    })
}

/// RCU a Scan or Query answer consumed: the size of every item it read,
/// in 4 KB steps.
pub fn scan_units(body: &[u8], consistent: bool) -> f64 {
    let Ok(json) = serde_json::from_slice::<Json>(body) else {
        return 0.0;
    };
    read_units(items_size(json.get("Items")), consistent)
}

fn entry(table: &str, units: f64, indexes: bool) -> Json {
    let mut e = json!({ "TableName": table, "CapacityUnits": units });
    if indexes {
        e["Table"] = json!({ "CapacityUnits": units });
    }
    e
}

/// Per table: the units of each entry of a batch that was processed.
fn batch(req: &Json, answer: &Json, indexes: bool, write: bool) -> Json {
    let mut per_table: Map<String, Json> = Map::new();
    let tables = req.get("RequestItems").and_then(Json::as_object);
    for (table, entries) in tables.into_iter().flatten() {
        let units = if write {
            let unprocessed = answer
                .pointer(&format!("/UnprocessedItems/{}", escape(table)))
                .and_then(Json::as_array)
                .map_or(0, Vec::len);
            let list = entries.as_array().map(Vec::as_slice).unwrap_or_default();
            let keep = list.len().saturating_sub(unprocessed);
            list[..keep]
                .iter()
                .map(|e| match e.get("PutRequest") {
                    Some(p) => write_units(p.get("Item")),
                    None => 1.0,
                })
                .sum()
        } else {
            let consistent = entries.get("ConsistentRead").and_then(Json::as_bool) == Some(true);
            let found = answer
                .pointer(&format!("/Responses/{}", escape(table)))
                .and_then(Json::as_array);
            found.into_iter().flatten().fold(0.0, |sum, i| {
                let size = item(Some(i)).map_or(0, |i| value::item_size(&i));
                sum + read_units(size, consistent)
            })
        };
        per_table.insert(table.clone(), entry(table, units, indexes));
    }
    Json::Array(per_table.into_values().collect())
}

fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The answer with DynamoDB's ConsumedCapacity in place of the upstream's.
pub fn rewrite(op: &str, req: &Json, body: &[u8]) -> Option<Vec<u8>> {
    let indexes = wanted(op, req)?;
    let mut answer: Json = serde_json::from_slice(body).ok()?;
    let table = req
        .get("TableName")
        .and_then(Json::as_str)
        .unwrap_or_default();
    let consistent = req.get("ConsistentRead").and_then(Json::as_bool) == Some(true);
    let capacity = match op {
        "PutItem" => entry(table, write_units(req.get("Item")), indexes),
        "UpdateItem" | "DeleteItem" => {
            // The stored item's size is known only when it is returned.
            entry(table, write_units(answer.get("Attributes")), indexes)
        }
        "GetItem" => {
            let size = item(answer.get("Item")).map_or(0, |i| value::item_size(&i));
            entry(table, read_units(size, consistent), indexes)
        }
        "Scan" | "Query" => {
            let size = items_size(answer.get("Items"));
            entry(table, read_units(size, consistent), indexes)
        }
        "BatchWriteItem" => batch(req, &answer, indexes, true),
        "BatchGetItem" => batch(req, &answer, indexes, false),
        "TransactWriteItems" => {
            let mut per_table: Map<String, Json> = Map::new();
            let mut sums: Map<String, Json> = Map::new();
            let list = req.get("TransactItems").and_then(Json::as_array);
            for e in list.into_iter().flatten() {
                let Some((kind, body)) = ["Put", "Update", "Delete", "ConditionCheck"]
                    .into_iter()
                    .find_map(|k| Some((k, e.get(k)?)))
                else {
                    continue;
                };
                let t = body
                    .get("TableName")
                    .and_then(Json::as_str)
                    .unwrap_or_default();
                let units = match kind {
                    "Put" => 2.0 * write_units(body.get("Item")),
                    "ConditionCheck" => 2.0 * read_units(0, true),
                    _ => 2.0,
                };
                let sum = sums.entry(t).or_insert(json!(0.0));
                *sum = json!(sum.as_f64().unwrap_or(0.0) + units);
            }
            for (t, units) in sums {
                let e = entry(&t, units.as_f64().unwrap_or(0.0), indexes);
                per_table.insert(t, e);
            }
            Json::Array(per_table.into_values().collect())
        }
        _ => return None,
    };
    answer
        .as_object_mut()?
        .insert("ConsumedCapacity".into(), capacity);
    serde_json::to_vec(&answer).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big(pk: &str, bytes: usize) -> Json {
        json!({"PK": {"S": pk}, "pad": {"S": "x".repeat(bytes)}})
    }

    #[test]
    fn writes_are_charged_per_item_in_1_kb_steps() {
        let req = json!({"ReturnConsumedCapacity": "TOTAL", "RequestItems": {"t": [
            {"PutRequest": {"Item": big("a", 3000)}},
            {"PutRequest": {"Item": big("b", 10)}},
            {"DeleteRequest": {"Key": {"PK": {"S": "c"}}}},
            {"PutRequest": {"Item": big("d", 5000)}},
        ]}});
        let moto = br#"{"UnprocessedItems": {}, "ConsumedCapacity": [{"TableName": "t", "CapacityUnits": 1.0}]}"#;
        let out: Json =
            serde_json::from_slice(&rewrite("BatchWriteItem", &req, moto).unwrap()).unwrap();
        assert_eq!(
            out["ConsumedCapacity"],
            json!([{"TableName": "t", "CapacityUnits": 3.0 + 1.0 + 1.0 + 5.0}])
        );

        // What came back unprocessed (the tail of the list) is not charged.
        let answer = json!({"UnprocessedItems": {"t": [{"PutRequest": {"Item": big("d", 5000)}}]}});
        let out: Json = serde_json::from_slice(
            &rewrite("BatchWriteItem", &req, answer.to_string().as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(out["ConsumedCapacity"][0]["CapacityUnits"], 5.0);

        let put =
            json!({"TableName": "t", "Item": big("a", 2100), "ReturnConsumedCapacity": "INDEXES"});
        let out: Json = serde_json::from_slice(&rewrite("PutItem", &put, b"{}").unwrap()).unwrap();
        assert_eq!(
            out["ConsumedCapacity"],
            json!({"TableName": "t", "CapacityUnits": 3.0, "Table": {"CapacityUnits": 3.0}})
        );
        assert_eq!(
            rewrite(
                "PutItem",
                &json!({"TableName": "t", "Item": big("a", 1)}),
                b"{}"
            ),
            None,
            "not asked for"
        );
    }

    #[test]
    fn reads_are_charged_in_4_kb_steps_halved_unless_consistent() {
        let scan = json!({"TableName": "t", "ReturnConsumedCapacity": "TOTAL"});
        let answer = json!({"Items": [big("a", 5000), big("b", 5000)], "Count": 2});
        let out: Json =
            serde_json::from_slice(&rewrite("Scan", &scan, answer.to_string().as_bytes()).unwrap())
                .unwrap();
        assert_eq!(
            out["ConsumedCapacity"]["CapacityUnits"], 1.5,
            "10 KB: 3 steps, halved"
        );
        assert_eq!(scan_units(answer.to_string().as_bytes(), true), 3.0);

        let get =
            json!({"TableName": "t", "ConsistentRead": true, "ReturnConsumedCapacity": "TOTAL"});
        let out: Json = serde_json::from_slice(&rewrite("GetItem", &get, b"{}").unwrap()).unwrap();
        assert_eq!(
            out["ConsumedCapacity"]["CapacityUnits"], 1.0,
            "a miss costs a read"
        );

        let batch = json!({"ReturnConsumedCapacity": "TOTAL", "RequestItems": {"t": {"Keys": [], "ConsistentRead": true}}});
        let answer = json!({"Responses": {"t": [big("a", 9000), big("b", 1)]}});
        let out: Json = serde_json::from_slice(
            &rewrite("BatchGetItem", &batch, answer.to_string().as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(out["ConsumedCapacity"][0]["CapacityUnits"], 3.0 + 1.0);
    }
}
