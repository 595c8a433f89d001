//! `agent-relay up` and `down`: the daemon's life cycle.
//!
//! The pid file doubles as the single-instance lock: the daemon holds an exclusive `flock` on
//! it for its whole life. A second daemon cannot take the lock and refuses to start; a pid file
//! left by a crashed daemon is not locked, so it is simply taken over (and the stale socket
//! removed by `bind`). Nothing ever trusts a pid number without the lock.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use relay_client::paths::Paths;
use relay_store::{MemoryStore, SqliteStore, Store};
use rustix::fs::{FlockOperation, flock};

use crate::args::{DownArgs, StorageKind, UpArgs};
use crate::cmd::init_logging;
use crate::out::{json, line};
use crate::settings::{Flags, Resolved, SETTINGS, Source, UpSettings};

/// Holds the daemon's lock on its pid file while alive.
struct PidLock {
    file: File,
}

/// Tries to take the pid-file lock. `Ok(None)` when another process holds it.
fn try_lock(pid_file: &Path) -> anyhow::Result<Option<PidLock>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(pid_file)
        .with_context(|| format!("cannot open pid file {}", pid_file.display()))?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(PidLock { file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(anyhow::anyhow!(
            "cannot lock pid file {}: {e}",
            pid_file.display()
        )),
    }
}

/// The pid of the running daemon, if one holds the lock. Read through the handle that was
/// locked: a daemon that is exiting removes its pid file, and opening the path a second time
/// would fail on that (a wrapper starting then took it for an error and relayed for no one).
pub(crate) fn running_pid(paths: &Paths) -> anyhow::Result<Option<u32>> {
    let mut file = match File::open(&paths.pid_file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(anyhow::anyhow!(
                "cannot open pid file {}: {e}",
                paths.pid_file.display()
            ));
        }
    };
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        // We got the lock, so nobody runs; closing the file releases it again.
        Ok(()) => Ok(None),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut s = String::new();
            file.read_to_string(&mut s)
                .with_context(|| format!("cannot read pid file {}", paths.pid_file.display()))?;
            Ok(s.trim().parse().ok())
        }
        Err(e) => Err(anyhow::anyhow!(
            "cannot lock pid file {}: {e}",
            paths.pid_file.display()
        )),
    }
}

fn make_data_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create data directory {}", dir.display()))
}

/// A warning when others can read (or enter, or write) the data directory, with the command
/// that fixes it. The relay's own files are private whatever the directory's mode (the daemon's
/// umask and [`make_files_private`]), but a directory others can list still shows who uses
/// the relay, and one made before the relay made its files private may hold copies.
fn open_data_dir_warning(dir: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "the data directory {} can be read by other users (mode {mode:o}); the relay's files in it are private (0600), but run `chmod 700 {}` to make the directory private too",
            dir.display(),
            dir.display()
        )
    })
}

/// Makes the relay's existing files private (0600): files from a version of the relay that
/// created them 0644, or copied in with a looser mode. SQLite gives a new `-wal`/`-shm` the
/// mode of the database file, so the database must be private before it is opened.
fn make_files_private(paths: &Paths) {
    use std::os::unix::fs::PermissionsExt;
    let db = paths.db.as_os_str();
    let with = |suffix: &str| {
        let mut p = db.to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p)
    };
    let files = [
        paths.db.clone(),
        with("-wal"),
        with("-shm"),
        with("-journal"),
        paths.agents_file.clone(),
        paths.log_file.clone(),
        paths.pid_file.clone(),
        dashboard_file(paths),
        settings_file(paths),
        paths.data_dir.join(crate::cmd::rules::FILE),
    ];
    for file in &files {
        let Ok(meta) = std::fs::symlink_metadata(file) else {
            continue; // not there (yet): it will be created private
        };
        if !meta.is_file() || meta.permissions().mode() & 0o077 == 0 {
            continue;
        }
        match std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)) {
            Ok(()) => tracing::info!(path = %file.display(), "made private (0600)"),
            Err(e) => tracing::warn!(
                path = %file.display(),
                error = %e,
                "cannot make this file private; other users may read it"
            ),
        }
    }
    // The wrappers' state (inboxes with message bodies, logs) lives under `team/`.
    let team = paths.data_dir.join("team");
    if let Ok(meta) = std::fs::symlink_metadata(&team) {
        if meta.is_dir() && meta.permissions().mode() & 0o077 != 0 {
            if let Err(e) = std::fs::set_permissions(&team, std::fs::Permissions::from_mode(0o700))
            {
                tracing::warn!(path = %team.display(), error = %e, "cannot make this directory private");
            }
        }
    }
}

/// The running daemon's dashboard URL (with its token), if it serves one. The file is
/// private (0600): the token is what keeps other local users out.
pub(crate) fn dashboard_url(paths: &Paths) -> Option<String> {
    std::fs::read_to_string(dashboard_file(paths))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn dashboard_file(paths: &Paths) -> std::path::PathBuf {
    paths.data_dir.join("dashboard.url")
}

/// The project's dashboard token (0600), kept across restarts.
pub(crate) fn dashboard_token_file(paths: &Paths) -> std::path::PathBuf {
    paths.data_dir.join("dashboard.token")
}

/// `agent-relay dashboard`: the dashboard's URL; with `--rotate-token`, a new token first (the
/// running dashboard refuses the old one from its next request on).
pub(crate) fn dashboard(paths: &Paths, args: &crate::args::DashboardArgs) -> anyhow::Result<()> {
    let running = dashboard_url(paths);
    if args.rotate_token {
        std::fs::create_dir_all(&paths.data_dir)
            .with_context(|| format!("cannot create {}", paths.data_dir.display()))?;
        let file = dashboard_token_file(paths);
        let token = relay_dashboard::auth::write_new_token(&file)
            .with_context(|| format!("cannot write {}", file.display()))?;
        // The URL file of a running dashboard carries the token: rewritten with the new one.
        if let Some(old) = &running
            && let Some((base, _)) = old.split_once("?token=")
        {
            let url = format!("{base}?token={token}");
            let written = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(dashboard_file(paths))
                .and_then(|mut f| writeln!(f, "{url}"));
            written.with_context(|| format!("cannot write {}", dashboard_file(paths).display()))?;
            if args.json {
                return json(&serde_json::json!({"rotated": true, "url": url}));
            }
            line(format!(
                "new dashboard token; the old URL is refused from now on:\n{url}"
            ))?;
            return Ok(());
        }
        if args.json {
            return json(&serde_json::json!({"rotated": true, "url": null}));
        }
        line(
            "new dashboard token, used from the next `agent-relay up` (the relay's dashboard is not running)",
        )?;
        return Ok(());
    }
    match running {
        Some(url) if args.json => json(&serde_json::json!({"url": url})),
        Some(url) => Ok(line(url)?),
        None => Err(crate::exit::not_running(
            "no dashboard is running for this project (`agent-relay up` starts the relay and its dashboard)",
        )),
    }
}

fn print_running(
    paths: &Paths,
    pid: u32,
    already: bool,
    args: &UpArgs,
    settings: &UpSettings,
) -> anyhow::Result<()> {
    let dashboard = dashboard_url(paths);
    if args.json {
        return json(&serde_json::json!({
            "running": true,
            "already_running": already,
            "pid": pid,
            "project_root": paths.project_root,
            "socket": paths.socket,
            "data_dir": paths.data_dir,
            "db": paths.db,
            "log": paths.log_file,
            "dashboard": dashboard,
        }));
    }
    let what = if already {
        "relay already running"
    } else {
        "relay started"
    };
    line(format!("{what} (pid {pid})"))?;
    line(format!("  project: {}", paths.project_root.display()))?;
    line(format!("  socket: {}", paths.socket.display()))?;
    line(format!("  data:   {}", paths.data_dir.display()))?;
    line(format!("  log:    {}", paths.log_file.display()))?;
    if let Some(url) = dashboard {
        let wanted = settings.dashboard_port;
        let moved = !url.starts_with(&format!("http://127.0.0.1:{wanted}/")) && wanted != 0;
        let note = if moved && !already {
            format!(" (port {wanted} was taken)")
        } else {
            String::new()
        };
        line(format!("  dashboard: {url}{note}"))?;
    }
    Ok(())
}

/// `agent-relay up`. `flags`: the settings given on the command line; with the environment
/// and the project's configuration file they make the relay's settings, and those not left
/// to their default must match the running relay's, if one runs (settings apply at start).
pub(crate) fn up(paths: &Paths, args: &UpArgs, flags: &Flags) -> anyhow::Result<()> {
    let (resolved, file) = crate::settings::for_project(paths, flags)?;
    let settings = &resolved.settings;
    let people = file.map(|f| f.people).unwrap_or_default();
    if args.foreground {
        return foreground(paths, settings, people);
    }
    // The adapters' secret files are checked here too, so a bad one is reported by `up`
    // itself rather than found in the background daemon's log.
    if !people.is_empty() {
        relay_people::Hub::new(people, paths.socket.clone(), None)?;
    }
    let printed = match start_background(paths, settings)? {
        Started::Already(pid) => {
            same_settings(paths, pid, &resolved)?;
            print_running(paths, pid, true, args, settings)
        }
        Started::Now(pid) => print_running(paths, pid, false, args, settings),
        Started::Elsewhere => Err(crate::exit::Coded {
            code: 1,
            message: format!(
                "a relay already answers on {}, but its data is not in {} (it was started with \
                 another AGENT_RELAY_DATA_DIR), so this one cannot start there and its settings \
                 cannot be checked. Use that relay's data directory, or set AGENT_RELAY_SOCKET \
                 to another path to run a second relay.",
                paths.socket.display(),
                paths.data_dir.display()
            ),
        }
        .into()),
    };
    printed?;
    if !args.json {
        print_federation(&resolved)?;
    }
    Ok(())
}

/// With `--cluster` (from wherever it came: a project's `.agent-relay/config.toml` can set
/// it), `up` says the relay is in a federation, through what, as which node, and warns loudly
/// on stderr when that connection is neither authenticated nor local-only.
fn print_federation(resolved: &Resolved) -> anyhow::Result<()> {
    let s = &resolved.settings;
    if s.cluster.trim().is_empty() {
        return Ok(());
    }
    let source = SETTINGS
        .iter()
        .zip(&resolved.sources)
        .find(|(setting, _)| setting.name == "cluster")
        .map(|(_, source)| source);
    let from = match source {
        Some(Source::Default) | None => String::new(),
        Some(Source::Flag) => " (--cluster)".to_owned(),
        Some(other) => format!(" (set by {other})"),
    };
    let node = if s.node.is_empty() {
        format!("{} (the host name; --node not given)", host_node_name())
    } else {
        s.node.clone()
    };
    line(format!(
        "  federation: node {node} through {}{from}; `agent-relay status` shows the link",
        relay_protocol::text::one_line(&s.cluster, 200)
    ))?;
    if let Some(w) = relay_federation::core::exposure(&s.cluster, !s.cluster_creds.is_empty()) {
        eprintln!(
            "agent-relay: WARNING: {}",
            relay_protocol::text::one_line(&w, 600)
        );
    }
    Ok(())
}

/// The file in the data directory where the daemon keeps its adapters' state
/// (`agent-relay adapters` reads it).
pub(crate) const ADAPTERS_FILE: &str = "adapters.json";

/// The file in the data directory where the daemon records the settings it started with.
fn settings_file(paths: &Paths) -> std::path::PathBuf {
    paths.data_dir.join("settings.json")
}

/// The settings the daemon with `pid` recorded at start, if it recorded them.
pub(crate) fn running_settings(paths: &Paths, pid: u32) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(settings_file(paths)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    // A file left by an earlier daemon (killed before it could remove it) is not this one's.
    if v["pid"].as_u64() != Some(u64::from(pid)) {
        return None;
    }
    serde_json::from_value(v["settings"].clone()).ok()
}

/// Records the daemon's settings for `up` (and `status`) to compare and show.
fn write_settings(paths: &Paths, settings: &UpSettings) -> anyhow::Result<()> {
    let v = serde_json::json!({
        "pid": std::process::id(),
        "settings": settings.to_map(),
    });
    let file = settings_file(paths);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&file)
        .with_context(|| format!("cannot write {}", file.display()))?;
    writeln!(f, "{v}")?;
    Ok(())
}

/// `s` as one word for a POSIX shell: as it is when it has nothing the shell would read,
/// else in single quotes.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Refuses (exit 1) when a setting given on the command line, by an environment variable or
/// by the configuration file differs from the running relay's: saying "already running" and
/// succeeding would leave the user believing the new setting is in force.
fn same_settings(paths: &Paths, pid: u32, resolved: &Resolved) -> anyhow::Result<()> {
    let asked = resolved.settings.to_map();
    let given: Vec<(&str, &Source)> = SETTINGS
        .iter()
        .zip(&resolved.sources)
        .filter(|(_, source)| **source != Source::Default)
        .map(|(s, source)| (s.name, source))
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    // Options go on the command line again; a variable or the file is read again anyway. A
    // socket chosen by `--socket` goes on both commands, or they would reach another relay.
    let socket_flag = std::env::var_os("AGENT_RELAY_SOCKET").is_none()
        && Paths::from_env().ok().map(|p| p.socket).as_ref() != Some(&paths.socket);
    let program = if socket_flag {
        format!(
            "agent-relay --socket {}",
            shell_word(&paths.socket.to_string_lossy())
        )
    } else {
        "agent-relay".to_owned()
    };
    let mut restart = format!("{program} down && {program} up");
    for (g, _) in given.iter().filter(|(_, source)| **source == Source::Flag) {
        match *g {
            "no-dashboard" if asked[*g] == "true" => restart.push_str(" --no-dashboard"),
            "no-dashboard" => {}
            "rate-override" => {
                for o in asked[*g].split_whitespace() {
                    restart.push_str(&format!(" --rate-override {o}"));
                }
            }
            _ => restart.push_str(&format!(" --{g} {}", asked[*g])),
        }
    }
    let how = format!(
        "Settings apply when the relay starts. To use yours, restart it (stored messages are \
         kept; wrapped agents reconnect by themselves):\n  {restart}"
    );
    let Some(running) = running_settings(paths, pid) else {
        return Err(crate::exit::Coded {
            code: 1,
            message: format!(
                "the relay already runs (pid {pid}) and does not record its settings (an \
                 older agent-relay started it), so --{} may not be in force.\n{how}",
                given
                    .iter()
                    .map(|(g, _)| *g)
                    .collect::<Vec<_>>()
                    .join(", --")
            ),
        }
        .into());
    };
    let differ: Vec<String> = given
        .iter()
        .filter(|(g, _)| running.get(*g) != asked.get(*g))
        .map(|(g, source)| {
            let shown = |v: Option<&String>| match v.map(String::as_str) {
                None => "(unknown)".to_owned(),
                Some("") => "(none)".to_owned(),
                Some(v) => v.to_owned(),
            };
            let from = match source {
                Source::Flag => String::new(),
                other => format!(" ({other})"),
            };
            format!(
                "  --{g}: it runs with {}, you asked for {}{from}",
                shown(running.get(*g)),
                shown(asked.get(*g))
            )
        })
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(crate::exit::Coded {
        code: 1,
        message: format!(
            "the relay already runs (pid {pid}) with other settings:\n{}\n{how}",
            differ.join("\n")
        ),
    }
    .into())
}

/// Whether a listener answers on `socket` and the socket is this user's. Another user's
/// socket is not even connected to here: starting a daemon reports it (see
/// `relay_daemon::bind`), and nothing is ever sent to it.
fn own_relay_answers(socket: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    std::fs::symlink_metadata(socket)
        .is_ok_and(|m| m.file_type().is_socket() && m.uid() == rustix::process::getuid().as_raw())
        && std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// Whether [`start_background`] found a daemon or started one.
pub(crate) enum Started {
    /// One was running (its pid).
    Already(u32),
    /// One answers on the socket, but it does not keep its data in this data directory (it
    /// was started with another `AGENT_RELAY_DATA_DIR`): usable, its pid and settings unknown.
    Elsewhere,
    /// One was started (its pid).
    Now(u32),
}

/// Starts the daemon in the background unless one runs, and returns once it accepts
/// connections. Used by `up` and by the wrapper (which starts the relay rather than fail).
pub(crate) fn start_background(paths: &Paths, settings: &UpSettings) -> anyhow::Result<Started> {
    if let Some(pid) = running_pid(paths)? {
        return Ok(Started::Already(pid));
    }
    // A daemon of another data directory on this socket: starting one here would only fail
    // on the socket (after creating a database nobody uses).
    if own_relay_answers(&paths.socket) {
        return Ok(Started::Elsewhere);
    }
    make_data_dir(&paths.data_dir)?;
    if let Some(w) = open_data_dir_warning(&paths.data_dir) {
        eprintln!("agent-relay: warning: {w}");
    }
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&paths.log_file)
        .with_context(|| format!("cannot open log file {}", paths.log_file.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().context("cannot find the agent-relay executable")?;
    let mut cmd = Command::new(exe);
    // Every setting, resolved here: the daemon runs with what this process decided, whatever
    // its environment or the configuration file say by the time it reads them.
    cmd.args(["up", "--foreground"]).args(settings.to_args());
    let mut child = cmd
        .env("AGENT_RELAY_SOCKET", &paths.socket)
        .env("AGENT_RELAY_DATA_DIR", &paths.data_dir)
        .env("AGENT_RELAY_STORAGE_PATH", &paths.db)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal must not stop the daemon.
        .process_group(0)
        .spawn()
        .context("cannot start the daemon")?;
    let deadline = relay_protocol::now_instant() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait()? {
            let tail = log_tail(&paths.log_file, log_start);
            anyhow::bail!("the daemon exited during start-up ({status}):\n{tail}");
        }
        if std::os::unix::net::UnixStream::connect(&paths.socket).is_ok() {
            break;
        }
        if relay_protocol::now_instant() > deadline {
            anyhow::bail!(
                "the daemon did not accept connections within 15 s; see {}",
                paths.log_file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Started::Now(child.id()))
}

fn log_tail(path: &Path, from: u64) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Runs the daemon in this process until SIGTERM or SIGINT.
fn foreground(
    paths: &Paths,
    args: &UpSettings,
    people: relay_people::PeopleConfig,
) -> anyhow::Result<()> {
    // Everything the daemon creates (database, WAL, shared memory, agents.json, ...) is for
    // this user only, whatever the mode of the directory it is in: message bodies are private.
    // Set before any file is created; the daemon starts no other programs, so no one else
    // inherits it.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    init_logging("info");
    // Every connection costs a descriptor; a soft limit of 1,024 is soon spent.
    let fds = match relay_daemon::fds::raise_limit() {
        Ok(n) => n,
        Err((n, e)) => {
            tracing::warn!(limit = n, error = %e, "could not raise the open-files limit");
            n
        }
    };
    make_data_dir(&paths.data_dir)?;
    if let Some(w) = open_data_dir_warning(&paths.data_dir) {
        tracing::warn!("{w}");
    }
    make_files_private(paths);
    let Some(mut lock) = try_lock(&paths.pid_file)? else {
        let pid = running_pid(paths)?
            .map(|p| p.to_string())
            .unwrap_or_else(|| "?".into());
        anyhow::bail!(
            "another relay daemon is already running for this data directory (pid {pid}); `agent-relay down` stops it"
        );
    };
    // Checked again when binding; asked before anything is written so that a daemon of
    // another data directory on this socket leaves no pid or database here.
    if own_relay_answers(&paths.socket) {
        return Err(relay_daemon::DaemonError::AlreadyRunning(paths.socket.clone()).into());
    }
    lock.file.set_len(0)?;
    lock.file.rewind()?;
    writeln!(lock.file, "{}", std::process::id())?;
    lock.file.flush()?;
    write_settings(paths, args)?;
    // The person's names are theirs: no agent connection takes them (issue 23.3).
    let declared: Vec<String> = people.people.iter().map(|p| p.name.clone()).collect();
    // Secrets are read (and refused when others can read them) before anything listens.
    let people = if people.is_empty() {
        None
    } else {
        Some(relay_people::Hub::new(
            people,
            paths.socket.clone(),
            Some(paths.data_dir.join(ADAPTERS_FILE)),
        )?)
    };
    // Bound before the socket, so that whoever waits for the socket finds the URL file.
    let dashboard = start_dashboard(paths, args);
    let store: Box<dyn Store> = match args.storage {
        StorageKind::Sqlite => Box::new(
            SqliteStore::open_with(&paths.db, args.durability.store())
                .with_context(|| format!("cannot open database {}", paths.db.display()))?,
        ),
        StorageKind::Memory => Box::new(MemoryStore::new()),
    };
    let mut cfg = relay_daemon::Config::new(paths.socket.clone());
    cfg.agents_file = Some(paths.agents_file.clone());
    cfg.set_inbox_ttl(Duration::from_secs(args.inbox_ttl));
    cfg.set_heartbeat(Duration::from_millis(args.heartbeat_ms));
    cfg.busy_high_water = args.busy_high_water.max(1);
    cfg.max_connections = args.max_connections.max(1);
    // The socket keeps its share of descriptors whatever the dashboard's port is sent.
    let share = relay_daemon::fds::socket_share(fds, relay_dashboard::MAX_CONNECTIONS as u64);
    if cfg.max_connections > share {
        tracing::warn!(
            asked = cfg.max_connections,
            allowed = share,
            open_files_limit = fds,
            "--max-connections is more than the open-files limit leaves; using the lower"
        );
        cfg.max_connections = share;
    }
    cfg.max_hops = args.max_hops;
    cfg.max_spawned = args.max_spawned;
    cfg.max_spawn_depth = args.max_spawn_depth;
    cfg.breaker_failures = args.breaker_failures;
    cfg.breaker_cooldown = Duration::from_millis(args.breaker_cooldown_ms.max(1));
    cfg.rules_file = Some(paths.data_dir.join(crate::cmd::rules::FILE));
    for name in declared {
        if !cfg.person_names.contains(&name) {
            cfg.person_names.push(name);
        }
    }
    let window_ms = args.rate_window.max(1).saturating_mul(1000);
    cfg.rates = relay_daemon::limits::RateConfig {
        sender: relay_daemon::limits::Limit {
            max: args.rate_limit,
            window_ms,
        },
        pair: relay_daemon::limits::Limit {
            max: args.pair_rate_limit,
            window_ms,
        },
        overrides: args.rate_overrides.iter().cloned().collect(),
    };
    let mut federation = federation_options(paths, args)?;
    // The link adds the legs on other nodes to a `trace` (asked over NATS).
    let mut traces = None;
    if let Some(f) = &mut federation {
        // No other node speaks as this node's people.
        f.people = cfg.person_names.clone();
        cfg.federation = Some(relay_daemon::FederationCell::default());
        cfg.node = Some(f.node.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        cfg.federation_trace = Some(tx);
        traces = Some(rx);
    }
    let cell = cfg.federation.clone();
    // Measured: a current-thread runtime spends the same CPU per message but confines routing
    // to one core, and delivers less (docs/PERFORMANCE.md).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let kind = args.storage.as_str();
    // The node name is this relay's alone: another live relay holding it refuses the start
    // here, before anything listens (NATS unreachable is no refusal: the link checks again).
    if let Some(f) = &federation {
        rt.block_on(relay_federation::claim_node_at_start(f))?;
    }
    let result = rt.block_on(async {
        let shutdown = shutdown_signal();
        let listener = relay_daemon::bind(&paths.socket)?;
        tracing::info!(
            pid = std::process::id(),
            socket = %paths.socket.display(),
            db = %store.location(),
            durability = args.durability.as_str(),
            "relay daemon listening"
        );
        relay_daemon::run_with(listener, store, cfg, kind, shutdown, |handle| {
            if let Some(hub) = &people {
                hub.start(&handle);
            }
            // The link speaks to this daemon over its socket, bound by now (connections wait
            // in the backlog until the accept loop starts).
            if let (Some(opts), Some(cell), Some(traces)) = (federation, cell, traces) {
                tokio::spawn(async move {
                    if let Err(e) = relay_federation::run(opts, cell, traces).await {
                        tracing::error!(error = %e, "the federation link stopped");
                    }
                });
            }
            if let Some((bound, token)) = dashboard {
                tokio::spawn(async move {
                    if let Err(e) =
                        relay_dashboard::serve_with(bound.listener, token, handle, people).await
                    {
                        tracing::error!(error = %e, "the dashboard stopped");
                    }
                });
            }
        })
        .await
    });
    for file in [
        dashboard_file(paths),
        paths.data_dir.join(ADAPTERS_FILE),
        settings_file(paths),
        paths.pid_file.clone(),
    ] {
        remove_stale(&file);
    }
    drop(lock);
    result?;
    tracing::info!("relay daemon stopped");
    Ok(())
}

/// The federation link's options when `--cluster` is set (`None`: nothing extra runs).
fn federation_options(
    paths: &Paths,
    args: &UpSettings,
) -> anyhow::Result<Option<relay_federation::Options>> {
    if args.cluster.trim().is_empty() {
        return Ok(None);
    }
    let node_from_host = args.node.is_empty();
    let node = if node_from_host {
        host_node_name()
    } else {
        args.node.clone()
    };
    relay_federation::core::validate_node(&node).map_err(|e| crate::exit::usage(e.to_string()))?;
    let path = |p: &str| (!p.is_empty()).then(|| std::path::PathBuf::from(p));
    Ok(Some(relay_federation::Options {
        cluster: args.cluster.clone(),
        node,
        socket: paths.socket.clone(),
        creds: path(&args.cluster_creds),
        ca: path(&args.cluster_ca),
        retention: Duration::from_secs(args.cluster_retention.max(1)),
        replicas: usize::try_from(args.cluster_replicas).unwrap_or(0),
        inbox_ttl: Duration::from_secs(args.inbox_ttl),
        people: Vec::new(),
        instance: federation_instance(paths)?,
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into()),
        data_dir: paths.data_dir.display().to_string(),
        node_from_host,
        publish_slots: test_publish_slots()?,
    }))
}

/// A test hook: `AGENT_RELAY_TEST_PUBLISH_SLOTS=N` gives the federation link N JetStream
/// publishes in flight instead of [`relay_federation::PUBLISH_SLOTS`], so that a test reaches
/// the wait for a free slot with a few thousand messages (issue 28.1's deadlock needed 64
/// remote agents' backlogs to fill 5,000).
fn test_publish_slots() -> anyhow::Result<usize> {
    match std::env::var("AGENT_RELAY_TEST_PUBLISH_SLOTS") {
        Err(std::env::VarError::NotPresent) => Ok(relay_federation::PUBLISH_SLOTS),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                anyhow::anyhow!("AGENT_RELAY_TEST_PUBLISH_SLOTS={v}: expected a number above 0")
            }),
        Err(e) => Err(anyhow::anyhow!("AGENT_RELAY_TEST_PUBLISH_SLOTS: {e}")),
    }
}

/// This relay's identity in the federation: a random id kept in its data directory, made
/// once. The same relay restarted (a crash, an upgrade) takes its node name back at once;
/// another relay under the same name is refused while this one lives.
fn federation_instance(paths: &Paths) -> anyhow::Result<String> {
    let file = paths.data_dir.join("federation.id");
    match std::fs::read_to_string(&file) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", file.display())),
    }
    let id = ulid::Ulid::new().to_string();
    relay_protocol::file::write_atomic(
        &file,
        format!("{id}\n").as_bytes(),
        relay_protocol::file::Durability::PowerLoss,
    )
    .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(id)
}

/// The host name as a node name: characters a NATS subject token cannot hold become `-`.
fn host_node_name() -> String {
    // Linux; elsewhere (or unreadable) the node is called `node` unless --node says.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let name: String = host
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() { "node".into() } else { name }
}

/// Binds the dashboard's port and writes its URL (0600) for `up` and `status` to show. A
/// dashboard that cannot start is logged, never a reason for the relay not to run.
fn start_dashboard(
    paths: &Paths,
    args: &UpSettings,
) -> Option<(relay_dashboard::Bound, relay_dashboard::auth::Token)> {
    let file = dashboard_file(paths);
    let _ = std::fs::remove_file(&file);
    if args.no_dashboard {
        return None;
    }
    let wanted = args.dashboard_port;
    let bound = match relay_dashboard::bind(wanted) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "no dashboard");
            return None;
        }
    };
    // The project's token, the same at every start: an open page and a saved URL keep working.
    let token_file = dashboard_token_file(paths);
    let token = match relay_dashboard::auth::load_or_create(&token_file) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, path = %token_file.display(), "cannot keep the dashboard token; this start's token is new and not kept");
            relay_dashboard::auth::new_token()
        }
    };
    let url = relay_dashboard::url(bound.port, &token);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
        .and_then(|mut f| writeln!(f, "{url}"));
    if let Err(e) = written {
        tracing::warn!(error = %e, path = %file.display(), "cannot write the dashboard URL file");
    }
    if !bound.preferred {
        tracing::warn!(
            wanted,
            port = bound.port,
            "dashboard port taken; using another"
        );
    }
    // Not the URL: it carries the access token, and the log is no place for a secret. `up`
    // prints it to whoever started the relay, `status` to whoever asks.
    tracing::info!(
        port = bound.port,
        "dashboard on 127.0.0.1 (`agent-relay status` shows its URL with the access token)"
    );
    Some((
        bound,
        relay_dashboard::auth::Token::kept_in(token, token_file),
    ))
}

/// Completes at SIGTERM or SIGINT. The handlers are installed when this is called, not when
/// the future is first polled: called before the socket is bound, a `down` sent the moment
/// the socket accepts finds them there (until then, SIGTERM's default action ended the
/// daemon without its graceful stop). Needs the runtime.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            // Without signal handlers the daemon can still be stopped with SIGKILL; losing
            // nothing committed.
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    }
}

/// `agent-relay down`.
pub(crate) fn down(paths: &Paths, args: &DownArgs) -> anyhow::Result<()> {
    let Some(pid) = running_pid(paths)? else {
        line("relay is not running")?;
        return Ok(());
    };
    let Some(raw) = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(0)) else {
        anyhow::bail!("pid file {} holds an invalid pid", paths.pid_file.display());
    };
    rustix::process::kill_process(raw, rustix::process::Signal::Term)
        .with_context(|| format!("cannot signal the daemon (pid {pid})"))?;
    let deadline = relay_protocol::now_instant() + Duration::from_secs(args.timeout);
    while running_pid(paths)?.is_some() {
        if relay_protocol::now_instant() > deadline {
            anyhow::bail!(
                "the daemon (pid {pid}) did not stop within {} s; `kill -9 {pid}` is safe (nothing acknowledged is lost)",
                args.timeout
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    line(format!("relay stopped (pid {pid})"))?;
    Ok(())
}

/// Removes a file the daemon leaves for others (URL, settings, pid) as it stops. One left
/// behind is harmless (the next start replaces it, and readers check the pid), but say so.
fn remove_stale(file: &std::path::Path) {
    if let Err(e) = std::fs::remove_file(file)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %file.display(), error = %e, "could not remove at stop; the next start replaces it");
    }
}
