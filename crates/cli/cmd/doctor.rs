//! `agent-relay doctor`: checks what the relay depends on, one finding per line, each problem
//! with what to do. Exit 1 when something is broken (a `fail`), else 0; warnings do not fail.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use relay_client::paths::Paths;
use serde::Serialize;

use crate::out::{json, line};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    /// Not there, and optional (an agent CLI this machine does not use).
    Missing,
    Warn,
    Fail,
}

/// One check's result.
#[derive(Debug, Serialize)]
struct Finding {
    check: String,
    level: Level,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

fn finding(check: &str, level: Level, detail: String, fix: Option<String>) -> Finding {
    Finding {
        check: check.to_owned(),
        level,
        detail,
        fix,
    }
}

/// The agent CLIs with a profile: (command, profile, npm package, override variable).
const AGENTS: [(&str, &str, &str, &str); 3] = [
    (
        "claude",
        "claude",
        "@anthropic-ai/claude-code",
        "AGENT_RELAY_CLAUDE",
    ),
    ("codex", "codex", "@openai/codex", "AGENT_RELAY_CODEX"),
    (
        "gemini",
        "gemini",
        "@google/gemini-cli",
        "AGENT_RELAY_GEMINI",
    ),
];

/// `agent-relay doctor`.
pub(crate) async fn doctor(paths: &Paths, as_json: bool) -> anyhow::Result<()> {
    let mut found = vec![tmux(), data_dir(&paths.data_dir)];
    found.extend(socket_dir(&paths.socket));
    found.push(relay(paths).await);
    found.extend(federation(paths));
    for (cmd, profile, package, var) in AGENTS {
        found.push(agent(cmd, profile, package, var));
    }
    if as_json {
        json(&found)?;
    } else {
        for f in &found {
            let level = match f.level {
                Level::Ok => "ok     ",
                Level::Missing => "missing",
                Level::Warn => "warn   ",
                Level::Fail => "FAIL   ",
            };
            line(format!(
                "{level}  {:<10} {}",
                f.check,
                relay_protocol::text::one_line(&f.detail, 300)
            ))?;
            if let Some(fix) = &f.fix {
                line(format!("         {:<10} → {}", "", fix))?;
            }
        }
    }
    if found.iter().any(|f| f.level == Level::Fail) {
        return Err(crate::exit::Coded {
            code: 1,
            message: String::new(),
        }
        .into());
    }
    Ok(())
}

/// The first line a program prints for `args`, if it runs within 15 s.
fn first_line(program: &Path, args: &[&str]) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = relay_protocol::now_instant() + Duration::from_secs(15);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if relay_protocol::now_instant() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                // A CLI that hangs on --version: its version is unknown, not ours to wait for.
                if let Err(e) = child.kill() {
                    tracing::debug!(error = %e, "could not stop a hanging --version");
                }
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
}

/// `program` on `PATH`, if it is there.
pub(crate) fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The first `N.N.N` in `text`.
fn version_in(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|w| w.split('.').filter(|p| !p.is_empty()).count() >= 3)
        .map(|w| w.trim_matches('.').to_owned())
}

fn tmux() -> Finding {
    match on_path("tmux") {
        None => finding(
            "tmux",
            Level::Fail,
            "tmux is not on PATH: agents cannot run in tmux sessions (the default backend)".into(),
            Some(
                "install it (apt-get install tmux, brew install tmux), or run agents with --backend pty"
                    .into(),
            ),
        ),
        Some(exe) => match first_line(&exe, &["-V"]) {
            Some(v) => finding("tmux", Level::Ok, format!("{v} ({})", exe.display()), None),
            None => finding(
                "tmux",
                Level::Warn,
                format!("{} did not say its version", exe.display()),
                Some("check that `tmux -V` works".into()),
            ),
        },
    }
}

fn data_dir(dir: &Path) -> Finding {
    match std::fs::metadata(dir) {
        Err(_) => finding(
            "data",
            Level::Ok,
            format!(
                "{} does not exist yet (`up` creates it, private)",
                dir.display()
            ),
            None,
        ),
        Ok(m) if m.permissions().mode() & 0o077 != 0 => finding(
            "data",
            Level::Warn,
            format!(
                "{} is open to other users (mode {:o}): the relay's files in it are 0600, but others can list them",
                dir.display(),
                m.permissions().mode() & 0o777
            ),
            Some(format!("chmod 700 {}", dir.display())),
        ),
        Ok(_) => finding(
            "data",
            Level::Ok,
            format!("{} (private)", dir.display()),
            None,
        ),
    }
}

fn socket_dir(socket: &Path) -> Option<Finding> {
    let dir = socket.parent()?;
    let m = std::fs::metadata(dir).ok()?;
    let mode = m.permissions().mode();
    // Writable by others without the sticky bit: someone else could replace the socket.
    Some(if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        finding(
            "socket",
            Level::Fail,
            format!(
                "{} is writable by other users (mode {:o}): the relay refuses to use it",
                dir.display(),
                mode & 0o7777
            ),
            Some(format!(
                "chmod go-w {}, or set AGENT_RELAY_SOCKET to a path in a private directory",
                dir.display()
            )),
        )
    } else {
        finding("socket", Level::Ok, socket.display().to_string(), None)
    })
}

async fn relay(paths: &Paths) -> Finding {
    match crate::cmd::tool_client(&paths.socket, "doctor").await {
        Ok(client) => {
            client.close().await;
            let dashboard = crate::cmd::up::dashboard_url(paths)
                .map(|u| {
                    // The token is the key to the dashboard: doctor's output is often pasted.
                    u.split('?').next().unwrap_or_default().to_owned()
                })
                .map(|u| format!("; dashboard {u}"))
                .unwrap_or_default();
            finding(
                "relay",
                Level::Ok,
                format!("running for {}{dashboard}", paths.project_root.display()),
                None,
            )
        }
        Err(_) => finding(
            "relay",
            Level::Warn,
            format!("not running for {}", paths.project_root.display()),
            Some("agent-relay up (or `agent-relay -n NAME <cli>`, which starts it)".into()),
        ),
    }
}

/// The project's federation (`cluster` from its configuration file or the environment): a
/// warning when its connection is neither authenticated nor local-only.
fn federation(paths: &Paths) -> Option<Finding> {
    let (resolved, _) = match crate::settings::for_project(paths, &Default::default()) {
        Ok(r) => r,
        Err(e) => {
            return Some(finding(
                "federation",
                Level::Warn,
                format!("cannot read the project's settings: {e}"),
                None,
            ));
        }
    };
    let s = &resolved.settings;
    if s.cluster.trim().is_empty() {
        return None;
    }
    Some(
        match relay_federation::core::exposure(&s.cluster, !s.cluster_creds.is_empty()) {
            Some(w) => finding(
                "federation",
                Level::Warn,
                w,
                Some("agent-relay up --cluster-creds FILE --cluster-ca CA.pem (or set them in .agent-relay/config.toml)".into()),
            ),
            None => finding(
                "federation",
                Level::Ok,
                format!("cluster {}", s.cluster),
                None,
            ),
        },
    )
}

fn agent(cmd: &str, profile: &str, package: &str, var: &str) -> Finding {
    let exe = std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .or_else(|| on_path(cmd));
    let tested = relay_wrap::profile::Profile::builtin(profile)
        .map(|p| p.tested_versions)
        .unwrap_or_default();
    let Some(exe) = exe else {
        // The version the profile was tested with: an unpinned install may get one whose
        // screen the profile does not know.
        let pinned = tested
            .last()
            .map_or_else(|| package.to_owned(), |v| format!("{package}@{v}"));
        return finding(
            cmd,
            Level::Missing,
            format!("not installed (optional: only to run {cmd} agents)"),
            Some(format!("npm install -g {pinned}")),
        );
    };
    let said = first_line(&exe, &["--version"]);
    let Some(version) = said.as_deref().and_then(version_in) else {
        return finding(
            cmd,
            Level::Warn,
            format!("{} did not say its version", exe.display()),
            Some(format!("check that `{cmd} --version` works")),
        );
    };
    if tested.contains(&version) {
        finding(
            cmd,
            Level::Ok,
            format!(
                "{version} ({}), a version the profile was tested with",
                exe.display()
            ),
            None,
        )
    } else {
        let last = tested.last().cloned().unwrap_or_default();
        finding(
            cmd,
            Level::Warn,
            format!(
                "{version} ({}) is not a version the relay was tested with ({}): its screen may differ, so readiness and directives may be misread",
                exe.display(),
                tested.join(", ")
            ),
            Some(format!(
                "npm install -g {package}@{last} for the tested version, or tell us what differs"
            )),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::version_in;

    #[test]
    fn versions_are_found_in_what_clis_print() {
        assert_eq!(
            version_in("2.1.328 (Claude Code)").as_deref(),
            Some("2.1.328")
        );
        assert_eq!(version_in("codex-cli 0.169.0").as_deref(), Some("0.169.0"));
        assert_eq!(version_in("tmux 3.3a"), None);
    }
}
