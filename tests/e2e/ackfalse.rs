//! A recipient that said `ack: false` (issue 23.10): a DELIVER counts as handed over only
//! once the recipient has read it off its socket.

use std::collections::{HashMap, HashSet};

use crate::support::*;

/// 30,000 messages wait for Bob (`ack: false`); he reads a third of them and closes his
/// connection with more written to his socket and unread. On his next connection he gets
/// every message he had not read. Before the fix those sitting unread in his socket buffer
/// had been recorded "acknowledged by the recipient" when written, and were lost.
#[test]
fn an_ack_false_recipient_that_closes_mid_stream_gets_the_unread_rest_next_time() {
    const N: usize = 30_000;
    let relay = Relay::start_with(UNLIMITED);
    let mut bob = connect_bob(&relay);
    // Everything is stored before Bob reads: the daemon has filled his socket buffer.
    let sent = alice_sends_bob(&relay, N);
    let mut got: HashMap<String, usize> = HashMap::new();
    read_deliveries_until(&mut bob, &mut got, N / 3, 0);
    // Bob goes mid-stream: whatever sits unread in his socket is thrown away by the kernel.
    drop(bob);
    let before = got.len();
    let mut bob = connect_bob(&relay);
    read_deliveries_until(&mut bob, &mut got, N, before);
    let received: HashSet<String> = got.keys().cloned().collect();
    assert_eq!(received, sent);
    // The wire is at least once (a client drops a re-delivered id); what is redelivered is
    // only what was read too shortly before the close for the relay to have seen it read.
    let again = got.values().filter(|n| **n > 1).count();
    println!(
        "ack:false recipient: {before} read before closing, all {N} after reconnecting, {again} delivered twice"
    );
}
