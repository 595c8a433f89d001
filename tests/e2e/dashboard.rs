//! The web dashboard served by the real daemon: its token, its API, its port, and the page in a
//! real headless Chromium (Debian's `chromium`, driven by playwright-core from
//! `tests/browser/`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// Alice sends `body` to Bob, Bob acknowledges it; returns the message id.
fn converse(alice: &mut Raw, bob: &mut Raw, body: &str) -> String {
    let id = alice.send("Bob", body);
    alice.expect("ACK");
    let d = bob.expect("DELIVER");
    assert_eq!(d["id"], id.as_str());
    bob.ack(&d);
    id
}

#[test]
fn dashboard_refuses_requests_without_the_right_token() {
    let relay = Relay::start();
    let (port, token) = dashboard(&relay);
    let wrong = "0".repeat(token.len());
    for path in [
        "/",
        "/app.js",
        "/api/agents",
        "/api/messages",
        "/api/events",
        "/metrics",
    ] {
        let (status, body) = http_get(port, path, &[]);
        assert_eq!(status, 401, "{path} without a token: {body}");
        assert!(body.contains("wrong token"), "{body}");
        let (status, _) = http_get(port, &format!("{path}?token={wrong}"), &[]);
        assert_eq!(status, 401, "{path} with a wrong token");
        let (status, _) = http_get(port, path, &[("Authorization", &format!("Bearer {wrong}"))]);
        assert_eq!(status, 401, "{path} with a wrong bearer token");
    }
    let (status, page) = http_get(port, &format!("/?token={token}"), &[]);
    assert_eq!(status, 200);
    assert!(page.contains("agent-relay"), "{page}");
    let (status, metrics) = http_get(
        port,
        "/metrics",
        &[("Authorization", &format!("Bearer {token}"))],
    );
    assert_eq!(status, 200);
    assert!(
        metrics.contains("agent_relay_messages_accepted_total 0"),
        "{metrics}"
    );
}

#[test]
fn dashboard_api_serves_agents_history_detail_and_metrics() {
    let relay = Relay::start();
    let (port, token) = dashboard(&relay);
    let (mut bob, _) = relay.agent("Bob");
    let (mut alice, _) = relay.agent("Alice");
    let ids: Vec<String> = (0..3)
        .map(|i| converse(&mut alice, &mut bob, &format!("note {i} about parsing")))
        .collect();

    // Acknowledgements reach the store with the next watermark flush.
    wait_for(Duration::from_secs(20), "Bob's inbox is empty", || {
        let agents = api(port, &token, "/api/agents");
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "Bob" && a["pending"] == 0 && a["state"] == "idle")
    });
    let agents = api(port, &token, "/api/agents");
    let alice_row = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "Alice")
        .unwrap()
        .clone();
    assert_eq!(alice_row["online"], true);
    assert_eq!(alice_row["cli"], "test");
    assert_eq!(alice_row["sent"], 3);
    assert_eq!(alice_row["received"], 0);

    let page = api(port, &token, "/api/messages?limit=2");
    let msgs = page["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0]["id"], ids[2].as_str(), "newest first");
    let before = page["next_before"]
        .as_i64()
        .expect("a full page says where to go on");
    let older = api(
        port,
        &token,
        &format!("/api/messages?limit=2&before={before}"),
    );
    assert_eq!(older["messages"][0]["id"], ids[0].as_str());
    assert_eq!(older["next_before"], json!(null));

    let found = api(
        port,
        &token,
        "/api/messages?text=note%201&from=Alice&to=Bob",
    );
    assert_eq!(found["messages"].as_array().unwrap().len(), 1);
    assert_eq!(found["messages"][0]["id"], ids[1].as_str());
    let none = api(port, &token, "/api/messages?from=Bob");
    assert_eq!(none["messages"], json!([]));

    // The stored delivery trace, as `agent-relay trace` tells it.
    wait_for(Duration::from_secs(20), "the trace shows the ack", || {
        let detail = api(port, &token, &format!("/api/messages/{}", ids[0]));
        detail["trace"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["state"] == "injected" && s["recipient"] == "Bob")
    });
    let detail = api(port, &token, &format!("/api/messages/{}", ids[0]));
    assert_eq!(detail["message"]["body"], "note 0 about parsing");
    let states: Vec<&str> = field_strs(&detail["trace"], "state");
    assert_eq!(states, ["accepted", "queued", "delivered", "injected"]);
    let (status, body) = http_get(
        port,
        &format!("/api/messages/nosuchmessage?token={token}"),
        &[],
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = http_get(port, &format!("/api/messages?limit=0&token={token}"), &[]);
    assert_eq!(status, 400, "{body}");

    let stats = api(port, &token, "/api/stats");
    assert_eq!(stats["status"]["messages"], 3);
    assert_eq!(stats["totals"]["accepted"], 3);
    assert_eq!(stats["totals"]["delivered"], 3);
    let dead = api(port, &token, "/api/dead");
    assert_eq!(dead["dead_letters"], json!([]));
    // Putting a dead letter back is an operator action: the token is needed, and the number
    // must exist.
    let (status, _) = http(port, "POST", "/api/dead/1/retry", &[]);
    assert_eq!(status, 401);
    let retry = format!("/api/dead/1/retry?token={token}");
    let (status, body) = http(port, "POST", &retry, &[]);
    assert_eq!(status, 404, "{body}");
    let (status, _) = http(port, "GET", &retry, &[]);
    assert_eq!(status, 405, "a GET changes nothing");

    let (_, metrics) = http_get(port, &format!("/metrics?token={token}"), &[]);
    assert!(
        metrics.contains("agent_relay_messages_accepted_total 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("agent_relay_agents_online 2\n"),
        "{metrics}"
    );
}

#[test]
fn dashboard_moves_to_a_free_port_when_its_port_is_taken() {
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let wanted = taken.local_addr().unwrap().port();
    let relay = Relay::start_with(&["--dashboard-port", &wanted.to_string()]);
    let (port, token) = dashboard(&relay);
    assert_ne!(port, wanted);
    let (status, _) = http_get(port, &format!("/api/agents?token={token}"), &[]);
    assert_eq!(status, 200);
    let status = ok_stdout(&relay.cli(&["status"]));
    assert!(
        status.contains(&format!(
            "dashboard: http://127.0.0.1:{port}/?token={token}"
        )),
        "{status}"
    );
    let file = relay.data_dir().join("dashboard.url");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is private");
}

#[test]
fn no_dashboard_serves_nothing() {
    let relay = Relay::start_with(&["--no-dashboard"]);
    assert!(!relay.data_dir().join("dashboard.url").exists());
    let status = ok_stdout(&relay.cli(&["status"]));
    assert!(status.contains("dashboard: off"), "{status}");
    let json: serde_json::Value =
        serde_json::from_str(&ok_stdout(&relay.cli(&["status", "--json"]))).unwrap();
    assert_eq!(json["dashboard"], json!(null));
}

#[test]
fn up_prints_the_dashboard_url() {
    // `relay` only lends its test environment; `up` starts another daemon in the background
    // on a directory of its own.
    let relay = Relay::start_with(&["--no-dashboard"]);
    let dir = tempfile::tempdir().unwrap();
    let run = |cmd: &str| {
        let out = relay
            .command()
            .env("AGENT_RELAY_DATA_DIR", dir.path().join("data"))
            .env("AGENT_RELAY_SOCKET", dir.path().join("b.sock"))
            .arg(cmd)
            .output()
            .unwrap();
        ok_stdout(&out)
    };
    let text = run("up");
    let url = std::fs::read_to_string(dir.path().join("data/dashboard.url")).unwrap();
    assert!(
        text.contains(&format!("dashboard: {}", url.trim())),
        "{text}"
    );
    run("down");
    // The daemon removes it on its way out (a bound on a hang, not a speed requirement).
    crate::support::wait_for(
        Duration::from_secs(10),
        "the URL file is removed on stop",
        || !dir.path().join("data/dashboard.url").exists(),
    );
}

#[test]
fn dashboard_page_in_chromium() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "Debian's chromium is missing: `apt-get install chromium` (.ci/run installs it)"
    );
    // Long heartbeats: the raw agents below only answer PINGs when they read. Alice sends Bob
    // more than the per-pair rate limit allows in a minute: no limit here.
    let relay = Relay::start_with(&["--heartbeat-ms", "60000", "--pair-rate-limit", "0"]);
    let url = std::fs::read_to_string(relay.data_dir().join("dashboard.url")).unwrap();
    let (mut bob, _) = relay.agent("Bob");
    let (mut alice, _) = relay.agent("Alice");
    // Carol asks for a build on a topic, then leaves: she shows offline.
    let (mut carol, _) = relay.agent("Carol");
    carol.send_env(
        "SEND",
        json!({"to": "Bob", "topic": "build.linux"}),
        json!({"kind": "action", "body": "run the linux build please", "thread": "release-1.2"}),
    );
    carol.expect("ACK");
    let d = bob.expect("DELIVER");
    bob.ack(&d);
    drop(carol);
    alice.send("Bobb", "is anyone there?");
    alice.expect("NACK");
    let mut old = String::new();
    for i in 0..30 {
        let body = if i == 3 {
            "the needle-7f3 in the haystack".to_owned()
        } else {
            format!("routine update {i}")
        };
        let id = converse(&mut alice, &mut bob, &body);
        if i == 3 {
            old = id;
        }
    }
    // A delivery Bob reports he could not hand over: a dead letter, and Alice is told.
    let failed = alice.send("Bob", "the nightly report, which Bob could not show");
    alice.expect("ACK");
    let d = bob.expect("DELIVER");
    assert_eq!(d["id"], failed.as_str());
    bob.send_env(
        "ACK",
        json!({}),
        json!({"ack_id": failed, "seq": d["delivery"]["seq"], "state": "failed"}),
    );
    let notice = alice.expect("DELIVER");
    assert_eq!(notice["from"], "relay");
    alice.ack(&notice);
    let shot = std::env::var("AGENT_RELAY_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| relay.dir.path().join("dashboard.png"));
    let mut browser = Browser::start(
        "dashboard.mjs",
        &[
            std::ffi::OsStr::new(url.trim()),
            old.as_ref(),
            "needle-7f3".as_ref(),
            shot.as_os_str(),
            failed.as_ref(),
        ],
    );
    assert_eq!(browser.next("READY"), "READY");
    let id = converse(
        &mut alice,
        &mut bob,
        "a live one: does the page update by itself?",
    );
    browser.say(&format!("SENT {id}"));
    // The page's Retry button puts the dead letter back: Bob gets the message again.
    assert_eq!(browser.next("RETRIED"), format!("RETRIED {failed}"));
    let again = bob.expect("DELIVER");
    assert_eq!(again["id"], failed.as_str());
    bob.ack(&again);
    browser.say("REDELIVERED");
    let last = browser.next("OK");
    assert!(browser.passed(), "browser checks failed");
    assert_eq!(last, "OK");
    assert!(shot.exists(), "screenshot written");
}
