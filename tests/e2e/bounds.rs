//! Everything a door carries is bounded and has a deadline (issue 23, points 11–15): answers
//! larger than a frame arrive in parts, a request the relay never answers fails with a clear
//! error, the dashboard's port cannot take the daemon's descriptors, the people adapters read
//! remote answers up to a cap and never block one another.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Raw, Relay, ok_stdout};

/// Runs `cmd` to its end, killing it after `limit` (a hang fails the test instead of stopping
/// the suite). The limit only bounds a hang.
pub(crate) fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        stdout.read_to_end(&mut v).unwrap();
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        stderr.read_to_end(&mut v).unwrap();
        v
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "the command did not end within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// A body of `len` bytes, different for each `n`, with characters JSON escapes (quotes and
/// backslashes double): three of them are far over one frame as a `history` answer.
fn big_body(n: usize, len: usize) -> String {
    let mut s = format!("message {n} begins \"quoted\" \\ ");
    while s.len() < len - 16 {
        s.push_str("abc\"def\\ghi é ");
    }
    s.truncate(len - 16);
    s.push_str(&format!(" message {n} ends"));
    s
}

/// Three 500 KB messages: `history` (and `read`) answer with all of them, whole, although the
/// answer is over the 1 MiB frame limit. Before, the daemon could not encode the answer,
/// logged "could not encode outbound frame" and the CLI waited forever.
#[test]
fn a_history_answer_over_the_frame_limit_arrives_whole() {
    let relay = Relay::start();
    let (_bob, _) = relay.agent("Bob");
    let (mut alice, _) = relay.agent("Alice");
    let bodies: Vec<String> = (0..3).map(|n| big_body(n, 500_000)).collect();
    for b in &bodies {
        alice.send("Bob", b);
        // An ACK, not a NACK: stored.
        alice.expect("ACK");
    }
    let mut cmd = relay.command();
    cmd.args(["history", "--json"]);
    let out = output_within(cmd, Duration::from_secs(60));
    let v: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
    let got: Vec<&str> = v
        .as_array()
        .unwrap_or_else(|| v["messages"].as_array().unwrap())
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    for b in &bodies {
        assert!(got.contains(&b.as_str()), "a 500 KB body is missing or cut");
    }
    assert!(
        !relay.log().contains("could not encode outbound frame"),
        "an answer was dropped"
    );
}

/// A relay that takes the HELLO and then never answers anything: `agent-relay history` ends
/// with an error that says the relay did not answer and what to look at, instead of waiting
/// forever.
#[test]
fn a_query_the_relay_never_answers_fails_with_a_clear_error() {
    // A real relay's WELCOME, to play a relay that answers the handshake only.
    let relay = Relay::start();
    let mut probe = relay.connect();
    let welcome = probe.hello("Probe", json!({"role": "client"}));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mute.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let mute = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut conn = Raw { stream };
        let hello = conn.read().unwrap();
        assert_eq!(hello["type"], "HELLO");
        conn.write_json(&welcome);
        // Read the QUERY (and anything else) without ever answering, until the client goes.
        while conn.read().is_some() {}
    });
    let mut cmd = relay.command();
    cmd.env("AGENT_RELAY_SOCKET", &socket)
        .env("AGENT_RELAY_REQUEST_TIMEOUT", "2")
        .args(["history"]);
    let out = output_within(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("did not answer the query within 2 s") && err.contains("agent-relay status"),
        "{err}"
    );
    mute.join().unwrap();
}

/// The soft and hard open-files limits of process `pid`, from `/proc`.
fn open_files_limit(pid: u32) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut f = line["Max open files".len()..].split_whitespace();
    (f.next().unwrap().to_owned(), f.next().unwrap().to_owned())
}

/// Anyone on the machine can open connections to the dashboard's port. 1,100 that each sent
/// one byte must not take the descriptors the relay's own socket needs: the daemon raises its
/// open-files limit at start (started here with the common soft limit of 1,024), and even
/// where it cannot (the limit is then put back to 1,024, hard too) the dashboard holds at most
/// its cap and closes the rest at once; `status`, `send`, a new agent and a delivery all work
/// meanwhile; and every idle connection is closed by the header deadline.
#[test]
fn idle_connections_to_the_dashboard_port_do_not_lock_the_owner_out() {
    use rustix::process::{Pid, Resource, Rlimit, getrlimit, prlimit, setrlimit};
    let mine = getrlimit(Resource::Nofile);
    let hard = mine.maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(1024),
            maximum: hard,
        },
    )
    .unwrap();
    let relay = Relay::start();
    // This test holds 1,100 connections itself.
    setrlimit(Resource::Nofile, mine).unwrap();
    let pid = relay.child.as_ref().unwrap().id();
    let (soft, hard_now) = open_files_limit(pid);
    assert_eq!(
        soft, hard_now,
        "the daemon did not raise its soft open-files limit"
    );
    prlimit(
        Pid::from_raw(pid as i32),
        Resource::Nofile,
        Rlimit {
            current: Some(1024),
            maximum: Some(1024),
        },
    )
    .unwrap();
    let (mut bob, _) = relay.agent("Bob");
    let (port, _) = crate::support::dashboard(&relay);
    let mut idle = Vec::new();
    for _ in 0..1100 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
            // One byte of a request that never ends.
            if s.write_all(b"G").is_ok() {
                idle.push(s);
            }
        }
    }
    // The owner is not locked out: the CLI, a new agent, a send and its delivery.
    let mut status = relay.command();
    status.args(["status", "--json"]);
    ok_stdout(&output_within(status, Duration::from_secs(60)));
    let (_carol, welcome) = relay.agent("Carol");
    assert_eq!(welcome["type"], "WELCOME");
    let mut send = relay.command();
    send.args(["send", "Bob", "still reachable"]);
    ok_stdout(&output_within(send, Duration::from_secs(60)));
    let got = bob.expect("DELIVER");
    assert_eq!(got["payload"]["body"], "still reachable");
    // Every idle connection is closed by the relay: those over the cap at once, the others
    // when their header deadline passes.
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut b = [0u8; 256];
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                // An answer (408) before the close is fine; keep reading to the end.
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("an idle dashboard connection stayed open: {e}"),
            }
        }
    }
    assert!(
        !relay.log().contains("Too many open files"),
        "the daemon ran out of descriptors"
    );
}
