//! One module per `agent-bundle` subcommand (and the bundle's `--install`): its
//! arguments and what it says; the work itself is the library's ([`crate::pack`],
//! [`crate::keygen`], [`crate::sign`], [`crate::install`], `agent_delta`).

pub mod apply_delta;
pub mod delta;
pub mod install;
pub mod keygen;
pub mod pack;
pub mod rotate_key;
pub mod sign;
pub mod verify;

use std::path::PathBuf;

use crate::error::{BundleError, Result};

/// This executable: a bundle's stub, or the tool itself.
pub(crate) fn this_exe() -> Result<PathBuf> {
    std::env::current_exe()
        .map_err(|e| BundleError::Invalid(format!("cannot find this executable: {e}")))
}
