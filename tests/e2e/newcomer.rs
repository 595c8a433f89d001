//! A newcomer's first hour (issue 12): mistakes are caught before anything starts.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use crate::support::*;

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

/// `agent-relay completions bash` loads in a real bash and completes a subcommand from its
/// first letters (the function bash calls is the one it registers for `agent-relay`); the
/// man page renders.
#[test]
fn bash_completion_completes_a_subcommand_and_the_man_page_renders() {
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = r#"source <(agent-relay completions bash) || exit 9
f=$(complete -p agent-relay | sed -n 's/.* -F \([^ ]*\) agent-relay$/\1/p')
[ -n "$f" ] || exit 8
COMP_WORDS=(agent-relay sta); COMP_CWORD=1; COMP_LINE="agent-relay sta"; COMP_POINT=${#COMP_LINE}
"$f" agent-relay sta agent-relay
printf '%s\n' "${COMPREPLY[@]}""#;
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", script])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let words = String::from_utf8_lossy(&out.stdout);
    assert_eq!(words.lines().collect::<Vec<_>>(), ["status"], "{words}");
    for shell in ["zsh", "fish"] {
        let out = std::process::Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "{shell}: {out:?}"
        );
    }
    let man = std::process::Command::new(BIN).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(
        page.starts_with(".ie") && page.contains(".TH agent-relay 1"),
        "{page}"
    );
}

/// A test that needs root never passes without running (issue 11.12): run as another user,
/// each of the tests `scripts/test` lists as root-only fails and says what is missing (they
/// used to print "NOTE: not run" and pass).
#[test]
fn root_only_tests_fail_without_root_instead_of_passing() {
    crate::support::require_root("run a test binary as another user");
    let me = std::env::current_exe().unwrap();
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test"),
    )
    .unwrap();
    let listed: Vec<&str> = script
        .split("ROOT_TESTS=(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(listed.len(), 3, "{listed:?}");
    for test in listed {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&me)
            .args(["--exact", test])
            .env("HOME", "/tmp")
            .current_dir("/tmp")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{test} passed without root:\n{text}");
        assert!(text.contains("needs root"), "{test}:\n{text}");
        assert!(text.contains("1 failed"), "{test} did not run:\n{text}");
    }
}

/// `history` shows at most 1,000 rows; `history --all --json` exports everything, newest
/// first, each message once (here 5,000, five pages), in the one form every `--json` list
/// has: the JSON array `history --json` prints, the same text for the same messages (issue
/// 24.12). Before, `--all --json` printed JSON Lines.
#[test]
fn history_all_exports_every_message_as_the_array_history_json_prints() {
    let relay = crate::support::Relay::start_with(crate::support::UNLIMITED);
    let out = relay
        .command()
        .args([
            "bench", "-s", "2", "-r", "2", "-n", "5000", "--acks", "lean", "--json", "--target",
        ])
        .arg(&relay.socket)
        .output()
        .unwrap();
    crate::support::ok_stdout(&out);
    let all = crate::support::ok_stdout(&relay.cli(&["history", "--all", "--json"]));
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&all).unwrap_or_else(|e| panic!("not one JSON array ({e})"));
    assert_eq!(rows.len(), 5000);
    let pos: Vec<i64> = rows.iter().map(|r| r["pos"].as_i64().unwrap()).collect();
    assert!(
        pos.windows(2).all(|w| w[0] > w[1]),
        "newest first, each once"
    );
    let ids: std::collections::HashSet<&str> =
        rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 5000);
    // The newest 1,000 are what `history --json` shows, and where both hold the same
    // messages, both print the same text.
    let page: Vec<serde_json::Value> = serde_json::from_str(&crate::support::ok_stdout(
        &relay.cli(&["history", "--json", "--limit", "1000"]),
    ))
    .unwrap();
    assert_eq!(page[..], rows[..1000]);
    for body in ["first to export", "second to export"] {
        crate::support::ok_stdout(&relay.cli(&["send", "--from", "Carol", "Dan", body]));
    }
    let one = |extra: &[&str]| {
        let mut args = vec!["history", "--from", "Carol", "--json"];
        args.extend_from_slice(extra);
        crate::support::ok_stdout(&relay.cli(&args))
    };
    let (paged, whole) = (one(&[]), one(&["--all"]));
    assert_eq!(paged, whole);
    assert_eq!(
        serde_json::from_str::<Vec<serde_json::Value>>(&whole)
            .unwrap()
            .len(),
        2
    );
    // No match: an empty array, both ways.
    let none = |extra: &[&str]| {
        let mut args = vec!["history", "--from", "Nobody", "--json"];
        args.extend_from_slice(extra);
        crate::support::ok_stdout(&relay.cli(&args))
    };
    assert_eq!(none(&[]).trim(), "[]");
    assert_eq!(none(&["--all"]).trim(), "[]");
    // The paged default is unchanged, and --all does not take a limit.
    let page: serde_json::Value = serde_json::from_str(&crate::support::ok_stdout(
        &relay.cli(&["history", "--json"]),
    ))
    .unwrap();
    assert_eq!(page.as_array().unwrap().len(), 50);
    let both = relay.cli(&["history", "--all", "--limit", "5"]);
    assert_eq!(both.status.code(), Some(2), "{both:?}");
}

/// `doctor` on a healthy setup says ok to each check; on a broken one (no tmux on PATH, a data
/// directory others can read, an agent CLI of a version the profiles were not tested with) it
/// names each finding with what to do, and exits 1 for what is broken.
#[test]
fn doctor_names_each_problem_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |path: &str, data: &std::path::Path, claude: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(BIN);
        c.args(["doctor", "--json"])
            .env("PATH", path)
            .env("AGENT_RELAY_DATA_DIR", data)
            .env("AGENT_RELAY_SOCKET", tmp.path().join("r.sock"))
            .env_remove("AGENT_RELAY_CODEX")
            .env_remove("AGENT_RELAY_GEMINI");
        match claude {
            Some(p) => c.env("AGENT_RELAY_CLAUDE", p),
            None => c.env_remove("AGENT_RELAY_CLAUDE"),
        };
        let out = c.output().unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        (out.status.code(), v)
    };
    let level = |v: &serde_json::Value, check: &str| -> (String, String) {
        let f = v
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .unwrap_or_else(|| panic!("no {check} finding: {v}"));
        (
            f["level"].as_str().unwrap().to_owned(),
            f["fix"].as_str().unwrap_or("").to_owned(),
        )
    };
    // Healthy: tmux on PATH (as the test command installs it), a private data directory.
    let good = tmp.path().join("good");
    std::fs::create_dir(&good).unwrap();
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (code, v) = run("/usr/local/bin:/usr/bin:/bin", &good, None);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(level(&v, "tmux").0, "ok", "{v}");
    assert_eq!(level(&v, "data").0, "ok", "{v}");
    // Broken: PATH without tmux, a 0755 data directory, a claude that says 9.9.9.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let claude = bin.join("claude");
    std::fs::write(&claude, "#!/bin/sh\necho '9.9.9 (Claude Code)'\n").unwrap();
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, v) = run(bin.to_str().unwrap(), &open, Some(&claude));
    assert_eq!(code, Some(1), "{v}");
    let (l, fix) = level(&v, "tmux");
    assert_eq!(l, "fail", "{v}");
    assert!(fix.contains("install"), "{fix}");
    let (l, fix) = level(&v, "data");
    assert_eq!(l, "warn", "{v}");
    assert_eq!(fix, format!("chmod 700 {}", open.display()));
    let (l, fix) = level(&v, "claude");
    assert_eq!(l, "warn", "{v}");
    assert!(fix.contains("@anthropic-ai/claude-code@2.1."), "{fix}");
    assert!(v.to_string().contains("9.9.9"), "{v}");
}
