//! The `rekey` binary: parse the arguments, convert them to a checked
//! configuration, run the command, print any error once.

use clap::Parser as _;
use rekey::ops::cli::{Cli, exit, exit_code};
use rekey::ops::config::Config;
use rekey::ops::out;

fn main() {
    let config = match Config::try_from(Cli::parse()) {
        Ok(config) => config,
        Err(err) => fail(&err, exit::BAD_INPUT),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => fail(
            &anyhow::Error::new(e).context("cannot start the async runtime"),
            exit::FAILURE,
        ),
    };
    match runtime.block_on(rekey::ops::commands::run(config)) {
        Ok(code) => std::process::exit(code),
        // The reader of stdout went away (`| head`): nothing left to say.
        Err(err) if out::is_closed(&err) => std::process::exit(exit::OK),
        Err(err) => fail(&err, exit_code(&err)),
    }
}

/// The error, once, on stderr; then exit with `code`.
fn fail(err: &anyhow::Error, code: i32) -> ! {
    eprintln!("error: {err:#}");
    std::process::exit(code)
}
