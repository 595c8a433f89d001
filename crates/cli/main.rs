//! `agent-relay`: the command-line entry point. Parsing, logging set-up and exit codes live
//! here; the work lives in the library crates (see `CLAUDE.md` for the map).

mod args;
mod cmd;
mod exit;
mod out;
mod time;

use clap::Parser;

// The daemon allocates and frees small buffers for every frame on several threads; glibc's
// allocator spent about a tenth of all CPU on that under load (see docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = args::Cli::parse();
    let code = match cmd::run(cli) {
        Ok(()) => 0,
        Err(err) => exit::report(&err),
    };
    std::process::exit(code);
}
