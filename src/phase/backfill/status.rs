//! What a running backfill tells the rest of the world, once a second: the
//! control file applied, the adaptive rate ticked, `progress.jsonl` sampled,
//! `backfill.json` published (with whether a pause has taken effect), and the
//! progress display updated.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::aws::rate::Control;
use crate::phase::progress::Progress;
use crate::state::StateDir;
use crate::state::control::ControlFile;
use crate::state::snapshot::BackfillStatus;

use super::Counters;
use super::import::ImportSink;
use super::ledger::Ledger;
use super::writer::Writer;

/// The run's shared parts the ticker reads.
pub(super) struct Ticker {
    pub(super) control: Arc<Control>,
    pub(super) writer: Arc<Writer>,
    pub(super) ledger: Arc<Mutex<Ledger>>,
    pub(super) dir: StateDir,
    pub(super) live: Arc<AtomicU64>,
    pub(super) consumed_rcu: Arc<Mutex<f64>>,
    pub(super) progress: Progress,
    pub(super) expected_items: u64,
    /// `--via-import`: objects instead of write units.
    pub(super) import: Option<Arc<ImportSink>>,
}

/// How the backfill ended, for its last snapshot.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ending {
    Running,
    Done,
    Stopped,
}

/// `backfill.json` for `counts`, with the live figures when running.
pub(super) fn snapshot(
    counts: &Counters,
    expected_items: u64,
    ending: Ending,
    live: Option<BackfillStatus>,
) -> BackfillStatus {
    BackfillStatus {
        pid: std::process::id(),
        updated_at: chrono::Utc::now(),
        done: matches!(ending, Ending::Done),
        stopped: matches!(ending, Ending::Stopped),
        expected_items,
        scanned: counts.scanned,
        written: counts.written,
        rejected: counts.rejected,
        skipped: counts.skipped,
        collisions: counts.collisions,
        ..live.unwrap_or_default()
    }
}

impl Ticker {
    pub(super) fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { self.run().await })
    }

    async fn run(self) {
        let mut control_file = ControlFile::watcher(&self.dir);
        let (mut last_wcu, mut last_rcu) = (0.0, 0.0);
        // One sample a second, for `status` and for measuring rate accuracy.
        let mut samples = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.progress_log())
            .ok();
        let t0 = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.control.tick().await;
            control_file.apply(&self.control).await;
            self.writer.per_key.retain_recent();
            let wcu = *self.writer.consumed_wcu.lock().await;
            let rcu = *self.consumed_rcu.lock().await;
            let live = self.live_status(rcu - last_rcu, wcu - last_wcu).await;
            (last_wcu, last_rcu) = (wcu, rcu);
            let items = self.live.load(Ordering::Relaxed);
            if let Some(f) = samples.as_mut() {
                use std::io::Write as _;
                let line = serde_json::json!({
                    "t": t0.elapsed().as_secs_f64(),
                    "consumed_wcu": wcu,
                    "write_rate": self.control.write.rate().await,
                    "key_rates": self.writer.key_rates.summary(),
                    "scanned": items,
                    "written": live.written,
                    "paused": live.paused,
                });
                let _ = writeln!(f, "{line}");
            }
            let counts = self.ledger.lock().await.totals;
            let status = snapshot(&counts, self.expected_items, Ending::Running, Some(live));
            let _ = crate::state::snapshot::publish(&self.dir.backfill_snapshot(), &status);
            self.progress.update(items, 0.0);
        }
    }

    /// This second's rates and the pause, shown and published.
    async fn live_status(&self, rcu_s: f64, wcu_s: f64) -> BackfillStatus {
        let stats = self.control.stats().await;
        let (rejected, written) = {
            let l = self.ledger.lock().await;
            (l.totals.rejected, l.totals.written)
        };
        let write_limit = self.control.write.rate().await.unwrap_or(0.0);
        let paused = self.control.is_paused();
        let throttles = stats.write_throttles + stats.read_throttles;
        let import = self.import.as_ref().map(|s| s.progress());
        let writes = match &import {
            Some(i) => format!("{} objects in {}", i.objects, i.objects_at),
            None => format!("{wcu_s:.0} WCU/s (limit {write_limit:.0})"),
        };
        self.progress.status(
            format!(
                "{rcu_s:.0} RCU/s, {writes}, written {written}, rejects {rejected}, throttles {throttles}{}",
                if paused { ", PAUSED" } else { "" }
            ),
            serde_json::json!({
                "rcu_per_sec": rcu_s,
                "wcu_per_sec": wcu_s,
                "write_limit": write_limit,
                "written": written,
                "rejected": rejected,
                "throttles": stats,
                "paused": paused,
                "writes_in_flight": self.control.writes_in_flight(),
                "import": import,
            }),
        );
        BackfillStatus {
            paused,
            writes_in_flight: self.control.writes_in_flight(),
            written,
            rcu_per_sec: rcu_s,
            wcu_per_sec: wcu_s,
            write_limit,
            throttles,
            import,
            ..Default::default()
        }
    }
}
