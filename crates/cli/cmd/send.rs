//! `agent-relay send`.

use std::io::Read;

use relay_client::Outgoing;
use relay_client::paths::Paths;
use relay_protocol::{AckStatus, Kind, Send};

use crate::args::SendArgs;
use crate::cmd::tool_client;
use crate::out::{json, line};

/// Sends one message and prints its id and receipt.
pub(crate) async fn send(paths: &Paths, args: SendArgs) -> anyhow::Result<()> {
    let kind = Kind::parse(&args.kind)
        .ok_or_else(|| crate::exit::usage("--kind must be message, action, state or thinking"))?;
    // Checked here rather than by the relay: a value the command line gave that cannot be used
    // is bad usage (exit 2), not a refused message (5) or a failed connection (1).
    use crate::exit::usage;
    if args.to != "*" {
        relay_protocol::validate_agent_name(&args.to)
            .map_err(|e| usage(format!("invalid agent name for the recipient: {e}")))?;
    }
    relay_protocol::validate_agent_name(&args.from)
        .map_err(|e| usage(format!("invalid agent name for --from: {e}")))?;
    if let Some(t) = &args.topic {
        relay_protocol::validate_topic(t).map_err(|e| usage(format!("--topic {t:?}: {e}")))?;
    }
    if let Some(id) = &args.id {
        relay_protocol::text::validate_message_id(id)
            .map_err(|e| usage(format!("--id {id:?}: {e}")))?;
    }
    let body = match args.body.as_deref() {
        Some(b) if b != "-" => b.to_owned(),
        _ => {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                // Otherwise the command just waits, and looks stuck.
                eprintln!(
                    "agent-relay: type the message for {}, then press Ctrl-D on a new line to send it (Ctrl-C cancels)",
                    relay_protocol::text::one_line(&args.to, 64)
                );
            }
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s.trim_end_matches('\n').to_owned()
        }
    };
    if body.trim().is_empty() {
        anyhow::bail!("the message is empty; give the text as an argument or on stdin");
    }
    let client = tool_client(&paths.socket, &args.from).await?;
    let msg = Outgoing {
        id: args.id,
        to: Some(args.to.clone()),
        topic: args.topic.clone(),
        payload: Send {
            origin: None,
            kind,
            body,
            data: None,
            thread: args.thread,
            in_reply_to: args.in_reply_to,
            budget: None,
            urgent: args.urgent,
        },
    };
    let res = client.send(msg).await;
    client.close().await;
    let receipt = res?;
    // A topic nobody subscribes to: stored, and nobody gets it; said rather than left to look
    // delivered.
    let unheard = match (&args.topic, receipt.recipients) {
        (Some(t), Some(0)) => Some(format!(
            "no agent subscribes to topic {}: nobody got it (an agent subscribes with `wrap --subscribe PATTERN`)",
            relay_protocol::text::one_line(t, 200)
        )),
        _ => None,
    };
    if args.json {
        let note = receipt
            .note
            .as_deref()
            .map(|n| relay_protocol::text::one_line(n, usize::MAX))
            .or(unheard);
        return json(&serde_json::json!({
            "id": receipt.id,
            "status": receipt.status,
            "recipients": receipt.recipients,
            "note": note,
        }));
    }
    if let Some(u) = &unheard {
        eprintln!("agent-relay: {u}");
    }
    let what = match (receipt.status, &receipt.note) {
        // The relay says why it waits (a recipient that has not connected yet).
        (AckStatus::Queued, Some(note)) => format!(
            "queued ({})",
            relay_protocol::text::one_line(note, usize::MAX)
        ),
        (AckStatus::Accepted, _) => "accepted".to_owned(),
        (AckStatus::Queued, None) => {
            "queued (recipient offline; delivered when it connects)".to_owned()
        }
        (AckStatus::Duplicate, _) => {
            "duplicate (this id was sent before; nothing new was stored)".to_owned()
        }
    };
    let n = receipt
        .recipients
        .map(|n| format!(", {n} recipient{}", if n == 1 { "" } else { "s" }))
        .unwrap_or_default();
    line(format!(
        "{}  to {}: {what}{n}",
        relay_protocol::text::one_line(&receipt.id, usize::MAX),
        relay_protocol::text::one_line(&args.to, usize::MAX)
    ))?;
    Ok(())
}
