//! Shows what relay-parse sees: every final line, then the directives it gave.
//!
//! ```sh
//! printf 'spin\r\n\x1b[1A\x1b[2K@relay:Bob hi\r\n' | cargo run -p relay-parse --example inspect -- generic
//! cargo run -p relay-parse --example inspect -- claude 40 < crates/parse/tests/fixtures/synthetic-claude-reply.bin
//! F=crates/parse/tests/fixtures/claude-session
//! cargo run -p relay-parse --example inspect -- claude $F.timing 500 < $F.bin
//! ```
//!
//! Arguments: the profile (default generic), then either the terminal height (default 100) or
//! a `.timing` file written by `tests/fixtures/record.py` and a quiet time in milliseconds
//! (default 500): the capture is then replayed as the wrapper would see it (reads as they
//! came, `set_rows` at resizes, `note_injected` at pastes, `settle` after each pause), and
//! `-- settle` marks each settle.
//!
//! Lines are printed as `ROW | text` (`ROW c| text` when part of it is in a code colour), and
//! directives as `=> {json}`, in stream order.

use std::io::{Read, Write};

use relay_parse::{Directive, Parser, Profile};

enum Step {
    Read,
    Rows(usize),
    Inject(String),
    Settle,
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let name = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "generic".to_string());
    let Some(profile) = Profile::by_name(&name) else {
        writeln!(
            std::io::stderr(),
            "unknown profile {name}; known: {}",
            Profile::NAMES.join(", ")
        )?;
        std::process::exit(2);
    };
    let mut parser = Parser::new(profile);
    parser.set_trace(true);
    let mut input = Vec::new();
    std::io::stdin().lock().read_to_end(&mut input)?;
    let mut out = std::io::stdout().lock();

    let mut steps = Vec::new();
    match args.get(2) {
        Some(arg) if arg.ends_with(".timing") => {
            let quiet: u64 = args.get(3).and_then(|q| q.parse().ok()).unwrap_or(500);
            let timing = std::fs::read_to_string(arg)?;
            let mut last_ms = None;
            for line in timing.lines() {
                let mut words = line.splitn(3, ' ');
                let offset = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                match words.next() {
                    None => {
                        if last_ms.is_some_and(|l| ms.saturating_sub(l) >= quiet) {
                            steps.push((offset, Step::Settle));
                        }
                        last_ms = Some(ms);
                        steps.push((offset, Step::Read));
                    }
                    Some(w) => {
                        if let Some(rows) = w.strip_prefix("rows=").and_then(|r| r.parse().ok()) {
                            steps.push((offset, Step::Rows(rows)));
                        } else if let Some(json) = w.strip_prefix("inject=") {
                            let text: String = serde_json::from_str(json).unwrap_or_default();
                            steps.push((offset, Step::Inject(text)));
                        }
                    }
                }
            }
        }
        Some(rows) => {
            if let Ok(rows) = rows.parse() {
                parser.set_rows(rows);
            }
        }
        None => {}
    }
    steps.sort_by_key(|s| s.0);

    let mut pos = 0;
    for (offset, step) in steps {
        let offset = offset.min(input.len());
        if offset > pos {
            let found = parser.feed(&input[pos..offset]);
            show(&mut out, &mut parser, &found)?;
            pos = offset;
        }
        match step {
            Step::Read => {}
            Step::Rows(rows) => parser.set_rows(rows),
            Step::Inject(text) => parser.note_injected(&text),
            Step::Settle => {
                let found = parser.settle();
                writeln!(out, "-- settle")?;
                show(&mut out, &mut parser, &found)?;
            }
        }
    }
    let found = parser.feed(&input[pos..]);
    show(&mut out, &mut parser, &found)?;
    let found = parser.finish();
    writeln!(out, "-- finish")?;
    show(&mut out, &mut parser, &found)
}

fn show(out: &mut impl Write, parser: &mut Parser, found: &[Directive]) -> std::io::Result<()> {
    for line in parser.take_trace() {
        let mark = if line.has_code_colour { "c|" } else { " |" };
        writeln!(out, "{:>5} {mark} {}", line.row, line.text)?;
    }
    for d in found {
        writeln!(out, "=> {}", serde_json::to_string(d).unwrap_or_default())?;
    }
    Ok(())
}
