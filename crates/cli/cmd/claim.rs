//! `agent-relay claim`: claims of paths (issue 25.7), for a person, a script, or an agent's
//! shell when the agent is not connected under that name (a connected agent claims through its
//! own connection: the `claim` directive, the `relay_claim` tool).

use std::path::Path;

use relay_client::paths::Paths;
use relay_protocol::claims::{ClaimCollision, normalize_claim_path};
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::text::one_line;
use serde_json::json;

use crate::args::ClaimArgs;
use crate::cmd::tool_client;
use crate::exit::usage;
use crate::out::{json, line};
use crate::time::{format_utc, parse_duration_ms};

/// `raw` paths, relative to `cwd` or absolute, as claim paths relative to the project's root
/// (an existing directory ends with `/`). Shared by the CLI and the MCP server.
pub(crate) fn normalize(root: &Path, cwd: &Path, raw: &[String]) -> Result<Vec<String>, String> {
    raw.iter()
        .map(|p| {
            let dir = cwd.join(p).is_dir();
            normalize_claim_path(root, cwd, p, dir)
                .map_err(|e| format!("cannot claim {}: {e}", one_line(p, 120)))
        })
        .collect()
}

/// One collision as a line: who else holds (or edited) the path.
pub(crate) fn collision_line(c: &ClaimCollision) -> String {
    let who = one_line(&c.agent, 128);
    match (&c.claimed, c.until) {
        (Some(claimed), Some(until)) => format!(
            "{} is also claimed by {who} ({}, until {}); {who} was told",
            one_line(&c.path, 200),
            one_line(claimed, 200),
            format_utc(until)
        ),
        _ => format!(
            "{who} also edited {} within the last minute; {who} was told",
            one_line(&c.path, 200)
        ),
    }
}

/// The wrapper's door and the door key when this runs in the session of the wrapped agent
/// `name` (its shell: `AGENT_RELAY_NAME` is `name` and the wrapper's key is in the
/// environment), so that the claim is the agent's own.
fn own_door(paths: &Paths, name: &str) -> Option<(std::path::PathBuf, String)> {
    let own = std::env::var("AGENT_RELAY_NAME").ok()?;
    let key = std::env::var(relay_wrap::DOOR_KEY_ENV)
        .ok()
        .filter(|k| !k.is_empty())?;
    let door = paths
        .data_dir
        .join("team")
        .join(name)
        .join(relay_wrap::DOOR_SOCKET);
    (own == name && door.exists()).then_some((door, key))
}

/// Runs `agent-relay claim`.
pub(crate) async fn claim(paths: &Paths, args: &ClaimArgs) -> anyhow::Result<()> {
    relay_protocol::validate_agent_name(&args.as_)
        .map_err(|e| usage(format!("invalid name for --as: {e}")))?;
    let req = if args.list {
        QueryRequest::Claims
    } else {
        let cwd = std::env::current_dir()?;
        let claimed = normalize(&paths.project_root, &cwd, &args.paths).map_err(usage)?;
        if args.release {
            QueryRequest::Unclaim { paths: claimed }
        } else {
            if claimed.is_empty() {
                return Err(usage(
                    "no path given: agent-relay claim PATH... (a file, or a directory it covers)",
                ));
            }
            let for_ms = parse_duration_ms(&args.for_).ok_or_else(|| {
                usage(format!(
                    "--for {}: give a duration such as 90s, 30m or 2h",
                    one_line(&args.for_, 40)
                ))
            })?;
            QueryRequest::Claim {
                paths: claimed,
                for_ms: Some(for_ms),
            }
        }
    };
    let result = match own_door(paths, &args.as_) {
        // In the agent's own shell (its wrapper's environment): on the agent's connection.
        Some((door, key)) => {
            let answer =
                crate::cmd::hooks::ask_door(&door, &json!({"query": req, "key": key})).await?;
            serde_json::from_value(answer)?
        }
        None => {
            let client = tool_client(&paths.socket, &args.as_).await?;
            let res = client.query(req).await;
            client.close().await;
            res?
        }
    };
    match result {
        QueryResult::Claim { claims, collisions } => {
            if args.json {
                return json(&json!({"claims": claims, "collisions": collisions}));
            }
            for c in &claims {
                line(format!(
                    "claimed {} until {}",
                    one_line(&c.path, 200),
                    format_utc(c.until)
                ))?;
            }
            for c in &collisions {
                line(collision_line(c))?;
            }
        }
        QueryResult::Unclaim { released } => {
            if args.json {
                return json(&json!({ "released": released }));
            }
            if released.is_empty() {
                line("nothing to release: no such claim")?;
            }
            for p in &released {
                line(format!("released {}", one_line(p, 200)))?;
            }
        }
        QueryResult::Claims { claims } => {
            if args.json {
                return json(&json!({ "claims": claims }));
            }
            if claims.is_empty() {
                line("no claims")?;
            }
            for c in &claims {
                line(format!(
                    "{}  {}  until {}",
                    one_line(&c.path, 200),
                    one_line(&c.agent, 128),
                    format_utc(c.until)
                ))?;
            }
        }
        other => anyhow::bail!("unexpected answer to claim: {other:?}"),
    }
    Ok(())
}
