//! Where a project's relay lives: project root and id, data directory, socket, database, pid
//! and log files. The daemon, the CLI and the wrapper all resolve paths here, so they agree.
//!
//! - Project root, the first that applies: the nearest ancestor of the working directory
//!   holding `.agent-relay` (a project that says where its root is); else the git top-level (the
//!   nearest ancestor holding `.git`), so a sub-folder with its own `package.json` inside a
//!   repository shares the repository's relay; else the nearest ancestor holding `Cargo.toml`,
//!   `package.json`, `go.mod` or `pyproject.toml`; else the working directory.
//! - Project id: the first 12 hex digits of SHA-256 of the root path.
//! - Data: `$AGENT_RELAY_DATA_DIR`, else `$XDG_DATA_HOME/agent-relay/<id>`, else
//!   `~/.local/share/agent-relay/<id>`.
//! - Socket: `$AGENT_RELAY_SOCKET`, else `relay.sock` in a private (0700) directory
//!   `$XDG_RUNTIME_DIR/agent-relay/<key>/`, else `/tmp/agent-relay-<uid>/<key>/`, where `<key>`
//!   is the project id, or a hash of `$AGENT_RELAY_DATA_DIR` when that is set (one daemon per
//!   data directory).
//! - Database: `$AGENT_RELAY_STORAGE_PATH`, else `<data>/messages.sqlite`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Files that mark a project root.
pub const ROOT_MARKERS: [&str; 6] = [
    ".git",
    "Cargo.toml",
    "package.json",
    "go.mod",
    "pyproject.toml",
    ".agent-relay",
];

/// Every path the relay uses for one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The project root.
    pub project_root: PathBuf,
    /// 12 hex digits identifying the project.
    pub project_id: String,
    /// Data directory (database, logs, pid file, agents.json).
    pub data_dir: PathBuf,
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// The SQLite database.
    pub db: PathBuf,
    /// The daemon's pid file (also its single-instance lock).
    pub pid_file: PathBuf,
    /// The daemon's log file.
    pub log_file: PathBuf,
    /// Membership snapshot for anything watching the directory.
    pub agents_file: PathBuf,
}

/// The project root for `start` (see the module docs): the nearest `.agent-relay`, else the
/// git top-level, else the nearest other root marker, else `start`.
pub fn project_root(start: &Path) -> PathBuf {
    let nearest = |markers: &[&str]| {
        start
            .ancestors()
            .find(|dir| markers.iter().any(|m| dir.join(m).exists()))
    };
    nearest(&[".agent-relay"])
        .or_else(|| nearest(&[".git"]))
        .or_else(|| nearest(&ROOT_MARKERS))
        .unwrap_or(start)
        .to_path_buf()
}

fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// First 12 hex digits of SHA-256 of the root path.
pub fn project_id(root: &Path) -> String {
    short_hash(root.as_os_str().as_encoded_bytes())
}

impl Paths {
    /// Resolves paths for the working directory `cwd`, reading variables through `env`
    /// (injected so tests need not touch the process environment).
    pub fn resolve(cwd: &Path, env: impl Fn(&str) -> Option<OsString>) -> Self {
        let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let project_root = project_root(cwd);
        let project_id = project_id(&project_root);
        let explicit_data = var("AGENT_RELAY_DATA_DIR");
        let data_dir = explicit_data.clone().unwrap_or_else(|| {
            let base = var("XDG_DATA_HOME")
                .or_else(|| var("HOME").map(|h| h.join(".local/share")))
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            base.join("agent-relay").join(&project_id)
        });
        let key = match &explicit_data {
            Some(d) => short_hash(d.as_os_str().as_encoded_bytes()),
            None => project_id.clone(),
        };
        let socket = var("AGENT_RELAY_SOCKET").unwrap_or_else(|| {
            let base = var("XDG_RUNTIME_DIR")
                .map(|d| d.join("agent-relay"))
                .unwrap_or_else(|| {
                    PathBuf::from(format!(
                        "/tmp/agent-relay-{}",
                        rustix::process::getuid().as_raw()
                    ))
                });
            base.join(key).join("relay.sock")
        });
        let db =
            var("AGENT_RELAY_STORAGE_PATH").unwrap_or_else(|| data_dir.join("messages.sqlite"));
        Self {
            pid_file: data_dir.join("daemon.pid"),
            log_file: data_dir.join("daemon.log"),
            agents_file: data_dir.join("agents.json"),
            project_root,
            project_id,
            data_dir,
            socket,
            db,
        }
    }

    /// Resolves paths from the process's working directory and environment.
    ///
    /// # Errors
    /// If the working directory cannot be read.
    pub fn from_env() -> std::io::Result<Self> {
        let cwd = std::env::current_dir()?;
        Ok(Self::resolve(&cwd, |k| std::env::var_os(k)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_id_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::write(root.join("Cargo.toml"), "").unwrap();
        let p = Paths::resolve(&root.join("src/deep"), |k| match k {
            "HOME" => Some("/home/u".into()),
            "XDG_RUNTIME_DIR" => Some("/run/user/1".into()),
            _ => None,
        });
        assert_eq!(p.project_root, root);
        assert_eq!(p.project_id.len(), 12);
        assert_eq!(p.project_id, project_id(&root));
        assert_eq!(
            p.data_dir,
            PathBuf::from(format!("/home/u/.local/share/agent-relay/{}", p.project_id))
        );
        assert_eq!(
            p.socket,
            PathBuf::from(format!(
                "/run/user/1/agent-relay/{}/relay.sock",
                p.project_id
            ))
        );
        assert_eq!(p.db, p.data_dir.join("messages.sqlite"));
    }

    #[test]
    fn a_sub_project_inside_a_repository_shares_the_repositorys_root() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let web = repo.join("web");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(web.join("src")).unwrap();
        std::fs::write(web.join("package.json"), "{}").unwrap();
        assert_eq!(project_root(&web.join("src")), repo);
        // A project that says where its root is wins over the repository.
        std::fs::create_dir_all(web.join(".agent-relay")).unwrap();
        assert_eq!(project_root(&web.join("src")), web);
        // Outside any repository, the nearest marker.
        let plain = dir.path().join("plain");
        std::fs::create_dir_all(plain.join("a/b")).unwrap();
        std::fs::write(plain.join("a/go.mod"), "").unwrap();
        assert_eq!(project_root(&plain.join("a/b")), plain.join("a"));
    }

    #[test]
    fn overrides_win() {
        let p = Paths::resolve(Path::new("/nowhere"), |k| match k {
            "AGENT_RELAY_DATA_DIR" => Some("/d".into()),
            "AGENT_RELAY_SOCKET" => Some("/s/r.sock".into()),
            "AGENT_RELAY_STORAGE_PATH" => Some("/db.sqlite".into()),
            _ => None,
        });
        assert_eq!(p.data_dir, PathBuf::from("/d"));
        assert_eq!(p.socket, PathBuf::from("/s/r.sock"));
        assert_eq!(p.db, PathBuf::from("/db.sqlite"));
        assert_eq!(p.pid_file, PathBuf::from("/d/daemon.pid"));
    }

    #[test]
    fn data_dir_keys_the_socket() {
        let a = Paths::resolve(Path::new("/x"), |k| {
            (k == "AGENT_RELAY_DATA_DIR").then(|| "/a".into())
        });
        let b = Paths::resolve(Path::new("/x"), |k| {
            (k == "AGENT_RELAY_DATA_DIR").then(|| "/b".into())
        });
        assert_ne!(a.socket, b.socket);
    }
}
