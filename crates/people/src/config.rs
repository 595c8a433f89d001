//! The `[people.NAME]` and `[adapters.*]` tables of `.agent-relay/config.toml`:
//!
//! ```toml
//! [people.human]
//! telegram = 123456789        # this person's Telegram user id (their chat with the bot)
//! webhook = true              # messages to this person are also POSTed to [adapters.webhook]
//! notify = ["blocked", "waiting", "dead"]
//! blocked_after_s = 30
//! waiting_after_s = 600
//!
//! [adapters.webhook]
//! url = "https://example.org/relay"
//! secret_file = "~/.config/agent-relay/webhook.secret"   # 0600
//!
//! [adapters.telegram]
//! token_file = "~/.config/agent-relay/telegram.token"    # 0600
//! api = "https://api.telegram.org"
//! engage = "mention"          # pattern | mention | mention-sticky
//! senders = "known"           # known | all
//! ignored = "drop"            # drop | accumulate (handed to the next engaging message)
//! ```
//!
//! Read from the file's text with spans, so every error names its line and column. Secrets
//! are never in this file: only the path of a file that holds them, which must be private.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::engage::{EngageMode, IgnoredPolicy, SenderScope};
use crate::notify::NoticeKind;

/// A configuration error, with the byte offset it is about (the caller turns it into a line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// Where in the text.
    pub offset: usize,
    /// What is wrong, and what is allowed.
    pub message: String,
}

/// One person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// The name agents address.
    pub name: String,
    /// Telegram user id (the private chat messages go to).
    pub telegram: Option<i64>,
    /// Whether messages to this person go to the webhook.
    pub webhook: bool,
    /// Which notices this person gets.
    pub notify: Vec<NoticeKind>,
    /// Blocked this long is told (seconds).
    pub blocked_after_s: u64,
    /// Unanswered this long is told (seconds).
    pub waiting_after_s: u64,
}

impl Person {
    /// Whether an adapter reaches this person (otherwise their messages wait in their mailbox
    /// for `agent-relay inbox` and the dashboard).
    pub fn reachable(&self) -> bool {
        self.telegram.is_some() || self.webhook
    }
}

/// The webhook adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    /// Where messages to people are POSTed.
    pub url: String,
    /// The file holding the shared HMAC secret (0600).
    pub secret_file: PathBuf,
    /// Inbound timestamps further than this from now are refused (seconds).
    pub tolerance_s: u64,
    /// Tries per message before it is dead-lettered.
    pub attempts: u32,
    /// First retry delay (ms), doubled each time.
    pub backoff_ms: u64,
}

/// The Telegram adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct Telegram {
    /// The file holding the bot token (0600).
    pub token_file: PathBuf,
    /// Bot API base URL.
    pub api: String,
    /// Group chats the bot listens in, and the person who speaks for members not declared
    /// (sender scope `all`).
    pub groups: BTreeMap<i64, String>,
    /// Engage mode.
    pub engage: EngageMode,
    /// With `engage = "pattern"`: the pattern and the agent it engages.
    pub pattern: Option<(String, String)>,
    /// Sender scope.
    pub senders: SenderScope,
    /// Ignored-message policy.
    pub ignored: IgnoredPolicy,
    /// Long-poll timeout (seconds).
    pub poll_timeout_s: u64,
}

/// Everything about people in one configuration file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PeopleConfig {
    /// Declared people.
    pub people: Vec<Person>,
    /// The webhook adapter, if configured.
    pub webhook: Option<Webhook>,
    /// The Telegram adapter, if configured.
    pub telegram: Option<Telegram>,
}

impl PeopleConfig {
    /// Whether anything is configured.
    pub fn is_empty(&self) -> bool {
        self.people.is_empty()
    }
}

#[derive(Deserialize)]
struct Doc {
    #[serde(default)]
    people: BTreeMap<Spanned<String>, PersonToml>,
    #[serde(default)]
    adapters: Option<AdaptersToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PersonToml {
    telegram: Option<i64>,
    #[serde(default)]
    webhook: bool,
    notify: Option<Vec<NoticeKind>>,
    blocked_after_s: Option<u64>,
    waiting_after_s: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdaptersToml {
    webhook: Option<WebhookToml>,
    telegram: Option<TelegramToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookToml {
    url: Spanned<String>,
    secret_file: String,
    tolerance_s: Option<u64>,
    attempts: Option<u32>,
    backoff_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TelegramToml {
    token_file: String,
    api: Option<Spanned<String>>,
    #[serde(default)]
    groups: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    engage: EngageMode,
    pattern: Option<Spanned<String>>,
    agent: Option<Spanned<String>>,
    #[serde(default)]
    senders: SenderScope,
    #[serde(default)]
    ignored: IgnoredPolicy,
    poll_timeout_s: Option<u64>,
}

/// Default Bot API base URL.
pub const TELEGRAM_API: &str = "https://api.telegram.org";

/// Reads the people and adapters of a configuration file's `text`; relative file paths are
/// taken from `root` (the project), `~/` from `home`.
///
/// # Errors
/// [`ConfigError`] naming the offset of the first problem.
pub fn parse(text: &str, root: &Path, home: Option<&Path>) -> Result<PeopleConfig, ConfigError> {
    let doc: Doc = toml::from_str(text).map_err(|e| ConfigError {
        offset: e.span().map_or(0, |s| s.start),
        message: e.message().trim_end().to_owned(),
    })?;
    let path = |p: &str| -> PathBuf {
        match (p.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest),
            _ => root.join(p),
        }
    };
    let err = |offset: usize, message: String| ConfigError { offset, message };
    let mut cfg = PeopleConfig::default();
    for (name, person) in &doc.people {
        relay_protocol::validate_agent_name(name.get_ref()).map_err(|e| {
            err(
                name.span().start,
                format!(
                    "[people.{}]: {e}",
                    relay_protocol::text::one_line(name.get_ref(), 60)
                ),
            )
        })?;
        let p = person;
        cfg.people.push(Person {
            name: name.get_ref().clone(),
            telegram: p.telegram,
            webhook: p.webhook,
            notify: p.notify.clone().unwrap_or_else(|| {
                vec![NoticeKind::Blocked, NoticeKind::Waiting, NoticeKind::Dead]
            }),
            blocked_after_s: p.blocked_after_s.unwrap_or(60),
            waiting_after_s: p.waiting_after_s.unwrap_or(600),
        });
    }
    let adapters = doc.adapters.as_ref();
    if let Some(w) = adapters.and_then(|a| a.webhook.as_ref()) {
        let span = w.url.span().start;
        let url = w.url.get_ref();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(err(
                w.url.span().start,
                format!("[adapters.webhook] url = {url:?}: expected an http:// or https:// URL"),
            ));
        }
        cfg.webhook = Some(Webhook {
            url: url.clone(),
            secret_file: path(&w.secret_file),
            tolerance_s: w.tolerance_s.unwrap_or(300),
            attempts: w.attempts.unwrap_or(4).max(1),
            backoff_ms: w.backoff_ms.unwrap_or(500),
        });
        if !cfg.people.iter().any(|p| p.webhook) {
            return Err(err(
                span,
                "[adapters.webhook]: no person has `webhook = true`, so nobody could use it".into(),
            ));
        }
    } else if let Some((name, _)) = doc.people.iter().find(|(_, p)| p.webhook) {
        return Err(err(
            name.span().start,
            format!(
                "[people.{}] webhook = true, but there is no [adapters.webhook] table",
                name.get_ref()
            ),
        ));
    }
    if let Some(t) = adapters.and_then(|a| a.telegram.as_ref()) {
        let api = t.api.as_ref().map_or(TELEGRAM_API.to_owned(), |a| {
            a.get_ref().trim_end_matches('/').to_owned()
        });
        if !(api.starts_with("http://") || api.starts_with("https://")) {
            let at = t.api.as_ref().map_or(0, |a| a.span().start);
            return Err(err(
                at,
                format!("[adapters.telegram] api = {api:?}: expected an http:// or https:// URL"),
            ));
        }
        let mut groups = BTreeMap::new();
        for (chat, person) in &t.groups {
            let id: i64 = chat.parse().map_err(|_| {
                err(person.span().start, format!("[adapters.telegram.groups] {chat:?}: a chat id is a number (\"-100...\" for a group)"))
            })?;
            if !cfg.people.iter().any(|p| &p.name == person.get_ref()) {
                return Err(err(
                    person.span().start,
                    format!(
                        "[adapters.telegram.groups] {chat} = {:?}: not a declared person ([people.NAME])",
                        person.get_ref()
                    ),
                ));
            }
            groups.insert(id, person.get_ref().clone());
        }
        let pattern = match (t.engage, &t.pattern, &t.agent) {
            (EngageMode::Pattern, Some(p), Some(a)) => {
                regex::Regex::new(p.get_ref()).map_err(|e| {
                    err(p.span().start, format!("[adapters.telegram] pattern: {e}"))
                })?;
                relay_protocol::validate_agent_name(a.get_ref())
                    .map_err(|e| err(a.span().start, format!("[adapters.telegram] agent: {e}")))?;
                Some((p.get_ref().clone(), a.get_ref().clone()))
            }
            (EngageMode::Pattern, _, _) => {
                return Err(err(0, "[adapters.telegram] engage = \"pattern\" needs `pattern` (a regular expression, \".\" for every message) and `agent` (who it engages)".into()));
            }
            (_, Some(p), _) => {
                return Err(err(
                    p.span().start,
                    "[adapters.telegram] pattern: only used with engage = \"pattern\"".into(),
                ));
            }
            _ => None,
        };
        if !cfg.people.iter().any(|p| p.telegram.is_some()) {
            return Err(err(
                0,
                "[adapters.telegram]: no person has a `telegram` user id, so nobody could use it"
                    .into(),
            ));
        }
        cfg.telegram = Some(Telegram {
            token_file: path(&t.token_file),
            api,
            groups,
            engage: t.engage,
            pattern,
            senders: t.senders,
            ignored: t.ignored,
            poll_timeout_s: t.poll_timeout_s.unwrap_or(25).min(50),
        });
    } else if let Some((name, _)) = doc.people.iter().find(|(_, p)| p.telegram.is_some()) {
        return Err(err(
            name.span().start,
            format!(
                "[people.{}] has a telegram id, but there is no [adapters.telegram] table",
                name.get_ref()
            ),
        ));
    }
    // A person with neither is a mailbox only: `agent-relay inbox` and the dashboard.
    Ok(cfg)
}

/// Reads a secret from `path`, which must be a regular file of ours that no one else can read
/// or write (0600); surrounding whitespace is dropped.
///
/// # Errors
/// A message naming the file and what to do.
pub fn read_secret(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read secret file {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("secret file {shown} is not a regular file"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "secret file {shown} is readable or writable by others (mode {:o}); run `chmod 600 {shown}`",
            meta.mode() & 0o777
        ));
    }
    if meta.uid() != rustix::process::getuid().as_raw() {
        return Err(format!("secret file {shown} belongs to another user"));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read secret file {shown}: {e}"))?;
    let secret = text.trim().to_owned();
    if secret.is_empty() {
        return Err(format!("secret file {shown} is empty"));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str, e: &ConfigError) -> usize {
        text[..e.offset].matches('\n').count() + 1
    }

    #[test]
    fn a_full_configuration_is_read() {
        let text = "[up]\ninbox-ttl = \"1m\"\n\n[people.human]\ntelegram = 42\nwebhook = true\nblocked_after_s = 5\n\n[adapters.webhook]\nurl = \"http://127.0.0.1:9/x\"\nsecret_file = \"s.secret\"\n\n[adapters.telegram]\ntoken_file = \"~/t.token\"\napi = \"http://127.0.0.1:1/\"\nengage = \"mention-sticky\"\n";
        let cfg = parse(text, Path::new("/p"), Some(Path::new("/h"))).unwrap();
        assert_eq!(cfg.people[0].telegram, Some(42));
        assert_eq!(cfg.people[0].blocked_after_s, 5);
        assert_eq!(
            cfg.webhook.as_ref().unwrap().secret_file,
            Path::new("/p/s.secret")
        );
        let t = cfg.telegram.unwrap();
        assert_eq!(t.token_file, Path::new("/h/t.token"));
        assert_eq!(t.api, "http://127.0.0.1:1");
        assert_eq!(t.engage, EngageMode::MentionSticky);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, at, says) in [
            (
                "[people.human]\ntelegram = 1\ncolour = 2\n[adapters.telegram]\ntoken_file = \"t\"\n",
                3,
                "unknown field",
            ),
            (
                "[people.human]\ntelegram = 1\n[adapters.telegram]\ntoken_file = \"t\"\nengage = \"always\"\n",
                5,
                "unknown variant",
            ),
            (
                "[people.human]\nwebhook = true\n\n[adapters.webhook]\nurl = \"ftp://x\"\nsecret_file = \"s\"\n",
                5,
                "http://",
            ),
            ("\n[people.\"bad name\"]\nwebhook = true\n", 2, "people."),
        ] {
            let e = parse(text, Path::new("/p"), None).unwrap_err();
            assert_eq!(line(text, &e), at, "{text}: {e}");
            assert!(e.message.contains(says), "{e}");
        }
    }

    #[test]
    fn a_person_without_an_adapter_is_a_mailbox() {
        let cfg = parse("[people.human]\n\n[people.Kim]\n", Path::new("/p"), None).unwrap();
        let names: Vec<&str> = cfg.people.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["Kim", "human"]);
        assert!(cfg.people.iter().all(|p| !p.reachable()));
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile_dir();
        let f = dir.join("token");
        std::fs::write(&f, "123:abc\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret(&f).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        assert!(!e.contains("123:abc"), "the secret is never in a message");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&f).unwrap(), "123:abc");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "relay-people-{}-{}",
            std::process::id(),
            relay_protocol::now_ms()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
