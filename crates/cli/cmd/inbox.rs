//! `agent-relay inbox` and `agent-relay reply`: the person's mailbox.
//!
//! `human` and every declared person (`[people.NAME]`) can always be addressed; their messages
//! wait in the store like an offline agent's (`docs/DESIGN` §13). `inbox` is one of the
//! person's doors: it holds the person's name for as long as it runs ([`Mailbox`]), prints
//! what waits, oldest first, and acknowledges each message it printed as verified by this door
//! (the store's record, which `trace` shows: a second `inbox` does not print it again).
//! When the person's adapters hold the name (they take every message as it comes), it says so
//! and prints the latest messages instead. `reply` answers a message as the person, threaded.

use relay_client::Delivered;
use relay_client::paths::Paths;
use relay_protocol::query::{HistoryFilter, MessageRecord, QueryRequest, QueryResult};
use relay_protocol::text::{for_terminal, one_line};
use relay_protocol::{Kind, short_id};

use crate::args::{InboxArgs, ReplyArgs, SendArgs};
use crate::cmd::mailbox::Mailbox;
use crate::out::{JsonArray, line};
use crate::time::format_utc;

/// The door's name in a delivery's trace.
const DOOR: &str = "shown to the person by agent-relay inbox";
/// Messages taken from the relay at a time.
const PAGE: usize = 200;
/// Messages already read shown by `--all`.
const READ_SHOWN: u32 = 20;

/// `agent-relay inbox`.
pub(crate) async fn inbox(paths: &Paths, args: &InboxArgs) -> anyhow::Result<()> {
    relay_protocol::validate_agent_name(&args.person)
        .map_err(|e| crate::exit::usage(format!("--as {:?}: {e}", args.person)))?;
    let Some(mailbox) = Mailbox::open(
        &paths.socket,
        &args.person,
        relay_protocol::PERSON_CLI,
        args.follow,
        false,
    )
    .await?
    else {
        eprintln!(
            "agent-relay: {} is held by another of the person's doors (the relay's adapters, or \
             another `agent-relay inbox`), which takes each message as it comes; the latest ones:",
            one_line(&args.person, 64)
        );
        let read = latest(paths, &args.person, READ_SHOWN, &[]).await?;
        let mut out = Out::of(args);
        print_records(&read, false, &mut out)?;
        return out.finish();
    };
    let mut out = Out::of(args);
    let mut shown = Vec::new();
    loop {
        let (page, more) = mailbox.take(PAGE, DOOR).await?;
        for m in &page {
            print_delivered(m, &mut out)?;
        }
        shown.extend(page.iter().map(|m| m.id.clone()));
        if more == 0 || page.is_empty() {
            break;
        }
    }
    if shown.is_empty() && !args.json && !args.follow {
        line(format!(
            "No new messages for {}.",
            one_line(&args.person, 64)
        ))?;
    }
    if args.all {
        let read = latest(paths, &args.person, READ_SHOWN, &shown).await?;
        if !read.is_empty() && !args.json {
            line("Read before:")?;
        }
        print_records(&read, false, &mut out)?;
    }
    if args.follow {
        while let Some(m) = mailbox.next(DOOR).await {
            print_delivered(&m, &mut out)?;
        }
    }
    // Closed, not dropped: what was acknowledged is written before the command ends.
    mailbox.close().await;
    out.finish()
}

/// How the inbox prints: text, or `--json`: one JSON array (`history --json`'s form), or
/// with `--follow`, a stream that never ends, one object per line (JSON Lines).
enum Out {
    Text,
    Array(JsonArray),
    Lines,
}

impl Out {
    fn of(args: &InboxArgs) -> Self {
        match (args.json, args.follow) {
            (false, _) => Out::Text,
            (true, false) => Out::Array(JsonArray::new()),
            (true, true) => Out::Lines,
        }
    }

    fn json(&self) -> bool {
        !matches!(self, Out::Text)
    }

    /// Ends the output (closes the array).
    fn finish(self) -> anyhow::Result<()> {
        match self {
            Out::Array(a) => a.finish(),
            Out::Text | Out::Lines => Ok(()),
        }
    }
}

/// The latest `limit` messages to `person` other than `except`, oldest first.
async fn latest(
    paths: &Paths,
    person: &str,
    limit: u32,
    except: &[String],
) -> anyhow::Result<Vec<MessageRecord>> {
    let client = crate::cmd::tool_client(&paths.socket, "cli").await?;
    let res = client
        .query(QueryRequest::History(HistoryFilter {
            to: Some(person.to_owned()),
            limit: Some(limit),
            ..HistoryFilter::default()
        }))
        .await;
    client.close().await;
    let QueryResult::History { messages } = res? else {
        anyhow::bail!("unexpected answer to history");
    };
    let mut messages: Vec<MessageRecord> = messages
        .into_iter()
        .filter(|m| m.from != person && !except.contains(&m.id))
        .collect();
    messages.reverse();
    Ok(messages)
}

/// One message as the inbox prints it: `unread` says whether this door just handed it over.
#[allow(clippy::too_many_arguments)]
fn print_one(
    id: &str,
    ts: u64,
    from: &str,
    thread: Option<&str>,
    kind: Kind,
    body: &str,
    unread: bool,
    json: Option<serde_json::Value>,
    out: &mut Out,
) -> anyhow::Result<()> {
    if let Some(mut v) = json {
        v["unread"] = serde_json::Value::Bool(unread);
        match out {
            Out::Array(a) => a.push(&v)?,
            Out::Text | Out::Lines => line(relay_protocol::text::json_line(&v)?)?,
        }
        return Ok(());
    }
    let mut head = format!(
        "[{}] from {} at {} UTC",
        for_terminal(short_id(id)),
        one_line(from, 64),
        format_utc(ts)
    );
    if let Some(t) = thread {
        head.push_str(&format!(" (thread {})", one_line(short_id(t), 64)));
    }
    if kind != Kind::Message {
        head.push_str(&format!(" ({})", kind.as_str()));
    }
    line(format!("{head}:"))?;
    for l in for_terminal(body).lines() {
        line(format!("  {l}"))?;
    }
    line(format!(
        "  (answer: agent-relay reply {} \"...\")",
        for_terminal(short_id(id))
    ))?;
    Ok(())
}

fn print_delivered(m: &Delivered, out: &mut Out) -> anyhow::Result<()> {
    let v = out.json().then(|| {
        serde_json::json!({
            "id": m.id,
            "ts": m.ts,
            "from": m.from,
            "to": m.to,
            "topic": m.topic,
            "kind": m.payload.kind,
            "body": m.payload.body,
            "thread": m.payload.thread,
            "in_reply_to": m.payload.in_reply_to,
        })
    });
    print_one(
        &m.id,
        m.ts,
        &m.from,
        m.payload.thread.as_deref(),
        m.payload.kind,
        &m.payload.body,
        true,
        v,
        out,
    )
}

fn print_records(messages: &[MessageRecord], unread: bool, out: &mut Out) -> anyhow::Result<()> {
    for m in messages {
        let v = if out.json() {
            Some(serde_json::to_value(m)?)
        } else {
            None
        };
        print_one(
            &m.id,
            m.ts,
            &m.from,
            m.thread.as_deref(),
            m.kind,
            &m.body,
            unread,
            v,
            out,
        )?;
    }
    Ok(())
}

/// `agent-relay reply`: the message answered is read first; the answer goes to its sender,
/// with `in_reply_to` (the hop budget counts it) and the thread (the answered message's, or
/// the answered message itself).
pub(crate) async fn reply(paths: &Paths, args: ReplyArgs) -> anyhow::Result<()> {
    let QueryResult::Read { message } =
        crate::cmd::query::ask_id(paths, &args.id, |id| QueryRequest::Read { id, from: None })
            .await?
    else {
        anyhow::bail!("unexpected answer to read")
    };
    let thread = message.thread.clone().unwrap_or_else(|| message.id.clone());
    let send = SendArgs {
        to: message.from.clone(),
        body: args.body,
        from: args.from,
        topic: None,
        kind: "message".into(),
        thread: Some(thread),
        in_reply_to: Some(message.id),
        id: None,
        urgent: args.urgent,
        json: args.json,
    };
    crate::cmd::send::send(paths, send).await
}
