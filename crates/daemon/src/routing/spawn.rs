//! Spawned workers (issue 25): who may spawn (access rule `deny-spawn`), the caps on live
//! spawned agents and on depth, the names of workers, who may release them, and what their
//! parent is told (an exit on its own; idle after a turn). Every door (the CLI, the MCP server,
//! a directive) asks the relay one `spawn` QUERY, so they share this one decision; the records
//! are in the store (`spawned`), loaded at start.

use relay_protocol::query::{SpawnRecord, SpawnRequest};
use relay_protocol::text::one_line;
use relay_protocol::{Role, Send, TerminalState};
use relay_store::WriteOp;

use super::{Agent, Core, NO_CONN, Origin, RELAY};
use crate::msg::{StoreCmd, WriteCtx};

/// A refusal: the QUERY error's code and its message.
pub(crate) type Refusal = (&'static str, String);

impl Core {
    /// The records the store holds (at start).
    pub(crate) fn load_spawned(&mut self, records: Vec<SpawnRecord>) {
        for r in records {
            if r.ended_at.is_none() {
                // Known as a recipient from the start, as when it was spawned.
                self.reserve(&r.name);
            }
            self.spawned.insert(r.name.clone(), r);
        }
    }

    /// How many spawned workers are live (not released, not exited).
    fn live_spawned(&self) -> usize {
        self.spawned
            .values()
            .filter(|r| r.ended_at.is_none())
            .count()
    }

    /// Makes `name` a known agent (offline until it connects): the task waits for it, and a
    /// sibling's name a letter away is not taken for a typo of it.
    fn reserve(&mut self, name: &str) {
        if !self.agents.contains_key(name) {
            self.agents.insert(name.to_owned(), Agent::default());
            self.fold_in(name);
        }
    }

    /// Who asks on connection `conn_id`: its name, unless a tool connection speaks as a
    /// connected agent (only that agent's own connection does) or as a known name spelled
    /// with other case.
    fn asker(&self, conn_id: u64) -> Result<String, Refusal> {
        let Some(conn) = self.conns.get(&conn_id) else {
            return Err((
                "invalid",
                "spawn and release are asked on a connection to the relay".into(),
            ));
        };
        let name = conn.name.clone();
        if conn.role == Role::Client {
            if self.agents.get(&name).is_some_and(|a| {
                a.online.is_some() && a.cli.as_deref() != Some(relay_protocol::PERSON_CLI)
            }) {
                return Err((
                    "forbidden",
                    format!(
                        "{name} is a connected agent, and only its own connection speaks as it: \
                         {name} asks through its MCP server (relay_spawn, relay_release) or the \
                         directive [[RELAY]]{{\"spawn\": ...}}[[/RELAY]] in its terminal; or ask \
                         as yourself (--from YOUR_NAME)"
                    ),
                ));
            }
            self.may_sign(&name).map_err(|e| ("forbidden", e))?;
        }
        Ok(name)
    }

    /// A `spawn` QUERY from `conn_id`: decides (the asker may speak as itself, the name, the
    /// rule `deny-spawn`, depth, the cap, the task's size) and, unless it is only a check,
    /// reserves the name and keeps the record (the shell queues its write, then
    /// [`Core::spawn_task`]). The record, or the refusal (which names the limit or rule).
    pub(crate) fn spawn(
        &mut self,
        conn_id: u64,
        req: &SpawnRequest,
        now_ms: u64,
    ) -> Result<SpawnRecord, Refusal> {
        let parent = self.asker(conn_id)?;
        let name = match &req.name {
            Some(n) => {
                relay_protocol::validate_agent_name(n)
                    .map_err(|e| ("invalid", format!("worker name {:?}: {e}", one_line(n, 80))))?;
                self.may_take_worker_name(n)?;
                n.clone()
            }
            None => self.worker_name(&parent),
        };
        if let Some(rule) = self.rules.denies_spawn(&parent, &name) {
            return Err((
                "forbidden",
                format!(
                    "spawn refused: an access rule forbids {parent} to spawn (deny-spawn from {} \
                     to {}; `agent-relay rules list`)",
                    rule.from.as_str(),
                    rule.to.as_str()
                ),
            ));
        }
        if req.task.is_some() && !self.rules.allows(&parent, &name) {
            return Err((
                "forbidden",
                format!(
                    "spawn refused: an access rule forbids {parent} to send to {name}, so its task \
                     could not reach it (`agent-relay rules list`)"
                ),
            ));
        }
        let depth = self
            .spawned
            .get(&parent)
            .filter(|r| r.ended_at.is_none())
            .map_or(1, |r| r.depth + 1);
        if depth > self.cfg.max_spawn_depth {
            return Err((
                "limit",
                format!(
                    "spawn refused: the spawn depth limit is {} (max_spawn_depth), and a worker of \
                     {parent} would be at depth {depth}; do the work in {parent}, or ask its own \
                     lead to spawn",
                    self.cfg.max_spawn_depth
                ),
            ));
        }
        let live = self.live_spawned();
        if live >= self.cfg.max_spawned as usize {
            return Err((
                "limit",
                format!(
                    "spawn refused: the limit of live spawned agents is {} (max_spawned), and {live} \
                     run; release one first (agent-relay release NAME)",
                    self.cfg.max_spawned
                ),
            ));
        }
        if let Some(task) = &req.task
            && task.len() > self.cfg.max_body_bytes
        {
            return Err((
                "too_large",
                format!(
                    "the task is {} bytes, over the relay's {} for a message: put it in a file \
                     and give the worker its path",
                    task.len(),
                    self.cfg.max_body_bytes
                ),
            ));
        }
        let record = SpawnRecord {
            worktree: req.worktree_in.as_ref().map(|d| format!("{d}/{name}")),
            name: name.clone(),
            parent: parent.clone(),
            depth,
            at: now_ms,
            notify_idle: req.notify_idle,
            ended_at: None,
        };
        if req.check {
            return Ok(record);
        }
        self.reserve(&name);
        self.spawned.insert(name.clone(), record.clone());
        Ok(record)
    }

    /// Stores the task of worker `record` as a message from its parent with id `task_id`,
    /// routed as the parent's (rate limits and budgets apply; refused, it is dead-lettered).
    /// Called after the record's write is queued: a crash between them loses the task (the
    /// spawn was not answered), never the record of a worker that got it.
    pub(crate) fn spawn_task(&mut self, record: &SpawnRecord, task: String, task_id: String) {
        let payload = Send {
            kind: relay_protocol::Kind::Message,
            body: task,
            data: Some(serde_json::json!({"relay_task": {
                "parent": record.parent, "worker": record.name,
            }})),
            thread: None,
            in_reply_to: None,
            budget: None,
            urgent: false,
            // From this relay's own agent: no federation node.
            origin: None,
        };
        let origin = Origin {
            conn_id: NO_CONN,
            from: record.parent.clone(),
            session_id: None,
            checked: false,
        };
        self.route(
            origin,
            task_id,
            Some(record.name.clone()),
            None,
            payload,
            None,
        );
    }

    /// Whether a worker may be spawned as `name`: not a connected agent, not a live worker,
    /// not a person's or the relay's name, not a known name spelled with other case.
    fn may_take_worker_name(&self, name: &str) -> Result<(), Refusal> {
        if self.agents.get(name).is_some_and(|a| a.online.is_some()) {
            return Err((
                "name_taken",
                format!("{name} is a connected agent; choose another name (-n) or leave it out"),
            ));
        }
        if self.spawned.get(name).is_some_and(|r| r.ended_at.is_none()) {
            return Err((
                "name_taken",
                format!(
                    "{name} is a live spawned worker; release it first (agent-relay release {name}) or choose another name"
                ),
            ));
        }
        self.may_take(name, Role::Agent, false, false)
            .map_err(|(_, e)| ("invalid", e))
    }

    /// `<parent>-w<N>` for the lowest N free (no agent, worker or person has it, in any
    /// case), or `w<N>` when the parent's name leaves no room.
    fn worker_name(&self, parent: &str) -> String {
        let base = if parent.len() + 6 <= relay_protocol::MAX_NAME_LEN && parent != RELAY {
            format!("{parent}-w")
        } else {
            "w".to_owned()
        };
        let free = |n: &str| {
            !self.agents.contains_key(n)
                && !self.spawned.contains_key(n)
                && self.may_take(n, Role::Agent, false, false).is_ok()
        };
        (1u32..)
            .map(|i| format!("{base}{i}"))
            .find(|n| free(n))
            .unwrap_or_else(|| format!("{base}0"))
    }

    /// A `release` QUERY from `conn_id` for `name`: its parent, a person, or an asker an
    /// `allow-release` rule names may release it. Ends its record (the write is queued).
    pub(crate) fn release(
        &mut self,
        conn_id: u64,
        name: &str,
        now_ms: u64,
    ) -> Result<SpawnRecord, Refusal> {
        let asker = self.asker(conn_id)?;
        let Some(record) = self.spawned.get(name) else {
            return Err((
                "not_found",
                format!(
                    "{} was not spawned through the relay; stop it with `agent-relay stop {}`",
                    one_line(name, 80),
                    one_line(name, 80)
                ),
            ));
        };
        if record.ended_at.is_some() {
            return Err((
                "not_found",
                format!("{name} was already released or has exited"),
            ));
        }
        if asker != record.parent
            && !self.is_person(&asker)
            && !self.rules.allows_release(&asker, name)
        {
            return Err((
                "forbidden",
                format!(
                    "release refused: {name} was spawned by {}, and {asker} may release only the \
                     workers it spawned (a person may release any; a rule `rules add --from \
                     {asker} --to {name} --action allow-release` allows more)",
                    record.parent
                ),
            ));
        }
        let mut ended = record.clone();
        ended.ended_at = Some(now_ms);
        self.spawned.insert(name.to_owned(), ended.clone());
        self.store(StoreCmd::Write(
            WriteOp::SpawnEnded {
                name: name.to_owned(),
                at: now_ms,
            },
            WriteCtx::None,
        ));
        Ok(ended)
    }

    /// A wrapper says agent `name` exited on its own with `status`, showing `lines` last.
    /// When it is a live spawned worker (and not connected: a connected agent has not
    /// exited), its record ends and its parent is told. Whether the parent was told.
    pub(crate) fn spawn_exited(
        &mut self,
        name: &str,
        status: Option<i32>,
        lines: &[String],
        now_ms: u64,
    ) -> bool {
        if self.agents.get(name).is_some_and(|a| a.online.is_some()) {
            return false;
        }
        let Some(record) = self.spawned.get_mut(name) else {
            return false;
        };
        if record.ended_at.is_some() {
            return false;
        }
        record.ended_at = Some(now_ms);
        let parent = record.parent.clone();
        self.store(StoreCmd::Write(
            WriteOp::SpawnEnded {
                name: name.to_owned(),
                at: now_ms,
            },
            WriteCtx::None,
        ));
        let status_text = status.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
        let shown: Vec<String> = lines
            .iter()
            .rev()
            .take(10)
            .rev()
            .map(|l| format!("  | {}", one_line(l, 200)))
            .collect();
        let mut body = format!(
            "relay: your worker {name} exited on its own (status {status_text}); its messages stay stored."
        );
        if !shown.is_empty() {
            body.push_str(" Its last lines:\n");
            body.push_str(&shown.join("\n"));
        }
        let data = serde_json::json!({"relay_notice": {
            "worker_exited": name, "status": status, "lines": lines,
        }});
        let id = format!("worker-exit-{}-{now_ms}", one_line(name, 64));
        self.relay_notice(parent, id, None, body, data);
        true
    }

    /// A terminal report of `name` moved from `before` to `after`: a worker spawned with
    /// `--notify idle` that became idle after working has its parent told (once per turn:
    /// on each busy → idle).
    pub(super) fn spawn_state_changed(
        &mut self,
        name: &str,
        before: Option<TerminalState>,
        after: TerminalState,
    ) {
        if before != Some(TerminalState::Busy) || after != TerminalState::Idle {
            return;
        }
        let Some(record) = self
            .spawned
            .get(name)
            .filter(|r| r.notify_idle && r.ended_at.is_none())
        else {
            return;
        };
        let parent = record.parent.clone();
        let ms = self.now.ms;
        let body = format!("relay: your worker {name} is idle after a turn.");
        let data = serde_json::json!({"relay_notice": {"worker_idle": name}});
        let id = format!("worker-idle-{}-{ms}", one_line(name, 64));
        self.relay_notice(parent, id, None, body, data);
    }
}

#[cfg(test)]
mod tests {
    use relay_protocol::query::{HistoryFilter, SpawnRecord, SpawnRequest};
    use relay_protocol::{Role, TerminalState};
    use relay_store::Store;

    use super::super::harness::{World, config};
    use crate::rules::Rules;

    fn ask(name: Option<&str>) -> SpawnRequest {
        SpawnRequest {
            name: name.map(str::to_owned),
            ..SpawnRequest::default()
        }
    }

    fn record(name: &str, parent: &str, depth: u32) -> SpawnRecord {
        SpawnRecord {
            name: name.into(),
            parent: parent.into(),
            depth,
            at: 1,
            worktree: None,
            notify_idle: false,
            ended_at: None,
        }
    }

    #[test]
    fn workers_are_named_after_their_parent_and_a_live_workers_name_is_taken() {
        let mut w = World::new(config());
        let lead = w.client("Lead");
        let names: Vec<String> = (0..3)
            .map(|_| w.core.spawn(lead, &ask(None), 5).unwrap().name)
            .collect();
        assert_eq!(names, ["Lead-w1", "Lead-w2", "Lead-w3"]);
        let (code, why) = w.core.spawn(lead, &ask(Some("Lead-w2")), 5).unwrap_err();
        assert_eq!(code, "name_taken", "{why}");
        // Reserved: a message to a sibling a letter away is not a typo.
        assert!(w.core.admit_recipient("Lead-w3").is_ok());
        // A connected agent's name, and a person's, are not a worker's.
        w.agent("Bob", 8);
        assert_eq!(
            w.core.spawn(lead, &ask(Some("Bob")), 5).unwrap_err().0,
            "name_taken"
        );
        assert!(w.core.spawn(lead, &ask(Some("human")), 5).is_err());
    }

    #[test]
    fn the_cap_and_the_depth_are_refused_naming_the_limit() {
        let mut cfg = config();
        cfg.max_spawned = 2;
        let mut w = World::new(cfg);
        w.core
            .load_spawned(vec![record("W1", "Lead", 1), record("W2", "W1", 2)]);
        let deep = w.client("W2");
        let (code, why) = w.core.spawn(deep, &ask(None), 5).unwrap_err();
        assert_eq!(code, "limit");
        assert!(
            why.contains("spawn depth limit is 2 (max_spawn_depth)"),
            "{why}"
        );
        let lead = w.client("Lead");
        let (code, why) = w.core.spawn(lead, &ask(None), 5).unwrap_err();
        assert_eq!(code, "limit");
        assert!(
            why.contains("live spawned agents is 2 (max_spawned)"),
            "{why}"
        );
        // Released, its place is free; an ended parent counts as depth 0.
        w.core.release(lead, "W1", 6).unwrap();
        w.settle();
        let w1 = w.client("W1");
        let r = w.core.spawn(w1, &ask(None), 7).unwrap();
        assert_eq!((r.name.as_str(), r.depth), ("W1-w1", 1));
    }

    #[test]
    fn only_the_parent_a_person_or_a_rule_may_release() {
        let rules =
            Rules::parse(r#"{"rules": [{"from": "Ops", "to": "W*", "action": "allow-release"}]}"#)
                .unwrap();
        let mut w = World::with_rules(config(), rules);
        w.core.load_spawned(vec![
            record("W1", "Lead", 1),
            record("W2", "Lead", 1),
            record("W3", "Lead", 1),
        ]);
        let other = w.client("Other");
        let (code, why) = w.core.release(other, "W1", 5).unwrap_err();
        assert_eq!(code, "forbidden");
        assert!(why.contains("spawned by Lead"), "{why}");
        let lead = w.client("Lead");
        assert!(w.core.release(lead, "W1", 5).is_ok());
        assert_eq!(w.core.release(lead, "W1", 5).unwrap_err().0, "not_found");
        let person = w.client("human");
        assert!(w.core.release(person, "W2", 5).is_ok());
        let ops = w.client("Ops");
        assert!(w.core.release(ops, "W3", 5).is_ok());
        assert_eq!(w.core.release(ops, "Nobody", 5).unwrap_err().0, "not_found");
        w.settle();
    }

    #[test]
    fn a_tool_connection_may_not_spawn_as_a_connected_agent() {
        let mut w = World::new(config());
        w.agent("Lead", 8);
        let fake = w.open("Lead", Role::Client, 8, true, None).unwrap().0;
        let (code, why) = w.core.spawn(fake, &ask(None), 5).unwrap_err();
        assert_eq!(code, "forbidden");
        assert!(
            why.contains("only its own connection speaks as it"),
            "{why}"
        );
    }

    #[test]
    fn the_parent_is_told_once_per_turn_and_of_an_exit_on_its_own() {
        let mut w = World::new(config());
        let mut r = record("W1", "Lead", 1);
        r.notify_idle = true;
        w.core.load_spawned(vec![r, record("W2", "Lead", 1)]);
        let busy = Some(TerminalState::Busy);
        w.core.spawn_state_changed("W1", busy, TerminalState::Idle);
        w.core
            .spawn_state_changed("W1", Some(TerminalState::Idle), TerminalState::Idle);
        w.core.spawn_state_changed("W1", None, TerminalState::Idle);
        w.core.spawn_state_changed("W2", busy, TerminalState::Idle);
        assert!(w.core.spawn_exited("W2", Some(3), &["bye".into()], 9));
        assert!(!w.core.spawn_exited("W2", Some(3), &[], 10), "told once");
        w.settle();
        let filter = HistoryFilter {
            to: Some("Lead".into()),
            ..HistoryFilter::default()
        };
        let mut bodies: Vec<String> = w
            .store
            .history(&filter)
            .unwrap()
            .into_iter()
            .map(|m| m.body)
            .collect();
        bodies.sort();
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        assert_eq!(bodies[0], "relay: your worker W1 is idle after a turn.");
        assert!(
            bodies[1].starts_with("relay: your worker W2 exited on its own (status 3)")
                && bodies[1].ends_with("  | bye"),
            "{}",
            bodies[1]
        );
    }
}
