//! Command-line arguments. The `///` comments here are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const AFTER_HELP: &str = "\
Quick start:
  agent-relay up                      start the relay for this project (in the background)
  agent-relay -n Alice claude         run an agent under the relay (starts the relay if needed)
  agent-relay attach Alice            back to Alice's tmux session (detach: Ctrl-b d)
  agent-relay send Bob 'hello'        send a message as a person
  agent-relay history                 what was said
  agent-relay status                  is it running? how much is stored?
  agent-relay trace ID                what became of a message
  agent-relay dlq                     messages that were not delivered, and why
  agent-relay stop Alice              stop one wrapped agent (its messages stay stored)
  agent-relay down --all              stop every wrapped agent, then the relay

Paths: one relay per project (nearest directory with .git, Cargo.toml, package.json, go.mod,
pyproject.toml or .agent-relay). Override with AGENT_RELAY_DATA_DIR, AGENT_RELAY_SOCKET,
AGENT_RELAY_STORAGE_PATH; AGENT_RELAY_STORAGE_TYPE=memory keeps nothing on disk.

Exit codes: 0 ok, 1 failure, 2 bad usage, 3 relay not running, 4 not found (no such message,
dead letter, agent or rule), 5 message refused by the relay. A wrapped agent: its own exit
code, or 128 + the signal that stopped the wrapper (130 for SIGINT).";

/// Lets AI coding agents in separate terminals message each other through a local relay.
#[derive(Debug, Parser)]
#[command(name = "agent-relay", version, about, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    /// With an agent command (`agent-relay -n Alice claude`): the agent's relay name.
    #[arg(short = 'n', long = "name", value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// With an agent command: where it runs, tmux or pty (see `wrap --help`).
    #[arg(long, value_enum, env = "AGENT_RELAY_BACKEND")]
    pub(crate) backend: Option<Backend>,
    /// With an agent command and tmux: start it and return without attaching.
    #[arg(long)]
    pub(crate) detached: bool,
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
    /// Stop the relay daemon gracefully (nothing stored is lost); with --all, every wrapped
    /// agent of the project first. Wrapped agents otherwise keep running and reconnect to
    /// the next relay started here.
    Down(DownArgs),
    /// Stop one wrapped agent: its wrapper, the agent and its tmux session. Messages for it
    /// stay stored and reach it when it runs again. The relay keeps running.
    Stop(StopArgs),
    /// Show whether the relay runs, where, and what it holds. Exit 3 when it is not running.
    Status(JsonArg),
    /// List connected and known-offline agents; `agents forget NAME` removes one that is
    /// not connected from the list.
    #[command(visible_alias = "who")]
    Agents(AgentsArgs),
    /// Send a message as a person or script; prints its id and the relay's receipt.
    Send(SendArgs),
    /// Print one message in full, by id, short id (as shown in brackets) or a unique prefix of at least 8 characters.
    Read(ReadArgs),
    /// List stored messages, newest first.
    History(HistoryArgs),
    /// Show the delivery story of one message: accepted, queued, delivered, injected,
    /// verified, failed, expired, rejected, dead-lettered, retried — with times and reasons.
    Trace(ReadArgs),
    /// The dead-letter queue: messages that were not delivered, with the reason.
    Dlq(DlqArgs),
    /// Access rules: which agent may send to which (applied without a restart).
    Rules(RulesArgs),
    /// Follow the relay live, one line per event: agents connecting, messages sent, delivered,
    /// acknowledged, refused, expired. Runs until interrupted.
    Watch(WatchArgs),
    /// Measure throughput and latency: S senders, R receivers, N messages of B bytes.
    Bench(BenchArgs),
    /// Find relay directives in raw terminal output, each once, exactly as the wrapper would.
    Parse(crate::cmd::parse::ParseArgs),
    /// Print a shell completion script: `source <(agent-relay completions bash)` in ~/.bashrc,
    /// `agent-relay completions zsh > ~/.zfunc/_agent-relay`, or
    /// `agent-relay completions fish > ~/.config/fish/completions/agent-relay.fish`.
    Completions(CompletionsArgs),
    /// Check what the relay depends on (tmux, the agent CLIs and their versions, directory
    /// permissions, the relay itself) and say what to do about each problem. Exit 1 if
    /// something is broken.
    Doctor(JsonArg),
    /// Print the manual page (roff): `agent-relay man > ~/.local/share/man/man1/agent-relay.1`.
    Man,
    /// Run an agent CLI under the relay: what it prints as `@relay:NAME ...` is sent, what it
    /// receives is typed in when it is idle. Shorthand: `agent-relay -n NAME <cli> [args]`.
    Wrap(WrapArgs),
    /// Attach this terminal to a wrapped agent's tmux session (detach again with Ctrl-b d).
    Attach(AttachArgs),
    /// The scripted agents of `bench --wrap`.
    #[command(hide = true)]
    BenchAgent(BenchAgentArgs),
    /// `agent-relay [-n NAME] <cli> [args]`: the same as `wrap`.
    #[command(external_subcommand)]
    Agent(Vec<String>),
}

/// What the user gave on the command line, as opposed to defaults and environment variables.
#[derive(Debug, Default)]
pub(crate) struct Given {
    /// The long names (without `--`) of the `up` options given on the command line.
    pub(crate) up: Vec<String>,
    /// The command line held `--` (an agent command's own arguments follow it).
    pub(crate) dashdash: bool,
}

impl Given {
    /// Reads the sources of the values in `matches` (clap's `value_source`).
    pub(crate) fn from_matches(matches: &clap::ArgMatches) -> Self {
        let mut given = Self {
            dashdash: std::env::args_os().any(|a| a == "--"),
            ..Self::default()
        };
        let Some(("up", up)) = matches.subcommand() else {
            return given;
        };
        let cmd = <Cli as clap::CommandFactory>::command();
        let Some(up_cmd) = cmd.find_subcommand("up") else {
            return given;
        };
        for arg in up_cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if up.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
                && let Some(long) = arg.get_long()
            {
                given.up.push(long.to_owned());
            }
        }
        given
    }
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

/// Durability levels of the SQLite store (see `relay_store::Durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum DurabilityKind {
    /// fsync every commit before its ACK (default).
    #[default]
    Full,
    /// No fsync per commit: an ACK survives a crash of the relay, not of the machine.
    Normal,
}

impl DurabilityKind {
    /// `AGENT_RELAY_DURABILITY` if it names a level, else the default (for callers that build
    /// `UpArgs` without clap).
    pub(crate) fn from_env() -> anyhow::Result<Self> {
        match std::env::var("AGENT_RELAY_DURABILITY") {
            Ok(v) => Self::from_str(&v, true).map_err(|_| {
                anyhow::anyhow!("AGENT_RELAY_DURABILITY={v:?}: expected `full` or `normal`")
            }),
            Err(_) => Ok(Self::default()),
        }
    }

    pub(crate) fn store(self) -> relay_store::Durability {
        match self {
            Self::Full => relay_store::Durability::Full,
            Self::Normal => relay_store::Durability::Normal,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        self.store().as_str()
    }
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
    /// What an ACK promises: `full` fsyncs every commit before acknowledging it (survives a
    /// power cut); `normal` skips the fsync (faster; survives the relay being killed, but the
    /// last acknowledged messages may be lost if the machine loses power).
    #[arg(
        long,
        env = "AGENT_RELAY_DURABILITY",
        value_enum,
        default_value = "full"
    )]
    pub(crate) durability: DurabilityKind,
    /// How long a message waits for an offline agent before it expires: seconds, or a
    /// duration (90s, 10m, 1h, 7d).
    #[arg(long, default_value = "3600", value_name = "SECS", value_parser = crate::time::parse_secs)]
    pub(crate) inbox_ttl: u64,
    /// PING interval: milliseconds, or a duration (5s); a connection silent for three
    /// intervals is closed.
    #[arg(long, default_value = "5000", value_name = "MS", value_parser = crate::time::parse_ms)]
    pub(crate) heartbeat_ms: u64,
    /// Messages waiting for one recipient before senders are told BUSY.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub(crate) busy_high_water: u64,
    /// Connections open at once (agents, CLI commands, watchers); past it a new one is
    /// refused with an ERROR that says to try again later.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub(crate) max_connections: usize,
    /// Loop budgets and rate limits.
    #[command(flatten)]
    pub(crate) safety: SafetyArgs,
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

/// `up`'s loop budgets and rate limits.
#[derive(Debug, Clone, Args)]
pub(crate) struct SafetyArgs {
    /// Most replies in a chain (each answer to an answer is one hop); one more is refused and
    /// dead-lettered, and the sender is told.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub(crate) max_hops: u32,
    /// Messages one sender may send per --rate-window (0: no limit).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub(crate) rate_limit: u32,
    /// Messages one agent may send to one other agent per --rate-window (0: no limit).
    #[arg(long, default_value_t = 30, value_name = "N")]
    pub(crate) pair_rate_limit: u32,
    /// The sliding window of the rate limits: seconds, or a duration (1m).
    #[arg(long, default_value = "60", value_name = "SECS", value_parser = crate::time::parse_secs)]
    pub(crate) rate_window: u64,
    /// Failure reports in a row from one agent that pause deliveries to it (its messages wait;
    /// 0: never pause).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub(crate) breaker_failures: u32,
    /// How long a paused agent waits before one message is tried again: milliseconds, or a
    /// duration (30s); doubling while that fails.
    #[arg(long, default_value = "30000", value_name = "MS", value_parser = crate::time::parse_ms)]
    pub(crate) breaker_cooldown_ms: u64,
    /// A different --rate-limit for one sender, as NAME=N (repeatable).
    #[arg(long = "rate-override", value_name = "NAME=N", value_parser = parse_override)]
    pub(crate) rate_overrides: Vec<(String, u32)>,
}

impl Default for SafetyArgs {
    fn default() -> Self {
        Self {
            max_hops: 10,
            rate_limit: 100,
            pair_rate_limit: 30,
            rate_window: 60,
            breaker_failures: 3,
            breaker_cooldown_ms: 30_000,
            rate_overrides: Vec::new(),
        }
    }
}

impl SafetyArgs {
    /// The same settings as `up` arguments, for starting a daemon in the background.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--max-hops".to_owned(),
            self.max_hops.to_string(),
            "--rate-limit".to_owned(),
            self.rate_limit.to_string(),
            "--pair-rate-limit".to_owned(),
            self.pair_rate_limit.to_string(),
            "--rate-window".to_owned(),
            self.rate_window.to_string(),
            "--breaker-failures".to_owned(),
            self.breaker_failures.to_string(),
            "--breaker-cooldown-ms".to_owned(),
            self.breaker_cooldown_ms.to_string(),
        ];
        for (name, n) in &self.rate_overrides {
            v.push("--rate-override".to_owned());
            v.push(format!("{name}={n}"));
        }
        v
    }
}

fn parse_override(s: &str) -> Result<(String, u32), String> {
    let (name, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=N, e.g. ci-bot=1000"))?;
    relay_protocol::validate_agent_name(name).map_err(|e| format!("{name:?}: {e}"))?;
    let n = n
        .parse()
        .map_err(|_| format!("{s:?}: N must be a whole number (0: no limit)"))?;
    Ok((name.to_owned(), n))
}

/// `agent-relay dlq`.
#[derive(Debug, Args)]
pub(crate) struct DlqArgs {
    /// What to do (default: list).
    #[command(subcommand)]
    pub(crate) action: Option<DlqAction>,
    /// Print JSON for scripts.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// `agent-relay rules`.
#[derive(Debug, Args)]
pub(crate) struct RulesArgs {
    /// What to do (default: list).
    #[command(subcommand)]
    pub(crate) action: Option<RulesAction>,
    /// Print JSON for scripts.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// `agent-relay rules` actions.
#[derive(Debug, Subcommand)]
pub(crate) enum RulesAction {
    /// List the rules, numbered.
    List,
    /// Add a rule. Names may use '*' for any run of characters.
    Add {
        /// Sender name or pattern.
        #[arg(long)]
        from: String,
        /// Recipient name or pattern.
        #[arg(long)]
        to: String,
        /// allow or deny.
        #[arg(long, value_parser = ["allow", "deny"])]
        action: String,
        /// The matching rule with the highest priority decides.
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        priority: i64,
    },
    /// Remove a rule by its number in `rules list`.
    Remove {
        /// Its number.
        number: usize,
    },
}

/// `agent-relay dlq` actions.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqAction {
    /// List dead letters, newest first.
    List {
        /// Include those already retried.
        #[arg(long)]
        all: bool,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// Show one dead letter in full.
    Show {
        /// Its number (from `dlq list`).
        id: i64,
    },
    /// Deliver a dead letter again (a refused message is sent again as its sender).
    Retry {
        /// Its number (from `dlq list`).
        id: i64,
    },
    /// Remove every dead letter.
    Purge,
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
    /// First stop every wrapped agent of this project (as `stop NAME` does for one: wrapper,
    /// agent, tmux session), then the relay. Messages waiting for them stay stored.
    #[arg(long)]
    pub(crate) all: bool,
}

/// `agent-relay stop`.
#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    /// The agent's name.
    pub(crate) name: String,
    /// Seconds to wait for it to stop before giving up.
    #[arg(long, default_value_t = 10)]
    pub(crate) timeout: u64,
}

/// `agent-relay agents`.
#[derive(Debug, Args)]
pub(crate) struct AgentsArgs {
    /// What to do (default: list).
    #[command(subcommand)]
    pub(crate) action: Option<AgentsAction>,
    /// Print JSON for scripts.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// `agent-relay agents` actions.
#[derive(Debug, Subcommand)]
pub(crate) enum AgentsAction {
    /// List the agents (the default).
    List,
    /// Remove an agent that is not connected from the list (an agent that will not come
    /// back). Messages stored for it stay. Refused for a connected agent.
    Forget {
        /// Its name.
        name: String,
    },
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
    #[arg(long, default_value = "message", value_parser = ["message", "action", "state", "thinking"])]
    pub(crate) kind: String,
    /// Thread id to attach.
    #[arg(long)]
    pub(crate) thread: Option<String>,
    /// Message id to use (default: a new ULID). Re-using an id makes the send a no-op duplicate.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Urgent: the recipient's wrapper types it before the other messages waiting for it.
    #[arg(long)]
    pub(crate) urgent: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay read`.
#[derive(Debug, Args)]
pub(crate) struct ReadArgs {
    /// Message id, its short id as shown in `[5DZ82MJ3]` (the id's last 8 characters), or a
    /// unique prefix of at least 8 characters.
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
    #[arg(long, value_name = "WHEN", value_parser = crate::time::parse_since)]
    pub(crate) since: Option<u64>,
    /// Only messages stored before: a duration ago (90s, 10m, 2h, 7d) or Unix milliseconds.
    /// With --since, a time range that includes its start and not its end.
    #[arg(long, value_name = "WHEN", value_parser = crate::time::parse_since)]
    pub(crate) until: Option<u64>,
    /// At most this many (1 to 1000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) limit: u32,
    /// Everything that matches, however much (newest first, fetched a page at a time): with
    /// --json, one JSON object per line (JSON Lines), written as each page arrives.
    #[arg(long, conflicts_with = "limit")]
    pub(crate) all: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where a wrapped agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// Its own tmux session: detach and reattach (`agent-relay attach NAME`) at will.
    Tmux,
    /// A pseudo-terminal owned by this process, in this terminal.
    Pty,
}

impl Backend {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Tmux => "tmux",
            Self::Pty => "pty",
        }
    }
}

/// `agent-relay wrap`.
#[derive(Debug, Args)]
#[command(after_help = "\
Backends: with tmux the agent runs in its own tmux session named <project>-<NAME>; you are
attached to it (detach with Ctrl-b d; the agent keeps running and relaying), and
`agent-relay attach NAME` brings you back. Run the same command again after a crash and the
wrapper picks the session up without re-sending anything. With pty the agent runs inside this
terminal and ends with it. Default: tmux when this is a terminal and tmux is installed, else pty.

Profiles (when to type a message in, how to read the screen) are TOML files; override any
field in $AGENT_RELAY_PROFILE_DIR/<profile>.toml (default ~/.config/agent-relay/profiles/).")]
pub(crate) struct WrapArgs {
    /// The agent's relay name (default: a generated one, printed).
    #[arg(short = 'n', long)]
    pub(crate) name: Option<String>,
    /// Where the agent runs: tmux or pty.
    #[arg(long, value_enum, env = "AGENT_RELAY_BACKEND")]
    pub(crate) backend: Option<Backend>,
    /// tmux: start (or pick up) the session and return at once, without attaching.
    #[arg(long)]
    pub(crate) detached: bool,
    /// How to read the agent's screen: claude, codex, gemini, shell or generic (default: from
    /// the command's name; a shell running a script or `-c` is generic). With `shell`, and for
    /// any shell reading commands, messages are typed as `: '...'`, which runs nothing.
    #[arg(long, value_name = "NAME")]
    pub(crate) profile: Option<String>,
    /// Do not pass this terminal's keystrokes to the agent (pty; it gets relayed messages only).
    #[arg(long)]
    pub(crate) no_input: bool,
    /// Longest message body typed in full; longer ones are cut, with a hint to read the rest
    /// with `agent-relay read <id>`.
    #[arg(long, value_name = "CHARS", default_value_t = 2000)]
    pub(crate) max_body: usize,
    /// Also append every message for the agent to team/<NAME>/inbox.md in the data directory
    /// (or under $AGENT_RELAY_INBOX_DIR), so it can be told to read it if typing ever fails.
    #[arg(long)]
    pub(crate) inbox: bool,
    /// Once the agent is ready, type in a short note telling it how to use the relay (its
    /// name, the @relay: syntax, how messages arrive). tmux: only when the session is new.
    #[arg(long)]
    pub(crate) intro: bool,
    /// Internal: relay for an existing tmux session (started by `wrap --backend tmux`).
    #[arg(long, hide = true, value_name = "SESSION")]
    pub(crate) serve_tmux: Option<String>,
    /// The agent command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) command: Vec<String>,
}

/// `agent-relay attach`.
#[derive(Debug, Args)]
pub(crate) struct AttachArgs {
    /// The agent's name.
    pub(crate) name: String,
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
    /// Durability of the private daemon's SQLite store (ignored with --socket): `full`
    /// fsyncs every commit before its ACK, as `up` does by default; `normal` does not.
    #[arg(
        long,
        env = "AGENT_RELAY_DURABILITY",
        value_enum,
        default_value = "full"
    )]
    pub(crate) durability: DurabilityKind,
    /// Use the relay on this socket instead of starting a private one (its rate limits apply:
    /// start it with `--rate-limit 0 --pair-rate-limit 0` to measure it).
    #[arg(long, value_name = "PATH")]
    pub(crate) target: Option<PathBuf>,
    /// How receivers acknowledge. `wrapper` (default) does what a real wrapper does: one
    /// `verified` ACK per message, which the relay records in its store. `lean` sends one
    /// cumulative ACK per read (the least work a client can ask for); `plain` one ACK per
    /// message without a state (for relays that speak only plain protocol v1).
    #[arg(long, value_enum, default_value = "wrapper")]
    pub(crate) acks: AckMode,
    /// Give up waiting for deliveries after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout: u64,
    /// Instead: measure a wrapped agent's directive reaching another wrapped agent's terminal
    /// (printed → first byte typed), with both agents under this backend; -n messages, one
    /// every --interval-ms.
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub(crate) wrap: Option<Backend>,
    /// With --wrap: pause between two directives (keep it above 50 ms, the recipient's
    /// Enter-and-check cycle, to measure an idle recipient).
    #[arg(long, default_value_t = 200)]
    pub(crate) interval_ms: u64,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// How `bench` receivers acknowledge DELIVERs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum AckMode {
    /// One `verified` ACK per message, as a wrapper sends after typing it (a store write each).
    Wrapper,
    /// One cumulative ACK per read.
    Lean,
    /// One plain ACK per message (protocol v1).
    Plain,
}

impl AckMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Wrapper => "wrapper",
            Self::Lean => "lean",
            Self::Plain => "plain",
        }
    }
}

/// `agent-relay completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

/// `agent-relay bench-agent` (hidden): the two scripted agents of `bench --wrap`.
#[derive(Debug, Args)]
pub(crate) struct BenchAgentArgs {
    /// Print directives to this agent (send), or else record what is typed in (receive).
    #[arg(long)]
    pub(crate) to: Option<String>,
    /// Directives to print.
    #[arg(short = 'n', default_value_t = 100)]
    pub(crate) count: usize,
    /// Pause between directives.
    #[arg(long, default_value_t = 50)]
    pub(crate) interval_ms: u64,
    /// Receive: append one latency (µs) per message here.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        super::Cli::command().debug_assert();
    }
}
