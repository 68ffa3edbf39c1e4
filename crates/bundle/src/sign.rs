//! `agent-bundle sign --key K FILE…`: fresh signatures over bundles kept unchanged.
//!
//! Agents refuse a signature older than the one they run (no replayed downgrade), so a
//! way back to a release the fleet ran before is that release's very bytes signed
//! again, today. Each bundle's version and platform are read from the bundle itself,
//! its sha256 computed from its bytes; only the `.minisig` beside it is written.

use std::fs::File;
use std::path::{Path, PathBuf};

use agent_extract::atomic;
use agent_extract::payload::Payload;
use agent_protocol::digest::Digests;
use agent_protocol::layout;
use agent_protocol::minisign::{BundleClaim, SecretKey};

use crate::error::{IoContext, Result};

/// One bundle signed again.
#[derive(Debug)]
pub struct Signed {
    pub signature: PathBuf,
    pub claim: BundleClaim,
}

/// Writes `<bundle>.minisig` (replacing the old one) signed at `signed_at`. A release's
/// MSI (`agent-<version>-<target>.msi`) is signed the same way, with the version and
/// platform of the bundle it packs, which lies beside it as `build-dist.sh` wrote them:
/// the server takes it only into the release of that build.
pub fn sign(bundle: &Path, key: &SecretKey, signed_at: u64) -> Result<Signed> {
    let facts = Payload::open(&facts_from(bundle)?)?.facts()?;
    let digests = Digests::of_reader(File::open(bundle).at(bundle)?).at(bundle)?;
    let claim = BundleClaim {
        version: facts.version,
        platform: facts.platform,
        sha256: digests.sha256_hex(),
        signed_at,
    };
    let signature = key.sign_prehashed(&digests.blake2b, &claim.to_comment())?;
    let name = bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = bundle.with_file_name(layout::signature_file_name(&name));
    atomic::write_with_mode(&path, signature.to_file_string().as_bytes(), Some(0o644))?;
    Ok(Signed {
        signature: path,
        claim,
    })
}

/// The file whose facts a signature of `file` claims: itself, or for an MSI the bundle
/// beside it.
fn facts_from(file: &Path) -> Result<PathBuf> {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(bundle) = layout::bundle_of_msi(&name) else {
        return Ok(file.to_owned());
    };
    let beside = file.with_file_name(&bundle);
    if !beside.is_file() {
        return Err(crate::error::BundleError::Invalid(format!(
            "{}: an MSI is signed with the version and build of the bundle it packs, and {bundle} is not beside it; put the bundle scripts/build-dist.sh wrote with it there and sign again",
            file.display()
        )));
    }
    Ok(beside)
}
