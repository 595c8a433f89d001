//! Who may use the dashboard: its access token (how it is made, found in a request, and
//! compared), and the `Host` and `Origin` checks that keep other web pages out.
//!
//! The dashboard listens on loopback only, but every local user can reach loopback ports, and
//! the page shows what agents say to each other. So every request must carry the token the
//! daemon printed (in `?token=` or an `Authorization: Bearer` header), and it is compared in
//! constant time so its bytes cannot be guessed one by one from response times.

use std::path::{Path, PathBuf};

/// A new random token: 128 bits as 32 hex digits.
pub fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Whether `text` has a token's form (32 hex digits).
fn token_form(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The token kept in `path`, when the file holds one.
///
/// # Errors
/// The file cannot be read (missing is `Ok(None)`).
pub fn read_token(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_owned()).filter(|t| token_form(t))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes a new token to `path` (0600, replacing the old one at once) and returns it.
///
/// # Errors
/// The file cannot be written.
pub fn write_new_token(path: &Path) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let token = new_token();
    let tmp = path.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(token)
}

/// The project's dashboard token: the one kept in `path` (`<data>/dashboard.token`), or a new
/// one written there. The same token across restarts, so an open page and a bookmarked URL
/// keep working; `agent-relay dashboard --rotate-token` replaces it.
///
/// # Errors
/// The file cannot be read or written.
pub fn load_or_create(path: &Path) -> std::io::Result<String> {
    match read_token(path)? {
        Some(t) => Ok(t),
        None => write_new_token(path),
    }
}

/// The token requests must present, and the file it is kept in: a token rotated while the
/// dashboard runs (the file replaced) is taken up at the next request, and from then on the
/// old one is refused. Each request costs one `stat` of the file.
#[derive(Debug)]
pub struct Token {
    /// The token and the modification time of the file it was read from.
    current: std::sync::RwLock<(String, Option<std::time::SystemTime>)>,
    file: Option<PathBuf>,
}

impl Token {
    /// A token that never changes (tests, or no file).
    pub fn fixed(token: String) -> Self {
        Self {
            current: std::sync::RwLock::new((token, None)),
            file: None,
        }
    }

    /// `token`, as read from `file`, which is read again whenever it changes.
    pub fn kept_in(token: String, file: PathBuf) -> Self {
        let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok();
        Self {
            current: std::sync::RwLock::new((token, modified)),
            file: Some(file),
        }
    }

    /// The token now.
    pub fn value(&self) -> String {
        self.refresh();
        match self.current.read() {
            Ok(t) => t.0.clone(),
            Err(poisoned) => poisoned.into_inner().0.clone(),
        }
    }

    /// Whether `given` is the token now.
    pub fn accepts(&self, given: &str) -> bool {
        same_token(given.as_bytes(), self.value().as_bytes())
    }

    /// Reads the file again when it changed since it was last read.
    fn refresh(&self) {
        let Some(file) = &self.file else {
            return;
        };
        let modified = match std::fs::metadata(file).and_then(|m| m.modified()) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, path = %file.display(), "the dashboard token file");
                return;
            }
        };
        let seen = match self.current.read() {
            Ok(t) => t.1,
            Err(poisoned) => poisoned.into_inner().1,
        };
        if seen == Some(modified) {
            return;
        }
        match read_token(file) {
            Ok(Some(fresh)) => {
                let mut t = match self.current.write() {
                    Ok(t) => t,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *t = (fresh, Some(modified));
                tracing::info!("the dashboard token was replaced; the old one is refused");
            }
            Ok(None) => {
                tracing::warn!(path = %file.display(), "the dashboard token file holds no token; the one held is kept");
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %file.display(), "cannot read the dashboard token");
            }
        }
    }
}

/// Equal byte strings, taking the same time whatever the position of the first difference.
pub fn same_token(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    let diff = given
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    // Keep the comparison from being turned into an early exit.
    std::hint::black_box(diff) == 0
}

/// The token a request presents: the `token` query parameter, else a bearer token.
pub fn presented<'a>(query: Option<&'a str>, authorization: Option<&'a str>) -> Option<&'a str> {
    let from_query = query.and_then(|q| {
        q.split('&')
            .find_map(|pair| pair.strip_prefix("token="))
            .filter(|t| !t.is_empty())
    });
    from_query.or_else(|| {
        authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
    })
}

/// The names the dashboard answers to: its loopback address and `localhost`.
const OWN_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

/// Whether `authority` (`host[:port]`) is one of [`OWN_HOSTS`] with the dashboard's `port`.
/// A bare host counts only when the port is 80 (browsers leave out the default port).
fn own_authority(authority: &str, port: u16) -> bool {
    let (host, given_port) = match authority.rsplit_once(':') {
        // `[::1]` alone has colons but no port: its last colon is inside the brackets.
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (authority, None),
    };
    let port_ok = match given_port {
        Some(p) => p.parse::<u16>() == Ok(port) && !p.starts_with('+'),
        None => port == 80,
    };
    port_ok && OWN_HOSTS.iter().any(|own| host.eq_ignore_ascii_case(own))
}

/// Whether a request's `Host` is the dashboard itself: `127.0.0.1`, `localhost` or `[::1]`
/// with the dashboard's port. A DNS-rebinding attack makes a browser send the attacker's name
/// (`evil.example:3888`) to the loopback address, so answering only to our own names keeps
/// such a page from reading anything even if it somehow had the token.
#[must_use]
pub fn loopback_host(host: Option<&str>, port: u16) -> bool {
    host.is_some_and(|h| own_authority(h.trim(), port))
}

/// Whether a state-changing request may come from `origin`: none at all (a tool such as
/// curl), or the dashboard's own page (`http://` + one of its [`loopback_host`] names). Any other
/// page, and the opaque `null` origin, is refused: a request a foreign page makes the browser
/// send must not change anything.
#[must_use]
pub fn same_origin(origin: Option<&str>, port: u16) -> bool {
    let Some(origin) = origin.map(str::trim) else {
        return true;
    };
    let Some(scheme_end) = origin.find("://") else {
        return false;
    };
    origin[..scheme_end].eq_ignore_ascii_case("http") && {
        let authority = &origin[scheme_end + 3..];
        !authority.contains('/') && own_authority(authority, port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dashboards_own_host_and_port() {
        for ok in [
            "127.0.0.1:3888",
            "localhost:3888",
            "LOCALHOST:3888",
            "[::1]:3888",
        ] {
            assert!(loopback_host(Some(ok), 3888), "{ok}");
        }
        for bad in [
            "evil.example:3888",
            "127.0.0.1.evil.example:3888",
            "localhost.evil.example:3888",
            "127.0.0.1:3889",
            "127.0.0.1",
            "localhost",
            "[::1]",
            "127.0.0.1:+3888",
            "127.0.0.1:03888x",
            "evil@127.0.0.1:3888",
            "",
        ] {
            assert!(!loopback_host(Some(bad), 3888), "{bad}");
        }
        assert!(!loopback_host(None, 3888));
        // The default port may be left out, as browsers do.
        assert!(loopback_host(Some("localhost"), 80));
        assert!(loopback_host(Some("[::1]"), 80));
    }

    #[test]
    fn changes_only_from_the_dashboards_own_page_or_no_page() {
        assert!(same_origin(None, 3888));
        for ok in [
            "http://127.0.0.1:3888",
            "http://localhost:3888",
            "HTTP://[::1]:3888",
        ] {
            assert!(same_origin(Some(ok), 3888), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://evil.example:3888",
            "http://127.0.0.1:3889",
            "https://127.0.0.1:3888",
            "http://127.0.0.1",
            "http://127.0.0.1:3888/x",
            "null",
            "127.0.0.1:3888",
            "",
        ] {
            assert!(!same_origin(Some(bad), 3888), "{bad}");
        }
    }

    #[test]
    fn tokens_are_random_hex() {
        let a = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_token());
    }

    #[test]
    fn comparison() {
        assert!(same_token(b"abc", b"abc"));
        assert!(!same_token(b"abd", b"abc"));
        assert!(!same_token(b"ab", b"abc"));
        assert!(!same_token(b"", b"abc"));
    }

    #[test]
    fn token_from_query_or_header() {
        assert_eq!(presented(Some("a=1&token=xyz"), None), Some("xyz"));
        assert_eq!(presented(Some("token="), Some("Bearer k")), Some("k"));
        assert_eq!(presented(None, Some("Bearer  k ")), Some("k"));
        assert_eq!(presented(None, Some("Basic k")), None);
        assert_eq!(presented(Some("xtoken=1"), None), None);
    }
}
