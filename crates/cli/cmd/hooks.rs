//! `agent-relay hooks`: Claude Code's hooks as a door into the agent.
//!
//! `hooks install claude` adds a `Stop` hook to the project's `.claude/settings.json` (merged
//! into what is there; `hooks uninstall claude` takes out exactly what was added, and gives the
//! file back byte for byte when nothing else changed). At the end of each turn Claude Code runs
//! `agent-relay hooks stop`, which hands the messages waiting for the agent to the model as the
//! hook's `{"decision": "block", "reason": ...}`: the model goes on with them as its next
//! input, without any typing. For an agent under a wrapper the hook asks the wrapper, through
//! its door (`team/NAME/door.sock`): the wrapper hands over the messages waiting to be typed
//! (recorded injected, then verified when the next Stop hook runs: the turn they started is
//! over) and types what no hook takes, so each message goes in through one door.

use std::path::{Path, PathBuf};

use anyhow::Context;
use relay_client::paths::Paths;
use relay_protocol::query::{HistoryFilter, MessageRecord, QueryRequest, QueryResult};
use relay_protocol::text::for_terminal;
use serde_json::{Value, json};

/// Arguments of `agent-relay hooks`.
#[derive(Debug, clap::Args)]
pub(crate) struct HooksArgs {
    #[command(subcommand)]
    pub(crate) action: HooksAction,
}

/// What `agent-relay hooks` does.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum HooksAction {
    /// Add the relay's Stop hook to this folder's .claude/settings.json (merged; a person's
    /// settings are kept). Claude Code started here then gets waiting relay messages at the end
    /// of its turns (an agent without a wrapper; a wrapped one keeps getting them typed).
    Install {
        /// The CLI: claude.
        #[arg(value_parser = ["claude"])]
        cli: String,
    },
    /// Take the relay's hooks out of .claude/settings.json again (the file as it was when
    /// nothing else changed since).
    Uninstall {
        /// The CLI: claude.
        #[arg(value_parser = ["claude"])]
        cli: String,
    },
    /// Run by Claude Code's Stop hook: prints the messages waiting for $AGENT_RELAY_NAME as a
    /// block decision, or nothing.
    #[command(hide = true)]
    Stop,
}

/// What marks the relay's own hook commands (so that uninstall takes out only those).
const MARK: &str = " hooks stop";
/// The settings file, relative to the folder Claude Code runs in.
const SETTINGS: &str = ".claude/settings.json";
/// The file as it was before `install`, for a byte-for-byte restore.
const BACKUP: &str = ".claude/settings.json.agent-relay-backup";
/// Most of the messages' text handed over in one reason (Claude Code replaces longer hook
/// output with a file path and a preview).
const MAX_REASON: usize = 9000;

/// Runs `agent-relay hooks`.
pub(crate) fn run(paths: &Paths, args: &HooksArgs) -> anyhow::Result<()> {
    let dir = std::env::current_dir().context("no working directory")?;
    match &args.action {
        HooksAction::Install { .. } => install(&dir),
        HooksAction::Uninstall { .. } => uninstall(&dir),
        HooksAction::Stop => stop(paths),
    }
}

fn our_command() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("cannot find the agent-relay executable")?;
    Ok(format!(
        "{}{MARK}",
        relay_wrap::tmux::sh_quote(&exe.to_string_lossy())
    ))
}

fn is_ours(hook: &Value) -> bool {
    hook["command"]
        .as_str()
        .is_some_and(|c| c.ends_with(MARK) && c.contains("agent-relay"))
}

fn read_settings(file: &Path) -> anyhow::Result<Option<(String, Value)>> {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            let value: Value = serde_json::from_str(&text).with_context(|| {
                format!("{} is not valid JSON; nothing was changed", file.display())
            })?;
            anyhow::ensure!(
                value.is_object(),
                "{} is not a JSON object; nothing was changed",
                file.display()
            );
            Ok(Some((text, value)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", file.display())),
    }
}

fn write_settings(file: &Path, value: &Value) -> anyhow::Result<()> {
    let text = format!("{}\n", serde_json::to_string_pretty(value)?);
    // A plain write keeps the file's mode (a person's settings file is theirs to set).
    std::fs::write(file, text.as_bytes())
        .with_context(|| format!("cannot write {}", file.display()))
}

/// Adds the Stop hook, unless it is there already.
fn install(dir: &Path) -> anyhow::Result<()> {
    let file = dir.join(SETTINGS);
    let existing = read_settings(&file)?;
    let mut value = existing
        .as_ref()
        .map_or_else(|| json!({}), |(_, v)| v.clone());
    let stops = value
        .as_object_mut()
        .map(|o| o.entry("hooks").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
        .map(|h| h.entry("Stop").or_insert_with(|| json!([])))
        .and_then(Value::as_array_mut)
        .with_context(|| format!("{}: hooks.Stop is not a list", file.display()))?;
    let present = stops.iter().any(|group| {
        group["hooks"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(is_ours))
    });
    if present {
        println!(
            "agent-relay: the relay's Stop hook is already in {}",
            file.display()
        );
        return Ok(());
    }
    stops.push(json!({"hooks": [{"type": "command", "command": our_command()?}]}));
    std::fs::create_dir_all(dir.join(".claude"))
        .with_context(|| format!("cannot create {}", dir.join(".claude").display()))?;
    // The person's file as it was, for uninstall (not overwritten by a second install).
    let backup = dir.join(BACKUP);
    if !backup.exists() {
        let original = existing.map(|(text, _)| text).unwrap_or_default();
        std::fs::write(&backup, original.as_bytes())
            .with_context(|| format!("cannot write {}", backup.display()))?;
    }
    write_settings(&file, &value)?;
    println!(
        "agent-relay: added the relay's Stop hook to {} (undo: agent-relay hooks uninstall claude)",
        file.display()
    );
    Ok(())
}

/// Takes out the relay's hooks; the original bytes back when nothing else changed.
fn uninstall(dir: &Path) -> anyhow::Result<()> {
    let file = dir.join(SETTINGS);
    let backup = dir.join(BACKUP);
    let Some((_, mut value)) = read_settings(&file)? else {
        println!("agent-relay: no {}; nothing to do", file.display());
        return Ok(());
    };
    if let Some(hooks) = value.get_mut("hooks").and_then(Value::as_object_mut) {
        if let Some(stops) = hooks.get_mut("Stop").and_then(Value::as_array_mut) {
            for group in stops.iter_mut() {
                if let Some(hs) = group.get_mut("hooks").and_then(Value::as_array_mut) {
                    hs.retain(|h| !is_ours(h));
                }
            }
            stops.retain(|g| g["hooks"].as_array().is_none_or(|hs| !hs.is_empty()));
            if stops.is_empty() {
                hooks.remove("Stop");
            }
        }
        if hooks.is_empty() {
            if let Some(o) = value.as_object_mut() {
                o.remove("hooks");
            }
        }
    }
    let original = match std::fs::read_to_string(&backup) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("cannot read {}: {e}", backup.display()),
    };
    match original {
        // No file before install, and nothing else added since: no file again.
        Some(text) if text.is_empty() && value == json!({}) => {
            std::fs::remove_file(&file)
                .with_context(|| format!("cannot remove {}", file.display()))?;
        }
        // Nothing else changed: the person's bytes (formatting, key order) back.
        Some(text) if serde_json::from_str::<Value>(&text).ok().as_ref() == Some(&value) => {
            std::fs::write(&file, text.as_bytes())
                .with_context(|| format!("cannot write {}", file.display()))?;
        }
        // Changed since (or no backup): only the relay's entries are taken out.
        _ => write_settings(&file, &value)?,
    }
    if backup.exists() {
        std::fs::remove_file(&backup)
            .with_context(|| format!("cannot remove {}", backup.display()))?;
    }
    println!(
        "agent-relay: took the relay's hooks out of {}",
        file.display()
    );
    Ok(())
}

/// Where the hook keeps the newest store position it handed over, per agent.
fn seen_file(paths: &Paths, name: &str) -> PathBuf {
    paths.data_dir.join("team").join(name).join("hook-seen")
}

/// The Stop hook: the waiting messages as a block decision, or nothing (Claude Code stops).
/// Never fails the hook: a relay that is not running, or any error, means nothing to hand over
/// (logged on stderr, which Claude Code shows only in its debug output).
fn stop(paths: &Paths) -> anyhow::Result<()> {
    // Claude Code's input (session, transcript, stop_hook_active): read whole, so that it is
    // not left unread in the pipe; `stop_hook_active` says this turn was one a Stop hook
    // continued.
    let mut input = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
        tracing::debug!(error = %e, "cannot read the hook's input");
    }
    let active = serde_json::from_str::<Value>(&input)
        .ok()
        .and_then(|v| v["stop_hook_active"].as_bool())
        .unwrap_or(false);
    let Ok(name) = std::env::var("AGENT_RELAY_NAME") else {
        return Ok(());
    };
    if relay_protocol::validate_agent_name(&name).is_err() {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let door = paths
        .data_dir
        .join("team")
        .join(&name)
        .join(relay_wrap::DOOR_SOCKET);
    if door.exists() {
        // A wrapper holds the name: it hands over what waits to be typed (or nothing).
        match rt.block_on(from_wrapper(&door, active)) {
            Ok(texts) if texts.is_empty() => {}
            Ok(texts) => block(&name, &texts)?,
            Err(e) => eprintln!("agent-relay hooks stop: nothing handed over: {e:#}"),
        }
        return Ok(());
    }
    let waiting = match rt.block_on(waiting(paths, &name)) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("agent-relay hooks stop: nothing handed over: {e:#}");
            return Ok(());
        }
    };
    let Some(last) = waiting.iter().map(|m| m.pos).max() else {
        return Ok(());
    };
    let mut reason = format!(
        "{} relay message{} arrived for you ({name}) while you worked. Answer with @relay:NAME \
         where an answer is needed.\n\n",
        waiting.len(),
        if waiting.len() == 1 { "" } else { "s" }
    );
    for m in &waiting {
        let thread = m
            .thread
            .as_deref()
            .map(|t| format!(" (thread {})", relay_protocol::short_id(t)))
            .unwrap_or_default();
        let piece = format!(
            "Relay message from {} [{}]{thread}:\n{}\n\n",
            for_terminal(&m.from),
            relay_protocol::short_id(&m.id),
            for_terminal(&m.body)
        );
        if reason.len() + piece.len() > MAX_REASON {
            reason.push_str(&format!(
                "(more waiting: `agent-relay read ID` or `agent-relay history --to {name}`)\n"
            ));
            break;
        }
        reason.push_str(&piece);
    }
    let file = seen_file(paths, &name);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    relay_protocol::file::write_atomic(
        &file,
        last.to_string().as_bytes(),
        relay_protocol::file::Durability::ProcessCrash,
    )
    .with_context(|| format!("cannot write {}", file.display()))?;
    println!(
        "{}",
        relay_protocol::text::json_line(
            &json!({"decision": "block", "reason": reason.trim_end()})
        )?
    );
    Ok(())
}

/// Prints the block decision that hands `texts` (as the wrapper would have typed them) to the
/// model.
fn block(name: &str, texts: &[String]) -> anyhow::Result<()> {
    let mut reason = format!(
        "{} relay message{} arrived for you ({name}) while you worked. Answer with @relay:NAME \
         where an answer is needed.\n\n",
        texts.len(),
        if texts.len() == 1 { "" } else { "s" }
    );
    for t in texts {
        reason.push_str(t);
        reason.push_str("\n\n");
    }
    println!(
        "{}",
        relay_protocol::text::json_line(
            &json!({"decision": "block", "reason": reason.trim_end()})
        )?
    );
    Ok(())
}

/// Asks the wrapper of this agent, through its door, for the messages waiting to be typed.
async fn from_wrapper(door: &Path, active: bool) -> anyhow::Result<Vec<String>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(door)
        .await
        .with_context(|| format!("cannot reach the wrapper's door {}", door.display()))?;
    let (read, mut write) = stream.into_split();
    let ask = format!("{}\n", json!({"hook": "stop", "active": active}));
    write.write_all(ask.as_bytes()).await?;
    let mut line = String::new();
    tokio::io::BufReader::new(read).read_line(&mut line).await?;
    let answer: Value = serde_json::from_str(&line).context("the wrapper's answer")?;
    if let Some(e) = answer["error"].as_str() {
        anyhow::bail!("the wrapper: {e}");
    }
    Ok(answer["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str().map(String::from))
        .collect())
}

/// The messages for `name` the hook has not handed over, oldest first; none when a wrapper
/// holds the name (it types them).
async fn waiting(paths: &Paths, name: &str) -> anyhow::Result<Vec<MessageRecord>> {
    let client = crate::cmd::tool_client(&paths.socket, name).await?;
    let agents = client.query(QueryRequest::Agents).await;
    let history = client
        .query(QueryRequest::History(HistoryFilter {
            to: Some(name.to_owned()),
            limit: Some(100),
            ..HistoryFilter::default()
        }))
        .await;
    client.close().await;
    if let QueryResult::Agents { agents } = agents? {
        let wrapped = agents
            .iter()
            .any(|a| a.name == name && a.online && a.cli.as_deref() != Some("mcp"));
        if wrapped {
            return Ok(Vec::new());
        }
    }
    let QueryResult::History { messages } = history? else {
        anyhow::bail!("unexpected answer to history");
    };
    let seen: i64 = std::fs::read_to_string(seen_file(paths, name))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let mut new: Vec<MessageRecord> = messages
        .into_iter()
        .filter(|m| m.pos > seen && m.from != name)
        .collect();
    new.reverse();
    Ok(new)
}
