//! Webhook signatures, both ways (pure): `HMAC-SHA256(secret, "{timestamp}.{body}")` in hex,
//! sent as `X-Relay-Signature: sha256=<hex>` with `X-Relay-Timestamp: <Unix seconds>`.
//!
//! Signing the timestamp with the body is what makes replay protection possible: a request is
//! refused when its timestamp is further than the tolerance from now (an old request replayed
//! later), and a signature already accepted inside the tolerance is refused again (the same
//! request replayed at once), so each signed request is accepted at most once.

use std::collections::{BTreeMap, HashSet};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the Unix time (seconds) the request was signed at.
pub const TIMESTAMP_HEADER: &str = "x-relay-timestamp";
/// The header carrying `sha256=<hex>`.
pub const SIGNATURE_HEADER: &str = "x-relay-signature";

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A header is missing or not in the expected form.
    #[error("missing or malformed {0} header")]
    Malformed(&'static str),
    /// The signature does not match the body and timestamp under the shared secret.
    #[error("bad signature")]
    BadSignature,
    /// The timestamp is too far from now: an old request replayed, or a wrong clock.
    #[error("stale timestamp: {skew_s} s from now, more than the {tolerance_s} s allowed")]
    Stale {
        /// How far from now, in seconds.
        skew_s: u64,
        /// The tolerance.
        tolerance_s: u64,
    },
    /// This exact signed request was accepted before.
    #[error("replayed request: this signature was already accepted")]
    Replayed,
}

/// The hex signature of `body` signed at `ts` (Unix seconds).
pub fn sign(secret: &[u8], ts: u64, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(ts.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex(&mac.finalize().into_bytes())
}

/// The signature header's value for `body` at `ts`.
pub fn header_value(secret: &[u8], ts: u64, body: &[u8]) -> String {
    format!("sha256={}", sign(secret, ts, body))
}

fn mac(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable_mac(),
    }
}

#[cold]
fn unreachable_mac() -> Hmac<Sha256> {
    // InvalidLength is never returned for HMAC (any key length is valid); hash an empty key.
    <Hmac<Sha256> as hmac::digest::KeyInit>::new(&Default::default())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Stale lines the kept file may hold beyond twice what is remembered before it is rewritten.
/// Appending one line per accepted request keeps the common path to one small write; the
/// rewrite, now and then, keeps the file (and the next start's reading of it) bounded.
const COMPACT_SLACK: usize = 256;

/// How to keep an accepted signature across a restart: the file is appended to, and now and
/// then rewritten with only what is still remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// Append this line (`TIMESTAMP SIGNATURE\n`) to the kept file.
    Append(String),
    /// Replace the kept file with this text (stale lines dropped).
    Rewrite(String),
}

/// Checks inbound signatures and remembers the ones accepted (for replay refusal) for as
/// long as their timestamp is inside the tolerance.
#[derive(Debug)]
pub struct Verifier {
    secret: Vec<u8>,
    tolerance_s: u64,
    seen: HashSet<String>,
    /// Timestamp → signatures accepted with it, to forget them once stale.
    by_ts: BTreeMap<u64, Vec<String>>,
    /// Lines the kept file holds (what was loaded plus what was appended since), stale ones
    /// included: decides when [`Keep::Rewrite`] is due.
    file_lines: usize,
}

impl Verifier {
    /// A verifier for `secret`, accepting timestamps within `tolerance_s` of now.
    pub fn new(secret: Vec<u8>, tolerance_s: u64) -> Self {
        Self {
            secret,
            tolerance_s,
            seen: HashSet::new(),
            by_ts: BTreeMap::new(),
            file_lines: 0,
        }
    }

    /// Verifies a request (header values as received) at `now_s`; on success it is remembered,
    /// so the same request is refused if it comes again.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn verify(
        &mut self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_s: u64,
    ) -> Result<(), Refusal> {
        self.accept(timestamp, signature, body, now_s).map(drop)
    }

    /// [`Verifier::verify`], giving back the accepted timestamp and signature (hex).
    fn accept(
        &mut self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_s: u64,
    ) -> Result<(u64, String), Refusal> {
        let ts: u64 = timestamp
            .and_then(|t| t.trim().parse().ok())
            .ok_or(Refusal::Malformed(TIMESTAMP_HEADER))?;
        let given = signature
            .and_then(|s| s.trim().strip_prefix("sha256="))
            .and_then(unhex)
            .ok_or(Refusal::Malformed(SIGNATURE_HEADER))?;
        let mut mac = mac(&self.secret);
        mac.update(ts.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        // `verify_slice` compares in constant time.
        mac.verify_slice(&given)
            .map_err(|_| Refusal::BadSignature)?;
        let skew_s = now_s.abs_diff(ts);
        if skew_s > self.tolerance_s {
            return Err(Refusal::Stale {
                skew_s,
                tolerance_s: self.tolerance_s,
            });
        }
        self.forget_before(now_s.saturating_sub(self.tolerance_s));
        let key = hex(&given);
        if !self.seen.insert(key.clone()) {
            return Err(Refusal::Replayed);
        }
        self.by_ts.entry(ts).or_default().push(key.clone());
        Ok((ts, key))
    }

    /// [`Verifier::verify`], and how to keep what it accepted: one line appended to the kept
    /// file, or the file rewritten once it holds more than twice what is remembered (plus a
    /// slack), so that it stays bounded without being rewritten on every request.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn verify_and_keep(
        &mut self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_s: u64,
    ) -> Result<Keep, Refusal> {
        let (ts, sig) = self.accept(timestamp, signature, body, now_s)?;
        if self.file_lines + 1 > 2 * self.seen.len() + COMPACT_SLACK {
            self.file_lines = self.seen.len();
            return Ok(Keep::Rewrite(self.to_text()));
        }
        self.file_lines += 1;
        Ok(Keep::Append(format!("{ts} {sig}\n")))
    }

    /// Forgets signatures whose timestamps are before `oldest`: they are refused as stale now.
    fn forget_before(&mut self, oldest: u64) {
        let keep = self.by_ts.split_off(&oldest);
        for sigs in std::mem::replace(&mut self.by_ts, keep).into_values() {
            for s in sigs {
                self.seen.remove(&s);
            }
        }
    }

    /// Signatures remembered now.
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }

    /// What is remembered, as text to keep across a restart (one `TIMESTAMP SIGNATURE` a
    /// line): a request accepted before a restart must still be refused after it while its
    /// timestamp is inside the tolerance.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (ts, sigs) in &self.by_ts {
            for s in sigs {
                out.push_str(&format!("{ts} {s}\n"));
            }
        }
        out
    }

    /// Takes back what [`Verifier::to_text`] kept, forgetting what is stale at `now_s`; lines
    /// that are not in that form are skipped and counted.
    pub fn load_text(&mut self, text: &str, now_s: u64) -> usize {
        let mut skipped = 0;
        self.file_lines = text.lines().count();
        for line in text.lines() {
            let parsed = line
                .split_once(' ')
                .and_then(|(ts, sig)| Some((ts.parse::<u64>().ok()?, sig)))
                .filter(|(_, sig)| sig.len() == 64 && unhex(sig).is_some());
            match parsed {
                Some((ts, sig)) => {
                    if self.seen.insert(sig.to_owned()) {
                        self.by_ts.entry(ts).or_default().push(sig.to_owned());
                    }
                }
                None => skipped += 1,
            }
        }
        self.forget_before(now_s.saturating_sub(self.tolerance_s));
        skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4231_case_2() {
        // HMAC-SHA256 of "what do ya want for nothing?" with key "Jefe" (RFC 4231, 4.3).
        let mut m = mac(b"Jefe");
        m.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// One accepted request is one appended line; the kept file is rewritten only once it
    /// holds more than twice what is remembered plus the slack, so over a long run it stays
    /// bounded and what it holds after a rewrite loads back to the same refusals.
    #[test]
    fn accepted_signatures_are_appended_and_the_kept_file_stays_bounded() {
        let mut v = Verifier::new(b"s3cret".to_vec(), 30);
        let mut file = String::new();
        let (mut appends, mut rewrites) = (0, 0);
        for i in 0..5_000u64 {
            // Ten requests a second: about 300 are inside the tolerance at any time.
            let now = 1_000 + i / 10;
            let body = format!("request {i}");
            let sig = header_value(b"s3cret", now, body.as_bytes());
            match v.verify_and_keep(Some(&now.to_string()), Some(&sig), body.as_bytes(), now) {
                Ok(Keep::Append(line)) => {
                    assert_eq!(line, format!("{now} {}\n", &sig["sha256=".len()..]));
                    file.push_str(&line);
                    appends += 1;
                }
                Ok(Keep::Rewrite(text)) => {
                    file = text;
                    rewrites += 1;
                }
                Err(e) => panic!("request {i} refused: {e}"),
            }
            assert!(
                file.lines().count() <= 2 * v.remembered() + COMPACT_SLACK,
                "the kept file grew unbounded at request {i}"
            );
        }
        assert!(appends > 4_900, "{appends} appends, {rewrites} rewrites");
        assert!(rewrites >= 1, "never rewritten");
        // What the file holds refuses the same replays after a restart.
        let now = 1_000 + 4_999 / 10;
        let mut again = Verifier::new(b"s3cret".to_vec(), 30);
        assert_eq!(again.load_text(&file, now), 0);
        assert_eq!(again.remembered(), v.remembered());
        let body = "request 4999";
        let sig = header_value(b"s3cret", now, body.as_bytes());
        assert_eq!(
            again.verify(Some(&now.to_string()), Some(&sig), body.as_bytes(), now),
            Err(Refusal::Replayed)
        );
    }

    #[test]
    fn a_signed_request_is_accepted_once_and_only_while_fresh() {
        let mut v = Verifier::new(b"s3cret".to_vec(), 300);
        let body = br#"{"from":"human","to":"Alice","body":"hi"}"#;
        let sig = header_value(b"s3cret", 1000, body);
        assert_eq!(v.verify(Some("1000"), Some(&sig), body, 1010), Ok(()));
        assert_eq!(
            v.verify(Some("1000"), Some(&sig), body, 1011),
            Err(Refusal::Replayed)
        );
        let later = header_value(b"s3cret", 1000, b"other");
        assert!(matches!(
            v.verify(Some("1000"), Some(&later), b"other", 1400),
            Err(Refusal::Stale { skew_s: 400, .. })
        ));
        // Forgotten once stale: memory stays bounded.
        let fresh = header_value(b"s3cret", 1400, b"x");
        assert_eq!(v.verify(Some("1400"), Some(&fresh), b"x", 1400), Ok(()));
        assert_eq!(v.remembered(), 1);
    }

    #[test]
    fn what_was_seen_survives_a_restart_while_fresh() {
        let mut v = Verifier::new(b"s3cret".to_vec(), 300);
        let body = b"x";
        let sig = header_value(b"s3cret", 1000, body);
        assert_eq!(v.verify(Some("1000"), Some(&sig), body, 1000), Ok(()));
        let kept = v.to_text();
        let mut again = Verifier::new(b"s3cret".to_vec(), 300);
        assert_eq!(again.load_text(&format!("{kept}garbage\n"), 1100), 1);
        assert_eq!(
            again.verify(Some("1000"), Some(&sig), body, 1100),
            Err(Refusal::Replayed)
        );
        let mut late = Verifier::new(b"s3cret".to_vec(), 300);
        late.load_text(&kept, 2000);
        assert_eq!(late.remembered(), 0, "stale ones are forgotten");
    }

    #[test]
    fn forged_or_malformed_signatures_are_refused() {
        let mut v = Verifier::new(b"s3cret".to_vec(), 300);
        let forged = header_value(b"guess", 1000, b"x");
        assert_eq!(
            v.verify(Some("1000"), Some(&forged), b"x", 1000),
            Err(Refusal::BadSignature)
        );
        let good = header_value(b"s3cret", 1000, b"x");
        assert_eq!(
            v.verify(Some("1001"), Some(&good), b"x", 1000),
            Err(Refusal::BadSignature),
            "the timestamp is signed too"
        );
        assert_eq!(
            v.verify(None, Some(&good), b"x", 1000),
            Err(Refusal::Malformed(TIMESTAMP_HEADER))
        );
        assert_eq!(
            v.verify(Some("1000"), Some("md5=00"), b"x", 1000),
            Err(Refusal::Malformed(SIGNATURE_HEADER))
        );
    }
}
