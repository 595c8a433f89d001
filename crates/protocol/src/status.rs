//! The state of one recipient's copy of a message, shared by the QUERY records
//! ([`crate::query`]) and the live feed ([`crate::events`]).

use serde::{Deserialize, Serialize};

/// Where one recipient's copy of a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Stored, not yet acknowledged by the recipient.
    Queued,
    /// The recipient acknowledged it (typed it into the agent's terminal).
    Acked,
    /// The recipient saw it on the agent's screen.
    Verified,
    /// The recipient reported it could not be handed over.
    Failed,
    /// Not delivered before its time to live ran out.
    Expired,
}

impl DeliveryStatus {
    /// Stable small integer used by stores.
    pub fn code(self) -> i64 {
        match self {
            Self::Queued => 0,
            Self::Acked => 1,
            Self::Verified => 2,
            Self::Failed => 3,
            Self::Expired => 4,
        }
    }

    /// Inverse of [`DeliveryStatus::code`].
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => Self::Queued,
            1 => Self::Acked,
            2 => Self::Verified,
            3 => Self::Failed,
            4 => Self::Expired,
            _ => return None,
        })
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Acked => "acked",
            Self::Verified => "verified",
            Self::Failed => "failed",
            Self::Expired => "expired",
        }
    }
}
