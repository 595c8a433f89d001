//! The Anthropic Messages API's shapes, as pure functions: reading the latest user message
//! out of a request, and writing a reply as one JSON message or as Server-Sent Events.

use serde_json::{Value, json};

/// The text of the latest user message: a string content as is, or its text blocks joined by
/// newlines. Blocks that are whole `<system-reminder>` notes Claude Code adds around a prompt
/// are left out, so rules see what was typed. Empty when there is no user message.
pub fn latest_user_text(body: &Value) -> String {
    let Some(msg) = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &msg["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .filter(|t| !is_reminder(t))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The text of the tool results in the latest user message (`tool_result` blocks: a string
/// content, or its text blocks), joined by newlines; empty when it carries none.
pub fn latest_tool_result_text(body: &Value) -> String {
    let Some(msg) = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    let Value::Array(blocks) = &msg["content"] else {
        return String::new();
    };
    let mut out = Vec::new();
    for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
        match &b["content"] {
            Value::String(s) => out.push(s.clone()),
            Value::Array(parts) => out.extend(
                parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .map(str::to_owned),
            ),
            _ => {}
        }
    }
    out.join("\n")
}

fn is_reminder(text: &str) -> bool {
    let t = text.trim();
    t.starts_with("<system-reminder>") && t.ends_with("</system-reminder>")
}

/// The text of the system prompt (a string or text blocks, joined by newlines).
pub fn system_text(body: &Value) -> String {
    match &body["system"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// `prefix`, then a number for each id after the first in this process: unique, as the API's
/// are. With one id for every reply and tool call, Claude Code merged a second tool call into
/// the first reply and reported its result missing ("[Tool result missing due to internal
/// error]"), and so it did with ids `toolu_standin_2`/`msg_standin_2`: hence no separator
/// (`spawn::claude_code_spawns_a_worker_through_mcp_and_releases_it_after_its_answer`).
fn unique_id(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    match NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
        1 => prefix.to_owned(),
        n => format!("{prefix}{n}"),
    }
}

fn message(model: &str, content: Value, stop_reason: Value, output_tokens: usize) -> Value {
    json!({
        "id": unique_id("msg_standin"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": output_tokens},
    })
}

/// Rough token count: what the usage fields report (nothing checks it; it only has to be
/// plausible).
fn tokens(text: &str) -> usize {
    text.len().div_ceil(4).max(1)
}

/// The input of a scripted tool call, as a JSON value (an object; `{}` if the text is not
/// one).
pub(crate) fn tool_input(json: &str) -> Value {
    serde_json::from_str::<Value>(json)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The whole reply as one non-streaming message; with `tool`, a tool call (name, input JSON)
/// after the text, and `stop_reason: tool_use`.
pub fn reply_message(model: &str, text: &str, tool: Option<&(String, String)>) -> Value {
    let mut content = vec![json!({"type": "text", "text": text})];
    let stop = match tool {
        Some((name, input)) => {
            content.push(
                json!({"type": "tool_use", "id": unique_id("toolu_standin"), "name": name,
                                "input": tool_input(input)}),
            );
            "tool_use"
        }
        None => "end_turn",
    };
    message(model, Value::Array(content), json!(stop), tokens(text))
}

/// The reply as a stream: `message_start`, then (with `thinking`) a thinking block
/// (`thinking_delta`s and a `signature_delta`), then the text block: `content_block_start`, one
/// `content_block_delta` (`text_delta`) per `chunk` characters, `content_block_stop`; then
/// `message_delta` with `stop_reason: end_turn` and `message_stop`. Each item is (event
/// name, data).
pub fn reply_events(
    model: &str,
    thinking: Option<&str>,
    text: &str,
    tool: Option<&(String, String)>,
    chunk: usize,
) -> Vec<(&'static str, Value)> {
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": message(model, json!([]), Value::Null, 1)}),
    )];
    let mut block = |index: usize, kind: &str, field: &str, body: &str, delta: &str| {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": kind, field: ""}}),
        ));
        let chars: Vec<char> = body.chars().collect();
        for piece in chars.chunks(chunk.max(1)) {
            let piece: String = piece.iter().collect();
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": delta, field: piece}}),
            ));
        }
        if kind == "thinking" {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": "standin"}}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    };
    let mut index = 0;
    if let Some(t) = thinking {
        block(index, "thinking", "thinking", t, "thinking_delta");
        index += 1;
    }
    block(index, "text", "text", text, "text_delta");
    let mut stop = "end_turn";
    if let Some((name, input)) = tool {
        // A tool call: its input streams as JSON text (`input_json_delta`), all at once.
        index += 1;
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": unique_id("toolu_standin"), "name": name,
                                     "input": {}}}),
        ));
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta",
                             "partial_json": tool_input(input).to_string()}}),
        ));
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        stop = "tool_use";
    }
    events.push((
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": tokens(text)}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

/// One Server-Sent Event: `event: NAME`, `data: JSON` (one line: JSON escapes newlines), and
/// the blank line that ends it.
pub fn sse(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_user_message_without_reminders() {
        let body = json!({"messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nnotes\n</system-reminder>"},
                {"type": "text", "text": "ask Bob"},
                {"type": "image", "source": {}},
                {"type": "text", "text": "line two"},
            ]},
        ]});
        assert_eq!(latest_user_text(&body), "ask Bob\nline two");
        assert_eq!(
            latest_user_text(&json!({"messages": [{"role": "user", "content": "x"}]})),
            "x"
        );
        assert_eq!(latest_user_text(&json!({})), "");
        let tool = json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Spawned W1"}]},
            {"type": "tool_result", "tool_use_id": "t2", "content": "done"},
        ]}]});
        assert_eq!(latest_user_text(&tool), "");
        assert_eq!(latest_tool_result_text(&tool), "Spawned W1\ndone");
        assert_eq!(
            system_text(&json!({"system": [{"type": "text", "text": "a"}, {"text": "b"}]})),
            "a\nb"
        );
    }

    #[test]
    fn a_streamed_reply_carries_the_whole_text_in_order() {
        let events = reply_events("m", None, "héllo wörld", None, 4);
        let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let text: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "héllo wörld", "chunks split on characters, not bytes");
        for (name, data) in &events {
            assert_eq!(data["type"], *name);
        }
        assert_eq!(events[6].1["delta"]["stop_reason"], "end_turn");
        assert_eq!(events[0].1["message"]["model"], "m");
    }

    #[test]
    fn a_thinking_block_comes_first_with_its_signature() {
        let events = reply_events("m", Some("hmm"), "ok", None, 8);
        let blocks: Vec<(String, i64)> = events
            .iter()
            .filter(|(n, _)| *n == "content_block_start")
            .map(|(_, d)| {
                let kind = d["content_block"]["type"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (kind, d["index"].as_i64().unwrap_or(-1))
            })
            .collect();
        assert_eq!(blocks, [("thinking".to_owned(), 0), ("text".to_owned(), 1)]);
        let thought: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"]["thinking"].as_str())
            .collect();
        assert_eq!(thought, "hmm");
        assert!(
            events
                .iter()
                .any(|(_, d)| d["delta"]["type"] == "signature_delta")
        );
    }

    #[test]
    fn sse_frames_are_one_line_of_json_each() {
        let s = sse("content_block_delta", &json!({"t": "a\nb"}));
        assert_eq!(s, "event: content_block_delta\ndata: {\"t\":\"a\\nb\"}\n\n");
        let m = reply_message("m", "done", None);
        assert_eq!(m["content"][0]["text"], "done");
        assert_eq!(m["stop_reason"], "end_turn");
    }
}
