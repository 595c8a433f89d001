//! Errors to exit codes, in one table (documented in README and `--help`).
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok (success) |
//! | 1 | any other failure |
//! | 2 | bad usage: a bad command line (clap) or a value on it that cannot be used (a name, an id prefix too short, a time), or an invalid configuration file or `AGENT_RELAY_*` setting value |
//! | 3 | the relay is not running |
//! | 4 | not found: no such message, dead letter, agent or rule (or an id prefix that matches several messages) |
//! | 5 | the relay refused the message (NACK), or a spawn or release (a rule or limit) |
//!
//! The same table is in README and `--help`; `tests/e2e/cli.rs`
//! `the_exit_code_table_in_the_docs_is_what_commands_return` checks all three against runs.

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

/// A wrapped agent exited with `code`, which becomes this command's: its own status, not one
/// of the table's meanings (an agent that exits 3 does not mean the relay is not running).
/// An empty message prints nothing (the agent's output already said it all).
#[derive(Debug)]
pub(crate) struct AgentExit {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl std::fmt::Display for AgentExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AgentExit {}

/// Exit code 4 (not found) with a message.
pub(crate) fn not_found(message: impl Into<String>) -> anyhow::Error {
    Coded {
        code: 4,
        message: message.into(),
    }
    .into()
}

/// Exit code 3 with a message.
pub(crate) fn not_running(message: impl Into<String>) -> anyhow::Error {
    Coded {
        code: 3,
        message: message.into(),
    }
    .into()
}

/// Exit code 2 (bad usage, as clap's own errors) with a message: a value the command line
/// gave that cannot be used.
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    Coded {
        code: 2,
        message: message.into(),
    }
    .into()
}

/// The exit code for `err`.
pub(crate) fn code_of(err: &anyhow::Error) -> i32 {
    if let Some(c) = err.downcast_ref::<Coded>() {
        return c.code;
    }
    if let Some(a) = err.downcast_ref::<AgentExit>() {
        return a.code;
    }
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            return 0;
        }
    }
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::NotRunning { .. }) => 3,
        Some(ClientError::Query { code, .. }) if code == "not_found" || code == "ambiguous" => 4,
        // The relay could not use a value the command line gave (an id prefix too short).
        Some(ClientError::Query { code, .. }) if code == "invalid" => 2,
        Some(ClientError::Rejected { .. }) => 5,
        // Refused by an access rule or a limit (`spawn`, `release`).
        Some(ClientError::Query { code, .. }) if code == "forbidden" || code == "limit" => 5,
        _ => 1,
    }
}

/// `err` with its causes, as printed: controls shown as `\u{..}` (`relay_protocol::text`).
fn render(err: &anyhow::Error) -> String {
    relay_protocol::text::for_terminal(&format!("{err:#}"))
}

/// Prints `err` (unless it is a closed pipe) and returns its exit code.
pub(crate) fn report(err: &anyhow::Error) -> i32 {
    let code = code_of(err);
    let silent = err
        .downcast_ref::<Coded>()
        .is_some_and(|c| c.message.is_empty())
        || err
            .downcast_ref::<AgentExit>()
            .is_some_and(|a| a.message.is_empty());
    if code != 0 && !silent {
        let mut stderr = std::io::stderr().lock();
        // Errors quote relay-supplied text (ids in an ambiguity error, a NACK's reason, a
        // name from the command line): shown, never interpreted by the terminal.
        let _ = writeln!(stderr, "agent-relay: {}", render(err));
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_show_control_characters_instead_of_sending_them() {
        let err = anyhow::anyhow!("\"ab\" matches 2 messages (ab\u{9b}31m, ab\u{1b}]0;t\u{7})")
            .context("read\u{9d}0;x\u{9c}");
        let text = render(&err);
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.contains("ab\\u{9b}31m"), "{text}");
    }
}
