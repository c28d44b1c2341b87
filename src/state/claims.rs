//! The claim index: which source item owns each target key. The backfill
//! claims before writing; verify records the keys it expects the same way.
//!
//! Two source items that the plan maps to one target key would overwrite each
//! other in the target. The backfill claims every target key before writing
//! it; a second claimant is a collision, rejected and never written. The index
//! holds an entry per item, so it lives on disk in redb, whose page cache is
//! capped: memory stays flat however large the table (sled, which holds the
//! checkpoints, keeps per-page bookkeeping in memory and grew by ~140 MiB per
//! million claims).
//!
//! Keys are the MD5 of the encoded target key — 16 bytes however long the key,
//! which keeps the B-tree small and its cache effective. A true collision
//! always has equal digests, so it is always caught; two different target keys
//! with equal digests (odds about n²/2¹²⁹) would be reported as a collision and
//! rejected — loud, never a silent overwrite. The value is the full encoded
//! source key, so the report names the real owner.
//!
//! Invariant: a page's claims are durable before its checkpoint is, so after
//! kill -9 a claim is never missing for an item the checkpoint says was
//! written; a rerun re-claims with the same source key, which is no collision.

use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

const CLAIMS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("claims");

/// redb's page cache. Lookups are random, so a bigger cache buys little.
const CACHE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
#[error("claim index {path}: {detail}")]
pub struct ClaimsError {
    path: PathBuf,
    detail: String,
}

pub struct Claims {
    db: Database,
    path: PathBuf,
}

impl Claims {
    /// Open (or create) the index at `path`.
    pub fn open(path: &Path) -> Result<Claims, ClaimsError> {
        let err = |e: &dyn std::fmt::Display| ClaimsError {
            path: path.to_path_buf(),
            detail: e.to_string(),
        };
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| err(&e))?;
        Ok(Claims {
            db,
            path: path.to_path_buf(),
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> ClaimsError {
        ClaimsError {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// Claim each `(target key, source key)` pair, durably, in one transaction.
    /// Returns, per pair, the other source key when a different source item
    /// owns the target key already (also when it claimed it earlier in this
    /// same batch).
    pub fn claim_all(
        &self,
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<Vec<Option<Vec<u8>>>, ClaimsError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let tx = self.db.begin_write().map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(pairs.len());
        {
            let mut table = tx.open_table(CLAIMS).map_err(|e| self.err(e))?;
            for (target, source) in pairs {
                let digest = Md5::digest(target);
                let owner = table
                    .get(&digest[..])
                    .map_err(|e| self.err(e))?
                    .map(|v| v.value().to_vec());
                out.push(match owner {
                    Some(owner) if owner != *source => Some(owner),
                    Some(_) => None,
                    None => {
                        table
                            .insert(&digest[..], &source[..])
                            .map_err(|e| self.err(e))?;
                        None
                    }
                });
            }
        }
        tx.commit().map_err(|e| self.err(e))?;
        Ok(out)
    }

    /// The source key that owns `target`, if any.
    pub fn owner(&self, target: &[u8]) -> Result<Option<Vec<u8>>, ClaimsError> {
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = match tx.open_table(CLAIMS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        let digest = Md5::digest(target);
        Ok(table
            .get(&digest[..])
            .map_err(|e| self.err(e))?
            .map(|v| v.value().to_vec()))
    }

    /// Forget every claim (a verify that starts over).
    pub fn clear(&self) -> Result<(), ClaimsError> {
        let tx = self.db.begin_write().map_err(|e| self.err(e))?;
        match tx.delete_table(CLAIMS) {
            Ok(_) => {}
            Err(e) => return Err(self.err(e)),
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// How many target keys are claimed.
    pub fn count(&self) -> Result<u64, ClaimsError> {
        use redb::ReadableTableMetadata;
        let tx = self.db.begin_read().map_err(|e| self.err(e))?;
        match tx.open_table(CLAIMS) {
            Ok(t) => t.len().map_err(|e| self.err(e)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(self.err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(t: &str, s: &str) -> (Vec<u8>, Vec<u8>) {
        (t.as_bytes().to_vec(), s.as_bytes().to_vec())
    }

    #[test]
    fn second_claimant_is_a_collision_and_reruns_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::open(&dir.path().join("claims.redb")).unwrap();
        assert_eq!(
            c.claim_all(&[pair("t1", "s1"), pair("t2", "s2")]).unwrap(),
            vec![None, None]
        );
        // The same source again (a rerun after a crash) is no collision.
        assert_eq!(c.claim_all(&[pair("t1", "s1")]).unwrap(), vec![None]);
        assert_eq!(
            c.claim_all(&[pair("t1", "s3")]).unwrap(),
            vec![Some(b"s1".to_vec())]
        );
        assert_eq!(c.count().unwrap(), 2);
        assert_eq!(c.owner(b"t2").unwrap(), Some(b"s2".to_vec()));
        assert_eq!(c.owner(b"t9").unwrap(), None);
        c.clear().unwrap();
        assert_eq!(c.count().unwrap(), 0);
        assert_eq!(c.claim_all(&[pair("t1", "s3")]).unwrap(), vec![None]);
    }

    #[test]
    fn collisions_within_one_batch_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::open(&dir.path().join("claims.redb")).unwrap();
        assert_eq!(
            c.claim_all(&[pair("t", "a"), pair("t", "b"), pair("t", "a")])
                .unwrap(),
            vec![None, Some(b"a".to_vec()), None]
        );
    }

    #[test]
    fn claims_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.redb");
        {
            let c = Claims::open(&path).unwrap();
            c.claim_all(&[pair("t", "a")]).unwrap();
        }
        let c = Claims::open(&path).unwrap();
        assert_eq!(
            c.claim_all(&[pair("t", "b")]).unwrap(),
            vec![Some(b"a".to_vec())]
        );
    }
}
