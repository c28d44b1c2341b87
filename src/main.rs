//! The `rekey` binary: parse arguments, run the command, print any error once.

use clap::Parser as _;
use rekey::ops::cli::{Cli, exit, exit_code};

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(exit::FAILURE);
        }
    };
    match runtime.block_on(rekey::ops::commands::run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(exit_code(&err));
        }
    }
}
