//! `agent-bundle rotate-key`: trust handed from one signing key to the next.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::Result;
use crate::{keygen, pack};

/// Hand trust from the current signing key to a new one: writes
/// DIR/rotation-<new key id>.minisig (NEW.pub signed by OLD.key) and a copy of NEW.pub.
///
/// Pack the next bundles with the new key and `--rotation DIR/rotation-<id>.minisig`;
/// agents that trust the old key follow it and then trust only the new one. Check a
/// statement by hand with
/// `minisign -Vm DIR/rotation-<id>.pub -x DIR/rotation-<id>.minisig -p OLD.pub`.
#[derive(Debug, clap::Args)]
pub struct RotateKey {
    /// The current (old) secret key.
    #[arg(long, value_name = "OLD.key")]
    old: PathBuf,
    /// The new key's public half (from `agent-bundle keygen`).
    #[arg(long, value_name = "NEW.pub")]
    new: PathBuf,
    /// Directory to write the statement into.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

impl RotateKey {
    pub fn run(self) -> Result<ExitCode> {
        let RotateKey { old, new, out } = self;
        let files = keygen::rotate_key(&old, &new, &out, pack::now_secs())?;
        println!(
            "Wrote {} (key {} hands trust to key {}) and {}.",
            files.signature.display(),
            files.from,
            files.to,
            files.public.display()
        );
        println!(
            "Pack the next bundles with the new secret key and --rotation {}.",
            files.signature.display()
        );
        println!(
            "Check it by hand with: minisign -Vm {} -x {} -p <old update.pub>",
            files.public.display(),
            files.signature.display()
        );
        Ok(ExitCode::SUCCESS)
    }
}
