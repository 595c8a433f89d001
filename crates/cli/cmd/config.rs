//! `agent-relay config`: the effective settings of `up` and the profile overrides of this
//! project, each with where it came from.

use relay_client::paths::Paths;
use relay_protocol::text::one_line;

use crate::out::{json, line};
use crate::settings::{Flags, SETTINGS};

/// A profile's overrides: field, value as written, source.
type ProfileRows = Vec<(String, Vec<(String, String, String)>)>;

/// `agent-relay config [--json]`.
pub(crate) fn run(paths: &Paths, as_json: bool) -> anyhow::Result<()> {
    let (resolved, file) = crate::settings::for_project(paths, &Flags::new())?;
    let rows: Vec<(&str, String, String)> = SETTINGS
        .iter()
        .zip(&resolved.sources)
        .map(|(s, source)| (s.name, s.get(&resolved.settings).text(), source.to_string()))
        .collect();
    // What the running relay started with, where it differs: the file (or the environment)
    // changed since, and takes effect only at its next start.
    let running = match crate::cmd::up::running_pid(paths) {
        Ok(Some(pid)) => crate::cmd::up::running_settings(paths, pid),
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(error = %e, "cannot tell whether the relay runs");
            None
        }
    };
    let differs = |name: &str, value: &str| -> Option<String> {
        running
            .as_ref()
            .and_then(|r| r.get(name))
            .filter(|v| v.as_str() != value)
            .cloned()
    };
    let profiles: ProfileRows = file
        .as_ref()
        .map(|f| {
            f.profiles
                .iter()
                .map(|(name, table)| {
                    let fields = table
                        .fields
                        .iter()
                        .map(|(k, v, line)| {
                            (k.clone(), v.clone(), format!("file {}:{line}", f.shown))
                        })
                        .collect();
                    (name.clone(), fields)
                })
                .collect()
        })
        .unwrap_or_default();
    let personal = relay_wrap::profile::override_dir();
    if as_json {
        let up: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(name, value, source)| {
                let mut v = serde_json::json!({ "value": value, "source": source });
                if let Some(r) = differs(name, value) {
                    v["running"] = serde_json::json!(r);
                }
                ((*name).to_owned(), v)
            })
            .collect();
        let profiles: serde_json::Map<String, serde_json::Value> = profiles
            .iter()
            .map(|(name, fields)| {
                let fields: serde_json::Map<String, serde_json::Value> = fields
                    .iter()
                    .map(|(k, v, source)| {
                        (
                            k.clone(),
                            serde_json::json!({ "value": v, "source": source }),
                        )
                    })
                    .collect();
                (name.clone(), serde_json::Value::Object(fields))
            })
            .collect();
        return json(&serde_json::json!({
            "project_root": paths.project_root,
            "file": file.as_ref().map(|f| &f.path),
            "up": up,
            "profiles": profiles,
            "profile_dir": personal,
        }));
    }
    match &file {
        Some(f) => line(format!(
            "configuration file: {}",
            one_line(&f.path.display().to_string(), 300)
        ))?,
        None => line(format!(
            "configuration file: none ({} under the project root {}; `agent-relay config --help` shows what it holds)",
            crate::config_file::RELATIVE,
            one_line(&paths.project_root.display().to_string(), 300)
        ))?,
    }
    line("up settings (an option on `up` wins over all of these):")?;
    let width = rows
        .iter()
        .map(|(n, v, _)| n.len() + v.len())
        .max()
        .unwrap_or(0)
        + 2;
    for (name, value, source) in &rows {
        let shown = if value.is_empty() {
            "(none)".to_owned()
        } else {
            one_line(value, 200)
        };
        let pad = width.saturating_sub(name.len() + shown.chars().count());
        let now = differs(name, value).map_or_else(String::new, |r| {
            format!(
                " (the running relay uses {}; restart it to apply: agent-relay down && agent-relay up)",
                one_line(&r, 200)
            )
        });
        line(format!(
            "  {name} = {shown}{:pad$}  {}{now}",
            "",
            one_line(source, 300)
        ))?;
    }
    if !profiles.is_empty() {
        line("profile overrides (a file in the personal profile directory wins over these):")?;
        for (name, fields) in &profiles {
            for (k, v, source) in fields {
                line(format!(
                    "  {name}.{} = {}  {}",
                    one_line(k, 60),
                    one_line(v, 200),
                    one_line(source, 300)
                ))?;
            }
        }
    }
    if let Some(dir) = personal {
        line(format!(
            "personal profile directory: {}",
            one_line(&dir.display().to_string(), 300)
        ))?;
    }
    Ok(())
}
