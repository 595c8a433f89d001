//! Delivery: what the store committed goes out in each recipient's window (DELIVER), pending
//! copies are read back for a connection that has room, dead letters put back are delivered
//! again, and a recipient's circuit is probed after failures.

use super::*;

impl Core {
    /// The online recipients of an append about to be sent to the store (issue 26 point 2):
    /// each pre-approved for the store thread to hand its DELIVER over right after the commit
    /// ([`Online::may_hand_over`]), or counted as one the router will deliver.
    pub(super) fn handovers(&mut self, recipients: &[String]) -> Box<[Handover]> {
        let mut out = Vec::new();
        for (index, name) in recipients.iter().enumerate() {
            let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            let writer = if on.may_hand_over() {
                on.tickets += 1;
                on.issued += 1;
                Some(Writer {
                    tx: on.tx.clone(),
                    session_id: on.session_id.clone(),
                    confirm: !on.ack_required,
                })
            } else {
                on.unapproved += 1;
                None
            };
            out.push(Handover {
                index,
                conn_id: on.conn_id,
                writer,
                handed: false,
            });
        }
        out.into_boxed_slice()
    }

    /// The router has processed the append `h` was given for: its pre-approval (or its count
    /// as unapproved) ends, on the session it was given in. `stored`: the store committed it
    /// (a pre-approved DELIVER it did not hand over closed the connection to the store
    /// thread).
    fn settle_handover(&mut self, name: &str, h: &Handover, stored: Option<(&StoredMessage, u64)>) {
        let Some(on) = session_on(&mut self.agents, name, h.conn_id) else {
            if let (true, Some(w), Some((msg, _))) = (h.handed, &h.writer, stored) {
                self.handed_to_ended(name, w, msg.pos);
            }
            self.orphan_settled(name, h, stored);
            return;
        };
        let stored = stored.is_some();
        if h.writer.is_some() {
            on.tickets = on.tickets.saturating_sub(1);
            on.resolved += 1;
            if stored && !h.handed {
                on.fallback = true;
            }
        } else {
            on.unapproved = on.unapproved.saturating_sub(1);
        }
    }

    /// The store thread handed the DELIVER at `pos` to a session that ended before the router
    /// recorded it: `end_session` covered only what the router had recorded, so the trace's
    /// "delivered" row and the handing-out attempt are written now, as `end_session` writes
    /// them for the rest (a delivery loaded after them says attempt 2, not 1 again).
    fn handed_to_ended(&mut self, name: &str, w: &Writer, pos: i64) {
        let recipient = name.to_owned();
        self.store(StoreCmd::Write(
            WriteOp::Sent {
                recipient: recipient.clone(),
                session_id: w.session_id.to_string(),
                after: pos - 1,
                through: pos,
                at: self.now.ms,
            },
            WriteCtx::None,
        ));
        self.store(StoreCmd::Write(
            WriteOp::HandedOut {
                recipient,
                after: pos - 1,
                through: pos,
            },
            WriteCtx::None,
        ));
    }

    /// Whether an ended session of `name` still has acknowledgements waiting to be written
    /// ([`Orphan`]).
    pub(super) fn orphaned(&self, name: &str) -> bool {
        self.orphans.values().any(|o| o.name == name)
    }

    /// [`Core::settle_handover`] for a session that has ended: an acknowledgement held for the
    /// DELIVER handed to it is written to the store now that its position is known.
    fn orphan_settled(&mut self, name: &str, h: &Handover, stored: Option<(&StoredMessage, u64)>) {
        let Some(orphan) = self.orphans.get_mut(&h.conn_id) else {
            return;
        };
        if h.writer.is_some() {
            orphan.tickets = orphan.tickets.saturating_sub(1);
        }
        let mut writes = Vec::new();
        if let (true, Some((msg, seq))) = (h.handed, stored) {
            orphan.held.retain(|held| {
                let write = match held {
                    Held::Ack {
                        ack_id,
                        seq: s,
                        state,
                        cumulative,
                        reason,
                        ..
                    } if *ack_id == msg.id && s.is_none_or(|s| s == seq) => Some(orphan_ack(
                        name,
                        msg.pos,
                        *state,
                        *cumulative,
                        reason.clone(),
                    )),
                    Held::Written { pos, .. } if *pos == msg.pos => Some((
                        WriteOp::SetStatus {
                            recipient: name.to_owned(),
                            pos: *pos,
                            status: DeliveryStatus::Acked,
                            reason: None,
                        },
                        WriteCtx::None,
                    )),
                    _ => None,
                };
                let hit = write.is_some();
                writes.extend(write);
                !hit
            });
        }
        let done = orphan.tickets == 0;
        if done {
            self.orphans.remove(&h.conn_id);
        }
        for (op, ctx) in writes {
            self.store(StoreCmd::Write(op, ctx));
        }
        // A new session of the name waited for these writes before loading what waits for
        // it (`register`): loaded now, after them in command order.
        if done && !self.orphaned(name) {
            self.advance_watermark(name);
        }
    }

    /// After an append's result: a connection whose pre-approved DELIVERs have all been
    /// processed since one came back not handed over is reopened to the store thread, and
    /// acknowledgements held for DELIVERs now recorded are applied.
    fn after_handovers(&mut self, recipients: &[String], online: &[Handover]) {
        for h in online {
            let Some(name) = recipients.get(h.index) else {
                continue;
            };
            let Some(on) = session_on(&mut self.agents, name, h.conn_id) else {
                continue;
            };
            if on.fallback && on.tickets == 0 {
                on.fallback = false;
                let conn_id = on.conn_id;
                self.store(StoreCmd::Reopen { conn_id });
            }
            self.release_held(name);
        }
    }

    pub(super) fn on_appended(
        &mut self,
        conn_id: u64,
        env_id: String,
        recipients: Vec<String>,
        raw: Option<Raw>,
        online: Box<[Handover]>,
        res: Result<WriteResult, String>,
    ) {
        let stored = match &res {
            Ok(WriteResult::Appended(AppendOutcome::Stored { message, .. })) => {
                Some(message.payload.budget.as_ref().map_or(0, |b| b.hops))
            }
            _ => None,
        };
        self.hops.settled(&env_id, conn_id, stored);
        if stored.is_none() {
            for h in &online {
                if let Some(name) = recipients.get(h.index) {
                    self.settle_handover(name, h, None);
                }
            }
            self.after_handovers(&recipients, &online);
        }
        let outcome = match res {
            Ok(WriteResult::Appended(o)) => o,
            Ok(other) => {
                tracing::error!(?other, "append answered with a non-append result");
                self.nack(
                    conn_id,
                    env_id,
                    NackCode::Unavailable,
                    "internal error; retry".into(),
                );
                return;
            }
            Err(e) => {
                self.nack(
                    conn_id,
                    env_id,
                    NackCode::Unavailable,
                    format!("the message could not be stored ({e}); nothing was delivered; retry"),
                );
                return;
            }
        };
        let (message, seqs) = match outcome {
            // The relay's own notice stored before (told once): not a sender's repeat.
            AppendOutcome::Duplicate { .. } if conn_id == NO_CONN => return,
            AppendOutcome::Duplicate { .. } => {
                self.feed.counters.duplicates.add(1);
                self.receipt(conn_id, env_id, AckStatus::Duplicate, None);
                return;
            }
            AppendOutcome::Taken { owner } => {
                // An id names one message, so that a full id always resolves (issue 24.7).
                // Nothing was stored: the sender chooses another id and sends again.
                tracing::warn!(id = %env_id, owner = %owner, "SEND refused: id already another sender's");
                let reason = format!(
                    "the id {:?} is already another sender's message ({}); nothing was stored; send again with a new id (a ULID)",
                    relay_protocol::text::one_line(&env_id, 64),
                    relay_protocol::text::one_line(&owner, 64)
                );
                self.nack(conn_id, env_id, NackCode::Invalid, reason);
                return;
            }
            AppendOutcome::Stored { message, seqs } => (message, seqs),
        };
        self.feed.counters.accepted.add(1);
        self.feed.emit(|| {
            let (body, truncated) = excerpt(&message.payload.body);
            RelayEvent::Accepted {
                ts: message.ts,
                id: message.id.clone(),
                pos: message.pos,
                from: message.from.clone(),
                to: message.to.clone(),
                topic: message.topic.clone(),
                kind: message.payload.kind,
                thread: message.payload.thread.clone(),
                body,
                truncated,
                recipients: recipients.clone(),
            }
        });
        let thread = message
            .payload
            .thread
            .clone()
            .unwrap_or_else(|| message.id.clone());
        if let Some(sender) = self.agents.get_mut(&message.from) {
            sender.sent += 1;
            sender.activity = self.now.ms;
            sender.thread = Some(thread.clone());
        }
        // A recipient nobody has connected as yet (`names.rs`): the message waits for it like
        // one for an offline agent, and its sender is told.
        let not_yet = match recipients.as_slice() {
            [only]
                if *only == message.to
                    && !self.agents.contains_key(only)
                    && !self.is_person(only) =>
            {
                Some(only.clone())
            }
            _ => None,
        };
        let mut any_online = false;
        let mut busy: Vec<(String, u64)> = Vec::new();
        let mut slow: Vec<String> = Vec::new();
        let mut handovers = online.iter().peekable();
        for (index, (name, seq)) in recipients.iter().zip(seqs).enumerate() {
            let handover = handovers.next_if(|h| h.index == index);
            if let Some(h) = handover {
                self.settle_handover(name, h, Some((&message, seq)));
            }
            let Some(agent) = self.agents.get_mut(name) else {
                continue;
            };
            agent.received += 1;
            agent.activity = self.now.ms;
            agent.thread = Some(thread.clone());
            let Some(on) = agent.online.as_mut() else {
                // An offline inbox passing the high-water mark: warn once per crossing and
                // tell the sender, as for an online recipient far behind.
                agent.offline_backlog += 1;
                if agent.offline_backlog == self.cfg.busy_high_water {
                    tracing::warn!(
                        agent = %name,
                        pending = agent.offline_backlog,
                        "an offline agent's inbox passed the high-water mark; its messages wait (and expire after the inbox TTL)"
                    );
                    busy.push((name.clone(), agent.offline_backlog));
                }
                continue;
            };
            any_online = true;
            if handover.is_some_and(|h| h.handed && h.conn_id == on.conn_id) {
                // The store thread queued it on this session's writer: recorded, not sent.
                if on.sent(message.pos, message.id.clone(), seq, self.now.ms) {
                    self.dirty.insert(name.clone());
                }
                self.feed.counters.delivered.add(1);
                self.feed
                    .emit(|| delivered_event(&message, name, seq, 1, self.now.ms));
                continue;
            }
            // Not handed over (or handed to a session that has since ended: that one is
            // gone with it, and the message waits as any other): delivered as before.
            if on.can_send_live() {
                match on.dispatch(message.clone(), seq, 1, raw.clone(), self.now.ms) {
                    Err(SlowConsumer) => slow.push(name.clone()),
                    Ok(dirty) => {
                        if dirty {
                            self.dirty.insert(name.clone());
                        }
                        self.feed.counters.delivered.add(1);
                        self.feed
                            .emit(|| delivered_event(&message, name, seq, 1, self.now.ms));
                    }
                }
            } else {
                if on.mode == Mode::Live {
                    on.mode = Mode::CatchUp { loading: false };
                }
                on.backlog += 1;
                if on.backlog >= self.cfg.busy_high_water {
                    let sender = self
                        .conns
                        .get(&conn_id)
                        .map(|c| c.name.clone())
                        .unwrap_or_default();
                    let told = on
                        .busy_told
                        .get(&sender)
                        .is_some_and(|t| self.now.at.duration_since(*t) < Duration::from_secs(1));
                    if !told {
                        on.busy_told.insert(sender, self.now.at);
                        busy.push((name.clone(), on.backlog));
                    }
                }
            }
        }
        let status = if recipients.is_empty() || any_online {
            AckStatus::Accepted
        } else {
            AckStatus::Queued
        };
        let count = Some(u32::try_from(recipients.len()).unwrap_or(u32::MAX));
        match not_yet {
            Some(name) => self.tell_not_yet(conn_id, env_id, &message, name, count),
            None => self.receipt(conn_id, env_id, status, count),
        }
        for (target, pending) in busy {
            tracing::warn!(%target, pending, "recipient is far behind; telling sender BUSY");
            self.reply(
                conn_id,
                Payload::Busy(Busy {
                    retry_after_ms: 1000,
                    target: Some(target),
                    pending,
                }),
            );
        }
        self.after_handovers(&recipients, &online);
        for name in slow {
            self.drop_slow(&name);
        }
    }

    pub(super) fn on_pending(
        &mut self,
        recipient: String,
        conn_id: u64,
        deliveries: Result<Vec<relay_store::PendingDelivery>, String>,
        limit: usize,
    ) {
        let Some(on) = self
            .agents
            .get_mut(&recipient)
            .and_then(|a| a.online.as_mut())
            .filter(|o| o.conn_id == conn_id)
        else {
            return;
        };
        let deliveries = match deliveries {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, %recipient, "could not load queued messages; will retry");
                on.mode = Mode::CatchUp { loading: false };
                return;
            }
        };
        let n = deliveries.len();
        let mut slow = false;
        // The circuit may have opened while the page was loading: what is left waits.
        let mut held = false;
        for d in deliveries {
            if d.message.pos <= on.last_sent {
                continue;
            }
            if on.in_use() >= on.room_limit() {
                held = true;
                break;
            }
            let event = self
                .feed
                .watched()
                .then(|| delivered_event(&d.message, &recipient, d.seq, d.attempt, self.now.ms));
            match on.dispatch(d.message, d.seq, d.attempt, None, self.now.ms) {
                Err(SlowConsumer) => {
                    slow = true;
                    break;
                }
                Ok(dirty) => {
                    if dirty {
                        self.dirty.insert(recipient.clone());
                    }
                    self.feed.counters.delivered.add(1);
                    if let Some(ev) = event {
                        self.feed.emit(|| ev);
                    }
                }
            }
        }
        on.backlog = on.backlog.saturating_sub(n as u64);
        if n < limit && !held {
            on.mode = Mode::Live;
            on.backlog = 0;
        } else {
            on.mode = Mode::CatchUp { loading: false };
        }
        if slow {
            self.drop_slow(&recipient);
            return;
        }
        self.advance_watermark(&recipient);
    }

    /// Hands a re-queued delivery to its recipient at once if it is online (it is below what
    /// the session has been sent, so paging would not find it); otherwise it waits in the
    /// inbox for the next connection.
    pub(super) fn redeliver(&mut self, recipient: &str, d: relay_store::PendingDelivery) -> String {
        let Some(on) = self
            .agents
            .get_mut(recipient)
            .and_then(|a| a.online.as_mut())
        else {
            return format!(
                "queued again for {recipient}, who is offline: it is delivered when {recipient} connects"
            );
        };
        let pos = d.message.pos;
        let session_id = on.session_id.to_string();
        match on.dispatch(d.message, d.seq, d.attempt, None, self.now.ms) {
            Err(SlowConsumer) => {
                self.drop_slow(recipient);
                format!("queued again for {recipient}")
            }
            Ok(_) => {
                // Below the session's trace range: recorded on its own.
                self.store(StoreCmd::Write(
                    WriteOp::Sent {
                        recipient: recipient.to_owned(),
                        session_id,
                        after: pos - 1,
                        through: pos,
                        at: self.now.ms,
                    },
                    WriteCtx::None,
                ));
                self.dirty.insert(recipient.to_owned());
                format!("queued again for {recipient} and delivered (online)")
            }
        }
    }

    /// Acts on a dead letter taken out of the queue, and says what was done.
    pub(crate) fn retried(&mut self, outcome: RetryOutcome, now: Now) -> QueryResult {
        self.now = now;
        match outcome {
            RetryOutcome::Requeued {
                recipient,
                delivery,
                entry,
            } => {
                let outcome = self.redeliver(&recipient, delivery);
                QueryResult::DlqRetry {
                    dead_letter: entry,
                    outcome,
                }
            }
            RetryOutcome::Resend { message, entry } => {
                let origin = Origin {
                    conn_id: NO_CONN,
                    from: message.from.clone(),
                    session_id: None,
                    checked: true,
                };
                let to = Some(message.to.clone()).filter(|t| t != "*" || message.topic.is_none());
                self.route(origin, message.id, to, message.topic, message.payload, None);
                QueryResult::DlqRetry {
                    outcome: format!(
                        "sent again as {} (past rate limits and budgets); `agent-relay trace {}` shows what became of it",
                        entry.from, entry.msg_id
                    ),
                    dead_letter: entry,
                }
            }
            RetryOutcome::AlreadyRetried(entry) => QueryResult::Error {
                code: "invalid".into(),
                message: format!(
                    "dead letter {} was already retried; `agent-relay trace {}` shows what became of it",
                    entry.dlq_id, entry.msg_id
                ),
            },
            RetryOutcome::NotFound => QueryResult::Error {
                code: "not_found".into(),
                message: "no such dead letter; `agent-relay dlq list` shows them".into(),
            },
        }
    }

    /// Circuits whose cool-down is over go half open: one message is tried.
    pub(super) fn probe_circuits(&mut self) {
        let now = self.now.at;
        let mut due = Vec::new();
        for (name, a) in &mut self.agents {
            if let Some(on) = a.online.as_mut()
                && let Circuit::Open { until, cooldown } = on.circuit
                && until <= now
            {
                on.circuit = Circuit::HalfOpen { cooldown };
                due.push(name.clone());
            }
        }
        for name in due {
            tracing::info!(agent = %name, "circuit half open: trying one message");
            self.advance_watermark(&name);
        }
    }
}

/// The store write for an acknowledgement held for a DELIVER handed to a session that has
/// ended, once the DELIVER's position is known: its state, or for a cumulative one everything
/// the session was handed up to it (deliveries to one session go out in position order).
fn orphan_ack(
    name: &str,
    pos: i64,
    state: Option<DeliveryState>,
    cumulative: bool,
    reason: Option<String>,
) -> (WriteOp, WriteCtx) {
    let recipient = name.to_owned();
    match state {
        Some(DeliveryState::Failed) => (
            WriteOp::SetStatus {
                recipient,
                pos,
                status: DeliveryStatus::Failed,
                reason,
            },
            WriteCtx::Notify,
        ),
        Some(DeliveryState::Verified) => (
            WriteOp::SetStatus {
                recipient,
                pos,
                status: DeliveryStatus::Verified,
                reason,
            },
            WriteCtx::Notify,
        ),
        Some(DeliveryState::Injected) | None if cumulative => (
            WriteOp::AckThrough {
                recipient,
                through: pos,
            },
            WriteCtx::None,
        ),
        Some(DeliveryState::Injected) | None => (
            WriteOp::SetStatus {
                recipient,
                pos,
                status: DeliveryStatus::Acked,
                reason: None,
            },
            WriteCtx::None,
        ),
    }
}
