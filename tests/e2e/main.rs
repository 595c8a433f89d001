//! Black-box tests of the `agent-relay` binary: a real daemon process, its real Unix socket and
//! SQLite file, spoken to with raw frames, the client crate, and the CLI.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on purpose"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests read the wall clock (file times, log stamps) beside the relay's own"
)]

mod ackfalse;
mod afterfirst;
mod agents;
mod backends;
mod bounds;
mod chains;
mod claims;
mod cli;
mod client;
mod config;
mod crash;
mod daemon_core;
mod dashboard;
mod dashtoken;
mod digest;
mod doors;
mod faults;
mod federation;
mod firstrun;
mod hardening;
mod hookinstall;
mod identity;
mod names;
mod newcomer;
mod parse;
mod people;
mod protocol;
mod record;
mod safety;
mod shells;
mod spawn;
mod support;
mod team;
mod tmux;
mod topics;
mod trust;
mod watch;
mod wrap;
