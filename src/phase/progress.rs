//! The progress handle phases report to. What it shows, and where, is the
//! operator surface's business (`ops::progress` implements [`ProgressSink`]
//! for the terminal, plain lines and JSON events): a phase only says what
//! it is doing.

use std::sync::Arc;

/// Where progress goes. Implementations share one display between the
/// handles [`ProgressSink::beside`] makes.
pub trait ProgressSink: Send + Sync {
    /// A new step: its label and, when known, how many items it expects.
    fn start(&self, label: &str, expected_items: Option<u64>);
    /// `items` so far; `units` consumed capacity since the last call.
    fn update(&self, items: u64, units: f64);
    /// The status shown under the counts (text for people, JSON for events).
    fn status(&self, text: String, json: serde_json::Value);
    /// A line of commentary between steps: a gate, a wait, a next step.
    fn note(&self, text: &str);
    fn finish(&self);
    /// A sink of its own for work running beside this one, in the same display.
    fn beside(&self) -> Arc<dyn ProgressSink>;
}

/// Cheap to clone: clones report to the same sink.
#[derive(Clone)]
pub struct Progress(Arc<dyn ProgressSink>);

impl Progress {
    pub fn new(sink: Arc<dyn ProgressSink>) -> Progress {
        Progress(sink)
    }

    pub fn beside(&self) -> Progress {
        Progress(self.0.beside())
    }

    pub fn start(&self, label: &str, expected_items: Option<u64>) {
        self.0.start(label, expected_items);
    }

    pub fn update(&self, items: u64, units: f64) {
        self.0.update(items, units);
    }

    pub fn status(&self, text: String, json: serde_json::Value) {
        self.0.status(text, json);
    }

    pub fn note(&self, text: &str) {
        self.0.note(text);
    }

    pub fn finish(&self) {
        self.0.finish();
    }
}
