//! Property tests of the codec: round trips, fragmentation independence, hostile input.
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly on purpose")]

use bytes::{Buf, BytesMut};
use proptest::prelude::*;
use relay_protocol::query::{HistoryFilter, QueryRequest};
use relay_protocol::{
    Ack, AckStatus, Budget, Busy, Bye, Capabilities, Delivery, DeliveryState, Envelope, ErrorCode,
    ErrorPayload, Hello, Kind, MAX_FRAME_BYTES, Nack, NackCode, Payload, Ping, Role, Send,
    ServerInfo, SubscribePayload, TerminalReport, TerminalState, Welcome, encode_frame, frame_len,
};

fn text() -> impl Strategy<Value = String> {
    // Any Unicode, including control characters, quotes and escapes.
    proptest::string::string_regex("(?s).{0,40}").unwrap()
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(text())
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        text().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn send_payload() -> impl Strategy<Value = Send> {
    (
        prop_oneof![
            Just(Kind::Message),
            Just(Kind::Action),
            Just(Kind::State),
            Just(Kind::Thinking)
        ],
        text(),
        proptest::option::of(json_value()),
        opt_text(),
        opt_text(),
        proptest::option::of((
            any::<u32>(),
            any::<u32>(),
            proptest::option::of(any::<u64>()),
        )),
        any::<bool>(),
    )
        .prop_map(
            |(kind, body, data, thread, in_reply_to, budget, urgent)| Send {
                origin: None,
                kind,
                body,
                // `Some(Null)` and `None` are the same on the wire.
                data: data.filter(|d| !d.is_null()),
                thread,
                in_reply_to,
                budget: budget.map(|(hops, max_hops, expires_at)| Budget {
                    hops,
                    max_hops,
                    expires_at,
                }),
                urgent,
            },
        )
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        (
            text(),
            opt_text(),
            any::<bool>(),
            any::<u32>(),
            opt_text(),
            any::<bool>()
        )
            .prop_map(|(agent, cli, ack, max_inflight, resume_token, client)| {
                Payload::Hello(Hello {
                    agent,
                    cli,
                    capabilities: Capabilities {
                        ack,
                        resume: true,
                        max_inflight,
                        supports_topics: false,
                    },
                    resume_token,
                    role: if client { Role::Client } else { Role::Agent },
                })
            }),
        (text(), text(), any::<u32>(), any::<u64>(), any::<bool>()).prop_map(
            |(s, r, m, h, resumed)| {
                Payload::Welcome(Welcome {
                    session_id: s,
                    resume_token: r,
                    server: ServerInfo {
                        max_frame_bytes: m,
                        heartbeat_ms: h,
                    },
                    resumed,
                    agent: None,
                })
            }
        ),
        send_payload().prop_map(Payload::Send),
        send_payload().prop_map(Payload::Deliver),
        (
            text(),
            proptest::option::of(any::<u64>()),
            any::<bool>(),
            proptest::option::of(text()),
        )
            .prop_map(|(ack_id, seq, dup, reason)| {
                Payload::Ack(Ack {
                    ack_id,
                    seq,
                    status: Some(if dup {
                        AckStatus::Duplicate
                    } else {
                        AckStatus::Accepted
                    }),
                    recipients: seq.map(|s| s as u32),
                    state: if dup {
                        None
                    } else {
                        Some(DeliveryState::Verified)
                    },
                    cumulative: !dup,
                    reason,
                })
            }),
        (text(), text()).prop_map(|(ack_id, reason)| Payload::Nack(Nack {
            ack_id,
            code: NackCode::UnknownTarget,
            reason
        })),
        opt_text().prop_map(|nonce| Payload::Ping(Ping {
            nonce,
            terminal: None
        })),
        (opt_text(), opt_text()).prop_map(|(nonce, why)| Payload::Pong(Ping {
            nonce,
            terminal: Some(TerminalReport {
                backend: "pty".into(),
                state: TerminalState::Blocked,
                why,
            }),
        })),
        (text(), any::<bool>()).prop_map(|(message, fatal)| Payload::Error(ErrorPayload {
            code: ErrorCode::BadFrame,
            message,
            fatal
        })),
        (any::<u64>(), opt_text(), any::<u64>()).prop_map(|(retry_after_ms, target, pending)| {
            Payload::Busy(Busy {
                retry_after_ms,
                target,
                pending,
            })
        }),
        opt_text().prop_map(|topic| Payload::Subscribe(SubscribePayload { topic })),
        opt_text().prop_map(|topic| Payload::Unsubscribe(SubscribePayload { topic })),
        opt_text().prop_map(|reason| Payload::Bye(Bye { reason })),
        opt_text().prop_map(|from| Payload::Query(QueryRequest::History(HistoryFilter {
            from,
            limit: Some(5),
            ..HistoryFilter::default()
        }))),
    ]
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        text(),
        any::<u64>(),
        opt_text(),
        opt_text(),
        opt_text(),
        proptest::option::of((any::<u64>(), text(), any::<u32>())),
        payload(),
    )
        .prop_map(|(id, ts, from, to, topic, delivery, payload)| {
            let mut env = Envelope::new(id, ts, payload);
            env.from = from;
            env.to = to;
            env.topic = topic;
            env.delivery = delivery.map(|(seq, session_id, attempt)| Delivery {
                seq,
                session_id,
                attempt,
            });
            env
        })
}

fn decode_all(buf: &mut BytesMut) -> Vec<Envelope> {
    let mut out = Vec::new();
    while let Some(n) = frame_len(buf, MAX_FRAME_BYTES).unwrap() {
        out.push(Envelope::from_json(&buf[4..n]).unwrap());
        buf.advance(n);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_envelope_round_trips(env in envelope()) {
        let mut out = Vec::new();
        encode_frame(&env, &mut out, MAX_FRAME_BYTES).unwrap();
        let mut buf = BytesMut::from(&out[..]);
        let back = decode_all(&mut buf);
        prop_assert_eq!(back, vec![env]);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn frames_do_not_depend_on_how_the_stream_is_split(
        envs in proptest::collection::vec(envelope(), 1..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut bytes = Vec::new();
        for e in &envs {
            encode_frame(e, &mut bytes, MAX_FRAME_BYTES).unwrap();
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for w in points.windows(2) {
            buf.extend_from_slice(&bytes[w[0]..w[1]]);
            got.extend(decode_all(&mut buf));
        }
        prop_assert_eq!(got, envs);
    }

    #[test]
    fn random_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(n)) = frame_len(&buf, 1024) {
            let _ = Envelope::from_json(&buf[4..n]);
            buf.advance(n);
        }
    }

    #[test]
    fn mutated_valid_frames_never_panic(env in envelope(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = Vec::new();
        encode_frame(&env, &mut bytes, MAX_FRAME_BYTES).unwrap();
        for (i, b) in flips {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(n)) = frame_len(&buf, MAX_FRAME_BYTES) {
            let _ = Envelope::from_json(&buf[4..n]);
            buf.advance(n);
        }
    }
}

#[test]
fn an_oversize_header_is_refused_from_the_header_alone() {
    // Four bytes are enough to refuse a 4 GiB frame: nothing waits for (or allocates) a body.
    let header = u32::MAX.to_be_bytes();
    assert!(frame_len(&header, MAX_FRAME_BYTES).is_err());
    let exact = (MAX_FRAME_BYTES as u32).to_be_bytes();
    assert_eq!(frame_len(&exact, MAX_FRAME_BYTES), Ok(None));
}
