//! The Telegram Bot API, the parts the relay uses: `getUpdates` (long polling, so no public URL
//! is needed) and `sendMessage`. The token is part of every request's path, so this type never
//! shows it: not in `Debug`, not in errors (see [`crate::http::HttpError`]).

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::http::{self, HttpError};

/// A bot, by its API base URL and token.
#[derive(Clone)]
pub struct Bot {
    api: String,
    token: String,
}

impl std::fmt::Debug for Bot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bot")
            .field("api", &self.api)
            .field("token", &"<hidden>")
            .finish()
    }
}

/// One update (only messages are asked for).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Update {
    /// Its id; the next poll asks for ids after it.
    pub update_id: i64,
    /// The message, if the update is one.
    #[serde(default)]
    pub message: Option<Message>,
}

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Message {
    /// Id within its chat.
    pub message_id: i64,
    /// Who wrote it (absent for channel posts).
    #[serde(default)]
    pub from: Option<User>,
    /// Where.
    pub chat: Chat,
    /// The text, for text messages.
    #[serde(default)]
    pub text: Option<String>,
    /// The message it replies to.
    #[serde(default)]
    pub reply_to_message: Option<Box<Message>>,
}

/// A user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct User {
    /// User id.
    pub id: i64,
}

/// A chat.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Chat {
    /// Chat id (a private chat's id is the user's).
    pub id: i64,
}

#[derive(Deserialize)]
struct Answer<T> {
    ok: bool,
    result: Option<T>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    parameters: Option<Parameters>,
}

/// What a refusal says about trying again.
#[derive(Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// Telegram's limit on a message's text, in UTF-16 code units.
pub const TEXT_LIMIT: usize = 4096;

/// Cuts `text` into pieces Telegram accepts (at most [`TEXT_LIMIT`] UTF-16 units each, room
/// left for a `(2/3) ` mark), at a line break or space near the end of each piece when there
/// is one. A text within the limit is one piece.
pub fn split_text(text: &str) -> Vec<String> {
    if text.encode_utf16().count() <= TEXT_LIMIT {
        return vec![text.to_owned()];
    }
    let budget = TEXT_LIMIT - 16;
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut units = 0;
        let mut end = rest.len();
        for (at, c) in rest.char_indices() {
            units += c.len_utf16();
            if units > budget {
                end = at;
                break;
            }
        }
        if end < rest.len() {
            // Prefer a line break, then a space, in the last quarter of the piece.
            let floor = end * 3 / 4;
            if let Some(b) = rest[..end].rfind('\n').filter(|&b| b > floor) {
                end = b + 1;
            } else if let Some(b) = rest[..end].rfind(' ').filter(|&b| b > floor) {
                end = b + 1;
            }
        }
        pieces.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    let n = pieces.len();
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| format!("({}/{n}) {p}", i + 1))
        .collect()
}

#[derive(Deserialize)]
struct Sent {
    message_id: i64,
}

impl Bot {
    /// A bot at `api` (no trailing slash) with `token`.
    pub fn new(api: String, token: String) -> Self {
        Self { api, token }
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<T, HttpError> {
        let url = format!("{}/bot{}/{method}", self.api, self.token);
        let (status, bytes) =
            http::post_json(&url, &[], body.to_string().into_bytes(), timeout).await?;
        let answer: Answer<T> = serde_json::from_slice(&bytes).map_err(|e| {
            HttpError::Io(format!(
                "{method}: HTTP {status}, not a Bot API answer: {e}"
            ))
        })?;
        match (answer.ok, answer.result) {
            (true, Some(r)) => Ok(r),
            _ => Err(HttpError::Status {
                status: answer.error_code.unwrap_or(status),
                reason: format!(
                    "{method}: {}",
                    relay_protocol::text::one_line(
                        answer.description.as_deref().unwrap_or("not ok"),
                        200
                    )
                ),
                retry_after: answer.parameters.and_then(|p| p.retry_after),
            }),
        }
    }

    /// Updates after `offset`, waiting up to `wait` for one.
    ///
    /// # Errors
    /// [`HttpError`].
    pub async fn updates(&self, offset: i64, wait: Duration) -> Result<Vec<Update>, HttpError> {
        self.call(
            "getUpdates",
            json!({"offset": offset, "timeout": wait.as_secs(), "allowed_updates": ["message"]}),
            wait + Duration::from_secs(10),
        )
        .await
    }

    /// Sends `text` to `chat`; the new message's id.
    ///
    /// # Errors
    /// [`HttpError`].
    pub async fn send(&self, chat: i64, text: &str) -> Result<i64, HttpError> {
        let sent: Sent = self
            .call(
                "sendMessage",
                json!({"chat_id": chat, "text": text}),
                Duration::from_secs(20),
            )
            .await?;
        Ok(sent.message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_never_shown() {
        let bot = Bot::new("http://x".into(), "123:SECRET".into());
        assert!(!format!("{bot:?}").contains("SECRET"));
    }

    #[test]
    fn long_texts_are_cut_into_pieces_telegram_accepts() {
        assert_eq!(split_text("short"), vec!["short".to_owned()]);
        let long = "word ".repeat(3000) + &"é".repeat(5000) + &"🦀".repeat(3000);
        let pieces = split_text(&long);
        assert!(pieces.len() > 3);
        for (i, p) in pieces.iter().enumerate() {
            assert!(p.encode_utf16().count() <= TEXT_LIMIT, "piece {i}");
            assert!(p.starts_with(&format!("({}/{}) ", i + 1, pieces.len())));
        }
        let joined: String = pieces
            .iter()
            .map(|p| p.split_once(") ").unwrap().1)
            .collect();
        assert_eq!(joined, long);
    }

    #[test]
    fn a_refusal_says_when_to_try_again() {
        let text = r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#;
        let a: Answer<Sent> = serde_json::from_str(text).unwrap();
        assert_eq!(a.parameters.unwrap().retry_after, Some(3));
    }

    #[test]
    fn updates_are_read() {
        let text = r#"{"ok":true,"result":[{"update_id":5,"message":{"message_id":9,"from":{"id":7,"is_bot":false},"chat":{"id":7,"type":"private"},"text":"hi","reply_to_message":{"message_id":3,"chat":{"id":7},"text":"x"}}}]}"#;
        let a: Answer<Vec<Update>> = serde_json::from_str(text).unwrap();
        let u = &a.result.unwrap()[0];
        let m = u.message.as_ref().unwrap();
        assert_eq!((m.from.as_ref().unwrap().id, m.chat.id), (7, 7));
        assert_eq!(m.reply_to_message.as_ref().unwrap().message_id, 3);
    }
}
