//! How the server meets its clients, below HTTP's routes: the accept loop and its
//! connection limit with eviction ([`conn`]), held long polls ([`held`]), TLS and
//! its certificate reload ([`tls`]), the download limiter ([`limiter`]) and the
//! pacer that spaces held agents' turns ([`pacer`]). Nothing here knows the fleet.

pub mod conn;
pub mod held;
pub mod limiter;
pub mod pacer;
pub mod tls;
