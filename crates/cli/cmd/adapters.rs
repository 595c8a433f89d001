//! `agent-relay adapters`: the people adapters of the running relay (webhook, Telegram) and how
//! each is doing, from `<data>/adapters.json`, which the daemon rewrites when an adapter's state
//! changes (`relay_people::Hub`).

use relay_client::paths::Paths;
use serde_json::{Value, json};

use crate::out::line;
use relay_protocol::text::one_line;

/// Lists the adapters; exit 3 when the relay is not running.
pub(crate) fn run(paths: &Paths, as_json: bool) -> anyhow::Result<()> {
    if crate::cmd::up::running_pid(paths)?.is_none() {
        return Err(crate::exit::not_running(
            "the relay is not running — start it with `agent-relay up`",
        ));
    }
    let file = paths.data_dir.join(crate::cmd::up::ADAPTERS_FILE);
    let adapters: Vec<Value> = match std::fs::read_to_string(&file) {
        Ok(text) => serde_json::from_str::<Value>(&text)?["adapters"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", file.display())),
    };
    if as_json {
        return crate::out::json(&json!({ "adapters": adapters }));
    }
    if adapters.is_empty() {
        line(
            "no adapters: declare people ([people.NAME]) and adapters ([adapters.webhook], [adapters.telegram]) in .agent-relay/config.toml",
        )?;
        return Ok(());
    }
    for a in &adapters {
        let s = |k: &str| one_line(a[k].as_str().unwrap_or(""), 300);
        let n = |k: &str| a[k].as_u64().unwrap_or(0);
        let people: Vec<String> = a["people"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|v| v.as_str())
                    .map(|v| one_line(v, 64))
                    .collect()
            })
            .unwrap_or_default();
        let mut text = format!(
            "{:<9} {:<10} people: {}  sent {}  received {}  refused {}",
            s("name"),
            s("state"),
            people.join(", "),
            n("sent"),
            n("received"),
            n("refused"),
        );
        if a["last_error"].is_string() {
            text.push_str(&format!("  last error: {}", s("last_error")));
        }
        line(text)?;
    }
    Ok(())
}
