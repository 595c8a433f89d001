//! Writing to stdout without panicking on a closed pipe (`agent-relay history | head`).

use std::io::Write;

/// Writes `text` plus a newline to stdout.
pub(crate) fn line(text: impl AsRef<str>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_ref().as_bytes())?;
    out.write_all(b"\n")
}

/// Pretty JSON to stdout.
pub(crate) fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    line(text)?;
    Ok(())
}

/// Makes text safe to print on a terminal: control characters (escape sequences from a
/// message body, say) are shown as `\u{..}` instead of being interpreted.
pub(crate) fn clean(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            s.push_str(&c.escape_unicode().to_string());
        } else {
            s.push(c);
        }
    }
    s
}

/// `clean`, on one line, cut to `max` characters with an ellipsis.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let flat: String = clean(text).replace(['\n', '\t'], " ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut s: String = flat.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}
