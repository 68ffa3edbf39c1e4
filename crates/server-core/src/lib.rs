//! The update-server's core: the server's state over the fleet model ([`agent_fleet`])
//! and the release model ([`agent_releases`]), the operator actions every edge performs
//! ([`actions`]), the native HTTP interface agents and operators use ([`routes`]), the
//! server's configuration, metrics, background work (the rollout loop, the release
//! scan, governance), and starting its state ([`build_state`]).
//!
//! The other edges build on it: OpAMP (`server-opamp`), the fleet page (`server-web`);
//! the `update-server` crate puts them together, serves them over the transport
//! (`server-transport`) and holds the command line. This crate must not touch the fleet
//! database but through [`agent_fleet`], nor decide a rollout step or a credentials
//! verdict itself, and it knows neither the page nor OpAMP.

pub mod actions;
pub mod background;
pub mod config;
pub mod error;
pub mod governance;
pub mod maintenance;
pub mod metrics;
pub mod reload;
pub mod routes;
mod startup;
pub mod state;
// The transport is its own crate (no fleet, no routes); its modules keep their paths.
pub use server_transport::{self as transport, panics, signals};
// The release and bundle model lives in its own crate (no HTTP); its modules keep
// their paths here.
pub use agent_releases::publish as releases;
pub use agent_releases::{deltas, refusal, store};

pub use config::{Config, ConfigSource};
pub use error::ServerError;
pub use state::AppState;

/// Writes queued while the fleet database was away, under the server's home.
pub const SPOOL_FILE: &str = "spool.jsonl";

pub use agent_releases::{SCAN_INTERVAL, served};

pub use background::ROLLOUT_INTERVAL;
pub use startup::build_state;
