//! Target-key claims across workers: `pk = CLAIM#<id>#<md5 of the encoded
//! target key>`, holding the encoded source key that owns it. A claim is a
//! put conditioned on "absent, or already this source's", so a rerun of a
//! page (after kill -9, or by the next holder of a unit) claims again what it
//! claimed before, and a second source item for one target key learns whose
//! it is.
//!
//! Why transactions: one PutItem per item costs a request per item, and a
//! request costs a worker far more CPU than the item itself (BENCHMARKS.md
//! (h2): ~390 µs per claim against ~15 µs per item for the rest of the
//! backfill). A TransactWriteItems carries up to 100 claims: the common case,
//! no collision, is one request per 100 items. Its price is DynamoDB's: a
//! transactional write costs two write units, so claims spend twice the
//! control table's write units of single puts. A cancelled transaction writes
//! nothing; the refused claims come back with their holder (ALL_OLD) and the
//! rest are sent again. Plans that `rekey check` proves collision-free send
//! no claims at all.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use md5::{Digest, Md5};

use super::{Fleet, FleetError, PK, SK, exprs, hex, s};
use crate::aws::control::{PUTS_PER_TRANSACTION, Puts};
use crate::core::value::{Item, Value};
use crate::state::claims::{Claim, Owners};

/// Transactions cancelled with nothing refused (conflicts with another
/// worker's claims of the same keys, throttles) in a row before the page
/// gives up: DynamoDB's own retry budget for one request is of that order.
const CANCELS_IN_A_ROW: u32 = 10;

/// What one transaction settled: owners found, and claims to send again.
struct Settled {
    owners: Vec<(usize, Option<Vec<u8>>)>,
    again: Vec<usize>,
}

impl Fleet {
    fn claim_pk(&self, tk: &[u8]) -> String {
        format!("CLAIM#{}#{}", self.at.migration, hex(&Md5::digest(tk)))
    }

    /// Claims each target key for its source key (both encoded), `at_once`
    /// transactions in flight: who holds each (None: that source item).
    pub async fn claim_all(&self, keys: &[Claim], at_once: usize) -> Result<Owners, FleetError> {
        let pks: Vec<String> = keys.iter().map(|(tk, _)| self.claim_pk(tk)).collect();
        let mut owners: Owners = vec![None; keys.len()];
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let mut cancels = 0;
        while !pending.is_empty() {
            let (round, later) = distinct_round(&pks, pending);
            let chunks: Vec<Vec<usize>> = round
                .chunks(PUTS_PER_TRANSACTION)
                .map(<[usize]>::to_vec)
                .collect();
            let pks = &pks;
            let settled: Vec<Settled> = stream::iter(chunks)
                .map(|chunk| async move { self.claim_chunk(keys, pks, &chunk).await })
                .buffer_unordered(at_once.max(1))
                .try_collect()
                .await?;
            let mut again = later;
            let mut progress = false;
            for s in settled {
                progress |= !s.owners.is_empty();
                for (i, owner) in s.owners {
                    owners[i] = owner;
                }
                again.extend(s.again);
            }
            cancels = if progress { 0 } else { cancels + 1 };
            if cancels >= CANCELS_IN_A_ROW {
                return Err(self.malformed(
                    &pks[again[0]],
                    "claims cancelled again and again with no claim refused (conflicts or throttles)",
                ));
            }
            if cancels > 0 {
                tokio::time::sleep(Duration::from_millis(20 << cancels.min(6))).await;
            }
            again.sort_unstable();
            pending = again;
        }
        Ok(owners)
    }

    /// One transaction of claims (distinct keys).
    async fn claim_chunk(
        &self,
        keys: &[Claim],
        pks: &[String],
        chunk: &[usize],
    ) -> Result<Settled, FleetError> {
        let puts: Vec<_> = chunk
            .iter()
            .map(|&i| claim_put(&pks[i], &keys[i].0, &keys[i].1))
            .collect();
        let refused = match self.control.put_all_if(&puts).await? {
            Puts::Written => {
                return Ok(Settled {
                    owners: chunk.iter().map(|&i| (i, None)).collect(),
                    again: Vec::new(),
                });
            }
            Puts::Cancelled(refused) => refused,
        };
        let mut owners = Vec::with_capacity(refused.len());
        for (at, held) in refused {
            let i = chunk[at];
            let held = match held {
                Some(item) => Some(item),
                None => self.control.get(&pks[i], "CLAIM").await?,
            };
            match held.as_ref().and_then(|h| h.get("src")) {
                Some(Value::B(other)) => owners.push((i, Some(other.clone()))),
                _ => return Err(self.malformed(&pks[i], "a refused claim has no source")),
            }
        }
        let again = chunk
            .iter()
            .copied()
            .filter(|i| !owners.iter().any(|(o, _)| o == i))
            .collect();
        Ok(Settled { owners, again })
    }
}

/// The claim item and its condition: absent, or already `src`'s.
fn claim_put(pk: &str, tk: &[u8], src: &[u8]) -> (Item, crate::aws::item::Expressions) {
    let mut it = Item::new();
    it.insert(PK.into(), s(pk));
    it.insert(SK.into(), s("CLAIM"));
    it.insert("src".into(), Value::B(src.to_vec()));
    it.insert("tk".into(), Value::B(tk.to_vec()));
    let e = exprs(
        "",
        "attribute_not_exists(#pk) OR #src = :src",
        &["pk", "src"],
        vec![(":src", Value::B(src.to_vec()))],
    );
    (it, e)
}

/// The first of `pending` for each claim key, in order, and the rest: a
/// transaction may not hold two actions on one item, and the second claim of
/// a key must see the first's outcome anyway (it is refused, and learns the
/// first source as the holder).
fn distinct_round(pks: &[String], pending: Vec<usize>) -> (Vec<usize>, Vec<usize>) {
    let mut seen = std::collections::HashSet::new();
    pending
        .into_iter()
        .partition(|&i| seen.insert(pks[i].as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_holds_each_key_once_and_defers_the_repeats_in_order() {
        let pks: Vec<String> = ["a", "b", "a", "c", "b", "a"].map(String::from).to_vec();
        let (round, later) = distinct_round(&pks, (0..6).collect());
        assert_eq!(round, vec![0, 1, 3]);
        assert_eq!(later, vec![2, 4, 5]);
        let (round, later) = distinct_round(&pks, later);
        assert_eq!(round, vec![2, 4]);
        assert_eq!(later, vec![5]);
    }
}
