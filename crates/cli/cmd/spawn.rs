//! `agent-relay spawn` and `agent-relay release` (issue 25): a lead starts a worker with a
//! task and stops it again. The relay decides and records (`spawn` QUERY: the access rule
//! `deny-spawn`, the caps, the parent, the name; the task stored as a message from the asker);
//! this process then starts the worker's wrapper, detached in tmux, as `wrap --detached` does.
//! The task is a stored message, never in any argv.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use relay_client::paths::Paths;
use relay_protocol::query::{AgentState, QueryRequest, QueryResult, SpawnRecord, SpawnRequest};
use relay_protocol::text::one_line;

use crate::args::{ReleaseArgs, SpawnArgs};
use crate::cmd::tool_client;
use crate::out::{json, line};

/// Where worktrees of spawned workers are made, under the project's root.
const WORKTREES: &str = ".agent-relay/worktrees";

/// Who asks the relay to spawn or release.
#[derive(Debug, Clone)]
pub(crate) enum Asker {
    /// The agent this command runs inside (its wrapper's door and key are in its environment):
    /// asked on the wrapper's connection, as the agent.
    Door {
        /// The agent's name.
        name: String,
        /// Its wrapper's door.
        door: PathBuf,
        /// The door key.
        key: String,
    },
    /// A tool connection under this name (`--from`, or the person).
    Tool(String),
}

impl Asker {
    /// `--from NAME` when given; else the agent whose wrapper's door key is in this process's
    /// environment (run by a wrapped agent); else the person.
    pub(crate) fn of(paths: &Paths, from: Option<&str>) -> Self {
        if let Some(f) = from {
            return Self::Tool(f.to_owned());
        }
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let (Some(name), Some(key)) = (var("AGENT_RELAY_NAME"), var(relay_wrap::DOOR_KEY_ENV))
            && relay_protocol::validate_agent_name(&name).is_ok()
        {
            let door = paths
                .data_dir
                .join("team")
                .join(&name)
                .join(relay_wrap::DOOR_SOCKET);
            if door.exists() {
                return Self::Door { name, door, key };
            }
        }
        Self::Tool(relay_protocol::HUMAN.to_owned())
    }

    /// The asker's name.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Door { name, .. } | Self::Tool(name) => name,
        }
    }
}

/// One QUERY as `asker`.
fn ask_as(paths: &Paths, asker: &Asker, req: QueryRequest) -> anyhow::Result<QueryResult> {
    match asker {
        Asker::Tool(from) => ask(paths, from, req),
        Asker::Door { name, door, key } => {
            use std::io::{BufRead, Write};
            let stream = std::os::unix::net::UnixStream::connect(door)
                .with_context(|| format!("cannot reach {name}'s wrapper at {}", door.display()))?;
            let request = serde_json::json!({"query": req, "key": key});
            (&stream).write_all(format!("{request}\n").as_bytes())?;
            let mut answer = String::new();
            std::io::BufReader::new(&stream).read_line(&mut answer)?;
            let v: serde_json::Value = serde_json::from_str(&answer)
                .with_context(|| format!("{name}'s wrapper answered {answer:?}"))?;
            if let Some(result) = v.get("result") {
                return Ok(serde_json::from_value(result.clone())?);
            }
            let message = v["error"].as_str().unwrap_or("no answer").to_owned();
            match v["code"].as_str() {
                Some(code) => Err(relay_client::ClientError::Query {
                    code: code.to_owned(),
                    message,
                }
                .into()),
                None => anyhow::bail!("{name}'s wrapper: {message}"),
            }
        }
    }
}

/// One QUERY as `from`, on a runtime of its own.
fn ask(paths: &Paths, from: &str, req: QueryRequest) -> anyhow::Result<QueryResult> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = tool_client(&paths.socket, from).await?;
        let res = client.query(req).await;
        client.close().await;
        Ok(res?)
    })
}

/// The task's text: `--task`, or `--task-file` (`-`: stdin).
fn task_text(args: &SpawnArgs) -> anyhow::Result<Option<String>> {
    let text = match (&args.task, &args.task_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) if f.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
            s
        }
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the task file {}", f.display()))?,
        (None, None) => return Ok(None),
    };
    let text = text.trim_end_matches('\n').to_owned();
    if text.trim().is_empty() {
        return Err(crate::exit::usage(
            "the task is empty; give its text with --task TEXT or --task-file FILE",
        ));
    }
    Ok(Some(text))
}

/// `git -C dir ARGS`: its stdout, or an error with its stderr.
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run git (is it installed?)")?;
    if !out.status.success() {
        anyhow::bail!(
            "git {} failed: {}",
            args.join(" "),
            one_line(String::from_utf8_lossy(&out.stderr).trim(), 400)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The worker's own worktree at `dir`, on branch `relay/NAME` (made from the current HEAD, or
/// taken up again when it exists from an earlier worker of that name).
fn add_worktree(root: &Path, dir: &Path, name: &str) -> anyhow::Result<()> {
    exclude_worktrees(root);
    let branch = format!("relay/{name}");
    let dir_s = dir.to_string_lossy();
    let exists = git(root, &["rev-parse", "--verify", "--quiet", &branch]).is_ok();
    if exists {
        git(root, &["worktree", "add", &dir_s, &branch])?;
    } else {
        git(root, &["worktree", "add", "-b", &branch, &dir_s])?;
    }
    Ok(())
}

/// Keeps the workers' worktrees out of the project's own `git status`: `.agent-relay/worktrees/`
/// in the repository's `info/exclude` (local, never committed). A failure is only logged.
fn exclude_worktrees(root: &Path) {
    let line = format!("/{WORKTREES}/");
    let result = git(root, &["rev-parse", "--git-common-dir"]).and_then(|common| {
        let common = PathBuf::from(common.trim());
        let info = if common.is_absolute() {
            common
        } else {
            root.join(common)
        }
        .join("info");
        std::fs::create_dir_all(&info)?;
        let exclude = info.join("exclude");
        let text = std::fs::read_to_string(&exclude).unwrap_or_default();
        if !text.lines().any(|l| l.trim() == line) {
            let sep = if text.is_empty() || text.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            std::fs::write(&exclude, format!("{text}{sep}{line}\n"))?;
        }
        Ok(())
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, "cannot add the workers' worktrees to git's info/exclude");
    }
}

/// What became of a released worker's worktree.
#[derive(Debug, serde::Serialize)]
struct WorktreeFate {
    path: String,
    removed: bool,
    /// Why it was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    kept_because: Option<String>,
}

/// Removes worktree `dir` when it is clean; a dirty one (or one git cannot read) is kept.
/// Its branch stays either way: what the worker committed is on it.
fn remove_worktree(root: &Path, dir: &Path) -> WorktreeFate {
    let path = dir.to_string_lossy().into_owned();
    if !dir.exists() {
        return WorktreeFate {
            path,
            removed: false,
            kept_because: Some("it no longer exists".into()),
        };
    }
    let kept = |why: String| WorktreeFate {
        path: path.clone(),
        removed: false,
        kept_because: Some(why),
    };
    match git(dir, &["status", "--porcelain"]) {
        Ok(s) if s.trim().is_empty() => match git(root, &["worktree", "remove", &path]) {
            Ok(_) => WorktreeFate {
                path,
                removed: true,
                kept_because: None,
            },
            Err(e) => kept(format!("{e:#}")),
        },
        Ok(_) => kept("it has uncommitted changes".into()),
        Err(e) => kept(format!("{e:#}")),
    }
}

/// `agent-relay spawn [-n NAME] [--task TEXT | --task-file F] [--worktree] [--notify idle]
/// CLI [ARGS...]`.
pub(crate) fn spawn(paths: &Paths, args: &SpawnArgs) -> anyhow::Result<()> {
    super::check_agent_program(&args.command)?;
    let task = task_text(args)?;
    if let Some(n) = &args.name {
        relay_protocol::validate_agent_name(n)
            .map_err(|e| crate::exit::usage(format!("-n {:?}: {e}", one_line(n, 80))))?;
    }
    let root = paths.project_root.clone();
    let worktrees = root.join(WORKTREES);
    if args.worktree {
        git(&root, &["rev-parse", "--show-toplevel"]).map_err(|e| {
            crate::exit::usage(format!(
                "--worktree needs the project to be a git repository ({}): {e:#}",
                root.display()
            ))
        })?;
        std::fs::create_dir_all(&worktrees)
            .with_context(|| format!("cannot create {}", worktrees.display()))?;
    }
    // The relay starts if it is not running, as for `wrap`.
    let (settings, _) = crate::settings::for_project(paths, &crate::settings::Flags::new())?;
    crate::cmd::up::start_background(paths, &settings.settings)
        .context("cannot start the relay")?;
    let req = SpawnRequest {
        name: args.name.clone(),
        task,
        worktree_in: args
            .worktree
            .then(|| worktrees.to_string_lossy().into_owned()),
        notify_idle: args.notify.is_some(),
        check: false,
    };
    let asker = Asker::of(paths, args.from.as_deref());
    let (record, task_id) = match ask_as(paths, &asker, QueryRequest::Spawn(req))? {
        QueryResult::Spawn { record, task_id } => (record, task_id),
        other => anyhow::bail!("unexpected answer to spawn: {other:?}"),
    };
    let name = record.name.clone();
    let cwd = match &record.worktree {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if let Err(e) = add_worktree(&root, &dir, &name) {
                end_record(paths, &asker, &name);
                return Err(e.context(format!("cannot make {name}'s worktree")));
            }
            dir
        }
        None => std::env::current_dir().context("no working directory")?,
    };
    let started = start_wrapper(paths, args, &name, &cwd);
    if let Err(e) = started {
        // Not running: its record ends (the cap counts it no more) and a clean worktree goes.
        end_record(paths, &asker, &name);
        if record.worktree.is_some() {
            let fate = remove_worktree(&root, &cwd);
            if !fate.removed {
                eprintln!(
                    "agent-relay: kept {name}'s worktree {}: {}",
                    fate.path,
                    fate.kept_because.unwrap_or_default()
                );
            }
        }
        return Err(e);
    }
    let session = relay_wrap::tmux::session_name(&paths.project_root, &name);
    if args.json {
        return json(&serde_json::json!({
            "name": name,
            "parent": record.parent,
            "depth": record.depth,
            "task_id": task_id,
            "worktree": record.worktree,
            "notify_idle": record.notify_idle,
            "session": session,
        }));
    }
    line(&name)?;
    Ok(())
}

/// Ends the record of a worker that did not start (asked as its parent, who may).
fn end_record(paths: &Paths, asker: &Asker, name: &str) {
    let req = QueryRequest::Release {
        name: name.to_owned(),
    };
    if let Err(e) = ask_as(paths, asker, req) {
        eprintln!(
            "agent-relay: warning: {name} did not start, and its record could not be ended ({e:#}); `agent-relay release {name}` ends it"
        );
    }
}

/// Runs `agent-relay wrap --backend tmux --detached -n NAME ... -- CLI ARGS` in `cwd`: it
/// returns once the worker is connected and past its start, or fails with its exit status
/// and last lines.
fn start_wrapper(paths: &Paths, args: &SpawnArgs, name: &str, cwd: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the agent-relay executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["wrap", "--backend", "tmux", "--detached", "-n", name])
        .args(["--delivery", args.delivery.as_str()]);
    if let Some(p) = &args.profile {
        cmd.args(["--profile", p]);
    }
    for t in &args.subscribe {
        cmd.args(["--subscribe", t]);
    }
    // The lead's relay, whatever the worktree's own project root would say (a worktree
    // that tracks `.agent-relay/` is a project root of its own).
    cmd.arg("--")
        .args(&args.command)
        .env("AGENT_RELAY_SOCKET", &paths.socket)
        .env("AGENT_RELAY_DATA_DIR", &paths.data_dir)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let status = cmd.status().context("cannot start the worker's wrapper")?;
    if !status.success() {
        return Err(crate::exit::Coded {
            code: status.code().unwrap_or(1),
            message: format!("{name} did not start (its wrapper said why, above)"),
        }
        .into());
    }
    Ok(())
}

/// `agent-relay release NAME [--now]`.
pub(crate) fn release(paths: &Paths, args: &ReleaseArgs) -> anyhow::Result<()> {
    let name = &args.name;
    relay_protocol::validate_agent_name(name)
        .map_err(|e| crate::exit::usage(format!("{:?}: {e}", one_line(name, 80))))?;
    let req = QueryRequest::Release { name: name.clone() };
    let asker = Asker::of(paths, args.from.as_deref());
    let record = match ask_as(paths, &asker, req)? {
        QueryResult::Release { record } => record,
        other => anyhow::bail!("unexpected answer to release: {other:?}"),
    };
    let waited = if args.now {
        None
    } else {
        Some(wait_idle(paths, name, args.timeout)?)
    };
    let deadline = relay_protocol::now_instant() + Duration::from_secs(30);
    let by = format!("`agent-relay release {name}` (for {})", asker.name());
    let stopped = crate::cmd::stop::stop_one(paths, name, deadline, &by)?;
    let fate = record
        .worktree
        .as_ref()
        .map(|d| remove_worktree(&paths.project_root, Path::new(d)));
    report_release(args, &record, waited, &stopped, fate.as_ref())
}

/// Waits until `name` is idle or offline (at most `timeout` seconds, when given); its state
/// then.
fn wait_idle(paths: &Paths, name: &str, timeout: Option<u64>) -> anyhow::Result<AgentState> {
    let deadline = timeout.map(|s| relay_protocol::now_instant() + Duration::from_secs(s));
    let mut told = false;
    loop {
        let state = match ask(paths, "cli", QueryRequest::Agents)? {
            QueryResult::Agents { agents } => agents
                .iter()
                .find(|a| a.name == name)
                .map_or(AgentState::Offline, |a| a.state),
            other => anyhow::bail!("unexpected answer to agents: {other:?}"),
        };
        if matches!(state, AgentState::Idle | AgentState::Offline) {
            return Ok(state);
        }
        if deadline.is_some_and(|d| relay_protocol::now_instant() >= d) {
            return Err(crate::exit::Coded {
                code: crate::cmd::team::WAIT_TIMED_OUT,
                message: format!(
                    "{name} is still {} after the --timeout: it is released but still runs; stop \
                     it at once with `agent-relay stop {name}`",
                    state.as_str()
                ),
            }
            .into());
        }
        if !told {
            told = true;
            eprintln!(
                "agent-relay: {name} is {}; releasing it once it is idle (--now does not wait)",
                state.as_str()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn report_release(
    args: &ReleaseArgs,
    record: &SpawnRecord,
    waited: Option<AgentState>,
    stopped: &[String],
    fate: Option<&WorktreeFate>,
) -> anyhow::Result<()> {
    let name = &record.name;
    if args.json {
        return json(&serde_json::json!({
            "name": name,
            "parent": record.parent,
            "waited_for": waited,
            "stopped": stopped,
            "worktree": fate,
        }));
    }
    let what = if stopped.is_empty() {
        "it was not running".to_owned()
    } else {
        format!("stopped {}", stopped.join(", "))
    };
    let mut text = format!(
        "released {name}: {what}; its messages stay stored (agent-relay history --to {name})"
    );
    if let Some(f) = fate {
        if f.removed {
            text.push_str(&format!("; its clean worktree {} was removed", f.path));
        } else {
            text.push_str(&format!(
                "; its worktree {} was kept ({}), on branch relay/{name}",
                f.path,
                f.kept_because.as_deref().unwrap_or("")
            ));
        }
    }
    line(text)?;
    Ok(())
}

/// After the relaying process of a tmux agent ended: when the agent exited on its own (its
/// exit status was written and no command of the relay stopped it), the relay is told, and a
/// spawned worker's parent with it. Waits (bounded) until the relay has seen its connection
/// go, since it does not take an exit from a connected agent.
pub(crate) fn report_exit(paths: &Paths, name: &str, team_dir: &Path) {
    let exit = team_dir.join("exit");
    let Ok(text) = std::fs::read_to_string(&exit) else {
        return;
    };
    if relay_wrap::tmux::stopped_by(team_dir).is_some() {
        return;
    }
    let status = text.trim().parse::<i32>().ok();
    let lines = relay_wrap::tmux::last_lines(team_dir, 15);
    let deadline = relay_protocol::now_instant() + Duration::from_secs(10);
    loop {
        let online = match ask(paths, "cli", QueryRequest::Agents) {
            Ok(QueryResult::Agents { agents }) => agents.iter().any(|a| a.name == name && a.online),
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(error = %e, "cannot ask the relay about the agent's exit");
                return;
            }
        };
        if !online || relay_protocol::now_instant() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let req = QueryRequest::SpawnExited {
        name: name.to_owned(),
        status,
        lines,
    };
    match ask(paths, "cli", req) {
        Ok(QueryResult::SpawnExited { told }) => {
            tracing::info!(told, "told the relay that the agent exited");
        }
        Ok(other) => tracing::warn!(?other, "unexpected answer to spawn_exited"),
        Err(e) => tracing::warn!(error = %e, "cannot tell the relay that the agent exited"),
    }
}
