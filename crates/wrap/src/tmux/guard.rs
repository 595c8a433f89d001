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
//! one lock per tmux server directory, so that none of the relay's own steps falls in another's
//! window. An agent that exits or a person who detaches during the window is outside the
//! relay's reach; the window is a few of the server's loop turns.

use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};

/// How long a step waits for the lock before going on without it: a relaying process stuck
/// while holding it (it is held for one tmux command or one attach, bounded by the control
/// client's answer time) must not stop every other agent from starting.
const WAIT_AT_MOST: Duration = Duration::from_secs(15);

/// The lock file: one per user and tmux socket directory (`TMUX_TMPDIR`, as tmux itself
/// chooses it), so that relaying processes sharing a tmux server share it.
fn path() -> PathBuf {
    let dir = std::env::var_os("TMUX_TMPDIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    dir.join(format!(
        "agent-relay-tmux-{}.lock",
        rustix::process::getuid().as_raw()
    ))
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
    let path = path();
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, what, "cannot open the tmux lock; going on without it");
            return Guard { _file: None };
        }
    };
    let deadline = Instant::now() + WAIT_AT_MOST;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Guard { _file: Some(file) },
            Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, what, "cannot take the tmux lock; going on without it");
                return Guard { _file: None };
            }
        }
    }
}
