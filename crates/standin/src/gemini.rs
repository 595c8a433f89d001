//! The Gemini API's shapes (what Gemini CLI speaks with `GOOGLE_GEMINI_BASE_URL`):
//! `models/M:streamGenerateContent?alt=sse` and `models/M:generateContent`.

use serde_json::{Value, json};

/// The text of the latest `user` entry in `contents` (its text parts joined by newlines),
/// without the `<session_context>` part Gemini CLI puts before the first prompt.
pub fn latest_user_text(body: &Value) -> String {
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

fn chunk_of(text: &str, last: bool) -> Value {
    let mut c = json!({"content": {"role": "model", "parts": [{"text": text}]}, "index": 0});
    if last {
        c["finishReason"] = json!("STOP");
    }
    json!({"candidates": [c],
           "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 10, "totalTokenCount": 20}})
}

/// The whole reply as one `generateContent` response.
pub fn reply_message(text: &str) -> Value {
    chunk_of(text, true)
}

/// The reply as `streamGenerateContent` chunks (each an SSE `data:` line with no event name),
/// `chunk` characters each, the last with `finishReason: STOP`.
pub fn reply_chunks(text: &str, chunk: usize) -> Vec<Value> {
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = chars
        .chunks(chunk.max(1))
        .map(|p| p.iter().collect())
        .collect();
    let n = pieces.len().max(1);
    if pieces.is_empty() {
        return vec![chunk_of("", true)];
    }
    pieces
        .iter()
        .enumerate()
        .map(|(i, p)| chunk_of(p, i + 1 == n))
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
            {"role": "user", "parts": [{"functionResponse": {}}]},
        ]});
        assert_eq!(latest_user_text(&body), "ping\nBob");
        let chunks = reply_chunks("hello world", 4);
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
