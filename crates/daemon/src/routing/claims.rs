//! Claims and edits (issue 25.7): who works on which paths, and who is told when two agents
//! meet on one. [`ClaimBook`] is pure (time comes in as Unix ms); the [`Core`] glue below
//! answers the queries, writes claims to the store (they outlive a restart) and stores the
//! relay's notices.
//!
//! Told once: each notice's id is derived from what it is about (who, whom, the path, and the
//! other side's claim or edit episode), so the store's dedupe of `(relay, id)` keeps it told
//! once even when the same collision is reported again (each edit of a claimed file, a claim
//! renewed, a restart in between).

use std::collections::{BTreeMap, HashMap};

use relay_protocol::claims::{
    ClaimCollision, ClaimInfo, DEFAULT_CLAIM_MS, MAX_CLAIM_MS, MAX_CLAIM_PATHS, claim_overlaps,
    validate_claim_path,
};
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::{PERSON_CLI, Role};
use relay_store::WriteOp;

use super::{Core, Now};
use crate::msg::{StoreCmd, WriteCtx};

/// Two agents' edits of one file this close together (ms) are a collision: Claude Code's
/// edits of a file in one task come minutes apart at most; two agents' a minute apart are
/// two hands on one file.
pub(crate) const EDIT_WINDOW_MS: u64 = 60_000;

/// How a claim query is answered.
#[derive(Debug)]
pub(crate) enum ClaimAnswer {
    /// Now, with this.
    Now(Box<QueryResult>),
    /// When the store has committed the write that carries the answer.
    Stored,
}

/// A notice for one agent, to be stored by the relay.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimNotice {
    /// Who is told.
    pub(crate) to: String,
    /// Its id (told once: see the module's docs).
    pub(crate) id: String,
    /// The text.
    pub(crate) body: String,
    /// `{"relay_notice": {...}}`.
    pub(crate) data: serde_json::Value,
}

/// The claims held and the recent edits.
#[derive(Debug, Default)]
pub(crate) struct ClaimBook {
    /// (path, agent) → claim.
    held: BTreeMap<(String, String), ClaimInfo>,
    /// path → (agent, time of its last edit).
    edits: HashMap<String, Vec<(String, u64)>>,
    /// (path, agent, other agent), names in order → (episode's first edit, last edit): two
    /// agents' edits of a path within [`EDIT_WINDOW_MS`] of each other are one episode, told
    /// once.
    episodes: HashMap<(String, String, String), (u64, u64)>,
}

/// `1h`, `25m`, `40s`: what is left of a claim.
fn left(until: u64, now_ms: u64) -> String {
    let s = until.saturating_sub(now_ms) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// A notice id from what it is about: the same facts, the same id.
fn notice_id(parts: &[&str]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("claim-{hex}")
}

fn data(code: &str, path: &str, agent: &str, claimed: Option<&str>) -> serde_json::Value {
    serde_json::json!({"relay_notice": {
        "code": code, "path": path, "agent": agent, "claimed": claimed,
    }})
}

/// How a path is shown in a notice: one line, bounded.
fn shown(path: &str) -> String {
    relay_protocol::text::one_line(path, 200)
}

impl ClaimBook {
    /// The book as stored, without what expired by `now_ms`.
    pub(crate) fn load(claims: Vec<ClaimInfo>, now_ms: u64) -> Self {
        let held = claims
            .into_iter()
            .filter(|c| c.until > now_ms)
            .map(|c| ((c.path.clone(), c.agent.clone()), c))
            .collect();
        Self {
            held,
            ..Self::default()
        }
    }

    /// Every claim held at `now_ms`, by path.
    pub(crate) fn list(&self, now_ms: u64) -> Vec<ClaimInfo> {
        self.held
            .values()
            .filter(|c| c.until > now_ms)
            .cloned()
            .collect()
    }

    /// Others' live claims that overlap `path`.
    fn others(&self, agent: &str, path: &str, now_ms: u64) -> Vec<ClaimInfo> {
        self.held
            .values()
            .filter(|c| c.agent != agent && c.until > now_ms && claim_overlaps(&c.path, path))
            .cloned()
            .collect()
    }

    /// `agent` claims `paths` (valid, normal form) for `for_ms` from `now_ms`: the claims as
    /// now held, the collisions, the notices, the store writes. A path it claimed already is
    /// renewed (its `since` kept: the others were told about that claim).
    pub(crate) fn claim(
        &mut self,
        agent: &str,
        paths: &[String],
        for_ms: u64,
        now_ms: u64,
    ) -> (
        Vec<ClaimInfo>,
        Vec<ClaimCollision>,
        Vec<ClaimNotice>,
        Vec<WriteOp>,
    ) {
        let until = now_ms.saturating_add(for_ms);
        let (mut claims, mut collisions, mut notices, mut writes) =
            (vec![], vec![], vec![], vec![]);
        for path in paths {
            let key = (path.clone(), agent.to_owned());
            let since = match self.held.get(&key) {
                Some(c) if c.until > now_ms => c.since,
                _ => now_ms,
            };
            let info = ClaimInfo {
                agent: agent.to_owned(),
                path: path.clone(),
                since,
                until,
            };
            self.held.insert(key, info.clone());
            writes.push(WriteOp::Claim {
                agent: agent.to_owned(),
                path: path.clone(),
                since,
                until,
            });
            for other in self.others(agent, path, now_ms) {
                let claim_key = other.since.to_string();
                let (p, o) = (shown(path), shown(&other.path));
                let wait = left(other.until, now_ms);
                notices.push(ClaimNotice {
                    to: agent.to_owned(),
                    id: notice_id(&["claimed", agent, &other.agent, path, &other.path, &claim_key]),
                    body: format!(
                        "{p} is claimed by {who} ({o}, for another {wait}); {who} was told. Agree with {who} who changes it before you edit it",
                        who = other.agent
                    ),
                    data: data("claim_collision", path, &other.agent, Some(&other.path)),
                });
                notices.push(ClaimNotice {
                    to: other.agent.clone(),
                    id: notice_id(&["claimed", &other.agent, agent, path, &other.path, &claim_key]),
                    body: format!(
                        "{agent} claimed {p}, which you claimed ({o}, for another {wait}); {agent} was told. Agree with {agent} who changes it"
                    ),
                    data: data("claim_collision", path, agent, Some(&other.path)),
                });
                collisions.push(ClaimCollision {
                    path: path.clone(),
                    agent: other.agent.clone(),
                    claimed: Some(other.path.clone()),
                    until: Some(other.until),
                });
            }
            claims.push(info);
        }
        (claims, collisions, notices, writes)
    }

    /// `agent` releases `paths` (all its claims when empty): the paths released and the store
    /// write.
    pub(crate) fn unclaim(&mut self, agent: &str, paths: &[String]) -> (Vec<String>, WriteOp) {
        let mut released = Vec::new();
        self.held.retain(|(path, a), _| {
            let goes = a == agent && (paths.is_empty() || paths.contains(path));
            if goes {
                released.push(path.clone());
            }
            !goes
        });
        let op = WriteOp::Unclaim {
            agent: agent.to_owned(),
            paths: paths.to_vec(),
        };
        (released, op)
    }

    /// Drops what expired by `now_ms` (and edits older than the window); the store writes.
    pub(crate) fn expire(&mut self, now_ms: u64) -> Vec<WriteOp> {
        let mut ops = Vec::new();
        self.held.retain(|(path, agent), c| {
            let keep = c.until > now_ms;
            if !keep {
                ops.push(WriteOp::Unclaim {
                    agent: agent.clone(),
                    paths: vec![path.clone()],
                });
            }
            keep
        });
        let cutoff = now_ms.saturating_sub(EDIT_WINDOW_MS);
        self.edits.retain(|_, by| {
            by.retain(|(_, at)| *at >= cutoff);
            !by.is_empty()
        });
        self.episodes.retain(|_, (_, last)| *last >= cutoff);
        ops
    }

    /// `agent` edited `paths` at `now_ms`: the collisions (others' claims; others' edits within
    /// [`EDIT_WINDOW_MS`]) and the notices, each told once per claim or edit episode.
    pub(crate) fn edited(
        &mut self,
        agent: &str,
        paths: &[String],
        now_ms: u64,
    ) -> (Vec<ClaimCollision>, Vec<ClaimNotice>) {
        let (mut collisions, mut notices) = (Vec::new(), Vec::new());
        let cutoff = now_ms.saturating_sub(EDIT_WINDOW_MS);
        for path in paths {
            let p = shown(path);
            let claimed_by = self.others(agent, path, now_ms);
            for other in &claimed_by {
                let claim_key = other.since.to_string();
                let o = shown(&other.path);
                notices.push(ClaimNotice {
                    to: agent.to_owned(),
                    id: notice_id(&["edited", agent, &other.agent, &other.path, &claim_key]),
                    body: format!(
                        "you edited {p}, which {who} claimed ({o}, for another {wait}); {who} was told. Agree with {who} who changes it",
                        who = other.agent,
                        wait = left(other.until, now_ms)
                    ),
                    data: data("claimed_edit", path, &other.agent, Some(&other.path)),
                });
                notices.push(ClaimNotice {
                    to: other.agent.clone(),
                    id: notice_id(&["edited", &other.agent, agent, &other.path, &claim_key]),
                    body: format!(
                        "{agent} edited {p}, which you claimed ({o}); {agent} was told. Agree with {agent} who changes it"
                    ),
                    data: data("claimed_edit", path, agent, Some(&other.path)),
                });
                collisions.push(ClaimCollision {
                    path: path.clone(),
                    agent: other.agent.clone(),
                    claimed: Some(other.path.clone()),
                    until: Some(other.until),
                });
            }
            let by = self.edits.entry(path.clone()).or_default();
            let recent: Vec<String> = by
                .iter()
                .filter(|(a, at)| a != agent && *at >= cutoff)
                .map(|(a, _)| a.clone())
                .collect();
            match by.iter_mut().find(|(a, _)| a == agent) {
                Some(mine) => mine.1 = now_ms,
                None => by.push((agent.to_owned(), now_ms)),
            }
            for other in recent {
                // A claim's holder was told about this edit already.
                if claimed_by.iter().any(|c| c.agent == other) {
                    continue;
                }
                let pair = if agent < other.as_str() {
                    (path.clone(), agent.to_owned(), other.clone())
                } else {
                    (path.clone(), other.clone(), agent.to_owned())
                };
                let episode = self.episodes.entry(pair).or_insert((now_ms, now_ms));
                if now_ms.saturating_sub(episode.1) > EDIT_WINDOW_MS {
                    *episode = (now_ms, now_ms);
                }
                episode.1 = now_ms;
                let key = episode.0.to_string();
                for (to, who) in [(agent, other.as_str()), (other.as_str(), agent)] {
                    notices.push(ClaimNotice {
                        to: to.to_owned(),
                        id: notice_id(&["both-edited", to, who, path, &key]),
                        body: format!(
                            "{who} and you both edited {p} within a minute; agree who changes it (relay_claim or agent-relay claim {p} says it is yours)"
                        ),
                        data: data("edit_collision", path, who, None),
                    });
                }
                collisions.push(ClaimCollision {
                    path: path.clone(),
                    agent: other.clone(),
                    claimed: None,
                    until: None,
                });
            }
        }
        (collisions, notices)
    }
}

/// Checks a query's paths: at least one (unless `empty_ok`), at most [`MAX_CLAIM_PATHS`], each in
/// normal form.
fn check_paths(paths: &[String], empty_ok: bool) -> Result<(), String> {
    if paths.is_empty() && !empty_ok {
        return Err(
            "no path given; name the files (src/auth.rs) or directories (src/auth/)".into(),
        );
    }
    if paths.len() > MAX_CLAIM_PATHS {
        return Err(format!(
            "{} paths; at most {MAX_CLAIM_PATHS} at once (claim their directory instead)",
            paths.len()
        ));
    }
    for p in paths {
        validate_claim_path(p).map_err(|e| format!("{}: {e}", shown(p)))?;
    }
    Ok(())
}

fn invalid(message: String) -> QueryResult {
    QueryResult::Error {
        code: "invalid".into(),
        message,
    }
}

impl Core {
    /// The claims stored (loaded at start).
    pub(crate) fn set_claims(&mut self, claims: Vec<ClaimInfo>) {
        self.claims = ClaimBook::load(claims, self.now.ms);
    }

    /// Answers `claim`, `unclaim`, `claims` and `edited` (None for any other query): at once
    /// ([`ClaimAnswer::Now`]), or for a claim or release once its write is committed
    /// ([`ClaimAnswer::Stored`], `ctx` made from the result). Claims and edits speak for the
    /// connection's name; a tool connection may not speak for a connected agent (only that
    /// agent's own connection does, as for a SEND).
    pub(crate) fn on_claim_query(
        &mut self,
        conn_id: u64,
        req: &QueryRequest,
        now: Now,
        ctx: impl FnOnce(QueryResult) -> WriteCtx,
    ) -> Option<ClaimAnswer> {
        let result = self.claim_query(conn_id, req, now)?;
        let writes = std::mem::take(&mut self.claim_writes);
        if writes.is_empty() {
            return Some(ClaimAnswer::Now(Box::new(result)));
        }
        let last = writes.len() - 1;
        let mut answer = Some(ctx(result));
        for (i, op) in writes.into_iter().enumerate() {
            let c = if i == last { answer.take() } else { None };
            self.store(StoreCmd::Write(op, c.unwrap_or(WriteCtx::None)));
        }
        Some(ClaimAnswer::Stored)
    }

    fn claim_query(&mut self, conn_id: u64, req: &QueryRequest, now: Now) -> Option<QueryResult> {
        self.now = now;
        let now_ms = now.ms;
        if matches!(req, QueryRequest::Claims) {
            return Some(QueryResult::Claims {
                claims: self.claims.list(now_ms),
            });
        }
        if !matches!(
            req,
            QueryRequest::Claim { .. } | QueryRequest::Unclaim { .. } | QueryRequest::Edited { .. }
        ) {
            return None;
        }
        let agent = match self.claimer(conn_id) {
            Ok(a) => a,
            Err((code, message)) => {
                return Some(QueryResult::Error {
                    code: code.into(),
                    message,
                });
            }
        };
        let result = match req {
            QueryRequest::Claim { paths, for_ms } => {
                let for_ms = for_ms.unwrap_or(DEFAULT_CLAIM_MS);
                if let Err(e) = check_paths(paths, false) {
                    return Some(invalid(e));
                }
                if for_ms == 0 || for_ms > MAX_CLAIM_MS {
                    return Some(invalid(format!(
                        "a claim lasts from 1 ms to {}h; give --for within that",
                        MAX_CLAIM_MS / 3_600_000
                    )));
                }
                let (claims, collisions, notices, writes) =
                    self.claims.claim(&agent, paths, for_ms, now_ms);
                tracing::info!(%agent, paths = paths.len(), collisions = collisions.len(), "claimed");
                // Written (with the answer) by `on_claim_query`, before the notices.
                self.claim_writes = writes;
                self.claim_notices(notices);
                QueryResult::Claim { claims, collisions }
            }
            QueryRequest::Unclaim { paths } => {
                if let Err(e) = check_paths(paths, true) {
                    return Some(invalid(e));
                }
                let (released, op) = self.claims.unclaim(&agent, paths);
                self.claim_writes = vec![op];
                QueryResult::Unclaim { released }
            }
            QueryRequest::Edited { paths } => {
                if let Err(e) = check_paths(paths, false) {
                    return Some(invalid(e));
                }
                let (collisions, notices) = self.claims.edited(&agent, paths, now_ms);
                self.claim_notices(notices);
                QueryResult::Edited { collisions }
            }
            _ => return None,
        };
        Some(result)
    }

    /// The name a claim from `conn_id` is made for, or the error that refuses it.
    fn claimer(&self, conn_id: u64) -> Result<String, (&'static str, String)> {
        let Some(conn) = self.conns.get(&conn_id) else {
            return Err((
                "invalid",
                "claims are made by a connection with a name (agent-relay claim --as NAME)".into(),
            ));
        };
        if conn.role == Role::Client {
            if self
                .agents
                .get(&conn.name)
                .is_some_and(|a| a.online.is_some() && a.cli.as_deref() != Some(PERSON_CLI))
            {
                return Err((
                    "forbidden",
                    format!(
                        "{name} is a connected agent, and only its own connection claims for it: print the [[RELAY]]{{\"claim\":[...]}}[[/RELAY]] directive in {name}'s terminal or call its relay_claim tool (or claim as yourself: agent-relay claim --as YOUR_NAME)",
                        name = conn.name
                    ),
                ));
            }
            if let Err(reason) = self.may_sign(&conn.name) {
                return Err(("forbidden", reason));
            }
        }
        Ok(conn.name.clone())
    }

    fn write_claims(&mut self, ops: Vec<WriteOp>) {
        for op in ops {
            self.store(StoreCmd::Write(op, WriteCtx::None));
        }
    }

    fn claim_notices(&mut self, notices: Vec<ClaimNotice>) {
        for n in notices {
            self.relay_notice(n.to, n.id, None, n.body, n.data);
        }
    }

    /// Drops expired claims (called every tick).
    pub(crate) fn expire_claims(&mut self) {
        let ops = self.claims.expire(self.now.ms);
        if !ops.is_empty() {
            tracing::info!(count = ops.len(), "claims expired");
        }
        self.write_claims(ops);
    }

    /// The agent of `conn_id` said BYE (it stopped, or exited): its claims are released. A
    /// tool connection's BYE, or one of a connection that no longer holds the name, is not
    /// its agent leaving.
    pub(crate) fn left(&mut self, conn_id: u64, now: Now) {
        self.now = now;
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        // A door that holds the name for a moment (a hook, a person's `inbox`) leaves; its
        // agent does not.
        let holds = conn.role == Role::Agent
            && self.agents.get(&conn.name).is_some_and(|a| {
                a.online.as_ref().is_some_and(|o| o.conn_id == conn_id)
                    && !matches!(
                        a.cli.as_deref(),
                        Some(relay_protocol::HOOK_CLI | PERSON_CLI)
                    )
            });
        if !holds {
            return;
        }
        let name = conn.name.clone();
        let (released, op) = self.claims.unclaim(&name, &[]);
        if !released.is_empty() {
            tracing::info!(agent = %name, count = released.len(), "claims released: the agent left");
            self.write_claims(vec![op]);
        }
    }

    /// A forgotten agent's claims go with it (the store's `forget_agent` deletes them).
    pub(crate) fn forget_claims(&mut self, name: &str) {
        self.claims.unclaim(name, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_second_claim_tells_both_once_per_claim() {
        let mut book = ClaimBook::default();
        let (_, none, n, _) = book.claim("Alice", &paths(&["src/"]), 60_000, 1_000);
        assert!(none.is_empty() && n.is_empty());
        let (_, coll, n1, _) = book.claim("Bob", &paths(&["src/auth.rs"]), 60_000, 2_000);
        assert_eq!(coll.len(), 1);
        assert_eq!(coll[0].agent, "Alice");
        let to: Vec<&str> = n1.iter().map(|n| n.to.as_str()).collect();
        assert_eq!(to, ["Bob", "Alice"]);
        // Renewed: the same notices (same ids: the store keeps them told once).
        let (_, _, n2, _) = book.claim("Bob", &paths(&["src/auth.rs"]), 60_000, 3_000);
        assert_eq!(
            n1.iter().map(|n| &n.id).collect::<Vec<_>>(),
            n2.iter().map(|n| &n.id).collect::<Vec<_>>()
        );
    }

    #[test]
    fn claims_expire_and_are_released() {
        let mut book = ClaimBook::default();
        book.claim("Alice", &paths(&["a.rs", "b.rs"]), 1_000, 0);
        book.claim("Bob", &paths(&["c.rs"]), 10_000, 0);
        assert_eq!(book.expire(1_000).len(), 2);
        assert_eq!(book.list(1_000).len(), 1);
        let (released, _) = book.unclaim("Bob", &[]);
        assert_eq!(released, ["c.rs"]);
        assert!(book.list(1_000).is_empty());
    }

    #[test]
    fn two_agents_editing_one_file_are_told_once_per_episode() {
        let mut book = ClaimBook::default();
        let f = paths(&["src/x.rs"]);
        assert!(book.edited("Alice", &f, 0).1.is_empty());
        let (_, n1) = book.edited("Bob", &f, 10_000);
        assert_eq!(n1.len(), 2);
        let (_, n2) = book.edited("Alice", &f, 20_000);
        let (_, n3) = book.edited("Bob", &f, 30_000);
        let ids: std::collections::HashSet<&String> =
            n1.iter().chain(&n2).chain(&n3).map(|n| &n.id).collect();
        assert_eq!(ids.len(), 2, "one notice each for the episode");
        // Two minutes later, a new episode.
        let (_, n4) = book.edited("Alice", &f, 200_000);
        assert!(n4.is_empty(), "Bob's last edit is past the window");
        let (_, n5) = book.edited("Bob", &f, 210_000);
        assert!(n5.iter().all(|n| !ids.contains(&n.id)));
    }

    #[test]
    fn an_edit_of_a_claimed_file_tells_the_holder_not_twice() {
        let mut book = ClaimBook::default();
        book.claim("Alice", &paths(&["src/"]), 600_000, 0);
        book.edited("Alice", &paths(&["src/x.rs"]), 1_000);
        let (coll, n) = book.edited("Bob", &paths(&["src/x.rs"]), 2_000);
        assert_eq!(coll.len(), 1, "{coll:?}");
        assert_eq!(n.len(), 2);
    }
}
