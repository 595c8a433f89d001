//! The client library against the real daemon: acknowledgements, replays and crashes.

use std::time::Duration;

use relay_client::{Client, ClientConfig, Event, Outgoing};
use serde_json::json;

use crate::support::*;

async fn next_message(c: &mut Client) -> relay_client::Delivered {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), c.next_event()).await {
            Ok(Some(Event::Message(m))) => return m,
            Ok(Some(_)) => {}
            other => panic!("no message: {other:?}"),
        }
    }
}

#[test]
fn one_cumulative_ack_covers_everything_before_it() {
    let (relay, [mut bob, mut alice]) = Relay::with_agents(&[], ["Bob", "Alice"]);
    for i in 0..3 {
        alice.send("Bob", &format!("m{i}"));
    }
    let d: Vec<_> = (0..3).map(|_| bob.expect("DELIVER")).collect();
    bob.send_env(
        "ACK",
        json!({}),
        json!({"ack_id": d[2]["id"], "seq": d[2]["delivery"]["seq"], "cumulative": true}),
    );
    bob.bye();
    let (mut bob, _) = relay.agent("Bob");
    bob.send_env("PING", json!({}), json!({"nonce": "x"}));
    let f = bob.expect("PONG");
    assert_eq!(
        f["payload"]["nonce"], "x",
        "no DELIVER replayed before the PONG"
    );
}

#[test]
fn acknowledged_messages_are_not_replayed_after_close() {
    let relay = Relay::start();
    rt().block_on(async {
        let cfg = ClientConfig::agent(relay.socket.clone(), "Bob");
        let mut bob = Client::connect(cfg.clone()).await.unwrap();
        let alice = relay.tool_client("Alice").await;
        for i in 0..20 {
            alice
                .send(Outgoing::new("Bob", format!("m{i}")))
                .await
                .unwrap();
        }
        for _ in 0..20 {
            let m = next_message(&mut bob).await;
            bob.ack(&m, None).await.unwrap();
        }
        // Acknowledgements gathered for a cumulative ACK must not be lost by closing.
        bob.close().await;
        let mut again = Client::connect(cfg).await.unwrap();
        nothing_before_a_marker(&relay.socket, &mut again, "Bob").await;
        again.close().await;
        alice.close().await;
    });
}

#[test]
fn a_message_handed_over_but_not_acknowledged_survives_a_crash_after_a_reconnect() {
    let mut relay = Relay::start();
    rt().block_on(async {
        let cfg = ClientConfig::agent(relay.socket.clone(), "Bob");
        let mut bob = Client::connect(cfg.clone()).await.unwrap();
        let alice = relay.tool_client("Alice").await;
        alice.send(Outgoing::new("Bob", "important")).await.unwrap();
        let m = next_message(&mut bob).await;
        assert_eq!(m.payload.body, "important");
        // The daemon restarts before Bob's application acknowledges; Bob's client reconnects
        // and gets the message replayed. It must neither show it twice nor acknowledge it on
        // the application's behalf.
        relay.kill9();
        relay.spawn();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), bob.next_event()).await {
                Ok(Some(Event::Connected { .. })) => break,
                Ok(Some(Event::Message(m))) => panic!("surfaced twice: {m:?}"),
                Ok(Some(_)) => {}
                other => panic!("no reconnect: {other:?}"),
            }
        }
        nothing_before_a_marker(&relay.socket, &mut bob, "Bob").await;
        // Now Bob's process dies without acknowledging: the message must still be there.
        drop(bob);
        let mut fresh = Client::connect(cfg).await.unwrap();
        let m = next_message(&mut fresh).await;
        assert_eq!(m.payload.body, "important");
        assert!(m.attempt >= 2, "{m:?}");
        fresh.ack(&m, None).await.unwrap();
        fresh.close().await;
        drop(alice);
    });
}
