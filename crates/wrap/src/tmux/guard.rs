//! Keeps this user's relaying processes from crashing their tmux server.
//!
//! tmux's server (3.3a, and up to at least 3.5a: tmux pull requests 4980 and 5004) marks a
//! client as a control client when the client's first identify message arrives and sets up its
//! control state only with the last one; identify messages that carry file descriptors arrive
//! in separate reads, so for at least one turn of the server's loop a control client has no
//! state. A notification sent to control clients in that turn (a session created or closed, a
//! client detached) makes the server dereference the missing state and crash: every session of
//! that server ends, the person's own included. Seen here as `segfault at 20 ... in tmux`
//! (`control_write`) when one agent started while another's control client attached.
//!
//! What this relay does that sends such notifications (creating a session, ending one,
//! detaching a control client) and what opens the window (attaching a control client) take
//! one lock per tmux socket directory, so that none of the relay's own steps falls in another's
//! window. An agent that exits or a person who detaches during the window is outside the
//! relay's reach; the window is a few of the server's loop turns.
//!
//! A relaying process that ends waits until its control client has detached under the lock
//! ([`super::control::wait_detached`]), and it handles SIGTERM from before it starts one: a
//! process that ended with its client attached had the client detach, announced to every
//! control client, outside the lock (`agents_started_and_stopped_together...` lost the
//! server that way under load, issue 23.19).

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

/// How long a step waits for the lock before going on without it: a relaying process stuck
/// while holding it (it is held for one tmux command or one attach, bounded by the control
/// client's answer time) must not stop every other agent from starting.
const WAIT_AT_MOST: Duration = Duration::from_secs(15);

/// The lock file: one per user and tmux socket directory, in the private directory tmux keeps
/// its sockets in (`$TMUX_TMPDIR/tmux-UID`, 0700, created as tmux would when no server has
/// yet), so that relaying processes sharing a tmux server share it and no other user can
/// create, hold or replace it.
fn path() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let base = std::env::var_os("TMUX_TMPDIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let uid = rustix::process::getuid().as_raw();
    let dir = base.join(format!("tmux-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // tmux refuses the directory on the same terms.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of this user",
            dir.display()
        )));
    }
    Ok(dir.join("agent-relay.lock"))
}

/// Held while one step that a tmux server must not see during a control client's identify
/// runs; released when dropped.
#[derive(Debug)]
pub(crate) struct Guard {
    _file: Option<File>,
}

/// Takes the lock, waiting up to [`WAIT_AT_MOST`]; without it (it cannot be opened, or it is
/// held too long) the step goes on, logged: this only narrows a race in tmux.
pub(crate) fn take(what: &str) -> Guard {
    let opened = path().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))
    });
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, what, "cannot open the tmux lock; going on without it");
            return Guard { _file: None };
        }
    };
    let deadline = relay_protocol::now_instant() + WAIT_AT_MOST;
    let mut said = false;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Guard { _file: Some(file) },
            Err(rustix::io::Errno::WOULDBLOCK) if relay_protocol::now_instant() < deadline => {
                if !said {
                    // Said once: what a relaying process waits for when it seems stuck.
                    tracing::info!(what, "waiting for the tmux lock");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                tracing::warn!(what, "the tmux lock was held for 15 s; going on without it");
                return Guard { _file: None };
            }
            Err(e) => {
                tracing::warn!(error = %e, what, "cannot take the tmux lock; going on without it");
                return Guard { _file: None };
            }
        }
    }
}
