//! The Gemini API's shapes (what Gemini CLI speaks with `GOOGLE_GEMINI_BASE_URL`):
//! `models/M:streamGenerateContent?alt=sse` and `models/M:generateContent`.

use serde_json::{Value, json};

/// The text of the latest `user` entry in `contents` (its text parts joined by newlines),
/// without the `<session_context>` part Gemini CLI puts before the first prompt. When the
/// contents end with the answer to a tool the stand-in called (`functionResponse` parts),
/// that answer is the latest turn: the rule that called the tool does not match it again.
pub fn latest_user_text(body: &Value) -> String {
    let last = body["contents"].as_array().and_then(|c| c.last());
    if let Some(parts) = last.and_then(|m| m["parts"].as_array())
        && last.is_some_and(|m| m["role"] == "user")
        && parts.iter().any(|p| p["functionResponse"].is_object())
        && parts.iter().all(|p| !p["text"].is_string())
    {
        return parts
            .iter()
            .map(|p| p["functionResponse"]["response"].to_string())
            .collect::<Vec<_>>()
            .join("\n");
    }
    body["contents"]
        .as_array()
        .and_then(|c| {
            c.iter().rev().find(|m| {
                m["role"] == "user"
                    && m["parts"]
                        .as_array()
                        .is_some_and(|p| p.iter().any(|p| p["text"].is_string()))
            })
        })
        .map(|m| {
            m["parts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .filter(|t| !t.trim_start().starts_with("<session_context>"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn chunk_of(text: &str, last: bool, tool: Option<&(String, String)>) -> Value {
    let mut parts = vec![json!({"text": text})];
    if let Some((name, input)) = tool {
        parts.push(json!({"functionCall": {"name": name,
                                           "args": crate::messages::tool_input(input)}}));
    }
    let mut c = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if last {
        c["finishReason"] = json!("STOP");
    }
    json!({"candidates": [c],
           "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 10, "totalTokenCount": 20}})
}

/// The whole reply as one `generateContent` response; with `tool` (name, arguments as JSON
/// text), a `functionCall` part after the text.
pub fn reply_message(text: &str, tool: Option<&(String, String)>) -> Value {
    chunk_of(text, true, tool)
}

/// The reply as `streamGenerateContent` chunks (each an SSE `data:` line with no event name),
/// `chunk` characters each, the last with `finishReason: STOP` (and the `functionCall` part
/// of `tool`, if any).
pub fn reply_chunks(text: &str, tool: Option<&(String, String)>, chunk: usize) -> Vec<Value> {
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = chars
        .chunks(chunk.max(1))
        .map(|p| p.iter().collect())
        .collect();
    let n = pieces.len().max(1);
    if pieces.is_empty() {
        return vec![chunk_of("", true, tool)];
    }
    pieces
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let last = i + 1 == n;
            chunk_of(p, last, tool.filter(|_| last))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_the_last_user_text_and_the_reply_streams_whole() {
        let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "a"}]},
            {"role": "model", "parts": [{"text": "b"}]},
            {"role": "user", "parts": [{"text": "<session_context>\nx\n</session_context>"},
                                       {"text": "ping"}, {"text": "Bob"}]},
        ]});
        assert_eq!(latest_user_text(&body), "ping\nBob");
        // The answer to a tool call is the latest turn.
        let mut answered = body.clone();
        answered["contents"].as_array_mut().unwrap().push(json!(
            {"role": "user", "parts": [{"functionResponse": {"name": "relay_send",
                "response": {"output": "ACK [1] to Bob"}}}]}));
        assert!(latest_user_text(&answered).contains("ACK [1] to Bob"));
        let tool = ("relay_send".to_owned(), r#"{"to": "Bob"}"#.to_owned());
        let last = reply_chunks("Sending.", Some(&tool), 4).pop().unwrap();
        assert_eq!(
            last["candidates"][0]["content"]["parts"][1]["functionCall"]["args"]["to"],
            "Bob"
        );
        let chunks = reply_chunks("hello world", None, 4);
        assert_eq!(chunks.len(), 3);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(text, "hello world");
        assert_eq!(chunks[2]["candidates"][0]["finishReason"], "STOP");
        assert!(chunks[0]["candidates"][0].get("finishReason").is_none());
    }
}
