//! A wrapped shell never runs a relayed message: real bash, dash and zsh under the real
//! wrapper (PTY backend), sent bodies that would run commands if typed as they are.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Relay, ok_stdout, signal_pid, wait_for};
use crate::wrap::wait_online;

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
        let sent: Value =
            serde_json::from_str(&ok_stdout(&relay.cli(&["send", name, &body, "--json"]))).unwrap();
        let id = sent["id"].as_str().unwrap().to_owned();
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
            let v: Value = serde_json::from_slice(&relay.cli(&["read", &id, "--json"]).stdout)
                .unwrap_or_default();
            v["deliveries"][0]["status"] == "verified"
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
