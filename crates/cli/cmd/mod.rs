//! One module per subcommand; `run` dispatches.

mod adapters;
mod bench;
pub(crate) mod claim;
mod config;
pub(crate) mod doctor;
pub(crate) mod hooks;
mod inbox;
mod mailbox;
pub(crate) mod mcp;
pub(crate) mod parse;
pub(crate) mod query;
pub(crate) mod rules;
pub(crate) mod send;
pub(crate) mod spawn;
pub(crate) mod stop;
pub(crate) mod teach;
pub(crate) mod team;
pub(crate) mod up;
mod watch;
mod wrap;

use std::path::Path;

use relay_client::paths::Paths;
use relay_client::{Client, ClientConfig};

use crate::args::{Cli, Cmd, Given};

/// Runs the parsed command line.
pub(crate) fn run(mut cli: Cli, given: &Given) -> anyhow::Result<()> {
    let mut paths = Paths::from_env()?;
    let chosen_socket = cli.socket.take();
    let explicit = chosen_socket.is_some() || std::env::var_os("AGENT_RELAY_SOCKET").is_some();
    if let Some(s) = chosen_socket {
        paths.socket = s;
    }
    dispatch(cli, &paths, given).map_err(|e| {
        // "Not running" from another folder of the same project is the usual surprise: say
        // which project this folder belongs to and how the root is chosen.
        if crate::exit::code_of(&e) != 3
            || explicit
            || e.downcast_ref::<crate::exit::AgentExit>().is_some()
        {
            return e;
        }
        crate::exit::not_running(format!(
            "{e:#}\n  project root: {} (the nearest folder holding .agent-relay, else the git top-level, else the nearest Cargo.toml/package.json/go.mod/pyproject.toml)",
            paths.project_root.display()
        ))
    })
}

fn dispatch(cli: Cli, paths: &Paths, given: &Given) -> anyhow::Result<()> {
    let paths = paths.clone();
    match cli.cmd {
        // The daemon builds its own runtime (it must daemonize before any threads exist).
        Cmd::Up(args) => up::up(&paths, &args, &given.up),
        Cmd::Down(args) => {
            if args.all {
                stop::stop_all(&paths, args.timeout)?;
            }
            up::down(&paths, &args)
        }
        Cmd::Stop(args) => stop::stop(&paths, &args),
        // Starts processes (the relay, the worker's wrapper) and waits for them.
        Cmd::Spawn(args) => spawn::spawn(&paths, &args),
        Cmd::Release(args) => spawn::release(&paths, &args),
        // Pure: no daemon, no runtime (reads the profile files).
        Cmd::Parse(args) => parse::run(&paths, &args),
        // Edits a file, or answers Claude Code's hook (its own small runtime).
        Cmd::Hooks(args) => hooks::run(&paths, &args),
        // Its own runtime; stdout is the MCP channel.
        Cmd::Mcp(args) => {
            init_logging("warn");
            mcp::run(&paths, &args)
        }
        // Generated from the command definitions: always what this binary accepts.
        Cmd::Completions(args) => {
            let mut cmd = crate::args::command();
            clap_complete::generate(args.shell, &mut cmd, "agent-relay", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man => {
            clap_mangen::Man::new(crate::args::command()).render(&mut std::io::stdout())?;
            Ok(())
        }
        // Reads the environment and a file; the daemon need not run.
        Cmd::Config(args) => config::run(&paths, args.json),
        // Files in the data directory, which the running dashboard reads.
        Cmd::Dashboard(args) => up::dashboard(&paths, &args),
        // Edits a file; the daemon need not run.
        Cmd::Rules(args) => rules::run(&paths, args),
        // Reads the state file the daemon keeps.
        Cmd::Adapters(args) => adapters::run(&paths, args.json),
        Cmd::Wrap(mut args) => {
            args.name = args.name.or(cli.name);
            args.backend = args.backend.or(cli.backend);
            args.detached |= cli.detached;
            args.no_teach |= cli.no_teach;
            args.intro |= cli.intro;
            args.delivery = cli.delivery.unwrap_or(args.delivery);
            args.subscribe.extend(cli.subscribe);
            exit_with(wrap::wrap(&paths, args, given.dashdash)?)
        }
        Cmd::Agent(command) => {
            // Checked before anything starts: a typo (`agent-relay statsu`) must not start a
            // relay and then fail to run a program of that name.
            check_agent_program(&command)?;
            let args = crate::args::WrapArgs {
                name: cli.name,
                backend: cli.backend,
                detached: cli.detached,
                profile: None,
                no_input: false,
                max_body: 2000,
                inbox: false,
                intro: cli.intro,
                no_teach: cli.no_teach,
                delivery: cli.delivery.unwrap_or(crate::args::Delivery::Each),
                serve_tmux: None,
                subscribe: cli.subscribe,
                command,
            };
            exit_with(wrap::wrap(&paths, args, given.dashdash)?)
        }
        Cmd::Attach(args) => exit_with(wrap::attach(&paths, &args)?),
        Cmd::BenchAgent(args) => bench::wrap::agent(&args),
        Cmd::Bench(args) if args.wrap.is_some() => bench::wrap::run(&args),
        cmd => {
            init_logging("warn");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                match cmd {
                    Cmd::Status(a) => query::status(&paths, a.json).await,
                    Cmd::Agents(a) => match a.action {
                        Some(crate::args::AgentsAction::Forget { name }) => {
                            stop::forget(&paths, &name).await
                        }
                        Some(crate::args::AgentsAction::List) | None => {
                            query::agents(&paths, a.json).await
                        }
                    },
                    Cmd::Read(a) => query::read(&paths, &a).await,
                    Cmd::History(a) => query::history(&paths, &a).await,
                    Cmd::Trace(a) => query::trace(&paths, &a).await,
                    Cmd::Dlq(a) => query::dlq(&paths, a).await,
                    Cmd::Chain(a) => query::chain(&paths, a).await,
                    Cmd::Claim(a) => claim::claim(&paths, &a).await,
                    Cmd::Send(a) => send::send(&paths, a).await,
                    Cmd::Inbox(a) => inbox::inbox(&paths, &a).await,
                    Cmd::Reply(a) => inbox::reply(&paths, a).await,
                    Cmd::Bench(a) => bench::bench(&paths, a).await,
                    Cmd::Watch(a) => watch::watch(&paths, &a).await,
                    Cmd::Wait(a) => team::wait(&paths, &a).await,
                    Cmd::Doctor(a) => doctor::doctor(&paths, a.json).await,
                    Cmd::Up(_)
                    | Cmd::Down(_)
                    | Cmd::Stop(_)
                    | Cmd::Spawn(_)
                    | Cmd::Release(_)
                    | Cmd::Parse(_)
                    | Cmd::Mcp(_)
                    | Cmd::Hooks(_)
                    | Cmd::Rules(_)
                    | Cmd::Adapters(_)
                    | Cmd::Config(_)
                    | Cmd::Dashboard(_)
                    | Cmd::Wrap(_)
                    | Cmd::Agent(_)
                    | Cmd::Attach(_)
                    | Cmd::BenchAgent(_)
                    | Cmd::Completions(_)
                    | Cmd::Man => Ok(()),
                }
            })
        }
    }
}

/// The wrapped agent's exit code becomes ours (what it means was said already, if anything).
fn exit_with(code: i32) -> anyhow::Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(crate::exit::AgentExit {
            code,
            message: String::new(),
        }
        .into())
    }
}

/// Logging to stderr; `AGENT_RELAY_LOG` (or `RUST_LOG`) overrides the level, and
/// `AGENT_RELAY_DEBUG=1` turns on debug output.
pub(crate) fn init_logging(default: &str) {
    let filter = std::env::var("AGENT_RELAY_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| {
            if std::env::var("AGENT_RELAY_DEBUG").is_ok_and(|v| v == "1" || v == "true") {
                "debug".into()
            } else {
                default.into()
            }
        });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// A short-lived tool connection for queries and sends.
pub(crate) async fn tool_client(socket: &Path, name: &str) -> anyhow::Result<Client> {
    Ok(Client::connect(ClientConfig::tool(socket.to_path_buf(), name)).await?)
}

/// Fails with exit 2 when `command`'s program is neither a path that exists nor a program on
/// `PATH`, suggesting the nearest subcommand when there is a close one.
fn check_agent_program(command: &[String]) -> anyhow::Result<()> {
    let Some(program) = command.first() else {
        return Err(crate::exit::usage(
            "no command given: `agent-relay -n NAME <cli> [args]` runs an agent, `agent-relay --help` lists the commands",
        ));
    };
    if program.contains('/') {
        if std::path::Path::new(program).exists() {
            return Ok(());
        }
        return Err(crate::exit::usage(format!(
            "{} does not exist",
            relay_protocol::text::one_line(program, 200)
        )));
    }
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program)))
    });
    if on_path {
        return Ok(());
    }
    let shown = relay_protocol::text::one_line(program, 80);
    let hint = nearest_subcommand(program)
        .map(|s| format!("; did you mean `agent-relay {s}`?"))
        .unwrap_or_else(|| {
            "; `agent-relay --help` lists the commands, and an agent CLI must be installed and on PATH".into()
        });
    Err(crate::exit::usage(format!(
        "`{shown}` is neither an agent-relay command nor a program on PATH; nothing was started{hint}"
    )))
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The visible subcommand closest to `word` (edit distance at most a third of its length,
/// and at least 1), if any.
fn nearest_subcommand(word: &str) -> Option<String> {
    let cmd = crate::args::command();
    let limit = (word.chars().count() / 3).max(1);
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| (edit_distance(word, s.get_name()), s.get_name().to_owned()))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, name)| name)
}

/// Levenshtein distance, by characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            prev = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_suggest_a_subcommand() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(nearest_subcommand("statsu").as_deref(), Some("status"));
        assert_eq!(nearest_subcommand("hsitory").as_deref(), Some("history"));
        assert_eq!(nearest_subcommand("claude"), None);
    }
}
