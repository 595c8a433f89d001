//! `agent-relay`: the command-line entry point. Parsing, logging set-up and exit codes live
//! here; the work lives in the library crates (see `CLAUDE.md` for the map).

mod args;
mod cmd;
mod exit;
mod out;
mod time;

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    let code = match cmd::run(cli) {
        Ok(()) => 0,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
