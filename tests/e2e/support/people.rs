//! People's adapters in tests: the Telegram stand-in's relay, the configuration file, and
//! signed webhook requests.

use super::*;
use relay_standin::people::{BotMessage, TelegramStandIn, WebhookStandIn};
use std::os::unix::fs::PermissionsExt;

pub(crate) const TOKEN: &str = "4242:SECRET-bot-token-never-logged";

pub(crate) const PERSON_TG: i64 = 42;

pub(crate) const WEBHOOK_SECRET: &str = "webhook-shared-secret";

/// A secret file with `mode`.
pub(crate) fn secret(relay: &Relay, name: &str, text: &str, mode: u32) {
    let path = relay.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes the project's configuration file.
pub(crate) fn configure(relay: &Relay, text: &str) {
    let dir = relay.dir.path().join(".agent-relay");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), text).unwrap();
}

/// A relay started with `args`, the private secret file `file` holding `text` and `config` as
/// its configuration file, once its adapters connection holds `person`'s name.
pub(crate) fn configured_relay(
    args: &[&str],
    (file, text): (&str, &str),
    config: &str,
    person: &str,
) -> Relay {
    let mut relay = Relay::unstarted();
    relay.set_args(args);
    secret(&relay, file, text, 0o600);
    configure(&relay, config);
    relay.spawn();
    wait_online(&relay, person);
    relay
}

/// A relay whose person `human` is Telegram user 42 on the stand-in's bot.
pub(crate) fn telegram_relay(tg: &TelegramStandIn, extra: &str) -> Relay {
    configured_relay(
        &[],
        ("tg.token", TOKEN),
        &format!(
            "[people.human]\ntelegram = {PERSON_TG}\n{extra}\n[adapters.telegram]\ntoken_file = \"tg.token\"\napi = \"{}\"\npoll_timeout_s = 2\nengage = \"mention-sticky\"\n",
            tg.base_url()
        ),
        "human",
    )
}

/// A relay started with `args` whose person `ops` is reached by a webhook to `hook` signed
/// with [`WEBHOOK_SECRET`]; `tuning` is more lines of `[adapters.webhook]` (attempts,
/// backoff).
pub(crate) fn webhook_relay(hook: &WebhookStandIn, tuning: &str, args: &[&str]) -> Relay {
    configured_relay(
        args,
        ("hook.secret", WEBHOOK_SECRET),
        &format!(
            "[people.ops]\nwebhook = true\n\n[adapters.webhook]\nurl = \"{}\"\nsecret_file = \"hook.secret\"\n{tuning}",
            hook.url()
        ),
        "ops",
    )
}

/// `attempts` and `backoff_ms` for [`webhook_relay`]: two tries, `backoff_ms` apart.
pub(crate) fn two_attempts(backoff_ms: u64) -> String {
    format!("attempts = 2\nbackoff_ms = {backoff_ms}\n")
}

/// The first message the stand-in's bot sent whose text contains `text`.
pub(crate) fn bot_sent(tg: &TelegramStandIn, text: &str) -> Option<BotMessage> {
    tg.sent().into_iter().find(|m| m.text.contains(text))
}

/// Waits (at most `limit`) until the stand-in's bot has sent a message containing `text`;
/// returns the first such.
pub(crate) fn wait_bot_sent(tg: &TelegramStandIn, limit: Duration, text: &str) -> BotMessage {
    wait_for(limit, &format!("the bot sends {text:?}"), || {
        bot_sent(tg, text).is_some()
    });
    bot_sent(tg, text).unwrap()
}

pub(crate) fn adapter(relay: &Relay, name: &str) -> Value {
    let v: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["adapters", "--json"]))).unwrap();
    v["adapters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .cloned()
        .unwrap_or_default()
}

/// A POST to the dashboard's listener, with a body; (status, JSON answer).
pub(crate) fn post(port: u16, path: &str, headers: &[(&str, String)], body: &str) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
}

pub(crate) fn signed(secret: &str, ts: u64, body: &str) -> Vec<(&'static str, String)> {
    vec![
        ("X-Relay-Timestamp", ts.to_string()),
        (
            "X-Relay-Signature",
            relay_people::sign::header_value(secret.as_bytes(), ts, body.as_bytes()),
        ),
    ]
}

pub(crate) fn now_s() -> u64 {
    relay_protocol::now_ms() / 1000
}
