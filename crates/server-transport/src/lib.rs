//! How update-server meets its clients, below HTTP's routes: the accept loop and its
//! connection limit with eviction ([`conn`]), held long polls ([`held`]), TLS and its
//! certificate reload ([`tls`]), the download limiter ([`limiter`]), the pacer that
//! spaces held agents' turns ([`pacer`]), the signals that stop or reload the server
//! ([`signals`]) and the panic guard every loop runs under ([`panics`]).
//!
//! It owns sockets, clocks and counters of connections; it must not know the fleet, the
//! releases or a route: the server hands it a router and reads its counters.

pub mod conn;
pub mod counters;
pub mod held;
pub mod limiter;
pub mod pacer;
pub mod panics;
pub mod signals;
pub mod tls;

pub use counters::ConnCounters;

/// A certificate or key that cannot serve, in words for the operator (what is wrong
/// with which file, and what to do).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);
