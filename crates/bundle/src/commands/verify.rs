//! `agent-bundle verify`: a bundle's signature, trusted comment and contents.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_extract::atomic;
use agent_extract::verify::{self, Verified};
use agent_protocol::minisign::Signature;

use crate::error::{BundleError, Result};
use crate::install;

/// Verify a bundle's signature, trusted comment and contents.
#[derive(Debug, clap::Args)]
pub struct Verify {
    /// The bundle file.
    bundle: PathBuf,
    /// The trusted public key.
    #[arg(long = "pub", value_name = "FILE")]
    public_key: PathBuf,
    /// The signature (default: BUNDLE.minisig).
    #[arg(long, value_name = "FILE")]
    sig: Option<PathBuf>,
}

impl Verify {
    pub fn run(self) -> Result<ExitCode> {
        let Verify {
            bundle,
            public_key,
            sig,
        } = self;
        Ok(report(&bundle, &public_key, sig.as_deref()))
    }
}

fn report(bundle: &Path, public_key: &Path, sig: Option<&Path>) -> ExitCode {
    let name = bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match verify_bundle(bundle, public_key, sig) {
        Ok(v) => {
            println!(
                "OK {name}: agent {} for {}, sha256 {}, signed by key {} at {} (unix seconds)",
                v.claim.version,
                v.claim.platform,
                v.claim.sha256,
                v.signature.key_id(),
                v.claim.signed_at
            );
            if let Some(chain) = &v.chain {
                println!("key rotation followed: {chain}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("FAILED {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn verify_bundle(bundle: &Path, public_key: &Path, sig: Option<&Path>) -> Result<Verified> {
    let key = install::read_public_key(public_key)?;
    let sig_path = sig
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("{}.minisig", bundle.display())));
    let text = atomic::read_text(&sig_path, 64 * 1024)?;
    let signature = Signature::parse(&text)
        .map_err(|e| BundleError::Invalid(format!("{}: {e}", sig_path.display())))?;
    Ok(verify::verify_file(
        bundle,
        &signature,
        &verify::Trust::key(&key),
    )?)
}
