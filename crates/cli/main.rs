//! `agent-relay`: the command-line entry point. Parsing, logging set-up and exit codes live
//! here; the work lives in the library crates (see `CLAUDE.md` for the map).

mod args;
mod cmd;
mod config_file;
mod exit;
mod out;
mod settings;
mod time;

use clap::FromArgMatches;

// The daemon allocates and frees small buffers for every frame on several threads; glibc's
// allocator spent about a tenth of all CPU on that under load (see docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // The matches, not only the parsed values: `up` must tell a setting the user gave from a
    // default (`ArgMatches::value_source`) to compare it with a running relay's.
    let matches = args::command().get_matches();
    let cli = args::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = args::Given::from_matches(&matches);
    let code = match cmd::run(cli, &given) {
        Ok(()) => 0,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
