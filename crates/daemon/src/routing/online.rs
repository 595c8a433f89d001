//! Online: who is connected and what their terminals say. A HELLO taken or refused
//! (`register`), a connection gone (`unregister`, `end_session`), a slow reader closed, topic
//! subscriptions, terminal reports (busy, idle, blocked) and the agent list others read.

use super::*;

impl Core {
    /// A HELLO that passed validation: registers the connection, queues WELCOME (with the
    /// fresh `session_id` and `resume_token` the shell drew; an agent's once the store has it
    /// as known, [`WriteCtx::Welcome`]) and, for an agent, asks the store for what waits for
    /// it. A second connection for a connected agent's name is refused
    /// unless it presents that session's resume token (then it takes over).
    pub(crate) fn register(
        &mut self,
        conn: ConnHandle,
        hello: Hello,
        session_id: Arc<str>,
        resume_token: String,
        now: Now,
    ) -> Result<(), (ErrorCode, String)> {
        self.now = now;
        // A federation link speaks for several names (issue 28.8): only the relay's own
        // process opens one, never a local client (which could then speak as anyone).
        if hello.role == Role::Link && !conn.in_process {
            return Err((
                ErrorCode::Forbidden,
                "only this relay's own federation link may open a link connection (one connection speaking for several names); connect as an agent under one name".into(),
            ));
        }
        let mut resumed = false;
        let person_door = hello.cli.as_deref() == Some(relay_protocol::PERSON_CLI);
        self.may_take(&hello.agent, hello.role, conn.in_process, person_door)?;
        let holder = self.agents.get(&hello.agent);
        let live = holder.and_then(|a| a.online.as_ref());
        if hello.role == Role::Agent
            && let Some(old) = live
        {
            if hello.resume_token.as_deref() != Some(old.resume_token.as_str()) {
                // A federation stand-in holds it: the name is an agent's of another node.
                let message = match holder.and_then(|a| remote_node(a.cli.as_deref())) {
                    Some(node) => format!(
                        "the name {:?} is held by node {node} in the federation (an agent of that node has it); choose another name",
                        hello.agent
                    ),
                    None => format!(
                        "an agent named {:?} is already connected; choose another name or stop the other one",
                        hello.agent
                    ),
                };
                return Err((ErrorCode::NameInUse, message));
            }
            old.killer.kill(
                ErrorCode::NameInUse,
                "replaced by a new connection presenting this session's resume token".into(),
            );
            self.conns.remove(&old.conn_id);
            if let Some(old) = self
                .agents
                .get_mut(&hello.agent)
                .and_then(|a| a.online.take())
            {
                self.end_session(&hello.agent, &old);
            }
            resumed = true;
        }
        let welcome = Payload::Welcome(Welcome {
            session_id: session_id.to_string(),
            resume_token: resume_token.clone(),
            server: ServerInfo {
                max_frame_bytes: u32::try_from(self.cfg.max_frame_bytes).unwrap_or(u32::MAX),
                heartbeat_ms: u64::try_from(self.cfg.heartbeat.as_millis()).unwrap_or(u64::MAX),
            },
            resumed,
            agent: conn.attach.then(|| hello.agent.clone()),
        });
        // A tool connection (or a link's own) is welcomed at once; an agent once it is stored
        // as known (below).
        if hello.role != Role::Agent
            && conn
                .tx
                .try_send(Outbound::Control(Box::new(welcome.clone())))
                .is_err()
        {
            return Err((ErrorCode::Internal, "connection queue unavailable".into()));
        }
        self.conns.insert(
            conn.id,
            Conn {
                name: hello.agent.clone(),
                role: hello.role,
                remote_node: remote_node(hello.cli.as_deref()).map(str::to_owned),
                tx: conn.tx.clone(),
                killer: conn.killer.clone(),
                watch: None,
            },
        );
        if hello.role != Role::Agent {
            return Ok(());
        }
        let window = (hello.capabilities.max_inflight as usize).clamp(1, self.cfg.max_window);
        // Acknowledgements of an ended session of this name still wait for their positions
        // ([`Orphan`]): what waits is loaded once they are written, not before.
        let after_orphans = self.orphaned(&hello.agent);
        self.fold_in(&hello.agent);
        let agent = self.agents.entry(hello.agent.clone()).or_default();
        agent.cli = hello.cli.clone();
        agent.connected_at = self.now.ms;
        agent.activity = self.now.ms;
        agent.offline_backlog = 0;
        agent.online = Some(Online {
            conn_id: conn.id,
            terminal: None,
            state_since: self.now.ms,
            handing_since: self.now.ms,
            terminal_told: None,
            terminal_pending: false,
            tx: conn.tx,
            killer: conn.killer,
            session_id: session_id.clone(),
            resume_token,
            ack_required: hello.capabilities.ack,
            window,
            mode: Mode::CatchUp {
                loading: !after_orphans,
            },
            last_sent: 0,
            inflight: BTreeMap::new(),
            acked_through: 0,
            backlog: 0,
            busy_told: HashMap::new(),
            traced_through: 0,
            trace_since: None,
            failures: 0,
            circuit: Circuit::Closed,
            tickets: 0,
            issued: 0,
            resolved: 0,
            unapproved: 0,
            fallback: false,
            held: Vec::new(),
        });
        tracing::info!(agent = %hello.agent, cli = ?hello.cli, resumed, "agent connected");
        self.feed.counters.connects.add(1);
        self.feed.emit(|| RelayEvent::AgentConnected {
            ts: self.now.ms,
            agent: hello.agent.clone(),
            cli: hello.cli.clone(),
            resumed,
        });
        self.store(StoreCmd::Write(
            WriteOp::AgentConnected {
                name: hello.agent.clone(),
                cli: hello.cli,
                session_id: session_id.to_string(),
            },
            WriteCtx::Welcome {
                conn_id: conn.id,
                welcome: Box::new(welcome),
            },
        ));
        // Replay whatever waits for it (offline inbox, unacknowledged deliveries).
        if !after_orphans {
            self.store(StoreCmd::TakePending {
                recipient: hello.agent,
                conn_id: conn.id,
                after: 0,
                limit: window,
            });
        }
        self.agents_changed = true;
        Ok(())
    }

    /// The connection is gone: its session ends.
    pub(crate) fn unregister(&mut self, conn_id: u64, now: Now) {
        self.now = now;
        let Some(conn) = self.conns.remove(&conn_id) else {
            return;
        };
        if conn.role != Role::Agent {
            return;
        }
        let Some(agent) = self.agents.get_mut(&conn.name) else {
            return;
        };
        let Some(online) = agent.online.take_if(|o| o.conn_id == conn_id) else {
            return;
        };
        tracing::info!(agent = %conn.name, inflight = online.inflight.len(), "agent disconnected");
        self.end_session(&conn.name, &online);
        self.store(StoreCmd::Write(
            WriteOp::AgentDisconnected {
                name: conn.name,
                session_id: online.session_id.to_string(),
            },
            WriteCtx::None,
        ));
        self.agents_changed = true;
    }

    pub(super) fn drop_slow(&mut self, name: &str) {
        if let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.take()) {
            tracing::warn!(agent = %name, "connection does not read its frames: closing it (its messages stay queued)");
            on.killer.kill(
                ErrorCode::SlowConsumer,
                "this connection did not read its frames; reconnect to receive the queued messages"
                    .into(),
            );
            self.end_session(name, &on);
        }
    }

    /// Records what an ending session had been handed without acknowledging: its acknowledged
    /// watermark, and one more attempt for everything it held above it. Everything at or below
    /// `last_sent` was handed out (live and catch-up sends both go in position order).
    pub(super) fn end_session(&mut self, name: &str, on: &Online) {
        self.feed.emit(|| RelayEvent::AgentDisconnected {
            ts: self.now.ms,
            agent: name.to_owned(),
        });
        self.dirty.remove(name);
        // The store thread may hold the connection closed, or still hand it DELIVERs
        // pre-approved before it ended: those reach a connection that is gone, and the
        // messages wait in the store as the rest of what it held (the DELIVERs it handed are
        // above `last_sent`, which is all the store counts as handed out). After them in
        // command order, the store forgets the connection.
        if on.tickets > 0 || on.fallback {
            self.store(StoreCmd::Reopen {
                conn_id: on.conn_id,
            });
        }
        if on.tickets > 0 && !on.held.is_empty() {
            self.orphans.insert(
                on.conn_id,
                Orphan {
                    name: name.to_owned(),
                    tickets: on.tickets,
                    held: on.held.clone(),
                },
            );
        }
        if let Some(at) = on.trace_since
            && on.last_sent > on.traced_through
        {
            self.store(StoreCmd::Write(
                WriteOp::Sent {
                    recipient: name.to_owned(),
                    session_id: on.session_id.to_string(),
                    after: on.traced_through,
                    through: on.last_sent,
                    at,
                },
                WriteCtx::None,
            ));
        }
        let through = on.watermark();
        if through > on.acked_through {
            self.store(StoreCmd::Write(
                WriteOp::AckThrough {
                    recipient: name.to_owned(),
                    through,
                },
                WriteCtx::None,
            ));
        }
        if on.last_sent > through {
            self.store(StoreCmd::Write(
                WriteOp::HandedOut {
                    recipient: name.to_owned(),
                    after: through,
                    through: on.last_sent,
                },
                WriteCtx::None,
            ));
        }
    }

    /// SUBSCRIBE (`on`) or UNSUBSCRIBE from connection `conn_id`.
    pub(crate) fn on_subscribe(
        &mut self,
        conn_id: u64,
        id: String,
        pattern: Option<String>,
        on: bool,
        now: Now,
    ) {
        self.now = now;
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.role != Role::Agent {
            self.nack(
                conn_id,
                id,
                NackCode::Invalid,
                "only agents can subscribe to topics".into(),
            );
            return;
        }
        let Some(pattern) = pattern else {
            self.nack(
                conn_id,
                id,
                NackCode::Invalid,
                "SUBSCRIBE needs a topic pattern in `topic`".into(),
            );
            return;
        };
        if let Err(e) = validate_topic_pattern(&pattern) {
            self.nack(
                conn_id,
                id,
                NackCode::Invalid,
                format!("bad topic pattern: {e}"),
            );
            return;
        }
        let name = conn.name.clone();
        if let Some(agent) = self.agents.get_mut(&name) {
            if on {
                agent.topics.insert(pattern.clone());
            } else {
                agent.topics.remove(&pattern);
            }
        }
        let op = if on {
            WriteOp::Subscribe {
                agent: name,
                pattern,
            }
        } else {
            WriteOp::Unsubscribe {
                agent: name,
                pattern,
            }
        };
        self.store(StoreCmd::Write(op, WriteCtx::None));
        self.receipt(conn_id, id, AckStatus::Accepted, None);
        self.agents_changed = true;
    }

    pub(crate) fn live_agents(&self) -> Vec<LiveAgent> {
        self.agents
            .iter()
            .map(|(name, a)| LiveAgent {
                name: name.clone(),
                sent: a.sent,
                received: a.received,
                inflight: a.online.as_ref().map_or(0, |o| o.inflight.len() as u64),
                terminal: a.online.as_ref().and_then(|o| o.terminal.clone()),
            })
            .collect()
    }

    /// A wrapper's report of its agent's terminal: kept while it is connected, and told to
    /// the live feed when it changes.
    pub(crate) fn on_terminal(&mut self, conn_id: u64, mut report: TerminalReport, now: Now) {
        self.now = now;
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        // Shown on a dashboard and in `watch`: short, whatever a client sends.
        report.backend = excerpt_of(&report.backend, 16).0;
        report.why = report.why.map(|w| excerpt_of(&w, 120).0);
        if on.terminal.as_ref() == Some(&report) {
            return;
        }
        let before = on.terminal.as_ref().map(|t| t.state);
        let after = report.state;
        if before != Some(after) {
            on.state_since = self.now.ms;
        }
        on.terminal = Some(report);
        on.terminal_pending = true;
        let due = on.terminal_due(self.now.at);
        if before != Some(after) {
            self.spawn_state_changed(&name, before, after);
        }
        if let Some(report) = due {
            self.emit_terminal(name, report);
        }
    }

    /// Tells the live feed the reports held back by [`STATE_EVERY`] (from the 1 s tick).
    pub(super) fn flush_terminal_states(&mut self) {
        let now = self.now.at;
        let due: Vec<(String, TerminalReport)> = self
            .agents
            .iter_mut()
            .filter_map(|(name, a)| Some((name.clone(), a.online.as_mut()?.terminal_due(now)?)))
            .collect();
        for (name, report) in due {
            self.emit_terminal(name, report);
        }
    }

    pub(super) fn emit_terminal(&self, agent: String, report: TerminalReport) {
        self.feed.emit(|| RelayEvent::AgentState {
            ts: self.now.ms,
            agent,
            backend: report.backend,
            state: report.state,
            why: report.why,
        });
    }

    /// Fills in what only the router knows (online, live subscriptions) in the store's agent
    /// list, online first.
    pub(crate) fn complete_agents(&self, agents: &mut [relay_protocol::query::AgentInfo]) {
        for a in agents.iter_mut() {
            if let Some(live) = self.agents.get(&a.name) {
                a.online = live.online.is_some();
                a.topics = live.topics.iter().cloned().collect();
                let (state, since, why) = team_state(live.online.as_ref());
                a.state = state;
                a.since = since;
                a.why = why;
                a.thread.clone_from(&live.thread);
                let activity = since.map_or(live.activity, |s| s.max(live.activity));
                a.last_activity = (activity > 0).then_some(activity);
            }
        }
        agents.sort_by(|a, b| b.online.cmp(&a.online).then_with(|| a.name.cmp(&b.name)));
    }

    /// `forget_agent` is decided here, where the live state is: refused (code, message) for
    /// a connected or unknown agent; otherwise the agent leaves routing at once (a broadcast
    /// no longer queues for it; should it connect again, its HELLO comes after this in the
    /// store's order and lists it again).
    pub(crate) fn forget(&mut self, name: &str) -> Result<(), (&'static str, String)> {
        match self.agents.get(name) {
            Some(a) if a.online.is_some() => Err((
                "connected",
                format!(
                    "{name} is connected; only an agent that is not can be forgotten \
                     (`agent-relay stop {name}` stops a wrapped agent)"
                ),
            )),
            Some(_) => {
                self.agents.remove(name);
                self.fold_out(name);
                self.forget_claims(name);
                Ok(())
            }
            None => Err((
                "not_found",
                format!("no agent {name} is known (`agent-relay agents` lists them)"),
            )),
        }
    }

    /// Agents online, agents known.
    pub(crate) fn agent_counts(&self) -> (u64, u64) {
        let online = self.agents.values().filter(|a| a.online.is_some()).count();
        (online as u64, self.agents.len() as u64)
    }

    /// The content of `agents.json`: every known agent, name order.
    pub(crate) fn agents_doc(&self) -> String {
        let mut names: Vec<&String> = self.agents.keys().collect();
        names.sort();
        let doc = serde_json::json!({
            "agents": names.iter().map(|name| {
                let a = &self.agents[*name];
                serde_json::json!({
                    "name": name, "cli": a.cli, "online": a.online.is_some(),
                    "connected_at": a.online.as_ref().map(|_| a.connected_at),
                    "topics": a.topics,
                })
            }).collect::<Vec<_>>(),
        });
        doc.to_string()
    }
}
