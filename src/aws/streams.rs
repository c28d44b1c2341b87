//! DynamoDB Streams for both of rekey's readers — the tail and verify's
//! stream watch: the shard list and its lineage, iterators, and one GetRecords
//! call with one set of retry rules (throttles and transient failures are
//! retried with backoff; an expired iterator and trimmed records are told
//! apart, because only the caller knows how to resume). Records come back in
//! rekey's types.
//!
//! The pure half — which shards may be read, and how far a set of reads
//! covers the stream (`lag_and_through`) — lives here too, so both readers
//! make the same claims.

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_sdk_dynamodbstreams::types::{OperationType, ShardIteratorType};

use crate::aws::retry::{backoff, jitter};
use crate::aws::{AwsError, Clients};
use crate::core::value::{Item, Value};

#[derive(Debug, Clone)]
pub struct ShardInfo {
    pub id: String,
    pub parent: Option<String>,
    pub closed: bool,
}

/// Sequence numbers are decimal strings of up to 40 digits: compared (and
/// sorted as keys) by padding to a fixed width, never as text of varying width.
pub(crate) fn seq_key(seq: &str) -> String {
    format!("{seq:0>40}")
}

/// Shards whose records may be read now: not finished, and whose parent is
/// finished or unknown (trimmed away). Children after parents is what keeps
/// per-item order across splits.
pub(crate) fn ready_shards(shards: &[ShardInfo], finished: &HashSet<String>) -> Vec<String> {
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

/// Generations from the oldest known ancestor: buffered records are applied
/// in this order, so a parent's records always precede its children's.
pub fn depth(shards: &[ShardInfo], id: &str) -> usize {
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

/// Clocks may disagree by this much: a record's creation time (DynamoDB's
/// clock, whole seconds) is compared with the start of a barrier or a read
/// (this machine's). A record proves its shard read through its creation time
/// less this margin.
pub(crate) const CLOCK_MARGIN_SECONDS: f64 = 1.0;

/// What a record proves of its shard once read (and applied): every write
/// the shard holds from before this instant came before it. A barrier's
/// marker proves its barrier's start (it was written after); any record, its
/// creation time less the clock margin. An empty page proves nothing: on
/// DynamoDB an open shard may answer empty while records sit further on.
pub(crate) fn evidence(created_at: f64, marker_started_at: Option<f64>) -> f64 {
    let by_time = created_at - CLOCK_MARGIN_SECONDS;
    marker_started_at.map_or(by_time, |s| s.max(by_time))
}

/// Per-shard progress the tail tracks between checkpoints, for lag and barriers.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardProgress {
    /// The newest [`evidence`] among the records read (applied or buffered).
    pub record_at: Option<f64>,
}

/// One shard as [`through`] judges it.
#[derive(Debug, Clone)]
pub struct ShardThrough<'a> {
    pub id: &'a str,
    pub parent: Option<&'a str>,
    /// The newest [`evidence`] read from it.
    pub record_at: Option<f64>,
}

/// Each listed shard's own claim: its newest evidence, or its parent's —
/// a child holds only writes made after its parent closed, so after every
/// record the parent delivered.
fn claims(shards: &[ShardThrough]) -> HashMap<String, Option<f64>> {
    let by_id: HashMap<&str, &ShardThrough> = shards.iter().map(|s| (s.id, s)).collect();
    let mut out = HashMap::new();
    for s in shards {
        let mut best = s.record_at;
        let mut cur = s.parent;
        let mut hops = 0;
        while let Some(p) = cur.and_then(|p| by_id.get(p)) {
            best = match (best, p.record_at) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            cur = p.parent;
            hops += 1;
            if hops > 10_000 {
                break;
            }
        }
        out.insert(s.id.to_string(), best);
    }
    out
}

/// The instant before which every write in the stream has been read: the
/// least claim over the leaf shards (listed shards no listed shard names as
/// parent). A shard created after the listing is a child of a listed one,
/// whose claim covers it. None while any leaf has no claim.
pub fn through(shards: &[ShardThrough]) -> Option<f64> {
    let parents: HashSet<&str> = shards.iter().filter_map(|s| s.parent).collect();
    let claims = claims(shards);
    let mut least: Option<f64> = None;
    for s in shards.iter().filter(|s| !parents.contains(s.id)) {
        let c = claims.get(s.id).copied().flatten()?;
        least = Some(least.map_or(c, |l: f64| l.min(c)));
    }
    least
}

/// Lag (seconds behind `now`) of the whole stream and of each shard.
pub(crate) fn lags(
    shards: &[ShardThrough],
    now: f64,
) -> (Option<f64>, HashMap<String, Option<f64>>) {
    let per = claims(shards)
        .into_iter()
        .map(|(id, c)| (id, c.map(|c| (now - c).max(0.0))))
        .collect();
    (through(shards).map(|t| (now - t).max(0.0)), per)
}

pub fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub(crate) async fn describe_shards(
    clients: &Clients,
    stream: &str,
) -> Result<Vec<ShardInfo>, AwsError> {
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
            .map_err(|e| clients.streams_error("DescribeStream", stream, e))?;
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

/// Where an iterator starts.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    /// The oldest record kept.
    TrimHorizon,
    /// After the newest record: only what is written from now on.
    Latest,
    After(&'a str),
}

pub async fn shard_iterator(
    clients: &Clients,
    stream: &str,
    shard: &str,
    start: Start<'_>,
) -> Result<String, AwsError> {
    let req = clients
        .streams
        .get_shard_iterator()
        .stream_arn(stream)
        .shard_id(shard);
    let req = match start {
        Start::After(seq) => req
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(seq),
        Start::TrimHorizon => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        Start::Latest => req.shard_iterator_type(ShardIteratorType::Latest),
    };
    let out = req
        .send()
        .await
        .map_err(|e| clients.streams_error("GetShardIterator", stream, e))?;
    out.shard_iterator
        .ok_or_else(|| clients.streams_missing("GetShardIterator", stream, "no iterator"))
}

/// What a record did to its item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Insert,
    Modify,
    Remove,
}

/// One stream record in rekey's types.
#[derive(Debug, Clone)]
pub struct Record {
    pub seq: String,
    pub kind: RecordKind,
    /// The item's primary key.
    pub keys: Option<Item>,
    pub old: Option<Item>,
    pub new: Option<Item>,
    /// A delete by DynamoDB's TTL process, not by the application.
    pub ttl: bool,
    /// `ApproximateCreationDateTime`, epoch seconds.
    pub created_at: Option<f64>,
}

/// One GetRecords answer.
#[derive(Debug)]
pub struct Page {
    pub records: Vec<Record>,
    /// None: the shard is closed and read to its end.
    pub next: Option<String>,
}

/// Why a GetRecords call did not return records.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The iterator is older than 15 minutes: get a new one from the last
    /// record read.
    #[error("the shard iterator expired")]
    Expired,
    /// Records were trimmed (24-hour retention) before they were read.
    #[error(
        "records were trimmed from the stream before they were read (TrimmedDataAccessException)"
    )]
    Trimmed,
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// Records asked for per GetRecords call (DynamoDB's maximum).
pub(crate) const PAGE: i32 = 1000;
/// Throttled or failed GetRecords calls retried before giving up.
const MAX_RETRIES: u32 = 10;

/// One GetRecords call: throttles and transient failures are retried with
/// backoff (the iterator stays valid), up to `MAX_RETRIES` times.
pub async fn get_records(
    clients: &Clients,
    stream: &str,
    iterator: &str,
    limit: i32,
) -> Result<Page, ReadError> {
    let mut failures = 0;
    loop {
        let out = clients
            .streams
            .get_records()
            .shard_iterator(iterator)
            .limit(limit)
            .send()
            .await;
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                let code = aws_sdk_dynamodbstreams::error::ProvideErrorMetadata::code(&e)
                    .unwrap_or("")
                    .to_string();
                match code.as_str() {
                    "ExpiredIteratorException" => return Err(ReadError::Expired),
                    "TrimmedDataAccessException" => return Err(ReadError::Trimmed),
                    _ => {}
                }
                let err = clients.streams_error("GetRecords", stream, e);
                if (err.is_throttle() || err.is_transient()) && failures < MAX_RETRIES {
                    failures += 1;
                    tracing::info!(action = "GetRecords", stream, failures, error = %err, "retrying");
                    tokio::time::sleep(backoff(failures, jitter())).await;
                    continue;
                }
                return Err(err.into());
            }
        };
        let records = out.records().iter().filter_map(record).collect();
        return Ok(Page {
            records,
            next: out.next_shard_iterator,
        });
    }
}

fn record(r: &aws_sdk_dynamodbstreams::types::Record) -> Option<Record> {
    let d = r.dynamodb()?;
    let kind = match r.event_name()? {
        OperationType::Insert => RecordKind::Insert,
        OperationType::Modify => RecordKind::Modify,
        OperationType::Remove => RecordKind::Remove,
        _ => return None,
    };
    Some(Record {
        seq: d.sequence_number().unwrap_or_default().to_string(),
        kind,
        keys: d.keys().and_then(streams_item),
        old: d.old_image().and_then(streams_item),
        new: d.new_image().and_then(streams_item),
        ttl: r.user_identity().and_then(|u| u.principal_id()) == Some("dynamodb.amazonaws.com"),
        created_at: d.approximate_creation_date_time().map(|t| t.as_secs_f64()),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn shard<'a>(id: &'a str, parent: Option<&'a str>, at: Option<f64>) -> ShardThrough<'a> {
        ShardThrough {
            id,
            parent,
            record_at: at,
        }
    }

    #[test]
    fn through_is_held_back_by_the_slowest_leaf_and_an_empty_shard_claims_nothing() {
        let s = [shard("a", None, Some(95.0)), shard("b", None, Some(90.0))];
        assert_eq!(through(&s), Some(90.0));
        let (lag, per) = lags(&s, 101.0);
        assert_eq!(lag, Some(11.0));
        assert_eq!(per["a"], Some(6.0));
        // A shard that only ever answered empty pages claims nothing.
        let s = [shard("a", None, Some(95.0)), shard("quiet", None, None)];
        assert_eq!(through(&s), None);
    }

    /// Regression (issue 25): an empty page used to prove its shard read to
    /// "now"; on DynamoDB an open shard answers empty while records sit
    /// further on. Only records prove anything, and a child inherits its
    /// parent's proof, not more.
    #[test]
    fn a_child_claims_its_parents_proof_until_it_delivers_its_own() {
        let s = [
            shard("p", None, Some(95.0)),
            shard("c1", Some("p"), None),
            shard("c2", Some("p"), Some(99.0)),
        ];
        assert_eq!(
            through(&s),
            Some(95.0),
            "c1 holds only writes after p closed"
        );
        let s = [shard("p", None, None), shard("c", Some("p"), None)];
        assert_eq!(through(&s), None);
        // A parent trimmed away: the child stands alone.
        let s = [shard("c", Some("gone"), Some(50.0))];
        assert_eq!(through(&s), Some(50.0));
    }

    #[test]
    fn a_marker_proves_its_barriers_start_a_record_its_time_less_the_margin() {
        assert_eq!(evidence(100.0, None), 100.0 - CLOCK_MARGIN_SECONDS);
        assert_eq!(evidence(100.0, Some(100.4)), 100.4);
        assert_eq!(evidence(100.0, Some(50.0)), 100.0 - CLOCK_MARGIN_SECONDS);
    }

    #[test]
    fn sequence_numbers_order_as_numbers() {
        assert!(seq_key("9") < seq_key("10"));
        assert!(seq_key("000100") == seq_key("100") || seq_key("100") > seq_key("99"));
    }
}
