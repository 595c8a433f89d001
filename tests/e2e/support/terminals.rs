//! Terminals for tests: the test's private tmux server ([`Tmux`]), agents started in it
//! under a background relaying process, and a person's terminal ([`person_terminal`]).

use super::*;

/// The test's tmux server, killed (with every session on it) when dropped; the relaying
/// processes notice and end.
pub(crate) struct Tmux<'a> {
    pub(crate) dir: &'a Path,
}

impl Tmux<'_> {
    pub(crate) fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .env("TMUX_TMPDIR", self.dir)
            .env_remove("TMUX")
            .args(args)
            .output()
            .expect("tmux is installed (.ci/run installs it)")
    }

    pub(crate) fn pane(&self, session: &str) -> String {
        let out = self.run(&[
            "capture-pane",
            "-p",
            "-J",
            "-S",
            "-",
            "-t",
            &format!("={session}:"),
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub(crate) fn has(&self, session: &str) -> bool {
        self.run(&["has-session", "-t", &format!("={session}")])
            .status
            .success()
    }
}

impl Relay {
    /// The test's tmux server for this relay's agents (its sockets in the relay's directory).
    pub(crate) fn tmux(&self) -> Tmux<'_> {
        Tmux {
            dir: self.dir.path(),
        }
    }
}

impl Drop for Tmux<'_> {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// `agent-relay <args>` in the relay's directory, with the test's tmux server.
pub(crate) fn wrap_cmd(relay: &Relay, args: &[&str]) -> Command {
    let mut c = relay.command();
    c.current_dir(relay.dir.path())
        .env("TMUX_TMPDIR", relay.dir.path())
        .env("AGENT_RELAY_LOG", "relay_wrap=debug,info")
        // As on a CI machine: the variable reaches the tmux server's global environment too,
        // and the agents must not see it (`relay_wrap::NOT_INHERITED`).
        .env("CI", "true")
        .env_remove("TMUX")
        .args(args)
        .stdin(Stdio::null());
    c
}

/// Starts `script` as agent `name` in tmux, detached; returns its session name.
pub(crate) fn start_tmux_agent(relay: &Relay, name: &str, script: &str, extra: &[&str]) -> String {
    start_tmux_agent_with(relay, name, script, extra, &[])
}

/// [`start_tmux_agent`] with more environment for the wrapper (and the agent).
pub(crate) fn start_tmux_agent_with(
    relay: &Relay,
    name: &str,
    script: &str,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> String {
    let file = relay.dir.path().join(format!("{name}.sh"));
    std::fs::write(&file, script).unwrap();
    let options = [TMUX_DETACHED, extra].concat();
    let out = wrap_cmd(
        relay,
        &wrap_args(name, &options, &["sh", file.to_str().unwrap()]),
    )
    .envs(env.iter().copied())
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("attach with: agent-relay attach {name}")),
        "{err}"
    );
    session_of(relay, name)
}

pub(crate) fn session_of(relay: &Relay, name: &str) -> String {
    let base = relay
        .dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_',
            "_",
        );
    format!("{base}-{name}")
}

/// Waits until agent `name`'s wrapper has message `id` due and holds it for a person's
/// half-written line (their keys under the PTY, the input line under tmux), then checks it
/// did not type it: a wrapper that typed over a person would type at that moment instead.
pub(crate) fn held_for_a_person(relay: &Relay, tmux: &Tmux<'_>, name: &str, id: &str) {
    let log = relay.data_dir().join(format!("team/{name}/wrap.log"));
    let queued = format!("a message waits to be typed id={id}");
    wait_or_dump(
        relay,
        tmux,
        &format!("{name}'s wrapper holds {id} for the person"),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.find(&queued).is_some_and(|at| {
                text[at..].contains("a message is due; held while a person has a half-written line")
                    || text[at..].contains("not ready for a message why=InputNotEmpty")
                    || text[at..].contains("typing a message")
            })
        },
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains(&format!("typing a message id={id}")),
        "typed over a person:\n{text}"
    );
}

/// Waits until `cond`; on timeout fails with what every session shows and every wrapper
/// logged, and the relay's history.
pub(crate) fn wait_or_dump(
    relay: &Relay,
    tmux: &Tmux<'_>,
    what: &str,
    mut cond: impl FnMut() -> bool,
) {
    let deadline = relay_protocol::now_instant() + Duration::from_secs(30);
    while !cond() {
        if relay_protocol::now_instant() > deadline {
            panic!(
                "timed out waiting until {what}\nhistory: {:?}\n{}",
                history(relay),
                dump(relay, tmux)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What every session shows and every wrapper logged: for a failure's message.
pub(crate) fn dump(relay: &Relay, tmux: &Tmux<'_>) -> String {
    let mut dump = String::new();
    let sessions = tmux.run(&["list-sessions", "-F", "#{session_name}"]);
    for s in String::from_utf8_lossy(&sessions.stdout).lines() {
        let info = tmux.run(&[
            "display-message",
            "-p",
            "-t",
            &format!("={s}:"),
            "dead=#{pane_dead} status=#{pane_dead_status} cmd=#{pane_current_command}",
        ]);
        dump.push_str(&format!(
            "--- pane {s} ({}):\n{}\n",
            String::from_utf8_lossy(&info.stdout).trim(),
            tmux.pane(s)
        ));
    }
    if let Ok(dirs) = std::fs::read_dir(relay.data_dir().join("team")) {
        for d in dirs.flatten() {
            let log = std::fs::read_to_string(d.path().join("wrap.log")).unwrap_or_default();
            dump.push_str(&format!("--- {}/wrap.log:\n{log}\n", d.path().display()));
        }
    }
    dump
}

/// Runs a tmux command on a private server (`-L server`, sockets under `dir`).
pub(crate) fn tmux_in(dir: &std::path::Path, server: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("tmux")
        .env("TMUX_TMPDIR", dir)
        .args(["-L", server])
        .args(args)
        .output()
        .expect("tmux is installed (.ci/run installs it)")
}

/// A person's terminal: a private tmux server, killed with whatever runs in it when this is
/// dropped, so a failing test leaves nothing running.
#[must_use = "the terminal's tmux server is killed when this is dropped"]
pub(crate) struct PersonTerminal {
    dir: std::path::PathBuf,
    server: String,
}

impl PersonTerminal {
    /// A tmux command on the terminal's server (keys the person types, say).
    pub(crate) fn tmux(&self, args: &[&str]) -> std::process::Output {
        tmux_in(&self.dir, &self.server, args)
    }

    /// What the person's terminal shows now (wrapped lines joined).
    pub(crate) fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-J"]).stdout).into_owned()
    }

    /// Waits (at most `limit`) until the terminal shows `text`; returns what it shows then.
    pub(crate) fn wait_shows(&self, limit: Duration, text: &str) -> String {
        let deadline = relay_protocol::now_instant() + limit;
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                relay_protocol::now_instant() < deadline,
                "the person's terminal does not show {text:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PersonTerminal {
    fn drop(&mut self) {
        let _ = tmux_in(&self.dir, &self.server, &["kill-server"]);
    }
}

/// [`person_terminal`] in the relay's directory, outside the test's tmux (as a person in the
/// project's folder): `commands`' first line runs with `TMUX` unset.
pub(crate) fn person_terminal_here(relay: &Relay, server: &str, commands: &str) -> PersonTerminal {
    let dir = relay.dir.path().display();
    person_terminal(
        relay,
        server,
        &format!("cd '{dir}' && unset TMUX && {commands}"),
    )
}

/// Starts a private tmux server `server` whose one window runs `commands` (shell lines) with
/// this relay's environment: a person's terminal. `{bin}` in `commands` is the binary.
pub(crate) fn person_terminal(relay: &Relay, server: &str, commands: &str) -> PersonTerminal {
    let dir = relay.dir.path();
    let script = dir.join(format!("{server}.sh"));
    let body = format!(
        // A person's usual terminal, whatever the machine running the tests sets: colour on.
        "#!/bin/sh\nunset NO_COLOR\nexport AGENT_RELAY_DATA_DIR='{}' AGENT_RELAY_SOCKET='{}' AGENT_RELAY_BACKEND=pty\n{}\nsleep 60\n",
        relay.data_dir().display(),
        relay.socket.display(),
        commands.replace("{bin}", &format!("'{BIN}'")),
    );
    std::fs::write(&script, body).unwrap();
    let out = tmux_in(
        dir,
        server,
        &[
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "30",
            "sh",
            script.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PersonTerminal {
        dir: dir.to_path_buf(),
        server: server.to_owned(),
    }
}
