//! The leases one worker holds, of one kind (Scan-segment units, stream
//! shards), as its heartbeat and its fence see them: one implementation of
//! the renewal (all at once, on a fixed beat), the fence (its own clock, see
//! [`super::lease`]) and the release, shared by the backfill's units and the
//! tail's shards so that both stop writing the same way when a lease is lost.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::lease::{self, FENCE_FRACTION};
use super::{Fleet, wall_ms};
use crate::aws::control::Cond;

/// A leased item's sort key in the control table.
pub trait HeldKey: Hash + Eq + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// Its sort key under `fleet`'s migration.
    fn sk(&self, fleet: &Fleet) -> String;
}

impl HeldKey for u32 {
    fn sk(&self, fleet: &Fleet) -> String {
        fleet.unit_sk(*self)
    }
}

/// A lease held.
#[derive(Debug)]
pub struct Held {
    pub lease: u64,
    pub beat: u64,
    /// When the last successful renewal (or the take) was sent: own clock.
    pub renewed: Duration,
    /// Cancelled when the lease is lost, the worker stops, or it is handed back.
    pub stop: CancellationToken,
    /// Being handed back (re-balancing): released once the work in flight
    /// has committed.
    pub handing_back: bool,
}

/// Every lease of one kind this worker holds.
#[derive(Debug)]
pub struct Holdings<K> {
    started: Instant,
    pub duration: Duration,
    held: Mutex<HashMap<K, Held>>,
}

impl<K: HeldKey> Holdings<K> {
    pub fn new(started: Instant, duration: Duration) -> Holdings<K> {
        Holdings {
            started,
            duration,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// This worker's monotonic clock.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// The fence: may this worker still write for `key` under `lease`?
    pub fn may_write(&self, key: &K, lease: u64) -> bool {
        let now = self.now();
        self.held
            .lock()
            .map(|h| {
                h.get(key).is_some_and(|x| {
                    x.lease == lease && lease::may_write(x.renewed, now, self.duration)
                })
            })
            .unwrap_or(false)
    }

    pub fn keys(&self) -> Vec<K> {
        self.held
            .lock()
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Records a take sent at `sent` (own clock).
    pub fn insert(&self, key: K, lease: u64, sent: Duration, stop: CancellationToken) {
        if let Ok(mut h) = self.held.lock() {
            h.insert(
                key,
                Held {
                    lease,
                    beat: 0,
                    renewed: sent,
                    stop,
                    handing_back: false,
                },
            );
        }
    }

    /// Whether `key` (any, when None) is being handed back.
    pub fn handing_back(&self, key: Option<&K>) -> bool {
        self.held
            .lock()
            .map(|h| {
                h.iter()
                    .any(|(k, x)| x.handing_back && key.is_none_or(|want| want == k))
            })
            .unwrap_or(false)
    }

    /// Starts handing `key` back: its task stops after the work in flight
    /// (re-balancing). False when it is not held.
    pub fn hand_back(&self, key: &K) -> bool {
        let Ok(mut h) = self.held.lock() else {
            return false;
        };
        let Some(x) = h.get_mut(key) else {
            return false;
        };
        x.handing_back = true;
        x.stop.cancel();
        true
    }

    pub fn remove(&self, key: &K) -> Option<Held> {
        self.held.lock().ok().and_then(|mut h| h.remove(key))
    }

    /// Asks every holder's task to stop (what is in flight finishes).
    pub fn cancel_all(&self) {
        if let Ok(h) = self.held.lock() {
            for x in h.values() {
                x.stop.cancel();
            }
        }
    }

    /// One renewal of each lease held, all at once (one after another, a
    /// worker holding many renewed its last a whole round trip per lease
    /// late). A refused renewal means the lease is gone: its task stops.
    pub async fn renew_all(&self, fleet: &Fleet) {
        let held: Vec<(K, u64, u64)> = match self.held.lock() {
            Ok(h) => h
                .iter()
                .map(|(k, x)| (k.clone(), x.lease, x.beat))
                .collect(),
            Err(_) => return,
        };
        futures::future::join_all(
            held.into_iter()
                .map(|(k, l, beat)| self.renew_one(fleet, k, l, beat)),
        )
        .await;
    }

    async fn renew_one(&self, fleet: &Fleet, key: K, lease: u64, beat: u64) {
        let sent = self.now();
        // The grant says, atomically with the renewal, how long this worker may write.
        let until = wall_ms() + self.duration.mul_f64(FENCE_FRACTION).as_millis() as i64;
        match fleet.renew_at(&key.sk(fleet), lease, beat + 1, until).await {
            Ok(Cond::Written) => {
                if let Ok(mut h) = self.held.lock()
                    && let Some(x) = h.get_mut(&key)
                    && x.lease == lease
                {
                    x.renewed = sent;
                    x.beat = beat + 1;
                }
            }
            Ok(Cond::Refused) => {
                tracing::warn!(?key, lease, "lease lost: its work stops");
                if let Some(x) = self.remove(&key) {
                    x.stop.cancel();
                }
            }
            Err(e) => {
                tracing::warn!(?key, error = %e, "renewal failed; the fence closes unless the next one lands")
            }
        }
    }

    /// Gives `key` back if still held (its task ended without finishing).
    pub async fn give_back(&self, fleet: &Fleet, key: &K) {
        if let Some(x) = self.remove(key) {
            let _ = fleet.release_at(&key.sk(fleet), x.lease).await;
        }
    }

    /// Gives back every lease still held (a stop), so that another worker
    /// takes them at once instead of waiting for them to expire.
    pub async fn release_all(&self, fleet: &Fleet) {
        let held: Vec<(K, Held)> = match self.held.lock() {
            Ok(mut h) => h.drain().collect(),
            Err(_) => return,
        };
        for (k, x) in held {
            match fleet.release_at(&k.sk(fleet), x.lease).await {
                Ok(_) => tracing::info!(key = ?k, "lease released"),
                Err(e) => {
                    tracing::warn!(key = ?k, error = %e, "cannot release; it expires instead")
                }
            }
        }
    }
}
