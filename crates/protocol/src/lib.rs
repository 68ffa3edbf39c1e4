//! Shared formats of the agent distribution.
//!
//! Everything that more than one binary reads or writes is defined here exactly once:
//! the `VERSION+BUILD` identity and the version directive, `.properties` files, the
//! names inside a bundle and inside an installed agent, minisign keys and signatures,
//! the digests of a bundle, the JSON bodies exchanged with the server, and what its busy
//! answer asks of an agent.
//!
//! This crate does no I/O of its own beyond `Read`/`Write` values handed to it: it
//! never opens a file, a socket or a process, so every format can be tested in memory.

pub mod blame;
pub mod busy;
pub mod config_set;
pub mod credentials;
pub mod digest;
pub mod env_vars;
pub mod error;
pub mod journal;
pub mod labels;
pub mod layout;
pub mod minisign;
pub mod names;
pub mod platform;
pub mod properties;
pub mod rotation;
pub mod selector;
pub mod server_url;
pub mod settings;
pub mod shown;
pub mod version;
pub mod wire;

pub use error::Error;
pub use version::{AcceptPolicy, AgentVersion};
