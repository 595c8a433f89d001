//! Claims (issue 25.7): an agent says it is working on some paths for a while, so that others
//! who claim or edit them are told. A claimed path is relative to the project's root, in one
//! form whoever sends it: `/`-separated, no `.` or `..` component, no empty component, no
//! control character, at most [`MAX_CLAIM_PATH_BYTES`]. A directory is claimed with a trailing
//! `/` (`src/auth/` covers every path under it); patterns (`*`, `?`) are refused: a claim names
//! what it covers. Pure: the caller decides whether a path is a directory (it may not exist yet).

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

/// The longest claimed path, in bytes (a project path is far shorter; a longer one is hostile
/// or a mistake).
pub const MAX_CLAIM_PATH_BYTES: usize = 1024;

/// Paths in one claim at most.
pub const MAX_CLAIM_PATHS: usize = 64;

/// The default time a claim lasts when none is given: 30 minutes.
pub const DEFAULT_CLAIM_MS: u64 = 30 * 60 * 1000;

/// The longest a claim may last: 24 hours (a claim forgotten by its agent must end).
pub const MAX_CLAIM_MS: u64 = 24 * 60 * 60 * 1000;

/// A claim the relay holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    /// The agent that claimed it.
    pub agent: String,
    /// The path, relative to the project's root (a directory ends with `/`).
    pub path: String,
    /// When it was claimed (Unix ms).
    pub since: u64,
    /// When it expires (Unix ms).
    pub until: u64,
}

/// Someone else's claim that a claim or an edit ran into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimCollision {
    /// The path claimed or edited.
    pub path: String,
    /// The other agent.
    pub agent: String,
    /// The other agent's claimed path (the same, or a directory that holds it, or a path under
    /// the directory claimed); absent when the other agent only edited the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<String>,
    /// When the other agent's claim expires (Unix ms), for a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
}

/// Why a path cannot be claimed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimPathError {
    /// Nothing given.
    #[error("the path is empty; give a file (src/auth.rs) or a directory (src/auth/)")]
    Empty,
    /// Over [`MAX_CLAIM_PATH_BYTES`].
    #[error(
        "the path is {0} bytes, over the {MAX_CLAIM_PATH_BYTES} a claim takes; claim its directory instead"
    )]
    TooLong(usize),
    /// A control character (escape sequences, new lines, NUL).
    #[error("the path holds a control character; claim the path as the file system names it")]
    Control,
    /// A glob.
    #[error(
        "the path is a pattern ({0:?} found); claim a file (src/auth.rs) or a directory (src/auth/), not a pattern"
    )]
    Pattern(char),
    /// Outside the project (`..` past the root, or an absolute path elsewhere).
    #[error("the path is outside the project ({0}); claims are for paths under the project's root")]
    Outside(String),
    /// The whole project.
    #[error("the path is the whole project; claim the files or directories you will change")]
    Root,
    /// Not in the normal form (a daemon's check of what a client sent).
    #[error(
        "the path is not relative to the project's root in normal form (no leading /, no . or .. or empty part); agent-relay claim and relay_claim normalize it"
    )]
    NotNormal,
}

/// Checks that `path` is a claim path in normal form (what the daemon accepts).
///
/// # Errors
/// [`ClaimPathError`] saying what is wrong and what to do.
pub fn validate_claim_path(path: &str) -> Result<(), ClaimPathError> {
    check_chars(path)?;
    let body = path.strip_suffix('/').unwrap_or(path);
    if body.is_empty() {
        return Err(ClaimPathError::Root);
    }
    if body
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(ClaimPathError::NotNormal);
    }
    Ok(())
}

/// Empty, too long, control characters, patterns.
fn check_chars(path: &str) -> Result<(), ClaimPathError> {
    if path.is_empty() {
        return Err(ClaimPathError::Empty);
    }
    if path.len() > MAX_CLAIM_PATH_BYTES {
        return Err(ClaimPathError::TooLong(path.len()));
    }
    if path.chars().any(char::is_control) {
        return Err(ClaimPathError::Control);
    }
    if let Some(c) = path.chars().find(|c| matches!(c, '*' | '?')) {
        return Err(ClaimPathError::Pattern(c));
    }
    Ok(())
}

/// `raw`, as a person or an agent wrote it (relative to `cwd`, or absolute), as a claim path
/// relative to `root`: `.` and `..` resolved by their names (symbolic links are not followed:
/// a claim is about the names agents use), a directory (`dir`, or `raw` ending with `/`)
/// ending with `/`. `cwd` and `root` are absolute.
///
/// # Errors
/// [`ClaimPathError`]: empty, too long, control characters, a pattern, outside `root`, `root`
/// itself.
pub fn normalize_claim_path(
    root: &Path,
    cwd: &Path,
    raw: &str,
    dir: bool,
) -> Result<String, ClaimPathError> {
    check_chars(raw)?;
    let dir = dir || raw.ends_with('/');
    let mut parts: Vec<String> = Vec::new();
    for c in cwd.join(raw).components() {
        match c {
            Component::RootDir | Component::Prefix(_) => parts.clear(),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(ClaimPathError::Outside(raw.to_owned()));
                }
            }
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
        }
    }
    let root_parts: Vec<String> = root
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    if !parts.starts_with(&root_parts) {
        let shown = crate::text::one_line(raw, 120);
        return Err(ClaimPathError::Outside(shown));
    }
    let rel = parts[root_parts.len()..].join("/");
    if rel.is_empty() {
        return Err(ClaimPathError::Root);
    }
    let out = if dir { format!("{rel}/") } else { rel };
    validate_claim_path(&out)?;
    Ok(out)
}

/// Whether claims (or an edit) of `a` and `b` touch the same files: the same path, or one is a
/// directory (ending with `/`) that holds the other.
#[must_use]
pub fn claim_overlaps(a: &str, b: &str) -> bool {
    a == b || (a.ends_with('/') && b.starts_with(a)) || (b.ends_with('/') && a.starts_with(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(cwd: &str, raw: &str) -> Result<String, ClaimPathError> {
        normalize_claim_path(Path::new("/p/proj"), Path::new(cwd), raw, false)
    }

    #[test]
    fn paths_are_made_relative_to_the_root() {
        assert_eq!(norm("/p/proj", "src/auth.rs").unwrap(), "src/auth.rs");
        assert_eq!(norm("/p/proj/src", "auth.rs").unwrap(), "src/auth.rs");
        assert_eq!(
            norm("/p/proj/src", "./a/../auth.rs").unwrap(),
            "src/auth.rs"
        );
        assert_eq!(
            norm("/elsewhere", "/p/proj/src/auth.rs").unwrap(),
            "src/auth.rs"
        );
        assert_eq!(norm("/p/proj", "src/auth/").unwrap(), "src/auth/");
        assert_eq!(
            normalize_claim_path(Path::new("/p/proj"), Path::new("/p/proj"), "src", true).unwrap(),
            "src/"
        );
    }

    #[test]
    fn hostile_paths_are_refused() {
        assert!(matches!(
            norm("/p/proj", "../../etc/passwd"),
            Err(ClaimPathError::Outside(_))
        ));
        assert!(matches!(
            norm("/p/proj", "/etc/passwd"),
            Err(ClaimPathError::Outside(_))
        ));
        assert!(matches!(
            norm("/p/proj", "/p/projx/a"),
            Err(ClaimPathError::Outside(_))
        ));
        assert_eq!(norm("/p/proj", "a\x1b[2Jb"), Err(ClaimPathError::Control));
        assert_eq!(
            norm("/p/proj", "src/*.rs"),
            Err(ClaimPathError::Pattern('*'))
        );
        assert_eq!(
            norm("/p/proj", &"a".repeat(10_240)),
            Err(ClaimPathError::TooLong(10_240))
        );
        assert_eq!(norm("/p/proj", "."), Err(ClaimPathError::Root));
        assert_eq!(norm("/p/proj", ""), Err(ClaimPathError::Empty));
    }

    #[test]
    fn the_daemon_takes_only_the_normal_form() {
        assert!(validate_claim_path("src/auth.rs").is_ok());
        assert!(validate_claim_path("src/").is_ok());
        for bad in ["/etc/passwd", "../x", "a//b", "a/./b", "/", "a/.."] {
            assert!(validate_claim_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn directories_cover_what_they_hold() {
        assert!(claim_overlaps("src/auth.rs", "src/auth.rs"));
        assert!(claim_overlaps("src/", "src/auth.rs"));
        assert!(claim_overlaps("src/auth.rs", "src/"));
        assert!(!claim_overlaps("src/auth.rs", "src/auth.rs.bak"));
        assert!(!claim_overlaps("src", "src/auth.rs"));
        assert!(!claim_overlaps("src/a/", "src/b/"));
    }
}
