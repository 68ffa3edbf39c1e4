//! update-server: the HTTP edge of the fleet. It serves the fleet's release, answers
//! agents with the version directive, and gives operators the admin API, the page, the
//! metrics and the CLI; the fleet's state and every decision about it live in the fleet
//! model ([`agent_fleet`]), the releases and bundles in the release model
//! ([`agent_releases`]); this crate drives both.
//!
//! Its parts: the routes ([`routes`], [`opamp`], [`web`]) over one [`state`], the
//! operator actions every edge performs ([`actions`]), the transport ([`transport`]: the
//! accept loop, held long polls, TLS, the download limiter, the pacer), the server's
//! background work (the rollout loop, the release scan), starting and serving, and the
//! command line ([`cli`]). It must not touch the fleet database but through
//! [`agent_fleet`], nor decide a rollout step or a credentials verdict itself.

pub mod actions;
mod background;
pub mod cli;
pub mod config;
pub mod error;
pub mod governance;
pub mod maintenance;
pub mod metrics;
pub mod opamp;
pub mod panics;
pub mod reload;
pub mod routes;
mod serve;
pub mod signals;
mod startup;
pub mod state;
// The release and bundle model lives in its own crate (no HTTP); its modules keep
// their paths here.
pub use agent_releases::publish as releases;
pub use agent_releases::{deltas, refusal, store};
pub mod transport;
pub mod web;

pub use config::{Config, ConfigSource};
pub use error::ServerError;
pub use state::AppState;

/// Writes queued while the fleet database was away, under the server's home.
pub const SPOOL_FILE: &str = "spool.jsonl";

pub use agent_releases::{SCAN_INTERVAL, served};

/// The whole HTTP interface over one state: the native routes and OpAMP's, each edge
/// built on its own (neither imports the other), a tower `Router` tests drive without a
/// socket.
pub fn app(state: AppState) -> axum::Router {
    // OpAMP bodies have their own (larger) limit, checked again after gzip.
    let opamp = opamp::router().route_layer(axum::extract::DefaultBodyLimit::max(
        opamp::http::MAX_WIRE_BODY,
    ));
    routes::router(&state)
        .merge(opamp)
        .layer(axum::extract::DefaultBodyLimit::max(routes::MAX_BODY))
        .with_state(state)
}

pub use background::ROLLOUT_INTERVAL;
pub use serve::{HOME_LOCK, HomeLock, LISTEN_BACKLOG, page_options, serve, shutdown_signal};
pub use startup::build_state;
