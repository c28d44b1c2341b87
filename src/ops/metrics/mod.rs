//! `--metrics-listen ADDR` and `--metrics emf`: a long-running command's
//! progress where monitoring can see it (issue 28, item 2).
//!
//! Nothing here counts on its own. A reading ([`sample::Sample`]) is taken
//! when it is asked for, from where the numbers already are: the snapshots
//! the phases publish in the state directory (backfill counters, the tails'
//! lag and `applied_through` per shard, verify's result, and the phase
//! `rekey status` derives from them), and the feed ([`feed`]): each AWS
//! request attempt's consumed capacity and throttle, from the interceptor's
//! events through a tracing layer, and the status phases hand their progress
//! sink (a running verify's counts, a fleet worker's units and leases).
//! The phases know nothing of metrics; they publish and report as before.
//!
//! The reading goes out as OpenMetrics text on `GET /metrics`
//! ([`openmetrics`], [`serve`]), or as CloudWatch EMF lines on stderr
//! ([`emf`]). Either runs from before the command's work starts until the
//! command returns — through a stop (the stop token, `ops::shutdown`), until
//! the last checkpoint is published — and ends with it.

pub(crate) mod emf;
pub(crate) mod feed;
pub(crate) mod openmetrics;
mod sample;
mod serve;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::state::StateDir;

use sample::Sample;

/// Where the metrics go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsSink {
    /// `--metrics-listen ADDR`: OpenMetrics on `http://ADDR/metrics`.
    Listen(SocketAddr),
    /// `--metrics emf`: an EMF line on stderr every `interval`.
    Emf { interval: Duration },
}

/// What the metrics of one command read.
pub(crate) struct Source {
    pub(crate) sink: MetricsSink,
    /// The command's name: EMF's `Command` dimension.
    pub(crate) command: &'static str,
    /// The plan's source table: EMF's `Table` dimension.
    pub(crate) table: String,
    /// The local state directory, if the command has one (a fleet's
    /// commands keep their state in the control table).
    pub(crate) state_dir: Option<StateDir>,
}

/// The metrics of a running command; [`Running::finish`] ends them.
pub(crate) struct Running {
    /// The address the endpoint listens on (port 0 picks one).
    pub(crate) address: Option<SocketAddr>,
    done: CancellationToken,
    task: JoinHandle<()>,
}

/// Starts serving or writing for `source`, before the command's work. A
/// listen address that cannot be bound is the command's error.
pub(crate) async fn start(source: Source) -> anyhow::Result<Running> {
    feed::switch_on();
    let done = CancellationToken::new();
    let mut address = None;
    let task = match source.sink {
        MetricsSink::Listen(addr) => {
            let (listener, bound) = serve::bind(addr).await?;
            tracing::info!(address = %bound, "serving metrics");
            address = Some(bound);
            tokio::spawn(serve::serve(listener, source.state_dir, done.clone()))
        }
        MetricsSink::Emf { interval } => tokio::spawn(write_emf(source, interval, done.clone())),
    };
    Ok(Running {
        address,
        done,
        task,
    })
}

impl Running {
    /// The command returned: the server closes; EMF writes its last line.
    pub(crate) async fn finish(self) {
        self.done.cancel();
        let _ = self.task.await;
    }
}

/// An EMF line every `interval` and one when `done`.
async fn write_emf(source: Source, interval: Duration, done: CancellationToken) {
    let mut emitter = emf::Emitter::new(source.command, source.table);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is now: nothing has happened yet
    loop {
        let last = tokio::select! {
            () = done.cancelled() => true,
            _ = tick.tick() => false,
        };
        match Sample::take(source.state_dir.as_ref()) {
            Ok(sample) => {
                let line = emitter.line(&sample, chrono::Utc::now().timestamp_millis());
                eprintln!("{line}");
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "metrics: no reading"),
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The dashboard in docs/ parses, and every query in it names a metric
    /// rekey serves.
    #[test]
    fn every_dashboard_query_names_a_metric_rekey_serves() {
        let text = include_str!("../../../docs/grafana-dashboard.json");
        let dashboard: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
        let mut exprs = Vec::new();
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().into_iter().flatten() {
                exprs.push(target["expr"].as_str().expect("expr").to_string());
            }
        }
        assert!(exprs.len() >= 8, "{exprs:?}");
        let names = regex::Regex::new(r"\brekey_[a-z_]+").unwrap();
        for expr in &exprs {
            let used: Vec<&str> = names.find_iter(expr).map(|m| m.as_str()).collect();
            assert!(!used.is_empty(), "{expr} names no rekey metric");
            for name in used {
                assert!(
                    super::openmetrics::NAMES.contains(&name),
                    "{expr}: rekey serves no {name}"
                );
            }
        }
        // And every family rekey serves is on the dashboard.
        for name in super::openmetrics::NAMES {
            assert!(
                exprs.iter().any(|e| e.contains(name)),
                "{name} is on no panel"
            );
        }
    }
}
