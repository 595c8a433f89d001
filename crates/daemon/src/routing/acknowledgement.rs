//! Acknowledgement: a recipient's ACK (or, for an `ack: false` peer, its reading of the socket)
//! ends a copy's flight; watermarks move per stream and are written in batches; a copy that ends
//! in a dead letter is told to its sender as a relay notice.

use super::*;

impl Core {
    /// An ACK (or, as `state: failed`, a NACK) of a DELIVER from connection `conn_id`.
    /// `reason`: a NACK's, kept as the dead letter's reason.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_ack(
        &mut self,
        conn_id: u64,
        ack_id: &str,
        seq: Option<u64>,
        state: Option<DeliveryState>,
        cumulative: bool,
        reason: Option<String>,
        now: Now,
    ) {
        self.now = now;
        let ack = Held::Ack {
            ack_id: ack_id.to_owned(),
            seq,
            state,
            cumulative,
            reason,
            until: 0,
        };
        self.apply(conn_id, ack, true);
    }

    /// Applies an acknowledgement ([`Held::Ack`] or [`Held::Written`]) from connection
    /// `conn_id`; `may_hold`: one about nothing in flight is held while pre-approved DELIVERs
    /// are outstanding (see [`Held`]).
    fn apply(&mut self, conn_id: u64, held: Held, may_hold: bool) {
        if may_hold
            && let Some((_, on)) = online_mut(&self.conns, &mut self.agents, conn_id)
            && on.tickets > 0
        {
            let early = match &held {
                Held::Ack { ack_id, seq, .. } => on.find(ack_id, *seq).is_none(),
                Held::Written { pos, .. } => !on.inflight.contains_key(pos),
            };
            if early {
                let mut held = held;
                let (Held::Ack { until, .. } | Held::Written { until, .. }) = &mut held;
                *until = on.issued;
                on.held.push(held);
                return;
            }
        }
        match held {
            Held::Ack {
                ack_id,
                seq,
                state,
                cumulative,
                reason,
                ..
            } => self.ack(conn_id, &ack_id, seq, state, cumulative, reason),
            Held::Written { pos, .. } => self.written(conn_id, &[pos]),
        }
    }

    /// Applies the acknowledgements held for recipient `name` whose DELIVER is now recorded as
    /// sent, or which waited for every pre-approval outstanding when they came.
    pub(super) fn release_held(&mut self, name: &str) {
        let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.as_mut()) else {
            return;
        };
        if on.held.is_empty() {
            return;
        }
        let conn_id = on.conn_id;
        let resolved = on.resolved;
        let mut keep = Vec::new();
        for h in std::mem::take(&mut on.held) {
            let Some((_, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
                return;
            };
            let due = match &h {
                Held::Ack {
                    ack_id, seq, until, ..
                } => on.find(ack_id, *seq).is_some() || resolved >= *until,
                Held::Written { pos, until } => on.inflight.contains_key(pos) || resolved >= *until,
            };
            if due {
                self.apply(conn_id, h, false);
            } else {
                keep.push(h);
            }
        }
        if let Some((_, on)) = online_mut(&self.conns, &mut self.agents, conn_id) {
            on.held.extend(keep);
        }
    }

    fn ack(
        &mut self,
        conn_id: u64,
        ack_id: &str,
        seq: Option<u64>,
        state: Option<DeliveryState>,
        cumulative: bool,
        reason: Option<String>,
    ) {
        // A federation's stand-in reports failures on another node (a dead letter there), not
        // a recipient that cannot take messages: they never pause its deliveries.
        let standin = self
            .conns
            .get(&conn_id)
            .is_some_and(|c| c.remote_node.is_some());
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        let failed = state == Some(DeliveryState::Failed);
        let opened = if failed && !standin {
            on.failed(
                self.cfg.breaker_failures,
                self.cfg.breaker_cooldown,
                self.now.at,
            )
        } else {
            on.succeeded();
            false
        };
        if opened {
            tracing::warn!(
                agent = %name,
                failures = on.failures,
                "circuit open: the agent keeps failing to take messages; they wait in its inbox until a probe succeeds"
            );
        }
        let Some(pos) = on.find(ack_id, seq) else {
            // A later state (verified, failed) of a message already acknowledged as injected.
            let status = match state {
                Some(DeliveryState::Failed) => DeliveryStatus::Failed,
                Some(DeliveryState::Verified) => DeliveryStatus::Verified,
                Some(DeliveryState::Injected) | None => {
                    tracing::debug!(agent = %name, ack_id, "ACK for nothing in flight (already acknowledged?)");
                    return;
                }
            };
            // Verified means it was injected, and that acknowledgement may still wait in the
            // watermark (range updates are committed after other writes): record it first,
            // so the trace keeps both. (It changes nothing if it is already stored.)
            if status == DeliveryStatus::Verified {
                self.store(StoreCmd::Write(
                    WriteOp::MarkById {
                        recipient: name.clone(),
                        msg_id: ack_id.to_owned(),
                        status: DeliveryStatus::Acked,
                        reason: None,
                    },
                    WriteCtx::None,
                ));
            }
            self.store(StoreCmd::Write(
                WriteOp::MarkById {
                    recipient: name,
                    msg_id: ack_id.to_owned(),
                    status,
                    reason,
                },
                WriteCtx::Notify,
            ));
            return;
        };
        // Below the watermark already written (a retried dead letter): the range update will
        // not come back down for it.
        let below = pos <= on.acked_through;
        let (range, single) = if cumulative {
            // Everything delivered on this connection up to `pos` (deliveries go out in
            // position order).
            let rest = on.inflight.split_off(&(pos + 1));
            (Some(std::mem::replace(&mut on.inflight, rest)), None)
        } else {
            (None, on.inflight.remove_entry(&pos))
        };
        let n_acked = range.as_ref().map_or(1, BTreeMap::len);
        let status = match state {
            Some(DeliveryState::Failed) => Some(DeliveryStatus::Failed),
            Some(DeliveryState::Verified) => Some(DeliveryStatus::Verified),
            Some(DeliveryState::Injected) | None => below.then_some(DeliveryStatus::Acked),
        };
        let counters = &self.feed.counters;
        counters.acked.add(n_acked as u64);
        if status == Some(DeliveryStatus::Failed) {
            counters.failed.add(1);
        }
        if self.feed.watched() {
            let ts = self.now.ms;
            for (p, (id, _)) in range.into_iter().flatten().chain(single) {
                // A state other than plain acknowledgement applies to `ack_id` only.
                let state = status.filter(|_| p == pos).unwrap_or(DeliveryStatus::Acked);
                self.feed.emit(|| RelayEvent::Acked {
                    ts,
                    id,
                    pos: p,
                    recipient: name.clone(),
                    state,
                });
            }
        }
        if let Some(status) = status {
            self.store(StoreCmd::Write(
                WriteOp::SetStatus {
                    recipient: name.clone(),
                    pos,
                    status,
                    // A failure's reason, or the door that showed a verified message to
                    // its agent's model (`trace` names it).
                    reason: reason.filter(|_| {
                        matches!(status, DeliveryStatus::Failed | DeliveryStatus::Verified)
                    }),
                },
                WriteCtx::Notify,
            ));
        }
        self.advance_watermark(&name);
    }

    /// DELIVERs read off the socket by a connection that does not acknowledge: that is their
    /// acknowledgement. (What was queued, or written and never read, stays in flight, and
    /// `end_session` leaves it pending for the next connection.)
    pub(crate) fn on_written(&mut self, conn_id: u64, positions: &[i64], now: Now) {
        self.now = now;
        let early = online_mut(&self.conns, &mut self.agents, conn_id)
            .is_some_and(|(_, on)| on.tickets > 0 && !on.ack_required);
        if early {
            // Some may have been handed over by the store thread and not yet recorded.
            for &pos in positions {
                self.apply(conn_id, Held::Written { pos, until: 0 }, true);
            }
        } else {
            self.written(conn_id, positions);
        }
    }

    fn written(&mut self, conn_id: u64, positions: &[i64]) {
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        if on.ack_required {
            return;
        }
        let watched = self.feed.watched();
        let ts = self.now.ms;
        let mut below = Vec::new();
        let mut n = 0u64;
        for &pos in positions {
            let Some((id, _)) = on.inflight.remove(&pos) else {
                continue;
            };
            n += 1;
            // Below the watermark already written (a retried dead letter): the range update
            // will not come back down for it.
            if pos <= on.acked_through {
                below.push(pos);
            }
            if watched {
                self.feed.emit(|| RelayEvent::Acked {
                    ts,
                    id,
                    pos,
                    recipient: name.clone(),
                    state: DeliveryStatus::Acked,
                });
            }
        }
        self.feed.counters.acked.add(n);
        for pos in below {
            self.store(StoreCmd::Write(
                WriteOp::SetStatus {
                    recipient: name.clone(),
                    pos,
                    status: DeliveryStatus::Acked,
                    reason: None,
                },
                WriteCtx::None,
            ));
        }
        self.advance_watermark(&name);
    }

    /// Notes a moved acknowledgement watermark (written to the store in the next flush) and
    /// loads the next page when catching up.
    pub(super) fn advance_watermark(&mut self, name: &str) {
        let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.as_mut()) else {
            return;
        };
        if on.watermark() > on.acked_through && !self.dirty.contains(name) {
            self.dirty.insert(name.to_owned());
        }
        let room = on.room_limit();
        let in_use = on.in_use();
        if on.mode == (Mode::CatchUp { loading: false })
            && in_use < room
            && (room < on.window || in_use <= on.window / 2)
        {
            on.mode = Mode::CatchUp { loading: true };
            let cmd = StoreCmd::TakePending {
                recipient: name.to_owned(),
                conn_id: on.conn_id,
                after: on.last_sent,
                limit: room - in_use,
            };
            self.store(cmd);
        }
    }

    /// Writes every moved watermark: one range update per recipient instead of one write per
    /// acknowledgement.
    pub(crate) fn flush_watermarks(&mut self) {
        let dirty: Vec<String> = self.dirty.drain().collect();
        for name in dirty {
            let Some(on) = self.agents.get_mut(&name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            let trace = on.take_trace(&name);
            let through = on.watermark();
            if let Some(op) = trace {
                self.store(StoreCmd::Write(op, WriteCtx::None));
            }
            let Some(on) = self.agents.get_mut(&name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            if through > on.acked_through {
                on.acked_through = through;
                self.store(StoreCmd::Write(
                    WriteOp::AckThrough {
                        recipient: name,
                        through,
                    },
                    WriteCtx::None,
                ));
            }
        }
    }

    /// Tells the senders of undelivered messages, with a message from [`RELAY`] stored in
    /// their inbox like any other (so an offline sender gets it when it comes back). Never for
    /// a notice, so notices cannot beget notices. Each is then marked told; one made just
    /// before a crash is told at the next start (`unnotified`), and because a notice's id is
    /// its dead letter's number, telling it twice stores it once.
    pub(crate) fn notify(&mut self, notices: Vec<DeadNotice>) {
        for n in notices {
            let told = WriteOp::Notified { dlq_id: n.dlq_id };
            if n.from == RELAY || !self.agents.contains_key(&n.from) {
                self.store(StoreCmd::Write(told, WriteCtx::None));
                continue;
            }
            let short = relay_protocol::short_id(&n.msg_id);
            let body = format!(
                "relay: your message [{short}] to {} was not delivered ({}): {}. It is dead letter {}; `agent-relay dlq retry {}` sends it again.",
                n.recipient, n.code, n.reason, n.dlq_id, n.dlq_id
            );
            let data = serde_json::json!({"relay_notice": {
                "msg_id": n.msg_id, "recipient": n.recipient, "code": n.code,
                "reason": n.reason, "dlq_id": n.dlq_id,
            }});
            let id = format!("dead-letter-{}", n.dlq_id);
            self.relay_notice(n.from, id, Some(&n.msg_id), body, data);
            // After the notice in command order, so at worst a crash repeats the notice
            // (stored once), never loses it.
            self.store(StoreCmd::Write(told, WriteCtx::None));
        }
    }

    /// Stores a message from [`RELAY`] to `to` about its message `about` (an answer to it, in
    /// its chain; `None`: about no message of theirs, as a claim's or a worker's notice),
    /// delivered like any other. `id` names the notice so that telling it twice
    /// stores it once.
    pub(super) fn relay_notice(
        &mut self,
        to: String,
        id: String,
        about: Option<&str>,
        body: String,
        data: serde_json::Value,
    ) {
        // A notice about no message (a claim, a spawned worker) starts no chain.
        let hops = about.map_or(0, |a| self.hops.reply_hops(a));
        let payload = Send {
            kind: relay_protocol::Kind::Message,
            body,
            data: Some(data),
            thread: None,
            in_reply_to: about.map(str::to_owned),
            budget: Some(Budget {
                hops,
                max_hops: self.cfg.max_hops,
                expires_at: None,
            }),
            urgent: false,
            origin: None,
        };
        let new = NewMessage {
            id: id.clone(),
            from: RELAY.to_owned(),
            to: to.clone(),
            topic: None,
            payload,
            session_id: None,
            recipients: vec![Recipient { name: to.clone() }],
            queued_at: None,
        };
        let recipients = vec![to];
        let online = self.handovers(&recipients);
        self.hops.admitted(&id, NO_CONN, hops);
        self.store(StoreCmd::Write(
            WriteOp::Append(new),
            WriteCtx::Send {
                conn_id: NO_CONN,
                env_id: id,
                recipients,
                raw: None,
                online,
            },
        ));
    }

    /// The chain of `thread` may run `extra` replies beyond `max_hops` (its stored extension
    /// in all); returns its limit now.
    pub(crate) fn chain_extended(&mut self, thread: String, extra: u32) -> u32 {
        self.chains.insert(thread, extra);
        self.cfg.max_hops.saturating_add(extra)
    }

    /// The hop limit of a message in `thread`: the relay's, plus what a person allowed it.
    pub(super) fn max_hops_in(&self, thread: Option<&str>) -> u32 {
        let extra = thread.and_then(|t| self.chains.get(t)).copied();
        self.cfg.max_hops.saturating_add(extra.unwrap_or(0))
    }
}
