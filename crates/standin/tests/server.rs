//! The stand-in over real HTTP on a real socket, as an agent CLI would use it.
#![expect(clippy::unwrap_used, reason = "tests fail loudly on purpose")]
#![allow(
    clippy::disallowed_methods,
    reason = "tests bound their waits with the std clock"
)]

use std::io::{Read, Write};
use std::time::Duration;

use relay_standin::{Kind, Rule, Script, StandIn};
use serde_json::{Value, json};

/// One HTTP/1.1 request; returns (status line, body).
fn post(standin: &StandIn, path: &str, body: &Value) -> (String, String) {
    let mut s = std::net::TcpStream::connect(standin.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The SSE events' data in a (possibly chunked) body: every `data:` line.
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn turn(text: &str, stream: bool) -> Value {
    json!({"model": "claude-x", "stream": stream, "tools": [{"name": "Bash"}],
           "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]})
}

#[test]
fn streams_the_chosen_reply_and_logs_what_was_asked() {
    let standin = StandIn::start(Script::new(vec![Rule::contains(
        "review",
        "@relay:Bob please review auth.ts, it is long enough to split",
    )]))
    .unwrap();
    let (status, body) = post(&standin, "/v1/messages", &turn("please review", true));
    assert!(status.contains("200"), "{status}");
    let evs = events(&body);
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    let text: String = evs
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(
        text,
        "@relay:Bob please review auth.ts, it is long enough to split"
    );

    let (_, body) = post(&standin, "/alice/v1/messages", &turn("anything", false));
    let msg: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(msg["content"][0]["text"], "OK.", "the default");
    // A request without tools is a side request: never answered by the rules.
    let side = json!({"model": "haiku", "messages": [{"role": "user", "content": "review"}]});
    let (_, body) = post(&standin, "/v1/messages", &side);
    let msg: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        msg["content"][0]["text"],
        r#"{"title": "Stand-in session"}"#
    );
    let (_, body) = post(&standin, "/v1/messages/count_tokens", &turn("x", false));
    assert!(body.contains("input_tokens"), "{body}");
    let (_, body) = post(&standin, "/api/hello", &json!({}));
    assert_eq!(body, "{}");

    let log = standin.requests();
    let summary: Vec<(Kind, &str, Option<&str>, &str)> = log
        .iter()
        .map(|r| {
            (
                r.kind,
                r.prefix.as_str(),
                r.rule.as_deref(),
                r.user_text.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (Kind::Main, "", Some("review"), "please review"),
            (Kind::Main, "alice", None, "anything"),
            (Kind::Side, "", None, "review"),
            (Kind::CountTokens, "", None, "x"),
            (Kind::Other, "", None, ""),
        ]
    );
    assert!(log.iter().all(|r| r.finished.is_some()));
    assert_eq!(standin.prompts(), ["please review", "anything"]);
}

#[test]
fn a_delayed_rule_holds_the_reply_back_after_message_start() {
    let standin = StandIn::start(Script::new(vec![
        Rule::contains("slow", "done").delayed(Duration::from_millis(300)),
    ]))
    .unwrap();
    let (_, body) = post(&standin, "/v1/messages", &turn("slow please", true));
    assert!(events(&body).iter().any(|e| e["delta"]["text"] == "done"));
    let r = &standin.requests()[0];
    // A lower bound only: the delay was honoured (an upper bound would be a clock threshold).
    assert!(r.finished.unwrap() - r.received >= Duration::from_millis(300));
}

#[test]
fn a_held_reply_waits_for_its_release() {
    let standin =
        StandIn::start(Script::new(vec![Rule::contains("busy", "finally").held()])).unwrap();
    let addr = standin.addr();
    let client = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let body = turn("busy now", true).to_string();
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while standin.requests().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no request arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(standin.requests()[0].finished, None, "held");
    standin.release();
    let out = client.join().unwrap();
    assert!(out.contains("\"finally\""), "{out}");
    assert!(standin.requests()[0].finished.is_some());
}
