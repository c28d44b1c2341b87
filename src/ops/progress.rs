//! Progress output: the one module that talks to the terminal while work
//! runs. Phases report to a `phase::progress::Progress`; this is its sink.
//!
//! Three ways, chosen once per command:
//! * on a TTY, an indicatif multi-bar: items with rate and ETA, and under it a
//!   status line (capacity consumed, limits, throttles, rejects);
//! * off a TTY (CI, logs, pipes), a plain line every ten seconds on stderr,
//!   because a redrawn bar in a log file is noise;
//! * with `--json`, a JSON event line on stdout every five seconds
//!   (`{"event":"progress",…}`), so that machines can follow a run; the
//!   command's final line is its report. `--quiet` prints nothing;
//! * with `--log-format json` (and without `--json`), the plain lines as
//!   lines of the JSON log on stderr (`ops::log::say`), no bars.
//!
//! Work that runs beside another (the tail inside `rekey run`) takes a
//! `Progress::beside`: its own bars in the same display on a TTY, its own
//! labelled lines off one.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::ops::{log, out};
use crate::phase::progress::{Progress, ProgressSink};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    Auto,
    Json,
    Quiet,
    /// The plain lines, as JSON log lines (`--log-format json`).
    Log,
}

/// A JSON event line on stdout, best effort: with stdout closed the work goes
/// on, and the command's report, written last, ends it quietly (`ops::out`).
fn json_event(event: &serde_json::Value) {
    let _ = out::line(&event.to_string());
}

/// The progress handle for a command's output mode (whose statuses the
/// metrics read too, when they are on: `ops::metrics::feed`).
pub fn new(mode: ProgressMode) -> Progress {
    crate::ops::metrics::feed::tee(Arc::new(Terminal::new(mode)))
}

/// Cheap to clone: clones share one display.
#[derive(Clone)]
struct Terminal {
    mode: ProgressMode,
    /// The terminal display, on a TTY in Auto mode: shared by everything
    /// started `beside` this progress.
    multi: Option<MultiProgress>,
    state: Arc<Mutex<State>>,
}

struct State {
    bars: Option<(ProgressBar, ProgressBar)>,
    label: String,
    /// Rates, throttles, rejects: whatever the running command reports.
    message: String,
    /// The same, for JSON events.
    status: serde_json::Value,
    started: Instant,
    last_line: Instant,
    units: f64,
}

const PLAIN_EVERY: Duration = Duration::from_secs(10);
const JSON_EVERY: Duration = Duration::from_secs(5);

impl Terminal {
    fn new(mode: ProgressMode) -> Terminal {
        let multi = (mode == ProgressMode::Auto && std::io::stderr().is_terminal())
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Terminal::with_display(mode, multi)
    }

    fn with_display(mode: ProgressMode, multi: Option<MultiProgress>) -> Terminal {
        let now = Instant::now();
        Terminal {
            mode,
            multi,
            state: Arc::new(Mutex::new(State {
                bars: None,
                label: String::new(),
                message: String::new(),
                status: serde_json::Value::Null,
                started: now,
                last_line: now,
                units: 0.0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ProgressSink for Terminal {
    /// A progress of its own, in the same display.
    fn beside(&self) -> Arc<dyn ProgressSink> {
        Arc::new(Terminal::with_display(self.mode, self.multi.clone()))
    }

    fn start(&self, label: &str, expected_items: Option<u64>) {
        let mut s = self.lock();
        s.label = label.to_string();
        s.started = Instant::now();
        s.last_line = s.started;
        s.units = 0.0;
        s.message.clear();
        s.status = serde_json::Value::Null;
        let Some(multi) = &self.multi else {
            return;
        };
        if let Some((main, status)) = s.bars.take() {
            multi.remove(&main);
            multi.remove(&status);
        }
        // DescribeTable's item count is refreshed about every six hours: a hint,
        // not a bound. Without one (a tail), a count and a rate, no bar.
        let main = match expected_items {
            Some(n) => {
                let bar = multi.add(ProgressBar::new(n));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:>9} {bar:30} {human_pos}/{human_len} items  {per_sec}  eta {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar
            }
            None => {
                let spinner = multi.add(ProgressBar::new_spinner());
                spinner.set_style(
                    ProgressStyle::with_template(
                        "{prefix:>9} {spinner} {human_pos} items  {per_sec}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                spinner
            }
        };
        main.set_prefix(label.to_string());
        let status = multi.add(ProgressBar::new_spinner());
        status.set_style(
            ProgressStyle::with_template("{prefix:>9} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        main.enable_steady_tick(Duration::from_millis(200));
        s.bars = Some((main, status));
    }

    /// `items` so far; `units` consumed capacity since the last call.
    fn update(&self, items: u64, units: f64) {
        if self.mode == ProgressMode::Quiet {
            return;
        }
        let mut s = self.lock();
        s.units += units;
        let secs = s.started.elapsed().as_secs_f64().max(0.001);
        let message = if s.message.is_empty() {
            format!("{:.0} CU/s", s.units / secs)
        } else {
            s.message.clone()
        };
        if let Some((main, status)) = &s.bars {
            if main.length().is_some_and(|l| items > l) {
                main.set_length(items);
            }
            main.set_position(items);
            status.set_message(message);
            return;
        }
        let every = if self.mode == ProgressMode::Json {
            JSON_EVERY
        } else {
            PLAIN_EVERY
        };
        if s.last_line.elapsed() < every {
            return;
        }
        s.last_line = Instant::now();
        if self.mode == ProgressMode::Json {
            let event = serde_json::json!({
                "event": "progress",
                "phase": s.label,
                "items": items,
                "items_per_sec": items as f64 / secs,
                "elapsed_seconds": secs,
                "status": s.status,
            });
            json_event(&event);
        } else {
            log::say(&format!(
                "{}: {items} items, {:.0} items/s, {message}",
                s.label,
                items as f64 / secs
            ));
        }
    }

    /// Replace the status shown under the counts (text for people, JSON for events).
    fn status(&self, text: String, json: serde_json::Value) {
        let mut s = self.lock();
        s.message = text;
        s.status = json;
    }

    /// A line of commentary between phases: a gate, a wait, a next step.
    /// Above the bars on a TTY, on stderr off one, an event with `--json`.
    fn note(&self, text: &str) {
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Json => {
                json_event(&serde_json::json!({"event": "note", "text": text}));
            }
            ProgressMode::Auto | ProgressMode::Log => match &self.multi {
                Some(multi) if multi.println(text).is_ok() => {}
                _ => log::say(text),
            },
        }
    }

    fn finish(&self) {
        let mut s = self.lock();
        if let Some((main, status)) = s.bars.take() {
            main.finish_and_clear();
            status.finish_and_clear();
            if let Some(multi) = &self.multi {
                multi.remove(&main);
                multi.remove(&status);
            }
        }
    }
}
