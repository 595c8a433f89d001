//! Trust at the edges (issue 11): what a hostile or careless client can do to the daemon, and
//! what an ACK promises. Each test here failed on the code before its fix.

use std::io::{ErrorKind, Read};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Raw, Relay, UNLIMITED, ok_stdout, wait_for};

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
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    let (mut alice, _) = relay.agent("Alice");
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
        alice.send_env(
            "SEND",
            json!({"id": id, "to": "Bob"}),
            json!({"body": "hi"}),
        );
        let nack = alice.expect("NACK");
        assert_eq!(nack["payload"]["code"], "invalid", "{id:?}: {nack}");
        // The echo of a hostile id carries no control character.
        let echoed = nack["payload"]["ack_id"].as_str().unwrap();
        assert!(!echoed.chars().any(char::is_control), "{echoed:?}");
    }
    // A safe id still goes through, and it is the only message Bob ever gets.
    let ok = alice.send_env(
        "SEND",
        json!({"id": "01JB2K7Q-ok.1:x_y", "to": "Bob"}),
        json!({"body": "fine"}),
    );
    assert_eq!(alice.expect("ACK")["payload"]["ack_id"], ok);
    let d = bob.expect("DELIVER");
    assert_eq!(d["id"], ok);
    let history = ok_stdout(&relay.cli(&["history", "--json"]));
    let rows: Value = serde_json::from_str(&history).unwrap();
    let ids: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [ok.as_str()], "{history}");
}

/// A recipient that said `ack: false` and stopped reading, then went away, gets everything
/// the daemon had not written to its socket when it comes back: before the fix, DELIVERs
/// still queued inside the daemon counted as acknowledged and were lost (thousands here).
#[test]
fn an_ack_false_recipient_that_stops_reading_and_drops_loses_nothing() {
    const N: usize = 20_000;
    let relay = Relay::start_with(UNLIMITED);
    let mut bob = relay.connect();
    bob.hello("Bob", json!({"capabilities": {"ack": false}}));
    let (mut alice, _) = relay.agent("Alice");
    // Alice sends everything and waits until every SEND is stored (ACKed); Bob reads nothing.
    // Her ACKs are read on a thread while she sends, so her own connection never backs up.
    let mut reader = alice.reader();
    let acks = std::thread::spawn(move || {
        let mut acked = 0;
        while acked < N {
            let f = reader.read().expect("Alice's connection stays open");
            match f["type"].as_str() {
                Some("ACK") => acked += 1,
                Some("PING" | "BUSY") => {}
                _ => panic!("unexpected frame for Alice: {f}"),
            }
        }
    });
    let mut sent = std::collections::HashSet::new();
    for i in 0..N {
        let id = format!("m{i:06}");
        alice.send_env("SEND", json!({"id": id, "to": "Bob"}), json!({"body": "x"}));
        sent.insert(id);
    }
    acks.join().unwrap();
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
    let mut got: std::collections::HashSet<String> = frames(&buffered)
        .into_iter()
        .filter(|f| f["type"] == "DELIVER")
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect();
    let before = got.len();
    // Bob comes back (the daemon may still be closing his first connection: retry the name).
    let mut bob = loop {
        let mut c = relay.connect();
        c.send_env(
            "HELLO",
            json!({}),
            json!({"agent": "Bob", "cli": "test", "capabilities": {"ack": false}}),
        );
        let f = c.read().expect("an answer to HELLO");
        if f["type"] == "WELCOME" {
            break c;
        }
        assert_eq!(f["payload"]["code"], "name_in_use", "{f}");
    };
    let end = Instant::now() + Duration::from_secs(120);
    while got.len() < N {
        assert!(
            Instant::now() < end,
            "Bob got {} of {N} messages ({before} before he dropped); the rest were lost",
            got.len()
        );
        let f = bob.read().expect("Bob's second connection stays open");
        match f["type"].as_str() {
            Some("DELIVER") => {
                got.insert(f["id"].as_str().unwrap().to_owned());
            }
            Some("PING") => {
                bob.send_env("PONG", json!({}), json!({}));
            }
            _ => {}
        }
    }
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
