//! Which Codex rollouts are this agent's own: the ones its Codex process has open.
//!
//! Codex 0.169.0 keeps its session's rollout (`<sessions>/YYYY/MM/DD/rollout-*.jsonl`) open
//! for writing while it runs, and the rollout names no process: two agents of one person in
//! one working directory write rollouts that look alike. The files open in the agent's own
//! processes (the wrapper's child, or the tmux pane's process, and their descendants) are its
//! own, exactly, as Claude Code's session records tell its transcripts (issue 23.17). Read from
//! `/proc`; elsewhere none is found and the wrapper keeps to the working directory's rollouts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Whether `path` is a rollout under `sessions` (as `/proc/PID/fd` links name it).
pub(super) fn is_rollout(path: &Path, sessions: &Path) -> bool {
    path.starts_with(sessions)
        && path.extension().is_some_and(|x| x == "jsonl")
        && path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("rollout-"))
}

/// `root` and its descendants, from `(pid, parent)` pairs.
pub(super) fn family(root: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for &(pid, parent) in parents {
        children.entry(parent).or_default().push(pid);
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            for &pid in c {
                if !out.contains(&pid) {
                    out.push(pid);
                }
            }
        }
        i += 1;
    }
    out
}

/// The rollouts under `sessions` that process `root` or a descendant has open.
#[cfg(target_os = "linux")]
pub(super) fn open_in(root: u32, sessions: &Path) -> Vec<PathBuf> {
    let mut parents = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(parent) = super::parent_of(pid) {
            parents.push((pid, parent));
        }
    }
    // Links name the canonical path: so must the folder they are compared with.
    let sessions = sessions
        .canonicalize()
        .unwrap_or_else(|_| sessions.to_path_buf());
    let mut out = Vec::new();
    for pid in family(root, &parents) {
        // Another user's process, or gone meanwhile: not readable, not this agent's.
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && is_rollout(&target, &sessions)
                && !out.contains(&target)
            {
                out.push(target);
            }
        }
    }
    out
}

/// No `/proc`: none found (the working directory's rollouts are read, as before).
#[cfg(not(target_os = "linux"))]
pub(super) fn open_in(_root: u32, _sessions: &Path) -> Vec<PathBuf> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_its_root_and_every_descendant() {
        let parents = [(10, 1), (11, 10), (12, 11), (13, 1), (14, 12), (15, 13)];
        let mut f = family(10, &parents);
        f.sort_unstable();
        assert_eq!(f, [10, 11, 12, 14]);
        assert_eq!(family(99, &parents), [99]);
    }

    #[test]
    fn only_rollouts_under_the_sessions_folder_count() {
        let s = Path::new("/h/.codex/sessions");
        assert!(is_rollout(
            Path::new("/h/.codex/sessions/2026/11/28/rollout-x.jsonl"),
            s
        ));
        assert!(!is_rollout(Path::new("/h/.codex/state_5.sqlite"), s));
        assert!(!is_rollout(
            Path::new("/h/.codex/sessions/2026/11/28/other.jsonl"),
            s
        ));
        assert!(!is_rollout(Path::new("/elsewhere/rollout-x.jsonl"), s));
    }

    /// This process opens a rollout: it is found as its own, and as a child's parent's.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_rollout_open_in_the_agents_process_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = dir.path().join("sessions");
        let day = sessions.join("2026/11/28");
        std::fs::create_dir_all(&day).unwrap();
        let path = day.join("rollout-mine.jsonl");
        let _open = std::fs::File::create(&path).unwrap();
        std::fs::write(day.join("rollout-closed.jsonl"), "").unwrap();
        let found = open_in(std::process::id(), &sessions);
        assert_eq!(found, [path.canonicalize().unwrap()]);
    }
}
