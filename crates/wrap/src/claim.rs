//! Claims from the agent's screen (issue 25.7): a `[[RELAY]]` block `{"claim": PATHS, "for"?:
//! DURATION}` or `{"unclaim": PATHS}` becomes a `QUERY claim`/`unclaim` on the agent's own
//! connection (claims speak for the connection's name), and the agent is told how it went.
//! Paths are put in the relay's normal form here: relative to the project's root, from the
//! wrapper's directory (the agent's).

use std::path::Path;

use relay_protocol::claims::normalize_claim_path;
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::text::one_line;

/// The query `verb` asks for, with paths relative to `root` from `cwd`; or what to tell the
/// agent when a path cannot be claimed.
pub(crate) fn request(
    verb: &relay_parse::ClaimVerb,
    root: &Path,
    cwd: &Path,
) -> Result<QueryRequest, String> {
    let paths = verb
        .paths
        .iter()
        .map(|p| {
            normalize_claim_path(root, cwd, p, cwd.join(p).is_dir())
                .map_err(|e| format!("cannot claim {}: {e}", one_line(p, 120)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if verb.release {
        QueryRequest::Unclaim { paths }
    } else {
        QueryRequest::Claim {
            paths,
            for_ms: verb.for_ms,
        }
    })
}

/// What the agent is told of the relay's answer (one line; collisions come as the relay's own
/// notices, once).
pub(crate) fn told(result: &QueryResult, now_ms: u64) -> String {
    let list = |ps: Vec<&str>| {
        ps.iter()
            .map(|p| one_line(p, 200))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match result {
        QueryResult::Claim { claims, collisions } => {
            let mins = claims
                .first()
                .map_or(0, |c| c.until.saturating_sub(now_ms).div_ceil(60_000));
            let mut s = format!(
                "relay: claimed {} for {mins} min",
                list(claims.iter().map(|c| c.path.as_str()).collect())
            );
            if !collisions.is_empty() {
                let mut who: Vec<&str> = collisions.iter().map(|c| c.agent.as_str()).collect();
                who.sort_unstable();
                who.dedup();
                s.push_str(&format!(
                    "; also claimed by {} (the relay tells you both)",
                    list(who)
                ));
            }
            s
        }
        QueryResult::Unclaim { released } if released.is_empty() => {
            "relay: nothing to release (no such claim)".to_owned()
        }
        QueryResult::Unclaim { released } => format!(
            "relay: released {}",
            list(released.iter().map(String::as_str).collect())
        ),
        other => format!("relay: unexpected answer to a claim: {other:?}"),
    }
}
