//! `agent-bundle sign`: bundles signed again, today, their bytes unchanged.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::{BundleError, Result};
use crate::{keygen, pack};

/// Sign bundles again, today (signed-at now), leaving their bytes as they are: the
/// way back to a release the fleet ran before (agents refuse an older signature).
#[derive(Debug, clap::Args)]
pub struct Sign {
    /// The secret key (update.key).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// The bundles; each gets a fresh FILE.minisig beside it. A release's MSI
    /// (agent-<version>-<target>.msi) is signed for the bundle beside it.
    #[arg(required = true, value_name = "FILE")]
    bundles: Vec<PathBuf>,
}

impl Sign {
    pub fn run(self) -> Result<ExitCode> {
        let Sign { key, bundles } = self;
        let key = keygen::read_secret_key(&key)?;
        let now = pack::now_secs();
        // A glob over a release directory takes its signatures too
        // (`agent-bundle-2.2.0*`): they are what this writes, not bundles.
        let (signatures, bundles): (Vec<PathBuf>, Vec<PathBuf>) = bundles
            .into_iter()
            .partition(|b| b.extension().is_some_and(|e| e == "minisig"));
        for s in &signatures {
            println!("Skipped {}: a signature, not a bundle", s.display());
        }
        if bundles.is_empty() {
            return Err(BundleError::Invalid(
            "no bundle to sign: only signatures were given; name the agent-bundle-<version>… files".into(),
        ));
        }
        for bundle in &bundles {
            let signed = crate::sign::sign(bundle, &key, now)?;
            println!(
                "Signed {} again ({} for {}, sha256 {}, signed-at {now}): {}",
                bundle.display(),
                signed.claim.version,
                signed.claim.platform,
                signed.claim.sha256,
                signed.signature.display()
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
