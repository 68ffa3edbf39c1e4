//! The reference agent: the daemon an operator runs on every machine, and the client half
//! of the update.
//!
//! It registers with an update-server under the version directive, heartbeats, and when
//! refused downloads, verifies and hands the server's bundle to the updater. It owns
//! `data/` (identity, outbox, downloads, bad versions) and `run/health.json`; it never
//! modifies `versions/` or `current` (that is the updater's job) and never runs a byte it
//! has not verified.
//!
//! It also runs the operator's program, the workload ([`workload`], the `agent-workload`
//! crate): it starts it, restarts it, checks its health and stops it, and owns
//! `logs/workload.log` and `run/workload.pid`.

pub mod cli;
pub mod commands;
pub mod config;
pub mod contact;
pub mod daemon;
pub mod error;
pub mod os;
pub mod remote_config;
pub mod sleep;
pub mod state;
pub mod telemetry;
pub mod uninstall;
pub mod update;
// The workload supervisor is its own crate; its modules keep their paths here.
pub use agent_workload as workload;

pub use error::{AgentError, Result};
