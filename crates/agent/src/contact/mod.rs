//! Reaching update-servers: the client and its directive, the proxy, when to ask
//! again (pacing, backoff), and the agent's identity.

pub mod backoff;
pub mod client;
pub mod identity;
pub mod pacing;
pub mod proxy;
pub mod rotation;
