//! `agent-relay parse`: the wrapper's parser, run by hand on recorded terminal output.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::{BIN, ok_stdout};

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
    let run = |args: &[&str]| {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        ok_stdout(&child.wait_with_output().unwrap())
    };
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
