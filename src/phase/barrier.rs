//! The drain barrier: proof that the tail has applied every change made to
//! the source before a chosen moment — what a cutover waits for.
//!
//! `rekey drain` writes a marker item into the source table (partition key
//! `__rekey__#barrier#<id>`) and deletes it at once. The marker travels the
//! stream like any write. The tail recognises it ([`marker_id`]; the transform
//! skips such items everywhere, so a marker is never copied), and marks the
//! barrier *observed* when it applies the marker — every earlier record of
//! that shard is applied by then, since a shard is applied in order. Records
//! of other shards are ordered only against themselves, so the barrier is
//! *complete* once each other open shard has also been read to its end after
//! the observation. On DynamoDB Local, which keeps one shard, observation is
//! completion.
//!
//! The tail publishes barriers in `<state dir>/tail/status.json`; `drain`
//! polls that file, so the two can be separate processes.
//!
//! Invariant: a barrier is complete only after every change written to the
//! source before the marker's write has been applied to the target.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::aws::{Clients, to_sdk_item};
use crate::core::plan::Plan;
use crate::core::value::{Item, ScalarType, Value};

/// Partition-key values starting with this are rekey's own markers.
pub const MARKER_PREFIX: &str = "__rekey__#barrier#";

/// The barrier id if `item` (a source item) is a drain marker.
pub fn marker_id(plan: &Plan, item: &Item) -> Option<String> {
    let text = match item.get(&plan.source_key.partition_key.name)? {
        Value::S(s) => s.as_str(),
        Value::B(b) => std::str::from_utf8(b).ok()?,
        _ => return None,
    };
    text.strip_prefix(MARKER_PREFIX).map(str::to_string)
}

/// The marker item for barrier `id`: the source key and nothing else.
pub fn marker_item(plan: &Plan, id: &str) -> anyhow::Result<Item> {
    let text = format!("{MARKER_PREFIX}{id}");
    let value = |ty: ScalarType| match ty {
        ScalarType::S => Value::S(text.clone()),
        ScalarType::B => Value::B(text.clone().into_bytes()),
        ScalarType::N => Value::N("0".into()),
    };
    let pk = &plan.source_key.partition_key;
    if pk.ty == ScalarType::N {
        anyhow::bail!(crate::ops::cli::InputError(format!(
            "table `{}` has a numeric partition key ({}); the drain barrier needs a string or binary key \
             for its marker item. Stop the application's writes and wait for the tail to be idle instead",
            plan.source_table, pk.name
        )));
    }
    let mut item = Item::new();
    item.insert(pk.name.clone(), value(pk.ty));
    if let Some(sk) = &plan.source_key.sort_key {
        item.insert(sk.name.clone(), value(sk.ty));
    }
    Ok(item)
}

/// A barrier as the tail publishes it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BarrierState {
    /// When the tail applied the marker (epoch seconds, the tail's clock).
    pub observed_at: f64,
    /// When every other open shard had been read to its end after that.
    pub complete_at: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct DrainOptions {
    pub state_dir: std::path::PathBuf,
    pub timeout: Duration,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainReport {
    pub barrier: String,
    pub complete: bool,
    pub waited_seconds: f64,
}

/// Write a marker into the source, delete it, and wait until the tail reports
/// the barrier complete. `complete: false` when the timeout passed first.
pub async fn drain(
    clients: &Clients,
    plan: &Plan,
    opts: &DrainOptions,
) -> anyhow::Result<DrainReport> {
    let id = format!(
        "{}-{:08x}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ"),
        rand_u32()
    );
    let marker = to_sdk_item(&marker_item(plan, &id)?);
    let started = std::time::Instant::now();
    clients
        .dynamodb
        .put_item()
        .table_name(&plan.source_table)
        .set_item(Some(marker.clone()))
        .send()
        .await
        .map_err(|e| clients.error("PutItem", &plan.source_table, e))
        .context("writing the drain marker")?;
    clients
        .dynamodb
        .delete_item()
        .table_name(&plan.source_table)
        .set_key(Some(marker))
        .send()
        .await
        .map_err(|e| clients.error("DeleteItem", &plan.source_table, e))
        .context("deleting the drain marker")?;
    let status = crate::phase::tail::status_path(&opts.state_dir);
    loop {
        if let Some(s) = crate::phase::tail::read_status(&status)?
            && s.barriers.get(&id).is_some_and(|b| b.complete_at.is_some())
        {
            return Ok(DrainReport {
                barrier: id,
                complete: true,
                waited_seconds: started.elapsed().as_secs_f64(),
            });
        }
        if started.elapsed() >= opts.timeout {
            return Ok(DrainReport {
                barrier: id,
                complete: false,
                waited_seconds: started.elapsed().as_secs_f64(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos()));
    h.finish() as u32
}

/// Whether a status file exists at all: `drain` says so when no tail runs.
pub fn tail_has_run(state_dir: &Path) -> bool {
    crate::phase::tail::status_path(state_dir).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(pk_type: &str) -> Plan {
        let text = format!(
            r#"
[source]
table = "s"
partition_key = "PK:{pk_type}"
sort_key = "SK"
[target]
table = "t"
partition_key = "PK"
[[rule]]
match = {{ SK = "{{x}}" }}
key = {{ PK = "{{x}}" }}
"#
        );
        Plan::parse(&text, Path::new("p")).unwrap()
    }

    #[test]
    fn a_marker_round_trips_and_ordinary_items_are_not_markers() {
        let p = plan("S");
        let m = marker_item(&p, "abc").unwrap();
        assert_eq!(marker_id(&p, &m).as_deref(), Some("abc"));
        let mut other = m.clone();
        other.insert("PK".into(), Value::S("ORDER#1".into()));
        assert_eq!(marker_id(&p, &other), None);
    }

    #[test]
    fn binary_keys_carry_the_marker_as_bytes_and_numeric_keys_are_refused() {
        let p = plan("B");
        let m = marker_item(&p, "x").unwrap();
        assert!(matches!(m["PK"], Value::B(_)));
        assert_eq!(marker_id(&p, &m).as_deref(), Some("x"));
        let e = marker_item(&plan("N"), "x").unwrap_err();
        assert!(format!("{e:#}").contains("numeric partition key"), "{e:#}");
    }
}
