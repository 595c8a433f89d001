//! A newcomer's first hour (issue 12): mistakes are caught before anything starts.

use std::process::Stdio;

use crate::support::BIN;

/// A word that is neither a subcommand nor a program (`agent-relay completions --help` before
/// completions existed, `agent-relay statsu`) used to be taken for an agent CLI: it started a
/// relay for the directory, announced a generated agent name, then failed to spawn the word.
/// Now it is a usage error (exit 2) that starts nothing and suggests the nearest subcommand.
#[test]
fn a_mistyped_command_starts_nothing_and_suggests_the_nearest() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .current_dir(tmp.path())
            .env("AGENT_RELAY_DATA_DIR", &data)
            .env("AGENT_RELAY_SOCKET", tmp.path().join("r.sock"))
            .env("AGENT_RELAY_DASHBOARD_PORT", "0")
            .env("AGENT_RELAY_BACKEND", "pty")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&["statsu"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean `agent-relay status`?"), "{err}");
    assert!(err.contains("nothing was started"), "{err}");
    let out = run(&["no-such-agent-cli-xyz", "--help"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("neither an agent-relay command nor a program on PATH"),
        "{err}"
    );
    // Nothing started: no daemon left a socket, a pid file or a data directory behind.
    assert!(!tmp.path().join("r.sock").exists());
    assert!(!data.join("daemon.pid").exists(), "a daemon was started");
}
