//! Claims (issue 25.7): an agent claims paths for a while; another agent's claim or edit of
//! them is told to both, once; claims outlive a daemon restart, expire, and are released when
//! their agent leaves; hostile paths are refused.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// Reads frames (acknowledging DELIVERs, answering PINGs) until a RESULT and `notices`
/// notices from the relay have come; returns them.
fn result_and_notices(c: &mut Raw, notices: usize) -> (Value, Vec<Value>) {
    let (mut result, mut told) = (None, Vec::new());
    while result.is_none() || told.len() < notices {
        let f = c.read().expect("connection closed");
        match f["type"].as_str() {
            Some("RESULT") => result = Some(f),
            Some("DELIVER") => {
                c.ack(&f);
                told.push(f);
            }
            Some("PING") => {
                c.send_env("PONG", json!({}), json!({}));
            }
            _ => {}
        }
    }
    (result.unwrap(), told)
}

/// The next DELIVER (acknowledged).
fn next_deliver(c: &mut Raw) -> Value {
    let d = c.expect("DELIVER");
    c.ack(&d);
    d
}

fn query(c: &mut Raw, payload: Value) -> String {
    c.send_env("QUERY", json!({}), payload)
}

fn claims_listed(relay: &Relay) -> Vec<(String, String)> {
    let out = ok_stdout(&relay.cli(&["claim", "--list", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    v["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["agent"].as_str().unwrap().to_owned(),
                c["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_claim_of_a_claimed_path_is_told_to_both_once() {
    let relay = Relay::start();
    let (mut alice, _) = relay.agent("Alice");
    let (mut bob, _) = relay.agent("Bob");
    query(&mut alice, json!({"what": "claim", "paths": ["src/"]}));
    let (r, _) = result_and_notices(&mut alice, 0);
    assert_eq!(r["payload"]["claims"][0]["path"], "src/", "{r}");
    assert_eq!(r["payload"]["collisions"], json!([]), "{r}");

    query(&mut bob, json!({"what": "claim", "paths": ["src/auth.rs"]}));
    let (r, told) = result_and_notices(&mut bob, 1);
    assert_eq!(r["payload"]["collisions"][0]["agent"], "Alice", "{r}");
    assert_eq!(r["payload"]["collisions"][0]["claimed"], "src/", "{r}");
    let body = told[0]["payload"]["body"].as_str().unwrap();
    assert_eq!(told[0]["from"], "relay");
    assert!(body.contains("src/auth.rs is claimed by Alice"), "{body}");
    let d = next_deliver(&mut alice);
    assert_eq!(d["from"], "relay");
    let body = d["payload"]["body"].as_str().unwrap();
    assert!(body.contains("Bob claimed src/auth.rs"), "{body}");

    // Claimed again (renewed): nobody is told a second time. A marker shows what comes next.
    query(&mut bob, json!({"what": "claim", "paths": ["src/auth.rs"]}));
    let (r, _) = result_and_notices(&mut bob, 0);
    assert_eq!(r["payload"]["collisions"][0]["agent"], "Alice", "{r}");
    ok_stdout(&relay.cli(&["send", "Alice", "marker-a"]));
    ok_stdout(&relay.cli(&["send", "Bob", "marker-b"]));
    assert_eq!(next_deliver(&mut alice)["payload"]["body"], "marker-a");
    assert_eq!(next_deliver(&mut bob)["payload"]["body"], "marker-b");

    // A person's claim from the command line names both holders.
    let out = ok_stdout(&relay.cli(&["claim", "--as", "carol", "src/auth.rs", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut who: Vec<&str> = v["collisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["agent"].as_str().unwrap())
        .collect();
    who.sort();
    assert_eq!(who, ["Alice", "Bob"], "{out}");
    let told = next_deliver(&mut alice);
    assert!(
        told["payload"]["body"]
            .as_str()
            .unwrap()
            .contains("carol claimed src/auth.rs"),
        "{told}"
    );
}

#[test]
fn a_tool_cannot_claim_for_a_connected_agent() {
    let relay = Relay::start();
    let (_alice, _) = relay.agent("Alice");
    let out = relay.cli(&["claim", "--as", "Alice", "src/x.rs"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("only its own connection claims for it"),
        "{err}"
    );
    assert!(claims_listed(&relay).is_empty());
}

#[test]
fn claims_survive_a_restart_and_expire() {
    let mut relay = Relay::start();
    std::fs::create_dir_all(relay.dir.path().join("src/db")).unwrap();
    ok_stdout(&relay.cli(&["claim", "--as", "dora", "src/x.rs", "src/db", "--for", "1h"]));
    ok_stdout(&relay.cli(&["claim", "--as", "eve", "notes.md", "--for", "3s"]));
    relay.stop();
    relay.spawn();
    let listed = claims_listed(&relay);
    assert!(
        listed.contains(&("dora".into(), "src/x.rs".into())),
        "{listed:?}"
    );
    // An existing directory is claimed as one (what it holds is covered).
    assert!(
        listed.contains(&("dora".into(), "src/db/".into())),
        "{listed:?}"
    );
    // After the restart the claim still collides.
    let out = ok_stdout(&relay.cli(&["claim", "--as", "fay", "src/db/schema.sql"]));
    assert!(out.contains("also claimed by dora (src/db/"), "{out}");
    // Eve's claim ends by itself; Dora's stays.
    wait_for(Duration::from_secs(30), "eve's claim expired", || {
        !claims_listed(&relay).iter().any(|(a, _)| a == "eve")
    });
    assert!(claims_listed(&relay).iter().any(|(a, _)| a == "dora"));
    // Released from the command line.
    let out = ok_stdout(&relay.cli(&["claim", "--as", "dora", "--release"]));
    assert!(out.contains("released src/x.rs"), "{out}");
    assert!(!claims_listed(&relay).iter().any(|(a, _)| a == "dora"));
}

#[test]
fn an_agent_that_leaves_releases_its_claims_and_a_lost_one_keeps_them() {
    let relay = Relay::start();
    let (mut alice, _) = relay.agent("Alice");
    let (mut carol, _) = relay.agent("Carol");
    query(&mut alice, json!({"what": "claim", "paths": ["a.rs"]}));
    result_and_notices(&mut alice, 0);
    query(&mut carol, json!({"what": "claim", "paths": ["c.rs"]}));
    result_and_notices(&mut carol, 0);
    // Carol's connection is lost (no BYE): her claim stays until it expires.
    drop(carol);
    wait_for(Duration::from_secs(20), "Carol offline", || {
        let out = ok_stdout(&relay.cli(&["agents", "--json"]));
        let v: Value = serde_json::from_str(&out).unwrap();
        v.as_array()
            .or(v["agents"].as_array())
            .unwrap()
            .iter()
            .any(|a| a["name"] == "Carol" && a["online"] == false)
    });
    // Alice says BYE (stopped, or exited): hers are released.
    alice.send_env("BYE", json!({}), json!({}));
    assert!(alice.closed());
    wait_for(Duration::from_secs(20), "Alice's claim released", || {
        !claims_listed(&relay).iter().any(|(a, _)| a == "Alice")
    });
    assert_eq!(claims_listed(&relay), [("Carol".into(), "c.rs".into())]);
}

#[test]
fn hostile_paths_are_refused_with_a_clear_error() {
    let relay = Relay::start();
    let long = "a".repeat(10 * 1024);
    for (path, says) in [
        ("../../etc/passwd", "outside the project"),
        ("/etc/passwd", "outside the project"),
        ("src/\x1b[2Jevil.rs", "control character"),
        ("src/*.rs", "not a pattern"),
        (long.as_str(), "claim its directory instead"),
        (".", "whole project"),
    ] {
        let out = relay.cli(&["claim", "--as", "mallory", path]);
        assert_eq!(out.status.code(), Some(2), "{path:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{path:?}: {err}");
        assert!(
            !err.contains('\x1b'),
            "the escape is shown, not sent: {err:?}"
        );
    }
    // The daemon checks what a client sends, whatever the client.
    let (mut m, _) = relay.agent("Mallory");
    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "a\u{1b}[2J",
        "src/../../x",
    ] {
        query(&mut m, json!({"what": "claim", "paths": [path]}));
        let r = m.expect("RESULT");
        assert_eq!(r["payload"]["what"], "error", "{path:?}: {r}");
        assert_eq!(r["payload"]["code"], "invalid", "{r}");
    }
    assert!(claims_listed(&relay).is_empty());
}
