//! Command-line arguments. The `///` comments here are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const AFTER_HELP: &str = "\
Quick start:
  agent-relay up                      start the relay for this project (in the background)
  agent-relay -n Alice claude         run an agent under the relay (starts the relay if needed)
  agent-relay -n Bob --delivery digest codex --model o3
                                      agent-relay's options before the agent command, the
                                      agent's own after it
  agent-relay attach Alice            back to Alice's tmux session (detach: Ctrl-b d)
  agent-relay send Bob 'hello'        send a message as a person
  agent-relay history                 what was said
  agent-relay status                  is it running? how much is stored?
  agent-relay trace ID                what became of a message
  agent-relay dlq                     messages that were not delivered, and why
  agent-relay stop Alice              stop one wrapped agent (its messages stay stored)
  agent-relay down --all              stop every wrapped agent, then the relay
  agent-relay config                  the relay's settings and where each comes from

Paths: one relay per project (nearest directory with .git, Cargo.toml, package.json, go.mod,
pyproject.toml or .agent-relay). Override with AGENT_RELAY_DATA_DIR, AGENT_RELAY_SOCKET,
AGENT_RELAY_STORAGE_PATH; AGENT_RELAY_STORAGE_TYPE=memory keeps nothing on disk.

--json: every command that prints data prints one JSON document: a list (history, history
--all, inbox, agents) is one array, one thing (read, trace, status, dlq's answer) one object.
Only a live stream (watch, inbox --follow) prints one object per line (JSON Lines).

Deadlines: a command waits at most 30 s for the relay's answer, then says so and exits 1
(AGENT_RELAY_REQUEST_TIMEOUT=SECONDS changes it); a live stream has none.

Exit codes: 0 ok, 1 failure, 2 bad usage (or an invalid .agent-relay/config.toml), 3 relay not
running, 4 not found (no such message, dead letter, agent or rule), 5 message refused by the
relay (or a spawn or release refused by a rule or limit). A wrapped agent: its own exit code, or 128 + the signal that stopped the wrapper (130
for SIGINT).";

const CONFIG_ABOUT: &str = "\
Show the effective settings of `agent-relay up` and the wrapper profile overrides of this
project, each with where it came from. A value is taken from the first of: the option on
`up`'s command line, its environment variable (AGENT_RELAY_STORAGE_TYPE,
AGENT_RELAY_DURABILITY, AGENT_RELAY_DASHBOARD_PORT), the project configuration file, its
default. A wrapper that starts the relay uses the same values (it has no options of its own
for them). Where the running relay started with another value (the file changed since), it
is said (`running` in --json): it takes effect at the relay's next start.

The configuration file is .agent-relay/config.toml at the project root (the folder
`agent-relay status` names), or the file AGENT_RELAY_CONFIG names. Every table and key is
optional; an unknown one, or a value of the wrong kind, is an error (exit 2) naming the file,
line and column, and what is allowed. For example:

  [up]                      # keys: up's options, spelled as the options (kebab-case)
  inbox-ttl = \"10m\"         # durations: a number in the option's unit, or \"90s\", \"10m\"
  max-hops = 5
  rate-override = [\"ci-bot=1000\"]
  no-dashboard = true

  [profiles.claude]         # claude, codex, gemini, shell or generic
  quiet_ms = 800            # any field of a profile file, spelled as there (snake_case)
  dialogs = [\"Do you want to\", \"Allow?\"]

Profiles are layered: built-in, then [profiles.NAME] here, then a person's own
$AGENT_RELAY_PROFILE_DIR/NAME.toml (default ~/.config/agent-relay/profiles/), which wins.
Settings apply when the relay starts: after changing the file, `agent-relay down` and `up`.
`up` refuses to join a running relay whose settings differ from those given by an option,
variable or this file, and says how to restart it.";

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
    /// With an agent command and tmux: start it and return without attaching, once it is
    /// connected and past its start (see `wrap --help`).
    #[arg(long)]
    pub(crate) detached: bool,
    /// With an agent command: do not teach the agent the relay at start (see `wrap --help`).
    #[arg(long)]
    pub(crate) no_teach: bool,
    /// With an agent command: type a one-line introduction once it is ready (see `wrap
    /// --help`).
    #[arg(long)]
    pub(crate) intro: bool,
    /// With an agent command: how messages are typed in, each, digest or notice (see `wrap
    /// --help`).
    #[arg(long, value_enum, value_name = "HOW")]
    pub(crate) delivery: Option<Delivery>,
    /// With an agent command: subscribe it to topics matching PATTERN (repeatable; see `wrap
    /// --help`).
    #[arg(long, value_name = "PATTERN", value_parser = topic_pattern)]
    pub(crate) subscribe: Vec<String>,
    /// The relay's socket (default: derived from the project; see below).
    #[arg(long, global = true, env = "AGENT_RELAY_SOCKET", value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// Start the relay daemon for this project (returns once it accepts connections). Each
    /// setting below comes from its option, else its environment variable, else
    /// .agent-relay/config.toml, else its default (`agent-relay config` shows which).
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
    /// Print the web dashboard's URL with its access token (exit 3 when it is not running).
    /// The token is the project's, kept (0600) in the data directory: the same at every
    /// start; `--rotate-token` replaces it, and the running dashboard refuses the old one.
    Dashboard(DashboardArgs),
    /// List connected and known-offline agents; `agents forget NAME` removes one that is
    /// not connected from the list.
    #[command(visible_alias = "who")]
    Agents(AgentsArgs),
    /// Send a message as a person or script; prints its id and the relay's receipt.
    Send(SendArgs),
    /// Show the messages waiting for the person ("human", or --as NAME), oldest first, and
    /// mark them read (a second `inbox` does not show them again); --follow keeps showing new
    /// ones. Messages to a person always wait here, adapters or not.
    Inbox(InboxArgs),
    /// Answer a message as the person: sent to its sender, in its thread (the agent sees
    /// "(thread T)"), counted in the conversation's hop budget.
    Reply(ReplyArgs),
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
    /// Reply chains: `chain extend THREAD N` lets a conversation stopped by the hop budget
    /// (`budget_exceeded`) run N more replies, without restarting the relay (kept across
    /// restarts).
    Chain(ChainArgs),
    /// Claim paths for a while, so that other agents who claim or edit them are told (and you
    /// are told who): `claim src/auth.rs src/db/ --for 1h`; `--release` gives them back,
    /// `--list` shows every claim. Paths are relative to the project's root; a directory
    /// covers what it holds.
    Claim(ClaimArgs),
    /// List the people adapters (webhook, Telegram) of the running relay with their state:
    /// connected, failing and the last error, and what each sent, received and refused.
    Adapters(JsonArg),
    /// Follow the relay live, one line per event: agents connecting, messages sent, delivered,
    /// acknowledged, refused, expired. Runs until interrupted.
    Watch(WatchArgs),
    /// Wait until agents are idle (`--until idle`) or have exited (`--until exit`), for
    /// scripts and lead agents. Exit status: 0 every agent named did what --until asks;
    /// 10 (--until idle) an agent went offline (exited) instead; 11 the --timeout passed;
    /// 3 the relay is not running; 4 an agent named is not known.
    #[command(after_help = WAIT_HELP)]
    Wait(WaitArgs),
    /// Start a worker agent detached in tmux with a task: the relay records you as its parent
    /// (a restart keeps it), hands it the task as its first message from you (its answer
    /// threads back), and prints its name. Refused past the caps (`up --max-spawned`,
    /// `--max-spawn-depth`) or by a `deny-spawn` rule, naming the limit (exit 5).
    Spawn(SpawnArgs),
    /// Stop a spawned worker once it is idle (or at once with --now); its stored messages stay.
    /// Only its parent may, or a person, or whom an `allow-release` rule names. A clean
    /// worktree of its is removed; a dirty one is kept and named.
    Release(ReleaseArgs),
    /// Measure throughput and latency: S senders, R receivers, N messages of B bytes.
    Bench(BenchArgs),
    /// Find relay directives in raw terminal output, each once, exactly as the wrapper would.
    Parse(crate::cmd::parse::ParseArgs),
    /// Claude Code hooks as a door: `hooks install claude` adds a Stop hook that hands waiting
    /// relay messages to the model at the end of its turn (to .claude/settings.local.json;
    /// `--shared` for the project's .claude/settings.json); `hooks uninstall claude` removes it.
    Hooks(crate::cmd::hooks::HooksArgs),
    /// Serve the relay to an agent as MCP tools over stdio (relay_send, relay_inbox,
    /// relay_read, relay_agents, relay_search): `claude mcp add relay -- agent-relay mcp --name Alice`.
    Mcp(crate::cmd::mcp::McpArgs),
    /// Print a shell completion script: `source <(agent-relay completions bash)` in ~/.bashrc,
    /// `agent-relay completions zsh > ~/.zfunc/_agent-relay`, or
    /// `agent-relay completions fish > ~/.config/fish/completions/agent-relay.fish`.
    Completions(CompletionsArgs),
    /// Show the effective settings of `up` and the wrapper profile overrides of this project,
    /// each with where it came from: env VAR, file .agent-relay/config.toml:LINE, or default.
    #[command(long_about = CONFIG_ABOUT)]
    Config(JsonArg),
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
    /// Inside tmux, this tmux client switches to the agent's session instead: back to your
    /// own with Ctrl-b L (Ctrl-b d there would detach your whole tmux client).
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
    /// The `up` settings given on the command line, by name, with their values as written.
    pub(crate) up: crate::settings::Flags,
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
        if let Some(("up", up)) = matches.subcommand() {
            given.up = crate::settings::flags_of(up);
        }
        given
    }
}

/// `agent-relay dashboard`.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Make a new access token; the old URL is refused from then on.
    #[arg(long)]
    pub(crate) rotate_token: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
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
    /// The level for the store's.
    pub(crate) fn of(d: relay_store::Durability) -> Self {
        match d {
            relay_store::Durability::Normal => Self::Normal,
            _ => Self::Full,
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

/// `agent-relay up`. Its settings options (storage, limits, dashboard, ...) are not fields
/// here: they are built from the one table of settings (`settings.rs`, added by [`command`]),
/// read from the matches (`Given::up`) and resolved with the environment and the project
/// configuration file.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Stay in the foreground and log to stderr (for service managers and tests).
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The command line's definition: the derived [`Cli`] with `up`'s settings options from the
/// settings table. Everything that needs the definition (parsing, completions, the manual)
/// takes it from here.
pub(crate) fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command().mut_subcommand("up", crate::settings::add_args)
}

/// `NAME=N` of `--rate-override` (and of `rate-override` in the configuration file).
pub(crate) fn parse_override(s: &str) -> Result<(String, u32), String> {
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

/// `agent-relay claim`.
#[derive(Debug, Args)]
pub(crate) struct ClaimArgs {
    /// Files or directories (a directory covers every path under it); relative to this
    /// directory, or absolute, inside the project. With --release and none: every claim of
    /// the name.
    pub(crate) paths: Vec<String>,
    /// How long the claim lasts (`90s`, `30m`, `2h`; at most 24h). Claiming a path again
    /// renews it.
    #[arg(long = "for", value_name = "DURATION", default_value = "30m")]
    pub(crate) for_: String,
    /// Release the paths (all of the name's claims when none is given).
    #[arg(long, conflicts_with = "list")]
    pub(crate) release: bool,
    /// List every claim the relay holds.
    #[arg(long)]
    pub(crate) list: bool,
    /// Claim as this name: a person's or a script's, not another connected agent's. In a
    /// wrapped agent's shell ($AGENT_RELAY_NAME and its wrapper's key set) the claim is that
    /// agent's own, made through its wrapper.
    #[arg(
        long = "as",
        value_name = "NAME",
        env = "AGENT_RELAY_NAME",
        default_value = "human"
    )]
    pub(crate) as_: String,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay chain`.
#[derive(Debug, Args)]
pub(crate) struct ChainArgs {
    /// What to do.
    #[command(subcommand)]
    pub(crate) action: ChainAction,
    /// Print JSON for scripts.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// `agent-relay chain` actions.
#[derive(Debug, Subcommand)]
pub(crate) enum ChainAction {
    /// Let the reply chain of THREAD run HOPS more replies than `up --max-hops` allows
    /// (added to any earlier extension). The thread is the one the refusal names;
    /// `agent-relay dlq retry ID` then sends the refused reply again.
    Extend {
        /// The chain's thread id.
        thread: String,
        /// Replies more (1 to 1000).
        hops: u32,
    },
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
        /// Recipient name or pattern (for deny-spawn and allow-release: the worker's; default
        /// '*').
        #[arg(long)]
        to: Option<String>,
        /// allow or deny (messages); deny-spawn (FROM may not spawn workers); allow-release
        /// (FROM may release the workers TO though it did not spawn them).
        #[arg(long, value_parser = ["allow", "deny", "deny-spawn", "allow-release"])]
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

/// A `--subscribe` value: a topic pattern the relay accepts.
fn topic_pattern(s: &str) -> Result<String, String> {
    relay_protocol::validate_topic_pattern(s)
        .map(|()| s.to_owned())
        .map_err(|e| e.to_string())
}

/// `agent-relay wait`'s longer help.
const WAIT_HELP: &str = "\
An agent is idle when it is connected, nothing is being handed to it, and its terminal (as its
wrapper reports it) is quiet: a message typed into a wrapped agent makes it busy until its
output settles after it. `agent-relay agents` shows the same states.

Exit status:
  0   every agent named is idle (--until idle) or offline (--until exit)
  10  --until idle: an agent named went offline (its wrapper exited) instead of idle
  11  the --timeout passed first
  3   the relay is not running
  4   an agent named is not known to the relay";

/// `agent-relay wait`.
#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    /// The agents to wait for (all of them).
    #[arg(required = true, value_name = "NAME")]
    pub(crate) names: Vec<String>,
    /// What to wait for.
    #[arg(long, value_enum, default_value = "idle")]
    pub(crate) until: WaitUntil,
    /// Give up after this long (seconds, or 90s, 10m, 1h); default: wait as long as it takes.
    #[arg(long, value_parser = crate::time::parse_secs, value_name = "DURATION")]
    pub(crate) timeout: Option<u64>,
    /// Print JSON for scripts: each agent's final state.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay spawn`.
#[derive(Debug, Args)]
pub(crate) struct SpawnArgs {
    /// The worker's name (default: `<parent>-w1`, `-w2`...).
    #[arg(short = 'n', long)]
    pub(crate) name: Option<String>,
    /// Its task: the first message it gets, from you (stored; never in any command line).
    #[arg(long, conflicts_with = "task_file")]
    pub(crate) task: Option<String>,
    /// Its task, read from FILE ('-': stdin).
    #[arg(long, value_name = "FILE")]
    pub(crate) task_file: Option<PathBuf>,
    /// Give it its own git worktree and branch `relay/NAME` under .agent-relay/worktrees/NAME
    /// (it starts there); `release` removes it when clean and keeps it when not.
    #[arg(long)]
    pub(crate) worktree: bool,
    /// Be told (a message from the relay) each time it becomes idle after a turn.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub(crate) notify: Option<NotifyWhen>,
    /// Who spawns it (its parent). Default: the agent this runs inside (a wrapped agent's
    /// shell: asked through its wrapper, as it), else the person, "human".
    #[arg(long)]
    pub(crate) from: Option<String>,
    /// How messages are typed in (as `wrap --delivery`).
    #[arg(long, value_enum, default_value = "each", value_name = "HOW")]
    pub(crate) delivery: Delivery,
    /// How to read its screen (as `wrap --profile`).
    #[arg(long, value_name = "NAME")]
    pub(crate) profile: Option<String>,
    /// Subscribe it to topics matching PATTERN (as `wrap --subscribe`).
    #[arg(long, value_name = "PATTERN", value_parser = topic_pattern)]
    pub(crate) subscribe: Vec<String>,
    /// Print JSON for scripts (one document: name, parent, depth, task_id, worktree, session).
    #[arg(long)]
    pub(crate) json: bool,
    /// The agent command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) command: Vec<String>,
}

/// When `spawn --notify` tells the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum NotifyWhen {
    /// Each time the worker becomes idle after a turn.
    Idle,
}

/// `agent-relay release`.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// The worker's name.
    pub(crate) name: String,
    /// Stop it at once, busy or not.
    #[arg(long)]
    pub(crate) now: bool,
    /// Who releases it: its parent's name. Default: the agent this runs inside (asked
    /// through its wrapper), else the person, "human" (who may release any).
    #[arg(long)]
    pub(crate) from: Option<String>,
    /// Give up waiting for it to be idle after this long (seconds, or 90s, 10m).
    #[arg(long, value_parser = crate::time::parse_secs, value_name = "DURATION")]
    pub(crate) timeout: Option<u64>,
    /// Print JSON for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What `wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WaitUntil {
    /// Connected, nothing being handed to it, its terminal quiet.
    Idle,
    /// Not connected any more (its wrapper exited).
    Exit,
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
    /// A name that has not connected yet is accepted: the message waits for that agent (for the
    /// relay's --inbox-ttl); one a letter or two from a known name is refused ("did you mean").
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
    /// The full id of the message this answers (`agent-relay reply ID` finds it for you).
    #[arg(long, value_name = "ID")]
    pub(crate) in_reply_to: Option<String>,
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

/// `agent-relay inbox`.
#[derive(Debug, Args)]
pub(crate) struct InboxArgs {
    /// The person whose mailbox to show: "human" or a declared [people.NAME].
    #[arg(long = "as", value_name = "NAME", default_value = relay_protocol::HUMAN)]
    pub(crate) person: String,
    /// Keep running and show each new message as it arrives (until interrupted).
    #[arg(long, short = 'f')]
    pub(crate) follow: bool,
    /// After the unread messages, also show the latest ones read before.
    #[arg(long)]
    pub(crate) all: bool,
    /// Print JSON: one array of messages, each with `"unread": true|false` (as `history
    /// --json`); with --follow, a stream: one JSON object per line (JSON Lines).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `agent-relay reply`.
#[derive(Debug, Args)]
pub(crate) struct ReplyArgs {
    /// The message answered: its id, its short id as shown in brackets, or a unique prefix of
    /// at least 8 characters.
    pub(crate) id: String,
    /// The answer; '-' or nothing reads it from stdin.
    pub(crate) body: Option<String>,
    /// Answer as this name (default: "human").
    #[arg(long, default_value = relay_protocol::HUMAN)]
    pub(crate) from: String,
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
    /// Only the message of this sender: ids are unique per sender, so an id and its sender
    /// always name one message (needed when two senders used the same id).
    #[arg(long, value_name = "NAME")]
    pub(crate) from: Option<String>,
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
    /// --json, the same JSON array as without --all, written as each page arrives.
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

/// How a wrapper hands its agent the messages for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Delivery {
    /// Each message typed as its own prompt.
    Each,
    /// Messages that waited while the agent was busy typed as one prompt ("3 relay
    /// messages:" then each as usual) when it is next ready; urgent ones first and alone.
    Digest,
    /// Only a one-line notice ("2 relay messages from Bob [ID] [ID] — call relay_inbox to
    /// read them"): for an agent with the relay's MCP server (`agent-relay mcp`), whose
    /// relay_inbox/relay_read hand the messages over exactly.
    Notice,
}

impl Delivery {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Each => "each",
            Self::Digest => "digest",
            Self::Notice => "notice",
        }
    }

    pub(crate) fn wrap(self) -> relay_wrap::format::Delivery {
        match self {
            Self::Each => relay_wrap::format::Delivery::Each,
            Self::Digest => relay_wrap::format::Delivery::Digest,
            Self::Notice => relay_wrap::format::Delivery::Notice,
        }
    }
}

/// `agent-relay wrap`.
#[derive(Debug, Args)]
#[command(after_help = "\
Backends: with tmux the agent runs in its own tmux session named <project>-<NAME>; you are
attached to it (detach with Ctrl-b d; the agent keeps running and relaying; inside tmux your
client switches to it instead, and Ctrl-b L switches back), and
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
    /// tmux: start (or pick up) the session and return without attaching, once the agent is
    /// connected to the relay and past its start (it printed and went quiet; at most 30 s). An
    /// agent that exits first is reported with its exit status and last lines, and the
    /// command exits non-zero.
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
    /// How messages are typed in: `each` as its own prompt; `digest`: those that waited while
    /// the agent was busy as one prompt (each still acknowledged on its own; urgent ones first
    /// and alone; over --max-body it splits); `notice`: only a one-line notice telling the
    /// agent to call relay_inbox (for an agent with `agent-relay mcp`; a message is verified
    /// when the tool shows it).
    #[arg(long, value_enum, default_value = "each", value_name = "HOW")]
    pub(crate) delivery: Delivery,
    /// Once the agent is ready, type in a short note telling it how to use the relay (its
    /// name, the @relay: syntax, how messages arrive). tmux: only when the session is new.
    #[arg(long)]
    pub(crate) intro: bool,
    /// Do not teach the agent the relay at start. By default Claude Code gets its name, the
    /// @relay: syntax and the other agents with --append-system-prompt, and Codex CLI with
    /// -c developer_instructions=... (Gemini CLI has no such flag: use --intro); the text is
    /// .agent-relay/teach.md in the project when it exists, else the built-in one.
    #[arg(long)]
    pub(crate) no_teach: bool,
    /// Subscribe the agent to topics matching PATTERN (repeatable; `build.*` one level,
    /// `build.>` any depth): it gets every message sent to a matching topic (`send --topic`,
    /// an agent's `@relay:#build.linux text`, the MCP `relay_send` with `topic`), once. Kept
    /// in the relay's store, so the subscription outlives a restart of either side.
    #[arg(long, value_name = "PATTERN", value_parser = topic_pattern)]
    pub(crate) subscribe: Vec<String>,
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
    /// Measure across nodes of a federation: start two private relays joined through these
    /// NATS servers (nats://HOST:PORT, JetStream on), senders on one and receivers on the
    /// other, so every message is stored, published, consumed and stored again before it is
    /// delivered (docs/FEDERATION.md).
    #[arg(long, value_name = "URLS")]
    pub(crate) cluster: Option<String>,
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
        super::command().debug_assert();
    }
}
