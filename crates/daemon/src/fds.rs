//! Open-descriptor limits. Every connection (Unix socket, dashboard, adapters' HTTP) costs a
//! descriptor, and all come from one per-process limit whose soft value is often 1,024: at
//! start the daemon raises it to what the system allows, and keeps the relay's socket a share
//! no other listener can take.

/// Descriptors kept for everything that is not a connection: the store's files, logs, the
/// adapters' outbound requests, the rules watcher, a tool's one-off files.
pub const RESERVE: u64 = 128;

/// The most the soft limit is raised to (a limit of millions buys nothing and some systems
/// refuse it).
const CEILING: u64 = 1 << 20;

/// Raises the soft limit of open descriptors to the hard limit (at most 2^20; on macOS at most
/// `OPEN_MAX`, 10,240, which is what the kernel accepts there). Returns the limit in force
/// afterwards, or, with the error, the one still in force when it could not be raised.
///
/// # Errors
/// The limit that stays in force and why it could not be raised.
pub fn raise_limit() -> Result<u64, (u64, std::io::Error)> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let current = now.current.unwrap_or(CEILING);
    let mut wanted = now.maximum.unwrap_or(CEILING).min(CEILING);
    if cfg!(target_os = "macos") {
        wanted = wanted.min(10_240);
    }
    if wanted <= current {
        return Ok(current);
    }
    match setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(wanted),
            maximum: now.maximum,
        },
    ) {
        Ok(()) => Ok(wanted),
        Err(e) => Err((current, e.into())),
    }
}

/// The most connections the relay's socket may hold under a descriptor `limit` when `others`
/// are kept for other listeners (the dashboard's cap): what is left after them and the
/// [`RESERVE`], at least 16.
#[must_use]
pub fn socket_share(limit: u64, others: u64) -> usize {
    let left = limit.saturating_sub(others + RESERVE).max(16);
    usize::try_from(left).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_keeps_what_the_other_listeners_and_the_reserve_leave() {
        assert_eq!(socket_share(1024, 128), 768);
        assert_eq!(socket_share(100, 128), 16);
    }
}
