//! Bad input that the other test files do not cover: a symlinked or foreign-owned socket
//! directory, hostile names wherever a name goes, escape sequences in the safety commands'
//! output, and malformed configuration. (Oversize frames and bodies, hostile HELLO names,
//! another user's client and escape sequences in `read`/`history` are in `protocol.rs` and
//! `cli.rs`.)

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// Runs `up --foreground` with its socket at `socket` and returns its output once it exits;
/// a daemon that starts instead is killed and the test fails.
fn up_with_socket(socket: &Path, data: &Path, extra: &[&str]) -> Output {
    let mut child = spawn_up(socket, data, extra);
    let deadline = relay_protocol::now_instant() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if relay_protocol::now_instant() > deadline {
            let _ = child.kill();
            panic!("the daemon started on {socket:?} instead of refusing it");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `up --foreground EXTRA` with its socket at `socket` and its data in `data`, output piped.
fn spawn_up(socket: &Path, data: &Path, extra: &[&str]) -> std::process::Child {
    Command::new(BIN)
        .args(["up", "--foreground"])
        .args(extra)
        .env("AGENT_RELAY_SOCKET", socket)
        .env("AGENT_RELAY_DATA_DIR", data)
        .env_remove("AGENT_RELAY_STORAGE_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `up` with its socket at `socket` and its data in `data` fails; what it said.
fn refused_up(socket: &Path, data: &Path, extra: &[&str]) -> String {
    let out = up_with_socket(socket, data, extra);
    assert!(!out.status.success());
    stderr(&out)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_symlinked_socket_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // Someone plants a symlink where our socket directory would go, pointing at a directory
    // they can read.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let link = tmp.path().join("relay-dir");
    std::os::unix::fs::symlink(&theirs, &link).unwrap();
    let err = refused_up(&link.join("r.sock"), &tmp.path().join("data"), &[]);
    assert!(
        err.contains("not a plain directory") && err.contains("remove it"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(&theirs).unwrap().next().is_none(),
        "nothing was created through the symlink"
    );
    // A socket path that is itself a symlink to a plain file is not followed either.
    let dir = tmp.path().join("mine");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = tmp.path().join("victim");
    std::fs::write(&target, "keep me").unwrap();
    std::os::unix::fs::symlink(&target, dir.join("r.sock")).unwrap();
    let err = refused_up(&dir.join("r.sock"), &tmp.path().join("data"), &[]);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
}

#[test]
fn a_socket_directory_owned_by_another_user_is_refused() {
    crate::support::require_root("give a directory to another user");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("foreign");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // nobody:nogroup
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let err = refused_up(&dir.join("r.sock"), &tmp.path().join("data"), &[]);
    assert!(
        err.contains("owned by another user") && err.contains("AGENT_RELAY_SOCKET"),
        "{err}"
    );
    assert!(!dir.join("r.sock").exists());
}

/// Starts `up --foreground` with its socket at `socket`, waits until it accepts connections,
/// stops it (SIGTERM) and returns its output; a daemon that refuses to start fails the test.
fn up_and_stop(socket: &Path, data: &Path) -> Output {
    let mut child = spawn_up(socket, data, &["--no-dashboard"]);
    let deadline = relay_protocol::now_instant() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the daemon on {socket:?} did not start ({status}): {}",
                stderr(&out)
            );
        }
        assert!(
            relay_protocol::now_instant() < deadline,
            "the daemon on {socket:?} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    crate::support::signal_pid(child.id() as i32, rustix::process::Signal::Term);
    child.wait_with_output().unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The socket may go in a directory that exists (a project, a home, `/tmp`): the daemon uses
/// it as it is and never changes its mode (it once made a socket's parent 0700 — `/tmp`
/// included). A directory others can write to without the sticky bit is refused, unchanged.
#[test]
fn an_existing_socket_directory_is_used_as_it_is_and_never_changed() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, m) in [
        ("project", 0o755),
        ("shared-tmp", 0o1777),
        ("private", 0o700),
    ] {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m)).unwrap();
        let out = up_and_stop(
            &dir.join("r.sock"),
            &tmp.path().join(format!("data-{name}")),
        );
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(mode(&dir), m, "{name}: the directory's mode is kept");
    }
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = refused_up(&open.join("r.sock"), &tmp.path().join("data-open"), &[]);
    assert!(
        err.contains("can be written by other users") && err.contains("AGENT_RELAY_SOCKET"),
        "{err}"
    );
    assert_eq!(mode(&open), 0o777, "refused, and left as it was");
    assert!(!open.join("r.sock").exists());
    // A missing directory is created private.
    let fresh = tmp.path().join("new/run");
    let out = up_and_stop(&fresh.join("r.sock"), &tmp.path().join("data-new"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&fresh), 0o700);
}

/// In a shared directory another user can be first at the socket's path. Their process never
/// gets a byte from a client (which checks who listens before writing), and our daemon
/// refuses to start there instead of reporting theirs as ours.
#[test]
fn another_users_process_on_the_socket_path_gets_nothing() {
    crate::support::require_root("act as another user");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A /tmp of our own: world-writable, sticky.
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let socket = shared.join("r.sock");
    let received = shared.join("received");
    // Their listener, as nobody: it records how many bytes each connection sent.
    let listener = r#"
import os, socket, sys
with open(sys.argv[3], "w") as f:
    f.write(str(os.getpid()))
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
while True:
    c, _ = s.accept()
    c.settimeout(1)
    n = 0
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
            n += len(d)
    except OSError:
        pass
    with open(sys.argv[2], "a") as f:
        f.write(f"{n} bytes" + chr(10))
    c.close()
"#;
    let mut theirs = Command::new("runuser")
        .args(["-u", "nobody", "--", "/usr/bin/python3", "-c", listener])
        .arg(&socket)
        .arg(&received)
        .arg(shared.join("pid"))
        .current_dir("/")
        .spawn()
        .unwrap();
    let guard = KillOnDrop(shared.join("pid"));
    crate::support::wait_for(Duration::from_secs(20), "their listener is up", || {
        assert!(
            theirs.try_wait().unwrap().is_none(),
            "their listener exited"
        );
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    crate::support::wait_for(Duration::from_secs(20), "the probe is counted", || {
        std::fs::read_to_string(&received).is_ok_and(|r| r.lines().count() == 1)
    });
    let data = tmp.path().join("data");
    for args in [
        &["send", "Bob", "the secret plan"][..],
        &["status"][..],
        &["watch"][..],
    ] {
        let out = Command::new(BIN)
            .args(args)
            .env("AGENT_RELAY_SOCKET", &socket)
            .env("AGENT_RELAY_DATA_DIR", &data)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("run by another user (uid 65534)") && err.contains("nothing was sent"),
            "{args:?}: {err}"
        );
    }
    let out = up_with_socket(&socket, &data, &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("another user's socket (uid 65534)"),
        "{}",
        stderr(&out)
    );
    // Every connection after the probe: connected, and sent nothing.
    crate::support::wait_for(
        Duration::from_secs(20),
        "every connection is counted",
        || std::fs::read_to_string(&received).is_ok_and(|r| r.lines().count() >= 4),
    );
    let counts = std::fs::read_to_string(&received).unwrap();
    assert!(
        counts.lines().all(|n| n == "0 bytes"),
        "bytes reached their process: {counts}"
    );
    drop(guard);
    let _ = theirs.wait();
}

/// Kills the process whose pid is in a file (written by the process itself) when dropped,
/// pass or fail: a process of another user outlives the `runuser` that started it.
struct KillOnDrop(std::path::PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::Kill);
        }
    }
}

#[test]
fn malformed_configuration_is_refused_with_a_message_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("s").join("r.sock");
    for (args, names) in [
        (&["--max-hops", "ten"][..], "--max-hops"),
        (&["--rate-limit=-5"][..], "--rate-limit"),
        (&["--rate-override", "bot"][..], "NAME=N"),
        (&["--rate-override", "b/ot=5"][..], "b/ot"),
        (&["--inbox-ttl", "1y"][..], "--inbox-ttl"),
        (&["--storage", "floppy"][..], "--storage"),
    ] {
        let out = up_with_socket(&socket, &tmp.path().join("data"), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(names), "{args:?}: {}", stderr(&out));
    }
    assert!(!socket.exists());
    // rules: a pattern with a path separator, an unknown action.
    let relay = Relay::start();
    let out = relay.cli(&[
        "rules", "add", "--from", "../x", "--to", "b", "--action", "deny",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("'/'"), "{}", stderr(&out));
    let out = relay.cli(&[
        "rules", "add", "--from", "a", "--to", "b", "--action", "maybe",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!relay.data_dir().join("rules.json").exists());
}

#[test]
fn hostile_names_are_refused_wherever_a_name_goes() {
    let relay = Relay::start();
    let (_bob, _) = relay.agent("Bob");
    for bad in ["../../etc/passwd", "a\u{1b}[2Jb", "x y", "", "-leading"] {
        let out = relay.cli(&["send", bad, "hi"]);
        assert!(!out.status.success(), "to {bad:?}");
        let out = relay.cli(&["send", "Bob", "hi", "--from", bad]);
        assert!(!out.status.success(), "from {bad:?}");
        assert!(
            !stderr(&out).contains('\u{1b}'),
            "the error echoes no escape: {bad:?}"
        );
    }
    // On the wire: a bad recipient is a NACK, not a crash; the reserved notice sender name.
    let (mut c, _) = relay.agent("Alice");
    c.send_env("SEND", json!({"to": "Bob/../x"}), json!({"body": "x"}));
    assert_eq!(c.expect("NACK")["payload"]["code"], "invalid");
    let mut r = relay.connect();
    r.send_env("HELLO", json!({}), json!({"agent": "relay"}));
    let e = r.expect("ERROR");
    assert_eq!(e["payload"]["code"], "bad_name");
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("reserved")
    );
    // Nothing of it was stored.
    let h: serde_json::Value =
        serde_json::from_str(&ok_stdout(&relay.cli(&["history", "--json"]))).unwrap();
    assert!(h.as_array().unwrap().is_empty(), "{h}");
}

#[test]
fn escape_sequences_never_reach_the_terminal_from_trace_or_the_dead_letter_queue() {
    let (relay, [_bob, mut alice]) = Relay::with_agents(&["--rate-limit", "1"], ["Bob", "Alice"]);
    let hostile = "x\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m";
    alice.send("Bob", "first");
    assert_eq!(alice.expect("ACK")["type"], "ACK");
    let id = alice.send("Bob", hostile);
    assert_eq!(alice.expect("NACK")["payload"]["code"], "rate_limited");
    for args in [
        vec!["dlq"],
        vec!["dlq", "show", "1"],
        vec!["trace", id.as_str()],
        vec!["status"],
    ] {
        let out = ok_stdout(&relay.cli(&args));
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{9b}'),
            "{args:?} printed a control character: {out:?}"
        );
    }
    let shown = ok_stdout(&relay.cli(&["dlq", "show", "1"]));
    assert!(shown.contains("\\u{1b}"), "{shown}");
    // JSON keeps the exact text, escaped by JSON.
    let v: serde_json::Value =
        serde_json::from_str(&ok_stdout(&relay.cli(&["dlq", "show", "1", "--json"]))).unwrap();
    assert_eq!(v["dead_letter"]["body"], hostile);
}

/// Connections are bounded (`up --max-connections`): past the limit a new one gets an ERROR
/// saying to try again later and is closed; those already open are served as before, and a
/// place frees when one of them leaves.
#[test]
fn past_the_connection_limit_a_new_connection_is_told_to_try_again_later() {
    let relay = Relay::start_with(&["--max-connections", "2"]);
    // `Relay::start`'s readiness probe holds a place until the daemon has seen it close.
    let (mut ann, _) = hello_once_a_place_is_free(&relay, "Ann");
    let (ben, _) = hello_once_a_place_is_free(&relay, "Ben");
    let mut third = relay.connect();
    let e = third.expect("ERROR");
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("too many connections; try again later"),
        "{e}"
    );
    assert!(third.read().is_none(), "then closed");
    // Ann is still served.
    ann.send("Ben", "still here");
    assert_eq!(ann.expect("ACK")["payload"]["status"], "accepted");
    // Ben leaves: his place goes to the next one (once the daemon has seen him go).
    drop(ben);
    let (_, welcome) = hello_once_a_place_is_free(&relay, "Cid");
    assert!(welcome["payload"]["session_id"].is_string(), "{welcome}");
}

/// HELLO as `name`, again while the daemon answers "too many connections" (a place frees once
/// it has seen a connection close), for up to 20 s; the connection and its WELCOME.
fn hello_once_a_place_is_free(relay: &Relay, name: &str) -> (Raw, Value) {
    let deadline = relay_protocol::now_instant() + Duration::from_secs(20);
    loop {
        let mut c = relay.connect();
        // A refused connection may be closed before HELLO is written: only the answer counts.
        let hello = serde_json::to_vec(&json!({"v": 1, "type": "HELLO", "id": "h", "ts": 1,
            "payload": {"agent": name, "cli": "test"}}))
        .unwrap();
        let mut frame = u32::try_from(hello.len()).unwrap().to_be_bytes().to_vec();
        frame.extend_from_slice(&hello);
        let written = std::io::Write::write_all(&mut c.stream, &frame);
        match c.read() {
            Some(f) if f["type"] == "WELCOME" => return (c, f),
            other => assert!(
                relay_protocol::now_instant() < deadline,
                "no place for {name}: {other:?} (HELLO written: {written:?})"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM the moment the socket accepts (what `down` right after `up` does) stops the daemon
/// gracefully, every time: its handlers are installed before the socket is bound. (They used
/// to be installed a moment after, and a TERM in between ended the daemon by the signal's
/// default action: once in a full run of the suite.)
#[test]
fn a_stop_right_after_the_socket_accepts_is_graceful() {
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..25 {
        let out = up_and_stop(
            &tmp.path().join(format!("r{round}.sock")),
            &tmp.path().join(format!("data-{round}")),
        );
        assert!(
            out.status.success(),
            "round {round}: {} {}",
            out.status,
            stderr(&out)
        );
        assert!(stderr(&out).contains("SIGTERM received"), "round {round}");
    }
}
