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
//!
//! Claims are group-committed on a thread of their own, in two steps. A redb
//! commit writes every B-tree leaf it dirtied and fsyncs; with digests for
//! keys a page of 2,000 claims dirties ~2,000 leaves, so the durable commit,
//! not the lookups, was the cost (BENCHMARKS.md (f3)). So [`Claims::claim_all`]
//! commits in memory only (redb's `Durability::None`: visible to every later
//! claim, lost by a crash) and answers at once with a [`Ticket`]; the caller
//! writes its items and, before its checkpoint, waits in
//! [`Claims::durable`] for one durable commit that covers every claim made
//! up to then, by any page. A crash before that loses the claims but also the
//! checkpoint, so the page is read and claimed again; a page that saw another's
//! claim (a collision) holds a later ticket, so its checkpoint is durable only
//! after the claim it saw.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use md5::{Digest, Md5};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

const CLAIMS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("claims");

/// redb's page cache. Lookups are random, so a bigger cache buys little.
const CACHE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, thiserror::Error)]
#[error("claim index {path}: {detail}")]
pub struct ClaimsError {
    path: PathBuf,
    detail: String,
}

/// One `(encoded target key, encoded source key)` claim.
pub type Claim = (Vec<u8>, Vec<u8>);

/// Per claim, `None` (this source owns the target key) or the other owner.
pub type Owners = Vec<Option<Vec<u8>>>;

/// The in-memory commit that holds a call's claims; [`Claims::durable`]
/// waits until it is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Ticket(u64);

/// What [`Claims::claim_all`] answers: the pairs as sent, their owners, and
/// the ticket to wait on before a checkpoint.
#[derive(Debug)]
pub struct Claimed {
    pub pairs: Vec<Claim>,
    pub owners: Owners,
    pub ticket: Ticket,
}

type Reply<T> = oneshot::Sender<Result<T, ClaimsError>>;

/// Work for the committer.
enum Request {
    Claim(Vec<Claim>, Reply<Claimed>),
    Durable(Ticket, Reply<()>),
}

/// A handle on the index; clones share one database and one committer.
#[derive(Clone)]
pub struct Claims {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    path: PathBuf,
    queue: Mutex<Option<mpsc::Sender<Request>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    /// Close the queue and wait for the committer, so the file is closed
    /// (and can be reopened) when the last handle goes.
    fn drop(&mut self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        if let Some(t) = self.committer.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// Creates an empty index at `path` all at once: built beside it, made
/// durable, then renamed into place. A kill -9 while redb wrote a new file's
/// header left a file that is not a database ("magic number mismatch") at
/// `path`, and every rerun refused it; now `path` is either absent or whole,
/// and a half-built file beside it is overwritten by the next try.
fn create_whole(path: &Path) -> Result<(), ClaimsError> {
    let new = path.with_extension("redb.new");
    let _ = std::fs::remove_file(&new);
    drop(Database::create(&new).map_err(|e| error(path, e))?);
    std::fs::File::open(&new)
        .and_then(|f| f.sync_all())
        .map_err(|e| error(path, e))?;
    std::fs::rename(&new, path).map_err(|e| error(path, e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The rename is durable once the directory is.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| error(path, e))?;
    }
    Ok(())
}

fn error(path: &Path, e: impl std::fmt::Display) -> ClaimsError {
    ClaimsError {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

impl Claims {
    /// Open (or create) the index at `path` and start its committer.
    pub fn open(path: &Path) -> Result<Claims, ClaimsError> {
        if !path.exists() {
            create_whole(path)?;
        }
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| error(path, e))?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel();
        let committer = std::thread::Builder::new()
            .name("rekey-claims".into())
            .spawn({
                let (db, path) = (db.clone(), path.to_path_buf());
                move || commit_loop(&db, &path, rx)
            })
            .map_err(|e| error(path, e))?;
        Ok(Claims {
            inner: Arc::new(Inner {
                db,
                path: path.to_path_buf(),
                queue: Mutex::new(Some(tx)),
                committer: Mutex::new(Some(committer)),
            }),
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> ClaimsError {
        error(&self.inner.path, e)
    }

    fn send<T>(
        &self,
        request: impl FnOnce(Reply<T>) -> Request,
    ) -> oneshot::Receiver<Result<T, ClaimsError>> {
        let (reply, answer) = oneshot::channel();
        if let Ok(q) = self.inner.queue.lock()
            && let Some(q) = q.as_ref()
        {
            // A send fails only when the committer is gone; the dropped
            // reply then ends the wait below with an error.
            let _ = q.send(request(reply));
        }
        answer
    }

    async fn ask<T>(&self, request: impl FnOnce(Reply<T>) -> Request) -> Result<T, ClaimsError> {
        self.send(request)
            .await
            .map_err(|_| self.err("the committer has stopped"))?
    }

    /// Claim each `(target key, source key)` pair, in memory (see the module
    /// docs). Per pair, the other source key when a different source item
    /// owns the target key already (also when it claimed it earlier in this
    /// same call, or in a call committed with it).
    pub async fn claim_all(&self, pairs: Vec<Claim>) -> Result<Claimed, ClaimsError> {
        self.ask(|reply| Request::Claim(pairs, reply)).await
    }

    /// Wait until the claims of `ticket`, and every claim before them, are on disk.
    pub async fn durable(&self, ticket: Ticket) -> Result<(), ClaimsError> {
        self.ask(|reply| Request::Durable(ticket, reply)).await
    }

    /// Claim and wait until the claims are on disk.
    pub async fn claim_durably(&self, pairs: Vec<Claim>) -> Result<Claimed, ClaimsError> {
        let claimed = self.claim_all(pairs).await?;
        self.durable(claimed.ticket).await?;
        Ok(claimed)
    }

    /// The source key that owns `target`, if any.
    pub fn owner(&self, target: &[u8]) -> Result<Option<Vec<u8>>, ClaimsError> {
        let tx = self.inner.db.begin_read().map_err(|e| self.err(e))?;
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
        let tx = self.inner.db.begin_write().map_err(|e| self.err(e))?;
        match tx.delete_table(CLAIMS) {
            Ok(_) => {}
            Err(e) => return Err(self.err(e)),
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// How many target keys are claimed.
    #[cfg(test)]
    pub(crate) fn count(&self) -> Result<u64, ClaimsError> {
        use redb::ReadableTableMetadata;
        let tx = self.inner.db.begin_read().map_err(|e| self.err(e))?;
        match tx.open_table(CLAIMS) {
            Ok(t) => t.len().map_err(|e| self.err(e)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(self.err(e)),
        }
    }
}

/// The committer: take every request queued; claim them in order in one
/// transaction; commit it durably when a caller waits on durability, else in
/// memory; answer each. Ends when every handle is gone.
fn commit_loop(db: &Database, path: &Path, rx: mpsc::Receiver<Request>) {
    let (mut committed, mut durable) = (Ticket(0), Ticket(0));
    while let Ok(first) = rx.recv() {
        let (mut claims, mut waits) = (Vec::new(), Vec::new());
        for r in std::iter::once(first).chain(rx.try_iter()) {
            match r {
                Request::Claim(pairs, reply) => claims.push((pairs, reply)),
                Request::Durable(t, reply) if t <= durable => {
                    let _ = reply.send(Ok(()));
                }
                Request::Durable(_, reply) => waits.push(reply),
            }
        }
        let sync = !waits.is_empty();
        if claims.is_empty() && !sync {
            continue;
        }
        let group: Vec<&[Claim]> = claims.iter().map(|(p, _)| &p[..]).collect();
        let outcome = claim_group(db, path, &group, sync);
        if outcome.is_ok() {
            committed = Ticket(committed.0 + 1);
            if sync {
                durable = committed;
            }
        }
        match outcome {
            Ok(owners) => {
                for ((pairs, reply), owners) in claims.into_iter().zip(owners) {
                    let ticket = committed;
                    let _ = reply.send(Ok(Claimed {
                        pairs,
                        owners,
                        ticket,
                    }));
                }
                for reply in waits {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                for (_, reply) in claims {
                    let _ = reply.send(Err(e.clone()));
                }
                for reply in waits {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// One transaction for a group of callers' claims, in order; durable (which
/// also persists every in-memory commit before it) or in memory.
fn claim_group(
    db: &Database,
    path: &Path,
    group: &[&[Claim]],
    durable: bool,
) -> Result<Vec<Owners>, ClaimsError> {
    let err = |e: &dyn std::fmt::Display| error(path, e);
    let mut tx = db.begin_write().map_err(|e| err(&e))?;
    if !durable {
        tx.set_durability(Durability::None).map_err(|e| err(&e))?;
    }
    let mut out = Vec::with_capacity(group.len());
    {
        let mut table = tx.open_table(CLAIMS).map_err(|e| err(&e))?;
        for pairs in group {
            let mut owners = Vec::with_capacity(pairs.len());
            for (target, source) in pairs.iter() {
                let digest = Md5::digest(target);
                let owner = table.get(&digest[..]).map_err(|e| err(&e))?;
                let owner = owner.map(|v| v.value().to_vec());
                owners.push(match owner {
                    Some(owner) if owner != *source => Some(owner),
                    Some(_) => None,
                    None => {
                        table
                            .insert(&digest[..], &source[..])
                            .map_err(|e| err(&e))?;
                        None
                    }
                });
            }
            out.push(owners);
        }
    }
    tx.commit().map_err(|e| err(&e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(t: &str, s: &str) -> (Vec<u8>, Vec<u8>) {
        (t.as_bytes().to_vec(), s.as_bytes().to_vec())
    }

    /// The owners `claim_all` answers for `pairs`.
    async fn claim(c: &Claims, pairs: &[(Vec<u8>, Vec<u8>)]) -> Owners {
        let claimed = c.claim_durably(pairs.to_vec()).await.unwrap();
        assert_eq!(claimed.pairs, pairs, "the pairs come back as sent");
        claimed.owners
    }

    #[tokio::test]
    async fn a_claim_index_killed_while_being_created_is_created_again() {
        // What kill -9 left in the middle of redb writing a new file: the
        // half-built file beside the index, never the index itself.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.redb");
        std::fs::write(path.with_extension("redb.new"), b"redb\0half").unwrap();
        let c = Claims::open(&path).unwrap();
        assert_eq!(claim(&c, &[pair("t1", "s1")]).await, vec![None]);
        drop(c);
        let c = Claims::open(&path).unwrap();
        assert_eq!(c.owner(b"t1").unwrap(), Some(b"s1".to_vec()));
        assert!(!path.with_extension("redb.new").exists());
        drop(c);
        // A file at the index's own path that is not a database is another
        // program's or a disk's doing: refused, not replaced.
        std::fs::write(&path, b"not a database").unwrap();
        let e = Claims::open(&path)
            .err()
            .expect("a foreign file is refused");
        assert!(e.to_string().contains("claims.redb"), "{e}");
    }

    #[tokio::test]
    async fn second_claimant_is_a_collision_and_reruns_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::open(&dir.path().join("claims.redb")).unwrap();
        assert_eq!(
            claim(&c, &[pair("t1", "s1"), pair("t2", "s2")]).await,
            vec![None, None]
        );
        // The same source again (a rerun after a crash) is no collision.
        assert_eq!(claim(&c, &[pair("t1", "s1")]).await, vec![None]);
        assert_eq!(
            claim(&c, &[pair("t1", "s3")]).await,
            vec![Some(b"s1".to_vec())]
        );
        assert_eq!(c.count().unwrap(), 2);
        assert_eq!(c.owner(b"t2").unwrap(), Some(b"s2".to_vec()));
        assert_eq!(c.owner(b"t9").unwrap(), None);
        c.clear().unwrap();
        assert_eq!(c.count().unwrap(), 0);
        assert_eq!(claim(&c, &[pair("t1", "s3")]).await, vec![None]);
    }

    #[tokio::test]
    async fn collisions_within_one_batch_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::open(&dir.path().join("claims.redb")).unwrap();
        assert_eq!(
            claim(&c, &[pair("t", "a"), pair("t", "b"), pair("t", "a")]).await,
            vec![None, Some(b"a".to_vec()), None]
        );
    }

    #[tokio::test]
    async fn claims_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.redb");
        {
            let c = Claims::open(&path).unwrap();
            claim(&c, &[pair("t", "a")]).await;
        }
        let c = Claims::open(&path).unwrap();
        assert_eq!(
            claim(&c, &[pair("t", "b")]).await,
            vec![Some(b"a".to_vec())]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_callers_grouped_in_one_commit_get_one_owner_per_key() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::open(&dir.path().join("claims.redb")).unwrap();
        let callers: Vec<_> = (0..8)
            .map(|s| {
                let c = c.clone();
                let pairs: Vec<_> = (0..200)
                    .map(|t| pair(&format!("t{t}"), &format!("s{s}")))
                    .collect();
                tokio::spawn(async move {
                    let claimed = c.claim_all(pairs).await.unwrap();
                    (claimed.pairs, claimed.owners)
                })
            })
            .collect();
        let mut winners = vec![None; 200];
        let mut answers = Vec::new();
        for caller in callers {
            answers.push(caller.await.unwrap());
        }
        for (pairs, owners) in &answers {
            for (t, ((_, source), owner)) in pairs.iter().zip(owners).enumerate() {
                if owner.is_none() {
                    assert_eq!(
                        winners[t].replace(source.clone()),
                        None,
                        "two owners of t{t}"
                    );
                }
            }
        }
        for (pairs, owners) in &answers {
            for (t, ((_, source), owner)) in pairs.iter().zip(owners).enumerate() {
                let winner = winners[t].clone().expect("every key has an owner");
                assert_eq!(owner.clone().unwrap_or(source.clone()), winner);
            }
        }
        assert_eq!(c.count().unwrap(), 200);
    }

    /// A checkpoint may rely only on claims made durable. A child process
    /// (this test binary again) claims, makes the second claim durable,
    /// claims once more in memory and aborts like kill -9; the reopened
    /// index holds both claims up to the durable ticket and not the last.
    #[tokio::test]
    async fn a_durable_ticket_covers_every_claim_before_it_across_a_crash() {
        const CHILD: &str = "REKEY_TEST_CLAIMS_CRASH_AT";
        if let Ok(path) = std::env::var(CHILD) {
            let c = Claims::open(Path::new(&path)).unwrap();
            let first = c.claim_all(vec![pair("t1", "a")]).await.unwrap();
            let second = c.claim_all(vec![pair("t2", "b")]).await.unwrap();
            assert!(second.ticket > first.ticket);
            c.durable(second.ticket).await.unwrap();
            c.durable(first.ticket).await.unwrap();
            c.claim_all(vec![pair("t3", "c")]).await.unwrap();
            std::process::abort();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claims.redb");
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "state::claims::tests::a_durable_ticket_covers_every_claim_before_it_across_a_crash",
                "--test-threads=1",
            ])
            .env(CHILD, &path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "the child aborts");
        let c = Claims::open(&path).unwrap();
        assert_eq!(c.owner(b"t1").unwrap(), Some(b"a".to_vec()));
        assert_eq!(c.owner(b"t2").unwrap(), Some(b"b".to_vec()));
        assert_eq!(
            c.owner(b"t3").unwrap(),
            None,
            "an in-memory claim dies with the process"
        );
    }
}
