//! The wrapper: runs an agent CLI in a pseudo-terminal or a tmux session without modifying
//! it, relays the directives it prints, and types in the messages it receives.
//!
//! ```text
//! agent output ──► PTY / tmux %output ─────► person's terminal (PTY: mirrored unchanged)
//!                                      └──► relay_parse::Parser ──► directives ──► Client::send
//! Client DELIVER ──► format::injected_text ──► inject::Injector (profile: quiet, prompt empty,
//!                    no spinner or dialog, no person mid-line) ──► type, Enter, verify ──► ACK
//! ```
//!
//! The pure parts (`format`, `inject`, `profile`) are unit tested, the profiles against
//! screens recorded from the real CLIs. The decision core, `Core`, is its own room
//! (`decide/`: events and `now` in, effects out, no I/O; unit and property tests in
//! `decide/core/tests.rs`). One loop (`Shell::serve` in `shell.rs`) drives it over a
//! `terminal::Terminal` and carries its effects out: the PTY, tmux, or in unit tests a fake
//! under tokio's paused clock (`serve_tests.rs`). [`run_pty`] and [`serve_tmux`] set a backend up, run the loop and end
//! it; they are tested end to end with the real binary.

mod claim;
mod decide;
mod door;
pub mod format;
pub mod inject;
mod link;
pub mod profile;
mod pty;
mod shell;
mod shell_line;
pub mod state;
mod terminal;
pub mod tmux;
/// The door's socket file name in the team directory (see `door.rs`).
pub use door::SOCKET as DOOR_SOCKET;
/// The door key's variable in the agent's environment, and how a wrapper makes one (see
/// `door.rs`).
pub use door::{KEY_ENV as DOOR_KEY_ENV, new_key as new_door_key};
pub use transcript::descends_from;

/// The most message text one Claude Code hook answer hands over (bytes, one message at least):
/// Claude Code replaces longer hook output with a file path and a short preview, which the
/// model would take for the messages. What does not fit waits for the next hook or typing.
pub const HOOK_TEXT_MAX: usize = 9000;
mod transcript;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use relay_client::{ClientConfig, ClientError};
use relay_protocol::{now_ms, text};
use tokio::sync::mpsc;

/// The decision core, named where the shell and the run functions use it.
pub(crate) use crate::decide::core::{Core, refusal_notice};
use crate::decide::ledger::Ledger;
use crate::decide::resume::Resume;
use crate::profile::Profile;
use crate::state::Checkpoint;
use crate::terminal::Terminal;

/// Variables the agent does not inherit from the wrapper. Each tells command-line programs that
/// no person is at the terminal, and the agent under the relay is in a terminal a person can
/// attach to: with `CI` set, Gemini CLI exits at start and Claude Code draws without colour
/// (a code block then looks like prose, and a directive shown in one like a real one).
pub const NOT_INHERITED: &[&str] = &["CI", "CONTINUOUS_INTEGRATION"];

/// A warning for the person when the agent will draw without colour although its parser
/// relies on colour: Claude Code's code blocks have no fences on screen, only colour tells
/// them from prose. `NO_COLOR` is the person's choice, so it is passed on, not removed.
/// `var` reads the environment (injectable for tests).
pub fn colour_warning(
    parse: &relay_parse::Profile,
    var: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let no_color = var("NO_COLOR").is_some_and(|v| !v.is_empty());
    (parse.name() == "claude" && no_color).then(|| {
        "NO_COLOR is set, so Claude Code draws without colour and the relay cannot tell its \
         code blocks from prose: a @relay: line shown inside a code block will be sent. Unset \
         NO_COLOR for this agent to avoid that."
            .to_owned()
    })
}

/// Wrapper failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WrapError {
    /// The pseudo-terminal or the agent process failed.
    #[error("{0}")]
    Pty(String),
    /// tmux failed (the tmux backend).
    #[error(transparent)]
    Tmux(#[from] tmux::TmuxError),
    /// The relay could not be reached or refused us.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The person's terminal could not be set up.
    #[error("terminal: {0}")]
    Terminal(String),
    /// The wrapper's files in the data directory could not be used.
    #[error("{0}")]
    State(String),
    /// The agent's tmux session ended without its exit status: the session was killed (or
    /// the status file is unreadable), so whether the agent succeeded is unknown.
    #[error(
        "the agent's tmux session {session} ended without an exit status (was the session or \
         the tmux server killed?); whether the agent succeeded is unknown: check its work"
    )]
    ExitUnknown {
        /// The tmux session.
        session: String,
    },
}

/// How to run one agent.
#[derive(Debug, Clone)]
pub struct WrapConfig {
    /// The agent's relay name.
    pub name: String,
    /// The agent command and its arguments.
    pub command: Vec<String>,
    /// Readiness rules and how to read the screen.
    pub profile: Profile,
    /// The relay's socket.
    pub socket: PathBuf,
    /// Longest body typed in full; longer ones are cut with a hint to `agent-relay read`.
    pub max_body: usize,
    /// Put the person's terminal in raw mode and pass keystrokes through (when stdin is a
    /// terminal). Off, the agent gets no input but relayed messages (scripts, tests).
    pub interactive: bool,
    /// This agent's wrapper files: `<data>/team/<name>/`.
    pub team_dir: PathBuf,
    /// Also append every message to `inbox.md` in this directory.
    pub inbox: Option<PathBuf>,
    /// Type [`intro`] into the agent once it is ready.
    pub intro: bool,
    /// Each message as its own prompt, waiting ones as one digest, or only a notice (see
    /// [`format::Delivery`]).
    pub delivery: format::Delivery,
    /// The key the agent's own doors (its MCP server, its hooks) present to this wrapper's
    /// door, put in the agent's environment as [`DOOR_KEY_ENV`] (see `door.rs`). `None`: a
    /// PTY wrapper makes one; a tmux relaying process reads the one its session was started
    /// with.
    pub door_key: Option<String>,
    /// Tell the command that started this wrapper how the start goes, one word a line on
    /// stdout: `connected` (the relay accepted the agent's name), then `started` (the agent
    /// printed and went quiet: it is past its start). `agent-relay --detached` waits for
    /// them; an agent that exits first is reported by its exit status and last lines.
    pub report_start: bool,
    /// Topic patterns the agent subscribes to (`wrap --subscribe`), on every (re)connection.
    pub topics: Vec<String>,
}

/// A note telling an agent how to use the relay, typed in with `--intro`: one line (Enter
/// submits it), with no directive at a line start (its echo is noted, and is never sent).
pub fn intro(name: &str) -> String {
    format!(
        "agent-relay: you are {name}, one of several AI agents connected by agent-relay. To \
         message another agent, write a line that starts with @relay: and its name (or \
         @relay:* for everyone), then the message; it ends at the next blank line. Messages \
         for you arrive as prompts starting with \"Relay message from NAME [ID]:\" (or \
         \"Relay message from NAME [ID] (thread T):\" in a conversation); answer \
         with @relay:NAME only when an answer is needed (never just to thank), and \
         `agent-relay read ID` prints a shortened message in full. To show the syntax without \
         sending, write it in inline code. No answer is needed to this note."
    )
}

/// Restores the person's terminal when dropped, on every way out (errors, panics).
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> Result<Self, WrapError> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)
            .map_err(|e| WrapError::Terminal(format!("cannot read terminal settings: {e}")))?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)
            .map_err(|e| WrapError::Terminal(format!("cannot set raw mode: {e}")))?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The person's terminal size, or a roomy default when there is none.
pub fn terminal_size() -> (u16, u16) {
    match rustix::termios::tcgetwinsize(std::io::stdout()) {
        Ok(ws) if ws.ws_row > 0 && ws.ws_col > 0 => (ws.ws_row, ws.ws_col),
        _ => (40, 120),
    }
}

/// Now, on tokio's clock: paused (and advanced by hand) in the loop's unit tests.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// What `cfg`'s terminal was given before, read from its `injected.log` (see
/// `decide/ledger.rs`).
fn load_ledger(cfg: &WrapConfig) -> Result<Ledger, WrapError> {
    state::load_injected(&cfg.team_dir).map_err(|e| {
        WrapError::State(format!(
            "{}: {e}",
            cfg.team_dir.join("injected.log").display()
        ))
    })
}

async fn connect(cfg: &WrapConfig) -> Result<relay_client::Client, WrapError> {
    let client = relay_client::Client::connect(ClientConfig {
        cli: cfg.command.first().cloned(),
        topics: cfg.topics.clone(),
        ..ClientConfig::agent(cfg.socket.clone(), cfg.name.clone())
    })
    .await?;
    if cfg.report_start {
        report_start_line("connected");
    }
    Ok(client)
}

/// One line on stdout for the command that started this wrapper; it may have gone (it stops
/// reading once the agent started), which is logged, not an error.
fn report_start_line(word: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{word}").and_then(|()| out.flush()) {
        tracing::debug!(error = %e, word, "the starting command no longer listens");
    }
}

/// How often, and how long apart, forgetting a fleeting agent is tried while the relay has
/// not yet seen its connection end (its goodbye and the forget request travel on two
/// connections).
const FORGET_TRIES: u32 = 40;
const FORGET_PAUSE: Duration = Duration::from_millis(50);

/// Removes agent `cfg.name` from the relay's list of agents, once its connection has ended:
/// it was a command that exited at once (see [`Core::fleeting`]). Failures are logged; the
/// person can still `agent-relay agents forget` it.
async fn forget_fleeting(cfg: &WrapConfig) {
    tracing::info!(
        command = %text::one_line(&cfg.command.join(" "), 200),
        "the command exited at once, took no part in any exchange and is no known agent CLI: it is not kept as an agent"
    );
    let client =
        match relay_client::Client::connect(ClientConfig::tool(cfg.socket.clone(), "cli")).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the relay to forget this agent");
                return;
            }
        };
    let mut tries = 0;
    loop {
        tries += 1;
        let res = client
            .query(relay_protocol::query::QueryRequest::ForgetAgent {
                name: cfg.name.clone(),
            })
            .await;
        match res {
            Err(relay_client::ClientError::Query { code, .. })
                if code == "connected" && tries < FORGET_TRIES =>
            {
                tokio::time::sleep(FORGET_PAUSE).await;
            }
            Ok(_) => {
                tracing::info!(name = %cfg.name, "forgotten");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot forget this agent");
                break;
            }
        }
    }
    client.close().await;
}

/// How the wrapper's loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The agent's side ended (it exited; tmux: its session is gone).
    Exited,
    /// A signal stopped the wrapper (its number).
    Stopped(i32),
}

/// Runs the agent in a PTY until it exits; returns its exit code.
///
/// # Errors
/// [`WrapError`] when the agent cannot start or the relay cannot be reached at start.
pub async fn run_pty(cfg: WrapConfig) -> Result<i32, WrapError> {
    let interactive = cfg.interactive && rustix::termios::isatty(std::io::stdin());
    let client = connect(&cfg).await?;
    let (rows, cols) = terminal_size();
    let key = cfg.door_key.clone().unwrap_or_else(door::new_key);
    let env = vec![
        ("AGENT_RELAY_NAME".to_owned(), cfg.name.clone()),
        (door::KEY_ENV.to_owned(), key.clone()),
    ];
    let pty = pty::spawn(&cfg.command, &env, rows, cols)?;
    let _raw = if interactive {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let (keys_tx, keys) = mpsc::channel::<Vec<u8>>(64);
    if interactive {
        std::thread::Builder::new()
            .name("relay-stdin".into())
            .spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                let mut stdin = std::io::stdin();
                while let Ok(n) = stdin.read(&mut buf) {
                    if n == 0 || keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| WrapError::Terminal(e.to_string()))?;
    } else {
        drop(keys_tx);
    }
    let mut term = pty::PtyTerminal::new(pty, keys)?;
    let gate = shell::transcript_gate(&cfg);
    let ledger = load_ledger(&cfg)?;
    let mut core = Core::new(cfg, ledger, gate, rows, now());
    // The width tells a row Claude Code (or Codex, Gemini) wrapped from a line it wrote.
    core.parser.set_cols(usize::from(cols));
    core.set_agent_pid(term.pty.pid());
    // The agent's own `agent-relay spawn` (a team directive) asks through this door with it.
    core.cfg.door_key = Some(key.clone());
    let mut door = door::open(&core.cfg.team_dir, &core.cfg.name, &key);
    let mut shell = shell::Shell::new(client);
    let ended = shell.serve(&mut core, &mut term, &mut door).await?;
    // The signal that stopped the wrapper, if one did: its exit status is then 128 + it, as a
    // shell reports a process a signal ended (so `agent-relay ...; next` stops at a Ctrl-C
    // sent to it, like any other command).
    let stopped = match ended {
        Ended::Stopped(signal) => Some(signal),
        Ended::Exited => None,
    };
    if let Some(signal) = stopped {
        tracing::info!(signal, "stopped by a signal: ending the agent");
        term.pty.kill();
    }
    let code = term.pty.wait().await?;
    let cfg = core.cfg.clone();
    let fleeting = shell.end(&mut core, &mut term).await && stopped.is_none();
    if fleeting {
        forget_fleeting(&cfg).await;
    }
    Ok(stopped.map_or(code, |signal| 128 + signal))
}

/// Relays for an agent running in tmux session `session` (created by [`tmux::create`])
/// until the agent exits; returns its exit status. Stopping this process leaves the agent
/// running: run again, it picks the session up where the last one stopped, sending nothing
/// twice (see [`state::Checkpoint`]) and missing nothing the agent printed meanwhile that
/// tmux's history still holds.
///
/// # Errors
/// [`WrapError`] when the relay cannot be reached at start or the session cannot be attached.
pub async fn serve_tmux(cfg: WrapConfig, session: String) -> Result<i32, WrapError> {
    // SIGTERM is handled from before the first control client starts: its default action
    // would end the process with the client attaching or attached, outside the tmux lock.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| WrapError::Terminal(e.to_string()))?;
    let served = serve_tmux_with(cfg, session, term).await;
    // Every control client let go of detaches under the tmux lock before the process ends.
    if let Err(e) = tokio::task::spawn_blocking(tmux::wait_detached).await {
        tracing::warn!(error = %e, "cannot wait for the tmux control client to detach");
    }
    served
}

/// [`serve_tmux`] with SIGTERM already handled by `term`.
async fn serve_tmux_with(
    cfg: WrapConfig,
    session: String,
    term: tokio::signal::unix::Signal,
) -> Result<i32, WrapError> {
    let client = connect(&cfg).await?;
    let mut checkpoint = Checkpoint::load(&cfg.team_dir);
    if checkpoint.at_ms == 0 {
        // The first relaying process for this session: ids it derives carry this time.
        checkpoint.at_ms = now_ms();
        checkpoint
            .save(&cfg.team_dir)
            .map_err(|e| WrapError::State(format!("cannot save the checkpoint: {e}")))?;
    }
    let (pane, output) = match tmux::Pane::attach(&session) {
        Ok(attached) => attached,
        // Gone before it could be attached (the agent exited at once, or the session or the
        // server was killed): as if it had gone while attached.
        Err(e) if !session_lives(&session) => {
            tracing::info!(error = %e, "the session is gone before it could be attached");
            client.close().await;
            let code = read_exit(&cfg.team_dir).await;
            log_last_lines(&cfg.team_dir, code);
            // It printed nothing this process saw and took part in nothing.
            if cfg.profile.name() == "generic" {
                forget_fleeting(&cfg).await;
            }
            return code.ok_or(WrapError::ExitUnknown { session });
        }
        Err(e) => return Err(e),
    };
    let key = session_door_key(&pane, cfg.door_key.as_deref());
    let gate = shell::transcript_gate(&cfg);
    let ledger = load_ledger(&cfg)?;
    let mut core = Core::new(cfg, ledger, gate, 40, now());
    let mut shell = shell::Shell::new(client);
    core.set_agent_pid(match pane.pid() {
        Ok(pid) => Some(pid),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the pane's process");
            None
        }
    });
    let offset = checkpoint.offset;
    core.resume = Some(Resume::new(checkpoint, session.clone()));
    let mut term = tmux::TmuxTerminal::new(pane, output, session.clone(), term);
    // A failure with the session gone is its end, which the loop hears of (`Note::Gone`).
    match Terminal::snapshot(&mut term, Some(offset)).await {
        Ok(Some(snap)) => {
            core.resync(snap, now());
            shell.apply(&mut core, &mut term).await?;
        }
        Ok(None) => {}
        Err(e) if session_lives(&session) => return Err(e),
        Err(_) => {}
    }
    core.cfg.door_key = Some(key.clone());
    let mut door = door::open(&core.cfg.team_dir, &core.cfg.name, &key);
    let ended = shell.serve(&mut core, &mut term, &mut door).await?;
    if let Ended::Stopped(_) = ended {
        // Stopped: the agent keeps running in its session; a new wrapper resumes.
        tracing::info!("stopped by a signal; the agent keeps running in tmux");
        shell.close().await;
        return Ok(0);
    }
    let code = read_exit(&core.cfg.team_dir).await;
    tracing::info!(?code, "the agent exited; ending its session");
    log_last_lines(&core.cfg.team_dir, code);
    shell.checkpoint(&mut core, &mut term).await;
    let cfg = core.cfg.clone();
    let fleeting = shell.end(&mut core, &mut term).await;
    tmux::kill(&session);
    if fleeting {
        forget_fleeting(&cfg).await;
    }
    // Unknown is not success: a killed session must not pass for an agent that exited 0.
    code.ok_or(WrapError::ExitUnknown { session })
}

/// The door key of the agent in `pane`'s session. `given` (by the process that created the
/// session and put it in the agent's environment) is kept in the session's own environment,
/// set through the control client (its input, not a command line), so that a relaying process
/// started later for the same session finds it there. A session with none (started by an older
/// agent-relay) gets a new one: its agent's doors are refused until it is started again, which
/// is logged.
fn session_door_key(pane: &tmux::Pane, given: Option<&str>) -> String {
    if let Some(key) = given {
        if let Err(e) = pane.set_session_env(door::KEY_ENV, key) {
            tracing::warn!(error = %e, "cannot keep the door key in the tmux session; a relaying process started later for it will refuse the agent's MCP server and hooks");
        }
        return key.to_owned();
    }
    match pane.session_env(door::KEY_ENV) {
        Ok(Some(key)) => key,
        Ok(None) => {
            tracing::warn!(
                "the tmux session has no door key (started by an older agent-relay): the agent's MCP server and hooks are refused until it is started again"
            );
            door::new_key()
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the door key of the tmux session: the agent's MCP server and hooks are refused until it is started again");
            door::new_key()
        }
    }
}

/// Logs the pane's last lines when the agent failed (or its status is unknown): the log then
/// says why, not only the status.
fn log_last_lines(team_dir: &std::path::Path, code: Option<i32>) {
    if code == Some(0) {
        return;
    }
    let lines = tmux::last_lines(team_dir, 20);
    if !lines.is_empty() {
        tracing::warn!(?code, last_lines = %lines.join("\n"), "the agent failed; its last lines");
    }
}

/// Whether tmux session `session` still exists, asked up to three times a tenth of a second
/// apart: ending the relaying (and the session) on one failed `has-session` under a loaded
/// machine would end an agent that runs on.
pub(crate) fn session_lives(session: &str) -> bool {
    for attempt in 0..3 {
        if tmux::exists(session) {
            return true;
        }
        if attempt < 2 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    false
}

/// The agent's exit status, from `<team dir>/exit`: written by the session's shell just before
/// it ends, so it is there by the time the session is gone, unless the session was killed.
/// A moment is given for a write still under way.
async fn read_exit(team_dir: &std::path::Path) -> Option<i32> {
    let exit = team_dir.join("exit");
    for _ in 0..10 {
        if let Ok(text) = std::fs::read_to_string(&exit) {
            return text.trim().parse().ok();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[cfg(test)]
mod fake_relay;
#[cfg(test)]
mod serve_tests;

#[cfg(test)]
mod colour_tests {
    use super::colour_warning;
    use relay_parse::Profile;

    #[test]
    fn no_color_warns_only_where_colour_tells_code_from_prose() {
        let claude = Profile::by_name("claude").expect("the claude parser");
        let codex = Profile::by_name("codex").expect("the codex parser");
        let set = |v: &str| {
            let v = v.to_owned();
            move |k: &str| (k == "NO_COLOR").then(|| v.clone())
        };
        let warning = colour_warning(&claude, set("1")).expect("a warning");
        assert!(warning.contains("NO_COLOR") && warning.contains("code block"));
        // An empty NO_COLOR is unset (no-color.org); other parsers do not use colour for this.
        assert_eq!(colour_warning(&claude, set("")), None);
        assert_eq!(colour_warning(&claude, |_: &str| None), None);
        assert_eq!(colour_warning(&codex, set("1")), None);
    }
}
