//! Black-box tests of the `agent-relay` binary: a real daemon process, its real Unix socket and
//! SQLite file, spoken to with raw frames, the client crate, and the CLI.
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly on purpose")]

pub(crate) mod ackfalse;
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
pub(crate) mod safety;
mod shells;
mod support;
mod team;
mod tmux;
mod topics;
mod trust;
mod watch;
mod wrap;
