//! `agent-bundle`: the stub executable at the front of every agent bundle.
//!
//! Run as a plain tool it makes keys (`keygen`), packs a distribution into a signed
//! bundle (`pack`), signs kept bundles again for a rollback (`sign`) and checks one
//! (`verify`). Run as `agent-bundle-<v>` with its zip payload
//! appended it installs the agent it carries (`--install`) or updates an installed agent
//! (`--update`, handed to the updater crate).
//!
//! It owns the bundle file format on the producing side. It must not touch an existing
//! agent's `conf/`, `data/` or `logs/` except through the updater, and it never writes
//! outside the prefix or output directory it was given.

pub mod cli;
pub mod commands;
pub mod error;
pub mod install;
pub mod keygen;
pub mod pack;
mod progress;
pub mod service;
pub mod shipped_key;
pub mod sign;

pub use error::{BundleError, Result};
