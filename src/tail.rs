//! `rekey tail`: keep the target current from the source table's DynamoDB
//! Stream, in per-item order across shard lineage.
//!
//! Convergence with the backfill (ARCHITECTURE.md, "Backfill and tail
//! converge"): until the backfill has finished — it leaves a `backfill.done`
//! marker in the plan's state directory — records are not applied but
//! buffered durably in the tail's own store, so that a backfill longer than the
//! stream's 24-hour retention loses nothing. Once the marker exists, the buffer
//! is applied in lineage order (parents before children), then records are
//! applied as they come. Every checkpoint (a shard's last sequence number)
//! moves only after the writes or buffer entries it covers are durable.
//!
//! The tail keeps its own sled store (`<state dir>/tail`), so it can run as a
//! process of its own beside `rekey backfill`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_dynamodbstreams::types::{OperationType, ShardIteratorType};
use serde::{Deserialize, Serialize};

use crate::aws::{AwsError, Clients, to_sdk_item};
use crate::plan::{Plan, TtlDeletes};
use crate::progress::Progress;
use crate::rate::Control;
use crate::rejects::RejectsFile;
use crate::state::StateStore;
use crate::transform::{Outcome, transform};
use crate::value::{Item, Value};
use crate::write::{backoff, jitter};

/// Written by the backfill when it is complete; the tail applies nothing before.
pub const BACKFILL_DONE: &str = "backfill.done";

#[derive(Debug, Clone)]
pub struct TailOptions {
    pub state_dir: PathBuf,
    pub rejects: PathBuf,
    /// Exit once the backfill is done, the buffer applied, and no shard has had
    /// a record for this long (catch-up mode; None: run until stopped).
    pub exit_when_idle: Option<Duration>,
    pub write_rate: Option<f64>,
    pub poll_interval: Duration,
}

/// One stream record as the tail keeps it (buffered or about to apply).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Change {
    pub kind: ChangeKind,
    pub old: Option<Item>,
    pub new: Option<Item>,
    /// A TTL expiry (userIdentity dynamodb.amazonaws.com), not an application delete.
    pub ttl: bool,
    /// Seconds since the epoch when DynamoDB wrote the record.
    pub at: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ChangeKind {
    Insert,
    Modify,
    Remove,
}

/// What the target must do for one change: the pure half of the tail.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Put(Item),
    Delete(Item),
    Reject { item: Item, reason: String },
}

/// The target writes for a change, in order. A MODIFY whose new image maps to a
/// different target key than the old one deletes the old key first, so no item
/// is left behind under a key it no longer has.
pub fn actions(plan: &Plan, change: &Change) -> Vec<Action> {
    let key_of = |item: &Item| -> Item {
        plan.target_key
            .names()
            .iter()
            .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
            .collect()
    };
    let old_target = change.old.as_ref().and_then(|o| match transform(plan, o) {
        Outcome::Put { item, .. } => Some(key_of(&item)),
        _ => None,
    });
    let mut out = Vec::new();
    match change.kind {
        ChangeKind::Remove => {
            if change.ttl && plan.ttl_deletes == TtlDeletes::Ignore {
                return out;
            }
            if let Some(k) = old_target {
                out.push(Action::Delete(k));
            }
        }
        ChangeKind::Insert | ChangeKind::Modify => {
            let Some(new) = &change.new else { return out };
            match transform(plan, new) {
                Outcome::Put { item, .. } => {
                    if let Some(k) = old_target
                        && k != key_of(&item)
                    {
                        out.push(Action::Delete(k));
                    }
                    out.push(Action::Put(item));
                }
                Outcome::Reject(r) => {
                    if let Some(k) = old_target {
                        out.push(Action::Delete(k));
                    }
                    out.push(Action::Reject {
                        item: new.clone(),
                        reason: r.to_string(),
                    });
                }
                Outcome::Skip => {
                    if let Some(k) = old_target {
                        out.push(Action::Delete(k));
                    }
                }
            }
        }
    }
    out
}

/// Shards whose records may be read now: not finished, and whose parent is
/// finished or unknown (trimmed away). Children after parents is what keeps
/// per-item order across splits.
pub fn ready_shards(shards: &[ShardInfo], finished: &HashSet<String>) -> Vec<String> {
    let known: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    shards
        .iter()
        .filter(|s| !finished.contains(&s.id))
        .filter(|s| match &s.parent {
            Some(p) => finished.contains(p) || !known.contains(p.as_str()),
            None => true,
        })
        .map(|s| s.id.clone())
        .collect()
}

/// Sequence numbers are decimal strings of up to 40 digits: compared (and
/// sorted as keys) by padding to a fixed width, never as text of varying width.
pub fn seq_key(seq: &str) -> String {
    format!("{seq:0>40}")
}

#[derive(Debug, Clone)]
pub struct ShardInfo {
    pub id: String,
    pub parent: Option<String>,
    pub closed: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ShardState {
    /// Last sequence number applied or buffered.
    seq: Option<String>,
    /// Closed and read to its end.
    finished: bool,
    /// When this checkpoint was last confirmed (epoch seconds, the tail's
    /// clock). A tail that has been away longer than the stream's retention
    /// may have missed trimmed records. (Not the record's own time: on a quiet
    /// table the last record may be days old while the checkpoint is current.)
    at: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TailReport {
    pub records: u64,
    pub buffered: u64,
    pub puts: u64,
    pub deletes: u64,
    pub rejected: u64,
    /// Seconds between the last applied record's creation and its application.
    pub last_lag_seconds: f64,
    pub shards: usize,
}

fn streams_item(
    m: &HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>,
) -> Option<Item> {
    use aws_sdk_dynamodbstreams::types::AttributeValue as A;
    fn conv(v: &A) -> Option<Value> {
        Some(match v {
            A::S(s) => Value::S(s.clone()),
            A::N(n) => Value::N(n.clone()),
            A::B(b) => Value::B(b.clone().into_inner()),
            A::Ss(v) => Value::Ss(v.clone()),
            A::Ns(v) => Value::Ns(v.clone()),
            A::Bs(v) => Value::Bs(v.iter().map(|b| b.clone().into_inner()).collect()),
            A::M(m) => Value::M(
                m.iter()
                    .map(|(k, v)| conv(v).map(|v| (k.clone(), v)))
                    .collect::<Option<_>>()?,
            ),
            A::L(l) => Value::L(l.iter().map(conv).collect::<Option<_>>()?),
            A::Bool(b) => Value::Bool(*b),
            A::Null(_) => Value::Null,
            _ => return None,
        })
    }
    m.iter()
        .map(|(k, v)| conv(v).map(|v| (k.clone(), v)))
        .collect()
}

const RETENTION_SECONDS: f64 = 24.0 * 3600.0;

pub async fn run(
    clients: &Clients,
    plan: &Plan,
    opts: &TailOptions,
    progress: &Progress,
) -> anyhow::Result<TailReport> {
    let info = clients.describe_table(&plan.source_table).await?;
    info.check_key(&plan.source_key, "source")?;
    let stream = match &info.stream {
        Some(s) if s.view == "NEW_AND_OLD_IMAGES" => s.arn.clone(),
        Some(s) => anyhow::bail!(crate::cli::InputError(format!(
            "table `{}` streams {} images; rekey needs NEW_AND_OLD_IMAGES to follow key-changing updates and deletes. \
             The view type cannot be changed in place: disable the stream and enable it again with \
             StreamViewType=NEW_AND_OLD_IMAGES (a new stream), before starting the backfill",
            info.name, s.view
        ))),
        None => anyhow::bail!(crate::cli::InputError(format!(
            "table `{}` has no stream. Enable one before the backfill starts: aws dynamodb update-table --table-name {} \
             --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES",
            info.name, info.name
        ))),
    };
    let store = StateStore::open(&opts.state_dir.join("tail"), plan)?;
    let mut rejects =
        RejectsFile::open_truncated(&opts.rejects, store.get("tail/rejects_len")?.unwrap_or(0))?;
    let control = Arc::new(Control::new(None, opts.write_rate));
    let mut report = TailReport::default();
    let mut iterators: HashMap<String, String> = HashMap::new();
    let mut last_record = Instant::now();
    progress.start("tail", None);
    loop {
        let backfill_done = opts.state_dir.join(BACKFILL_DONE).exists();
        if backfill_done && store.get::<bool>("tail/buffer_drained")? != Some(true) {
            drain_buffer(clients, plan, &store, &control, &mut rejects, &mut report).await?;
            store.put("tail/buffer_drained", &true)?;
            store.flush()?;
        }
        let shards = describe_shards(clients, &stream).await?;
        report.shards = shards.len();
        let states: HashMap<String, ShardState> = shards
            .iter()
            .map(|s| {
                Ok((
                    s.id.clone(),
                    store
                        .get::<ShardState>(&format!("tail/shard/{}", s.id))?
                        .unwrap_or_default(),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        let finished: HashSet<String> = states
            .iter()
            .filter(|(_, s)| s.finished)
            .map(|(k, _)| k.clone())
            .collect();
        let mut got_any = false;
        for shard in ready_shards(&shards, &finished) {
            let state = states.get(&shard).cloned().unwrap_or_default();
            if let Some(at) = state.at
                && now_secs() - at > RETENTION_SECONDS
            {
                anyhow::bail!(
                    "shard {shard}: the checkpoint is older than the stream's 24-hour retention, so records were lost; \
                         a new backfill is needed (start it with a fresh --state-dir)"
                );
            }
            let iterator = match iterators.remove(&shard) {
                Some(i) => i,
                None => shard_iterator(clients, &stream, &shard, state.seq.as_deref()).await?,
            };
            let out = clients
                .streams
                .get_records()
                .shard_iterator(&iterator)
                .limit(1000)
                .send()
                .await;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    let code = aws_sdk_dynamodbstreams::error::ProvideErrorMetadata::code(&e)
                        .unwrap_or("")
                        .to_string();
                    if code == "ExpiredIteratorException" {
                        // Re-get it from the checkpoint: nothing is skipped or repeated.
                        continue;
                    }
                    if code == "TrimmedDataAccessException" {
                        anyhow::bail!(
                            "shard {shard}: records were trimmed from the stream before the tail read them (TrimmedDataAccessException); \
                             changes were lost and a new backfill is needed"
                        );
                    }
                    let err = clients.error("GetRecords", &stream, e);
                    if err.is_throttle() || err.is_transient() {
                        tokio::time::sleep(backoff(2, jitter())).await;
                        continue;
                    }
                    return Err(err.into());
                }
            };
            let records = out.records();
            let mut seq = state.seq.clone();
            for r in records {
                let Some(d) = r.dynamodb() else { continue };
                let kind = match r.event_name() {
                    Some(OperationType::Insert) => ChangeKind::Insert,
                    Some(OperationType::Modify) => ChangeKind::Modify,
                    Some(OperationType::Remove) => ChangeKind::Remove,
                    _ => continue,
                };
                let ttl = r.user_identity().and_then(|u| u.principal_id())
                    == Some("dynamodb.amazonaws.com");
                let created = d
                    .approximate_creation_date_time()
                    .map(|t| t.as_secs_f64())
                    .unwrap_or_else(now_secs);
                let change = Change {
                    kind,
                    old: d.old_image().and_then(streams_item),
                    new: d.new_image().and_then(streams_item),
                    ttl,
                    at: created,
                };
                let s = d.sequence_number().unwrap_or_default().to_string();
                report.records += 1;
                if opts.state_dir.join(BACKFILL_DONE).exists()
                    && store.get::<bool>("tail/buffer_drained")? == Some(true)
                {
                    apply(clients, plan, &change, &control, &mut rejects, &mut report).await?;
                    report.last_lag_seconds = (now_secs() - created).max(0.0);
                } else {
                    store.put(
                        &format!(
                            "tail/buf/{:04}/{shard}/{}",
                            depth(&shards, &shard),
                            seq_key(&s)
                        ),
                        &change,
                    )?;
                    report.buffered += 1;
                }
                seq = Some(s);
            }
            got_any |= !records.is_empty();
            let finished_now = out.next_shard_iterator().is_none();
            if let Some(next) = out.next_shard_iterator() {
                iterators.insert(shard.clone(), next.to_string());
            }
            let len = rejects.flush_len()?;
            store.put_batch(&[
                (
                    &format!("tail/shard/{shard}"),
                    serde_json::to_value(ShardState {
                        seq,
                        finished: finished_now,
                        at: Some(now_secs()),
                    })?,
                ),
                ("tail/rejects_len", serde_json::to_value(len)?),
            ])?;
            store.flush()?;
        }
        progress.status(
            format!(
                "{} records, {} buffered, lag {:.1} s",
                report.records, report.buffered, report.last_lag_seconds
            ),
            serde_json::to_value(&report)?,
        );
        progress.update(report.records, 0.0);
        if got_any {
            last_record = Instant::now();
        } else {
            let drained = store.get::<bool>("tail/buffer_drained")? == Some(true);
            if let Some(idle) = opts.exit_when_idle
                && drained
                && last_record.elapsed() >= idle
            {
                break;
            }
            tokio::time::sleep(opts.poll_interval).await;
        }
    }
    progress.finish();
    rejects.flush_len()?;
    Ok(report)
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Generations from the oldest known ancestor: buffered records are applied
/// in this order, so a parent's records always precede its children's.
fn depth(shards: &[ShardInfo], id: &str) -> usize {
    let parents: BTreeMap<&str, Option<&str>> = shards
        .iter()
        .map(|s| (s.id.as_str(), s.parent.as_deref()))
        .collect();
    let mut d = 0;
    let mut cur = id;
    while let Some(Some(p)) = parents.get(cur) {
        d += 1;
        cur = p;
        if d > 10_000 {
            break;
        }
    }
    d
}

async fn describe_shards(clients: &Clients, stream: &str) -> anyhow::Result<Vec<ShardInfo>> {
    let mut shards = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let out = clients
            .streams
            .describe_stream()
            .stream_arn(stream)
            .set_exclusive_start_shard_id(start.take())
            .send()
            .await
            .map_err(|e| clients.error("DescribeStream", stream, e))?;
        let Some(desc) = out.stream_description() else {
            break;
        };
        for s in desc.shards() {
            shards.push(ShardInfo {
                id: s.shard_id().unwrap_or_default().to_string(),
                parent: s.parent_shard_id().map(str::to_string),
                closed: s
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .is_some(),
            });
        }
        match desc.last_evaluated_shard_id() {
            Some(last) => start = Some(last.to_string()),
            None => break,
        }
    }
    Ok(shards)
}

async fn shard_iterator(
    clients: &Clients,
    stream: &str,
    shard: &str,
    after: Option<&str>,
) -> anyhow::Result<String> {
    let mut req = clients
        .streams
        .get_shard_iterator()
        .stream_arn(stream)
        .shard_id(shard);
    req = match after {
        Some(seq) => req
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(seq),
        // No checkpoint: from the oldest record kept, which is at or before the
        // moment any backfill started after the stream was enabled.
        None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    let out = req
        .send()
        .await
        .map_err(|e| clients.error("GetShardIterator", stream, e))?;
    out.shard_iterator()
        .map(str::to_string)
        .context("GetShardIterator returned no iterator")
}

/// Apply the durable buffer in lineage order, deleting each entry once applied.
async fn drain_buffer(
    clients: &Clients,
    plan: &Plan,
    store: &StateStore,
    control: &Control,
    rejects: &mut RejectsFile,
    report: &mut TailReport,
) -> anyhow::Result<()> {
    for (key, change) in store.scan_prefix::<Change>("tail/buf/")? {
        apply(clients, plan, &change, control, rejects, report).await?;
        store.remove(&key)?;
    }
    store.flush()?;
    Ok(())
}

async fn apply(
    clients: &Clients,
    plan: &Plan,
    change: &Change,
    control: &Control,
    rejects: &mut RejectsFile,
    report: &mut TailReport,
) -> anyhow::Result<()> {
    for action in actions(plan, change) {
        match action {
            Action::Put(item) => {
                write(clients, &plan.target_table, control, |c| {
                    let item = to_sdk_item(&item);
                    async move {
                        c.dynamodb
                            .put_item()
                            .table_name(&plan.target_table)
                            .set_item(Some(item))
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(|e| c.error("PutItem", &plan.target_table, e))
                    }
                })
                .await?;
                report.puts += 1;
            }
            Action::Delete(key) => {
                write(clients, &plan.target_table, control, |c| {
                    let key = to_sdk_item(&key);
                    async move {
                        c.dynamodb
                            .delete_item()
                            .table_name(&plan.target_table)
                            .set_key(Some(key))
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(|e| c.error("DeleteItem", &plan.target_table, e))
                    }
                })
                .await?;
                report.deletes += 1;
            }
            Action::Reject { item, reason } => {
                rejects.write(&item, &format!("tail: {reason}"))?;
                report.rejected += 1;
            }
        }
    }
    Ok(())
}

/// One target write, retried through throttles and transient failures.
async fn write<'c, F, Fut>(
    clients: &'c Clients,
    table: &str,
    control: &Control,
    call: F,
) -> anyhow::Result<()>
where
    F: Fn(&'c Clients) -> Fut,
    Fut: std::future::Future<Output = Result<(), AwsError>>,
{
    let mut attempt = 0;
    let mut failures = 0;
    loop {
        control.acquire_write(1.0).await;
        match call(clients).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_throttle() => {
                control.write_throttled(&e, attempt).await;
                attempt = (attempt + 1).min(6);
            }
            Err(e) if e.is_transient() && failures < 10 => {
                failures += 1;
                tokio::time::sleep(backoff(failures, jitter())).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("tail write to `{table}`"))),
        }
    }
}

/// Mark the backfill complete for the tail (atomically: write, then rename).
pub fn mark_backfill_done(state_dir: &Path) -> anyhow::Result<()> {
    let tmp = state_dir.join(format!("{BACKFILL_DONE}.tmp"));
    std::fs::write(&tmp, b"done\n").with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, state_dir.join(BACKFILL_DONE))
        .with_context(|| format!("cannot write {}", state_dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = r#"
[source]
table = "s"
partition_key = "PK"
[target]
table = "t"
partition_key = "PK"
sort_key = "SK"
[options]
ttl_deletes = "ignore"
[[rule]]
match = { PK = "O#{id}" }
key = { PK = "ST#{@status}#{shard(id, 4)}", SK = "{id}" }
"#;

    fn plan() -> Plan {
        Plan::parse(PLAN, Path::new("p")).unwrap()
    }

    fn order(id: &str, status: &str) -> Item {
        let mut i = Item::new();
        i.insert("PK".into(), Value::S(format!("O#{id}")));
        i.insert("status".into(), Value::S(status.into()));
        i
    }

    fn change(kind: ChangeKind, old: Option<Item>, new: Option<Item>) -> Change {
        Change {
            kind,
            old,
            new,
            ttl: false,
            at: 0.0,
        }
    }

    #[test]
    fn a_key_changing_modify_deletes_the_old_target_key_first() {
        let p = plan();
        let a = actions(
            &p,
            &change(
                ChangeKind::Modify,
                Some(order("1", "OPEN")),
                Some(order("1", "DONE")),
            ),
        );
        assert_eq!(a.len(), 2);
        let Action::Delete(k) = &a[0] else {
            panic!("{a:?}")
        };
        assert!(matches!(&k["PK"], Value::S(s) if s.starts_with("ST#OPEN#")));
        let Action::Put(it) = &a[1] else { panic!() };
        assert!(matches!(&it["PK"], Value::S(s) if s.starts_with("ST#DONE#")));
        // The same key: just the put.
        let a = actions(
            &p,
            &change(
                ChangeKind::Modify,
                Some(order("1", "OPEN")),
                Some(order("1", "OPEN")),
            ),
        );
        assert!(matches!(a.as_slice(), [Action::Put(_)]));
    }

    #[test]
    fn removes_delete_the_transformed_old_key_and_ttl_follows_the_plan() {
        let p = plan();
        let a = actions(
            &p,
            &change(ChangeKind::Remove, Some(order("1", "OPEN")), None),
        );
        assert!(matches!(a.as_slice(), [Action::Delete(_)]));
        let mut ttl = change(ChangeKind::Remove, Some(order("1", "OPEN")), None);
        ttl.ttl = true;
        assert!(actions(&p, &ttl).is_empty(), "ttl_deletes = ignore");
    }

    #[test]
    fn an_item_that_stops_mapping_leaves_nothing_behind() {
        let p = plan();
        let mut bad = order("1", "OPEN");
        bad.remove("status");
        let a = actions(
            &p,
            &change(ChangeKind::Modify, Some(order("1", "OPEN")), Some(bad)),
        );
        assert!(
            matches!(a.as_slice(), [Action::Delete(_), Action::Reject { .. }]),
            "{a:?}"
        );
    }

    #[test]
    fn children_wait_for_their_parents() {
        let s = |id: &str, parent: Option<&str>| ShardInfo {
            id: id.into(),
            parent: parent.map(str::to_string),
            closed: false,
        };
        let shards = vec![
            s("a", None),
            s("b", Some("a")),
            s("c", Some("a")),
            s("d", Some("gone")),
        ];
        let mut done = HashSet::new();
        assert_eq!(ready_shards(&shards, &done), vec!["a", "d"]);
        done.insert("a".to_string());
        assert_eq!(ready_shards(&shards, &done), vec!["b", "c", "d"]);
        assert_eq!(depth(&shards, "b"), 1);
    }

    #[test]
    fn sequence_numbers_order_as_numbers() {
        assert!(seq_key("9") < seq_key("10"));
        assert!(seq_key("000100") == seq_key("100") || seq_key("100") > seq_key("99"));
    }
}
