//! `-v`, `-vv`, `RUST_LOG` and `--log-format`: the one tracing subscriber,
//! installed by `main` once the arguments are checked, writing to stderr.
//!
//! The other layers emit events with tracing's macros where things happen
//! (endpoints resolved, each AWS request attempt, retries, throttles,
//! checkpoints, pauses, rejected items); they never choose where the events
//! go. Without `-v`, `RUST_LOG` or `--log-format json` no subscriber is
//! installed at all, so the events cost nothing and stderr holds exactly what
//! it held before.
//!
//! * `-v`: rekey's own events at info (and each throttled AWS request).
//! * `-vv`: rekey's at debug — each AWS request attempt ([`crate::aws`]'s
//!   interceptor), each rejected item — and the SDK's own spans
//!   ([`VERY_VERBOSE`]: operation, table, attempts, retries).
//! * `RUST_LOG` (any `EnvFilter` directive, e.g. `rekey=debug,aws_config=info`)
//!   overrides both.
//! * `--log-format json` (default `text`): one JSON object a line, for a log
//!   pipeline ([`json`]): time, level, command, phase, table, message and
//!   fields. It logs at `-v`'s level unless told more, and everything else
//!   rekey says on stderr — notes, progress without `--json`, the final error
//!   — becomes such a line too, so every line of stderr parses.
//!
//! Key values: the layers log them only in the fields [`Redact`] knows
//! (`source_key`, `target_key`, and `detail`, a message that may quote
//! values in backticks), which are redacted here as the terminal redacts
//! them — the plan's literals and shard numbers readable, the rest hashed —
//! unless `--show-keys`. Every other field holds counts, names and codes.

mod json;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{Writer, debug_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::core::plan::Plan;
use crate::ops::metrics::feed;
use crate::ops::redact::{PlanRedactor, Redactor};

/// `-vv`: rekey's debug events; each SDK operation's span (`DynamoDB.Scan{rpc.method="Scan" …}`,
/// targets of the service crates) and the orchestrator's events inside it (attempts, retries,
/// and the endpoint resolved, whose parameters name the table). Not the HTTP or credential
/// layers: they are RUST_LOG's to enable.
const VERY_VERBOSE: &str = "rekey=debug,aws_sdk_dynamodb=debug,aws_sdk_dynamodbstreams=debug,\
     aws_sdk_s3=debug,aws_smithy_runtime::client::orchestrator=debug";

/// The fields that carry key values: a source key, a target key (their
/// values joined by ` / `, as the terminal joins them), and a message that
/// may quote values in backticks.
pub(crate) const SOURCE_KEY: &str = "source_key";
pub(crate) const TARGET_KEY: &str = "target_key";
pub(crate) const DETAIL: &str = "detail";

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// tracing's own lines, for people.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

/// What the subscriber needs to know of the command it logs.
pub struct LogOptions<'a> {
    /// How many `-v`.
    pub verbose: u8,
    pub format: Format,
    /// The command's name (`backfill`, `run`, …): every JSON line's `command`.
    pub command: &'static str,
    /// The plan, if the command has one: its source table is a line's
    /// `table` unless the event names one, and its shapes redact keys.
    pub plan: Option<&'a Plan>,
    /// `--show-keys`.
    pub show_keys: bool,
    /// `--metrics-listen` or `--metrics`: the metrics' layer reads the
    /// request events.
    pub metrics: bool,
}

/// The filter for `verbose` (the count of `-v`), unless `rust_log` (the
/// value of `RUST_LOG`) says otherwise; `None`: log nothing.
pub fn filter(verbose: u8, rust_log: Option<&str>) -> Option<String> {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(directives) => Some(directives.to_string()),
        None => match verbose {
            0 => None,
            1 => Some("rekey=info".into()),
            _ => Some(VERY_VERBOSE.into()),
        },
    }
}

/// The JSON lines' shared context, once `--log-format json` is installed:
/// [`note`] and [`error`] write through it.
static JSON: OnceLock<Arc<json::Context>> = OnceLock::new();

/// Installs the subscriber for `opts` and the environment's `RUST_LOG`.
/// A `RUST_LOG` that does not parse is reported once on stderr and the
/// verbosity's filter used instead. With metrics on, the metrics' layer
/// (`ops::metrics::feed`) is installed beside the log, with a filter of its
/// own, even when nothing is logged.
pub fn install(opts: &LogOptions<'_>) {
    use tracing_subscriber::Layer as _;
    // Asking for JSON lines is asking for a log: at least -v's.
    let verbose = match opts.format {
        Format::Json => opts.verbose.max(1),
        Format::Text => opts.verbose,
    };
    let rust_log = std::env::var("RUST_LOG").ok();
    let Some(directives) = filter(verbose, rust_log.as_deref()) else {
        if opts.metrics {
            let _ = tracing_subscriber::registry()
                .with(metrics_layer(true))
                .try_init();
        }
        return;
    };
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("warning: RUST_LOG={directives:?} does not parse ({e}); using -v's filter");
        EnvFilter::new(filter(verbose.max(1), None).unwrap_or_default())
    });
    let redact = Arc::new(Redact::new(opts.plan, opts.show_keys));
    // Ignore a second install (a library caller may have its own).
    match opts.format {
        Format::Text => {
            let text = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_target(true)
                .fmt_fields(text_fields(redact))
                .with_filter(filter);
            let _ = tracing_subscriber::registry()
                .with(text)
                .with(metrics_layer(opts.metrics))
                .try_init();
        }
        Format::Json => {
            let context = Arc::new(json::Context {
                command: opts.command,
                table: opts.plan.map(|p| p.source_table.clone()),
                redact,
            });
            let layer = json::JsonLayer::new(context.clone(), std::io::stderr).with_filter(filter);
            if tracing_subscriber::registry()
                .with(layer)
                .with(metrics_layer(opts.metrics))
                .try_init()
                .is_ok()
            {
                let _ = JSON.set(context);
            }
        }
    }
}

/// The metrics' layer, if `on`: the request events only, at any level.
fn metrics_layer<S>(on: bool) -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    on.then(|| {
        let requests = tracing_subscriber::filter::Targets::new()
            .with_target(feed::REQUEST_TARGET, tracing::Level::DEBUG);
        feed::RequestLayer.with_filter(requests)
    })
}

/// tracing's text fields (`message name=value …`, as its default formatter
/// writes them), with the key fields redacted.
fn text_fields(
    redact: Arc<Redact>,
) -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt as _;
    debug_fn(
        move |w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
            match field.name() {
                "message" => write!(w, "{value:?}"),
                name if Redact::is_key_field(name) => {
                    write!(w, "{name}={}", redact.field(name, format!("{value:?}")))
                }
                name => write!(w, "{name}={value:?}"),
            }
        },
    )
    .delimited(" ")
}

/// A line of commentary on stderr (`note: …`), or, with `--log-format
/// json`, a JSON line at info.
pub(crate) fn note(text: &str) {
    match JSON.get() {
        Some(context) => context.line("INFO", "rekey::note", text),
        None => eprintln!("note: {text}"),
    }
}

/// A line of progress or commentary, as it is (no `note:`), or a JSON line
/// at info.
pub fn say(text: &str) {
    match JSON.get() {
        Some(context) => context.line("INFO", "rekey::progress", text),
        None => eprintln!("{text}"),
    }
}

/// The error a command ends with (`error: …`), or a JSON line at error.
pub fn error(err: &anyhow::Error) {
    match JSON.get() {
        Some(context) => context.line("ERROR", "rekey", &format!("{err:#}")),
        None => eprintln!("error: {err:#}"),
    }
}

/// How the log shows the fields that carry key values: as the terminal
/// shows keys ([`PlanRedactor`] when there is a plan, a hash of the whole
/// value otherwise), or as they are with `--show-keys`.
pub(crate) struct Redact {
    plan: Option<PlanRedactor>,
    redactor: Redactor,
}

impl Redact {
    pub(crate) fn new(plan: Option<&Plan>, show_keys: bool) -> Redact {
        let redactor = Redactor { show: show_keys };
        Redact {
            plan: plan.map(|p| PlanRedactor::new(p, redactor)),
            redactor,
        }
    }

    pub(crate) fn is_key_field(name: &str) -> bool {
        matches!(name, SOURCE_KEY | TARGET_KEY | DETAIL)
    }

    /// `value` of the field `name`, redacted if it is a key field.
    pub(crate) fn field(&self, name: &str, value: String) -> String {
        if self.redactor.show {
            return value;
        }
        match (name, &self.plan) {
            (SOURCE_KEY | TARGET_KEY, Some(p)) => p.key_text(&value, name == TARGET_KEY),
            (SOURCE_KEY | TARGET_KEY, None) => self.redactor.key(&[value]),
            (DETAIL, Some(p)) => p.message(&value),
            (DETAIL, None) => self.redactor.message(&value, &BTreeSet::new()),
            _ => value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::redact::token;

    #[test]
    fn verbosity_picks_the_filter_and_rust_log_overrides_it() {
        assert_eq!(filter(0, None), None);
        assert_eq!(filter(0, Some("  ")), None);
        assert_eq!(filter(1, None).as_deref(), Some("rekey=info"));
        assert!(filter(2, None).unwrap().starts_with("rekey=debug,"));
        assert!(filter(3, None).unwrap().starts_with("rekey=debug,"));
        assert_eq!(
            filter(0, Some("aws_config=info")).as_deref(),
            Some("aws_config=info")
        );
        assert_eq!(filter(2, Some("rekey=warn")).as_deref(), Some("rekey=warn"));
    }

    fn plan() -> Plan {
        let text = r#"
            version = 1
            [source]
            table = "src"
            partition_key = "PK"
            sort_key = "SK"
            [target]
            table = "dst"
            partition_key = "PK"
            sort_key = "SK"
            [[rule]]
            name = "order"
            match = { PK = "T#{t}", SK = "O#{id}" }
            key = { PK = "T#{t}#S#{shard(id, 8)}", SK = "O#{id}" }
        "#;
        Plan::parse(text, std::path::Path::new("plan.toml")).unwrap()
    }

    #[test]
    fn key_fields_are_redacted_as_the_terminal_redacts_keys_unless_shown() {
        let plan = plan();
        let hide = Redact::new(Some(&plan), false);
        assert_eq!(
            hide.field(SOURCE_KEY, "T#acme / O#7".into()),
            format!("T#{} / O#{}", token("acme"), token("7"))
        );
        let shard = crate::core::hash::shard(crate::core::hash::HashFn::Fnv1a32, "7", 8);
        let target = format!("T#acme#S#{shard} / O#7");
        let shown = hide.field(TARGET_KEY, target.clone());
        assert!(!shown.contains("acme"), "{shown}");
        assert!(
            shown.contains(&format!("#S#{shard}")),
            "the shard stays: {shown}"
        );
        // A key whose parts do not split as the plan's key: hashed whole.
        assert_eq!(
            hide.field(SOURCE_KEY, "a / b / c".into()),
            token("a / b / c")
        );
        assert_eq!(
            hide.field(DETAIL, "`SK` renders `acme`".into()),
            format!("`SK` renders `{}`", token("acme"))
        );
        // Other fields, and every field with --show-keys, are as they are.
        assert_eq!(hide.field("table", "src".into()), "src");
        let show = Redact::new(Some(&plan), true);
        assert_eq!(
            show.field(SOURCE_KEY, "T#acme / O#7".into()),
            "T#acme / O#7"
        );
        // Without a plan: the whole value hashed.
        let bare = Redact::new(None, false);
        assert_eq!(bare.field(SOURCE_KEY, "T#acme".into()), token("T#acme"));
    }
}
