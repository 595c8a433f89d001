//! What can go wrong talking to tmux, typed: the wrapper's loop tells a command tmux refused
//! from a control client that ended, and every error keeps its source.

/// An error of the tmux backend.
#[derive(Debug, thiserror::Error)]
pub enum TmuxError {
    /// The `tmux` program could not be started.
    #[error(
        "cannot start tmux ({command}): {source} (is tmux installed? Debian/Ubuntu: apt install tmux)"
    )]
    Start {
        /// What was being started (`tmux new-session`, `tmux -C`).
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading from or writing to tmux, or a file the backend keeps, failed.
    #[error("tmux {what}: {source}")]
    Io {
        /// What was being done, with the path where there is one.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// tmux refused a command (its error message).
    #[error("tmux {command}: {message}")]
    Refused {
        /// The command's name (`new-session`, `show-environment`).
        command: String,
        /// What tmux said.
        message: String,
    },
    /// tmux answered with something this backend cannot read.
    #[error("tmux {command}: unexpected answer {answer:?} ({what})")]
    Answer {
        /// The command.
        command: &'static str,
        /// What was asked for.
        what: &'static str,
        /// The answer.
        answer: String,
    },
    /// The pane's control client has ended (the session or the server is gone), or did not
    /// answer in time; the loop attaches a new one while the session lives.
    #[error("tmux control client: {0}")]
    Control(&'static str),
    /// The pane's control client did not answer a command in time (it is then done: its
    /// answers may be out of step with the commands).
    #[error("tmux control client: no answer within {0:?}")]
    NoAnswer(std::time::Duration),
    /// A control client's state was poisoned by a panic on another thread.
    #[error("tmux control client: its state was poisoned by a panic")]
    Poisoned,
    /// A blocking tmux call on tokio's blocking pool panicked or was cancelled.
    #[error("tmux {what}: {source}")]
    Join {
        /// The call.
        what: &'static str,
        /// Why.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A path that tmux commands cannot carry.
    #[error(
        "the data directory {0:?} contains a character tmux commands cannot carry (\" \\ # $ ` or \
         a newline); set AGENT_RELAY_DATA_DIR to a plainer path"
    )]
    UnsafePath(String),
}

impl TmuxError {
    /// An I/O error while doing `what`.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether tmux refused a command saying `text` (its messages are its only detail).
    pub(crate) fn refused_with(&self, text: &str) -> bool {
        matches!(self, Self::Refused { message, .. } if message.contains(text))
    }
}

#[cfg(test)]
mod tests {
    use super::TmuxError;

    #[test]
    fn only_a_refusal_saying_the_text_is_told_by_refused_with() {
        let refused = TmuxError::Refused {
            command: "show-environment".into(),
            message: "unknown variable: AGENT_RELAY_X".into(),
        };
        assert!(refused.refused_with("unknown variable"));
        assert!(!refused.refused_with("no server running"));
        let io = TmuxError::io(
            "show-environment",
            std::io::Error::other("unknown variable"),
        );
        assert!(!io.refused_with("unknown variable"));
    }

    #[test]
    fn an_error_keeps_its_source_and_says_what_to_do() {
        use std::error::Error as _;
        let e = TmuxError::Start {
            command: "tmux -C attach-session".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(e.source().is_some());
        assert!(e.to_string().contains("apt install tmux"), "{e}");
        let e = crate::WrapError::from(TmuxError::NoAnswer(std::time::Duration::from_secs(10)));
        assert_eq!(e.to_string(), "tmux control client: no answer within 10s");
    }
}
