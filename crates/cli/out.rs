//! Writing to stdout without panicking on a closed pipe (`agent-relay history | head`). What is
//! written is cleaned by `relay_protocol::text` (the one cleaning module): text with
//! `for_terminal`/`one_line` by the caller, JSON here.

use std::io::Write;

/// Writes `text` plus a newline to stdout.
pub(crate) fn line(text: impl AsRef<str>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_ref().as_bytes())?;
    out.write_all(b"\n")
}

/// Pretty JSON to stdout, with no raw control character (`relay_protocol::text::json_pretty`:
/// serde_json writes DEL and C1 raw, and a terminal interprets U+009B as CSI).
pub(crate) fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = relay_protocol::text::json_pretty(value)?;
    line(text)?;
    Ok(())
}
