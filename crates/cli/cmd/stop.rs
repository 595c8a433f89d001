//! `agent-relay stop NAME`, `down --all` and `agents forget NAME`: stopping wrapped agents,
//! and forgetting agents that will not come back.
//!
//! A wrapper is found through the lock it holds for its whole life in the agent's directory
//! `<data>/team/<NAME>/`: `pty.lock` (a wrapper running the agent in a PTY) or `relay.lock`
//! (the background process relaying for a tmux session), each with the holder's pid written
//! in. A pid is trusted only while its file is locked, so a stale file names nobody. Stopping
//! is SIGTERM: a PTY wrapper then ends its agent and exits; a tmux relaying process exits
//! and the session (the agent with it) is killed after it. Messages stored for the agent are
//! not touched: they wait, and are delivered when it runs again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use relay_client::paths::Paths;
use relay_protocol::query::{AgentInfo, QueryRequest, QueryResult};
use relay_wrap::tmux;
use rustix::fs::{FlockOperation, flock};

use crate::args::StopArgs;
use crate::exit::Coded;
use crate::out::line;

/// The lock a PTY wrapper holds in its agent's directory.
pub(crate) const PTY_LOCK: &str = "pty.lock";
/// The lock the process relaying for a tmux session holds.
pub(crate) const RELAY_LOCK: &str = "relay.lock";

/// The pid written in `lock`, if a live process holds it.
fn holder(lock: &Path) -> Option<i32> {
    let file = std::fs::OpenOptions::new().read(true).open(lock).ok()?;
    match flock(&file, FlockOperation::NonBlockingLockShared) {
        // Taken, so nobody holds it: the pid in it (if any) is stale. Released on drop.
        Ok(()) => None,
        Err(_) => std::fs::read_to_string(lock).ok()?.trim().parse().ok(),
    }
}

/// Whether a live process holds `lock`.
fn held(lock: &Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new().read(true).open(lock) else {
        return false;
    };
    flock(&file, FlockOperation::NonBlockingLockShared).is_err()
}

fn term(pid: i32) -> anyhow::Result<()> {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        anyhow::bail!("invalid pid {pid}");
    };
    match rustix::process::kill_process(p, rustix::process::Signal::Term) {
        // Gone between reading its pid and signalling it: stopped already.
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("cannot signal pid {pid}: {e}")),
    }
}

/// Waits until `done`, or fails at `deadline` naming `what`.
fn wait_until(deadline: Instant, what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    while !done() {
        if relay_protocol::now_instant() > deadline {
            anyhow::bail!("{what} did not stop in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn team_dir(paths: &Paths, name: &str) -> PathBuf {
    paths.data_dir.join("team").join(name)
}

/// Stops agent `name`'s wrapper, agent and tmux session, whichever run; what was stopped
/// (empty when nothing ran).
/// `by` is the command that stops it, which a person attached to the agent's session is told.
pub(crate) fn stop_one(
    paths: &Paths,
    name: &str,
    deadline: Instant,
    by: &str,
) -> anyhow::Result<Vec<String>> {
    let dir = team_dir(paths, name);
    let mut stopped = Vec::new();
    let pty_lock = dir.join(PTY_LOCK);
    if let Some(pid) = holder(&pty_lock) {
        term(pid)?;
        wait_until(deadline, &format!("{name}'s wrapper (pid {pid})"), || {
            !held(&pty_lock)
        })?;
        stopped.push(format!("its wrapper (pid {pid}) and agent"));
    }
    let relay_lock = dir.join(RELAY_LOCK);
    if let Some(pid) = holder(&relay_lock) {
        // First the relaying process, so that it does not take the session's end for the
        // agent exiting by itself; it records how far it read before it goes.
        term(pid)?;
        wait_until(
            deadline,
            &format!("{name}'s relaying process (pid {pid})"),
            || !held(&relay_lock),
        )?;
        stopped.push(format!("its relaying process (pid {pid})"));
    }
    let session = tmux::session_name(&paths.project_root, name);
    if tmux::exists(&session) {
        // An attached `agent-relay -n NAME <cli>` reports this as the agent's exit status:
        // stopped by SIGTERM, not "unknown".
        let exit = dir.join("exit");
        if let Err(e) = relay_wrap::state::write_atomically(&exit, b"143\n") {
            eprintln!("agent-relay: warning: cannot write {}: {e}", exit.display());
        }
        // Who stopped it: tmux shows an attached person only `[exited]`.
        let marker = dir.join(relay_wrap::tmux::STOPPED_BY);
        if let Err(e) = relay_wrap::state::write_atomically(&marker, format!("{by}\n").as_bytes()) {
            eprintln!(
                "agent-relay: warning: cannot write {}: {e}",
                marker.display()
            );
        }
        tmux::kill(&session);
        wait_until(deadline, &format!("tmux session {session}"), || {
            !tmux::exists(&session)
        })?;
        stopped.push(format!("its tmux session {session}"));
    }
    Ok(stopped)
}

/// The agents the relay knows, or `None` when it is not running.
fn known_agents(paths: &Paths) -> anyhow::Result<Option<Vec<AgentInfo>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = match crate::cmd::tool_client(&paths.socket, "cli").await {
            Ok(c) => c,
            Err(e) if crate::exit::code_of(&e) == 3 => return Ok(None),
            Err(e) => return Err(e),
        };
        let res = client.query(QueryRequest::Agents).await;
        client.close().await;
        match res? {
            QueryResult::Agents { agents } => Ok(Some(agents)),
            _ => anyhow::bail!("unexpected answer to agents"),
        }
    })
}

/// `agent-relay stop NAME`.
pub(crate) fn stop(paths: &Paths, args: &StopArgs) -> anyhow::Result<()> {
    let name = &args.name;
    relay_protocol::validate_agent_name(name)
        .map_err(|e| crate::exit::usage(format!("{name:?}: {e}")))?;
    let deadline = relay_protocol::now_instant() + Duration::from_secs(args.timeout);
    let stopped = stop_one(paths, name, deadline, &format!("`agent-relay stop {name}`"))?;
    if !stopped.is_empty() {
        line(format!(
            "stopped {name}: {}; messages for {name} stay stored and reach it when it runs again",
            stopped.join(", ")
        ))?;
        return Ok(());
    }
    let agents = known_agents(paths)?.unwrap_or_default();
    match agents.iter().find(|a| &a.name == name) {
        Some(a) if a.online => Err(anyhow::anyhow!(
            "{name} is connected, but not through a wrapper of this project's relay (none holds a \
             lock in {}): stop it where it runs",
            team_dir(paths, name).display()
        )),
        Some(_) => Ok(line(format!(
            "{name} is not running (`agent-relay agents forget {name}` removes it from the list)"
        ))?),
        None => Err(Coded {
            code: 4,
            message: format!(
                "no agent {name} runs or is known here (`agent-relay agents` lists them)"
            ),
        }
        .into()),
    }
}

/// `agent-relay down --all`, before the daemon is stopped: stops every wrapped agent of the
/// project, and says which agents stay connected (not run by a wrapper it can find).
pub(crate) fn stop_all(paths: &Paths, timeout: u64) -> anyhow::Result<()> {
    let deadline = relay_protocol::now_instant() + Duration::from_secs(timeout);
    let team = paths.data_dir.join("team");
    let mut names: Vec<String> = match std::fs::read_dir(&team) {
        Ok(dir) => dir
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| relay_protocol::validate_agent_name(n).is_ok())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", team.display())),
    };
    names.sort();
    for name in &names {
        let stopped = stop_one(paths, name, deadline, "`agent-relay down --all`")?;
        if !stopped.is_empty() {
            line(format!("stopped {name}: {}", stopped.join(", ")))?;
        }
    }
    // The daemon notices a wrapper's connection end as soon as it goes; one still listed
    // online is not a wrapper this could stop. A person's connection is the relay's own (its
    // people adapters): it ends with the relay.
    if let Some(agents) = known_agents(paths)? {
        let own = |a: &AgentInfo| a.cli.as_deref() == Some(relay_protocol::PERSON_CLI);
        for a in agents.iter().filter(|a| a.online && !own(a)) {
            eprintln!(
                "agent-relay: warning: {} is still connected, not run by a wrapper of this \
                 project; it will connect to the next relay started here",
                relay_protocol::text::one_line(&a.name, 64)
            );
        }
    }
    Ok(())
}

/// `agent-relay agents forget NAME`.
pub(crate) async fn forget(paths: &Paths, name: &str) -> anyhow::Result<()> {
    relay_protocol::validate_agent_name(name)
        .map_err(|e| crate::exit::usage(format!("{name:?}: {e}")))?;
    let client = crate::cmd::tool_client(&paths.socket, "cli").await?;
    let res = client
        .query(QueryRequest::ForgetAgent {
            name: name.to_owned(),
        })
        .await;
    client.close().await;
    match res? {
        QueryResult::ForgetAgent { name } => Ok(line(format!(
            "forgot {}; messages stored for it stay stored (delivered if it connects again, \
             else they expire)",
            relay_protocol::text::one_line(&name, 64)
        ))?),
        _ => anyhow::bail!("unexpected answer to agents forget"),
    }
}
