//! Trust at the edges (issue 11): what a hostile or careless client can do to the daemon, and
//! what an ACK promises. Each test here failed on the code before its fix.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// Frames in `bytes` (complete ones only; a cut last frame is left out).
fn frames(bytes: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() >= at + 4 {
        let n = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if bytes.len() < at + 4 + n {
            break;
        }
        out.push(serde_json::from_slice(&bytes[at + 4..at + 4 + n]).unwrap());
        at += 4 + n;
    }
    out
}

/// The NACK or fatal ERROR the daemon answers a frame with.
fn answer(c: &mut Raw) -> Value {
    loop {
        let f = c.read().expect("an answer before the connection closed");
        if f["type"] == "PING" {
            continue;
        }
        return f;
    }
}

#[test]
fn message_ids_outside_the_safe_alphabet_are_refused_and_nothing_is_stored() {
    let (relay, [mut bob, mut alice]) = Relay::with_agents(&[], ["Bob", "Alice"]);
    let hostile = [
        "q\rtouch FILE\r#",
        "\u{1b}]0;pwned\u{7}",
        "\u{9d}0;title\u{9c}",
        "x\u{9b}31m",
        "a b",
        "$(touch x)",
        "../etc",
    ];
    let long = "x".repeat(129);
    for id in hostile.iter().copied().chain([long.as_str()]) {
        alice.send_as_id(id, "Bob", "hi");
        let nack = alice.expect("NACK");
        assert_eq!(nack["payload"]["code"], "invalid", "{id:?}: {nack}");
        // The echo of a hostile id carries no control character.
        let echoed = nack["payload"]["ack_id"].as_str().unwrap();
        assert!(!echoed.chars().any(char::is_control), "{echoed:?}");
    }
    // A safe id still goes through, and it is the only message Bob ever gets.
    let ok = alice.send_as_id("01JB2K7Q-ok.1:x_y", "Bob", "fine");
    assert_eq!(alice.expect("ACK")["payload"]["ack_id"], ok);
    let d = bob.expect("DELIVER");
    assert_eq!(d["id"], ok);
    let history = ok_stdout(&relay.cli(&["history", "--json"]));
    let rows: Value = serde_json::from_str(&history).unwrap();
    let ids: Vec<&str> = field_strs(&rows, "id");
    assert_eq!(ids, [ok.as_str()], "{history}");
}

/// A recipient that said `ack: false` and stopped reading, then went away, gets everything
/// the daemon had not written to its socket when it comes back: before the fix, DELIVERs
/// still queued inside the daemon counted as acknowledged and were lost (thousands here).
#[test]
fn an_ack_false_recipient_that_stops_reading_and_drops_loses_nothing() {
    const N: usize = 20_000;
    let relay = Relay::start_with(UNLIMITED);
    let mut bob = crate::support::connect_bob(&relay);
    // Bob reads nothing while everything is stored for him.
    let sent = crate::support::alice_sends_bob(&relay, N);
    // Bob stops reading for good: from here the daemon's writes to him fail (EPIPE), so what
    // is in his socket buffer now is exactly what was written to him.
    bob.stream.shutdown(Shutdown::Read).unwrap();
    bob.read_timeout(Duration::from_millis(200));
    let mut buffered = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match bob.stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buffered.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("{e}"),
        }
    }
    drop(bob);
    let mut got: std::collections::HashMap<String, usize> = frames(&buffered)
        .into_iter()
        .filter(|f| f["type"] == "DELIVER")
        .map(|f| (f["id"].as_str().unwrap().to_owned(), 1))
        .collect();
    let before = got.len();
    // Bob comes back (the daemon may still be closing his first connection: retry the name).
    let mut bob = crate::support::connect_bob(&relay);
    read_deliveries_until(&mut bob, &mut got, N, before);
    let got: std::collections::HashSet<String> = got.into_keys().collect();
    assert_eq!(got, sent);
    println!("ack:false recipient: {before} read before dropping, all {N} after reconnecting");
}

fn read_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// mimalloc's "peak commit" (memory the daemon's allocator committed at its highest), in MiB,
/// from the statistics it prints at exit with `MIMALLOC_SHOW_STATS=1`.
fn peak_commit_mib(log: &str) -> f64 {
    let rest = log
        .rsplit_once("peak commit:")
        .unwrap_or_else(|| panic!("no mimalloc statistics in the daemon log:\n{log}"))
        .1;
    let mut words = rest.split_whitespace();
    let n: f64 = words.next().unwrap().parse().unwrap();
    match words.next().unwrap().trim_end_matches(',') {
        "GiB" => n * 1024.0,
        "MiB" => n,
        "KiB" => n / 1024.0,
        u => panic!("unit {u:?}"),
    }
}

/// A header that declares a 1 MiB frame, followed by one byte, must not cost 1 MiB: before
/// the fix the reader reserved the declared length at once (1,500 connections: the daemon's
/// allocator committed 1.5 GiB), and before HELLO such connections held places under the
/// connection limit for the 10 s handshake timeout while doing so.
#[test]
fn a_declared_frame_length_costs_memory_only_as_its_bytes_arrive() {
    const CONNS: usize = 1500;
    let mut relay = Relay::start_with_env(
        &["--max-connections", "2000"],
        &[("MIMALLOC_SHOW_STATS", "1")],
    );
    let pid = relay.child.as_ref().unwrap().id();
    let mut header = 1_000_000u32.to_be_bytes().to_vec();
    header.push(b'{');

    // After HELLO a large frame is allowed, but costs memory as it arrives.
    let mut conns: Vec<Raw> = (0..CONNS)
        .map(|i| relay.agent(&format!("big{i}")).0)
        .collect();
    let read_before = read_bytes(pid);
    for c in &mut conns {
        c.write_bytes(&header);
    }
    // The daemon has read what was sent (its read counter moved past it).
    wait_for(
        Duration::from_secs(60),
        "the daemon reads the headers",
        || read_bytes(pid) >= read_before + (CONNS * header.len()) as u64,
    );
    // Everybody else is still served.
    let (mut a, _) = relay.agent("Alice");
    a.send("big0", "still here");
    assert_eq!(a.expect("ACK")["payload"]["status"], "accepted");
    // Before HELLO a peer may declare no more than a handshake needs: refused at once, so
    // such connections neither cost memory nor hold places under the connection limit.
    for _ in 0..CONNS {
        let mut c = relay.connect();
        c.write_bytes(&header);
        let e = answer(&mut c);
        assert_eq!(e["payload"]["code"], "frame_too_large", "{e}");
        assert!(c.closed());
    }
    drop(conns);
    assert!(relay.stop().success());
    let peak = peak_commit_mib(&relay.log());
    assert!(
        peak < 256.0,
        "{CONNS} connections that each declared 1 MiB and sent 5 bytes: the daemon committed {peak:.1} MiB at its peak"
    );
    println!("{CONNS} half-declared 1 MiB frames: peak commit {peak:.1} MiB");
}

#[test]
fn the_relays_files_are_private_in_a_data_directory_others_can_read() {
    let dir = tempfile::Builder::new().prefix("ar").tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&data)
        .unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("r.sock");
    let run = |args: &[&str]| {
        Command::new(crate::support::BIN)
            .env("AGENT_RELAY_DATA_DIR", &data)
            .env("AGENT_RELAY_SOCKET", &socket)
            .env_remove("AGENT_RELAY_STORAGE_PATH")
            .env_remove("AGENT_RELAY_STORAGE_TYPE")
            .env("AGENT_RELAY_DASHBOARD_PORT", "0")
            .current_dir(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let up = run(&["up"]);
    let stderr = String::from_utf8_lossy(&up.stderr);
    assert!(up.status.success(), "{stderr}");
    assert!(
        stderr.contains("can be read by other users") && stderr.contains("chmod 700"),
        "up did not warn about the data directory: {stderr}"
    );
    // An agent connects (agents.json), a message is stored (database, WAL, shared memory).
    let mut bob = Raw::connect(&socket);
    bob.hello("Bob", json!({}));
    ok_stdout(&run(&["send", "--from", "Carol", "Bob", "secret body"]));
    bob.expect("DELIVER");
    let private = || {
        let mut seen = Vec::new();
        for entry in walk(&data) {
            let meta = std::fs::symlink_metadata(&entry).unwrap();
            if meta.is_file() {
                let mode = meta.permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{} is {mode:o}", entry.display());
                seen.push(entry.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        seen
    };
    let seen = private();
    for must in ["messages.sqlite", "messages.sqlite-wal", "agents.json"] {
        assert!(seen.iter().any(|s| s == must), "{must} not among {seen:?}");
    }
    ok_stdout(&run(&["down"]));
    // Files an older relay left readable are made private when the relay starts again (the
    // database before it is opened: SQLite gives a new WAL the database file's mode).
    for file in ["messages.sqlite", "agents.json", "daemon.log"] {
        std::fs::set_permissions(data.join(file), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let up = run(&["up"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    ok_stdout(&run(&["send", "--from", "Carol", "Bob", "second secret"]));
    let seen = private();
    assert!(
        seen.iter().any(|s| s == "messages.sqlite-wal"),
        "no WAL among {seen:?}"
    );
    ok_stdout(&run(&["down"]));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// fsync-family calls made by the daemon's store thread while `n` SENDs are sent one at a
/// time, each waiting for its ACK (strace attached to the running daemon).
fn store_syncs(extra: &[&str], n: usize) -> usize {
    let relay = Relay::start_with(extra);
    let pid = relay.child.as_ref().unwrap().id();
    let (mut bob, _) = relay.agent("Bob");
    let (mut alice, _) = relay.agent("Alice");
    // One message first, so the database and its WAL exist before strace looks.
    alice.send("Bob", "warm-up");
    alice.expect("ACK");
    bob.expect("DELIVER");
    let store_tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let t = t.unwrap().path();
            let comm = std::fs::read_to_string(t.join("comm")).ok()?;
            (comm.trim() == "relay-store")
                .then(|| t.file_name().unwrap().to_string_lossy().into_owned())
        })
        .next()
        .expect("the daemon has a relay-store thread");
    let out = relay.dir.path().join("strace.txt");
    let mut strace = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,sync_file_range",
            "-o",
        ])
        .arg(&out)
        .args(["-p", &pid.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace is installed (.ci/run installs it)");
    // Attached once the store thread has a tracer.
    let mut stderr = strace.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        if !s.trim().is_empty() {
            eprintln!("strace: {s}");
        }
    });
    wait_for(Duration::from_secs(20), "strace attaches", || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{store_tid}/status"))
            .unwrap()
            .lines()
            .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
    });
    for i in 0..n {
        alice.send("Bob", &format!("m{i}"));
        assert_eq!(alice.expect("ACK")["payload"]["status"], "accepted");
        bob.expect("DELIVER");
    }
    crate::support::signal_pid(strace.id() as i32, rustix::process::Signal::Int);
    strace.wait().unwrap();
    let trace = std::fs::read_to_string(&out).unwrap();
    trace
        .lines()
        .filter(|l| l.starts_with(&format!("{store_tid} ")) && !l.contains("resumed>"))
        .count()
}

/// An ACK means the message is on disk: the store fsyncs every commit before acknowledging
/// (SQLite `synchronous=FULL`). Before the fix the store thread never synced (NORMAL), so a
/// power cut could lose acknowledged messages. `--durability normal` is the documented
/// opt-out.
#[test]
fn every_acknowledged_commit_is_fsynced_unless_durability_normal_is_asked_for() {
    const N: usize = 20;
    let full = store_syncs(&[], N);
    assert!(
        full >= N,
        "the store thread synced {full} times for {N} acknowledged commits"
    );
    let normal = store_syncs(&["--durability", "normal"], N);
    assert_eq!(
        normal, 0,
        "with --durability normal the store thread synced {normal} times"
    );
    println!("store-thread syncs for {N} acked SENDs: full {full}, normal {normal}");
}

#[test]
fn the_protocol_is_as_strict_as_protocol_md_says() {
    let relay = Relay::start();
    // An unknown type before HELLO is not a v1 peer: fatal bad_state.
    let mut c = relay.connect();
    c.send_env("FROBNICATE", json!({}), json!({}));
    let e = answer(&mut c);
    assert_eq!(
        (
            e["type"].as_str(),
            e["payload"]["code"].as_str(),
            e["payload"]["fatal"].as_bool()
        ),
        (Some("ERROR"), Some("bad_state"), Some(true)),
        "{e}"
    );
    assert!(c.closed());
    // After HELLO an unknown type is still answered and ignored.
    let (mut c, _) = relay.agent("Ann");
    c.send_env("FROBNICATE", json!({}), json!({}));
    let e = answer(&mut c);
    assert_eq!(e["payload"]["code"], "unknown_type", "{e}");
    assert_eq!(e["payload"]["fatal"], false, "{e}");
    // Frames only the daemon sends: fatal bad_state.
    for (ty, payload) in [
        ("BUSY", json!({"retry_after_ms": 1})),
        ("RESULT", json!({"kind": "status"})),
    ] {
        let (mut c, _) = relay.agent(&format!("Sender{ty}"));
        c.send_env(ty, json!({}), payload);
        let e = answer(&mut c);
        assert_eq!(e["payload"]["code"], "bad_state", "{ty}: {e}");
        assert!(c.closed(), "{ty}");
    }
    // The relay's own name, in any case.
    for name in ["relay", "Relay", "RELAY", "rElAy"] {
        let mut c = relay.connect();
        c.send_env("HELLO", json!({}), json!({"agent": name}));
        let e = answer(&mut c);
        assert_eq!(e["payload"]["code"], "bad_name", "{name}: {e}");
    }
    // Nesting is limited in unknown fields as in known ones.
    let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    for (what, frame) in [
        (
            "unknown envelope field",
            format!(
                r#"{{"v":1,"type":"SEND","id":"d1","ts":1,"to":"Ann","x":{},"payload":{{"body":"b"}}}}"#,
                deep(500)
            ),
        ),
        (
            "unknown payload field",
            format!(
                r#"{{"v":1,"type":"SEND","id":"d2","ts":1,"to":"Ann","payload":{{"body":"b","y":{}}}}}"#,
                deep(500)
            ),
        ),
    ] {
        let (mut c, _) = relay.agent(&format!("Deep{}", what.len()));
        let mut bytes = (frame.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(frame.as_bytes());
        c.write_bytes(&bytes);
        let e = answer(&mut c);
        assert_eq!(e["payload"]["code"], "bad_frame", "{what}: {e}");
        assert!(c.closed(), "{what}");
    }
    // A payload that fits the SEND's frame but not a DELIVER's is refused, not stored.
    let (mut c, _) = relay.agent("Big");
    let filler = "x".repeat(1024 * 1024 - 600);
    c.send_env(
        "SEND",
        json!({"id": "big-1", "to": "Ann"}),
        json!({"body": "b", "data": {"f": filler}}),
    );
    let nack = c.expect("NACK");
    assert_eq!(nack["payload"]["code"], "too_large", "{nack}");
    // Nothing of these reached the store.
    let history = ok_stdout(&relay.cli(&["history", "--json"]));
    assert_eq!(serde_json::from_str::<Value>(&history).unwrap(), json!([]));
}

#[test]
fn the_dashboard_serves_only_its_own_host_and_same_origin_changes() {
    let relay = Relay::start();
    let (port, token) = dashboard(&relay);
    let authed = format!("/api/agents?token={token}");
    // The dashboard's own names.
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (status, body) = raw_get(port, &authed, &host);
        assert_eq!(status, 200, "{host}: {body}");
    }
    // A rebinding page uses its own name in Host: refused even with the token.
    for host in [
        format!("evil.example:{port}"),
        format!("127.0.0.1.evil.example:{port}"),
        "127.0.0.1".to_owned(),
    ] {
        let (status, _) = raw_get(port, &authed, &host);
        assert_eq!(status, 421, "{host}");
    }
    // A state change from another origin is refused with the token; from the dashboard's own
    // page or a tool (no Origin) it reaches the handler (404: there is no dead letter 999).
    let bearer = format!("Bearer {token}");
    let (status, _) = http(
        port,
        "POST",
        "/api/dead/999/retry",
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
    );
    assert_eq!(status, 403);
    let own = format!("http://127.0.0.1:{port}");
    for origin in [Some(own.as_str()), None] {
        let mut headers = vec![("Authorization", bearer.as_str())];
        if let Some(o) = origin {
            headers.push(("Origin", o));
        }
        let (status, body) = http(port, "POST", "/api/dead/999/retry", &headers);
        assert_ne!(status, 403, "{origin:?}: {body}");
        assert_ne!(status, 401, "{origin:?}: {body}");
    }
    let (status, _) = http_get(port, "/api/agents", &[]);
    assert_eq!(status, 401);
    // The token is in the 0600 URL file, never in the log.
    assert!(
        !relay.log().contains(&token),
        "the daemon log carries the dashboard token"
    );
}

/// A GET with a chosen Host header; (status, body).
fn raw_get(port: u16, target: &str, host: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Text a peer controls, with everything a terminal acts on: ESC sequences (OSC title, clear
/// screen), the C1 CSI and OSC that need no ESC, BEL, CR, NEL, DEL and a bidi override.
const HOSTILE: &str =
    "x\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\u{9d}0;title\u{9c}\r\u{85}\u{7f}\u{202e}y";

/// Panics when `bytes` hold a character a terminal would act on (anything but `\n` and `\t`
/// among C0, DEL, C1, bidi overrides, line separators).
fn assert_inert(what: &str, bytes: &[u8]) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    let acts = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            )
    };
    if let Some(c) = text.chars().find(|&c| acts(c)) {
        panic!("{what} wrote {c:?} raw:\n{text:?}");
    }
}

/// `agent-relay watch` with its stdout and stderr kept byte for byte.
struct RawWatch {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<(Vec<u8>, Vec<u8>)>>,
}

impl RawWatch {
    fn start(relay: &Relay, args: &[&str]) -> Self {
        let mut child = relay.spawn_cli(&[&["watch"], args].concat(), Stdio::piped());
        let out = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (o, e) = (out.clone(), out.clone());
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut chunk) {
                o.lock().unwrap().0.extend_from_slice(&chunk[..n]);
            }
        });
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                e.lock().unwrap().1.extend_from_slice(&chunk[..n]);
            }
        });
        Self { child, out }
    }

    fn shows(&self, marker: &str) -> bool {
        let out = self.out.lock().unwrap();
        String::from_utf8_lossy(&out.0).contains(marker)
    }

    /// Stops the watch; (stdout, stderr).
    fn stop(mut self) -> (Vec<u8>, Vec<u8>) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.out.lock().unwrap())
    }
}

/// Every command that prints relay-supplied text (ids, names, bodies, threads, reasons, the
/// agent's `cli`, attached data), in text and `--json`, writes no byte a terminal would act
/// on: text shows controls as `\u{..}`, JSON escapes them (and still parses to the exact
/// text). Before the fix `history --json` and `watch --json` wrote U+009B/U+009D raw, and
/// `read`, `agents` and ambiguity errors printed names, ids, data and `cli` raw.
#[test]
fn relay_supplied_text_reaches_no_terminal_raw_from_any_command() {
    let (relay, [mut probe, _sink]) =
        Relay::with_agents(&["--rate-override", "Flood=1"], ["Probe", "Sink"]);
    let watches = [
        RawWatch::start(&relay, &[]),
        RawWatch::start(&relay, &["--json"]),
    ];
    // Both watches are subscribed once each has shown a probe.
    wait_for(Duration::from_secs(20), "the watches show a probe", || {
        probe.send("Sink", "probe");
        assert_eq!(probe.expect("ACK")["type"], "ACK");
        watches.iter().all(|w| w.shows("probe"))
    });

    // An agent whose `cli` is hostile; a message whose every free-text field is.
    let mut bob = relay.connect();
    bob.hello("Bob", json!({"cli": HOSTILE}));
    let (mut alice, _) = relay.agent("Alice");
    let body = format!("{HOSTILE}\nline two");
    // A thread is printed to models and terminals: it gets the id rules, so a hostile one is
    // refused at the door (issue 23.4); the rest of the message's free text is stored.
    alice.send_env(
        "SEND",
        json!({"id": "hostile-0", "to": "Bob"}),
        json!({"body": body, "thread": HOSTILE}),
    );
    assert_eq!(alice.expect("NACK")["payload"]["code"], "invalid");
    alice.send_env(
        "SEND",
        json!({"id": "hostile-1", "to": "Bob"}),
        json!({"body": body, "in_reply_to": HOSTILE, "data": {"k": HOSTILE}}),
    );
    assert_eq!(alice.expect("ACK")["payload"]["status"], "accepted");
    // Bob reports it failed: a dead letter with that body.
    let d = bob.expect("DELIVER");
    bob.send_env(
        "ACK",
        json!({}),
        json!({"ack_id": "hostile-1", "seq": d["delivery"]["seq"], "state": "failed"}),
    );
    // A refused message (over Flood's rate limit): a dead letter and a `refused` event.
    let (mut flood, _) = relay.agent("Flood");
    flood.send_as_id("flood-1", "Bob", "ok");
    flood.expect("ACK");
    flood.send_as_id("flood-2", "Bob", HOSTILE);
    assert_eq!(flood.expect("NACK")["payload"]["code"], "rate_limited");
    // Ids a terminal would act on: the daemon refuses them (issue 11) or, if it stores them,
    // an ambiguous prefix must not print them raw.
    // (Carol, not Alice: Alice's inbox gets the relay's notice about her failed message.)
    let (mut carol, _) = relay.agent("Carol");
    let mut stored_hostile_ids = 0;
    for id in ["ambiguous-1\u{9b}31m", "ambiguous-1\u{9d}0;t\u{9c}"] {
        carol.send_as_id(id, "Sink", "b");
        let f = carol.read().unwrap();
        match f["type"].as_str() {
            Some("ACK") => stored_hostile_ids += 1,
            _ => assert_eq!(f["payload"]["code"], "invalid", "{f}"),
        }
    }
    carol.send("Bob", "endmark");
    carol.expect("ACK");
    wait_for(Duration::from_secs(20), "the watches show the end", || {
        watches.iter().all(|w| w.shows("endmark"))
    });

    let [text_watch, json_watch] = watches;
    let (out, err) = text_watch.stop();
    assert_inert("watch", &out);
    assert_inert("watch (stderr)", &err);
    let (out, err) = json_watch.stop();
    assert_inert("watch --json", &out);
    assert_inert("watch --json (stderr)", &err);
    // The JSON still carries the exact text.
    let events: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e["body"] == body.as_str()),
        "{events:?}"
    );

    let dlq: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["dlq", "--json"]))).unwrap();
    let dead: Vec<String> = dlq["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dlq_id"].to_string())
        .collect();
    assert_eq!(dead.len(), 2, "{dlq}");
    let mut commands: Vec<Vec<&str>> = vec![
        vec!["history"],
        vec!["history", "--text", "line"],
        vec!["read", "hostile-1"],
        vec!["trace", "hostile-1"],
        vec!["trace", "flood-2"],
        vec!["dlq"],
        vec!["dlq", "list", "--all"],
        vec!["agents"],
        vec!["status"],
    ];
    for n in &dead {
        commands.push(vec!["dlq", "show", n]);
    }
    for args in commands {
        for json in [false, true] {
            let mut args = args.clone();
            if json {
                args.push("--json");
            }
            let out = relay.cli(&args);
            let what = args.join(" ");
            assert!(out.status.success(), "{what}: {out:?}");
            assert_inert(&what, &out.stdout);
            assert_inert(&format!("{what} (stderr)"), &out.stderr);
            if json {
                serde_json::from_slice::<Value>(&out.stdout)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }
    // Text shows the controls; JSON keeps the text exactly.
    let read = ok_stdout(&relay.cli(&["read", "hostile-1"]));
    assert!(
        read.contains("\\u{9b}31m") && read.contains("line two"),
        "{read}"
    );
    let read: Value =
        serde_json::from_str(&ok_stdout(&relay.cli(&["read", "hostile-1", "--json"]))).unwrap();
    assert_eq!(read["body"], body.as_str());
    assert_eq!(read["in_reply_to"], HOSTILE);
    assert_eq!(read["data"]["k"], HOSTILE);
    let agents: Value =
        serde_json::from_str(&ok_stdout(&relay.cli(&["agents", "--json"]))).unwrap();
    assert!(
        agents
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["cli"] == HOSTILE),
        "{agents}"
    );
    // An error that quotes stored ids.
    println!("hostile ids stored by this daemon: {stored_hostile_ids} of 2");
    if stored_hostile_ids == 2 {
        let out = relay.cli(&["read", "ambiguous-1"]);
        assert_eq!(out.status.code(), Some(4), "{out:?}");
        assert_inert("read (ambiguous)", &out.stderr);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("\\u{9b}"),
            "{out:?}"
        );
    }
}
