//! Framing: `u32` big-endian length, then that many bytes of UTF-8 JSON.
//!
//! The length is checked against the limit *before* any buffer grows for the body, so a hostile
//! peer announcing a 4 GiB frame costs us four bytes, not four gigabytes.

use crate::Envelope;

/// The largest frame body (JSON bytes, excluding the 4-byte header) either side accepts: 1 MiB.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Framing errors. Both are fatal to the connection: once the length is untrustworthy the
/// stream has no boundaries left.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// The header announces more than the limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced or produced length.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// Serialization failed (cannot happen for our own types).
    #[error("could not serialize envelope: {0}")]
    Encode(String),
}

/// Length of the complete frame (header included) at the front of `buf`, if one is there;
/// `Ok(None)` when more bytes are needed. The result does not depend on how the stream was
/// split into reads.
///
/// Parse `&buf[4..n]` in place, then drop the frame with `buf.advance(n)`. (Splitting frames
/// off a `BytesMut` instead would make the read buffer shared and force a reallocation and
/// copy on the next read.)
///
/// # Errors
/// [`FrameError::TooLarge`] as soon as a header announces more than `max` bytes.
pub fn frame_len(buf: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok((buf.len() >= 4 + len).then_some(4 + len))
}

/// Appends one frame holding `env` to `out`.
///
/// Frames are built in a `Vec<u8>`: serde_json writes many small pieces, and `Vec`'s
/// `io::Write` is a plain inlined extend (a `BytesMut` writer cost several times more per piece
/// in the daemon's profile).
///
/// # Errors
/// [`FrameError::TooLarge`] if the JSON exceeds `max`; `out` is left as it was.
pub fn encode_frame(env: &Envelope, out: &mut Vec<u8>, max: usize) -> Result<(), FrameError> {
    encode_with(out, max, |w| env.write_json(w))
}

/// Appends one frame whose JSON is produced by `write`; used for borrowed encodings such as
/// [`Envelope::write_deliver_json`].
///
/// # Errors
/// [`FrameError::TooLarge`] if the JSON exceeds `max`; `out` is left as it was.
pub fn encode_with(
    out: &mut Vec<u8>,
    max: usize,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>,
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    if let Err(e) = write(out) {
        out.truncate(start);
        return Err(FrameError::Encode(e.to_string()));
    }
    let len = out.len() - start - 4;
    if len > max {
        out.truncate(start);
        return Err(FrameError::TooLarge { len, max });
    }
    // `len <= max`, and callers pass limits far below `u32::MAX`.
    out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}
