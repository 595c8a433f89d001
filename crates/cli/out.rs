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

/// A JSON array written to stdout one element at a time: the same text [`json`] prints for
/// the whole list (pretty, two spaces), but a long list (`history --all`, `inbox`) starts at
/// once and is never held whole in memory. Every `--json` output is one JSON document; only
/// a live stream (`watch`, `inbox --follow`) is JSON Lines.
pub(crate) struct JsonArray {
    /// Elements written so far.
    written: usize,
}

impl JsonArray {
    /// Nothing is written until the first element or [`JsonArray::finish`].
    pub(crate) fn new() -> Self {
        Self { written: 0 }
    }

    /// Writes one element.
    pub(crate) fn push<T: serde::Serialize>(&mut self, value: &T) -> anyhow::Result<()> {
        let text = array_part(value, self.written == 0)?;
        std::io::stdout().lock().write_all(text.as_bytes())?;
        self.written += 1;
        Ok(())
    }

    /// Closes the array (`[]` when it is empty).
    pub(crate) fn finish(self) -> anyhow::Result<()> {
        let end: &[u8] = if self.written == 0 { b"[]\n" } else { b"\n]\n" };
        std::io::stdout().lock().write_all(end)?;
        Ok(())
    }
}

/// One element of a pretty JSON array as serde_json writes it: after `[` (the first) or `,`,
/// a line break, and the element's lines indented by two spaces. No JSON string holds a raw
/// line break, so the lines are the document's own.
fn array_part<T: serde::Serialize>(value: &T, first: bool) -> anyhow::Result<String> {
    let text = relay_protocol::text::json_pretty(value)?;
    let mut out = String::from(if first { "[\n" } else { ",\n" });
    for (i, l) in text.lines().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("  ");
        out.push_str(l);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// The streamed array is the text the whole list prints as.
    #[test]
    fn a_streamed_array_is_the_pretty_array() {
        let items = vec![
            serde_json::json!({"a": 1, "b": [1, 2], "c": {"d": "x\u{9b}\nline"}}),
            serde_json::json!({"a": 2, "b": [], "c": {}}),
            serde_json::json!("plain"),
        ];
        let mut streamed = String::new();
        for (i, v) in items.iter().enumerate() {
            streamed.push_str(&super::array_part(v, i == 0).unwrap());
        }
        streamed.push_str("\n]");
        assert_eq!(streamed, relay_protocol::text::json_pretty(&items).unwrap());
    }
}
