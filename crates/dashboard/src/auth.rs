//! The dashboard's access token: how it is made, found in a request, and compared.
//!
//! The dashboard listens on loopback only, but every local user can reach loopback ports, and
//! the page shows what agents say to each other. So every request must carry the token the
//! daemon printed (in `?token=` or an `Authorization: Bearer` header), and it is compared in
//! constant time so its bytes cannot be guessed one by one from response times.

/// A new random token: 128 bits as 32 hex digits.
pub fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
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

#[cfg(test)]
mod tests {
    use super::*;

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
