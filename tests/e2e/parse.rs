//! `agent-relay parse`: the wrapper's parser, run by hand on recorded terminal output.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/parse/tests/fixtures");

fn expected(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}.expected.jsonl")).unwrap()
}

#[test]
fn parse_a_recorded_shell_session_from_a_file() {
    let out = Command::new(BIN)
        .args(["parse", "--json", "--profile", "shell"])
        .arg(format!("{FIXTURES}/shell-bash-session.bin"))
        .output()
        .unwrap();
    let got = ok_stdout(&out);
    assert_eq!(got, expected("shell-bash-session"));
    assert!(got.lines().count() >= 3, "{got}");
}

#[test]
fn parse_a_recorded_python_repl_from_stdin_and_print_it_readably() {
    let bytes = std::fs::read(format!("{FIXTURES}/generic-python-repl.bin")).unwrap();
    let run = |args: &[&str]| ok_stdout(&output_with_input(Command::new(BIN).args(args), &bytes));
    assert_eq!(run(&["parse", "--json"]), expected("generic-python-repl"));
    let readable = run(&["parse"]);
    let first: serde_json::Value =
        serde_json::from_str(expected("generic-python-repl").lines().next().unwrap()).unwrap();
    let line = readable.lines().next().unwrap();
    assert_eq!(
        line,
        format!(
            "to {} ({}): {}",
            first["to"].as_str().unwrap(),
            first["kind"].as_str().unwrap(),
            first["body"].as_str().unwrap()
        )
    );
}

#[test]
fn an_unknown_profile_lists_the_known_ones() {
    let out = Command::new(BIN)
        .args(["parse", "--profile", "vim"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for p in ["generic", "shell", "claude", "codex", "gemini"] {
        assert!(err.contains(p), "{err}");
    }
}

/// `parse --live` in `dir` with `AGENT_RELAY_PROFILE_DIR=profiles`: a directive scrolls out
/// of the 4-row live region (always reported at once), then a pause with `@relay:Bob draft`
/// and `compiling now` under it above the cursor; then the agent rewrites its draft in place
/// and shows a prompt.
/// Returns every line printed.
fn live_parse_of_a_rewritten_draft(dir: &std::path::Path, profiles: &std::path::Path) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(BIN)
        .args(["parse", "--live", "--rows", "4"])
        .current_dir(dir)
        .env("AGENT_RELAY_PROFILE_DIR", profiles)
        .env_remove("AGENT_RELAY_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin
        .write_all(b"@relay:Carol sync\r\n\r\n\r\n\r\n\r\n@relay:Bob draft\r\ncompiling now\r\n")
        .unwrap();
    // Carol's line left the live region, so it is printed when that read is handled: the
    // pause that follows it (settled or not) comes before the next write.
    let mut got = String::new();
    while !got.contains("Carol") {
        assert!(
            stdout.read_line(&mut got).unwrap() > 0,
            "ended early: {got}"
        );
    }
    stdin
        .write_all(b"\x1b[2A\r\x1b[2K@relay:Bob final\r\n\x1b[2K$ ")
        .unwrap();
    drop(stdin);
    std::io::Read::read_to_string(&mut stdout, &mut got).unwrap();
    assert!(child.wait().unwrap().success());
    got
}

/// Busy markers are written once, in the profile files: an override of `busy` changes when
/// the parser settles (here for `parse`, which loads the profile as the wrapper does).
#[test]
fn a_busy_marker_from_a_profile_override_keeps_the_parser_from_settling() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-overrides");
    std::fs::create_dir(&none).unwrap();
    // The built-in generic profile does not know this marker: the pause settles the draft.
    let plain = live_parse_of_a_rewritten_draft(dir.path(), &none);
    assert!(plain.contains("to Bob (message): draft"), "{plain}");

    // A person's override says `compiling now` means busy: the pause settles nothing, and
    // only the rewritten line is read.
    let profiles = dir.path().join("profiles");
    std::fs::create_dir(&profiles).unwrap();
    std::fs::write(
        profiles.join("generic.toml"),
        "busy = [\"Compiling now\"]\n",
    )
    .unwrap();
    let busy = live_parse_of_a_rewritten_draft(dir.path(), &profiles);
    assert_eq!(
        busy, "to Carol (message): sync\nto Bob (message): final\n",
        "the draft was read while the profile's busy marker showed"
    );

    // The same through the project's configuration file.
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".agent-relay")).unwrap();
    std::fs::write(
        project.join(".agent-relay/config.toml"),
        "[profiles.generic]\nbusy = [\"compiling now\"]\n",
    )
    .unwrap();
    let busy = live_parse_of_a_rewritten_draft(&project, &none);
    assert_eq!(busy, "to Carol (message): sync\nto Bob (message): final\n");
}
