//! The settings of `agent-relay up`, defined once (issue 13): each one's name (its `up` option
//! and its key in the `[up]` table of the project configuration file), its environment
//! variable, its help, how its value is written, and its default ([`UpSettings::default`],
//! from `relay_daemon::defaults`, which the daemon's `Config::new` uses too).
//!
//! `up`'s options are built from this table ([`add_args`]: no clap defaults, the help shows
//! the default and the variable), and `up`, a wrapper starting the relay and
//! `agent-relay config` all resolve values here ([`resolve`]): flag > environment > the
//! project configuration file (`config_file.rs`) > default.

use std::collections::BTreeMap;

use clap::ValueEnum;

use crate::args::{DurabilityKind, StorageKind};
use crate::config_file::ConfigFile;

/// How a setting's value is written.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A length of time in seconds: a number (3600), or a duration (`10m`, `1h`).
    Secs,
    /// A length of time in milliseconds: a number (5000), or a duration (`500ms`, `5s`).
    Ms,
    /// A whole number from 0 to this bound.
    Count(u64),
    /// On or off: an option without a value; `true` or `false` in the file.
    Switch,
    /// `NAME=N` pairs: the option repeated; an array of strings in the file.
    Pairs,
    /// Free text (a URL, a name, a path), checked by this function; empty means unset.
    Text(fn(&str) -> Result<(), String>),
}

/// A setting's value, as read by its [`Kind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Word(String),
    Num(u64),
    Bool(bool),
    Pairs(Vec<(String, u32)>),
}

impl Value {
    /// The value as `up` takes it (and `settings.json` records it); pairs sorted.
    pub(crate) fn text(&self) -> String {
        match self {
            Self::Word(w) => w.clone(),
            Self::Num(n) => n.to_string(),
            Self::Bool(b) => b.to_string(),
            Self::Pairs(p) => {
                let mut v: Vec<String> = p.iter().map(|(n, c)| format!("{n}={c}")).collect();
                v.sort();
                v.join(" ")
            }
        }
    }

    fn num(&self) -> u64 {
        match self {
            Self::Num(n) => *n,
            _ => 0,
        }
    }

    fn word(&self) -> &str {
        match self {
            Self::Word(w) => w,
            _ => "",
        }
    }
}

/// One setting of `up`.
pub(crate) struct Setting {
    /// The option's long name and the file's key (kebab-case, as the option).
    pub(crate) name: &'static str,
    /// The environment variable that sets it, if any.
    pub(crate) env: Option<&'static str>,
    value_name: &'static str,
    help: &'static str,
    pub(crate) kind: Kind,
    get: fn(&UpSettings) -> Value,
    set: fn(&mut UpSettings, Value),
}

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Every setting of `up`, in `--help` order.
pub(crate) static SETTINGS: [Setting; 23] = [
    Setting {
        name: "storage",
        env: Some("AGENT_RELAY_STORAGE_TYPE"),
        value_name: "KIND",
        help: "Storage engine: sqlite (WAL; survives crashes and restarts) or memory (gone when \
               the relay stops).",
        kind: Kind::Choice(&["sqlite", "memory"]),
        get: |s| Value::Word(s.storage.as_str().to_owned()),
        set: |s, v| s.storage = StorageKind::from_str(v.word(), false).unwrap_or(s.storage),
    },
    Setting {
        name: "durability",
        env: Some("AGENT_RELAY_DURABILITY"),
        value_name: "LEVEL",
        help: "What an ACK promises: `full` fsyncs every commit before acknowledging it \
               (survives a power cut); `normal` skips the fsync (faster; survives the relay \
               being killed, but the last acknowledged messages may be lost if the machine \
               loses power).",
        kind: Kind::Choice(&["full", "normal"]),
        get: |s| Value::Word(s.durability.as_str().to_owned()),
        set: |s, v| {
            s.durability = DurabilityKind::from_str(v.word(), false).unwrap_or(s.durability);
        },
    },
    Setting {
        name: "inbox-ttl",
        env: None,
        value_name: "SECS",
        help: "How long a message waits for an offline agent before it expires: seconds, or a \
               duration (90s, 10m, 1h, 7d).",
        kind: Kind::Secs,
        get: |s| Value::Num(s.inbox_ttl),
        set: |s, v| s.inbox_ttl = v.num(),
    },
    Setting {
        name: "heartbeat-ms",
        env: None,
        value_name: "MS",
        help: "PING interval: milliseconds, or a duration (60s); a connection silent for three \
               intervals is closed (a peer that dies is seen at once, by its socket closing).",
        kind: Kind::Ms,
        get: |s| Value::Num(s.heartbeat_ms),
        set: |s, v| s.heartbeat_ms = v.num(),
    },
    Setting {
        name: "busy-high-water",
        env: None,
        value_name: "N",
        help: "Messages waiting for one recipient before senders are told BUSY.",
        kind: Kind::Count(u64::MAX),
        get: |s| Value::Num(s.busy_high_water),
        set: |s, v| s.busy_high_water = v.num(),
    },
    Setting {
        name: "max-connections",
        env: None,
        value_name: "N",
        help: "Connections open at once (agents, CLI commands, watchers); past it a new one is \
               refused with an ERROR that says to try again later.",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(s.max_connections as u64),
        set: |s, v| s.max_connections = usize::try_from(v.num()).unwrap_or(usize::MAX),
    },
    Setting {
        name: "max-hops",
        env: None,
        value_name: "N",
        help: "Most replies in a chain (each answer to an answer is one hop); one more is \
               refused and dead-lettered, and the sender is told.",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(u64::from(s.max_hops)),
        set: |s, v| s.max_hops = u32_of(&v),
    },
    Setting {
        name: "max-spawned",
        env: None,
        value_name: "N",
        help: "Most spawned workers live at once (agent-relay spawn, relay_spawn); one more is \
               refused with a notice that names this limit.",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(u64::from(s.max_spawned)),
        set: |s, v| s.max_spawned = u32_of(&v),
    },
    Setting {
        name: "max-spawn-depth",
        env: None,
        value_name: "N",
        help: "Deepest spawn: 1 lets only agents that were not spawned spawn workers, 2 lets a \
               worker spawn its own; deeper is refused naming this limit.",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(u64::from(s.max_spawn_depth)),
        set: |s, v| s.max_spawn_depth = u32_of(&v),
    },
    Setting {
        name: "rate-limit",
        env: None,
        value_name: "N",
        help: "Messages one sender may send per --rate-window (0: no limit).",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(u64::from(s.rate_limit)),
        set: |s, v| s.rate_limit = u32_of(&v),
    },
    Setting {
        name: "pair-rate-limit",
        env: None,
        value_name: "N",
        help: "Messages one agent may send to one other agent per --rate-window (0: no limit).",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(u64::from(s.pair_rate_limit)),
        set: |s, v| s.pair_rate_limit = u32_of(&v),
    },
    Setting {
        name: "rate-window",
        env: None,
        value_name: "SECS",
        help: "The sliding window of the rate limits: seconds, or a duration (1m).",
        kind: Kind::Secs,
        get: |s| Value::Num(s.rate_window),
        set: |s, v| s.rate_window = v.num(),
    },
    Setting {
        name: "breaker-failures",
        env: None,
        value_name: "N",
        help: "Failure reports in a row from one agent that pause deliveries to it (its \
               messages wait; 0: never pause).",
        kind: Kind::Count(u32::MAX as u64),
        get: |s| Value::Num(u64::from(s.breaker_failures)),
        set: |s, v| s.breaker_failures = u32_of(&v),
    },
    Setting {
        name: "breaker-cooldown-ms",
        env: None,
        value_name: "MS",
        help: "How long a paused agent waits before one message is tried again: milliseconds, \
               or a duration (30s); doubling while that fails.",
        kind: Kind::Ms,
        get: |s| Value::Num(s.breaker_cooldown_ms),
        set: |s, v| s.breaker_cooldown_ms = v.num(),
    },
    Setting {
        name: "rate-override",
        env: None,
        value_name: "NAME=N",
        help: "A different --rate-limit for one sender, as NAME=N (repeatable; in the file an \
               array: [\"ci-bot=1000\"]).",
        kind: Kind::Pairs,
        get: |s| Value::Pairs(s.rate_overrides.clone()),
        set: |s, v| {
            if let Value::Pairs(p) = v {
                s.rate_overrides = p;
            }
        },
    },
    Setting {
        name: "dashboard-port",
        env: Some("AGENT_RELAY_DASHBOARD_PORT"),
        value_name: "PORT",
        help: "Port of the web dashboard on 127.0.0.1. When it is taken (another project's \
               relay, say) a free port is used and printed; 0 always picks a free port.",
        kind: Kind::Count(u16::MAX as u64),
        get: |s| Value::Num(u64::from(s.dashboard_port)),
        set: |s, v| s.dashboard_port = u16::try_from(v.num()).unwrap_or(s.dashboard_port),
    },
    Setting {
        name: "no-dashboard",
        env: None,
        value_name: "",
        help: "Do not serve the web dashboard.",
        kind: Kind::Switch,
        get: |s| Value::Bool(s.no_dashboard),
        set: |s, v| s.no_dashboard = v == Value::Bool(true),
    },
    Setting {
        name: "cluster",
        env: Some("AGENT_RELAY_CLUSTER"),
        value_name: "URLS",
        help: "Join a federation of relays through these NATS servers (JetStream on): \
               nats://HOST:PORT, comma-separated (docs/FEDERATION.md). Unset: this relay is \
               alone and nothing extra runs.",
        kind: Kind::Text(check_cluster),
        get: |s| Value::Word(s.cluster.clone()),
        set: |s, v| s.cluster = v.word().to_owned(),
    },
    Setting {
        name: "node",
        env: Some("AGENT_RELAY_NODE"),
        value_name: "NAME",
        help: "This relay's name in the federation (letters, digits, - and _); unset: the \
               host name.",
        kind: Kind::Text(check_node),
        get: |s| Value::Word(s.node.clone()),
        set: |s, v| s.node = v.word().to_owned(),
    },
    Setting {
        name: "cluster-creds",
        env: Some("AGENT_RELAY_CLUSTER_CREDS"),
        value_name: "FILE",
        help: "A NATS credentials file (.creds: user JWT and NKey seed) for --cluster.",
        kind: Kind::Text(|_| Ok(())),
        get: |s| Value::Word(s.cluster_creds.clone()),
        set: |s, v| s.cluster_creds = v.word().to_owned(),
    },
    Setting {
        name: "cluster-ca",
        env: Some("AGENT_RELAY_CLUSTER_CA"),
        value_name: "FILE",
        help: "A CA certificate (PEM) the NATS servers' TLS certificates are checked against; \
               TLS is then required.",
        kind: Kind::Text(|_| Ok(())),
        get: |s| Value::Word(s.cluster_ca.clone()),
        set: |s, v| s.cluster_ca = v.word().to_owned(),
    },
    Setting {
        name: "cluster-retention",
        env: None,
        value_name: "SECS",
        help: "How long NATS keeps a message for a node that is down: seconds, or a duration \
               (7d). A node away longer misses what was sent to it meanwhile.",
        kind: Kind::Secs,
        get: |s| Value::Num(s.cluster_retention),
        set: |s, v| s.cluster_retention = v.num(),
    },
    Setting {
        name: "cluster-replicas",
        env: None,
        value_name: "N",
        help: "Copies NATS keeps of the federation's stream and directory (0: as many as the \
               cluster has servers, at most 3).",
        kind: Kind::Count(5),
        get: |s| Value::Num(s.cluster_replicas),
        set: |s, v| s.cluster_replicas = v.num(),
    },
];

fn check_cluster(text: &str) -> Result<(), String> {
    for url in text.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let rest = ["nats://", "tls://", "ws://", "wss://"]
            .iter()
            .find_map(|p| url.strip_prefix(p))
            .unwrap_or(url);
        if rest.is_empty() || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{url:?} is not a NATS server URL (nats://HOST:PORT)"
            ));
        }
    }
    Ok(())
}

fn check_node(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Ok(());
    }
    relay_federation::core::validate_node(text).map_err(|e| e.to_string())
}

fn u32_of(v: &Value) -> u32 {
    u32::try_from(v.num()).unwrap_or(u32::MAX)
}

/// The setting called `name`, if there is one.
pub(crate) fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The settings' names, for messages that say what is allowed.
pub(crate) fn names() -> String {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Setting {
    /// What a value of this setting looks like, for error messages.
    pub(crate) fn expected(&self) -> String {
        match self.kind {
            Kind::Choice(words) => format!(
                "one of {}",
                words
                    .iter()
                    .map(|w| format!("{w:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Kind::Secs => {
                "seconds as a number (3600) or a duration as a string (\"90s\", \"10m\", \"1h\", \"7d\")"
                    .into()
            }
            Kind::Ms => {
                "milliseconds as a number (5000) or a duration as a string (\"500ms\", \"5s\", \"1m\")"
                    .into()
            }
            Kind::Count(max) => format!("a whole number from 0 to {max}, without quotes"),
            Kind::Switch => "true or false".into(),
            Kind::Pairs => "an array of \"NAME=N\" strings, e.g. [\"ci-bot=1000\"]".into(),
            Kind::Text(_) => "a string".into(),
        }
    }

    /// Reads `text` as written on the command line or in an environment variable.
    pub(crate) fn parse_text(&self, text: &str) -> Result<Value, String> {
        let bad = || format!("{text:?}: expected {}", self.expected());
        match self.kind {
            Kind::Choice(words) => words
                .iter()
                .find(|w| **w == text)
                .map(|w| Value::Word((*w).to_owned()))
                .ok_or_else(bad),
            Kind::Secs => crate::time::parse_secs(text).map(Value::Num),
            Kind::Ms => crate::time::parse_ms(text).map(Value::Num),
            Kind::Count(max) => match text.trim().parse::<u64>() {
                Ok(n) if n <= max => Ok(Value::Num(n)),
                _ => Err(bad()),
            },
            Kind::Switch => match text {
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                _ => Err(bad()),
            },
            Kind::Pairs => text
                .split_whitespace()
                .map(crate::args::parse_override)
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Pairs),
            Kind::Text(check) => check(text).map(|()| Value::Word(text.to_owned())),
        }
    }

    /// Reads a value of the configuration file.
    pub(crate) fn parse_toml(&self, v: &toml::Value) -> Result<Value, String> {
        let bad = || format!("expected {}", self.expected());
        match (self.kind, v) {
            (Kind::Choice(_), toml::Value::String(s)) => self.parse_text(s),
            (Kind::Secs | Kind::Ms | Kind::Count(_), toml::Value::Integer(n)) => {
                match u64::try_from(*n) {
                    Ok(n) => self.parse_text(&n.to_string()),
                    Err(_) => Err(bad()),
                }
            }
            (Kind::Secs | Kind::Ms, toml::Value::String(s)) => self.parse_text(s),
            (Kind::Switch, toml::Value::Boolean(b)) => Ok(Value::Bool(*b)),
            (Kind::Text(_), toml::Value::String(s)) => self.parse_text(s),
            (Kind::Pairs, toml::Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    toml::Value::String(s) => crate::args::parse_override(s),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Pairs),
            _ => Err(bad()),
        }
    }

    /// The value of this setting in `s`.
    pub(crate) fn get(&self, s: &UpSettings) -> Value {
        (self.get)(s)
    }
}

/// The values of every `up` setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpSettings {
    pub(crate) storage: StorageKind,
    pub(crate) durability: DurabilityKind,
    /// Seconds.
    pub(crate) inbox_ttl: u64,
    pub(crate) heartbeat_ms: u64,
    pub(crate) busy_high_water: u64,
    pub(crate) max_connections: usize,
    pub(crate) max_hops: u32,
    pub(crate) max_spawned: u32,
    pub(crate) max_spawn_depth: u32,
    pub(crate) rate_limit: u32,
    pub(crate) pair_rate_limit: u32,
    /// Seconds.
    pub(crate) rate_window: u64,
    pub(crate) breaker_failures: u32,
    pub(crate) breaker_cooldown_ms: u64,
    pub(crate) rate_overrides: Vec<(String, u32)>,
    pub(crate) dashboard_port: u16,
    pub(crate) no_dashboard: bool,
    /// NATS URLs; empty: no federation.
    pub(crate) cluster: String,
    /// Empty: the host name.
    pub(crate) node: String,
    pub(crate) cluster_creds: String,
    pub(crate) cluster_ca: String,
    /// Seconds.
    pub(crate) cluster_retention: u64,
    pub(crate) cluster_replicas: u64,
}

/// The defaults: the daemon's own (`relay_daemon::defaults`), the store's durability and the
/// dashboard's port. Nothing else in the CLI writes a default of these settings.
impl Default for UpSettings {
    fn default() -> Self {
        use relay_daemon::defaults as d;
        let ms = |t: std::time::Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        Self {
            storage: StorageKind::Sqlite,
            durability: DurabilityKind::of(relay_store::Durability::default()),
            inbox_ttl: d::INBOX_TTL.as_secs(),
            heartbeat_ms: ms(d::HEARTBEAT),
            busy_high_water: d::BUSY_HIGH_WATER,
            max_connections: d::MAX_CONNECTIONS,
            max_hops: d::MAX_HOPS,
            max_spawned: d::MAX_SPAWNED,
            max_spawn_depth: d::MAX_SPAWN_DEPTH,
            rate_limit: d::RATE_LIMIT,
            pair_rate_limit: d::PAIR_RATE_LIMIT,
            rate_window: d::RATE_WINDOW.as_secs(),
            breaker_failures: d::BREAKER_FAILURES,
            breaker_cooldown_ms: ms(d::BREAKER_COOLDOWN),
            rate_overrides: Vec::new(),
            dashboard_port: relay_dashboard::DEFAULT_PORT,
            no_dashboard: false,
            cluster: String::new(),
            node: String::new(),
            cluster_creds: String::new(),
            cluster_ca: String::new(),
            cluster_retention: 7 * 24 * 3600,
            cluster_replicas: 0,
        }
    }
}

impl UpSettings {
    /// The settings as `up` options, for starting a daemon in the background with exactly
    /// these values (whatever its environment or the file says by then).
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for s in &SETTINGS {
            match s.get(self) {
                Value::Bool(true) => args.push(format!("--{}", s.name)),
                Value::Bool(false) => {}
                // An unset text setting (no federation, say) is left out.
                Value::Word(w) if w.is_empty() => {}
                Value::Pairs(pairs) => {
                    for (name, n) in pairs {
                        args.push(format!("--{}", s.name));
                        args.push(format!("{name}={n}"));
                    }
                }
                v => {
                    args.push(format!("--{}", s.name));
                    args.push(v.text());
                }
            }
        }
        args
    }

    /// Every setting by name, as the text `up` takes (what `settings.json` records).
    pub(crate) fn to_map(&self) -> BTreeMap<String, String> {
        SETTINGS
            .iter()
            .map(|s| (s.name.to_owned(), s.get(self).text()))
            .collect()
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// The command line.
    Flag,
    /// This environment variable.
    Env(&'static str),
    /// The configuration file (as shown), at this line.
    File { shown: String, line: usize },
    /// The built-in default.
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flag => f.write_str("flag"),
            Self::Env(var) => write!(f, "env {var}"),
            Self::File { shown, line } => write!(f, "file {shown}:{line}"),
            Self::Default => f.write_str("default"),
        }
    }
}

/// The options given on `up`'s command line: each setting's name and its values as written.
pub(crate) type Flags = BTreeMap<String, Vec<String>>;

/// Settings resolved from their sources, with where each came from.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) settings: UpSettings,
    /// One per entry of [`SETTINGS`], in its order.
    pub(crate) sources: Vec<Source>,
}

/// Each setting from the first source that has it: `flags` > `env` > `file` > default.
///
/// # Errors
/// Exit 2 for an environment variable whose value cannot be used (flags were checked by
/// clap, the file when it was read).
pub(crate) fn resolve(
    flags: &Flags,
    env: impl Fn(&str) -> Option<String>,
    file: Option<&ConfigFile>,
) -> anyhow::Result<Resolved> {
    let mut settings = UpSettings::default();
    let mut sources = Vec::with_capacity(SETTINGS.len());
    for s in &SETTINGS {
        let (value, source) = if let Some(given) = flags.get(s.name) {
            let value = match s.kind {
                Kind::Switch => Value::Bool(true),
                _ => s
                    .parse_text(&given.join(" "))
                    .map_err(|e| crate::exit::usage(format!("--{}: {e}", s.name)))?,
            };
            (value, Source::Flag)
        } else if let Some((var, text)) = s
            .env
            .and_then(|var| env(var).filter(|t| !t.is_empty()).map(|t| (var, t)))
        {
            let value = s.parse_text(&text).map_err(|e| {
                crate::exit::usage(format!(
                    "{var}={}: {e}",
                    relay_protocol::text::one_line(&format!("{text:?}"), 80)
                ))
            })?;
            (value, Source::Env(var))
        } else if let Some((value, line)) = file.and_then(|f| f.up.get(s.name)) {
            (
                value.clone(),
                Source::File {
                    shown: file.map(|f| f.shown.clone()).unwrap_or_default(),
                    line: *line,
                },
            )
        } else {
            sources.push(Source::Default);
            continue;
        };
        (s.set)(&mut settings, value);
        sources.push(source);
    }
    Ok(Resolved { settings, sources })
}

/// The settings of this project's relay: `flags`, then the process's environment, then the
/// project's configuration file (returned too: the wrapper reads its profile overrides).
///
/// # Errors
/// Exit 2 for a configuration file or a variable that cannot be used.
pub(crate) fn for_project(
    paths: &relay_client::paths::Paths,
    flags: &Flags,
) -> anyhow::Result<(Resolved, Option<ConfigFile>)> {
    let file = crate::config_file::load(&paths.project_root, |k| std::env::var_os(k))?;
    let resolved = resolve(flags, |k| std::env::var(k).ok(), file.as_ref())?;
    Ok((resolved, file))
}

/// `up`'s settings options, built from [`SETTINGS`]: no clap default (a value left out is
/// looked for in the environment, the file, then the default), the default and the variable
/// shown in the help.
pub(crate) fn add_args(cmd: clap::Command) -> clap::Command {
    use clap::{Arg, ArgAction};
    let defaults = UpSettings::default();
    SETTINGS.iter().enumerate().fold(cmd, |cmd, (i, s)| {
        // clap's style: no full stop before the `[default: ...]`.
        let mut help = s.help.trim_end_matches('.').to_owned();
        match (s.kind, s.get(&defaults).text()) {
            (Kind::Switch, _) => {}
            (_, d) if d.is_empty() => help.push_str(" [default: none]"),
            (_, d) => help.push_str(&format!(" [default: {d}]")),
        }
        if let Some(var) = s.env {
            help.push_str(&format!(" [env: {var}]"));
        }
        // After `--foreground` and `--json`, in the table's order.
        let arg = Arg::new(s.name)
            .long(s.name)
            .help(help)
            .display_order(100 + i);
        let arg = match s.kind {
            Kind::Switch => arg.action(ArgAction::SetTrue),
            Kind::Choice(words) => arg
                .value_name(s.value_name)
                .value_parser(clap::builder::PossibleValuesParser::new(words)),
            kind => arg
                .value_name(s.value_name)
                .action(if matches!(kind, Kind::Pairs) {
                    ArgAction::Append
                } else {
                    ArgAction::Set
                })
                .value_parser(move |v: &str| s.parse_text(v).map(|_| v.to_owned())),
        };
        cmd.arg(arg)
    })
}

/// The settings given on `up`'s command line in `up` (its matches).
pub(crate) fn flags_of(up: &clap::ArgMatches) -> Flags {
    SETTINGS
        .iter()
        .filter(|s| up.value_source(s.name) == Some(clap::parser::ValueSource::CommandLine))
        .map(|s| {
            let values = match s.kind {
                Kind::Switch => vec!["true".to_owned()],
                _ => up
                    .get_many::<String>(s.name)
                    .map(|v| v.cloned().collect())
                    .unwrap_or_default(),
            };
            (s.name.to_owned(), values)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_reads_back_as_itself() {
        let d = UpSettings::default();
        let mut again = UpSettings {
            storage: StorageKind::Memory,
            durability: DurabilityKind::Normal,
            no_dashboard: true,
            max_hops: 1,
            ..UpSettings::default()
        };
        for s in &SETTINGS {
            let v = s.get(&d);
            let parsed = match s.kind {
                Kind::Switch => v.clone(),
                _ => s.parse_text(&v.text()).unwrap(),
            };
            assert_eq!(parsed, v, "{}", s.name);
            (s.set)(&mut again, parsed);
        }
        assert_eq!(again, d);
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let flags: Flags = [("durability".to_owned(), vec!["full".to_owned()])].into();
        let env = |k: &str| match k {
            "AGENT_RELAY_DURABILITY" => Some("normal".to_owned()),
            "AGENT_RELAY_STORAGE_TYPE" => Some("memory".to_owned()),
            _ => None,
        };
        let file = crate::config_file::parse(
            "[up]\nstorage = \"sqlite\"\nmax-hops = 3\n",
            std::path::Path::new("/p/c.toml"),
            "c.toml".into(),
        )
        .unwrap();
        let r = resolve(&flags, env, Some(&file)).unwrap();
        let by = |name: &str| {
            let i = SETTINGS.iter().position(|s| s.name == name).unwrap();
            (
                SETTINGS[i].get(&r.settings).text(),
                r.sources[i].to_string(),
            )
        };
        assert_eq!(by("durability"), ("full".into(), "flag".into()));
        assert_eq!(
            by("storage"),
            ("memory".into(), "env AGENT_RELAY_STORAGE_TYPE".into())
        );
        assert_eq!(by("max-hops"), ("3".into(), "file c.toml:3".into()));
        assert_eq!(by("rate-limit"), ("100".into(), "default".into()));
        let bad = resolve(
            &Flags::new(),
            |k| (k == "AGENT_RELAY_DURABILITY").then(|| "fast".to_owned()),
            None,
        )
        .unwrap_err();
        assert_eq!(crate::exit::code_of(&bad), 2);
        assert!(bad.to_string().contains("\"full\", \"normal\""), "{bad}");
    }
}
