//! `-v`, `-vv` and `RUST_LOG`: the one tracing subscriber, installed by
//! `main` once the arguments are checked, writing to stderr.
//!
//! The other layers emit events with tracing's macros where things happen
//! (endpoints resolved, retries, throttles, checkpoints, pauses); they never
//! choose where the events go. Without `-v` or `RUST_LOG` no subscriber is
//! installed at all, so the events cost nothing and stderr holds exactly what
//! it held before. Events carry counts, segment numbers, file names and
//! table names, never item key values (those are redacted on the operator
//! surface; the state directory holds them).
//!
//! * `-v`: rekey's own events at info.
//! * `-vv`: rekey's at debug, and each AWS request ([`VERY_VERBOSE`]:
//!   operation, table, attempts, retries).
//! * `RUST_LOG` (any `EnvFilter` directive, e.g. `rekey=debug,aws_config=info`)
//!   overrides both.

use tracing_subscriber::EnvFilter;

/// `-vv`: rekey's debug events; each SDK operation's span (`DynamoDB.Scan{rpc.method="Scan" …}`,
/// targets of the service crates) and the orchestrator's events inside it (attempts, retries,
/// and the endpoint resolved, whose parameters name the table). Not the HTTP or credential
/// layers: they are RUST_LOG's to enable.
const VERY_VERBOSE: &str = "rekey=debug,aws_sdk_dynamodb=debug,aws_sdk_dynamodbstreams=debug,\
     aws_sdk_s3=debug,aws_smithy_runtime::client::orchestrator=debug";

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

/// Installs the subscriber for `verbose` and the environment's `RUST_LOG`.
/// A `RUST_LOG` that does not parse is reported once on stderr and the
/// verbosity's filter used instead.
pub fn install(verbose: u8) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let Some(directives) = filter(verbose, rust_log.as_deref()) else {
        return;
    };
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("warning: RUST_LOG={directives:?} does not parse ({e}); using -v's filter");
        EnvFilter::new(filter(verbose.max(1), None).unwrap_or_default())
    });
    // Ignore a second install (a library caller may have its own).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
