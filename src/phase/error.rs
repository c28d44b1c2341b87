//! The errors a phase raises that the operator surface turns into exit codes
//! (`ops::cli::exit_code` finds them in the error's chain).

/// Bad input other than the plan: a sample file, an argument combination,
/// a table or stream that is not what the plan needs (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// A gate that must hold before going on did not (exit 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct GateNotMet(pub String);

/// Stopped by the operator (Ctrl-C, SIGTERM) after the work in flight was
/// finished and checkpointed: a rerun resumes. The operator surface exits
/// 130 or 143 for it.
#[derive(Debug, thiserror::Error)]
#[error("stopped; the work in flight was checkpointed, run the same command again to resume")]
pub struct Stopped;
