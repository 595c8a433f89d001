//! The per-connection state machine, as a pure core: it is told what arrived and what time it
//! is, and answers what the connection shell must do. No I/O here, so every transition is unit
//! tested with made-up clocks.
//!
//! ```text
//! CONNECTING ──accept──▶ HANDSHAKING ──HELLO ok / WELCOME──▶ ACTIVE ──BYE/error──▶ CLOSING ──▶ CLOSED
//!                             │ bad first frame, timeout                              ▲
//!                             └───────────────────────────────────────────────────────┘
//! ```

use std::time::{Duration, Instant};

use relay_protocol::{ErrorCode, Hello, MessageType, validate_agent_name};

/// Connection states (the seed's section 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Accepted; waiting for HELLO.
    Handshaking,
    /// HELLO accepted and WELCOME sent.
    Active,
    /// BYE or a fatal error; flushing and closing.
    Closing,
}

/// Timing settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// PING interval.
    pub(crate) heartbeat: Duration,
    /// Silence after which the peer is declared dead.
    pub(crate) timeout: Duration,
    /// How long a new connection may take to say HELLO.
    pub(crate) handshake: Duration,
}

/// What the shell must do about an incoming frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Process it.
    Accept,
    /// Answer with this error and close.
    Fatal(ErrorCode, String),
}

/// What the shell must do on a timer tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Nothing.
    Idle,
    /// Send a PING.
    Ping,
    /// Declare the connection dead with this error.
    Expired(ErrorCode, String),
}

/// One connection's protocol state.
#[derive(Debug)]
pub(crate) struct Session {
    state: State,
    timing: Timing,
    opened: Instant,
    last_heard: Instant,
    last_ping: Instant,
    /// A federation link's connection: a HELLO once active takes one more name.
    link: bool,
}

impl Session {
    /// A freshly accepted connection.
    pub(crate) fn new(timing: Timing, now: Instant) -> Self {
        Self {
            state: State::Handshaking,
            timing,
            opened: now,
            last_heard: now,
            last_ping: now,
            link: false,
        }
    }

    /// Current state.
    #[cfg(test)]
    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// A frame of type `ty` arrived at `now`.
    pub(crate) fn on_frame(&mut self, ty: MessageType, now: Instant) -> Verdict {
        self.last_heard = now;
        match (self.state, ty) {
            (State::Handshaking, MessageType::Hello) => Verdict::Accept,
            (State::Handshaking, other) => Verdict::Fatal(
                ErrorCode::BadState,
                format!(
                    "{} before HELLO: the first frame on a connection must be HELLO",
                    other.as_str()
                ),
            ),
            (State::Active, MessageType::Hello) if self.link => Verdict::Accept,
            (State::Active, MessageType::Hello) => {
                Verdict::Fatal(ErrorCode::BadState, "HELLO on an active connection".into())
            }
            (
                State::Active,
                MessageType::Welcome
                | MessageType::Deliver
                | MessageType::Result
                | MessageType::Busy,
            ) => Verdict::Fatal(
                ErrorCode::BadState,
                format!("{} is sent by the daemon, not to it", ty.as_str()),
            ),
            (State::Active, MessageType::Bye) => {
                self.state = State::Closing;
                Verdict::Accept
            }
            (State::Active, _) => Verdict::Accept,
            (State::Closing, _) => Verdict::Fatal(ErrorCode::BadState, "frame after BYE".into()),
        }
    }

    /// A frame the shell handles itself arrived at `now` (a link's BYE for one of its names,
    /// which ends that name's session, not the connection): the peer is alive.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// Validates a HELLO's content.
    pub(crate) fn check_hello(&self, hello: &Hello) -> Verdict {
        match validate_agent_name(&hello.agent) {
            Ok(()) => Verdict::Accept,
            Err(e) => Verdict::Fatal(ErrorCode::BadName, format!("invalid agent name: {e}")),
        }
    }

    /// The daemon accepted the HELLO and queued WELCOME.
    pub(crate) fn activate(&mut self) {
        if self.state == State::Handshaking {
            self.state = State::Active;
        }
    }

    /// The daemon accepted the HELLO of a federation link ([`relay_protocol::Role::Link`]):
    /// each further HELLO takes one more name on this connection.
    pub(crate) fn activate_link(&mut self) {
        self.activate();
        self.link = true;
    }

    /// The connection is closing (fatal error sent, BYE, shutdown).
    pub(crate) fn close(&mut self) {
        self.state = State::Closing;
    }

    /// When [`Session::on_tick`] next has something to do: the handshake deadline, or the
    /// next PING (the heartbeat timeout comes later); `None` once closing. A tick before it
    /// is harmless, so the shell may sleep until it and re-arm after each tick.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        match self.state {
            State::Handshaking => Some(self.opened + self.timing.handshake),
            State::Active => Some(
                (self.last_ping + self.timing.heartbeat).min(self.last_heard + self.timing.timeout),
            ),
            State::Closing => None,
        }
    }

    /// Timer tick at `now`.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Tick {
        match self.state {
            State::Handshaking if now.duration_since(self.opened) >= self.timing.handshake => {
                self.state = State::Closing;
                Tick::Expired(ErrorCode::BadState, "no HELLO received in time".into())
            }
            State::Active if now.duration_since(self.last_heard) >= self.timing.timeout => {
                self.state = State::Closing;
                Tick::Expired(
                    ErrorCode::HeartbeatTimeout,
                    format!(
                        "nothing received for {} ms (PING every {} ms): closing",
                        self.timing.timeout.as_millis(),
                        self.timing.heartbeat.as_millis()
                    ),
                )
            }
            State::Active if now.duration_since(self.last_ping) >= self.timing.heartbeat => {
                self.last_ping = now;
                Tick::Ping
            }
            _ => Tick::Idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            heartbeat: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
            handshake: Duration::from_secs(10),
        }
    }

    #[test]
    fn frames_before_hello_are_fatal() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        assert!(matches!(
            s.on_frame(MessageType::Send, t0),
            Verdict::Fatal(ErrorCode::BadState, _)
        ));
        let mut s = Session::new(timing(), t0);
        assert_eq!(s.on_frame(MessageType::Hello, t0), Verdict::Accept);
        s.activate();
        assert_eq!(s.state(), State::Active);
        assert!(matches!(
            s.on_frame(MessageType::Hello, t0),
            Verdict::Fatal(..)
        ));
    }

    #[test]
    fn a_link_takes_more_names_with_hello_and_any_other_connection_does_not() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        s.on_frame(MessageType::Hello, t0);
        s.activate_link();
        assert_eq!(s.on_frame(MessageType::Hello, t0), Verdict::Accept);
        assert_eq!(s.on_frame(MessageType::Hello, t0), Verdict::Accept);
        assert_eq!(s.state(), State::Active);
        // A BYE without a name still closes the link.
        assert_eq!(s.on_frame(MessageType::Bye, t0), Verdict::Accept);
        assert_eq!(s.state(), State::Closing);
    }

    #[test]
    fn next_due_is_the_handshake_deadline_then_each_ping() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(10)));
        s.on_frame(MessageType::Hello, t0);
        s.activate();
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(5)));
        // Nothing to do before it; at it, a PING, and the next one 5 s later.
        assert_eq!(s.on_tick(t0 + Duration::from_secs(4)), Tick::Idle);
        let t5 = t0 + Duration::from_secs(5);
        assert_eq!(s.on_tick(t5), Tick::Ping);
        assert_eq!(s.next_due(), Some(t5 + Duration::from_secs(5)));
        s.close();
        assert_eq!(s.next_due(), None);
    }

    #[test]
    fn client_may_not_send_daemon_types() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        s.on_frame(MessageType::Hello, t0);
        s.activate();
        for ty in [
            MessageType::Deliver,
            MessageType::Welcome,
            MessageType::Result,
            MessageType::Busy,
        ] {
            assert!(matches!(s.on_frame(ty, t0), Verdict::Fatal(..)), "{ty:?}");
        }
    }

    #[test]
    fn heartbeat_pings_then_times_out() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        s.on_frame(MessageType::Hello, t0);
        s.activate();
        assert_eq!(s.on_tick(t0 + Duration::from_secs(1)), Tick::Idle);
        assert_eq!(s.on_tick(t0 + Duration::from_secs(5)), Tick::Ping);
        assert_eq!(s.on_tick(t0 + Duration::from_secs(6)), Tick::Idle);
        // A PONG (any frame) keeps it alive.
        s.on_frame(MessageType::Pong, t0 + Duration::from_secs(9));
        assert_eq!(s.on_tick(t0 + Duration::from_secs(10)), Tick::Ping);
        assert!(matches!(
            s.on_tick(t0 + Duration::from_secs(24)),
            Tick::Expired(ErrorCode::HeartbeatTimeout, _)
        ));
        assert_eq!(s.state(), State::Closing);
    }

    #[test]
    fn handshake_timeout() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        assert_eq!(s.on_tick(t0 + Duration::from_secs(9)), Tick::Idle);
        assert!(matches!(
            s.on_tick(t0 + Duration::from_secs(10)),
            Tick::Expired(..)
        ));
    }

    #[test]
    fn bye_moves_to_closing() {
        let t0 = relay_protocol::now_instant();
        let mut s = Session::new(timing(), t0);
        s.on_frame(MessageType::Hello, t0);
        s.activate();
        assert_eq!(s.on_frame(MessageType::Bye, t0), Verdict::Accept);
        assert_eq!(s.state(), State::Closing);
        assert!(matches!(
            s.on_frame(MessageType::Send, t0),
            Verdict::Fatal(..)
        ));
    }

    #[test]
    fn bad_names_are_refused() {
        let s = Session::new(timing(), relay_protocol::now_instant());
        let mut hello = Hello {
            agent: "Al ice\u{1b}".into(),
            cli: None,
            capabilities: Default::default(),
            resume_token: None,
            role: Default::default(),
        };
        assert!(matches!(
            s.check_hello(&hello),
            Verdict::Fatal(ErrorCode::BadName, _)
        ));
        hello.agent = "Alice".into();
        assert_eq!(s.check_hello(&hello), Verdict::Accept);
    }
}
