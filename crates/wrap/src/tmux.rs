//! The tmux backend: the agent runs in its own tmux session, which a person can attach to
//! and leave at will while relaying goes on.
//!
//! - The wrapper attaches one long-lived control-mode client (`tmux -C`, see `tmux/control.rs`) to
//!   the session: the pane's output arrives on it as `%output` notifications, and every
//!   command (paste, Enter, leave copy mode, read the screen) goes down the same pipe. No
//!   process is started per action, and nothing is written to disk while the agent runs.
//! - The agent runs under a one-line shell that writes its exit status to `<team dir>/exit`
//!   (a few bytes); the session ends with the agent, tmux ends the control client, and the
//!   relaying process reads the status and says goodbye to the relay.
//! - What the pane printed while no wrapper ran is read back once, when a wrapper attaches,
//!   from tmux's own history (`capture-pane`, see `Pane::snapshot`).
//!
//! `tmux_interface` is not used: its control-mode parser (`ControlModeLine::control_mode_line`)
//! takes a `&str` line and returns `Response::Output { value: String }` with the octal escapes
//! left in, and a pane's output is bytes (tmux cuts `%output` notifications anywhere, inside
//! a UTF-8 character too), so it cannot carry them; and its command builder's text form
//! (`TmuxCommand`'s `Display`, `to_vec`) joins arguments with spaces and no quoting for tmux's
//! own command parser, which a control-mode pipe needs (a message holds spaces, quotes, `;`,
//! `$`, line breaks). The three command lines the wrapper sends are written here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::collections::VecDeque;

use tokio::sync::mpsc;

pub(crate) use control::Note;
use control::Notes;

use crate::WrapError;

mod control;
mod error;
mod guard;

pub use error::TmuxError;

pub(crate) use control::wait_detached;

/// Runs one tmux command line; its stdout on success.
fn tmux(args: &[&str], stdin: Option<&[u8]>) -> Result<String, WrapError> {
    let mut cmd = Command::new("tmux");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let command = args.first().copied().unwrap_or_default();
    let mut child = cmd.spawn().map_err(|source| TmuxError::Start {
        command: format!("tmux {command}"),
        source,
    })?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes)
            .map_err(|e| TmuxError::io(format!("{command}: stdin"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| TmuxError::io(command, e))?;
    if !out.status.success() {
        return Err(TmuxError::Refused {
            command: command.to_owned(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Quotes `s` for `/bin/sh` (single quotes, each `'` as `'\''`).
#[must_use]
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A tmux session name from the project and the agent: `myapp-Alice`. tmux reserves `.` and
/// `:` in targets, so only letters, digits, `-` and `_` are kept.
pub fn session_name(project_root: &Path, agent: &str) -> String {
    let project = project_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let keep = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let project = keep(&project);
    if project.is_empty() {
        format!("relay-{}", keep(agent))
    } else {
        format!("{project}-{}", keep(agent))
    }
}

/// Whether session `name` exists.
pub fn exists(name: &str) -> bool {
    tmux(&["has-session", "-t", &format!("={name}")], None).is_ok()
}

/// How to start an agent in a new session.
#[derive(Debug)]
pub struct NewSession<'a> {
    /// Session name.
    pub name: &'a str,
    /// The agent command and its arguments.
    pub command: &'a [String],
    /// Extra environment (besides the caller's, which the session gets whole).
    pub env: &'a [(String, String)],
    /// Working directory.
    pub cwd: &'a Path,
    /// Size.
    pub rows: u16,
    /// Size.
    pub cols: u16,
    /// The agent's directory of wrapper files (`exit`, `checkpoint`).
    pub team_dir: &'a Path,
}

/// The file in the agent's team directory that holds the pane's last lines once the agent
/// exited (see [`last_lines`]).
pub const LAST_SCREEN: &str = "last-screen";

/// The file in the agent's team directory naming the command that stopped its session
/// (`agent-relay stop NAME`), for a person who was attached to it.
pub const STOPPED_BY: &str = "stopped-by";

/// What stopped the agent's session, when a command of the relay did.
pub fn stopped_by(team_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(team_dir.join(STOPPED_BY)).ok()?;
    Some(relay_protocol::text::one_line(text.trim(), 200)).filter(|t| !t.is_empty())
}

/// How many lines of the pane (history included) `last-screen` keeps.
const LAST_LINES: u16 = 60;

/// The last `n` lines the agent's pane showed when the agent exited, trailing blank lines
/// left out and each line cleaned for a terminal; empty when the file is missing (an agent
/// run before this was kept, or a session killed rather than ended).
pub fn last_lines(team_dir: &Path, n: usize) -> Vec<String> {
    let path = team_dir.join(LAST_SCREEN);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the agent's last lines");
            }
            return Vec::new();
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let skip = lines.len().saturating_sub(n);
    lines[skip..]
        .iter()
        .map(|l| relay_protocol::text::one_line(l, 400))
        .collect()
}

/// Starts the agent in a new detached session, with its exit status kept in `exit`. What it
/// prints before a wrapper attaches is read from the pane's history (see `Pane::snapshot`).
///
/// # Errors
/// tmux is missing or refuses (a session of that name exists, say).
pub fn create(s: &NewSession<'_>) -> Result<(), WrapError> {
    std::fs::create_dir_all(s.team_dir)
        .map_err(|e| TmuxError::io(format!("team directory {}", s.team_dir.display()), e))?;
    for p in [s.team_dir.to_string_lossy()] {
        // The paths go into commands tmux parses and formats; refuse what would be read
        // as syntax there instead of escaping through two languages.
        if p.contains(['"', '\\', '\'', '#', '$', '`', '\n']) {
            return Err(TmuxError::UnsafePath(p.into_owned()).into());
        }
    }
    let exit = s.team_dir.join("exit");
    let last = s.team_dir.join(LAST_SCREEN);
    // A new session starts a new checkpoint: its rows refer to this session. (`pane.log` is
    // what versions that piped the pane to a file left.)
    for stale in [
        &exit,
        &last,
        &s.team_dir.join(STOPPED_BY),
        &s.team_dir.join("checkpoint"),
        &s.team_dir.join("pane.log"),
    ] {
        match std::fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(TmuxError::io(format!("stale file {}", stale.display()), e).into());
            }
        }
    }
    let (cols, rows) = (s.cols.to_string(), s.rows.to_string());
    let cwd = s.cwd.to_string_lossy();
    let mut args: Vec<String> = [
        "new-session",
        "-d",
        "-s",
        s.name,
        "-x",
        &cols,
        "-y",
        &rows,
        "-c",
        &cwd,
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    // The caller's environment, whole (a running tmux server would otherwise give the agent
    // the environment the server started with), goes through a private file the session's
    // shell reads and removes: never through tmux's command line (`new-session -e K=V`),
    // which the server keeps as its argv for every local user to read (`ps -eo args`), API
    // keys included.
    let env_file = write_env_file(s.team_dir, s.env)?;
    // The agent runs under a one-line shell that keeps its exit status in `exit`; the pane,
    // and the session, close with it. (tmux's own record of the status, with remain-on-exit
    // and a pane-died hook, was not always there: tmux 3.3a sometimes marked a dead pane with
    // no status and fired no hook.) The paths and the command are arguments: nothing to quote.
    // The shell also unsets what the agent must not inherit, which a tmux server started
    // elsewhere may have in its global environment (the file can add, not remove).
    // Before the status, it keeps the pane's last lines in `last-screen` (the pane still
    // exists while its shell runs): an agent that fails at start (a bad flag, a missing key)
    // says why there, and the session, with what it printed, is gone a moment later.
    let shell = format!(
        r#"e="$1"; x="$2"; l="$3"; shift 3; . "$e"; rm -f "$e"; unset {}; "$@"; s=$?; tmux capture-pane -p -J -S -{LAST_LINES} -t "$TMUX_PANE" > "$l" 2>/dev/null; printf '%s\n' "$s" > "$x.tmp" && mv "$x.tmp" "$x"; exit "$s""#,
        crate::NOT_INHERITED.join(" ")
    );
    args.extend(
        ["--", "sh", "-c", &shell, "agent-relay"]
            .iter()
            .map(|a| (*a).to_owned()),
    );
    args.push(env_file.to_string_lossy().into_owned());
    args.push(exit.to_string_lossy().into_owned());
    args.push(last.to_string_lossy().into_owned());
    args.extend(s.command.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // A new session is announced to every control client (see [`guard`]).
    let created = {
        let _guard = guard::take("new-session");
        tmux(&args, None)
    };
    if let Err(e) = created {
        // No session will read it.
        if let Err(rm) = std::fs::remove_file(&env_file) {
            tracing::warn!(error = %rm, file = %env_file.display(), "cannot remove the session's environment file");
        }
        return Err(e);
    }
    Ok(())
}

/// Variables bash (which is `sh` on some systems) holds read-only: assigning one ends a POSIX
/// shell, so the session's environment file leaves them out.
const SHELL_READONLY: &[&str] = &[
    "BASHOPTS",
    "BASH_VERSINFO",
    "EUID",
    "PPID",
    "SHELLOPTS",
    "UID",
];

/// Whether `name` can be exported by a POSIX shell: a letter or `_`, then letters, digits, `_`.
fn shell_name(name: &[u8]) -> bool {
    name.first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
        && name.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// The environment a new session's shell sources: this process's (less tmux's own variables
/// and [`crate::NOT_INHERITED`]) and `extra`, as `export NAME='value'` lines.
fn env_script(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    extra: &[(String, String)],
) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    let mut line = |k: &[u8], v: &[u8]| {
        out.extend_from_slice(b"export ");
        out.extend_from_slice(k);
        out.extend_from_slice(b"='");
        for &b in v {
            if b == b'\'' {
                out.extend_from_slice(br"'\''");
            } else {
                out.push(b);
            }
        }
        out.extend_from_slice(b"'\n");
    };
    for (k, v) in vars {
        let name = k.as_bytes();
        let skip = |list: &[&str]| list.iter().any(|n| n.as_bytes() == name);
        if matches!(name, b"TMUX" | b"TMUX_PANE") || skip(crate::NOT_INHERITED) {
            continue;
        }
        // A name the shell cannot export (`BASH_FUNC_f%%`, ...) or must not assign.
        if !shell_name(name) || skip(SHELL_READONLY) {
            tracing::debug!(name = %k.to_string_lossy(), "not passed to the tmux session: not a shell variable name");
            continue;
        }
        line(name, v.as_bytes());
    }
    for (k, v) in extra {
        if shell_name(k.as_bytes()) {
            line(k.as_bytes(), v.as_bytes());
        }
    }
    out
}

/// Writes the new session's environment to `<team_dir>/session.env`, readable by this user
/// only (created 0600, never through a file or link already there), and returns its absolute
/// path: the session's shell sources it, then removes it.
fn write_env_file(team_dir: &Path, extra: &[(String, String)]) -> Result<PathBuf, WrapError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::path::absolute(team_dir.join("session.env"))
        .map_err(|e| TmuxError::io("environment file", e))?;
    // One left by a session that never started.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(TmuxError::io(format!("environment file {}", path.display()), e).into());
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| TmuxError::io(format!("environment file {}", path.display()), e))?;
    file.write_all(&env_script(std::env::vars_os(), extra))
        .map_err(|e| TmuxError::io(format!("environment file {}", path.display()), e))?;
    Ok(path)
}

/// Ends session `name` (gone already is fine: it was ending).
pub fn kill(name: &str) {
    // The session's end is announced to every control client (see [`guard`]).
    let _guard = guard::take("kill-session");
    if let Err(e) = tmux(&["kill-session", "-t", &format!("={name}")], None) {
        tracing::debug!(error = %e, session = name, "kill-session");
    }
}

/// A command that attaches the person's terminal to session `name` (switches the client
/// when already inside tmux).
pub fn attach_command(name: &str) -> Command {
    let mut cmd = Command::new("tmux");
    if std::env::var_os("TMUX").is_some() {
        cmd.args(["switch-client", "-t", &format!("={name}")]);
    } else {
        cmd.args(["attach-session", "-t", &format!("={name}")]);
    }
    cmd
}

/// The agent's pane in a running session, driven through one long-lived control-mode
/// client (see [`control`]): attached by [`Pane::attach`], attached again (by the loop, see
/// [`Pane::reattach`]) when it ended while the session lives on.
#[derive(Clone)]
pub(crate) struct Pane {
    session: String,
    target: String,
    buffer: String,
    client: std::sync::Arc<std::sync::Mutex<Client>>,
}

/// The control client and where its notes go.
struct Client {
    control: Option<control::Control>,
    notes: Notes,
    /// The agent's pane (`%N`), once known: other panes' output is not the agent's.
    pane_id: Option<String>,
}

impl std::fmt::Debug for Pane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pane")
            .field("target", &self.target)
            .finish()
    }
}

pub(crate) use crate::terminal::Snapshot;

impl Pane {
    /// Attaches a control client to session `session`; the pane's output and the client's
    /// end arrive on the returned channel.
    ///
    /// # Errors
    /// tmux cannot be started or the session is gone.
    pub(crate) fn attach(
        session: &str,
    ) -> Result<(Self, mpsc::UnboundedReceiver<(u64, Note)>), WrapError> {
        let (notes, rx) = Notes::channel();
        let pane = Self {
            session: session.to_owned(),
            target: control::quote(&format!("={session}:")),
            buffer: control::quote(&format!("relay-{session}")),
            client: std::sync::Arc::new(std::sync::Mutex::new(Client {
                control: None,
                notes,
                pane_id: None,
            })),
        };
        pane.reattach()?;
        Ok((pane, rx))
    }

    /// Attaches a new control client (the last one ended), its output to the same channel.
    ///
    /// # Errors
    /// tmux cannot be started or the session is gone.
    pub(crate) fn reattach(&self) -> Result<(), WrapError> {
        let mut c = self.client.lock().map_err(|_| TmuxError::Poisoned)?;
        c.control = None;
        if c.pane_id.is_none() {
            // Asked once, before the client exists, so that from its first `%output` on only
            // the agent's pane is read.
            let id = tmux(
                &[
                    "display-message",
                    "-p",
                    "-t",
                    &format!("={}:", self.session),
                    "#{pane_id}",
                ],
                None,
            )?;
            c.pane_id = Some(id.trim().to_owned());
        }
        c.control = Some(control::Control::attach(
            &self.session,
            c.pane_id.clone(),
            c.notes.clone(),
        )?);
        Ok(())
    }

    /// Runs one command line through the control client; its output as text.
    fn run(&self, line: &str) -> Result<String, WrapError> {
        self.run_counted(line).map(|(out, _)| out)
    }

    /// [`Pane::run`], with the number of the pane's notes read before its answer.
    fn run_counted(&self, line: &str) -> Result<(String, u64), WrapError> {
        let mut c = self.client.lock().map_err(|_| TmuxError::Poisoned)?;
        let Some(control) = c.control.as_mut().filter(|c| c.alive()) else {
            // The loop attaches a new one when it hears of the end (`Note::Gone`).
            return Err(TmuxError::Control("ended").into());
        };
        let (out, at) = control.run_counted(line)?;
        Ok((String::from_utf8_lossy(&out).into_owned(), at))
    }

    /// Reads the pane's screen and, from row `from` of its history on (counted from the
    /// oldest row tmux ever kept, see [`Pane::row`]; `None`: all of it), what no wrapper
    /// read. With colours (`-e`), as the parser reads them from live output.
    ///
    /// The pane may print between the commands that read it (the agent runs on): the snapshot
    /// is taken again until the pane's state (history size, cursor, size) is the same after
    /// the captures as before them, so that the rows and the cursor agree. A cursor read before
    /// output the captures then showed put the parser's cursor on a row above it: the next
    /// text typed overwrote, in the parser's copy only, a directive below it, never relayed.
    pub(crate) fn snapshot(&self, from: Option<u64>) -> Result<Snapshot, WrapError> {
        Commands::new(&|line| self.run_counted(line), &self.target).snapshot(from)
    }

    /// The row the cursor is on, counted from the oldest row in the pane's history: where a
    /// restarted wrapper starts reading (see [`Pane::snapshot`]).
    pub(crate) fn row(&self) -> Result<u64, WrapError> {
        Commands::new(&|line| self.run_counted(line), &self.target).row()
    }

    /// Everything in the pane's history and screen, as text (for finding a message typed by
    /// a wrapper that stopped before recording its outcome).
    pub(crate) fn history(&self) -> Result<String, WrapError> {
        self.run(&format!("capture-pane -p -J -S - -t {}", self.target))
    }

    /// Types `text` (no Enter), leaving copy mode first (a person scrolling back; keys would
    /// drive the copy mode, not the agent): one buffer set and one paste, bracketed when the
    /// application asked for bracketed paste.
    pub(crate) fn type_text(&self, text: &str) -> Result<(), WrapError> {
        Commands::new(&|line| self.run_counted(line), &self.target).type_text(&self.buffer, text)
    }
}

/// Runs a command line down a pane's control client: its output, and how many of the pane's
/// notes were read before it answered.
type Runner<'a> = dyn Fn(&str) -> Result<(String, u64), WrapError> + 'a;

/// The command lines that read or type into a pane, over whatever runs them: the pane's
/// control client, or in unit tests a stand-in that answers as tmux would.
struct Commands<'a> {
    run: &'a Runner<'a>,
    target: &'a str,
}

impl<'a> Commands<'a> {
    fn new(run: &'a Runner<'a>, target: &'a str) -> Self {
        Self { run, target }
    }

    fn run(&self, line: &str) -> Result<String, WrapError> {
        (self.run)(line).map(|(out, _)| out)
    }

    /// [`Commands::run`], with the number of the pane's notes read before its answer.
    fn run_counted(&self, line: &str) -> Result<(String, u64), WrapError> {
        (self.run)(line)
    }

    /// See [`Pane::snapshot`].
    fn snapshot(&self, from: Option<u64>) -> Result<Snapshot, WrapError> {
        let mut info = self.pane_state()?;
        for _ in 0..SNAPSHOT_TRIES {
            let snap = self.snapshot_at(from, &info)?;
            let after = self.pane_state()?;
            if after == info {
                return Ok(snap);
            }
            tracing::debug!(before = %info, after = %after, "the pane changed while it was read; reading it again");
            info = after;
        }
        // Printing without a pause: the last reading, its cursor read just before it.
        tracing::warn!("the pane kept changing while it was read; its last reading is used");
        self.snapshot_at(from, &info)
    }

    /// `history_size cursor_y cursor_x pane_height pane_width`, as tmux says it.
    fn pane_state(&self) -> Result<String, WrapError> {
        self.run(&format!(
            "display-message -p -t {} \"#{{history_size}} #{{cursor_y}} #{{cursor_x}} #{{pane_height}} #{{pane_width}}\"",
            self.target
        ))
        .map(|s| s.trim().to_owned())
    }

    /// One reading of the pane for [`Pane::snapshot`], `info` its state just before.
    fn snapshot_at(&self, from: Option<u64>, info: &str) -> Result<Snapshot, WrapError> {
        // Every field a number, or the answer is refused: a field read as 0 would put the
        // checkpoint on the wrong row.
        let n: Vec<i64> = info
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        let [history, cy, cx, height, width] = n[..] else {
            return Err(TmuxError::Answer {
                command: "display-message",
                what: "pane state",
                answer: info.to_owned(),
            }
            .into());
        };
        // The checkpoint's row on the screen (negative: in the history).
        let at = from.map_or(-history, |f| i64::try_from(f).unwrap_or(i64::MAX) - history);
        // The last capture's count of notes read before it is kept: every capture reads the
        // screen as the stream had it at its answer, and the screen is captured last.
        let notes_before = std::cell::Cell::new(0);
        let capture = |start: i64, end: &str, join: bool| -> Result<Vec<u8>, WrapError> {
            let start = if start <= -history {
                "-".to_owned()
            } else {
                start.to_string()
            };
            let (out, at) = self.run_counted(&format!(
                "capture-pane -p -e {}-S {start} -E {end} -t {}",
                if join { "-J " } else { "" },
                self.target
            ))?;
            notes_before.set(at);
            Ok(out.into_bytes())
        };
        let lines = |text: Vec<u8>, last: bool| -> Vec<u8> {
            // Rows as the terminal would draw them: CR LF between rows.
            let text = String::from_utf8_lossy(&text).into_owned();
            let text = text.strip_suffix('\n').unwrap_or(&text);
            let mut out = text.replace('\n', "\r\n").into_bytes();
            if !last {
                out.extend_from_slice(b"\r\n");
            }
            out
        };
        let mut snap = Snapshot {
            rows: u16::try_from(height).unwrap_or(40),
            cols: u16::try_from(width).unwrap_or(80),
            ..Snapshot::default()
        };
        if at < 0 {
            // Rows of the history no wrapper read (wrapped rows joined: final, whole lines),
            // then the whole screen.
            if history > 0 {
                snap.unseen = lines(capture(at, "-1", true)?, false);
            }
            snap.unseen.extend(lines(capture(0, "-", false)?, true));
        } else {
            if at > 0 {
                snap.seen = lines(capture(0, &(at.min(height) - 1).to_string(), false)?, false);
            }
            if at < height {
                snap.unseen = lines(capture(at, "-", false)?, true);
            }
        }
        snap.unseen
            .extend_from_slice(format!("\x1b[{};{}H", cy + 1, cx + 1).as_bytes());
        snap.notes_before = notes_before.get();
        Ok(snap)
    }

    /// See [`Pane::row`].
    fn row(&self) -> Result<u64, WrapError> {
        let out = self.run(&format!(
            "display-message -p -t {} \"#{{history_size}} #{{cursor_y}}\"",
            self.target
        ))?;
        let mut it = out.split_whitespace().map(str::parse::<u64>);
        match (it.next(), it.next()) {
            (Some(Ok(h)), Some(Ok(y))) => Ok(h + y),
            _ => Err(TmuxError::Answer {
                command: "display-message",
                what: "pane rows",
                answer: out,
            }
            .into()),
        }
    }

    /// See [`Pane::type_text`].
    fn type_text(&self, buffer: &str, text: &str) -> Result<(), WrapError> {
        let mode = self.run(&format!(
            "display-message -p -t {} \"#{{pane_in_mode}}\"",
            self.target
        ))?;
        if mode.trim() != "0" {
            self.run(&format!("send-keys -t {} -X cancel", self.target))?;
        }
        // Two lines: tmux answers each command of a `;` list with its own block.
        self.run(&format!("set-buffer -b {buffer} {}", control::quote(text)))?;
        self.run(&format!(
            "paste-buffer -p -d -r -b {buffer} -t {}",
            self.target
        ))?;
        Ok(())
    }
}

impl Pane {
    /// When a person last pressed a key in (or attached to) the pane's session, in whole
    /// seconds since the epoch: tmux's `session_activity`, which keys typed through an
    /// attached client move and the wrapper's own `send-keys`, pastes and resizes do not.
    pub(crate) fn person_activity(&self) -> Result<u64, WrapError> {
        let out = self.run(&format!(
            "display-message -p -t {} \"#{{session_activity}}\"",
            self.target
        ))?;
        out.trim().parse().map_err(|_| {
            TmuxError::Answer {
                command: "display-message",
                what: "session_activity",
                answer: out.clone(),
            }
            .into()
        })
    }

    /// The process the pane runs (the agent's CLI, or what starts it).
    pub(crate) fn pid(&self) -> Result<u32, WrapError> {
        let out = self.run(&format!(
            "display-message -p -t {} \"#{{pane_pid}}\"",
            self.target
        ))?;
        out.trim().parse().map_err(|_| {
            TmuxError::Answer {
                command: "display-message",
                what: "pane_pid",
                answer: out.clone(),
            }
            .into()
        })
    }

    /// Variable `name` of the session's own environment (`show-environment -t`), through the
    /// control client: `None` when the session has none.
    pub(crate) fn session_env(&self, name: &str) -> Result<Option<String>, WrapError> {
        let line = format!(
            "show-environment -t {} {}",
            control::quote(&format!("={}", self.session)),
            control::quote(name)
        );
        match self.run(&line) {
            Ok(out) => Ok(out
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)),
            Err(WrapError::Tmux(e)) if e.refused_with("unknown variable") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets variable `name` in the session's own environment (`set-environment -t`), through
    /// the control client's input: the value is on no process's command line.
    pub(crate) fn set_session_env(&self, name: &str, value: &str) -> Result<(), WrapError> {
        self.run(&format!(
            "set-environment -t {} {} {}",
            control::quote(&format!("={}", self.session)),
            control::quote(name),
            control::quote(value)
        ))
        .map(drop)
    }

    /// Presses Enter.
    pub(crate) fn enter(&self) -> Result<(), WrapError> {
        self.run(&format!("send-keys -t {} Enter", self.target))?;
        Ok(())
    }
}

/// Of the notes read off the channel while a snapshot was taken (numbered, oldest first), the
/// ones that came after its capture (`notes_before` were read before it answered), in order;
/// and whether an earlier client's end was among those before (a new client is live then).
/// Output before the capture is on the captured screen, a size before it is the snapshot's.
fn after_capture(read: Vec<(u64, Note)>, notes_before: u64) -> (Vec<Note>, bool) {
    let mut gone = false;
    let mut later = Vec::new();
    for (n, note) in read {
        if n >= notes_before {
            later.push(note);
        } else {
            gone |= matches!(note, Note::Gone);
        }
    }
    (later, gone)
}

/// A test hook (issue 23.17a): with `AGENT_RELAY_TEST_PAUSE_AFTER_CAPTURE=PATH` set, a snapshot
/// waits after tmux answered its capture, before it reads the notes the control reader passed
/// on meanwhile, until PATH exists (at most a minute). Output printed in that window is what a
/// snapshot once dropped; the window is microseconds wide, so only a pause lets a test print
/// into it. Unset (always, outside tests), this returns at once.
async fn pause_after_capture() {
    let Some(gate) = std::env::var_os("AGENT_RELAY_TEST_PAUSE_AFTER_CAPTURE") else {
        return;
    };
    let gate = std::path::PathBuf::from(gate);
    tracing::info!(gate = %gate.display(), "test hook: paused after the capture");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !gate.exists() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The tmux backend as the wrapper's loop drives it (see [`crate::terminal::Terminal`]): the
/// agent's pane through its control client, attached again when that client ends while the
/// session lives, and SIGTERM (which stops the relaying, not the agent).
pub(crate) struct TmuxTerminal {
    pub(crate) pane: Pane,
    output: mpsc::UnboundedReceiver<(u64, Note)>,
    /// Notes read off `output` while a snapshot was taken that came after its capture: the
    /// loop gets them first.
    after_snapshot: VecDeque<Note>,
    session: String,
    term: tokio::signal::unix::Signal,
}

/// How many times [`Pane::snapshot`] reads a pane that keeps changing under it.
const SNAPSHOT_TRIES: usize = 5;

impl TmuxTerminal {
    /// The terminal of `pane` (attached to `session`), whose notes arrive on `output`.
    /// `term` hears SIGTERM (set up by the caller before any control client started).
    pub(crate) fn new(
        pane: Pane,
        output: mpsc::UnboundedReceiver<(u64, Note)>,
        session: String,
        term: tokio::signal::unix::Signal,
    ) -> Self {
        Self {
            pane,
            output,
            after_snapshot: VecDeque::new(),
            session,
            term,
        }
    }

    /// Runs `f`, a command down the pane's control client (which blocks until tmux answers),
    /// on tokio's blocking pool: the loop's thread stays free for the other tasks (the door,
    /// the relay's receipts).
    async fn blocking<T: std::marker::Send + 'static>(
        &self,
        f: impl FnOnce(&Pane) -> Result<T, WrapError> + std::marker::Send + 'static,
    ) -> Result<T, WrapError> {
        let pane = self.pane.clone();
        tokio::task::spawn_blocking(move || f(&pane))
            .await
            .map_err(|source| TmuxError::Join {
                what: "control client",
                source,
            })?
    }

    /// Reads the pane afresh from row `from` (a wrapper attaching, or its control client
    /// attached again): output the old client passed on before the snapshot is in the
    /// snapshot.
    pub(crate) async fn snapshot(&mut self, from: Option<u64>) -> Result<Snapshot, WrapError> {
        let snap = self.blocking(move |pane| pane.snapshot(from)).await?;
        pause_after_capture().await;
        // What came before the capture's answer is on the captured screen already; what came
        // after it is read next (the reader may have passed it on by now: dropping it lost a
        // directive printed across the capture, issue 23.17).
        let mut read = Vec::new();
        while let Ok(note) = self.output.try_recv() {
            read.push(note);
        }
        let (later, gone) = after_capture(read, snap.notes_before);
        self.after_snapshot.extend(later);
        if gone {
            // The old client's end, read past above: the new client is live (its own end
            // comes on the channel when it ends).
            tracing::debug!("an earlier control client's end was read during the snapshot");
        }
        Ok(snap)
    }
}

impl crate::terminal::Terminal for TmuxTerminal {
    fn backend(&self) -> &'static str {
        "tmux"
    }

    async fn next_event(
        &mut self,
        checkpoint: Option<u64>,
    ) -> Result<crate::terminal::TermEvent, WrapError> {
        use crate::terminal::TermEvent;
        // Both branches are receives; what follows a note runs without awaiting: cancel-safe.
        let note = match self.after_snapshot.pop_front() {
            Some(note) => Some(note),
            None => tokio::select! {
                note = self.output.recv() => note.map(|(_, note)| note),
                _ = self.term.recv() => return Ok(TermEvent::Stopped(15)),
            },
        };
        match note {
            Some(Note::Output(bytes)) => Ok(TermEvent::Output(bytes)),
            // The window was resized (a person's terminal, `resize-window`): what the pane
            // prints from now on is laid out at this size.
            Some(Note::Resized { rows, cols }) => Ok(TermEvent::Resized { rows, cols }),
            // The control client ended: the session is gone (the agent exited, a person
            // killed it, the tmux server died), or only the client (killed), and a new one
            // reads on from the checkpoint.
            Some(Note::Gone) | None => {
                let session = self.session.clone();
                if !tokio::task::block_in_place(|| crate::session_lives(&session)) {
                    return Ok(TermEvent::Ended);
                }
                tracing::warn!(
                    "the tmux control client ended while the session lives: attaching a new one and reading the pane from the checkpoint"
                );
                // Failing with the session gone meanwhile, the new client's end (or the
                // closed channel) comes next and is handled above.
                let again = match self.pane.reattach() {
                    Ok(()) => self.snapshot(checkpoint).await,
                    Err(e) => Err(e),
                };
                match again {
                    Ok(snap) => Ok(TermEvent::Reread(snap)),
                    Err(e) if tokio::task::block_in_place(|| crate::session_lives(&session)) => {
                        Err(e)
                    }
                    Err(_) => Ok(TermEvent::Ended),
                }
            }
        }
    }

    async fn type_text(&mut self, text: &str) -> Result<(), WrapError> {
        let text = text.to_owned();
        self.blocking(move |pane| pane.type_text(&text)).await
    }

    async fn write_keys(&mut self, _keys: Vec<u8>) -> Result<(), WrapError> {
        // A person types through their own tmux client: no keys come through the wrapper.
        Ok(())
    }

    async fn enter(&mut self) -> Result<(), WrapError> {
        self.blocking(|pane| pane.enter()).await
    }

    fn resize(&mut self, _rows: u16, _cols: u16) -> Result<(), WrapError> {
        // The window takes the size of the person's tmux client when one is attached; the
        // wrapper has no terminal of its own to follow.
        Ok(())
    }

    fn sees_keys(&self) -> bool {
        false
    }

    fn typing_errors_end(&self) -> bool {
        false
    }

    fn outlives_wrapper(&self) -> bool {
        true
    }

    async fn history(&mut self) -> Result<Option<String>, WrapError> {
        self.blocking(|pane| pane.history().map(Some)).await
    }

    async fn cursor_row(&mut self) -> Result<Option<u64>, WrapError> {
        self.blocking(|pane| pane.row().map(Some)).await
    }

    async fn person_activity(&mut self) -> Result<Option<u64>, WrapError> {
        self.blocking(|pane| pane.person_activity().map(Some)).await
    }

    async fn snapshot(&mut self, from: Option<u64>) -> Result<Option<Snapshot>, WrapError> {
        TmuxTerminal::snapshot(self, from).await.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// What a pane with no tmux behind it answers to the command lines of [`Commands`].
    #[derive(Debug, Default)]
    struct FakePane {
        /// The pane's history and screen, as `capture-pane` gives it.
        history: String,
        /// Command lines run, in order.
        commands: Vec<String>,
        /// The pane is in a mode (copy mode: a person scrolling back) until cancelled.
        in_mode: bool,
        /// Answers to the snapshot's state query (`history_size cursor_y cursor_x height
        /// width`), one per query, the last one kept: the pane printing while it is read.
        states: VecDeque<String>,
    }

    impl FakePane {
        fn answer(&mut self, line: &str) -> String {
            self.commands.push(line.to_owned());
            if line.contains("#{pane_height}") && !self.states.is_empty() {
                if self.states.len() > 1 {
                    self.states.pop_front().unwrap_or_default()
                } else {
                    self.states[0].clone()
                }
            } else if line.starts_with("capture-pane") {
                self.history.clone()
            } else if line.contains("#{pane_in_mode}") {
                if self.in_mode { "1" } else { "0" }.to_owned()
            } else if line.contains("-X cancel") {
                self.in_mode = false;
                String::new()
            } else {
                String::new()
            }
        }
    }

    /// Runs `f` with the command lines of a pane that answers from `fake`.
    fn with_fake<T>(fake: &std::sync::Mutex<FakePane>, f: impl FnOnce(Commands<'_>) -> T) -> T {
        let run = |line: &str| Ok((fake.lock().unwrap().answer(line), 0));
        f(Commands::new(&run, "=fake:"))
    }

    #[test]
    fn session_names_keep_only_what_tmux_targets_allow() {
        assert_eq!(
            session_name(Path::new("/home/me/my.app"), "Alice"),
            "my_app-Alice"
        );
        assert_eq!(session_name(Path::new("/"), "Bob"), "relay-Bob");
    }

    #[test]
    fn the_environment_script_quotes_every_value_and_skips_what_a_shell_cannot_take() {
        let os = |k: &str, v: &str| (k.into(), v.into());
        let script = env_script(
            [
                os("KEY", "it's $HOME `x` \"q\"\nline two"),
                os("TMUX", "/tmp/tmux-0/default,1,0"),
                os("CI", "true"),
                os("BASH_FUNC_f%%", "() { :; }"),
                os("UID", "0"),
            ],
            &[("AGENT_RELAY_NAME".into(), "Al".into())],
        );
        let script = String::from_utf8(script).unwrap();
        assert_eq!(
            script,
            "export KEY='it'\\''s $HOME `x` \"q\"\nline two'\nexport AGENT_RELAY_NAME='Al'\n"
        );
        // A shell reads the value back exactly.
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{script}printf %s \"$KEY\""))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "it's $HOME `x` \"q\"\nline two"
        );
    }

    /// Output read off the channel while the snapshot was taken is kept when it came after
    /// the capture (the rest of a directive the capture ends inside: dropping it lost the
    /// directive, issue 23.17), dropped when it came before (the capture shows it).
    #[test]
    fn output_after_the_capture_is_kept_and_output_before_it_is_dropped() {
        let out = |s: &str| Note::Output(s.as_bytes().to_vec());
        let read = vec![
            (3, out("@relay:Carol split ")),
            (4, Note::Gone),
            (5, out("across the capture")),
            (6, out("\r\n")),
            (7, Note::Gone),
        ];
        let (later, gone) = after_capture(read, 5);
        assert!(gone, "the old client's end, before the capture");
        let later: Vec<String> = later.iter().map(|n| format!("{n:?}")).collect();
        assert_eq!(
            later,
            [
                format!("{:?}", out("across the capture")),
                format!("{:?}", out("\r\n")),
                format!("{:?}", Note::Gone),
            ]
        );
        let (later, gone) = after_capture(Vec::new(), 9);
        assert!(later.is_empty() && !gone);
    }

    /// A pane that prints between the commands reading it is read again: the snapshot's rows
    /// and cursor come from one state of the pane (the cursor was read before output the
    /// captures showed, and the parser's copy then lost a directive under it).
    #[test]
    fn a_pane_that_prints_while_it_is_read_is_read_again() {
        let fake = std::sync::Mutex::new(FakePane {
            history: "got: one\n@relay:B two\n".into(),
            // Before the captures, then after them (it printed: one more row, cursor lower),
            // then the same again: that reading is used.
            states: ["0 0 0 24 80", "0 2 0 24 80", "0 2 0 24 80"]
                .map(String::from)
                .into(),
            ..FakePane::default()
        });
        let snap = with_fake(&fake, |pane| pane.snapshot(None)).unwrap();
        let states = fake
            .lock()
            .unwrap()
            .commands
            .iter()
            .filter(|c| c.contains("#{pane_height}"))
            .count();
        assert_eq!(states, 3, "read, changed, read again, unchanged");
        // The cursor is the one read with the rows: below the directive.
        assert!(
            snap.unseen.ends_with(b"\x1b[3;1H"),
            "{:?}",
            String::from_utf8_lossy(&snap.unseen)
        );
    }

    #[test]
    fn a_pane_in_copy_mode_is_taken_out_of_it_before_the_text_is_pasted() {
        let fake = std::sync::Mutex::new(FakePane {
            in_mode: true,
            ..FakePane::default()
        });
        with_fake(&fake, |pane| {
            pane.type_text("relay-fake", "Relay message from Bob [abc]: it's $HOME; ok")
        })
        .unwrap();
        let commands = fake.lock().unwrap().commands.clone();
        let verbs: Vec<&str> = commands
            .iter()
            .map(|c| c.split(' ').next().unwrap())
            .collect();
        assert_eq!(
            verbs,
            ["display-message", "send-keys", "set-buffer", "paste-buffer"],
            "{commands:#?}"
        );
        assert!(commands[1].ends_with("-X cancel"), "{commands:#?}");
        // Out of copy mode, the next text is pasted at once.
        with_fake(&fake, |pane| pane.type_text("relay-fake", "again")).unwrap();
        let commands = fake.lock().unwrap().commands.clone();
        assert!(
            !commands[4..].iter().any(|c| c.contains("-X cancel")),
            "{commands:#?}"
        );
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }
}
