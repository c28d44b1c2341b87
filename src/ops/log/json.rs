//! `--log-format json`: a small tracing layer that writes each event as one
//! JSON object on one line, for a log pipeline to index without parsing
//! text.
//!
//! A line: `time` (RFC 3339, UTC, milliseconds), `level`, `target`,
//! `command`, `phase`, `table`, `message`, `fields` (the event's own, key
//! fields redacted by [`Redact`]) and `spans` (the enclosing spans, outermost
//! first, each its name and fields). `phase` is the innermost span's `phase`
//! field (`rekey run` enters one per phase), else the command's name;
//! `table` is the event's own `table` field (an AWS request names its table),
//! else the innermost span's, else the plan's source table. serde_json
//! writes the keys in order and escapes every value, so no field can break a
//! line.

use std::fmt;
use std::io::Write as _;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context as LayerContext;
use tracing_subscriber::registry::LookupSpan;

use super::Redact;

/// What every line says of the command, and how key fields are redacted.
pub(super) struct Context {
    pub(super) command: &'static str,
    /// The plan's source table, if the command has a plan.
    pub(super) table: Option<String>,
    pub(super) redact: Arc<Redact>,
}

impl Context {
    /// A line rekey writes itself (a note, progress, the final error): the
    /// same shape as an event's, without fields or spans.
    pub(super) fn line(&self, level: &str, target: &str, message: &str) {
        let line = self.object(level, target, Some(message.into()), Map::new(), Vec::new());
        let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    }

    fn object(
        &self,
        level: &str,
        target: &str,
        message: Option<Value>,
        mut fields: Map<String, Value>,
        spans: Vec<Value>,
    ) -> Value {
        let from_spans = |name: &str| {
            spans
                .iter()
                .rev()
                .find_map(|s| s["fields"][name].as_str().map(str::to_string))
        };
        let phase = from_spans("phase").unwrap_or_else(|| self.command.to_string());
        let table = match fields.get("table").and_then(Value::as_str) {
            Some(t) => Some(t.to_string()),
            None => from_spans("table").or_else(|| self.table.clone()),
        };
        fields.remove("table");
        json!({
            "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "level": level,
            "target": target,
            "command": self.command,
            "phase": phase,
            "table": table,
            "message": message.unwrap_or_else(|| Value::String(String::new())),
            "fields": fields,
            "spans": spans,
        })
    }
}

/// The layer; `W` makes the writer each line goes to (stderr).
pub(super) struct JsonLayer<W> {
    context: Arc<Context>,
    writer: W,
}

impl<W> JsonLayer<W> {
    pub(super) fn new(context: Arc<Context>, writer: W) -> Self {
        JsonLayer { context, writer }
    }
}

/// A span's fields as recorded so far (redacted).
struct SpanFields(Map<String, Value>);

impl<S, W> Layer<S> for JsonLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Map::new();
        attrs.record(&mut Fields::new(&mut fields, &self.context.redact));
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(SpanFields(fields)) = extensions.get_mut::<SpanFields>() {
            values.record(&mut Fields::new(fields, &self.context.redact));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: LayerContext<'_, S>) {
        let mut fields = Map::new();
        event.record(&mut Fields::new(&mut fields, &self.context.redact));
        let message = fields.remove("message");
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let fields = extensions
                    .get::<SpanFields>()
                    .map(|f| f.0.clone())
                    .unwrap_or_default();
                spans.push(json!({ "name": span.name(), "fields": fields }));
            }
        }
        let meta = event.metadata();
        let line =
            self.context
                .object(meta.level().as_str(), meta.target(), message, fields, spans);
        // One write of the whole line: lines of concurrent events never interleave.
        let _ = self
            .writer
            .make_writer()
            .write_all(format!("{line}\n").as_bytes());
    }
}

/// Records an event's or span's fields into a JSON map: numbers and
/// booleans as such, everything else as text (errors by their `Display`,
/// never their `Debug`), key fields redacted.
struct Fields<'a> {
    map: &'a mut Map<String, Value>,
    redact: &'a Redact,
}

impl<'a> Fields<'a> {
    fn new(map: &'a mut Map<String, Value>, redact: &'a Redact) -> Self {
        Fields { map, redact }
    }

    fn text(&mut self, field: &Field, text: String) {
        let text = self.redact.field(field.name(), text);
        self.map
            .insert(field.name().to_string(), Value::String(text));
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.map.insert(field.name().to_string(), json!(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.map.insert(field.name().to_string(), json!(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.map.insert(field.name().to_string(), json!(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.map.insert(field.name().to_string(), json!(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_string());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.text(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;
    use crate::ops::log::{DETAIL, SOURCE_KEY};
    use crate::ops::redact::token;

    /// Lines written to memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Lines {
        type Writer = Lines;
        fn make_writer(&'w self) -> Lines {
            self.clone()
        }
    }

    /// The JSON objects `log` writes, under a `backfill` of table `src`.
    fn logged(show_keys: bool, log: impl FnOnce()) -> Vec<Value> {
        let lines = Lines::default();
        let context = Arc::new(Context {
            command: "backfill",
            table: Some("src".into()),
            redact: Arc::new(Redact::new(None, show_keys)),
        });
        let subscriber =
            tracing_subscriber::registry().with(JsonLayer::new(context, lines.clone()));
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }

    #[test]
    fn each_event_is_one_json_line_with_its_context_and_fields() {
        let lines = logged(false, || {
            tracing::info!(
                attempt = 2_u32,
                latency_ms = 1.5,
                throttled = true,
                "a\nrequest"
            );
            let span = tracing::info_span!("phase", phase = "verify", table = "dst");
            let _in = span.enter();
            tracing::debug!(operation = "Scan", table = "other", "inside");
            tracing::warn!("no table of its own");
        });
        assert_eq!(lines.len(), 3, "{lines:?}");
        let first = &lines[0];
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["command"], "backfill");
        assert_eq!(
            first["phase"], "backfill",
            "the command's, outside any phase span"
        );
        assert_eq!(first["table"], "src", "the plan's source table");
        assert_eq!(first["message"], "a\nrequest");
        assert_eq!(first["fields"]["attempt"], 2);
        assert_eq!(first["fields"]["latency_ms"], 1.5);
        assert_eq!(first["fields"]["throttled"], true);
        let time = first["time"].as_str().unwrap();
        chrono::DateTime::parse_from_rfc3339(time).unwrap();
        // Inside a phase span: its phase; the event's own table first, then the span's.
        assert_eq!(lines[1]["phase"], "verify");
        assert_eq!(lines[1]["table"], "other");
        assert_eq!(lines[1]["spans"][0]["name"], "phase");
        assert_eq!(lines[2]["table"], "dst");
    }

    #[test]
    fn key_fields_are_hashed_unless_show_keys() {
        let log = || {
            tracing::debug!(source_key = %"T#acme / O#7", detail = %"renders `acme`", "item rejected");
        };
        let hidden = &logged(false, log)[0]["fields"];
        assert_eq!(hidden[SOURCE_KEY], token("T#acme / O#7"));
        assert_eq!(hidden[DETAIL], format!("renders `{}`", token("acme")));
        let shown = &logged(true, log)[0]["fields"];
        assert_eq!(shown[SOURCE_KEY], "T#acme / O#7");
    }
}
