//! `status`, `agents`, `read`, `history`: read-only questions to the daemon.

use relay_client::ClientError;
use relay_client::paths::Paths;
use relay_protocol::query::{
    DeadLetter, HistoryFilter, MessageRecord, QueryRequest, QueryResult, TraceEvent,
};
use relay_protocol::text::{for_terminal, one_line};

use crate::args::{DlqAction, DlqArgs, HistoryArgs, ReadArgs};
use crate::cmd::tool_client;
use crate::exit::not_running;
use crate::out::{JsonArray, json, line};
use crate::time::{format_utc, human_secs};

/// A relay-supplied name, id or short text on one line of output: controls shown, never
/// interpreted, and no line break that would forge another line.
fn field(text: &str) -> String {
    one_line(text, usize::MAX)
}

async fn ask(paths: &Paths, req: QueryRequest) -> anyhow::Result<QueryResult> {
    let client = tool_client(&paths.socket, "cli").await?;
    let res = client.query(req).await;
    client.close().await;
    Ok(res?)
}

/// Asks `make(id)`; when nothing has that id and it has lower-case letters, asks again with
/// it upper-cased. Ids the relay makes are ULIDs, which are case-insensitive and written in
/// upper case; ids in general are case-sensitive (a SEND may choose `build-1` and `BUILD-1`),
/// so the exact id is always tried first.
pub(crate) async fn ask_id(
    paths: &Paths,
    id: &str,
    make: impl Fn(String) -> QueryRequest,
) -> anyhow::Result<QueryResult> {
    let first = ask(paths, make(id.to_owned())).await;
    let upper = id.to_ascii_uppercase();
    let not_found = |e: &anyhow::Error| {
        matches!(
            e.downcast_ref::<ClientError>(),
            Some(ClientError::Query { code, .. }) if code == "not_found"
        )
    };
    match first {
        Err(e) if upper != id && not_found(&e) => match ask(paths, make(upper)).await {
            Ok(found) => Ok(found),
            // The error for the id as given, which is what the person typed.
            Err(_) => Err(e),
        },
        other => other,
    }
}

/// `agent-relay status`.
pub(crate) async fn status(paths: &Paths, as_json: bool) -> anyhow::Result<()> {
    let res = match ask(paths, QueryRequest::Status).await {
        Ok(r) => r,
        Err(e)
            if matches!(
                e.downcast_ref::<ClientError>(),
                Some(ClientError::NotRunning { .. })
            ) =>
        {
            if as_json {
                json(&serde_json::json!({
                    "running": false,
                    "pid": null,
                    "project_root": paths.project_root,
                    "socket": paths.socket,
                    "db": paths.db,
                    "data_dir": paths.data_dir,
                }))?;
            }
            return Err(not_running(format!(
                "relay is not running (no daemon at {}) — start it with `agent-relay up`",
                paths.socket.display()
            )));
        }
        Err(e) => return Err(e),
    };
    let QueryResult::Status(s) = res else {
        anyhow::bail!("unexpected answer to status")
    };
    let dashboard = crate::cmd::up::dashboard_url(paths);
    // What it started with (`up` options by long name); absent from an older daemon.
    let settings = crate::cmd::up::running_settings(paths, s.pid);
    if as_json {
        let mut v = serde_json::to_value(&s)?;
        v["dashboard"] = serde_json::json!(dashboard);
        v["settings"] = serde_json::json!(settings);
        v["project_root"] = serde_json::json!(paths.project_root);
        return json(&v);
    }
    line(format!(
        "relay running (pid {}, up {}, v{})",
        s.pid,
        human_secs(s.uptime_s),
        field(&s.version)
    ))?;
    line(format!("  socket:   {}", field(&s.socket)))?;
    line(format!(
        "  database: {} ({})",
        field(&s.db),
        field(&s.storage)
    ))?;
    line(format!("  project:  {}", paths.project_root.display()))?;
    line(format!(
        "  agents:   {} connected, {} known",
        s.agents, s.known_agents
    ))?;
    line(format!(
        "  messages: {} stored, {} waiting for delivery",
        s.messages, s.pending
    ))?;
    if let Some(e) = &s.rules_error {
        line(format!(
            "  rules:    {} in force; the rules file is invalid: {}",
            s.rules,
            for_terminal(e)
        ))?;
    } else if s.rules > 0 {
        line(format!(
            "  rules:    {} in force (`agent-relay rules list`)",
            s.rules
        ))?;
    }
    if let Some(d) = &s.delivery {
        let states: Vec<String> = d
            .by_state
            .iter()
            .map(|(k, v)| format!("{v} {}", field(k)))
            .collect();
        line(format!(
            "  deliveries: {}",
            if states.is_empty() {
                "none yet".into()
            } else {
                states.join(", ")
            }
        ))?;
        line(format!(
            "  dead letters: {} waiting (`agent-relay dlq`), {} refused at send time in all",
            d.dead_letters, d.rejected
        ))?;
        for st in d.latency.iter().filter(|st| st.samples > 0) {
            line(format!(
                "  latency {:<25} p50 {} ms, p90 {} ms, p99 {} ms, max {} ms ({} recent)",
                field(&st.stage),
                st.p50_ms,
                st.p90_ms,
                st.p99_ms,
                st.max_ms,
                st.samples
            ))?;
        }
    }
    if let Some(set) = &settings {
        let get = |k: &str| set.get(k).map_or("?", String::as_str);
        line(format!(
            "  limits:   --max-hops {}, --rate-limit {} and --pair-rate-limit {} per {} s, --inbox-ttl {} s (set at start: `agent-relay up --help`)",
            field(get("max-hops")),
            field(get("rate-limit")),
            field(get("pair-rate-limit")),
            field(get("rate-window")),
            field(get("inbox-ttl")),
        ))?;
    }
    match dashboard {
        Some(url) => line(format!("  dashboard: {}", field(&url)))?,
        None => line("  dashboard: off")?,
    }
    if let Some(f) = &s.federation {
        line(format!(
            "  federation: node {} via {}: link {}, backlog {} (waiting to be published), {} published, {} received, {} agents on other nodes",
            field(&f.node),
            field(&f.cluster),
            field(&f.link),
            f.backlog,
            f.published,
            f.received,
            f.remote.len()
        ))?;
        if let Some(e) = &f.error {
            line(format!("  federation error: {}", field(e)))?;
        }
        for c in &f.conflicts {
            line(format!(
                "  name conflict: {} is held by node {}; the agent here is refused in the federation (reconnect it under another name)",
                field(&c.name),
                field(&c.node)
            ))?;
        }
    }
    Ok(())
}

/// `agent-relay agents`.
pub(crate) async fn agents(paths: &Paths, as_json: bool) -> anyhow::Result<()> {
    let QueryResult::Agents { agents } = ask(paths, QueryRequest::Agents).await? else {
        anyhow::bail!("unexpected answer to agents")
    };
    // A federated relay: every agent's node, and remote agents' state as their node says.
    let federation = match ask(paths, QueryRequest::Status).await? {
        QueryResult::Status(s) => s.federation,
        _ => None,
    };
    if let Some(f) = federation {
        return federated_agents(agents, &f, as_json);
    }
    if as_json {
        return json(&agents);
    }
    if agents.is_empty() {
        return Ok(line("no agents have connected yet")?);
    }
    line(format!(
        "{:<20} {:<8} {:<8} {:<10} {:>7}  {:<19}  {:<10} {:<12} WHY",
        "NAME", "STATE", "SINCE", "CLI", "WAITING", "LAST ACTIVE (UTC)", "THREAD", "TOPICS"
    ))?;
    for a in agents {
        // The time of day the state began; an offline agent's is when it was last seen.
        let since = a.since.unwrap_or(a.last_seen);
        let since = format_utc(since).get(11..).unwrap_or("-").to_owned();
        let thread = a
            .thread
            .as_deref()
            .map_or_else(|| "-".into(), |t| relay_protocol::short_id(t).to_owned());
        line(format!(
            "{:<20} {:<8} {:<8} {:<10} {:>7}  {:<19}  {:<10} {:<12} {}",
            field(&a.name),
            a.state.as_str(),
            since,
            a.cli
                .as_deref()
                .map_or_else(|| "-".into(), |c| one_line(c, 40)),
            a.pending,
            format_utc(a.last_activity.unwrap_or(a.last_seen).max(a.last_seen)),
            field(&thread),
            field(&a.topics.join(",")),
            a.why
                .as_deref()
                .map_or_else(|| "-".into(), |w| one_line(w, 60)),
        ))?;
    }
    Ok(())
}

/// `agents` on a relay started with `--cluster`: a NODE column (and `node` in JSON); an
/// agent of another node shows as its node last said (here it has a stand-in, always
/// connected), and a local agent whose name another node holds is marked.
fn federated_agents(
    agents: Vec<relay_protocol::query::AgentInfo>,
    f: &relay_protocol::query::FederationStatus,
    as_json: bool,
) -> anyhow::Result<()> {
    let remote: std::collections::HashMap<&str, &relay_protocol::query::RemoteAgent> =
        f.remote.iter().map(|r| (r.name.as_str(), r)).collect();
    let conflict: std::collections::HashMap<&str, &str> = f
        .conflicts
        .iter()
        .map(|c| (c.name.as_str(), c.node.as_str()))
        .collect();
    let rows: Vec<(relay_protocol::query::AgentInfo, String, Option<&str>)> = agents
        .into_iter()
        .filter(|a| {
            // A stand-in whose agent left the directory is not an agent of the federation.
            relay_federation::core::standin_node(a.cli.as_deref()).is_none()
                || remote.contains_key(a.name.as_str())
        })
        .map(|mut a| {
            let c = conflict.get(a.name.as_str()).copied();
            let node = match remote.get(a.name.as_str()) {
                Some(r) => {
                    a.online = r.online;
                    r.node.clone()
                }
                None => f.node.clone(),
            };
            (a, node, c)
        })
        .collect();
    if as_json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(a, node, c)| {
                let mut v = serde_json::to_value(a).unwrap_or_default();
                v["node"] = serde_json::json!(node);
                if let Some(owner) = c {
                    v["conflict_with_node"] = serde_json::json!(owner);
                }
                v
            })
            .collect();
        return json(&v);
    }
    line(format!(
        "{:<20} {:<12} {:<8} {:<14} {:>7}  {:<19}  TOPICS",
        "NAME", "NODE", "STATE", "CLI", "WAITING", "LAST SEEN (UTC)"
    ))?;
    for (a, node, c) in rows {
        let state = match c {
            Some(_) => "conflict",
            None if a.online => "online",
            None => "offline",
        };
        line(format!(
            "{:<20} {:<12} {:<8} {:<14} {:>7}  {:<19}  {}{}",
            field(&a.name),
            field(&node),
            state,
            a.cli
                .as_deref()
                .map_or_else(|| "-".into(), |c| one_line(c, 40)),
            a.pending,
            format_utc(a.last_seen),
            field(&a.topics.join(",")),
            c.map(|o| format!(
                "  (name held by node {}: refused in the federation)",
                field(o)
            ))
            .unwrap_or_default()
        ))?;
    }
    Ok(())
}

/// ` (node hostA)` for a message that came from another node of a federation.
fn at_node(origin: Option<&str>) -> String {
    origin
        .map(|n| format!(" (node {})", field(n)))
        .unwrap_or_default()
}

fn print_message(m: &MessageRecord) -> anyhow::Result<()> {
    line(format!("Message {}", field(&m.id)))?;
    line(format!(
        "From:    {}{}",
        field(&m.from),
        at_node(m.origin.as_deref())
    ))?;
    line(format!("To:      {}", field(&m.to)))?;
    if let Some(t) = &m.topic {
        line(format!("Topic:   {}", field(t)))?;
    }
    line(format!("Kind:    {}", m.kind.as_str()))?;
    line(format!("Time:    {} UTC", format_utc(m.ts)))?;
    if let Some(t) = &m.thread {
        line(format!("Thread:  {}", field(t)))?;
    }
    if let Some(r) = &m.in_reply_to {
        line(format!("Reply to: {}", field(r)))?;
    }
    for d in &m.deliveries {
        let when = d
            .updated_at
            .map(|t| format!(" at {} UTC", format_utc(t)))
            .unwrap_or_default();
        line(format!(
            "Delivery: {} seq {} {}{}",
            field(&d.recipient),
            d.seq,
            d.status.as_str(),
            when
        ))?;
    }
    if let Some(data) = &m.data {
        // Display would write the JSON's DEL and C1 characters raw.
        line(format!(
            "Data:    {}",
            relay_protocol::text::json_line(data)?
        ))?;
    }
    line("")?;
    line(for_terminal(&m.body))?;
    Ok(())
}

/// `agent-relay read`.
pub(crate) async fn read(paths: &Paths, args: &ReadArgs) -> anyhow::Result<()> {
    let QueryResult::Read { message } = ask_id(paths, &args.id, |id| QueryRequest::Read {
        id,
        from: args.from.clone(),
    })
    .await?
    else {
        anyhow::bail!("unexpected answer to read")
    };
    if args.json {
        return json(&message);
    }
    print_message(&message)
}

/// `agent-relay history`.
pub(crate) async fn history(paths: &Paths, args: &HistoryArgs) -> anyhow::Result<()> {
    // Both were read by clap (`time::parse_since`): a duration ago or Unix milliseconds.
    let (since_ms, until_ms) = (args.since, args.until);
    if let (Some(since), Some(until)) = (since_ms, until_ms)
        && since >= until
    {
        return Err(crate::exit::usage(
            "--since is not before --until (the range includes its start, not its end): \
             nothing can match; swap them or widen the range",
        ));
    }
    let filter = HistoryFilter {
        from: args.from.clone(),
        to: args.to.clone(),
        topic: args.topic.clone(),
        text: args.text.clone(),
        since_ms,
        until_ms,
        before_pos: None,
        limit: Some(args.limit),
    };
    if args.all {
        return history_all(paths, filter, args.json).await;
    }
    let QueryResult::History { messages } = ask(paths, QueryRequest::History(filter)).await? else {
        anyhow::bail!("unexpected answer to history")
    };
    if args.json {
        return json(&messages);
    }
    if messages.is_empty() {
        return Ok(line("no messages match")?);
    }
    print_history(&messages)
}

/// `history --all`: every match, newest first, a page of 1,000 at a time on one connection,
/// each page written before the next is asked for (memory stays one page, output starts at
/// once). With `json`, the one JSON array `history --json` prints, written a page at a time.
async fn history_all(
    paths: &Paths,
    mut filter: HistoryFilter,
    as_json: bool,
) -> anyhow::Result<()> {
    let client = tool_client(&paths.socket, "cli").await?;
    filter.limit = Some(1000);
    let mut any = false;
    let mut array = as_json.then(JsonArray::new);
    let result = loop {
        let page = match client.query(QueryRequest::History(filter.clone())).await {
            Ok(QueryResult::History { messages }) => messages,
            Ok(_) => break Err(anyhow::anyhow!("unexpected answer to history")),
            Err(e) => break Err(e.into()),
        };
        let Some(last) = page.last() else {
            break Ok(());
        };
        filter.before_pos = Some(last.pos);
        any = true;
        let written = match &mut array {
            Some(array) => page.iter().try_for_each(|m| array.push(m)),
            None => print_history(&page),
        };
        if let Err(e) = written {
            break Err(e);
        }
    };
    client.close().await;
    result?;
    match array {
        Some(array) => array.finish()?,
        None if !any => line("no messages match")?,
        None => {}
    }
    Ok(())
}

fn print_history(messages: &[MessageRecord]) -> anyhow::Result<()> {
    for m in messages {
        let short = field(relay_protocol::short_id(&m.id));
        let to = match &m.topic {
            Some(t) => format!("{} #{}", field(&m.to), field(t)),
            None => field(&m.to),
        };
        line(format!(
            "{}  {} → {}  [{short}]  {}",
            format_utc(m.ts),
            field(&m.from),
            to,
            one_line(&m.body, 100)
        ))?;
    }
    Ok(())
}

fn print_event(e: &TraceEvent, start: u64) -> anyhow::Result<()> {
    let who = field(e.recipient.as_deref().unwrap_or(""));
    line(format!(
        "  {} UTC  +{:>6} ms  {:<13} {:<16} {}",
        format_utc(e.ts),
        e.ts.saturating_sub(start),
        e.state.as_str(),
        who,
        e.detail.as_deref().map(field).unwrap_or_default()
    ))?;
    Ok(())
}

/// `agent-relay trace`.
pub(crate) async fn trace(paths: &Paths, args: &ReadArgs) -> anyhow::Result<()> {
    let QueryResult::Trace { trace } = ask_id(paths, &args.id, |id| QueryRequest::Trace {
        id,
        from: args.from.clone(),
    })
    .await?
    else {
        anyhow::bail!("unexpected answer to trace")
    };
    if args.json {
        return json(&trace);
    }
    let to = match &trace.topic {
        Some(t) => format!("{} #{}", field(&trace.to), field(t)),
        None => field(&trace.to),
    };
    line(format!(
        "Message {} from {}{} to {}",
        field(&trace.id),
        field(&trace.from),
        at_node(trace.origin.as_deref()),
        to
    ))?;
    let start = trace.events.first().map_or(0, |e| e.ts);
    for e in &trace.events {
        print_event(e, start)?;
    }
    Ok(())
}

fn print_dead_letter_line(d: &DeadLetter) -> anyhow::Result<()> {
    let short = field(relay_protocol::short_id(&d.msg_id));
    let retried = if d.retried_at.is_some() {
        " (retried)"
    } else {
        ""
    };
    line(format!(
        "{:>5}  {}  {} → {}  [{short}]  {}{}: {}",
        d.dlq_id,
        format_utc(d.ts),
        field(&d.from),
        field(&d.recipient),
        field(&d.code),
        retried,
        one_line(&d.body, 60)
    ))?;
    Ok(())
}

fn print_dead_letter(d: &DeadLetter) -> anyhow::Result<()> {
    line(format!("Dead letter {}", d.dlq_id))?;
    line(format!("Message: {}", field(&d.msg_id)))?;
    line(format!("From:    {}", field(&d.from)))?;
    line(format!("To:      {}", field(&d.recipient)))?;
    if let Some(t) = &d.topic {
        line(format!("Topic:   {}", field(t)))?;
    }
    line(format!("Time:    {} UTC", format_utc(d.ts)))?;
    line(format!(
        "Reason:  {}: {}",
        field(&d.code),
        for_terminal(&d.reason)
    ))?;
    if let Some(at) = d.retried_at {
        line(format!("Retried: {} UTC", format_utc(at)))?;
    }
    line("")?;
    line(for_terminal(&d.body))?;
    Ok(())
}

/// `agent-relay dlq`.
pub(crate) async fn dlq(paths: &Paths, args: DlqArgs) -> anyhow::Result<()> {
    let action = args.action.unwrap_or(DlqAction::List {
        all: false,
        limit: 50,
    });
    let req = match action {
        DlqAction::List { all, limit } => QueryRequest::DlqList {
            all,
            limit: Some(limit),
        },
        DlqAction::Show { id } => QueryRequest::DlqShow { dlq_id: id },
        DlqAction::Retry { id } => QueryRequest::DlqRetry { dlq_id: id },
        DlqAction::Purge => QueryRequest::DlqPurge,
    };
    let res = ask(paths, req).await?;
    if args.json {
        return json(&res);
    }
    match res {
        QueryResult::DlqList { dead_letters } => {
            if dead_letters.is_empty() {
                return Ok(line("the dead-letter queue is empty")?);
            }
            for d in &dead_letters {
                print_dead_letter_line(d)?;
            }
            Ok(())
        }
        QueryResult::DlqShow { dead_letter } => print_dead_letter(&dead_letter),
        QueryResult::DlqRetry {
            dead_letter,
            outcome,
        } => Ok(line(format!(
            "dead letter {}: {}",
            dead_letter.dlq_id,
            for_terminal(&outcome)
        ))?),
        QueryResult::DlqPurge { removed } => Ok(line(format!("removed {removed} dead letters"))?),
        _ => anyhow::bail!("unexpected answer to dlq"),
    }
}

/// `agent-relay chain extend THREAD HOPS`.
pub(crate) async fn chain(paths: &Paths, args: crate::args::ChainArgs) -> anyhow::Result<()> {
    let crate::args::ChainAction::Extend { thread, hops } = args.action;
    // Checked here too: a bad value from the command line is bad usage (exit 2).
    relay_protocol::text::validate_message_id(&thread).map_err(|e| {
        crate::exit::usage(format!(
            "thread {:?}: {e}",
            relay_protocol::text::one_line(&thread, 64)
        ))
    })?;
    if !(1..=1000).contains(&hops) {
        return Err(crate::exit::usage(format!(
            "extend by 1 to 1000 replies, not {hops}"
        )));
    }
    let QueryResult::ChainExtend {
        thread,
        extra,
        max_hops,
    } = ask(paths, QueryRequest::ChainExtend { thread, hops }).await?
    else {
        anyhow::bail!("unexpected answer to chain extend")
    };
    if args.json {
        return json(&serde_json::json!({
            "thread": relay_protocol::text::one_line(&thread, usize::MAX),
            "extra": extra,
            "max_hops": max_hops,
        }));
    }
    line(format!(
        "the reply chain of thread {} may now run {max_hops} replies ({extra} more than the relay's --max-hops); `agent-relay dlq retry ID` sends a refused reply again",
        relay_protocol::text::one_line(&thread, 128)
    ))?;
    Ok(())
}
