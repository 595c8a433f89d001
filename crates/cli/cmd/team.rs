//! The team verbs for people, scripts and lead agents (issue 25): `wait` for agents to be idle
//! or gone. An agent's state is the daemon's (`agents`, `relay_agents` and the dashboard read
//! the same `state` of the `agents` query).

use std::time::Duration;

use relay_client::paths::Paths;
use relay_protocol::query::{AgentInfo, AgentState, QueryRequest, QueryResult};
use relay_protocol::text::one_line;

use crate::args::{WaitArgs, WaitUntil};
use crate::cmd::tool_client;
use crate::exit::Coded;
use crate::out::{json, line};

/// `wait`'s exit status when an agent went offline while it waited for it to be idle.
pub(crate) const WAIT_EXITED: i32 = 10;
/// `wait`'s exit status when its `--timeout` passed.
pub(crate) const WAIT_TIMED_OUT: i32 = 11;

/// How often `wait` asks the relay again. The state is the daemon's, read with one query per
/// look; a look costs a QUERY on a connection kept open.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// What `wait` decided after a look at the agents.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Every agent did what was asked.
    Done,
    /// `--until idle`: this agent is offline.
    Exited(String),
    /// Look again.
    Again,
}

/// Whether the agents `rows` (one per name waited for) are where `until` asks. Pure.
fn decide(until: WaitUntil, rows: &[&AgentInfo]) -> Decision {
    match until {
        WaitUntil::Idle => {
            if let Some(gone) = rows.iter().find(|a| a.state == AgentState::Offline) {
                return Decision::Exited(gone.name.clone());
            }
            if rows.iter().all(|a| a.state == AgentState::Idle) {
                Decision::Done
            } else {
                Decision::Again
            }
        }
        WaitUntil::Exit => {
            if rows.iter().all(|a| a.state == AgentState::Offline) {
                Decision::Done
            } else {
                Decision::Again
            }
        }
    }
}

/// `NAME: state (why)`, cleaned for a terminal.
fn state_text(a: &AgentInfo) -> String {
    let why = a.why.as_deref().map(|w| format!(" ({})", one_line(w, 120)));
    format!(
        "{}: {}{}",
        one_line(&a.name, 80),
        a.state.as_str(),
        why.unwrap_or_default()
    )
}

/// `agent-relay wait NAME... --until idle|exit [--timeout D]`.
pub(crate) async fn wait(paths: &Paths, args: &WaitArgs) -> anyhow::Result<()> {
    let deadline = args
        .timeout
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let client = tool_client(&paths.socket, "cli").await?;
    let mut told = false;
    let outcome = loop {
        let agents = match client.query(QueryRequest::Agents).await {
            Ok(QueryResult::Agents { agents }) => agents,
            Ok(other) => {
                client.close().await;
                anyhow::bail!("unexpected answer to agents: {other:?}")
            }
            Err(e) => {
                client.close().await;
                return Err(e.into());
            }
        };
        let mut rows = Vec::with_capacity(args.names.len());
        for name in &args.names {
            // Names that differ only by case are one name.
            match agents.iter().find(|a| a.name.eq_ignore_ascii_case(name)) {
                Some(a) => rows.push(a),
                None => {
                    client.close().await;
                    return Err(crate::exit::not_found(format!(
                        "no agent {} is known (`agent-relay agents` lists them)",
                        one_line(name, 80)
                    )));
                }
            }
        }
        match decide(args.until, &rows) {
            Decision::Again => {}
            decided => break (decided, rows.into_iter().cloned().collect::<Vec<_>>()),
        }
        if !told {
            // Said once, on stderr: a script (or a test) knows the wait has begun.
            told = true;
            let states: Vec<String> = rows.iter().map(|a| state_text(a)).collect();
            eprintln!("agent-relay: waiting ({})", states.join(", "));
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            break (Decision::Again, rows.into_iter().cloned().collect());
        }
        tokio::time::sleep(LOOK_EVERY).await;
    };
    client.close().await;
    let (decision, rows) = outcome;
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|a| {
                serde_json::json!({
                    "name": a.name,
                    "state": a.state,
                    "since": a.since,
                    "why": a.why,
                })
            })
            .collect();
        json(&v)?;
    } else {
        for a in &rows {
            line(state_text(a))?;
        }
    }
    match decision {
        Decision::Done => Ok(()),
        Decision::Exited(name) => Err(Coded {
            code: WAIT_EXITED,
            message: format!(
                "{} went offline (exited) before it was idle",
                one_line(&name, 80)
            ),
        }
        .into()),
        Decision::Again => Err(Coded {
            code: WAIT_TIMED_OUT,
            message: format!(
                "timed out: not every agent is {} yet",
                match args.until {
                    WaitUntil::Idle => "idle",
                    WaitUntil::Exit => "offline",
                }
            ),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, state: AgentState) -> AgentInfo {
        AgentInfo {
            name: name.into(),
            cli: None,
            online: state != AgentState::Offline,
            first_seen: 0,
            last_seen: 0,
            pending: 0,
            topics: Vec::new(),
            state,
            since: None,
            why: None,
            thread: None,
            last_activity: None,
        }
    }

    #[test]
    fn idle_waits_for_all_and_an_exit_ends_it() {
        let (a, b) = (agent("A", AgentState::Idle), agent("B", AgentState::Busy));
        assert_eq!(decide(WaitUntil::Idle, &[&a, &b]), Decision::Again);
        let b = agent("B", AgentState::Idle);
        assert_eq!(decide(WaitUntil::Idle, &[&a, &b]), Decision::Done);
        let b = agent("B", AgentState::Offline);
        assert_eq!(
            decide(WaitUntil::Idle, &[&a, &b]),
            Decision::Exited("B".into())
        );
        assert_eq!(decide(WaitUntil::Exit, &[&a, &b]), Decision::Again);
        let a = agent("A", AgentState::Offline);
        assert_eq!(decide(WaitUntil::Exit, &[&a, &b]), Decision::Done);
    }
}
