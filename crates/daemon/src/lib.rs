//! The agent-relay daemon: accepts protocol-v1 connections on a Unix socket, stores every
//! message before routing it, and delivers it to each recipient exactly once per session,
//! replaying what was not acknowledged when a recipient comes back.
//!
//! Shape (after mini-redis `server::run`): [`run`] takes a bound listener, a store and a shutdown
//! future. Inside, three kinds of task:
//! - one task per connection (`conn.rs`), with the pure protocol state machine in `session.rs`;
//! - one router task (`router.rs`), the single owner of membership, subscriptions and
//!   per-recipient delivery windows, a thin shell around the pure routing core in
//!   `routing/` (the messages the tasks exchange are in `msg.rs`);
//! - one store thread (`store_actor.rs`), the single owner of the [`relay_store::Store`], which
//!   commits writes in groups.

mod clock;
mod conn;
pub mod fds;
mod feed;
pub mod limits;
mod msg;
mod router;
mod routing;
pub mod rules;
mod session;
mod store_actor;
mod unread;

use std::future::Future;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use relay_store::Store;
use tokio::net::UnixListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

pub use feed::{Answer, Counter, Counters, Handle, LiveAgent, Stopped, Subscription};

/// The defaults of the settings a person can change (`agent-relay up` options and the project
/// configuration file), defined here once: [`Config::new`] and the CLI's settings table
/// (`crates/cli/settings.rs`, which shows them in `up --help` and `agent-relay config`) both
/// read them.
pub mod defaults {
    use std::time::Duration;

    /// PING interval; a connection silent for three is closed. Long, because a peer that dies
    /// is seen at once by its socket closing: the PING only finds a peer that is alive but
    /// wedged (not reading its socket), which this notices within three minutes. At 5 s (the
    /// seed's figure) the PINGs of 10,000 idle agents cost 5 % of a core (docs/PERFORMANCE.md).
    pub const HEARTBEAT: Duration = Duration::from_secs(60);
    /// How long a queued message waits for an offline recipient.
    pub const INBOX_TTL: Duration = Duration::from_secs(3600);
    /// Messages waiting for one recipient before its senders are told BUSY.
    pub const BUSY_HIGH_WATER: u64 = 10_000;
    /// Most simultaneous connections.
    pub const MAX_CONNECTIONS: usize = 1024;
    /// Most replies in a chain.
    pub const MAX_HOPS: u32 = 10;
    /// Messages one sender may send per [`RATE_WINDOW`] (0: no limit).
    pub const RATE_LIMIT: u32 = 100;
    /// Messages one agent may send to one other per [`RATE_WINDOW`] (0: no limit).
    pub const PAIR_RATE_LIMIT: u32 = 30;
    /// The sliding window of both rate limits.
    pub const RATE_WINDOW: Duration = Duration::from_secs(60);
    /// Failure reports in a row that pause deliveries to an agent (0: never).
    pub const BREAKER_FAILURES: u32 = 3;
    /// How long a paused agent waits before one message is tried again.
    pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);
    /// Most spawned workers live at once per relay (issue 25).
    pub const MAX_SPAWNED: u32 = 8;
    /// Deepest spawn: 1 is a worker, 2 a worker's worker; one deeper is refused.
    pub const MAX_SPAWN_DEPTH: u32 = 2;
}

/// Daemon settings. [`Config::new`] gives the documented defaults ([`defaults`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// The socket path (reported by `status`).
    pub socket_path: PathBuf,
    /// Where to write `agents.json` on membership changes; `None` to skip.
    pub agents_file: Option<PathBuf>,
    /// PING interval (protocol: 5 s).
    pub heartbeat: Duration,
    /// Silence after which a connection is closed.
    pub heartbeat_timeout: Duration,
    /// Time a new connection has to send HELLO.
    pub handshake_timeout: Duration,
    /// Largest frame accepted.
    pub max_frame_bytes: usize,
    /// Largest message body accepted.
    pub max_body_bytes: usize,
    /// Frames queued per connection before it counts as not reading.
    pub outbound_queue: usize,
    /// Largest per-recipient window of unacknowledged DELIVERs.
    pub max_window: usize,
    /// Most simultaneous connections.
    pub max_connections: usize,
    /// How long a queued message waits for an offline recipient before it expires.
    pub inbox_ttl: Duration,
    /// How often expired messages are swept.
    pub sweep_interval: Duration,
    /// Messages waiting for one recipient before its senders are told BUSY.
    pub busy_high_water: u64,
    /// Most replies in a chain: a SEND answering a message (`in_reply_to`) has one hop more
    /// than it, and one over this is refused (`budget_exceeded`) and dead-lettered.
    pub max_hops: u32,
    /// Rate limits per sender and per pair.
    pub rates: limits::RateConfig,
    /// The access rules file, reloaded when it changes; `None`: everything is allowed.
    pub rules_file: Option<PathBuf>,
    /// Failure reports in a row from one recipient that open its circuit (0: never).
    pub breaker_failures: u32,
    /// How long an open circuit waits before trying one message (doubling while probes fail).
    pub breaker_cooldown: Duration,
    /// The federation link's state, kept by `relay-federation` when the relay was started
    /// with `--cluster`, shown by `status`.
    pub federation: Option<FederationCell>,
    /// This relay's node in a federation (`up --node`): access rules that name nodes
    /// (`Alice@laptop`) match this relay's own agents under it.
    pub node: Option<String>,
    /// The federation link, asked to add the legs on other nodes to a `trace` (it asks their
    /// links over NATS); `None` outside a federation.
    pub federation_trace: Option<TraceAsk>,
    /// The person's names: `human` and every declared `[people.NAME]`. They belong to the
    /// person's doors (the CLI, and the adapters and dashboard this process runs): no agent
    /// connection from another process takes them, they are known names for "did you mean",
    /// and a message to one is never "not connected yet".
    pub person_names: Vec<String>,
    /// Most spawned workers live at once; one more `spawn` is refused naming the limit.
    pub max_spawned: u32,
    /// Deepest spawn (a worker is 1, its worker 2); deeper is refused naming the limit.
    pub max_spawn_depth: u32,
}

/// The person's name when no other is declared (what `agent-relay send` signs with).
pub use relay_protocol::HUMAN;

/// A `trace` as this relay's store tells it, and where the federation link answers it with
/// the legs on other nodes added (or as it was, if it cannot).
pub type TraceAsk = tokio::sync::mpsc::Sender<(
    relay_protocol::query::TraceRecord,
    tokio::sync::oneshot::Sender<relay_protocol::query::TraceRecord>,
)>;

/// Where the federation link keeps its state for `status` to read (read only when asked).
pub type FederationCell = Arc<std::sync::Mutex<Option<relay_protocol::query::FederationStatus>>>;

impl Config {
    /// Defaults for a daemon listening on `socket_path`.
    pub fn new(socket_path: PathBuf) -> Self {
        let mut cfg = Self {
            socket_path,
            agents_file: None,
            heartbeat: defaults::HEARTBEAT,
            heartbeat_timeout: defaults::HEARTBEAT * 3,
            handshake_timeout: Duration::from_secs(10),
            max_frame_bytes: relay_protocol::MAX_FRAME_BYTES,
            max_body_bytes: 512 * 1024,
            outbound_queue: 8192,
            max_window: 1024,
            max_connections: defaults::MAX_CONNECTIONS,
            inbox_ttl: defaults::INBOX_TTL,
            sweep_interval: Duration::from_secs(30),
            busy_high_water: defaults::BUSY_HIGH_WATER,
            max_hops: defaults::MAX_HOPS,
            rates: limits::RateConfig::default(),
            rules_file: None,
            breaker_failures: defaults::BREAKER_FAILURES,
            breaker_cooldown: defaults::BREAKER_COOLDOWN,
            federation: None,
            node: None,
            federation_trace: None,
            person_names: vec![HUMAN.to_owned()],
            max_spawned: defaults::MAX_SPAWNED,
            max_spawn_depth: defaults::MAX_SPAWN_DEPTH,
        };
        cfg.set_inbox_ttl(defaults::INBOX_TTL);
        cfg
    }

    /// Sets the PING interval (at least 50 ms) and the silence that closes a connection:
    /// three intervals.
    pub fn set_heartbeat(&mut self, interval: Duration) {
        self.heartbeat = interval.max(Duration::from_millis(50));
        self.heartbeat_timeout = self.heartbeat * 3;
    }

    /// Sets the inbox TTL and sweeps often enough that a message outlives it by at most a
    /// quarter of it (between 100 ms and 30 s).
    pub fn set_inbox_ttl(&mut self, ttl: Duration) {
        self.inbox_ttl = ttl;
        self.sweep_interval = (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
    }
}

/// Daemon failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// Socket set-up failed.
    #[error("cannot listen on {path}: {reason}")]
    Listen {
        /// Socket path.
        path: PathBuf,
        /// What went wrong and what to do.
        reason: String,
    },
    /// Another daemon answers on the socket.
    #[error("a relay daemon is already running on {0}")]
    AlreadyRunning(PathBuf),
    /// The store failed at start-up.
    #[error(transparent)]
    Store(#[from] relay_store::StoreError),
    /// Thread or runtime failure.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Makes sure the socket's directory `dir` is safe to listen in. A missing one is created
/// (with its parents) private, mode 0700. An existing one is used as it is, never changed (it
/// may be `/tmp`, a home or a project directory): it must be a real directory, not a symlink,
/// owned by us or root, and no other user may replace a file in it — not writable by group or
/// others, or, like `/tmp`, with the sticky bit set. Anything else is refused, because someone
/// else could then put their socket in place of ours.
///
/// # Errors
/// [`DaemonError::Listen`] explaining the problem and what to do.
pub fn ensure_private_dir(dir: &Path) -> Result<(), DaemonError> {
    let err = |reason: String| DaemonError::Listen {
        path: dir.to_path_buf(),
        reason,
    };
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => {
            if meta.file_type().is_symlink() || !meta.is_dir() {
                return Err(err(
                    "exists and is not a plain directory (a symlink?); remove it".into(),
                ));
            }
            if meta.uid() != rustix::process::getuid().as_raw() && meta.uid() != 0 {
                return Err(err(
                    "is owned by another user; set AGENT_RELAY_SOCKET to a path of yours".into(),
                ));
            }
            // Writable by others without the sticky bit: they could rename or remove our
            // socket and put theirs in its place.
            if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
                return Err(err(format!(
                    "can be written by other users (mode {:o}), who could replace the socket;                      make it private (chmod go-w) or set AGENT_RELAY_SOCKET to a path in a                      private directory",
                    meta.mode() & 0o7777
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(format!("cannot create it: {e}"))),
        Err(e) => Err(err(e.to_string())),
    }
}

/// Binds the daemon's socket at `path`: the parent directory is checked first (created private
/// if missing, see [`ensure_private_dir`]), a stale socket left by a crash is removed (a live one is [`DaemonError::AlreadyRunning`]), and
/// the socket is set to 0600.
///
/// # Errors
/// [`DaemonError`] saying what to do.
pub fn bind(path: &Path) -> Result<UnixListener, DaemonError> {
    let listen_err = |reason: String| DaemonError::Listen {
        path: path.to_path_buf(),
        reason,
    };
    if path.as_os_str().len() > 100 {
        return Err(listen_err(
            "the path is too long for a Unix socket (about 100 bytes at most); set AGENT_RELAY_SOCKET to a shorter path".into(),
        ));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_private_dir(parent)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(listen_err(
                    "a file that is not a socket is in the way; remove it".into(),
                ));
            }
            if meta.uid() != rustix::process::getuid().as_raw() {
                return Err(listen_err(format!(
                    "another user's socket (uid {}) is at this path; set AGENT_RELAY_SOCKET to a \
                     path in a directory of yours",
                    meta.uid()
                )));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(DaemonError::AlreadyRunning(path.to_path_buf()));
            }
            std::fs::remove_file(path)
                .map_err(|e| listen_err(format!("cannot remove stale socket: {e}")))?;
            tracing::info!(path = %path.display(), "removed stale socket");
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_err(e.to_string())),
    }
    // The socket file takes its mode from the umask: 0177 while binding makes it 0600 from the
    // first instant (the directory may be a shared one such as /tmp). The umask is the
    // process's; a file another thread creates in that instant is made private too, which is
    // harmless. The chmod after it is a second guard.
    let umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(umask);
    let listener = bound.map_err(|e| listen_err(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| listen_err(format!("cannot set socket mode 0600: {e}")))?;
    Ok(listener)
}

/// Runs the daemon on `listener` until `shutdown` completes, then closes every connection
/// (BYE), lets the store commit what it was given, and returns.
///
/// # Errors
/// [`DaemonError`] if the store cannot be read at start-up or its thread cannot start.
pub async fn run(
    listener: UnixListener,
    store: Box<dyn Store>,
    config: Config,
    storage_kind: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_with(listener, store, config, storage_kind, shutdown, |_| {}).await
}

/// [`run`], handing `started` a [`Handle`] on the daemon once it is ready (the web dashboard
/// is started this way).
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    listener: UnixListener,
    mut store: Box<dyn Store>,
    config: Config,
    storage_kind: &str,
    shutdown: impl Future<Output = ()>,
    started: impl FnOnce(Handle),
) -> Result<(), DaemonError> {
    let cfg = Arc::new(config);
    let known = store.known_agents()?;
    let hops = store.recent_hops(router::HOPS_REMEMBERED)?;
    let untold = store.unnotified(100_000)?;
    let chains = store.chain_extensions()?;
    let spawned = store.spawned()?;
    let claims = store.claims()?;
    let location = store.location();
    let (store_tx, store_rx) = mpsc::channel(16 * 1024);
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let store_thread = store_actor::spawn(store, store_rx, events_tx)
        .map_err(|e| DaemonError::Internal(format!("cannot start store thread: {e}")))?;
    let (router_tx, router_rx) = mpsc::channel(16 * 1024);
    let stop = CancellationToken::new();
    let feed = feed::Feed::new();
    let mut router = router::Router::new(
        cfg.clone(),
        store_tx,
        known,
        hops,
        location,
        storage_kind.to_owned(),
        feed.clone(),
    );
    router.set_chains(chains);
    router.set_spawned(spawned);
    router.set_claims(claims);
    let router_task = tokio::spawn(router.run(router_rx, events_rx, stop.clone(), untold));
    started(Handle {
        feed,
        router: router_tx.clone(),
        stop: stop.clone(),
    });
    let uid = rustix::process::getuid().as_raw();
    let own_pid = i32::try_from(std::process::id()).ok();
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let mut next_id: u64 = 1;
    tokio::pin!(shutdown);
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Whether the peer is this process (the people adapters and the federation link
        // connect over the socket too): a person's names are theirs (`routing/names.rs`).
        let in_process = match stream.peer_cred() {
            Ok(cred) if cred.uid() == uid => own_pid.is_some() && cred.pid() == own_pid,
            other => {
                let peer = other.as_ref().map(|c| c.uid()).ok();
                tracing::warn!(?peer, "refusing connection from another user");
                tracker.spawn(refuse(
                    stream,
                    cfg.max_frame_bytes,
                    relay_protocol::ErrorCode::Forbidden,
                    "this relay belongs to another user".into(),
                ));
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(
                max = cfg.max_connections,
                "connection limit reached; refusing"
            );
            tracker.spawn(refuse(
                stream,
                cfg.max_frame_bytes,
                relay_protocol::ErrorCode::Internal,
                "too many connections; try again later".into(),
            ));
            continue;
        };
        let conn_id = next_id;
        next_id += 1;
        tracker.spawn(
            conn::serve(
                stream,
                conn_id,
                cfg.clone(),
                router_tx.clone(),
                stop.clone(),
                in_process,
            )
            .inspect_done(permit),
        );
    }
    tracing::info!("shutting down");
    stop.cancel();
    drop(router_tx);
    tracker.close();
    if tokio::time::timeout(Duration::from_secs(5), tracker.wait())
        .await
        .is_err()
    {
        // Connections still open are cut off with the process; what they held stays in the
        // store (unacknowledged deliveries are replayed on reconnect).
        tracing::warn!("connections did not close within 5 s of shutdown; stopping anyway");
    }
    if let Err(e) = router_task.await {
        tracing::error!(error = %e, "router task failed during shutdown");
    }
    // The router owned the last store sender; the store thread drains and exits.
    tokio::task::spawn_blocking(move || store_thread.join())
        .await
        .map_err(|e| DaemonError::Internal(e.to_string()))?
        .map_err(|_| DaemonError::Internal("store thread panicked".into()))?;
    if let Err(e) = std::fs::remove_file(&cfg.socket_path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(socket = %cfg.socket_path.display(), error = %e, "could not remove the socket file; the next start replaces it");
    }
    Ok(())
}

/// Tells a refused connection why, then closes it.
async fn refuse(
    stream: tokio::net::UnixStream,
    max: usize,
    code: relay_protocol::ErrorCode,
    message: String,
) {
    use tokio::io::AsyncWriteExt;
    let env = relay_protocol::Envelope::new(
        clock::frame_id(),
        clock::now_ms(),
        relay_protocol::Payload::Error(relay_protocol::ErrorPayload {
            code,
            message,
            fatal: true,
        }),
    );
    let mut buf = Vec::new();
    if relay_protocol::encode_frame(&env, &mut buf, max).is_ok() {
        let mut stream = stream;
        if let Err(e) = stream.write_all(&buf).await {
            tracing::debug!(error = %e, "could not tell a refused connection why");
        }
    }
}

/// Holds a value until the future completes.
trait InspectDone: Future + Sized {
    fn inspect_done<T: std::marker::Send>(self, keep: T) -> impl Future<Output = Self::Output> {
        async move {
            let out = self.await;
            drop(keep);
            out
        }
    }
}

impl<F: Future> InspectDone for F {}
