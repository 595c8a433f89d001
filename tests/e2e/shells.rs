//! A wrapped shell never runs a relayed message: real bash, dash and zsh under the real
//! wrapper (PTY backend), sent bodies that would run commands if typed as they are.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;

/// The prompt every shell here shows: a command has finished when it is printed again.
const PROMPT: &str = "ready> ";

/// Bodies that run `touch pwnedN` in the wrapped shell's directory if typed as they are, each
/// with a tag to find its echo by, and text that must show on the screen after the tag.
fn hostile_bodies() -> Vec<(String, String)> {
    [
        ("x $(touch pwned1)", "x $(touch pwned1)"),
        ("x `touch pwned2`", "x `touch pwned2`"),
        ("x; touch pwned3", "x; touch pwned3"),
        (
            "x && touch pwned4 || touch pwned4",
            "x && touch pwned4 || touch pwned4",
        ),
        ("x | touch pwned5", "x | touch pwned5"),
        ("x\ntouch pwned6\n", "x touch pwned6"),
        ("x\rtouch pwned7\r", "x touch pwned7"),
        // Quotes of every kind, and backslashes (fish reads `\'` inside single quotes).
        (
            r#"it's '; touch pwned8; ' "; touch pwned8; " \'; touch pwned8; \"#,
            "; touch pwned8",
        ),
        // History expansion: the line before this one holds quotes, so `!!` expanded inside the
        // quoting would end it and run `touch pwned8`.
        ("!! '!!' !-2 \"!!\" !# !touch !:0", "!! "),
        ("x\u{1b}[201~; touch pwned9", "x[201~; touch pwned9"),
    ]
    .iter()
    .enumerate()
    .map(|(n, (body, shown))| (format!("tag-{n} {body}"), (*shown).to_owned()))
    .collect()
}

/// A wrapped agent whose output is collected as it comes.
struct Running {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Running {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wraps `args` (`-n NAME ... -- shell ...`) with `PS1` set, in the relay's directory.
fn wrap_shell(relay: &Relay, args: &[&str]) -> Running {
    let mut child = relay
        .command()
        .current_dir(relay.dir.path())
        .arg("wrap")
        .arg("--no-input")
        .args(args)
        .env("PS1", PROMPT)
        // No history written to the home directory; no start-up file read.
        .env("HISTFILE", relay.dir.path().join("history"))
        .env_remove("ENV")
        .env_remove("BASH_ENV")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    Running { child, out }
}

/// Files named `pwned*` in the shell's directory: commands that ran.
fn ran(relay: &Relay) -> Vec<String> {
    std::fs::read_dir(relay.dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("pwned"))
        .collect()
}

/// Sends each hostile body to `name`, a shell wrapped as `args`; after each, waits until the
/// shell has shown the text and printed its prompt again (so whatever the line ran has run),
/// then checks that nothing ran.
fn a_shell_runs_no_message(shell: &str, args: &[&str]) {
    let relay = Relay::start();
    let name = "Shell";
    let mut full = vec!["-n", name];
    full.extend_from_slice(args);
    let agent = wrap_shell(&relay, &full);
    wait_online(&relay, name);
    wait_for(Duration::from_secs(20), "the first prompt", || {
        agent.text().contains(PROMPT)
    });
    for (body, shown) in hostile_bodies() {
        let id = cli_send(&relay, name, &body);
        let tag = body.split(' ').next().unwrap().to_owned();
        wait_for(
            Duration::from_secs(30),
            &format!("{shell} shows {tag} and a prompt after it"),
            || {
                let text = agent.text();
                text.rfind(&tag)
                    .is_some_and(|at| text[at..].contains(PROMPT))
            },
        );
        let text = agent.text();
        assert!(
            ran(&relay).is_empty(),
            "{shell} ran {:?} from message {body:?}; the screen:\n{text}",
            ran(&relay)
        );
        // The person (or agent) at the shell still sees what was sent, after its tag.
        let echo = &text[text.find(&tag).unwrap()..];
        assert!(
            echo.contains(&shown),
            "{shell}: {shown:?} is not on the screen after {tag}:\n{text}"
        );
        // And the wrapper saw it submitted.
        wait_for(Duration::from_secs(20), "the delivery is verified", || {
            delivery_status(&relay, &id) == "verified"
        });
    }
    signal_pid(agent.child.id() as i32, rustix::process::Signal::Term);
}

/// bash picks the `shell` profile by its name; its `!` history expansion is on.
#[test]
fn a_wrapped_bash_runs_no_message() {
    a_shell_runs_no_message("bash", &["--", "bash", "--norc", "--noprofile", "-i"]);
}

/// dash, by its path; and dash started by a program (here `sh -c`), which the wrapper cannot
/// see, with the `shell` profile named.
#[test]
fn a_wrapped_dash_runs_no_message() {
    a_shell_runs_no_message("dash", &["--", "/usr/bin/dash", "-i"]);
    a_shell_runs_no_message(
        "dash under sh -c",
        &["--profile", "shell", "--", "sh", "-c", "exec dash -i"],
    );
}

/// zsh under another profile: a shell is recognised by its program, whatever the profile.
#[test]
fn a_wrapped_zsh_runs_no_message() {
    a_shell_runs_no_message("zsh", &["--profile", "generic", "--", "zsh", "-f", "-i"]);
}

/// Waits until `cond`; on timeout fails with `dump` of what is shown and logged.
fn wait_or(dump: &dyn Fn(&str) -> String, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = relay_protocol::now_instant() + Duration::from_secs(30);
    while !cond() {
        assert!(
            relay_protocol::now_instant() < deadline,
            "{}",
            dump(&format!("timed out waiting until {what}"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where a person edits a shell's line in the recall test: the person's own terminal (a
/// private tmux server running the PTY wrapper, whose keys the wrapper counts) or the agent's
/// tmux session (whose keys the wrapper never sees).
enum RecallPane<'a> {
    // The terminal is held for its drop, which kills its tmux server with the test.
    Pty(
        &'a std::path::Path,
        #[allow(dead_code)] crate::support::PersonTerminal,
    ),
    Tmux(&'a crate::support::Tmux<'a>, String),
}

impl RecallPane<'_> {
    fn run(&self, args: &[&str]) -> std::process::Output {
        match self {
            RecallPane::Pty(dir, _) => crate::support::tmux_in(dir, "relayrecall", args),
            RecallPane::Tmux(tmux, _) => tmux.run(args),
        }
    }

    fn target(&self) -> String {
        match self {
            RecallPane::Pty(..) => String::new(),
            RecallPane::Tmux(_, session) => format!("={session}:"),
        }
    }

    fn keys(&self, keys: &[&str]) {
        let target = self.target();
        let mut args = vec!["send-keys", "-t", &target];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }

    fn text(&self) -> String {
        let target = self.target();
        let out = self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", &target]);
        // `-J` keeps the spaces a line was drawn with after its text.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| format!("{}\n", l.trim_end()))
            .collect()
    }
}

/// A shell's line is judged from the screen, not from a count of a person's keys (issue
/// 23.16): under the shell profile a person recalls a command (Up) and erases four characters
/// (the key count is 0 again, the line still holds `echo hello-from-his`); a message sent then
/// waits, typed neither onto the line nor run with it, until the person clears the line, and
/// then goes in on its own. Before the fix it was typed onto the half-edited command and its
/// Enter ran it (`hello-from-his: Relay message ...`).
fn a_recalled_command(backend: crate::support::Backend) {
    let relay = Relay::start();
    let dir = relay.dir.path();
    // The test's tmux server (the agent's session, under tmux), killed with the test.
    let tmux = crate::support::Tmux { dir };
    let pane = match backend {
        crate::support::Backend::Pty => RecallPane::Pty(
            dir,
            crate::support::person_terminal(
                &relay,
                "relayrecall",
                "AGENT_RELAY_LOG=relay_wrap=debug {bin} wrap -n Sam -- bash --norc --noprofile -i",
            ),
        ),
        crate::support::Backend::Tmux => {
            let out = crate::support::wrap_cmd(
                &relay,
                &crate::support::wrap_args(
                    "Sam",
                    crate::support::TMUX_DETACHED,
                    &["bash", "--norc", "--noprofile", "-i"],
                ),
            )
            .output()
            .unwrap();
            assert!(out.status.success(), "{out:?}");
            RecallPane::Tmux(&tmux, crate::support::session_of(&relay, "Sam"))
        }
    };
    let log = relay.data_dir().join("team/Sam/wrap.log");
    let dump = |what: &str| {
        format!(
            "{what}\npane:\n{}\nlog:\n{}",
            pane.text().trim_end(),
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    };
    wait_online(&relay, "Sam");
    // `bash-5.2$ `, or `bash-5.2# ` as root.
    wait_or(&dump, "bash's prompt", || {
        pane.text().lines().any(|l| l.ends_with(['$', '#']))
    });
    // The person runs a command, then recalls it and erases its last four characters.
    pane.keys(&["-l", "echo hello-from-history"]);
    pane.keys(&["Enter"]);
    wait_or(&dump, "the command ran", || {
        pane.text().lines().any(|l| l == "hello-from-history")
    });
    pane.keys(&["Up"]);
    pane.keys(&["BSpace", "BSpace", "BSpace", "BSpace"]);
    wait_for(
        Duration::from_secs(30),
        "the half-edited command shows",
        || {
            pane.text()
                .lines()
                .any(|l| l.ends_with(" echo hello-from-his"))
        },
    );
    let id = cli_send(&relay, "Sam", "a note for the shell");
    // The wrapper has the message due and holds it (an event in its log, not a wait).
    crate::support::held_for_a_person(&relay, &tmux, "Sam", &id);
    let status = || delivery_status(&relay, &id);
    assert_eq!(status(), "queued", "{}", dump("not queued"));
    // The person clears the line: the message goes in on its own, and is verified.
    pane.keys(&["C-u"]);
    wait_or(&dump, "the message is verified", || status() == "verified");
    let shown = pane.text();
    assert!(
        shown.contains("a note for the shell")
            && !shown.lines().any(|l| l.starts_with("hello-from-his:")),
        "{}",
        dump("the recalled command ran with the message")
    );
    assert_eq!(
        shown.lines().filter(|l| *l == "hello-from-history").count(),
        1,
        "{}",
        dump("the recalled command ran")
    );
}

tests_of! {
    a_recalled_command {
        a_recalled_command_on_a_shells_line_in_a_pty_is_not_typed_onto(Backend::Pty);
        a_recalled_command_on_a_shells_line_in_a_tmux_pane_is_not_typed_onto(Backend::Tmux);
    }
}
