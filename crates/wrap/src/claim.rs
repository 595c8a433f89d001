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

#[cfg(test)]
mod tests {
    use super::*;

    fn verb(paths: &[&str], release: bool) -> relay_parse::ClaimVerb {
        relay_parse::ClaimVerb {
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            for_ms: None,
            release,
        }
    }

    #[test]
    fn a_block_is_claimed_from_the_agents_directory_and_a_hostile_path_is_told() {
        let (root, cwd) = (Path::new("/p/proj"), Path::new("/p/proj/src"));
        assert_eq!(
            request(&verb(&["auth.rs", "../docs/a.md"], false), root, cwd).unwrap(),
            QueryRequest::Claim {
                paths: vec!["src/auth.rs".into(), "docs/a.md".into()],
                for_ms: None,
            }
        );
        assert_eq!(
            request(&verb(&[], true), root, cwd).unwrap(),
            QueryRequest::Unclaim { paths: vec![] }
        );
        let why = request(&verb(&["../../../etc/passwd"], false), root, cwd).unwrap_err();
        assert!(why.contains("outside the project"), "{why}");
        let why = request(&verb(&["a\u{1b}[2Jb"], false), root, cwd).unwrap_err();
        assert!(
            why.contains("control character") && !why.contains('\u{1b}'),
            "{why}"
        );
    }

    #[test]
    fn the_agent_is_told_what_it_holds_and_who_else() {
        use relay_protocol::claims::{ClaimCollision, ClaimInfo};
        let result = QueryResult::Claim {
            claims: vec![ClaimInfo {
                agent: "Kim".into(),
                path: "src/auth.rs".into(),
                since: 0,
                until: 3_600_000,
            }],
            collisions: vec![ClaimCollision {
                path: "src/auth.rs".into(),
                agent: "Bob".into(),
                claimed: Some("src/".into()),
                until: Some(1),
            }],
        };
        assert_eq!(
            told(&result, 0),
            "relay: claimed src/auth.rs for 60 min; also claimed by Bob (the relay tells you both)"
        );
    }
}
