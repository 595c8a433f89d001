//! The tmux backend: the agent runs in its own tmux session, which a person can attach to
//! and leave at will while relaying goes on.
//!
//! - Output is streamed, never polled: `pipe-pane` appends everything the pane prints to
//!   `<team dir>/pane.log` (the `cat` it starts belongs to tmux, so nothing is missed while
//!   no wrapper runs), and a thread follows the file with inotify.
//! - The agent runs under a one-line shell that writes its exit status to `<team dir>/exit`;
//!   the session ends with the agent, and the relaying process (woken by the file, or by a
//!   pidfd on the pane's process) says goodbye to the relay.
//! - The screen is read with one `capture-pane` only when a message is about to be typed
//!   or checked, and text goes in with `load-buffer` + `paste-buffer -p` (tmux sends it as
//!   a bracketed paste when the application asked for that), Enter with `send-keys`.
//!
//! tmux is driven through its command line (`std::process::Command`), one process per
//! command group: the `tmux_interface` crate is a builder over the very same calls and
//! cannot pipe a buffer through stdin, which `load-buffer -` needs.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use relay_parse::ScreenText;
use tokio::sync::mpsc;

use crate::WrapError;

mod control;

/// What the pane-log follower reports.
#[derive(Debug)]
pub(crate) enum Tail {
    /// Bytes the pane printed; the log's offset after them.
    Output(Vec<u8>, u64),
    /// The agent exited (its status when tmux knew it), or the session is gone.
    Exited(Option<i32>),
}

fn tmux_err(what: &str, e: impl std::fmt::Display) -> WrapError {
    WrapError::Pty(format!("tmux {what}: {e}"))
}

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
    let mut child = cmd.spawn().map_err(|e| {
        tmux_err(
            args.first().copied().unwrap_or(""),
            format!("{e} (is tmux installed? Debian/Ubuntu: apt install tmux)"),
        )
    })?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes).map_err(|e| tmux_err("stdin", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| tmux_err(args.first().copied().unwrap_or(""), e))?;
    if !out.status.success() {
        return Err(tmux_err(
            args.first().copied().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).trim(),
        ));
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
    /// The agent's directory of wrapper files (`pane.log`, `exit`).
    pub team_dir: &'a Path,
}

/// Starts the agent in a new detached session, with its output piped to `pane.log` and its
/// exit status kept in `exit`, in one tmux command group so that not a byte of the agent's
/// first output is missed.
///
/// # Errors
/// tmux is missing or refuses (a session of that name exists, say).
pub fn create(s: &NewSession<'_>) -> Result<(), WrapError> {
    std::fs::create_dir_all(s.team_dir).map_err(|e| tmux_err("team directory", e))?;
    for p in [s.team_dir.to_string_lossy()] {
        // The paths go into commands tmux parses and formats; refuse what would be read
        // as syntax there instead of escaping through two languages.
        if p.contains(['"', '\\', '\'', '#', '$', '`', '\n']) {
            return Err(WrapError::Pty(format!(
                "the data directory {p:?} contains a character tmux commands cannot carry \
                 (\" \\ # $ ` or a newline); set AGENT_RELAY_DATA_DIR to a plainer path"
            )));
        }
    }
    let log = s.team_dir.join("pane.log");
    let exit = s.team_dir.join("exit");
    // A new session starts a new log and checkpoint: offsets in them refer to this session.
    for stale in [&log, &exit, &s.team_dir.join("checkpoint")] {
        let _ = std::fs::remove_file(stale);
    }
    std::fs::File::create(&log).map_err(|e| tmux_err("pane log", e))?;
    // Every command names the session's window (`=name:`): an exact match, never a prefix.
    let pane = format!("={}:", s.name);
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
    let shell = format!(
        r#"e="$1"; x="$2"; shift 2; . "$e"; rm -f "$e"; unset {}; "$@"; s=$?; printf '%s\n' "$s" > "$x.tmp" && mv "$x.tmp" "$x"; exit "$s""#,
        crate::NOT_INHERITED.join(" ")
    );
    args.extend(
        ["--", "sh", "-c", &shell, "agent-relay"]
            .iter()
            .map(|a| (*a).to_owned()),
    );
    args.push(env_file.to_string_lossy().into_owned());
    args.push(exit.to_string_lossy().into_owned());
    args.extend(s.command.iter().cloned());
    args.extend(
        [
            ";",
            "pipe-pane",
            "-O",
            "-t",
            &pane,
            &format!("exec cat >> {}", sh_quote(&log.to_string_lossy())),
        ]
        .iter()
        .map(|a| (*a).to_owned()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Err(e) = tmux(&args, None) {
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
        .map_err(|e| tmux_err("environment file", e))?;
    // One left by a session that never started.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(tmux_err(
                "environment file",
                format!("{}: {e}", path.display()),
            ));
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| tmux_err("environment file", format!("{}: {e}", path.display())))?;
    file.write_all(&env_script(std::env::vars_os(), extra))
        .map_err(|e| tmux_err("environment file", format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// Makes sure the pane's output still goes to `pane.log` (a tmux server restored from a
/// snapshot, or a pipe someone closed). Only when no pipe is open: `pipe-pane` always closes
/// the pane's current pipe first (even with `-o`, which then opens none), and a gap between
/// two pipes would lose output.
///
/// # Errors
/// tmux refuses.
pub fn ensure_pipe(name: &str, team_dir: &Path) -> Result<(), WrapError> {
    let pane = format!("={name}:");
    let open = tmux(
        &["display-message", "-p", "-t", &pane, "#{pane_pipe}"],
        None,
    )?;
    if open.trim() == "1" {
        return Ok(());
    }
    let log = team_dir.join("pane.log");
    tmux(
        &[
            "pipe-pane",
            "-O",
            "-t",
            &pane,
            &format!("exec cat >> {}", sh_quote(&log.to_string_lossy())),
        ],
        None,
    )?;
    Ok(())
}

/// Ends session `name`.
pub fn kill(name: &str) {
    let _ = tmux(&["kill-session", "-t", &format!("={name}")], None);
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
/// client (see [`control`]): started on first use, started again when it ended while the
/// session lives on (killed, or the wrapper's pipe to it broke).
#[derive(Clone)]
pub(crate) struct Pane {
    session: String,
    target: String,
    buffer: String,
    control: std::sync::Arc<std::sync::Mutex<Option<control::Control>>>,
}

impl std::fmt::Debug for Pane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pane")
            .field("target", &self.target)
            .finish()
    }
}

impl Pane {
    pub(crate) fn new(session: &str) -> Self {
        Self {
            session: session.to_owned(),
            target: control::quote(&format!("={session}:")),
            buffer: control::quote(&format!("relay-{session}")),
            control: std::sync::Arc::default(),
        }
    }

    /// Runs one command line through the control client; its output as text.
    fn run(&self, line: &str) -> Result<String, WrapError> {
        let mut guard = self
            .control
            .lock()
            .map_err(|_| tmux_err("control client", "poisoned"))?;
        // One more try with a new client when the old one is found gone: a command that
        // fails for another reason (tmux refuses it) is not run twice.
        for attempt in 0..2 {
            let fresh = guard.as_ref().is_none_or(|c| !c.alive());
            if fresh {
                if attempt > 0 || guard.is_some() {
                    tracing::info!(session = %self.session, "the tmux control client ended; attaching a new one");
                }
                *guard = Some(control::Control::attach(&self.session)?);
            }
            let Some(client) = guard.as_mut() else {
                break;
            };
            match client.run(line) {
                Ok(out) => return Ok(String::from_utf8_lossy(&out).into_owned()),
                Err(e) if client.alive() => return Err(e),
                Err(e) if attempt == 0 && exists(&self.session) => {
                    tracing::info!(error = %e, "the tmux control client ended mid-command; trying once more");
                }
                Err(e) => return Err(e),
            }
        }
        Err(tmux_err("control client", "cannot attach"))
    }

    /// What the pane shows, with the cursor; and whether it is in copy mode.
    pub(crate) fn screen(&self) -> Result<(ScreenText, bool), WrapError> {
        let text = self.run(&format!("capture-pane -p -t {}", self.target))?;
        let last = self.run(&format!(
            "display-message -p -t {} \"#{{cursor_y}} #{{cursor_x}} #{{pane_in_mode}}\"",
            self.target
        ))?;
        let text = text.trim_end_matches('\n');
        let mut it = last
            .trim()
            .split(' ')
            .map(|n| n.parse::<usize>().unwrap_or(0));
        let (row, col, mode) = (
            it.next().unwrap_or(0),
            it.next().unwrap_or(0),
            it.next().unwrap_or(0),
        );
        Ok((ScreenText::from_text(text, row, col), mode != 0))
    }

    /// Everything in the pane's history and screen, as text (for finding a message typed by
    /// a wrapper that stopped before recording its outcome).
    pub(crate) fn history(&self) -> Result<String, WrapError> {
        self.run(&format!("capture-pane -p -J -S - -t {}", self.target))
    }

    /// Types `text` (no Enter), leaving copy mode first: one buffer set and one paste,
    /// bracketed when the application asked for bracketed paste.
    pub(crate) fn type_text(&self, text: &str, in_mode: bool) -> Result<(), WrapError> {
        if in_mode {
            self.run(&format!("send-keys -t {} -X cancel", self.target))?;
        }
        // Two lines: tmux answers each command of a `;` list with its own block.
        self.run(&format!(
            "set-buffer -b {} {}",
            self.buffer,
            control::quote(text)
        ))?;
        self.run(&format!(
            "paste-buffer -p -d -r -b {} -t {}",
            self.buffer, self.target
        ))?;
        Ok(())
    }

    /// When a person last pressed a key in (or attached to) the pane's session, in whole
    /// seconds since the epoch: tmux's `session_activity`, which keys typed through an
    /// attached client move and the wrapper's own `send-keys`, pastes and resizes do not.
    pub(crate) fn person_activity(&self) -> Result<u64, WrapError> {
        let out = self.run(&format!(
            "display-message -p -t {} \"#{{session_activity}}\"",
            self.target
        ))?;
        out.trim()
            .parse()
            .map_err(|_| tmux_err("display-message", format!("session_activity is {out:?}")))
    }

    /// The process the pane runs (the agent's CLI, or what starts it).
    pub(crate) fn pid(&self) -> Result<u32, WrapError> {
        let out = self.run(&format!(
            "display-message -p -t {} \"#{{pane_pid}}\"",
            self.target
        ))?;
        out.trim()
            .parse()
            .map_err(|_| tmux_err("display-message", format!("pane_pid is {out:?}")))
    }

    /// Presses Enter.
    pub(crate) fn enter(&self) -> Result<(), WrapError> {
        self.run(&format!("send-keys -t {} Enter", self.target))?;
        Ok(())
    }
}

/// Follows `<team_dir>/pane.log` from `offset`, and `<team_dir>/exit`, on a thread woken by
/// inotify: no timer, no wake-up while the agent prints nothing.
///
/// # Errors
/// inotify or the log cannot be opened.
pub(crate) fn follow(
    session: String,
    team_dir: PathBuf,
    offset: u64,
) -> Result<mpsc::Receiver<Tail>, WrapError> {
    use rustix::fs::inotify;
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).map_err(|e| tmux_err("inotify", e))?;
    // Watch the directory: the log is appended to, the exit file is renamed in.
    inotify::add_watch(
        &fd,
        &team_dir,
        inotify::WatchFlags::MODIFY
            | inotify::WatchFlags::CLOSE_WRITE
            | inotify::WatchFlags::MOVED_TO,
    )
    .map_err(|e| tmux_err("inotify watch", e))?;
    let log_path = team_dir.join("pane.log");
    let mut log = std::fs::File::open(&log_path).map_err(|e| tmux_err("pane log", e))?;
    log.seek(SeekFrom::Start(offset))
        .map_err(|e| tmux_err("pane log", e))?;
    let (tx, rx) = mpsc::channel(64);
    watch_exit(&session, &team_dir, tx.clone())?;
    std::thread::Builder::new()
        .name("relay-tmux-tail".into())
        .spawn(move || {
            let mut pos = offset;
            let mut buf = vec![0u8; 64 * 1024];
            let mut events = vec![std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut reader = inotify::Reader::new(&fd, &mut events);
            loop {
                // Everything appended so far.
                loop {
                    match log.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            pos += n as u64;
                            if tx
                                .blocking_send(Tail::Output(buf[..n].to_vec(), pos))
                                .is_err()
                            {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the pane log");
                            let _ = tx.blocking_send(Tail::Exited(None));
                            return;
                        }
                    }
                }
                if let Ok(text) = std::fs::read_to_string(team_dir.join("exit")) {
                    let _ = tx.blocking_send(Tail::Exited(text.trim().parse().ok()));
                    return;
                }
                // Block until something changes in the directory.
                match reader.next() {
                    Ok(ev) => {
                        let closed = ev.events().contains(inotify::ReadFlags::CLOSE_WRITE)
                            && ev.file_name().is_some_and(|n| n.to_bytes() == b"pane.log");
                        // The pipe's writer went away: the pane (or the server) is gone,
                        // or someone closed the pipe, which is opened again.
                        if closed && exists(&session) {
                            if let Err(e) = ensure_pipe(&session, &team_dir) {
                                tracing::warn!(error = %e, "cannot reopen the pane's pipe");
                            }
                        } else if closed {
                            // Read what is left, then report.
                            let mut rest = Vec::new();
                            if log.read_to_end(&mut rest).is_ok() && !rest.is_empty() {
                                pos += rest.len() as u64;
                                let _ = tx.blocking_send(Tail::Output(rest, pos));
                            }
                            let code = std::fs::read_to_string(team_dir.join("exit"))
                                .ok()
                                .and_then(|t| t.trim().parse().ok());
                            let _ = tx.blocking_send(Tail::Exited(code));
                            return;
                        }
                    }
                    Err(e) if e == rustix::io::Errno::INTR => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "inotify failed");
                        let _ = tx.blocking_send(Tail::Exited(None));
                        return;
                    }
                }
            }
        })
        .map_err(|e| tmux_err("thread", e))?;
    Ok(rx)
}

/// Reports the agent's exit through `tx` once the pane's process ends, even if the `exit`
/// file never comes (the session killed from outside): a thread waits on a pidfd of the
/// pane's process (no polling), then gives the file a moment to arrive.
fn watch_exit(session: &str, team_dir: &Path, tx: mpsc::Sender<Tail>) -> Result<(), WrapError> {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::process::{Pid, PidfdFlags, pidfd_open};
    let pane = format!("={session}:");
    let info = tmux(
        &[
            "display-message",
            "-p",
            "-t",
            &pane,
            "#{pane_pid} #{pane_dead}",
        ],
        None,
    )?;
    let mut it = info.split_whitespace();
    let pid = it
        .next()
        .and_then(|p| p.parse::<i32>().ok())
        .and_then(Pid::from_raw);
    let already_dead = it.next() == Some("1");
    let fd = match pid {
        Some(pid) if !already_dead => pidfd_open(pid, PidfdFlags::empty()).ok(),
        _ => None,
    };
    let exit_file = team_dir.join("exit");
    std::thread::Builder::new()
        .name("relay-tmux-exit".into())
        .spawn(move || {
            if let Some(fd) = fd {
                loop {
                    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                    match poll(&mut fds, -1) {
                        Ok(_) => break,
                        Err(e) if e == rustix::io::Errno::INTR => {}
                        Err(_) => return,
                    }
                }
            } else if !already_dead {
                // No pidfd (an old kernel): the exit file and the pipe are all there is.
                return;
            }
            // The status, from the exit file, if it comes within a second (the shell writes
            // it just before it ends).
            for _ in 0..20 {
                if let Ok(text) = std::fs::read_to_string(&exit_file) {
                    let _ = tx.blocking_send(Tail::Exited(text.trim().parse().ok()));
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = tx.blocking_send(Tail::Exited(None));
        })
        .map_err(|e| tmux_err("thread", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }
}
