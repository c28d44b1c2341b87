//! Progress output: the one module that talks to the terminal while work runs.
//!
//! On a TTY an indicatif bar; off a TTY (CI, logs, pipes) a plain line every
//! ten seconds on stderr, because a redrawn bar in a log file is noise. With
//! `--json` or `--quiet` nothing at all, so stdout stays machine-readable.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    Auto,
    Quiet,
}

/// Cheap to clone: clones share one display.
#[derive(Clone)]
pub struct Progress {
    mode: ProgressMode,
    tty: bool,
    state: Arc<Mutex<State>>,
}

struct State {
    bar: Option<ProgressBar>,
    label: String,
    /// Rates, throttles, rejects: whatever the running command reports.
    message: String,
    started: Instant,
    last_line: Instant,
    units: f64,
}

const PLAIN_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    pub fn new(mode: ProgressMode) -> Progress {
        let now = Instant::now();
        Progress {
            mode,
            tty: std::io::stderr().is_terminal(),
            state: Arc::new(Mutex::new(State {
                bar: None,
                label: String::new(),
                message: String::new(),
                started: now,
                last_line: now,
                units: 0.0,
            })),
        }
    }

    pub fn start(&self, label: &str, expected_items: Option<u64>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.label = label.to_string();
        s.started = Instant::now();
        s.last_line = s.started;
        s.units = 0.0;
        s.message.clear();
        if self.mode == ProgressMode::Quiet || !self.tty {
            return;
        }
        // DescribeTable's item count is refreshed about every six hours: a hint, not a bound.
        let bar = match expected_items.filter(|n| *n > 0) {
            Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>9} {bar:30} {human_pos} items  {per_sec}  {msg}  eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(label.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        s.bar = Some(bar);
    }

    /// `items` so far; `units` consumed capacity since the last call.
    pub fn update(&self, items: u64, units: f64) {
        if self.mode == ProgressMode::Quiet {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.units += units;
        let secs = s.started.elapsed().as_secs_f64().max(0.001);
        let rate = s.units / secs;
        if let Some(bar) = &s.bar {
            if bar.length().is_some_and(|l| items > l) {
                bar.set_length(items);
            }
            bar.set_position(items);
            bar.set_message(format!("{rate:.0} CU/s"));
        } else if s.last_line.elapsed() >= PLAIN_EVERY {
            s.last_line = Instant::now();
            eprintln!(
                "{}: {items} items, {:.0} items/s, {rate:.0} CU/s",
                s.label,
                items as f64 / secs
            );
        }
    }

    /// Replace the status text shown after the counts.
    pub fn message(&self, text: String) {
        if self.mode == ProgressMode::Quiet {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.message = text;
    }

    pub fn finish(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bar) = s.bar.take() {
            bar.finish_and_clear();
        }
    }
}
