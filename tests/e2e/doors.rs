//! Issue 15, every door into an agent: directives that keep their lines, the MCP server, the
//! automatic teaching.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{BIN, Relay, ok_stdout};

/// What an agent prints: a directive followed by text at its own indentation, one with a
/// code block and a list under it, one in a later indented paragraph.
const CONTINUATIONS: &str = "@relay:Bob hi\nDone.\n\n@relay:Bob run this:\n    fn main() {\n        println!(\"x\");\n    }\n- then test\nThat is all.\n\n  @relay:Carol steps:\n  1. build\n    more detail\n  Thanks.\n";

fn expected_bodies() -> Vec<(String, String)> {
    [
        ("Bob", "hi"),
        (
            "Bob",
            "run this:\n    fn main() {\n        println!(\"x\");\n    }\n- then test",
        ),
        ("Carol", "steps:\n1. build\n  more detail"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect()
}

#[test]
fn continuation_lines_keep_their_breaks_and_a_line_at_the_directives_indent_ends_it() {
    let mut child = Command::new(BIN)
        .args(["parse", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(CONTINUATIONS.replace('\n', "\r\n").as_bytes())
        .unwrap();
    let out = ok_stdout(&child.wait_with_output().unwrap());
    let got: Vec<(String, String)> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["to"].as_str().unwrap().to_owned(),
                v["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(got, expected_bodies());
}

#[test]
fn a_wrapped_agents_directive_ends_at_a_line_at_its_own_indentation() {
    let relay = Relay::start();
    // Known recipients (a message for a name the relay never saw is refused).
    let _bob = relay.agent("Bob");
    let _carol = relay.agent("Carol");
    let script = format!("cat <<'EOF'\n{CONTINUATIONS}EOF\n");
    let out = relay.run_wrapped("Alice", "alice.sh", &script);
    assert!(out.status.success(), "{out:?}");
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    // Newest first.
    let mut got: Vec<(String, String)> = h
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["to"].as_str().unwrap().to_owned(),
                m["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.reverse();
    assert_eq!(got, expected_bodies());
}
