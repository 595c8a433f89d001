//! `agent-relay parse`: reads raw terminal bytes and prints the relay directives in them, each
//! once, through exactly the parser the wrapper uses ([`relay_parse::Parser`]).

use std::io::{Read, Write};

/// Arguments of `agent-relay parse`.
#[derive(Debug, clap::Args)]
pub(crate) struct ParseArgs {
    /// Print one JSON object per directive and line: {"to", "kind", "body", "thread"?, "data"?, "truncated"?}.
    #[arg(long)]
    pub(crate) json: bool,
    /// How to read the output: generic, shell, claude, codex or gemini (default: generic).
    #[arg(long, value_name = "NAME")]
    pub(crate) profile: Option<String>,
    /// Height of the terminal the output was written for (default 100). Needed for TUIs that
    /// position the cursor on absolute rows, such as Claude Code after a resize.
    #[arg(long, value_name = "N")]
    pub(crate) rows: Option<usize>,
    /// Width of the terminal the output was written for. A TUI that breaks long lines itself
    /// (claude, codex, gemini) is read with it to tell a wrapped row from a new line
    /// (default: unknown, a row at the directive's indentation is taken as wrapped).
    #[arg(long, value_name = "N")]
    pub(crate) cols: Option<usize>,
    /// Raw terminal bytes to read, e.g. a PTY capture (default: standard input).
    pub(crate) file: Option<std::path::PathBuf>,
}

/// Runs `agent-relay parse`.
pub(crate) fn run(args: &ParseArgs) -> anyhow::Result<()> {
    let profile = match &args.profile {
        None => relay_parse::Profile::generic(),
        Some(name) => relay_parse::Profile::by_name(name).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown profile {name:?}; known profiles: {}",
                relay_parse::Profile::NAMES.join(", ")
            )
        })?,
    };
    let mut input: Box<dyn Read> = match &args.file {
        Some(path) => Box::new(
            std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?,
        ),
        None => Box::new(std::io::stdin().lock()),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut parser = relay_parse::Parser::new(profile);
    if let Some(rows) = args.rows {
        parser.set_rows(rows);
    }
    if let Some(cols) = args.cols {
        parser.set_cols(cols);
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(anyhow::anyhow!("cannot read input: {e}")),
        };
        for directive in parser.feed(&buf[..n]) {
            print_directive(&mut out, &directive, args.json)?;
        }
    }
    for directive in parser.finish() {
        print_directive(&mut out, &directive, args.json)?;
    }
    out.flush()?;
    Ok(())
}

fn print_directive(
    out: &mut impl Write,
    directive: &relay_parse::Directive,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", relay_protocol::text::json_line(directive)?)?;
    } else {
        writeln!(
            out,
            "to {} ({}): {}",
            directive.to,
            directive.kind.as_str(),
            relay_protocol::text::for_terminal(&directive.body)
        )?;
        if directive.truncated {
            writeln!(
                out,
                "  (cut: longer than {} bytes; a wrapper does not send it, it tells the agent)",
                relay_parse::MAX_DIRECTIVE_BODY
            )?;
        }
    }
    Ok(())
}
