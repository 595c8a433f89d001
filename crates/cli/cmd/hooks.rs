//! `agent-relay hooks`: Claude Code's hooks as a door into the agent.
//!
//! `hooks install claude` adds a `Stop` hook to the folder's `.claude/settings.local.json`
//! (the person's own, which Claude Code keeps out of git; `--shared` for the project's
//! `.claude/settings.json`, with the command `agent-relay` as found on each teammate's PATH);
//! merged into what is there; `hooks uninstall claude` takes out exactly what was added, and
//! gives the file back byte for byte when nothing else changed (the original is kept in the
//! relay's data directory, never next to the settings). At the end of each turn Claude Code
//! runs `agent-relay hooks stop`, which hands the messages waiting for the agent to the model as
//! the hook's `additionalContext` (`hookSpecificOutput`, exit 0): the model goes on with them as
//! its next input, without any typing. (A `{"decision": "block"}` would do the same, but Claude
//! Code 2.1 counts a block as the hook's failure and shows "stop hook reported a problem".)
//! For an agent under a wrapper the hook asks the wrapper, through its door (`team/NAME/door.sock`): the wrapper hands over the messages waiting to be typed
//! (recorded injected, then verified when the next Stop hook runs: the turn they started is
//! over) and types what no hook takes, so each message goes in through one door. Without a
//! wrapper the hook is a mailbox door itself (`mailbox.rs`): it holds the name for a moment and
//! takes the oldest waiting messages, each recorded verified by the hook in the store, which
//! every door reads (so `relay_inbox` never shows them again). Either way one answer holds at
//! most `relay_wrap::HOOK_TEXT_MAX` bytes of messages; the rest wait, in order.
//!
//! It also adds a `UserPromptSubmit` hook, `agent-relay hooks prompt`: when a person submits a
//! prompt while messages wait (a wrapper holds them back while a person writes a line), they go
//! in with that prompt as the turn's `additionalContext` (recorded the same way: injected, then
//! verified when the turn's Stop hook runs; never typed after).
//!
//! And a `PostToolUse` hook for Claude Code's file edits (matcher `Edit|MultiEdit|Write`),
//! `agent-relay hooks edited` (issue 25.7): it reports the file an edit touched to the relay
//! (`QUERY edited`), as the agent and only as it: through its wrapper's door (with the door
//! key), its MCP server's door, or else holding its name for a moment. The relay tells the
//! editor and whoever claimed the file, or edited it within a minute, once; the hook prints
//! nothing (the relay's notices reach the model as messages do).

use std::path::{Path, PathBuf};

use anyhow::Context;
use relay_client::paths::Paths;
use relay_protocol::text::for_terminal;
use serde_json::{Value, json};

use crate::cmd::mailbox::Mailbox;

/// Arguments of `agent-relay hooks`.
#[derive(Debug, clap::Args)]
pub(crate) struct HooksArgs {
    #[command(subcommand)]
    pub(crate) action: HooksAction,
}

/// What `agent-relay hooks` does.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum HooksAction {
    /// Add the relay's Stop and UserPromptSubmit hooks to this folder's
    /// .claude/settings.local.json (yours, kept out of git by Claude Code; merged, your
    /// settings are kept). Claude Code started here then gets waiting relay messages at the end
    /// of its turns and with a person's prompts (under a wrapper, those that wait to be typed).
    /// Unwrapped, Claude Code's hooks need AGENT_RELAY_NAME (see docs/AGENTS.md).
    Install {
        /// The CLI: claude.
        #[arg(value_parser = ["claude"])]
        cli: String,
        /// Install into the project's shared .claude/settings.json instead, with the command
        /// `agent-relay` as each teammate's PATH finds it (not this binary's path).
        #[arg(long)]
        shared: bool,
    },
    /// Take the relay's hooks out of .claude/settings.local.json again (the file as it was
    /// when nothing else changed since).
    Uninstall {
        /// The CLI: claude.
        #[arg(value_parser = ["claude"])]
        cli: String,
        /// Take them out of the project's shared .claude/settings.json.
        #[arg(long)]
        shared: bool,
    },
    /// Run by Claude Code's Stop hook: prints the messages waiting for $AGENT_RELAY_NAME as the
    /// Stop hook's additional context (the model goes on with them), or nothing.
    #[command(hide = true)]
    Stop,
    /// Run by Claude Code's UserPromptSubmit hook: prints the messages waiting for
    /// $AGENT_RELAY_NAME as the turn's additional context, or nothing.
    #[command(hide = true)]
    Prompt,
    /// Run by Claude Code's PostToolUse hook after an Edit, MultiEdit or Write: reports the
    /// file to the relay as $AGENT_RELAY_NAME's edit (others who claimed or edited it are told).
    #[command(hide = true)]
    Edited,
}

/// A Claude Code hook the relay answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// `Stop`: the model is about to stop; waiting messages make it go on.
    Stop,
    /// `UserPromptSubmit`: a prompt was submitted; waiting messages go in with it.
    Prompt,
    /// `PostToolUse` of a file edit: the file is reported to the relay (nothing handed over).
    Edited,
}

impl Event {
    /// Every hook `install` adds.
    const ALL: [Event; 3] = [Event::Stop, Event::Prompt, Event::Edited];

    /// Claude Code's name of the hook event (the key under `hooks` in its settings).
    fn name(self) -> &'static str {
        match self {
            Event::Stop => "Stop",
            Event::Prompt => "UserPromptSubmit",
            Event::Edited => "PostToolUse",
        }
    }

    /// The `agent-relay hooks` subcommand that answers it.
    fn subcommand(self) -> &'static str {
        match self {
            Event::Stop => "stop",
            Event::Prompt => "prompt",
            Event::Edited => "edited",
        }
    }

    /// Claude Code's matcher for the hook: the tools it runs after (none: every time).
    fn matcher(self) -> Option<&'static str> {
        match self {
            Event::Edited => Some(EDIT_TOOLS),
            Event::Stop | Event::Prompt => None,
        }
    }
}

/// The Claude Code tools whose edits the PostToolUse hook reports.
const EDIT_TOOLS: &str = "Edit|MultiEdit|Write";

/// What marks the relay's own hook commands (so that uninstall takes out only those): the
/// command ends with ` hooks <subcommand>`.
const MARK: &str = " hooks ";
/// The person's own settings file, relative to the folder Claude Code runs in.
const SETTINGS_LOCAL: &str = ".claude/settings.local.json";
/// The project's settings file, shared through git.
const SETTINGS_SHARED: &str = ".claude/settings.json";
/// What the shared file runs: found on each teammate's PATH.
const SHARED_PROGRAM: &str = "agent-relay";

/// Runs `agent-relay hooks`.
pub(crate) fn run(paths: &Paths, args: &HooksArgs) -> anyhow::Result<()> {
    let dir = std::env::current_dir().context("no working directory")?;
    match &args.action {
        HooksAction::Install { shared, .. } => install(paths, &dir, *shared),
        HooksAction::Uninstall { shared, .. } => uninstall(paths, &dir, *shared),
        HooksAction::Stop => answer(paths, Event::Stop),
        HooksAction::Prompt => answer(paths, Event::Prompt),
        HooksAction::Edited => edited(paths),
    }
}

/// The hook's command: this binary's own path in the person's file; `agent-relay`, as the
/// PATH finds it, in the shared one (a teammate's binary is elsewhere).
fn our_command(event: Event, shared: bool) -> anyhow::Result<String> {
    let program = if shared {
        SHARED_PROGRAM.to_owned()
    } else {
        let exe = std::env::current_exe().context("cannot find the agent-relay executable")?;
        relay_wrap::tmux::sh_quote(&exe.to_string_lossy())
    };
    Ok(format!("{program}{MARK}{}", event.subcommand()))
}

/// The settings file `install` and `uninstall` edit.
fn settings_file(dir: &Path, shared: bool) -> PathBuf {
    dir.join(if shared {
        SETTINGS_SHARED
    } else {
        SETTINGS_LOCAL
    })
}

/// Where `install` keeps the settings file's bytes as they were, for a byte-for-byte restore:
/// in the relay's data directory, so that no stray file sits in the person's project. Absent
/// when there was no settings file before.
fn backup_file(paths: &Paths, settings: &Path) -> PathBuf {
    let key = settings.to_string_lossy().replace('/', "%");
    paths.data_dir.join("hooks-backup").join(key)
}

/// Whether `hook` is the relay's own, answering `event`.
fn is_ours_for(hook: &Value, event: Event) -> bool {
    hook["command"].as_str().is_some_and(|c| {
        c.contains("agent-relay") && c.ends_with(&format!("{MARK}{}", event.subcommand()))
    })
}

/// Whether `hook` is one of the relay's own.
fn is_ours(hook: &Value) -> bool {
    Event::ALL.iter().any(|&e| is_ours_for(hook, e))
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

/// Adds the Stop and UserPromptSubmit hooks, each unless it is there already.
fn install(paths: &Paths, dir: &Path, shared: bool) -> anyhow::Result<()> {
    let file = settings_file(dir, shared);
    let existing = read_settings(&file)?;
    let mut value = existing
        .as_ref()
        .map_or_else(|| json!({}), |(_, v)| v.clone());
    let mut added = Vec::new();
    for event in Event::ALL {
        let groups = value
            .as_object_mut()
            .map(|o| o.entry("hooks").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut)
            .map(|h| h.entry(event.name()).or_insert_with(|| json!([])))
            .and_then(Value::as_array_mut)
            .with_context(|| format!("{}: hooks.{} is not a list", file.display(), event.name()))?;
        let present = groups.iter().any(|group| {
            group["hooks"]
                .as_array()
                .is_some_and(|hs| hs.iter().any(|h| is_ours_for(h, event)))
        });
        if !present {
            let mut group =
                json!({"hooks": [{"type": "command", "command": our_command(event, shared)?}]});
            if let Some(m) = event.matcher() {
                group["matcher"] = json!(m);
            }
            groups.push(group);
            added.push(event.name());
        }
    }
    if added.is_empty() {
        println!(
            "agent-relay: the relay's hooks are already in {}",
            file.display()
        );
        return Ok(());
    }
    std::fs::create_dir_all(dir.join(".claude"))
        .with_context(|| format!("cannot create {}", dir.join(".claude").display()))?;
    // The person's file as it was, for uninstall (not overwritten by a second install); none
    // when there was no file: uninstall then removes the file if nothing else was added.
    let backup = backup_file(paths, &file);
    if let Some((text, _)) = &existing
        && !backup.exists()
    {
        if let Some(parent) = backup.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&backup, text.as_bytes())
            .with_context(|| format!("cannot write {}", backup.display()))?;
    }
    write_settings(&file, &value)?;
    let undo = if shared { " --shared" } else { "" };
    println!(
        "agent-relay: added the relay's {} hook{} to {} (undo: agent-relay hooks uninstall claude{undo})",
        added.join(" and "),
        if added.len() == 1 { "" } else { "s" },
        file.display()
    );
    if shared && crate::cmd::doctor::on_path(SHARED_PROGRAM).is_none() {
        eprintln!(
            "agent-relay: warning: `{SHARED_PROGRAM}` is not on this PATH; the shared hooks run \
             it by name, so each teammate needs it installed (cargo install --locked --path \
             crates/cli)"
        );
    }
    Ok(())
}

/// Takes out the relay's hooks; the original bytes back when nothing else changed.
fn uninstall(paths: &Paths, dir: &Path, shared: bool) -> anyhow::Result<()> {
    let file = settings_file(dir, shared);
    let backup = backup_file(paths, &file);
    let Some((_, mut value)) = read_settings(&file)? else {
        println!("agent-relay: no {}; nothing to do", file.display());
        return Ok(());
    };
    if let Some(hooks) = value.get_mut("hooks").and_then(Value::as_object_mut) {
        for event in Event::ALL {
            let Some(groups) = hooks.get_mut(event.name()).and_then(Value::as_array_mut) else {
                continue;
            };
            for group in groups.iter_mut() {
                if let Some(hs) = group.get_mut("hooks").and_then(Value::as_array_mut) {
                    hs.retain(|h| !is_ours(h));
                }
            }
            groups.retain(|g| g["hooks"].as_array().is_none_or(|hs| !hs.is_empty()));
            if groups.is_empty() {
                hooks.remove(event.name());
            }
        }
        if hooks.is_empty() {
            if let Some(o) = value.as_object_mut() {
                o.remove("hooks");
            }
        }
    }
    // Earlier versions kept the backup next to the file (empty for no file): read and
    // removed like the data directory's.
    let legacy = PathBuf::from(format!("{}.agent-relay-backup", file.display()));
    let backup = if backup.exists() || !legacy.exists() {
        backup
    } else {
        legacy
    };
    let original = match std::fs::read_to_string(&backup) {
        Ok(text) if text.is_empty() => None,
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("cannot read {}: {e}", backup.display()),
    };
    match original {
        // No file before install, and nothing else added since: no file again.
        None if value == json!({}) => {
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

/// A Claude Code hook: the waiting messages as the Stop or UserPromptSubmit hook's
/// additional context, or nothing (Claude Code goes on as usual).
/// Never fails the hook: a relay that is not running, or any error, means nothing to hand over
/// (logged on stderr, which Claude Code shows only in its debug output).
fn answer(paths: &Paths, event: Event) -> anyhow::Result<()> {
    // Claude Code's input (session, transcript, stop_hook_active, prompt): read whole, so that
    // it is not left unread in the pipe; `stop_hook_active` says this turn was one a Stop hook
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
    let who = format!("agent-relay hooks {}", event.subcommand());
    if door.exists() {
        // A wrapper holds the name: it hands over what waits to be typed (or nothing), to its
        // own agent's hooks only (the door key its wrapper put in this session's environment).
        let key = std::env::var(relay_wrap::DOOR_KEY_ENV).unwrap_or_default();
        let ask = match event {
            Event::Stop => json!({"hook": "stop", "active": active, "key": key}),
            Event::Prompt => json!({"hook": "prompt", "key": key}),
            // Answered by `edited`, which hands nothing over.
            Event::Edited => return Ok(()),
        };
        match rt.block_on(from_door(&door, &ask)) {
            Ok((texts, _)) if texts.is_empty() => {}
            Ok((texts, _)) => hand_over(event, &name, texts.len(), &texts)?,
            Err(e) => eprintln!("{who}: nothing handed over: {e:#}"),
        }
        return Ok(());
    }
    // The agent's MCP server holds the name (and its messages): it hands over a page.
    let mcp_door = paths.data_dir.join("team").join(&name).join(MCP_DOOR);
    // Why the MCP server's door gave nothing, when it answered with a refusal: said instead of
    // "another door holds" when the hook then finds the name held.
    let mut door_refused = None;
    let from_mcp = if mcp_door.exists() {
        let ask = json!({"hook": event.subcommand()});
        match rt.block_on(from_door(&mcp_door, &ask)) {
            Ok(t) => Some(t),
            // A socket a server left behind: the hook takes the messages itself.
            Err(e) => {
                tracing::debug!(error = %e, "the MCP server's door does not answer");
                door_refused = Some(format!("{e:#}"));
                None
            }
        }
    } else {
        None
    };
    let found = match from_mcp {
        Some(t) => Ok(Some(t)),
        None => rt.block_on(from_mailbox(paths, &name, event)),
    };
    let (texts, more) = match found {
        Ok(Some(t)) => t,
        Ok(None) => {
            match door_refused {
                Some(why) => eprintln!(
                    "{who}: nothing handed over: {name}'s MCP server holds its messages and its {}",
                    relay_protocol::text::one_line(&why, 600)
                ),
                None => eprintln!(
                    "{who}: nothing handed over: another door (a wrapper, or the agent's MCP server) holds {name}'s messages"
                ),
            }
            return Ok(());
        }
        Err(e) => {
            eprintln!("{who}: nothing handed over: {e:#}");
            return Ok(());
        }
    };
    if texts.is_empty() {
        return Ok(());
    }
    let mut texts = texts;
    if more > 0 {
        texts.push(format!(
            "({more} more waiting: they come at the end of the next turn, or `agent-relay history --to {name}`)"
        ));
    }
    hand_over(event, &name, texts.len() - usize::from(more > 0), &texts)
}

/// The socket, in the agent's team directory, of the agent's MCP server when it holds the
/// agent's name (no wrapper): the hooks ask it for a page of messages.
pub(crate) const MCP_DOOR: &str = "mcp-door.sock";

/// The door's name in a delivery's trace.
fn door_name(event: Event) -> &'static str {
    match event {
        Event::Stop => "handed to the model by Claude Code's Stop hook",
        Event::Prompt => "handed to the model by Claude Code's UserPromptSubmit hook",
        Event::Edited => "handed to the model by Claude Code's PostToolUse hook",
    }
}

/// The hook named `subcommand` (`stop`, `prompt`), if it is one.
fn event_of(subcommand: &str) -> Option<Event> {
    [Event::Stop, Event::Prompt]
        .into_iter()
        .find(|e| e.subcommand() == subcommand)
}

/// A door holding the agent's messages (the MCP server's) answers the hook `subcommand`: the
/// oldest messages within [`relay_wrap::HOOK_TEXT_MAX`], each recorded verified by that hook,
/// as `{"messages": [TEXT, ...], "more": N}`.
pub(crate) async fn answer_from(mailbox: &Mailbox, subcommand: &str) -> Value {
    let Some(event) = event_of(subcommand) else {
        return json!({"error": format!("no hook {subcommand:?}")});
    };
    match take_page(mailbox, event).await {
        Ok((texts, more)) => json!({"messages": texts, "more": more}),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// The oldest messages within the bound, each acknowledged verified by `event`'s hook.
async fn take_page(
    mailbox: &Mailbox,
    event: Event,
) -> Result<(Vec<String>, usize), relay_client::ClientError> {
    let mut used = 0;
    let (taken, more) = mailbox
        .take_while(
            |m| {
                used += text_of(m).len() + 2;
                used <= relay_wrap::HOOK_TEXT_MAX
            },
            door_name(event),
        )
        .await?;
    Ok((taken.iter().map(text_of).collect(), more))
}

/// Without a wrapper: the hook holds the agent's name for a moment (a mailbox door) and takes
/// the oldest waiting messages, at most `HOOK_TEXT_MAX` bytes of text (one at least), each
/// recorded verified by this hook in the store; the rest wait for the next hook, in order.
/// Returns their texts and how many more wait; `None` when another door (the agent's MCP
/// server) holds the name, and so its messages.
async fn from_mailbox(
    paths: &Paths,
    name: &str,
    event: Event,
) -> anyhow::Result<Option<(Vec<String>, usize)>> {
    let Some(mailbox) =
        Mailbox::open(&paths.socket, name, relay_protocol::HOOK_CLI, false, false).await?
    else {
        return Ok(None);
    };
    let page = take_page(&mailbox, event).await;
    // Closed, not dropped: the acknowledgements are written before the hook answers.
    mailbox.close().await;
    Ok(Some(page?))
}

/// One message as a hook hands it to the model (as the wrapper would have typed it).
fn text_of(m: &relay_client::Delivered) -> String {
    let thread = m
        .payload
        .thread
        .as_deref()
        .map(|t| format!(" (thread {})", relay_protocol::short_id(t)))
        .unwrap_or_default();
    format!(
        "Relay message from {} [{}]{thread}:\n{}",
        for_terminal(&m.from),
        relay_protocol::short_id(&m.id),
        // No line of the body may start like a header (issue 23.4).
        for_terminal(&relay_protocol::text::quote_headers(&m.payload.body))
    )
}

/// Prints what hands `n` messages, `texts` (each as the wrapper would have typed it), to the
/// model as the hook's additional context: the Stop hook's (the model goes on with them), or
/// the UserPromptSubmit hook's (the model gets them with the prompt).
fn hand_over(event: Event, name: &str, n: usize, texts: &[String]) -> anyhow::Result<()> {
    let plural = if n == 1 { "" } else { "s" };
    let when = match event {
        Event::Stop | Event::Edited => "while you worked",
        Event::Prompt => "before this prompt",
    };
    let mut text = format!(
        "{n} relay message{plural} arrived for you ({name}) {when}. Answer with @relay:NAME \
         where an answer is needed.\n\n"
    );
    for t in texts {
        text.push_str(t);
        text.push_str("\n\n");
    }
    let text = text.trim_end();
    // Both as the turn's additional context: for Stop, Claude Code goes on with it as the
    // model's next input, as with a block decision, which it would show as "stop hook
    // reported a problem" (it counts a block as the hook's failure).
    let out = json!({"hookSpecificOutput": {
        "hookEventName": event.name(),
        "additionalContext": text,
    }});
    println!("{}", relay_protocol::text::json_line(&out)?);
    Ok(())
}

/// Asks a door of this agent (its wrapper's, for the messages waiting to be typed; its MCP
/// server's) for the messages it hands to the hook, and how many more wait.
async fn from_door(door: &Path, ask: &Value) -> anyhow::Result<(Vec<String>, usize)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(door)
        .await
        .with_context(|| format!("cannot reach the wrapper's door {}", door.display()))?;
    let (read, mut write) = stream.into_split();
    let ask = format!("{ask}\n");
    write.write_all(ask.as_bytes()).await?;
    let mut line = String::new();
    tokio::io::BufReader::new(read).read_line(&mut line).await?;
    let answer: Value = serde_json::from_str(&line).context("the door's answer")?;
    if let Some(e) = answer["error"].as_str() {
        anyhow::bail!("the door: {e}");
    }
    let texts = answer["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str().map(String::from))
        .collect();
    let more = answer["more"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    Ok((texts, more))
}

/// The project paths Claude Code's PostToolUse `input` says an edit touched, in the relay's
/// normal form (`cwd`: Claude Code's, where a relative path is from; `root`: the project's).
/// A path outside the project is no one's claim: left out.
fn edited_paths(input: &Value, root: &Path, cwd: &Path) -> Vec<String> {
    let tool_input = &input["tool_input"];
    let files = [&tool_input["file_path"], &tool_input["notebook_path"]];
    files
        .into_iter()
        .filter_map(Value::as_str)
        .filter_map(|f| {
            relay_protocol::claims::normalize_claim_path(root, cwd, f, false)
                .map_err(|e| tracing::debug!(error = %e, "an edit outside the claims' reach"))
                .ok()
        })
        .collect()
}

/// Claude Code's PostToolUse hook: reports the edited file as `$AGENT_RELAY_NAME`'s edit,
/// through the agent's own door. Never fails the hook, and prints nothing: whoever must be told
/// is told by the relay's notices (a relay that is not running, or any error, is logged on
/// stderr, which Claude Code shows only in its debug output).
fn edited(paths: &Paths) -> anyhow::Result<()> {
    let mut input = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
        tracing::debug!(error = %e, "cannot read the hook's input");
    }
    let Ok(input) = serde_json::from_str::<Value>(&input) else {
        return Ok(());
    };
    let Ok(name) = std::env::var("AGENT_RELAY_NAME") else {
        return Ok(());
    };
    if relay_protocol::validate_agent_name(&name).is_err() {
        return Ok(());
    }
    let cwd = match input["cwd"].as_str() {
        Some(c) => PathBuf::from(c),
        None => std::env::current_dir().context("no working directory")?,
    };
    let files = edited_paths(&input, &paths.project_root, &cwd);
    if files.is_empty() {
        return Ok(());
    }
    let query = json!({"what": "edited", "paths": files});
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let team = paths.data_dir.join("team").join(&name);
    let door = team.join(relay_wrap::DOOR_SOCKET);
    let mcp_door = team.join(MCP_DOOR);
    let told = if door.exists() {
        // Under a wrapper: on its connection, with the door key of this session.
        let key = std::env::var(relay_wrap::DOOR_KEY_ENV).unwrap_or_default();
        rt.block_on(ask_door(&door, &json!({"query": query, "key": key})))
    } else if mcp_door.exists()
        && let Ok(done) = rt.block_on(ask_door(&mcp_door, &json!({ "query": query })))
    {
        Ok(done)
    } else {
        rt.block_on(async {
            let req: relay_protocol::query::QueryRequest = serde_json::from_value(query)?;
            let Some(mailbox) =
                Mailbox::open(&paths.socket, &name, relay_protocol::HOOK_CLI, false, false).await?
            else {
                anyhow::bail!("another door holds {name} and did not answer");
            };
            let res = mailbox.client().query(req).await;
            mailbox.close().await;
            Ok(serde_json::to_value(res?)?)
        })
    };
    if let Err(e) = told {
        eprintln!("agent-relay hooks edited: the edit was not reported: {e:#}");
    }
    Ok(())
}

/// One JSON request to a door of this agent, and its `result` (an `error` fails). Shared with
/// `agent-relay claim` run in a wrapped agent's shell.
pub(crate) async fn ask_door(door: &Path, ask: &Value) -> anyhow::Result<Value> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(door)
        .await
        .with_context(|| format!("cannot reach the door {}", door.display()))?;
    let (read, mut write) = stream.into_split();
    write.write_all(format!("{ask}\n").as_bytes()).await?;
    let mut line = String::new();
    tokio::io::BufReader::new(read).read_line(&mut line).await?;
    let mut answer: Value = serde_json::from_str(&line).context("the door's answer")?;
    if let Some(e) = answer["error"].as_str() {
        anyhow::bail!("the door: {e}");
    }
    Ok(answer["result"].take())
}
