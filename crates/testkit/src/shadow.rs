//! Strict request validation: every DynamoDB request the proxy receives is
//! first sent to a validating shadow, dynalite (MIT, from npm), which was
//! built to reproduce DynamoDB's request validation and its error messages;
//! the local server (moto) answers only what the shadow accepts.
//!
//! moto accepts requests DynamoDB refuses (a `BatchGetItem` key holding a
//! non-key attribute, among others), so a test on moto alone cannot see a
//! request that fails on DynamoDB. With the shadow in front, such a request
//! gets DynamoDB's `ValidationException` — rekey sees what it would see on
//! DynamoDB — and is recorded; the test environment fails the test that sent
//! it (tests/it/support: `TestEnv`'s drop).
//!
//! The shadow is a whole DynamoDB of its own: it receives the writes too, so
//! what DynamoDB checks against the stored item (an `UpdateItem` path into a
//! value of the wrong type) is checked as well. Only its validation counts:
//! a conditional failure or a missing item there is not an error, and its
//! data may lag moto's (a table created by `ImportTable`, which it lacks, is
//! created empty from moto's description on first use).
//!
//! dynalite lacks some actions. Transactions are validated member by member
//! as the single-item action each member is (a condition no item meets is
//! added, so nothing is written: a transaction is all or nothing, its members
//! one by one would not be); the rest (`ImportTable`, the exports, TTL and
//! backup settings) are counted as not validated. Each validator keeps its
//! counts per action; with `REKEY_VALIDATION_AUDIT=FILE` it appends them to
//! FILE when dropped, for scripts/test's audit of the whole suite.

pub mod server;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value as Json, json};

/// Appends each validator's counts per action to this file when it is dropped.
pub const AUDIT_ENV: &str = "REKEY_VALIDATION_AUDIT";
const TARGET_PREFIX: &str = "DynamoDB_20120810.";
const JSON_TYPE: &str = "application/x-amz-json-1.0";
const DUMMY_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0";
/// The answers that mean "DynamoDB refuses this request".
const REFUSALS: [&str; 2] = ["ValidationException", "SerializationException"];
/// An attribute no item has: `attribute_exists` of it is false, so a
/// transaction member checked as a single write writes nothing.
const NEVER_NAME: &str = "#rekeyShadowNever";
const NEVER_ATTR: &str = "rekey-shadow-never";

/// A refusal that judges the server, not the client: DynamoDB refuses a
/// Scan page's `ExclusiveStartKey` outside the segment asked for, and which
/// segment a key hashes to is each server's own (the shadow's and the local
/// server's differ). A start key the local server itself returned as the
/// `LastEvaluatedKey` of that very segment is the client passing on the
/// server's token, as it must: not a request DynamoDB would refuse.
const FOREIGN_SEGMENT: &str = "Please use ExclusiveStartKey with correct Segment";

/// Scan start keys the local server handed out, per table, segment and
/// segment count: one set for the whole test process, since a resumed
/// process may read its checkpoint through another proxy.
static ISSUED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Records the `LastEvaluatedKey` of a Scan answer (`answer`, to `request`).
pub fn scan_answered(request: &Json, answer: &[u8]) {
    let Ok(answer) = serde_json::from_slice::<Json>(answer) else {
        return;
    };
    if let Some(last) = answer.get("LastEvaluatedKey") {
        let mut issued = ISSUED.lock().unwrap_or_else(|e| e.into_inner());
        issued
            .get_or_insert_with(HashSet::new)
            .insert(issued_key(request, last));
    }
}

/// Whether `request`'s start key is one the server issued for its segment.
fn start_key_issued(request: &Json) -> bool {
    let Some(start) = request.get("ExclusiveStartKey") else {
        return false;
    };
    let issued = ISSUED.lock().unwrap_or_else(|e| e.into_inner());
    issued
        .as_ref()
        .is_some_and(|set| set.contains(&issued_key(request, start)))
}

/// Table, segment, segment count and key, canonical (serde_json's maps are
/// sorted, so attribute order does not matter).
fn issued_key(request: &Json, key: &Json) -> String {
    json!([
        request.get("TableName"),
        request.get("IndexName"),
        request.get("Segment"),
        request.get("TotalSegments"),
        key
    ])
    .to_string()
}

/// Actions whose validation in the shadow is older than DynamoDB's, so it
/// refuses what DynamoDB accepts: UpdateTable with a `StreamSpecification`
/// alone (how a stream is turned on; the demo and tests do it). Not sent to
/// the shadow, counted as not validated.
const OUTDATED: [&str; 1] = ["UpdateTable"];

/// A request DynamoDB refuses.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub action: String,
    /// DynamoDB's error type and message, as the shadow answered.
    pub error: String,
    /// The start of the request's body.
    pub request: String,
}

/// What one validator saw.
#[derive(Debug, Clone, Default)]
pub struct Audit {
    pub refused: Vec<Refusal>,
    /// Requests the shadow checked and accepted, per action.
    pub validated: BTreeMap<String, u64>,
    /// Requests of actions the shadow does not know, per action.
    pub unvalidated: BTreeMap<String, u64>,
    /// Refusals taken by the test that expected them.
    pub taken: u64,
    /// Refusals that failed their test (the proxy's drop).
    pub reported: u64,
    /// Scan pages refused for a start key the local server issued for that
    /// segment (see `FOREIGN_SEGMENT`): the servers' segments differ.
    pub server_tokens: u64,
}

/// The shadow's answer to one request.
pub enum Verdict {
    Accepted,
    /// DynamoDB's refusal: answer the client with it.
    Refused {
        status: StatusCode,
        body: Bytes,
    },
}

/// Checks requests against a shadow, creating there the tables the local
/// server has (`upstream`) as they are first named.
pub struct Validator {
    shadow: String,
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Tables the shadow has.
    known: Mutex<HashSet<String>>,
    audit: Mutex<Audit>,
}

/// One answer, read whole.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl Answer {
    /// DynamoDB's error type without its namespace (`…#ValidationException`).
    fn error_type(&self) -> Option<String> {
        if self.status.is_success() {
            return None;
        }
        let v: Json = serde_json::from_slice(&self.body).ok()?;
        let t = v.get("__type")?.as_str()?;
        Some(t.rsplit('#').next().unwrap_or(t).to_string())
    }

    fn message(&self) -> String {
        let v: Json = serde_json::from_slice(&self.body).unwrap_or(Json::Null);
        let t = self.error_type().unwrap_or_else(|| self.status.to_string());
        let m = v
            .get("message")
            .or_else(|| v.get("Message"))
            .and_then(Json::as_str)
            .unwrap_or_default();
        format!("{t}: {m}")
    }
}

impl Validator {
    pub fn new(shadow: &str, upstream: &str) -> Validator {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Validator {
            shadow: shadow.trim_end_matches('/').to_string(),
            upstream: upstream.trim_end_matches('/').to_string(),
            // Node closes a connection idle for 5 s: a pooled one must not
            // be reused that late (a request on a closing connection fails).
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(std::time::Duration::from_secs(2))
                .build(connector),
            known: Mutex::new(HashSet::new()),
            audit: Mutex::new(Audit::default()),
        }
    }

    pub fn audit(&self) -> Audit {
        self.audit.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Empties the list of refusals (their count stays in the audit).
    pub fn take_refusals(&self) -> Vec<Refusal> {
        let mut log = self.log();
        log.taken += log.refused.len() as u64;
        std::mem::take(&mut log.refused)
    }

    /// Empties the list of refusals for the proxy to fail its test with
    /// (their count stays in the audit, as failed tests).
    pub fn report_refusals(&self) -> Vec<Refusal> {
        let mut log = self.log();
        log.reported += log.refused.len() as u64;
        std::mem::take(&mut log.refused)
    }

    /// Validates one request of `action` with `body` (its JSON, `request`).
    pub async fn check(&self, action: &str, body: &Bytes, request: &Json) -> Verdict {
        if OUTDATED.contains(&action) {
            *self
                .log()
                .unvalidated
                .entry(action.to_string())
                .or_default() += 1;
            return Verdict::Accepted;
        }
        for table in tables_named(action, request) {
            self.ensure_table(&table).await;
        }
        let verdict = match action {
            "TransactWriteItems" | "TransactGetItems" => {
                self.check_members(action, body, request).await
            }
            _ => {
                self.check_one(action, action, body.clone(), Some(request))
                    .await
            }
        };
        if action == "DeleteTable"
            && let Some(t) = request.get("TableName").and_then(Json::as_str)
        {
            self.known_tables().remove(t);
        }
        verdict
    }

    /// A transaction, member by member.
    async fn check_members(&self, action: &str, body: &Bytes, request: &Json) -> Verdict {
        let Some(members) = request.get("TransactItems").and_then(Json::as_array) else {
            // Malformed as a whole: let the shadow say so (it knows no transactions).
            return self.check_one(action, action, body.clone(), None).await;
        };
        for member in members {
            let Some((single, req)) = as_single(member) else {
                continue;
            };
            let bytes = Bytes::from(serde_json::to_vec(&req).unwrap_or_default());
            if let v @ Verdict::Refused { .. } = self.check_one(action, single, bytes, None).await {
                return v;
            }
        }
        Verdict::Accepted
    }

    /// Sends one request to the shadow and records what it said; `action` is
    /// the client's, `sent` the one the shadow got, `request` its JSON when
    /// it is the client's own.
    async fn check_one(
        &self,
        action: &str,
        sent: &str,
        body: Bytes,
        request: Option<&Json>,
    ) -> Verdict {
        let answer = match self.call(&self.shadow, sent, body.clone()).await {
            Ok(a) => a,
            Err(e) => {
                self.refuse(
                    action,
                    format!("the validating shadow did not answer: {e}"),
                    &body,
                );
                return Verdict::Accepted;
            }
        };
        match answer.error_type().as_deref() {
            Some(t)
                if REFUSALS.contains(&t)
                    && sent == "Scan"
                    && answer.message().contains(FOREIGN_SEGMENT)
                    && request.is_some_and(start_key_issued) =>
            {
                self.log().server_tokens += 1;
                Verdict::Accepted
            }
            Some(t) if REFUSALS.contains(&t) => {
                self.refuse(action, answer.message(), &body);
                Verdict::Refused {
                    status: answer.status,
                    body: answer.body,
                }
            }
            Some("UnknownOperationException") => {
                *self
                    .log()
                    .unvalidated
                    .entry(action.to_string())
                    .or_default() += 1;
                Verdict::Accepted
            }
            // Accepted, or refused for what the shadow's data says (a failed
            // condition, an item it lacks): not a validation error.
            _ => {
                *self.log().validated.entry(action.to_string()).or_default() += 1;
                Verdict::Accepted
            }
        }
    }

    fn refuse(&self, action: &str, error: String, body: &Bytes) {
        let text = String::from_utf8_lossy(body);
        let request: String = text.chars().take(600).collect();
        eprintln!("strict validation: {action} refused: {error}\n  request: {request}");
        self.log().refused.push(Refusal {
            action: action.to_string(),
            error,
            request,
        });
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Audit> {
        self.audit.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known_tables(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates `table` in the shadow from the local server's description
    /// when the shadow lacks it (created before the shadow was there, or by
    /// an action the shadow does not know).
    async fn ensure_table(&self, table: &str) {
        if self.known_tables().contains(table) {
            return;
        }
        let describe = Bytes::from(json!({ "TableName": table }).to_string());
        let ours = self
            .call(&self.shadow, "DescribeTable", describe.clone())
            .await;
        if ours.is_ok_and(|a| a.status.is_success()) {
            self.known_tables().insert(table.to_string());
            return;
        }
        let Ok(theirs) = self.call(&self.upstream, "DescribeTable", describe).await else {
            return;
        };
        let Some(create) = theirs
            .status
            .is_success()
            .then(|| serde_json::from_slice::<Json>(&theirs.body).ok())
            .flatten()
            .and_then(|d| create_request(&d["Table"]))
        else {
            return; // not on the local server either: it will say so
        };
        let body = Bytes::from(create.to_string());
        if let Ok(a) = self.call(&self.shadow, "CreateTable", body).await
            && (a.status.is_success()
                || a.error_type().as_deref() == Some("ResourceInUseException"))
        {
            self.known_tables().insert(table.to_string());
        }
    }

    /// [`Validator::call_once`], again on a failure to send: a pooled
    /// connection the server closed as it was taken (asking the shadow twice
    /// is harmless; the local server is only asked for descriptions).
    async fn call(&self, base: &str, action: &str, body: Bytes) -> Result<Answer, String> {
        let mut last = String::new();
        for _ in 0..3 {
            match self.call_once(base, action, body.clone()).await {
                Ok(a) => return Ok(a),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn call_once(&self, base: &str, action: &str, body: Bytes) -> Result<Answer, String> {
        let req = Request::post(format!("{base}/"))
            .header(CONTENT_TYPE, JSON_TYPE)
            .header("x-amz-target", format!("{TARGET_PREFIX}{action}"))
            .header("x-amz-date", "20260101T000000Z")
            .header("authorization", DUMMY_AUTH)
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Answer { status, body })
    }
}

impl Drop for Validator {
    fn drop(&mut self) {
        let Some(path) = std::env::var_os(AUDIT_ENV).filter(|p| !p.is_empty()) else {
            return;
        };
        let audit = self.log().clone();
        let mut lines = String::new();
        for (action, n) in &audit.validated {
            lines.push_str(&format!("{action}\tvalidated\t{n}\n"));
        }
        for (action, n) in &audit.unvalidated {
            lines.push_str(&format!("{action}\tunvalidated\t{n}\n"));
        }
        for r in &audit.refused {
            lines.push_str(&format!("{}\trefused\t1\n", r.action));
        }
        if audit.reported > 0 {
            lines.push_str(&format!(
                "(failed their test)\trefused-reported\t{}\n",
                audit.reported
            ));
        }
        if audit.taken > 0 {
            lines.push_str(&format!(
                "(expected by tests)\trefused-expected\t{}\n",
                audit.taken
            ));
        }
        if audit.server_tokens > 0 {
            lines.push_str(&format!("Scan\tserver-token\t{}\n", audit.server_tokens));
        }
        // One write of the whole text: appends from parallel tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(lines.as_bytes());
        }
    }
}

/// The tables a request names that must exist for it (not the one a
/// `CreateTable` creates).
fn tables_named(action: &str, request: &Json) -> Vec<String> {
    let mut tables = Vec::new();
    if action != "CreateTable"
        && let Some(t) = request.get("TableName").and_then(Json::as_str)
    {
        tables.push(t.to_string());
    }
    if let Some(items) = request.get("RequestItems").and_then(Json::as_object) {
        tables.extend(items.keys().cloned());
    }
    for member in request
        .get("TransactItems")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        if let Some((_, req)) = as_single(member)
            && let Some(t) = req.get("TableName").and_then(Json::as_str)
        {
            tables.push(t.to_string());
        }
    }
    tables
}

/// A transaction member as the single-item request it is: writes get a
/// condition no item meets, so the shadow validates them and writes nothing.
fn as_single(member: &Json) -> Option<(&'static str, Json)> {
    let (kind, body) = ["Put", "Update", "Delete", "ConditionCheck", "Get"]
        .into_iter()
        .find_map(|k| Some((k, member.get(k)?.as_object()?.clone())))?;
    let single = match kind {
        "Put" => "PutItem",
        "Update" => "UpdateItem",
        "Get" => return Some(("GetItem", Json::Object(body))),
        // A ConditionCheck is a Delete that never happens.
        _ => "DeleteItem",
    };
    Some((single, Json::Object(never_written(body))))
}

fn never_written(mut body: Map<String, Json>) -> Map<String, Json> {
    // Only in a transaction; the single-item actions refuse it.
    body.remove("ReturnValuesOnConditionCheckFailure");
    let never = format!("attribute_exists({NEVER_NAME})");
    let condition = match body.get("ConditionExpression").and_then(Json::as_str) {
        Some(c) => format!("({c}) AND {never}"),
        None => never,
    };
    body.insert("ConditionExpression".into(), Json::String(condition));
    let names = body
        .entry("ExpressionAttributeNames")
        .or_insert_with(|| Json::Object(Map::new()));
    if let Some(names) = names.as_object_mut() {
        names.insert(NEVER_NAME.into(), Json::String(NEVER_ATTR.into()));
    }
    body
}

/// A `CreateTable` for the shadow from the local server's `Table` description.
fn create_request(desc: &Json) -> Option<Json> {
    let on_demand = desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST";
    let throughput = |d: &Json| {
        let units = |k: &str| d["ProvisionedThroughput"][k].as_u64().filter(|n| *n > 0);
        json!({
            "ReadCapacityUnits": units("ReadCapacityUnits").unwrap_or(1),
            "WriteCapacityUnits": units("WriteCapacityUnits").unwrap_or(1),
        })
    };
    let mut create = json!({
        "TableName": desc.get("TableName")?,
        "KeySchema": desc.get("KeySchema")?,
        "AttributeDefinitions": desc.get("AttributeDefinitions")?,
    });
    if on_demand {
        create["BillingMode"] = json!("PAY_PER_REQUEST");
    } else {
        create["ProvisionedThroughput"] = throughput(desc);
    }
    let index = |i: &Json, global: bool| {
        let mut out = json!({
            "IndexName": i["IndexName"],
            "KeySchema": i["KeySchema"],
            "Projection": i["Projection"],
        });
        if global && !on_demand {
            out["ProvisionedThroughput"] = throughput(i);
        }
        out
    };
    for (field, global) in [
        ("GlobalSecondaryIndexes", true),
        ("LocalSecondaryIndexes", false),
    ] {
        if let Some(list) = desc.get(field).and_then(Json::as_array)
            && !list.is_empty()
        {
            create[field] = Json::Array(list.iter().map(|i| index(i, global)).collect());
        }
    }
    if desc["StreamSpecification"]["StreamEnabled"] == true {
        create["StreamSpecification"] = desc["StreamSpecification"].clone();
    }
    Some(create)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_member_becomes_a_write_that_never_happens() {
        let member = json!({"Put": {
            "TableName": "t",
            "Item": {"pk": {"S": "a"}},
            "ConditionExpression": "attribute_not_exists(#k)",
            "ExpressionAttributeNames": {"#k": "pk"},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }});
        let (action, req) = as_single(&member).unwrap();
        assert_eq!(action, "PutItem");
        assert_eq!(
            req["ConditionExpression"],
            "(attribute_not_exists(#k)) AND attribute_exists(#rekeyShadowNever)"
        );
        assert_eq!(req["ExpressionAttributeNames"]["#k"], "pk");
        assert_eq!(req["ExpressionAttributeNames"][NEVER_NAME], NEVER_ATTR);
        assert!(req.get("ReturnValuesOnConditionCheckFailure").is_none());

        let check = json!({"ConditionCheck": {"TableName": "t", "Key": {"pk": {"S": "a"}}}});
        let (action, req) = as_single(&check).unwrap();
        assert_eq!(action, "DeleteItem");
        assert_eq!(
            req["ConditionExpression"],
            "attribute_exists(#rekeyShadowNever)"
        );
    }

    #[test]
    fn a_table_is_created_in_the_shadow_as_the_local_server_describes_it() {
        let desc = json!({
            "TableName": "t",
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"},
                                     {"AttributeName": "g", "AttributeType": "S"}],
            "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"},
            "ProvisionedThroughput": {"ReadCapacityUnits": 0, "WriteCapacityUnits": 0},
            "GlobalSecondaryIndexes": [{"IndexName": "by-g", "IndexStatus": "ACTIVE",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"}}],
            "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        });
        let create = create_request(&desc).unwrap();
        assert_eq!(create["BillingMode"], "PAY_PER_REQUEST");
        assert!(create.get("ProvisionedThroughput").is_none());
        assert_eq!(create["GlobalSecondaryIndexes"][0]["IndexName"], "by-g");
        assert!(
            create["GlobalSecondaryIndexes"][0]
                .get("IndexStatus")
                .is_none()
        );
        assert_eq!(
            create["StreamSpecification"]["StreamViewType"],
            "NEW_AND_OLD_IMAGES"
        );

        let provisioned = json!({
            "TableName": "t",
            "KeySchema": desc["KeySchema"],
            "AttributeDefinitions": desc["AttributeDefinitions"],
            "ProvisionedThroughput": {"ReadCapacityUnits": 5, "WriteCapacityUnits": 7},
        });
        let create = create_request(&provisioned).unwrap();
        assert_eq!(create["ProvisionedThroughput"]["WriteCapacityUnits"], 7);
    }

    #[test]
    fn every_table_a_request_needs_is_named() {
        let batch = json!({"RequestItems": {"a": {"Keys": []}, "b": {"Keys": []}}});
        assert_eq!(tables_named("BatchGetItem", &batch), ["a", "b"]);
        let create = json!({"TableName": "new"});
        assert!(tables_named("CreateTable", &create).is_empty());
        let tx = json!({"TransactItems": [{"Put": {"TableName": "c", "Item": {}}}]});
        assert_eq!(tables_named("TransactWriteItems", &tx), ["c"]);
    }
}
