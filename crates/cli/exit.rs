//! Errors to exit codes, in one table (documented in README and `--help`).
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | any other failure |
//! | 2 | bad command line (clap) |
//! | 3 | the relay is not running |
//! | 4 | no such message (or the id prefix is ambiguous) |
//! | 5 | the relay refused the message (NACK) |

use std::io::Write;

use relay_client::ClientError;

/// An error that carries its own exit code.
#[derive(Debug)]
pub(crate) struct Coded {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl std::fmt::Display for Coded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

/// Exit code 3 with a message.
pub(crate) fn not_running(message: impl Into<String>) -> anyhow::Error {
    Coded {
        code: 3,
        message: message.into(),
    }
    .into()
}

/// The exit code for `err`.
pub(crate) fn code_of(err: &anyhow::Error) -> i32 {
    if let Some(c) = err.downcast_ref::<Coded>() {
        return c.code;
    }
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            return 0;
        }
    }
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::NotRunning { .. }) => 3,
        Some(ClientError::Query { code, .. }) if code == "not_found" || code == "ambiguous" => 4,
        Some(ClientError::Rejected { .. }) => 5,
        _ => 1,
    }
}

/// Prints `err` (unless it is a closed pipe) and returns its exit code.
pub(crate) fn report(err: &anyhow::Error) -> i32 {
    let code = code_of(err);
    let silent = err
        .downcast_ref::<Coded>()
        .is_some_and(|c| c.message.is_empty());
    if code != 0 && !silent {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "agent-relay: {err:#}");
    }
    code
}
