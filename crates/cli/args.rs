//! Command-line arguments. The `///` comments here are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const AFTER_HELP: &str = "\
Quick start:
  agent-relay up                      start the relay for this project (in the background)
  agent-relay -n Alice claude         run an agent under the relay (starts the relay if needed)
  agent-relay send Bob 'hello'        send a message as a person
  agent-relay history                 what was said
  agent-relay status                  is it running? how much is stored?

Paths: one relay per project (nearest directory with .git, Cargo.toml, package.json, go.mod,
pyproject.toml or .agent-relay). Override with AGENT_RELAY_DATA_DIR, AGENT_RELAY_SOCKET,
AGENT_RELAY_STORAGE_PATH; AGENT_RELAY_STORAGE_TYPE=memory keeps nothing on disk.

Exit codes: 0 ok, 1 failure, 2 bad usage, 3 relay not running, 4 no such message,
5 message refused by the relay.";

/// Lets AI coding agents in separate terminals message each other through a local relay.
#[derive(Debug, Parser)]
#[command(name = "agent-relay", version, about, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    /// With an agent command (`agent-relay -n Alice claude`): the agent's relay name.
    #[arg(short = 'n', long = "name", value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// The relay's socket (default: derived from the project; see below).
    #[arg(long, global = true, env = "AGENT_RELAY_SOCKET", value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// Start the relay daemon for this project (returns once it accepts connections).
    Up(UpArgs),
    /// Stop the relay daemon gracefully (nothing stored is lost).
    Down(DownArgs),
    /// Show whether the relay runs, where, and what it holds. Exit 3 when it is not running.
    Status(JsonArg),
    /// List connected and known-offline agents.
    #[command(visible_alias = "who")]
    Agents(JsonArg),
    /// Send a message as a person or script; prints its id and the relay's receipt.
    Send(SendArgs),
    /// Print one message in full, by id or a unique prefix of at least 8 characters.
    Read(ReadArgs),
    /// List stored messages, newest first.
    History(HistoryArgs),
    /// Follow the relay live, one line per event: agents connecting, messages sent, delivered,
    /// acknowledged, refused, expired. Runs until interrupted.
    Watch(WatchArgs),
    /// Measure throughput and latency: S senders, R receivers, N messages of B bytes.
    Bench(BenchArgs),
    /// Find relay directives in raw terminal output, each once, exactly as the wrapper would.
    Parse(crate::cmd::parse::ParseArgs),
    /// Run an agent CLI under the relay: what it prints as `@relay:NAME ...` is sent, what it
    /// receives is typed in when it is idle. Shorthand: `agent-relay -n NAME <cli> [args]`.
    Wrap(WrapArgs),
    /// `agent-relay [-n NAME] <cli> [args]`: the same as `wrap`.
    #[command(external_subcommand)]
    Agent(Vec<String>),
}

/// `--json` alone.
#[derive(Debug, Args)]
pub(crate) struct JsonArg {
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Storage engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StorageKind {
    /// SQLite in WAL mode (default): survives crashes and restarts.
    Sqlite,
    /// In memory: gone when the daemon stops.
    Memory,
}

impl StorageKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Memory => "memory",
        }
    }
}

/// `agent-relay up`.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Stay in the foreground and log to stderr (for service managers and tests).
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Storage engine.
    #[arg(
        long,
        env = "AGENT_RELAY_STORAGE_TYPE",
        value_enum,
        default_value = "sqlite"
    )]
    pub(crate) storage: StorageKind,
    /// How long a message waits for an offline agent before it expires, in seconds.
    #[arg(long, default_value_t = 3600, value_name = "SECS")]
    pub(crate) inbox_ttl: u64,
    /// PING interval in milliseconds (a connection silent for three intervals is closed).
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub(crate) heartbeat_ms: u64,
    /// Messages waiting for one recipient before senders are told BUSY.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub(crate) busy_high_water: u64,
    /// Port of the web dashboard on 127.0.0.1 [default: 3888]. When it is taken (another
    /// project's relay, say) a free port is used and printed; 0 always picks a free port.
    #[arg(long, env = "AGENT_RELAY_DASHBOARD_PORT", value_name = "PORT")]
    pub(crate) dashboard_port: Option<u16>,
    /// Do not serve the web dashboard.
    #[arg(long)]
    pub(crate) no_dashboard: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// Only messages from this sender (and its connects and disconnects).
    #[arg(long)]
    pub(crate) from: Option<String>,
    /// Only messages to this recipient, broadcasts included (and its connects and disconnects).
    #[arg(long)]
    pub(crate) to: Option<String>,
    /// Only messages on topics matching this pattern (build.*, build.>).
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// One JSON object per line (the events as the relay sends them), for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay down`.
#[derive(Debug, Args)]
pub(crate) struct DownArgs {
    /// Seconds to wait for a graceful stop before giving up.
    #[arg(long, default_value_t = 10)]
    pub(crate) timeout: u64,
}

/// `agent-relay send`.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// Recipient agent name, or '*' for every agent (with --topic: the topic's subscribers).
    pub(crate) to: String,
    /// The message text; '-' or nothing reads it from stdin.
    pub(crate) body: Option<String>,
    /// Send as this name (default: "human").
    #[arg(long, default_value = "human")]
    pub(crate) from: String,
    /// Topic (e.g. build.linux); with '*' it reaches the topic's subscribers.
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// message, action, state or thinking.
    #[arg(long, default_value = "message")]
    pub(crate) kind: String,
    /// Thread id to attach.
    #[arg(long)]
    pub(crate) thread: Option<String>,
    /// Message id to use (default: a new ULID). Re-using an id makes the send a no-op duplicate.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay read`.
#[derive(Debug, Args)]
pub(crate) struct ReadArgs {
    /// Message id or a unique prefix (at least 8 characters), as shown in `[01JB2K7Q]`.
    pub(crate) id: String,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay history`.
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// Only messages from this sender.
    #[arg(long)]
    pub(crate) from: Option<String>,
    /// Only messages to this recipient (broadcasts it received included).
    #[arg(long)]
    pub(crate) to: Option<String>,
    /// Only messages on this topic.
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Only messages whose text contains this.
    #[arg(long)]
    pub(crate) text: Option<String>,
    /// Only messages since: a duration ago (90s, 10m, 2h, 7d) or Unix milliseconds.
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// At most this many (1 to 1000).
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: u32,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay wrap`.
#[derive(Debug, Args)]
pub(crate) struct WrapArgs {
    /// The agent's relay name (default: a generated one, printed).
    #[arg(short = 'n', long)]
    pub(crate) name: Option<String>,
    /// How to read the agent's screen: claude, codex, gemini, shell or generic (default: from
    /// the command's name).
    #[arg(long, value_name = "NAME")]
    pub(crate) profile: Option<String>,
    /// Do not pass this terminal's keystrokes to the agent (it gets relayed messages only).
    #[arg(long)]
    pub(crate) no_input: bool,
    /// Longest message body typed in full; longer ones are cut, with a hint to read the rest
    /// with `agent-relay read <id>`.
    #[arg(long, value_name = "CHARS", default_value_t = 2000)]
    pub(crate) max_body: usize,
    /// The agent command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) command: Vec<String>,
}

/// `agent-relay bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Sending connections.
    #[arg(short = 's', long, default_value_t = 64)]
    pub(crate) senders: usize,
    /// Receiving agents.
    #[arg(short = 'r', long, default_value_t = 64)]
    pub(crate) receivers: usize,
    /// Messages in all.
    #[arg(short = 'n', long, default_value_t = 1_000_000)]
    pub(crate) messages: usize,
    /// Body size in bytes.
    #[arg(short = 'b', long, default_value_t = 200)]
    pub(crate) bytes: usize,
    /// Target rate in messages/s over all senders (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub(crate) rate: u64,
    /// Unacknowledged SENDs each sender keeps in flight.
    #[arg(long, default_value_t = 256)]
    pub(crate) window: usize,
    /// Storage for the private daemon the bench starts (ignored with --socket).
    #[arg(long, value_enum, default_value = "sqlite")]
    pub(crate) storage: StorageKind,
    /// Use the relay on this socket instead of starting a private one.
    #[arg(long, value_name = "PATH")]
    pub(crate) target: Option<PathBuf>,
    /// Acknowledge each DELIVER with its own ACK instead of one cumulative ACK per read (for
    /// relays that speak only plain protocol v1).
    #[arg(long)]
    pub(crate) per_message_acks: bool,
    /// Give up waiting for deliveries after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout: u64,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        super::Cli::command().debug_assert();
    }
}
