//! Admission: a SEND checked (ids, threads, size, names, rules, rates, hop budgets) and routed
//! to its recipients, or refused with a reason; a recipient who has never connected is told of
//! once.

use super::*;

impl Core {
    pub(super) fn known_names(&self) -> String {
        let mut names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        if names.is_empty() {
            return "no agents have connected yet".into();
        }
        let more = names.len().saturating_sub(20);
        names.truncate(20);
        let mut s = format!("known: {}", names.join(", "));
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s
    }

    /// Decides who gets a SEND.
    pub(super) fn resolve(
        &self,
        from: &str,
        to: Option<&str>,
        topic: Option<&str>,
    ) -> Result<(String, Vec<String>), (NackCode, String)> {
        if let Some(t) = topic {
            validate_topic(t).map_err(|e| (NackCode::Invalid, format!("bad topic: {e}")))?;
        }
        match (to, topic) {
            (Some("*"), None) => {
                let names = self
                    .agents
                    .keys()
                    .filter(|n| n.as_str() != from)
                    .cloned()
                    .collect();
                Ok(("*".into(), names))
            }
            (None | Some("*"), Some(t)) => {
                let names = self
                    .agents
                    .iter()
                    .filter(|(n, a)| {
                        n.as_str() != from && a.topics.iter().any(|p| topic_matches(p, t))
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                Ok(("*".into(), names))
            }
            (Some(name), _) => {
                validate_agent_name(name)
                    .map_err(|e| (NackCode::Invalid, format!("bad recipient: {e}")))?;
                // A known agent, a person, or a name not seen yet (it waits): `names.rs`.
                self.admit_recipient(name)?;
                Ok((name.to_owned(), vec![name.to_owned()]))
            }
            (None, None) => Err((
                NackCode::Invalid,
                "SEND needs `to` (an agent name or \"*\") or a `topic`".into(),
            )),
        }
    }

    /// A SEND from connection `conn_id`: admission (id, size, who may speak as whom), then
    /// [`Core::route`]. Refusals are NACKed; an accepted SEND becomes a store append.
    pub(crate) fn on_send(&mut self, conn_id: u64, send: Submitted, now: Now) {
        self.now = now;
        let Submitted {
            id,
            to,
            topic,
            payload,
            raw,
        } = send;
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        // Ids are typed into terminals and printed by every command: only a safe alphabet.
        if let Err(e) = relay_protocol::text::validate_message_id(&id) {
            // The echo is cleaned: the id is what was hostile.
            let echo = relay_protocol::text::one_line(&id, 160);
            self.nack(conn_id, echo, NackCode::Invalid, e.to_string());
            return;
        }
        if names::is_relay_id(&id) {
            let reason = format!(
                "ids starting with {} are the relay's own notices'; nothing was stored; send again with a new id (a ULID)",
                names::RELAY_ID_PREFIXES.join(", ")
            );
            self.nack(conn_id, id, NackCode::Invalid, reason);
            return;
        }
        // A thread is printed in every header a model reads (`(thread T)`): the id rules, so
        // that it cannot carry a line break, an escape sequence or a header of its own.
        if let Some(thread) = &payload.thread
            && let Err(e) = relay_protocol::text::validate_message_id(thread)
        {
            let reason = format!(
                "thread {:?}: {e}; a thread is the id of its first message",
                relay_protocol::text::one_line(thread, 40)
            );
            self.nack(conn_id, id, NackCode::Invalid, reason);
            return;
        }
        if payload.body.len() > self.cfg.max_body_bytes {
            let reason = format!(
                "body is {} bytes; the limit is {} bytes. Put long content in a file and send its path",
                payload.body.len(),
                self.cfg.max_body_bytes
            );
            self.nack(conn_id, id, NackCode::TooLarge, reason);
            return;
        }
        // The whole payload (unknown fields too) goes out again inside a DELIVER, whose
        // header is larger than the SEND's: refuse here what could not be delivered.
        let payload_len = raw.as_ref().map_or(payload.body.len(), |r| r.get().len());
        let deliverable = self.cfg.max_frame_bytes.saturating_sub(DELIVER_HEADROOM);
        if payload_len > deliverable {
            let reason = format!(
                "payload is {payload_len} bytes; a DELIVER must carry it within {} bytes. Put long content in a file and send its path",
                deliverable
            );
            self.nack(conn_id, id, NackCode::TooLarge, reason);
            return;
        }
        // A tool (`send --from NAME`) may not speak as an agent that is connected: only that
        // agent's own connection does, so a message shown as from Alice is from Alice.
        // A person's adapters connection is the exception: the person at the terminal who
        // runs `agent-relay send` is that person.
        if conn.role == Role::Client
            && self.agents.get(&conn.name).is_some_and(|a| {
                a.online.is_some() && a.cli.as_deref() != Some(relay_protocol::PERSON_CLI)
            })
        {
            let reason = format!(
                "{name} is a connected agent, and only its own connection speaks as it; send as yourself (agent-relay send --from YOUR_NAME ...) or print the directive in {name}'s terminal",
                name = conn.name
            );
            self.nack(conn_id, id, NackCode::Forbidden, reason);
            return;
        }
        if conn.role == Role::Client
            && let Err(reason) = self.may_sign(&conn.name)
        {
            self.nack(conn_id, id, NackCode::Forbidden, reason);
            return;
        }
        let from = conn.name.clone();
        let session_id = self
            .agents
            .get(&from)
            .and_then(|a| a.online.as_ref())
            .filter(|o| o.conn_id == conn_id)
            .map(|o| o.session_id.to_string());
        let origin = Origin {
            conn_id,
            from,
            session_id,
            checked: false,
        };
        self.route(origin, id, to, topic, payload, raw);
    }

    /// Resolves, checks (budget, rate limits) and stores a SEND. Refusals are answered with a
    /// NACK and kept in the dead-letter queue.
    pub(super) fn route(
        &mut self,
        origin: Origin,
        id: String,
        to: Option<String>,
        topic: Option<String>,
        mut payload: Send,
        mut raw: Option<Raw>,
    ) {
        let Origin {
            conn_id,
            from,
            session_id,
            checked,
        } = origin;
        // The node a message came from is the relay's to say, never its sender's: a
        // federation stand-in's connection stands for its node; anyone else's message has none
        // (a retried dead letter keeps what it was stored with).
        if conn_id != NO_CONN {
            let node = self.conns.get(&conn_id).and_then(|c| c.remote_node.clone());
            if payload.origin != node {
                payload.origin = node;
                // The DELIVER must carry the relay's word, not the sender's text.
                raw = None;
            }
        }
        let (to_name, mut names) = match self.resolve(&from, to.as_deref(), topic.as_deref()) {
            Ok(r) => r,
            Err((code, reason)) if conn_id == NO_CONN => {
                // The daemon's own send (a retried dead letter) has nobody to answer: it goes
                // back to the dead-letter queue rather than vanish.
                let message = NewMessage {
                    id,
                    from,
                    to: to.unwrap_or_else(|| "*".into()),
                    topic,
                    payload,
                    session_id,
                    recipients: Vec::new(),
                    queued_at: None,
                };
                let code = serde_json::to_value(code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "invalid".into());
                self.store(StoreCmd::Write(
                    WriteOp::Reject {
                        message: Box::new(message),
                        code,
                        reason,
                    },
                    WriteCtx::None,
                ));
                return;
            }
            Err((code, reason)) => {
                self.nack(conn_id, id, code, reason);
                return;
            }
        };
        // Access rules: a denied recipient never gets it. A message every recipient is
        // denied is refused; a broadcast goes to the others, and each denied copy is
        // dead-lettered.
        let from_node = self
            .conns
            .get(&conn_id)
            .and_then(|c| c.remote_node.as_deref())
            .or(self.cfg.node.as_deref());
        let denied: Vec<String> = names
            .iter()
            .filter(|n| {
                let to_node = self
                    .agents
                    .get(n.as_str())
                    .and_then(|a| remote_node(a.cli.as_deref()))
                    .or(self.cfg.node.as_deref());
                !self.rules.allows_at((&from, from_node), (n, to_node))
            })
            .cloned()
            .collect();
        if !denied.is_empty() {
            names.retain(|n| !denied.contains(n));
            let all = names.is_empty();
            for d in &denied {
                let reason = format!(
                    "an access rule forbids {from} to send to {d} (`agent-relay rules list`)"
                );
                if all && denied.len() == 1 {
                    self.nack(
                        conn_id,
                        id.clone(),
                        NackCode::Forbidden,
                        format!("{reason}; kept in the dead-letter queue"),
                    );
                }
                let message = NewMessage {
                    id: id.clone(),
                    from: from.clone(),
                    to: d.clone(),
                    topic: topic.clone(),
                    payload: payload.clone(),
                    session_id: session_id.clone(),
                    recipients: Vec::new(),
                    queued_at: None,
                };
                self.store(StoreCmd::Write(
                    WriteOp::Reject {
                        message: Box::new(message),
                        code: "forbidden".to_owned(),
                        reason,
                    },
                    WriteCtx::None,
                ));
            }
            if all {
                if denied.len() > 1 {
                    self.nack(
                        conn_id,
                        id,
                        NackCode::Forbidden,
                        format!("access rules forbid {from} to send to any of {} (`agent-relay rules list`); kept in the dead-letter queue", denied.join(", ")),
                    );
                }
                return;
            }
        }
        // The daemon, not the sender, decides a message's hop count: a reply has one more
        // than what it answers; anything else starts a fresh chain.
        let hops = payload
            .in_reply_to
            .as_deref()
            .map_or(0, |parent| self.hops.reply_hops(parent));
        // A stand-in's SEND (a message from another node of a federation) carries when the
        // message expires there: its time to live runs from its acceptance on its origin node,
        // not again from now (time spent in an outbox while NATS was away counts).
        let expires_at = payload
            .budget
            .as_ref()
            .and_then(|b| b.expires_at)
            .filter(|_| {
                self.conns
                    .get(&conn_id)
                    .is_some_and(|c| c.remote_node.is_some())
            });
        let ttl = u64::try_from(self.cfg.inbox_ttl.as_millis()).unwrap_or(u64::MAX);
        // Never later than a message accepted here now would expire: a connection that calls
        // itself a stand-in can shorten its own message's life, not lengthen it.
        let expires_at = expires_at.map(|e| e.min(self.now.ms.saturating_add(ttl)));
        let queued_at = expires_at.map(|e| e.saturating_sub(ttl));
        let max_hops = self.max_hops_in(payload.thread.as_deref());
        let budget = (hops > 0 || expires_at.is_some()).then_some(Budget {
            hops,
            max_hops,
            expires_at,
        });
        if payload.budget != budget {
            payload.budget = budget;
            // The DELIVER must carry the daemon's budget, not the sender's text.
            raw = None;
        }
        let refusal = if checked {
            None
        } else if hops > max_hops {
            Some((
                NackCode::BudgetExceeded,
                "budget_exceeded",
                budget_reason(hops, max_hops, payload.thread.as_deref()),
            ))
        } else {
            let direct = (names.len() == 1 && to_name != "*").then_some(to_name.as_str());
            self.limiter
                .check(&from, direct, self.now.ms)
                .err()
                .map(|r| (NackCode::RateLimited, "rate_limited", r.reason))
        };
        let new = NewMessage {
            id: id.clone(),
            from,
            to: to_name,
            topic,
            payload,
            session_id,
            recipients: names
                .iter()
                .map(|n| Recipient { name: n.clone() })
                .collect(),
            queued_at,
        };
        if let Some((code, word, reason)) = refusal {
            tracing::info!(from = %new.from, to = %new.to, id = %id, code = word, "SEND refused; dead-lettered");
            self.nack(
                conn_id,
                id,
                code,
                format!("{reason} (kept in the dead-letter queue: `agent-relay dlq list`)"),
            );
            self.store(StoreCmd::Write(
                WriteOp::Reject {
                    message: Box::new(new),
                    code: word.to_owned(),
                    reason,
                },
                WriteCtx::None,
            ));
            return;
        }
        // Known before the store commits it: with a DELIVER handed over by the store thread
        // (issue 26 point 2), the recipient's reply can reach the router before the append's
        // result does, and a parent not yet counted would start the reply a fresh chain (two
        // agents answering each other would never reach the budget). Settled in
        // `on_appended`.
        self.hops.admitted(&id, conn_id, hops);
        let online = self.handovers(&names);
        self.store(StoreCmd::Write(
            WriteOp::Append(new),
            WriteCtx::Send {
                conn_id,
                env_id: id,
                recipients: names,
                raw,
                online,
            },
        ));
    }

    /// The receipt for a message to `name`, which has not connected yet, says so (the line
    /// `agent-relay send` prints); an agent that sent it is also told with a notice from the
    /// relay, once per recipient while the daemon runs (its model reads it).
    pub(super) fn tell_not_yet(
        &mut self,
        conn_id: u64,
        ack_id: String,
        message: &StoredMessage,
        name: String,
        recipients: Option<u32>,
    ) {
        let note = self.not_yet_seen_note(&name);
        self.reply(
            conn_id,
            Payload::Ack(relay_protocol::Ack {
                ack_id,
                seq: None,
                status: Some(AckStatus::Queued),
                recipients,
                state: None,
                cumulative: false,
                reason: Some(note.clone()),
            }),
        );
        let agent_sender = self
            .conns
            .get(&conn_id)
            .is_some_and(|c| c.role == Role::Agent && c.name == message.from);
        if !agent_sender
            || !self
                .told_not_yet
                .insert((message.from.clone(), name.clone()))
        {
            return;
        }
        let short = relay_protocol::short_id(&message.id);
        let body = format!(
            "relay: your message [{short}] to {name} is kept: {note}. Later messages to {name} wait the same way, without this notice."
        );
        let data = serde_json::json!({"relay_notice": {
            "msg_id": message.id, "recipient": name, "code": "not_connected_yet",
        }});
        // Told once per pair, ever: the notice's id is the pair's, so a relay restarted since
        // the first notice finds it stored and stores no second one (the store's dedupe of
        // (sender, id) is the record; no memory of this process is). Its short id is not the
        // message's.
        let id = names::not_yet_notice_id(&message.from, &name);
        self.relay_notice(message.from.clone(), id, Some(&message.id), body, data);
    }
}
