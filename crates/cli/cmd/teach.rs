//! Teaching an agent the relay when it starts: its name, the syntax and the other agents,
//! through each CLI's own mechanism, so that no person has to paste instructions.
//!
//! The text is one file: `crates/cli/teach.md` built in, or the project's
//! `.agent-relay/teach.md` when it exists (`{name}` and `{agents}` are filled in).

use std::path::Path;

use relay_client::paths::Paths;
use relay_protocol::query::{QueryRequest, QueryResult};

/// The built-in teaching text.
const DEFAULT: &str = include_str!("../teach.md");

/// Where a project overrides the text, under its root.
pub(crate) const OVERRIDE: &str = ".agent-relay/teach.md";

/// The teaching text for agent `name`, with the other agents online now.
pub(crate) fn text(paths: &Paths, name: &str) -> anyhow::Result<String> {
    let file = paths.project_root.join(OVERRIDE);
    let template = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DEFAULT.to_owned(),
        Err(e) => anyhow::bail!("cannot read {}: {e}", file.display()),
    };
    let others: Vec<String> = online_agents(&paths.socket, name)
        .into_iter()
        .filter(|a| a != name)
        .collect();
    let agents = if others.is_empty() {
        "none yet (`agent-relay agents` lists them later)".to_owned()
    } else {
        others.join(", ")
    };
    Ok(template
        .replace("{name}", name)
        .replace("{agents}", &agents))
}

/// The agents connected now (one that stopped is no one to talk to: naming it would send the
/// new agent's first messages to nobody); empty if the relay cannot be asked (teaching goes
/// on without the list).
fn online_agents(socket: &Path, name: &str) -> Vec<String> {
    let ask = async {
        let client = crate::cmd::tool_client(socket, name).await?;
        let res = client.query(QueryRequest::Agents).await;
        client.close().await;
        anyhow::Ok(res?)
    };
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(ask));
    match answer {
        Ok(QueryResult::Agents { agents }) => agents
            .into_iter()
            .filter(|a| a.online)
            .map(|a| a.name)
            .collect(),
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the agents for the teaching text");
            Vec::new()
        }
    }
}

/// How the CLI of profile `profile` is taught: the arguments that give it `text` at start
/// (Claude Code: `--append-system-prompt`; Codex CLI: `-c developer_instructions=...`), or
/// `None` when it has no such flag (Gemini CLI; `--intro` types a short note instead) or the
/// command already sets its own (a person's instructions are left alone).
pub(crate) fn args(profile: &str, command: &[String], text: &str) -> Option<Vec<String>> {
    let has = |flag: &str| {
        command
            .iter()
            .skip(1)
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    match profile {
        "claude" if !has("--append-system-prompt") && !has("--append-system-prompt-file") => {
            Some(vec!["--append-system-prompt".to_owned(), text.to_owned()])
        }
        "codex" if !command.iter().any(|a| a.contains("developer_instructions")) => {
            // A TOML basic string: JSON's escapes are TOML's.
            let value = serde_json::to_string(text).ok()?;
            Some(vec![
                "-c".to_owned(),
                format!("developer_instructions={value}"),
            ])
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn each_cli_is_taught_its_own_way_and_a_persons_own_prompt_is_kept() {
        assert_eq!(
            args("claude", &cmd(&["claude"]), "hi"),
            Some(cmd(&["--append-system-prompt", "hi"]))
        );
        assert_eq!(
            args(
                "claude",
                &cmd(&["claude", "--append-system-prompt", "x"]),
                "hi"
            ),
            None
        );
        assert_eq!(
            args("codex", &cmd(&["codex"]), "a \"b\"\nc"),
            Some(cmd(&["-c", r#"developer_instructions="a \"b\"\nc""#]))
        );
        assert_eq!(args("gemini", &cmd(&["gemini"]), "hi"), None);
        assert_eq!(args("generic", &cmd(&["sh"]), "hi"), None);
    }

    #[test]
    fn the_codex_value_is_the_text_as_toml_reads_it() {
        let text = DEFAULT;
        let a = args("codex", &cmd(&["codex"]), text).unwrap();
        let doc: toml::Table = toml::from_str(&a[1]).unwrap();
        assert_eq!(doc["developer_instructions"].as_str(), Some(text));
    }
}
