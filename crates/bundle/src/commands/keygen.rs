//! `agent-bundle keygen`: a signing key pair.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::Result;
use crate::keygen;

/// Make a signing key pair: update.key (secret, keep offline) and update.pub.
#[derive(Debug, clap::Args)]
pub struct Keygen {
    /// Directory to write the keys into.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Overwrite existing key files.
    #[arg(long)]
    force: bool,
}

impl Keygen {
    pub fn run(self) -> Result<ExitCode> {
        let Keygen { out, force } = self;
        let keys = keygen::keygen(&out, force)?;
        println!(
            "Wrote {} (secret: keep it offline, never on the server) and {} (key id {}).",
            keys.secret.display(),
            keys.public.display(),
            keys.key_id
        );
        Ok(ExitCode::SUCCESS)
    }
}
