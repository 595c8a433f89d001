//! `agent-relay parse`: reads raw terminal bytes and prints the relay directives in them, each
//! once, through exactly the parser the wrapper uses ([`relay_parse::Parser`]), with the
//! profile the wrapper would load (the embedded file, the project's `[profiles.NAME]`, then
//! `$AGENT_RELAY_PROFILE_DIR/NAME.toml`).

use std::io::{Read, Write};
use std::os::fd::AsFd;

/// Arguments of `agent-relay parse`.
#[derive(Debug, clap::Args)]
pub(crate) struct ParseArgs {
    /// Print one JSON object per directive and line: {"to", "kind", "body", "thread"?, "data"?, "truncated"?}.
    #[arg(long)]
    pub(crate) json: bool,
    /// How to read the output: generic, shell, claude, codex or gemini (default: generic).
    /// Loaded as the wrapper loads it: with the project's `[profiles.NAME]` and
    /// `$AGENT_RELAY_PROFILE_DIR/NAME.toml` overrides (its `busy` markers, for `--live`).
    #[arg(long, value_name = "NAME")]
    pub(crate) profile: Option<String>,
    /// Read the input as a live terminal: whenever nothing more is ready to read (a pause),
    /// the screen settles as the wrapper's does after quiet output, unless the profile's busy
    /// markers show near the cursor. Without it, rows are final only when they scroll away or
    /// at the end.
    #[arg(long)]
    pub(crate) live: bool,
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
pub(crate) fn run(paths: &relay_client::paths::Paths, args: &ParseArgs) -> anyhow::Result<()> {
    let name = args.profile.as_deref().unwrap_or("generic");
    if !relay_wrap::profile::Profile::NAMES.contains(&name) {
        anyhow::bail!(
            "unknown profile {name:?}; known profiles: {}",
            relay_wrap::profile::Profile::NAMES.join(", ")
        );
    }
    // The same layers as `wrap`: what the parser needs from a profile (its busy markers) is
    // written in the profile files only.
    let file = crate::config_file::load(&paths.project_root, |k| std::env::var_os(k))?;
    let project = file.as_ref().and_then(|f| f.profile(name));
    let profile = relay_wrap::profile::Profile::load_with(
        name,
        project.as_ref().map(|(o, from)| (*o, from.as_str())),
        relay_wrap::profile::override_dir().as_deref(),
    )?
    .parse;
    let (mut input, ready): (Box<dyn Read>, Box<dyn Fn() -> bool>) = match &args.file {
        Some(path) => {
            let file = std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
            let fd = file.try_clone()?;
            (Box::new(file), Box::new(move || more_ready(&fd)))
        }
        None => (
            Box::new(std::io::stdin().lock()),
            Box::new(|| more_ready(&std::io::stdin())),
        ),
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
        let mut found = parser.feed(&buf[..n]);
        // Whether this read ended at a pause is decided before anything is printed: a writer
        // that waits for what it read to be printed then writes on finds it decided.
        if args.live && !ready() {
            found.extend(parser.settle());
        }
        for directive in found {
            print_directive(&mut out, &directive, args.json)?;
        }
        out.flush()?;
    }
    for directive in parser.finish() {
        print_directive(&mut out, &directive, args.json)?;
    }
    out.flush()?;
    Ok(())
}

/// Whether more input is ready to read at once (no pause): a zero-timeout poll.
fn more_ready(fd: &impl AsFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    // A failed poll counts as a pause: settling early only makes rows final sooner.
    rustix::event::poll(&mut fds, 0).is_ok_and(|n| n > 0)
}

fn print_directive(
    out: &mut impl Write,
    directive: &relay_parse::Directive,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", relay_protocol::text::json_line(directive)?)?;
    } else if let Some(c) = &directive.claim {
        // A team verb, never a message (issue 25.7).
        let paths: Vec<String> = c
            .paths
            .iter()
            .map(|p| relay_protocol::text::one_line(p, 200))
            .collect();
        let verb = if c.release { "unclaim" } else { "claim" };
        let what = if paths.is_empty() {
            "(all)".to_owned()
        } else {
            paths.join(" ")
        };
        let how_long = c
            .for_ms
            .map(|ms| format!(" for {} s", ms / 1000))
            .unwrap_or_default();
        writeln!(out, "{verb} {what}{how_long}")?;
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
