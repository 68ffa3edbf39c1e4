//! update-server: the HTTP edge of the fleet, put together. It serves the native
//! interface ([`server_core::routes`]), OpAMP ([`opamp`]) and the fleet page ([`web`])
//! over one state, through the transport ([`server_transport`]), and holds the command
//! line ([`cli`]): the admin client's subcommands and `serve`.
//!
//! The fleet's state and every decision about it live in the fleet model
//! ([`agent_fleet`]), the releases and bundles in the release model
//! ([`agent_releases`]), the server's state and actions in [`server_core`]; this crate
//! only assembles and starts them.

pub mod cli;
mod serve;

// The parts, under the paths they have always had here.
pub use server_core::{
    AppState, Config, ConfigSource, ROLLOUT_INTERVAL, SCAN_INTERVAL, SPOOL_FILE, ServerError,
    actions, background, build_state, config, deltas, error, governance, maintenance, metrics,
    panics, refusal, releases, reload, routes, served, signals, state, store, transport,
};
pub use server_opamp as opamp;
pub use server_web as web;

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

pub use serve::{HOME_LOCK, HomeLock, LISTEN_BACKLOG, page_options, serve, shutdown_signal};
