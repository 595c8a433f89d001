//! `agent-relay wrap` and `agent-relay [-n NAME] <cli> [args]`: run an agent under the relay.

use std::io::IsTerminal;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use relay_client::paths::Paths;
use relay_wrap::WrapConfig;
use relay_wrap::profile::Profile;
use relay_wrap::tmux;

use crate::args::{AttachArgs, Backend, WrapArgs};
use crate::cmd::up::start_background;

const ADJECTIVES: [&str; 16] = [
    "Blue", "Red", "Green", "Amber", "Silver", "Swift", "Quiet", "Bright", "Bold", "Calm", "Keen",
    "Brave", "Clever", "Lucky", "Sunny", "Misty",
];
const ANIMALS: [&str; 16] = [
    "Falcon", "Otter", "Fox", "Heron", "Lynx", "Badger", "Raven", "Wolf", "Hare", "Owl", "Marten",
    "Ibis", "Crane", "Puma", "Seal", "Wren",
];

/// A name like `BlueFalcon`.
fn generated_name() -> String {
    let a = ADJECTIVES[rand::random::<usize>() % ADJECTIVES.len()];
    let b = ANIMALS[rand::random::<usize>() % ANIMALS.len()];
    format!("{a}{b}")
}

/// agent-relay's own options that, written after the agent command, go to the agent instead:
/// a person who wrote `agent-relay claude -n Alice` meant Alice, and `agent-relay claude
/// --delivery digest` meant digests (Claude Code would refuse the option, or worse, take it).
/// Everything after the command is the agent's, as for `env` or `sudo`, so such an option is
/// refused (exit 2) with the command in the right order, unless the option was also given
/// before the command or `--` marks where the agent's arguments begin (an agent CLI that
/// takes `-n` itself, as Claude Code does for its session's name).
fn misplaced_option(args: &WrapArgs, dashdash: bool) -> anyhow::Result<()> {
    let Some((cli, rest)) = args.command.split_first() else {
        return Ok(());
    };
    if dashdash {
        return Ok(());
    }
    let misplaced = rest.iter().position(|a| match a.as_str() {
        "-n" | "--name" => args.name.is_none(),
        a if a.starts_with("--name=") => args.name.is_none(),
        "--intro" => !args.intro,
        "--no-teach" => !args.no_teach,
        "--detached" => !args.detached,
        a if a == "--backend" || a.starts_with("--backend=") => args.backend.is_none(),
        // `each` is also the default: given before the command or not, a later one is misplaced.
        a if a == "--delivery" || a.starts_with("--delivery=") => {
            args.delivery == crate::args::Delivery::Each
        }
        _ => false,
    });
    let Some(at) = misplaced else {
        return Ok(());
    };
    let option = &rest[at];
    // The option and its value, moved before the command.
    let takes_value = ["-n", "--name", "--backend", "--delivery"].contains(&option.as_str());
    let moved: Vec<&String> = rest[at..]
        .iter()
        .take(if takes_value { 2 } else { 1 })
        .collect();
    let kept: Vec<&String> = rest
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < at || *i >= at + moved.len())
        .map(|(_, a)| a)
        .collect();
    // Shell words, quoted where the shell would split or expand them.
    let words = |v: &[&String]| {
        v.iter()
            .map(|a| {
                let a = relay_protocol::text::one_line(a, 80);
                let plain = !a.is_empty()
                    && a.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_./=:@%+,-".contains(c));
                if plain {
                    a
                } else {
                    relay_wrap::tmux::sh_quote(&a)
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    // The options given before the command stay; the misplaced one joins them.
    let mut fixed = String::from("agent-relay");
    if let Some(b) = args.backend {
        fixed.push_str(&format!(" --backend {}", b.as_str()));
    }
    if args.detached {
        fixed.push_str(" --detached");
    }
    if let Some(n) = &args.name {
        fixed.push_str(&format!(" -n {}", relay_protocol::text::one_line(n, 80)));
    }
    if args.intro {
        fixed.push_str(" --intro");
    }
    if args.no_teach {
        fixed.push_str(" --no-teach");
    }
    if args.delivery != crate::args::Delivery::Each {
        fixed.push_str(&format!(" --delivery {}", args.delivery.as_str()));
    }
    fixed.push_str(&format!(" {}", words(&moved)));
    let cli = relay_protocol::text::one_line(cli, 80);
    fixed.push_str(&format!(" {cli}"));
    if !kept.is_empty() {
        fixed.push_str(&format!(" {}", words(&kept)));
    }
    Err(crate::exit::usage(format!(
        "`{}` after `{cli}` would be passed to {cli}, not to agent-relay: put it before the \
         command:\n  {fixed}\n(If {cli} itself takes {}, mark where its arguments begin with \
         `--`: agent-relay -n NAME -- {cli} ...)",
        words(&moved),
        relay_protocol::text::one_line(option, 40),
    )))
}

/// Runs the agent; returns its exit code. `dashdash`: the command line held `--`.
pub(crate) fn wrap(paths: &Paths, args: WrapArgs, dashdash: bool) -> anyhow::Result<i32> {
    misplaced_option(&args, dashdash)?;
    let name = match args.name.clone() {
        Some(n) => {
            relay_protocol::validate_agent_name(&n)
                .map_err(|e| crate::exit::usage(format!("-n {n:?}: {e}")))?;
            n
        }
        None => {
            let n = generated_name();
            eprintln!("agent-relay: this agent is {n} (choose a name with -n NAME)");
            n
        }
    };
    if args.command.is_empty() {
        anyhow::bail!("no agent command given");
    }
    let profile_name = args
        .profile
        .clone()
        .unwrap_or_else(|| Profile::name_for_command(&args.command).to_owned());
    // The relay's settings and the profile overrides of the project's configuration file:
    // read (and checked) before anything starts.
    let (settings, file) = crate::settings::for_project(paths, &crate::settings::Flags::new())?;
    let project = file.as_ref().and_then(|f| f.profile(&profile_name));
    let profile = Profile::load_with(
        &profile_name,
        project.as_ref().map(|(o, from)| (*o, from.as_str())),
        relay_wrap::profile::override_dir().as_deref(),
    )?;
    if let Some(w) = relay_wrap::colour_warning(&profile.parse, |k| std::env::var(k).ok()) {
        eprintln!("agent-relay: warning: {w}");
    }
    let interactive_terminal = std::io::stdin().is_terminal();
    let backend = args.backend.unwrap_or_else(|| {
        if interactive_terminal && tmux_installed() {
            Backend::Tmux
        } else {
            Backend::Pty
        }
    });
    if args.detached && backend == Backend::Pty {
        // A PTY agent lives in this process: "detached" would silently run it in the
        // foreground, holding this terminal (or script) until it exits.
        let why = if args.backend == Some(Backend::Pty) {
            "--backend pty runs the agent inside this process"
        } else if !interactive_terminal {
            "without a terminal the default backend is pty, which runs the agent inside this process"
        } else {
            "tmux is not installed, so the backend is pty, which runs the agent inside this process"
        };
        return Err(crate::exit::usage(format!(
            "--detached needs the tmux backend: {why}. Add --backend tmux (then `agent-relay \
             attach {name}` reaches it), or leave out --detached and run it in the background \
             yourself (`... &`)"
        )));
    }
    // The relay starts if it is not running, as `agent-relay up` would: with the same settings
    // from the environment, the configuration file and the defaults.
    start_background(paths, &settings.settings).context("cannot start the relay")?;
    let team_dir = paths.data_dir.join("team").join(&name);
    private_dir(&paths.data_dir.join("team"))?;
    private_dir(&team_dir)?;
    let inbox = match std::env::var_os("AGENT_RELAY_INBOX_DIR") {
        Some(dir) => Some(PathBuf::from(dir).join("team").join(&name)),
        None if args.inbox => Some(team_dir.clone()),
        None => None,
    };
    // Taught at start through the CLI's own mechanism (`cmd/teach.rs`).
    let mut command = profile.command(&args.command);
    // The process relaying for a tmux session gets the command already taught. Gemini CLI
    // documents no flag for extra instructions (its GEMINI_SYSTEM_MD replaces the whole system
    // prompt): it is taught only by `--intro`, a typed note.
    if !args.no_teach
        && args.serve_tmux.is_none()
        && matches!(profile_name.as_str(), "claude" | "codex")
    {
        let text = crate::cmd::teach::text(paths, &name)?;
        if let Some(extra) = crate::cmd::teach::args(&profile_name, &command, &text) {
            command.extend(extra);
        }
    }
    let cfg = WrapConfig {
        name,
        command,
        profile,
        socket: paths.socket.clone(),
        max_body: args.max_body.max(1),
        interactive: !args.no_input,
        team_dir,
        inbox,
        intro: args.intro,
        delivery: args.delivery.wrap(),
        // The relaying process of a tmux session gets the key of the session its starter
        // created (in its environment, never its command line); otherwise the wrapper makes
        // one (PTY) or finds it in the session (see `relay_wrap::serve_tmux`).
        door_key: args
            .serve_tmux
            .as_ref()
            .and_then(|_| std::env::var(relay_wrap::DOOR_KEY_ENV).ok()),
        // The relaying process tells the command that started it (`tmux_front`) how the
        // start goes, on its stdout.
        report_start: args.serve_tmux.is_some(),
        topics: args.subscribe.clone(),
    };
    match (backend, &args.serve_tmux) {
        (Backend::Pty, _) => {
            init_wrap_logging(&cfg, cfg.interactive && interactive_terminal);
            // Held for the wrapper's life: how `stop NAME` and `down --all` find it.
            let _lock = pty_lock(&cfg);
            let name = cfg.name.clone();
            let code = pty_runtime()?.block_on(relay_wrap::run_pty(cfg))?;
            // The agent's output was on this terminal; its status is said.
            agent_exited(&name, code, Vec::new())
        }
        (Backend::Tmux, Some(session)) => {
            init_wrap_logging(&cfg, true);
            let _lock = relay_lock(&cfg)?;
            let (name, team_dir) = (cfg.name.clone(), cfg.team_dir.clone());
            let served = runtime()?.block_on(relay_wrap::serve_tmux(cfg, session.clone()));
            // An agent that exited on its own: a spawned worker's parent is told.
            crate::cmd::spawn::report_exit(paths, &name, &team_dir);
            served.map_err(Into::into)
        }
        (Backend::Tmux, None) => tmux_front(paths, &args, &cfg, &profile_name),
    }
}

/// The PTY wrapper's runtime: one thread. Its loop, its relay connection's driver and the
/// PTY all wake on that thread's epoll, so a directive read from the agent's terminal goes out
/// on the socket, and a DELIVER read from it is typed into the terminal, without waking another
/// thread (issue 26 point 4; docs/PERFORMANCE.md). Only `wait` for the agent's exit uses the
/// blocking pool. (tmux's relaying process keeps the multi-threaded runtime: its control
/// client's commands block in place.)
fn pty_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn tmux_installed() -> bool {
    std::process::Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// tmux: start the agent's session (or find it running), make sure a background process
/// relays for it, then attach the person to it unless `--detached`.
fn tmux_front(
    paths: &Paths,
    args: &WrapArgs,
    cfg: &WrapConfig,
    profile: &str,
) -> anyhow::Result<i32> {
    if !tmux_installed() {
        anyhow::bail!(
            "--backend tmux needs tmux, which was not found (Debian/Ubuntu: apt install tmux; \
             macOS: brew install tmux), or use --backend pty"
        );
    }
    let session = tmux::session_name(&paths.project_root, &cfg.name);
    let name = &cfg.name;
    let created = !tmux::exists(&session);
    // The new session's door key: in its agent's environment (through the session's private
    // environment file) and in its relaying process's, never on a command line.
    let mut key = None;
    if !created {
        eprintln!("agent-relay: {name} is running in tmux session {session}; picking it up");
    } else {
        let (rows, cols) = relay_wrap::terminal_size();
        let cwd = std::env::current_dir().context("no working directory")?;
        let new = relay_wrap::new_door_key();
        tmux::create(&tmux::NewSession {
            name: &session,
            command: &cfg.command,
            env: &[
                ("AGENT_RELAY_NAME".to_owned(), name.clone()),
                (relay_wrap::DOOR_KEY_ENV.to_owned(), new.clone()),
            ],
            cwd: &cwd,
            rows,
            cols,
            team_dir: &cfg.team_dir,
        })?;
        key = Some(new);
        eprintln!("agent-relay: started {name} in tmux session {session}");
    }
    let relaying = ensure_relaying(
        paths,
        args,
        cfg,
        &session,
        profile,
        created && cfg.intro,
        key.as_deref(),
    )?;
    if relaying.is_none() {
        eprintln!("agent-relay: a process already relays for {name}; none started");
    }
    if args.detached || !std::io::stdin().is_terminal() {
        if let Some(child) = relaying {
            return wait_started(child, cfg, &session);
        }
        eprintln!("agent-relay: {name} runs detached; attach with: agent-relay attach {name}");
        return Ok(0);
    }
    say_how_to_leave(name);
    let status = tmux::attach_command(&session)
        .status()
        .context("cannot run tmux attach")?;
    if !tmux::exists(&session) {
        // The session ended while attached: the agent's status is what it ended with, and
        // what it printed last (tmux shows only `[exited]`) is said when it failed.
        let code = agent_exit_status(&cfg.team_dir.join("exit"), name, &session)?;
        if let Some(by) = tmux::stopped_by(&cfg.team_dir) {
            return Err(stopped_error(name, code, &by));
        }
        let lines = if code == 0 {
            Vec::new()
        } else {
            tmux::last_lines(&cfg.team_dir, SHOWN_LINES)
        };
        return agent_exited(name, code, lines);
    }
    if !status.success() {
        anyhow::bail!("tmux attach failed ({status})");
    }
    eprintln!(
        "agent-relay: detached; {name} keeps running and relaying. Back to it: agent-relay attach {name}"
    );
    Ok(0)
}

/// How many of a failed agent's last lines are shown.
const SHOWN_LINES: usize = 15;

/// How long `--detached` waits for the agent to connect and get past its start. An agent
/// that has printed nothing by then (a program that waits silently for input) is left
/// running, and said to be connected.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Agent `name` exited with `code`: success for 0; otherwise an error that says so, with
/// the agent's last `lines` (the command then exits with the agent's code).
fn agent_exited(name: &str, code: i32, lines: Vec<String>) -> anyhow::Result<i32> {
    if code == 0 {
        return Ok(0);
    }
    let message = with_lines(format!("{name} exited with status {code}"), &lines);
    Err(crate::exit::AgentExit { code, message }.into())
}

/// `message`, followed by the agent's last `lines` when there are any.
fn with_lines(mut message: String, lines: &[String]) -> String {
    if !lines.is_empty() {
        message.push_str("; its last lines:");
        for l in lines {
            message.push_str(&format!("\n  | {l}"));
        }
    }
    message
}

/// `--detached`: waits until the relaying process `child` says the agent is connected and
/// past its start (it printed and went quiet), or the agent or the relaying process ends
/// first, which is said with the agent's status and last lines (or the relaying process's
/// log) and a non-zero exit.
fn wait_started(
    mut child: std::process::Child,
    cfg: &WrapConfig,
    session: &str,
) -> anyhow::Result<i32> {
    use std::io::BufRead;
    let name = &cfg.name;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let Some(stdout) = child.stdout.take() else {
        anyhow::bail!("the relaying process's output was not kept");
    };
    // A thread reads the lines; the channel closes when the relaying process ends.
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            match line {
                Ok(l) => {
                    if tx.send(l).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reading the relaying process's output");
                    return;
                }
            }
        }
    });
    let deadline = relay_protocol::now_instant() + START_WAIT;
    let mut connected = false;
    loop {
        let left = deadline.saturating_duration_since(relay_protocol::now_instant());
        match rx.recv_timeout(left) {
            Ok(l) if l == "connected" => connected = true,
            Ok(l) if l == "started" => {
                eprintln!(
                    "agent-relay: {name} runs detached and is connected; attach with: agent-relay attach {name}"
                );
                return Ok(0);
            }
            Ok(other) => tracing::debug!(line = %other, "relaying process"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if connected => {
                eprintln!(
                    "agent-relay: {name} is connected and runs detached, but has printed nothing \
                     in {} s; see what it shows with: agent-relay attach {name}",
                    START_WAIT.as_secs()
                );
                return Ok(0);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => anyhow::bail!(
                "{name} did not connect to the relay within {} s; it runs in tmux session \
                 {session} (agent-relay attach {name}); the relaying process's log: {}",
                START_WAIT.as_secs(),
                cfg.team_dir.join("wrap.log").display()
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // The relaying process ended before the agent was past its start.
    let status = child.wait().context("waiting for the relaying process")?;
    let exit_file = cfg.team_dir.join("exit");
    if exit_file.exists() {
        let code = agent_exit_status(&exit_file, name, session)?;
        let lines = tmux::last_lines(&cfg.team_dir, SHOWN_LINES);
        if code == 0 {
            // It ended without error, but as an agent it did not start: not a success.
            return Err(crate::exit::AgentExit {
                code: 1,
                message: with_lines(
                    format!("{name} exited at once (status 0): it is not running"),
                    &lines,
                ),
            }
            .into());
        }
        return agent_exited(name, code, lines);
    }
    let log = cfg.team_dir.join("wrap.log");
    let tail = std::fs::read_to_string(&log)
        .map(|t| {
            let lines: Vec<&str> = t.lines().collect();
            let skip = lines.len().saturating_sub(5);
            lines[skip..]
                .iter()
                .map(|l| format!("  | {}", relay_protocol::text::one_line(l, 300)))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|e| format!("  (cannot read it: {e})"));
    anyhow::bail!(
        "the process relaying for {name} ended ({status}) before {name} {}; the end of its log \
         ({}):\n{tail}",
        if connected {
            "was past its start"
        } else {
            "connected"
        },
        log.display()
    )
}

/// The exit status of agent `name`, whose tmux session has ended: the number its session's
/// shell wrote to `exit_file` as the agent exited. Missing or not a number (the session was
/// killed, the file damaged), it is unknown, which is a failure, never a success.
fn agent_exit_status(exit_file: &Path, name: &str, session: &str) -> anyhow::Result<i32> {
    let why = match std::fs::read_to_string(exit_file) {
        Ok(text) => match text.trim().parse::<i32>() {
            Ok(code) => return Ok(code),
            Err(_) => format!(
                "{} holds {:?}, not a number",
                exit_file.display(),
                relay_protocol::text::one_line(&text, 40)
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            format!("{} was never written", exit_file.display())
        }
        Err(e) => format!("cannot read {}: {e}", exit_file.display()),
    };
    anyhow::bail!(
        "{name}'s tmux session {session} ended, but the agent's exit status is unknown ({why}): \
         the session or the tmux server was probably killed rather than the agent exiting. \
         Check what the agent did (its relay log: {}), then start it again with the same command.",
        exit_file.with_file_name("wrap.log").display()
    )
}

/// Creates `dir` (and missing parents) 0700, or makes an existing one 0700: the wrapper's
/// state under it (the inbox, injected ids, logs) holds message bodies, and the files in it are
/// created with the agent's umask, which the wrapper must not change (the agent inherits it).
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private (chmod 700)", dir.display()))?;
    }
    Ok(())
}

/// The relaying process's lock (`team/<name>/relay.lock`), if nobody holds it: whoever holds
/// it relays for the agent, one process at a time.
fn try_relay_lock(cfg: &WrapConfig) -> anyhow::Result<Option<std::fs::File>> {
    use rustix::fs::{FlockOperation, flock};
    std::fs::create_dir_all(&cfg.team_dir)?;
    let path = cfg.team_dir.join("relay.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Ok(flock(&file, FlockOperation::NonBlockingLockExclusive)
        .is_ok()
        .then_some(file))
}

/// The relaying process's lock, held for its life, with its pid written in.
fn relay_lock(cfg: &WrapConfig) -> anyhow::Result<std::fs::File> {
    use std::io::Write;
    let Some(mut file) = try_relay_lock(cfg)? else {
        anyhow::bail!(
            "another process already relays for {} (its pid is in {})",
            cfg.name,
            cfg.team_dir.join("relay.lock").display()
        );
    };
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

/// The PTY wrapper's lock (`team/<name>/pty.lock`) with its pid written in, by which `stop`
/// finds it. A second wrapper under the same name (the relay then refuses or replaces one of
/// them) runs without it: it is logged, not a reason to refuse to run the agent.
fn pty_lock(cfg: &WrapConfig) -> Option<std::fs::File> {
    use rustix::fs::{FlockOperation, flock};
    use std::io::Write;
    let path = cfg.team_dir.join(crate::cmd::stop::PTY_LOCK);
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open the wrapper's lock; `agent-relay stop` will not find this wrapper");
            return None;
        }
    };
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        tracing::warn!(path = %path.display(), "another wrapper of this name holds the lock; `agent-relay stop` finds that one");
        return None;
    }
    let mut f = file;
    if let Err(e) = f
        .set_len(0)
        .and_then(|()| writeln!(f, "{}", std::process::id()))
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the wrapper's pid");
    }
    Some(f)
}

/// Starts the process that relays for `session`, unless one runs: it holds an exclusive
/// lock on `team/<name>/relay.lock` for as long as it lives. The process started, if one
/// was: its stdout says how the start goes (see `WrapConfig::report_start`). `key`: the door
/// key of a session just created (a process started for a running session reads it from the
/// session).
fn ensure_relaying(
    paths: &Paths,
    args: &WrapArgs,
    cfg: &WrapConfig,
    session: &str,
    profile: &str,
    intro: bool,
    key: Option<&str>,
) -> anyhow::Result<Option<std::process::Child>> {
    // Free: nobody relays; released at once for the process started below to take.
    if try_relay_lock(cfg)?.is_none() {
        return Ok(None);
    }
    let log_path = cfg.team_dir.join("wrap.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let exe = std::env::current_exe().context("cannot find the agent-relay executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "wrap",
        "--backend",
        Backend::Tmux.as_str(),
        "--serve-tmux",
        session,
    ])
    .args(["-n", &cfg.name, "--profile", profile])
    .args(["--max-body", &args.max_body.to_string()])
    .args(["--delivery", args.delivery.as_str()]);
    if args.inbox {
        cmd.arg("--inbox");
    }
    for t in &args.subscribe {
        cmd.args(["--subscribe", t]);
    }
    if intro {
        cmd.arg("--intro");
    }
    // Never a key this process inherited (an agent that starts another one has its own).
    match key {
        Some(k) => cmd.env(relay_wrap::DOOR_KEY_ENV, k),
        None => cmd.env_remove(relay_wrap::DOOR_KEY_ENV),
    };
    cmd.arg("--")
        .args(&cfg.command)
        .env("AGENT_RELAY_SOCKET", &paths.socket)
        .env("AGENT_RELAY_DATA_DIR", &paths.data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal must not stop the relaying.
        .process_group(0)
        .spawn()
        .context("cannot start the relaying process")
        .map(Some)
}

/// `agent-relay attach NAME`.
pub(crate) fn attach(paths: &Paths, args: &AttachArgs) -> anyhow::Result<i32> {
    relay_protocol::validate_agent_name(&args.name)
        .map_err(|e| crate::exit::usage(format!("{:?}: {e}", args.name)))?;
    let session = tmux::session_name(&paths.project_root, &args.name);
    if !tmux::exists(&session) {
        if let Some(near) = nearest_tmux_agent(paths, &args.name) {
            return Err(crate::exit::not_found(format!(
                "no tmux agent {}; did you mean `agent-relay attach {near}`?",
                args.name
            )));
        }
        return Err(crate::exit::Coded {
            code: 4,
            message: format!(
                "no tmux session {session} for {}: start it with \
                 `agent-relay -n {} --backend tmux <cli>` (agents run with --backend pty live \
                 in their own terminal)",
                args.name, args.name
            ),
        }
        .into());
    }
    say_how_to_leave(&args.name);
    let status = tmux::attach_command(&session)
        .status()
        .context("cannot run tmux attach")?;
    if !tmux::exists(&session) {
        let team_dir = paths.data_dir.join("team").join(&args.name);
        if let Some(by) = tmux::stopped_by(&team_dir) {
            return Err(stopped_error(&args.name, 143, &by));
        }
    }
    Ok(status.code().unwrap_or(1))
}

/// Agent `name` was stopped by the command `by` while the person was attached (tmux showed
/// them only `[exited]`).
fn stopped_error(name: &str, code: i32, by: &str) -> anyhow::Error {
    crate::exit::AgentExit {
        code,
        message: format!(
            "{name} was stopped by {by}; its messages stay stored (start it again with the same command)"
        ),
    }
    .into()
}

/// Inside tmux the person's own client is switched to the agent's session
/// ([`tmux::attach_command`]): `Ctrl-b d` would detach that whole client, their own session
/// with it, so the way back is said first.
fn say_how_to_leave(name: &str) {
    if std::env::var_os("TMUX").is_some() {
        eprintln!(
            "agent-relay: switching this tmux client to {name}'s session; back to your own with \
             Ctrl-b L (not Ctrl-b d, which would detach your whole tmux client)"
        );
    }
}

/// The agent of this project running in tmux whose name is nearest to `name` (the same but
/// for case, or at most two letters apart), if any: `attach alice` for Alice.
fn nearest_tmux_agent(paths: &Paths, name: &str) -> Option<String> {
    let team = paths.data_dir.join("team");
    let entries = match std::fs::read_dir(&team) {
        Ok(d) => d,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(error = %e, "cannot list {}", team.display());
            }
            return None;
        }
    };
    let lower = name.to_lowercase();
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != name && relay_protocol::validate_agent_name(n).is_ok())
        .filter(|n| tmux::exists(&tmux::session_name(&paths.project_root, n)))
        .map(|n| (crate::cmd::edit_distance(&lower, &n.to_lowercase()), n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| n)
}

/// The person's terminal belongs to the agent: when it is in use (or there is no terminal:
/// a background relaying process), logs go to `<data>/team/<name>/wrap.log`; otherwise to
/// stderr.
fn init_wrap_logging(cfg: &WrapConfig, to_file: bool) {
    if !to_file {
        crate::cmd::init_logging("warn");
        return;
    }
    let _ = std::fs::create_dir_all(&cfg.team_dir);
    let path = cfg.team_dir.join("wrap.log");
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    else {
        return;
    };
    let filter = std::env::var("AGENT_RELAY_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::agent_exit_status;

    #[test]
    fn an_unknown_exit_status_is_a_failure_that_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("exit");
        let err = agent_exit_status(&file, "Dana", "p-Dana")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("exit status is unknown") && err.contains("never written"),
            "{err}"
        );
        std::fs::write(&file, "garbage\u{1b}]0;t\u{7}\n").unwrap();
        let err = agent_exit_status(&file, "Dana", "p-Dana")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not a number") && !err.contains('\u{1b}'),
            "{err}"
        );
        std::fs::write(&file, "7\n").unwrap();
        assert_eq!(agent_exit_status(&file, "Dana", "p-Dana").unwrap(), 7);
    }
}
