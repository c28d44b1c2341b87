//! The verify's items in a fleet's control table (`rekey verify --state
//! dynamodb://…`): its units are `VUNIT#<n>` items leased as the backfill's
//! are ([`Fleet::verify`]), each committing its page's counters (verify's
//! [`Counts`]) and a sample of its confirmed differences (`diffs`) under the
//! lease; `VERIFY` holds the run: `started_ms` (set once, by the first
//! process), then `finished_ms`, `clean` and the summed counters, written
//! once every unit is done — what a fleet cutover gates on.

use serde::Serialize;

use crate::aws::control::Cond;
use crate::core::value::{Item, Value};
use crate::state::snapshot::Counts;

use super::{Fleet, FleetError, exprs, inum, n, num, s, text, wall_ms};

/// The fleet verify's record (`VERIFY`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyVerdict {
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    pub clean: Option<bool>,
    pub counts: Option<Counts>,
}

/// What one verify unit committed.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyUnit {
    pub n: u32,
    pub done: bool,
    pub counts: Counts,
    /// Confirmed differences (JSON), up to the sample kept per unit.
    pub diffs: Vec<String>,
}

/// The names of verify's counters, as the unit items store them.
pub fn count_names() -> Vec<String> {
    match serde_json::to_value(Counts::default()) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// `c` as (name, value) pairs, the form [`Fleet::commit_counts`] adds.
pub fn count_pairs(c: &Counts) -> Vec<(String, u64)> {
    match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
            .filter(|(_, v)| *v > 0)
            .collect(),
        _ => Vec::new(),
    }
}

fn counts_of(it: &Item) -> Counts {
    let m: serde_json::Map<String, serde_json::Value> = count_names()
        .into_iter()
        .map(|k| {
            let v = num(it, &k);
            (k, v.into())
        })
        .collect();
    serde_json::from_value(serde_json::Value::Object(m)).unwrap_or_default()
}

impl Fleet {
    /// The verify's record, started now unless another process started it
    /// first: its start time.
    pub async fn start_verify(&self) -> Result<i64, FleetError> {
        let e = exprs(
            "SET #started_ms = if_not_exists(#started_ms, :now)",
            "attribute_not_exists(#pk) OR attribute_exists(#pk)",
            &["started_ms", "pk"],
            vec![(":now", n(wall_ms()))],
        );
        self.control.update_if(&self.pk(), "VERIFY", &e).await?;
        let v = self
            .verify_verdict()
            .await?
            .ok_or_else(|| self.malformed("VERIFY", "missing after it was written"))?;
        Ok(v.started_ms)
    }

    /// The verdict, written once (the first process to see every unit done).
    pub async fn finish_verify(&self, counts: &Counts) -> Result<Cond, FleetError> {
        let json = serde_json::to_string(counts).map_err(|e| self.malformed("VERIFY", e))?;
        let e = exprs(
            "SET #finished_ms = :now, #clean = :clean, #counts = :counts",
            "attribute_not_exists(#finished_ms)",
            &["finished_ms", "clean", "counts"],
            vec![
                (":now", n(wall_ms())),
                (":clean", Value::Bool(counts.differences() == 0)),
                (":counts", s(&json)),
            ],
        );
        Ok(self.control.update_if(&self.pk(), "VERIFY", &e).await?)
    }

    /// The fleet verify's record, if one started.
    pub async fn verify_verdict(&self) -> Result<Option<VerifyVerdict>, FleetError> {
        let Some(it) = self.control.get(&self.pk(), "VERIFY").await? else {
            return Ok(None);
        };
        let counts = match text(&it, "counts") {
            Some(j) => Some(serde_json::from_str(j).map_err(|e| self.malformed("VERIFY", e))?),
            None => None,
        };
        Ok(Some(VerifyVerdict {
            started_ms: inum(&it, "started_ms"),
            finished_ms: it
                .contains_key("finished_ms")
                .then(|| inum(&it, "finished_ms")),
            clean: match it.get("clean") {
                Some(Value::Bool(b)) => Some(*b),
                _ => None,
            },
            counts,
        }))
    }

    /// Every verify unit's committed counters and differences.
    pub async fn verify_units(&self) -> Result<Vec<VerifyUnit>, FleetError> {
        let items = self.control.query_prefix(&self.pk(), "VUNIT#").await?;
        Ok(items
            .iter()
            .map(|it| VerifyUnit {
                n: num(it, "unit") as u32,
                done: matches!(it.get("done"), Some(Value::Bool(true))),
                counts: counts_of(it),
                diffs: match it.get("diffs") {
                    Some(Value::L(l)) => l
                        .iter()
                        .filter_map(|v| match v {
                            Value::S(x) => Some(x.clone()),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                },
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_counts_go_to_the_unit_item_and_back_by_name() {
        let c = Counts {
            scanned: 7,
            matched: 5,
            missing: 1,
            different: 1,
            target_scanned: 6,
            target_matched: 5,
            orphans: 1,
            ..Default::default()
        };
        let mut it = Item::new();
        for (k, v) in count_pairs(&c) {
            it.insert(k, Value::N(v.to_string()));
        }
        assert_eq!(counts_of(&it), c);
        assert!(count_pairs(&Counts::default()).is_empty());
        assert!(count_names().contains(&"pending_orphans".to_string()));
    }
}
