//! A RESULT too large for one frame travels as several [`QueryResult::Part`] frames, each
//! under the frame limit: the daemon cuts the answer's JSON text into slices ([`split`]), the
//! client joins them in order and reads the whole ([`Joiner`]). Without this an answer over
//! the limit (three 500 KB messages in `history`) could not be written at all and the asker
//! waited forever.
//!
//! The whole answer is bounded too: one over [`MAX_RESULT_BYTES`] is refused with a
//! `too_large` error that says to ask for fewer, on both sides.

use crate::query::QueryResult;

/// The largest answer (JSON text of the RESULT payload) sent in parts: 64 MiB. A bigger one
/// is answered with a `too_large` error instead.
pub const MAX_RESULT_BYTES: usize = 64 * 1024 * 1024;

/// Room left in each part's frame for the envelope and the part's own fields (the query's
/// id is added to it: ids are at most [`crate::MAX_MESSAGE_ID_BYTES`]).
const PART_OVERHEAD: usize = 512;

/// The `too_large` error answering a question whose answer has `len` bytes.
#[must_use]
pub fn too_large(len: usize) -> QueryResult {
    QueryResult::Error {
        code: "too_large".into(),
        message: format!(
            "the answer is {} MiB, more than the relay sends at once ({} MiB): ask for fewer \
             (for example a smaller --limit, or page with --before)",
            len.div_ceil(1024 * 1024),
            MAX_RESULT_BYTES / (1024 * 1024)
        ),
    }
}

/// Cuts `result` into parts whose frames (with an envelope id of `id_len` bytes) each fit in
/// `max_frame` bytes. The JSON text is cut on character boundaries, and each slice is as long
/// as it can be once its quotes and backslashes are escaped, so no part is over the limit
/// whatever the text holds.
///
/// # Errors
/// The answer to send instead: [`too_large`] over [`MAX_RESULT_BYTES`], `internal` if the
/// result cannot be serialized (it always can).
pub fn split(
    result: &QueryResult,
    id_len: usize,
    max_frame: usize,
) -> Result<Vec<QueryResult>, Box<QueryResult>> {
    let text = serde_json::to_string(result).map_err(|e| {
        Box::new(QueryResult::Error {
            code: "internal".into(),
            message: format!("could not serialize the answer: {e}"),
        })
    })?;
    if text.len() > MAX_RESULT_BYTES {
        return Err(Box::new(too_large(text.len())));
    }
    let budget = max_frame.saturating_sub(PART_OVERHEAD + id_len).max(64);
    let mut slices: Vec<&str> = Vec::new();
    let mut start = 0;
    let mut escaped = 0;
    for (at, c) in text.char_indices() {
        // serde_json's text has no control characters (they are escaped inside strings), so
        // only `"` and `\` grow when the slice is itself written as a JSON string.
        let cost = match c {
            '"' | '\\' => 2,
            c => c.len_utf8(),
        };
        if escaped + cost > budget {
            slices.push(&text[start..at]);
            start = at;
            escaped = 0;
        }
        escaped += cost;
    }
    slices.push(&text[start..]);
    let parts = u32::try_from(slices.len()).map_err(|_| Box::new(too_large(text.len())))?;
    Ok(slices
        .into_iter()
        .zip(0..)
        .map(|(data, part)| QueryResult::Part {
            part,
            parts,
            data: data.to_owned(),
        })
        .collect())
}

/// Joins the parts of one answer, in order.
#[derive(Debug, Default)]
pub struct Joiner {
    text: String,
    next: u32,
}

impl Joiner {
    /// Adds the next part: `Ok(Some(answer))` after the last one, `Ok(None)` while more are
    /// due.
    ///
    /// # Errors
    /// Says what is wrong when a part comes out of order, the count changes, the whole grows
    /// over [`MAX_RESULT_BYTES`], or the joined text is not a RESULT.
    pub fn push(
        &mut self,
        part: u32,
        parts: u32,
        data: &str,
    ) -> Result<Option<QueryResult>, String> {
        if part != self.next || part >= parts {
            return Err(format!(
                "answer part {part} of {parts} arrived where part {} was due",
                self.next
            ));
        }
        if self.text.len() + data.len() > MAX_RESULT_BYTES {
            return Err(format!(
                "the answer grew over {} MiB",
                MAX_RESULT_BYTES / (1024 * 1024)
            ));
        }
        self.text.push_str(data);
        self.next += 1;
        if self.next < parts {
            return Ok(None);
        }
        match serde_json::from_str::<QueryResult>(&self.text) {
            Ok(QueryResult::Part { .. }) => Err("an answer in parts held another part".into()),
            Ok(r) => Ok(Some(r)),
            Err(e) => Err(format!("the joined answer is not a RESULT: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::MessageRecord;
    use crate::{Envelope, Kind, Payload, encode_frame};

    fn history(bodies: &[String]) -> QueryResult {
        QueryResult::History {
            messages: bodies
                .iter()
                .zip(0..)
                .map(|(b, pos)| MessageRecord {
                    pos,
                    id: format!("m{pos}"),
                    ts: 1,
                    from: "Alice".into(),
                    to: "Bob".into(),
                    topic: None,
                    kind: Kind::Message,
                    body: b.clone(),
                    data: None,
                    thread: None,
                    in_reply_to: None,
                    origin: None,
                    deliveries: Vec::new(),
                })
                .collect(),
        }
    }

    /// Every part's frame fits, and the parts join back to the answer, whatever the bodies
    /// hold: quotes and backslashes (which double when escaped), control characters (six
    /// bytes each in JSON), several-byte characters.
    #[test]
    fn parts_fit_the_frame_and_join_back() {
        let max = 64 * 1024;
        for fill in ["\"", "\\", "\u{1b}", "é", "🦀", "a"] {
            let r = history(&[fill.repeat(30_000), fill.repeat(50_000), "x".into()]);
            let parts = split(&r, 26, max).unwrap();
            assert!(parts.len() > 1, "{fill:?}");
            let mut joiner = Joiner::default();
            let mut out = None;
            for p in parts {
                let env =
                    Envelope::new("01JB2K7Q000000000000000000", 1, Payload::Result(p.clone()));
                let mut buf = Vec::new();
                encode_frame(&env, &mut buf, max).unwrap();
                let QueryResult::Part { part, parts, data } = p else {
                    panic!("not a part")
                };
                assert!(out.is_none());
                out = joiner.push(part, parts, &data).unwrap();
            }
            assert_eq!(out.unwrap(), r, "{fill:?}");
        }
    }

    #[test]
    fn a_part_out_of_order_is_an_error() {
        let mut j = Joiner::default();
        assert!(j.push(1, 2, "{}").is_err());
        let mut j = Joiner::default();
        assert!(j.push(0, 0, "{}").is_err());
    }

    #[test]
    fn an_answer_over_the_whole_limit_is_refused_with_what_to_do() {
        let r = history(&["a".repeat(MAX_RESULT_BYTES)]);
        let Err(e) = split(&r, 26, 1024 * 1024) else {
            panic!("not refused")
        };
        let QueryResult::Error { code, message } = *e else {
            panic!("not an error")
        };
        assert_eq!(code, "too_large");
        assert!(message.contains("--limit"), "{message}");
    }
}
