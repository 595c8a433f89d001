//! `agent-relay wrap` and `agent-relay [-n NAME] <cli> [args]`: run an agent under the relay.

use std::time::Duration;

use anyhow::Context;
use relay_client::paths::Paths;
use relay_parse::Profile;
use relay_wrap::WrapConfig;
use relay_wrap::inject::Timing;

use crate::args::{StorageKind, UpArgs, WrapArgs};
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

/// Runs the agent; returns its exit code.
pub(crate) fn wrap(paths: &Paths, args: WrapArgs) -> anyhow::Result<i32> {
    let name = match args.name {
        Some(n) => {
            relay_protocol::validate_agent_name(&n)
                .map_err(|e| anyhow::anyhow!("-n {n:?}: {e}"))?;
            n
        }
        None => {
            let n = generated_name();
            eprintln!("agent-relay: this agent is {n} (choose a name with -n NAME)");
            n
        }
    };
    let program = args.command.first().context("no agent command given")?;
    let profile = match &args.profile {
        Some(p) => Profile::by_name(p).with_context(|| {
            format!(
                "unknown profile {p:?}; known: {}",
                Profile::NAMES.join(", ")
            )
        })?,
        None => Profile::for_command(program),
    };
    // The relay starts if it is not running, as `agent-relay up` would.
    let storage = match std::env::var("AGENT_RELAY_STORAGE_TYPE").as_deref() {
        Ok("memory") => StorageKind::Memory,
        _ => StorageKind::Sqlite,
    };
    let up = UpArgs {
        foreground: false,
        storage,
        inbox_ttl: 3600,
        heartbeat_ms: 5000,
        busy_high_water: 10_000,
        dashboard_port: None,
        no_dashboard: false,
        json: false,
    };
    start_background(paths, &up).context("cannot start the relay")?;
    let cfg = WrapConfig {
        name,
        command: args.command,
        profile,
        socket: paths.socket.clone(),
        timing: Timing {
            quiet: Duration::from_millis(500),
            enter_delay: Duration::from_millis(100),
        },
        settle_after: Duration::from_millis(400),
        max_body: args.max_body.max(1),
        interactive: !args.no_input,
    };
    init_wrap_logging(paths, &cfg);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(relay_wrap::run(cfg))?)
}

/// The person's terminal belongs to the agent: when it is in use, logs go to
/// `<data>/wrap-<name>.log`; otherwise to stderr.
fn init_wrap_logging(paths: &Paths, cfg: &WrapConfig) {
    let interactive = cfg.interactive && std::io::IsTerminal::is_terminal(&std::io::stdin());
    if !interactive {
        crate::cmd::init_logging("warn");
        return;
    }
    let path = paths.data_dir.join(format!("wrap-{}.log", cfg.name));
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
