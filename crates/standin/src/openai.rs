//! The OpenAI Responses API's shapes (what Codex CLI speaks with `wire_api = "responses"`).

use serde_json::{Value, json};

/// The text of the latest user message in `input` (a string, or message items whose content
/// is a string or `input_text` parts). Codex sends its environment context and instructions as
/// earlier user items; the prompt is the last one. When the input ends with the output of a
/// tool the stand-in called (`function_call_output`), that output is the latest turn: the
/// rule that called the tool does not match it again.
pub fn latest_user_text(body: &Value) -> String {
    match &body["input"] {
        Value::String(s) => s.clone(),
        Value::Array(items)
            if items
                .last()
                .is_some_and(|i| i["type"] == "function_call_output") =>
        {
            match &items[items.len() - 1]["output"] {
                Value::String(s) => s.clone(),
                // Codex 0.169 hands an MCP tool's result back as content parts
                // (`[{"type": "input_text", "text": ...}]`).
                Value::Array(parts) if parts.iter().all(|p| p["text"].is_string()) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                other => other.to_string(),
            }
        }
        Value::Array(items) => items
            .iter()
            .rev()
            .find(|i| i["role"] == "user")
            .map(|i| match &i["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            })
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The reply as Responses API stream events (name, data): `response.created`,
/// `response.output_item.added`, `response.content_part.added`, one
/// `response.output_text.delta` per `chunk` characters, the matching `.done` events and
/// `response.completed`; with `tool` (name, arguments as JSON text), a `function_call` item
/// after the message, its arguments streamed at once. A name `NAMESPACE/TOOL` calls TOOL in a
/// namespace of tools (`{"type": "namespace", "name": NAMESPACE, "tools": [...]}` in the
/// request, how Codex 0.169 offers an MCP server's tools, `mcp__SERVER`): the item then says
/// `"namespace": NAMESPACE, "name": TOOL`, the only form Codex routes to the server (a flat
/// `mcp__SERVER__TOOL` is "unsupported call").
pub fn reply_events(
    model: &str,
    text: &str,
    tool: Option<&(String, String)>,
    chunk: usize,
) -> Vec<(&'static str, Value)> {
    let resp = |status: &str, output: Value| {
        json!({"id": "resp_standin", "object": "response", "created_at": 0, "status": status,
               "model": model, "output": output})
    };
    let ids = json!({"item_id": "msg_standin", "output_index": 0, "content_index": 0});
    let with = |mut v: Value, extra: Value| {
        if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v
    };
    let part = |t: &str| json!({"type": "output_text", "text": t, "annotations": []});
    let item = |status: &str, content: Value| {
        json!({"id": "msg_standin", "type": "message", "role": "assistant",
               "status": status, "content": content})
    };
    let mut events = vec![
        (
            "response.created",
            json!({"response": resp("in_progress", json!([]))}),
        ),
        (
            "response.output_item.added",
            json!({"output_index": 0, "item": item("in_progress", json!([]))}),
        ),
        (
            "response.content_part.added",
            with(ids.clone(), json!({"part": part("")})),
        ),
    ];
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(chunk.max(1)) {
        let piece: String = piece.iter().collect();
        events.push((
            "response.output_text.delta",
            with(ids.clone(), json!({"delta": piece})),
        ));
    }
    let done_item = item("completed", json!([part(text)]));
    events.push((
        "response.output_text.done",
        with(ids.clone(), json!({"text": text})),
    ));
    events.push((
        "response.content_part.done",
        with(ids, json!({"part": part(text)})),
    ));
    events.push((
        "response.output_item.done",
        json!({"output_index": 0, "item": done_item.clone()}),
    ));
    let mut output = vec![done_item];
    if let Some((name, input)) = tool {
        let arguments = crate::messages::tool_input(input).to_string();
        let (namespace, name) = match name.split_once('/') {
            Some((ns, tool)) => (Some(ns), tool),
            None => (None, name.as_str()),
        };
        let call = |status: &str, arguments: &str| {
            let mut item = json!({"id": "fc_standin", "type": "function_call", "status": status,
                   "call_id": "call_standin", "name": name, "arguments": arguments});
            if let Some(ns) = namespace {
                item["namespace"] = json!(ns);
            }
            item
        };
        let at = json!({"item_id": "fc_standin", "output_index": 1});
        events.push((
            "response.output_item.added",
            json!({"output_index": 1, "item": call("in_progress", "")}),
        ));
        events.push((
            "response.function_call_arguments.delta",
            with(at.clone(), json!({"delta": arguments})),
        ));
        events.push((
            "response.function_call_arguments.done",
            with(at, json!({"arguments": arguments})),
        ));
        events.push((
            "response.output_item.done",
            json!({"output_index": 1, "item": call("completed", &arguments)}),
        ));
        output.push(call("completed", &arguments));
    }
    let mut completed = resp("completed", Value::Array(output));
    completed["usage"] = json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20});
    events.push(("response.completed", json!({"response": completed})));
    for (name, data) in &mut events {
        data["type"] = json!(name);
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_the_last_user_item_and_the_reply_streams_whole() {
        let body = json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ping"}]},
        ]});
        assert_eq!(latest_user_text(&body), "ping");
        let events = reply_events("m", "hello world", None, 4);
        assert_eq!(events[0].0, "response.created");
        assert_eq!(events.last().unwrap().0, "response.completed");
        let text: String = events
            .iter()
            .filter(|(n, _)| *n == "response.output_text.delta")
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect();
        assert_eq!(text, "hello world");
        assert!(events.iter().all(|(n, d)| d["type"] == *n));
        // A tool call: a function_call item after the message; its output is the next turn.
        let tool = (
            "relay__relay_send".to_owned(),
            r#"{"to": "Bob"}"#.to_owned(),
        );
        let events = reply_events("m", "Sending.", Some(&tool), 4);
        let done = events
            .iter()
            .rfind(|(n, _)| *n == "response.output_item.done")
            .unwrap();
        assert_eq!(done.1["item"]["name"], "relay__relay_send");
        assert_eq!(done.1["item"]["arguments"], r#"{"to":"Bob"}"#);
        let body = json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "send it"}]},
            {"type": "function_call", "call_id": "call_standin", "name": "x", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_standin", "output": "ACK [1] to Bob"},
        ]});
        assert_eq!(latest_user_text(&body), "ACK [1] to Bob");
        // A tool in a namespace (Codex's MCP servers): the item names both.
        let tool = ("mcp__relay/relay_send".to_owned(), "{}".to_owned());
        let events = reply_events("m", "Sending.", Some(&tool), 4);
        let done = events
            .iter()
            .rfind(|(n, _)| *n == "response.output_item.done")
            .unwrap();
        assert_eq!(
            (&done.1["item"]["namespace"], &done.1["item"]["name"]),
            (&json!("mcp__relay"), &json!("relay_send"))
        );
        // Codex's MCP result: content parts, read as their text.
        let body = json!({"input": [
            {"type": "function_call_output", "call_id": "call_standin", "output": [
                {"type": "input_text", "text": "Wall time: 0.01 seconds"},
                {"type": "input_text", "text": "ACK [1] to Bob"}]},
        ]});
        assert_eq!(
            latest_user_text(&body),
            "Wall time: 0.01 seconds\nACK [1] to Bob"
        );
    }
}
