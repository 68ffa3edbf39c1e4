//! Verification of a bundle against a trusted key: the one definition of "this bundle is
//! genuine", used by `agent-bundle verify`, the installer, the agent, the server and stamp.
//!
//! A bundle is genuine when its detached signature verifies under the key (prehashed
//! BLAKE2b-512), the signed trusted comment parses as a [`BundleClaim`], the claim's
//! sha256 is the file's sha256, and the version and platform inside the payload are
//! the ones the claim names.
//!
//! A bundle signed by another key than the trusted one is genuine when it carries a
//! rotation chain (`rotations/`) from the trusted key to its signer; a key retired by an
//! earlier rotation is refused whatever the bundle carries.

use std::fs::File;
use std::path::Path;

use agent_protocol::digest::Digests;
use agent_protocol::minisign::{BundleClaim, KeyId, PublicKey, Signature, Signed};
use agent_protocol::rotation::{self, Chain, ChainError};

use crate::error::{Error, IoContext, Result};
use crate::payload::{BundleFacts, Payload};

/// The largest `.minisig` file read: minisign's are a few hundred bytes (two comments of
/// at most 1 KiB each, two signatures), so anything larger is refused unread, never held.
pub const MAX_SIGNATURE_FILE: u64 = 8 * 1024;

/// Reads a `.minisig` file, refusing one over [`MAX_SIGNATURE_FILE`] without reading
/// the rest of it.
pub fn read_signature_file(path: &Path) -> Result<String> {
    crate::atomic::read_text(path, MAX_SIGNATURE_FILE)
}

/// Largest bundle verified with the legacy (non-prehashed) variant, which needs the
/// whole file in memory.
const MAX_LEGACY_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Verified {
    pub claim: BundleClaim,
    pub facts: BundleFacts,
    pub digests: Digests,
    pub signature: Signature,
    /// The key rotation followed from the trusted key to the signer, if it is another key.
    pub chain: Option<Chain>,
}

/// What a bundle is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Trust<'a> {
    pub key: &'a PublicKey,
    /// Keys an earlier rotation retired: a bundle they signed is refused.
    pub retired: &'a [KeyId],
}

impl<'a> Trust<'a> {
    /// Only `key`, nothing retired.
    pub fn key(key: &'a PublicKey) -> Self {
        Self { key, retired: &[] }
    }

    /// Refuses a signer that was retired; what can be known before the bundle is at hand.
    pub fn check_signer(&self, signer: KeyId) -> Result<(), ChainError> {
        if signer != self.key.key_id() && self.retired.contains(&signer) {
            return Err(ChainError::Retired { signer });
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Signature(#[from] agent_protocol::Error),
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("{0}")]
    Mismatch(String),
    #[error(transparent)]
    Bundle(#[from] Error),
}

/// Hashes `bundle` in one read and verifies it.
pub fn verify_file(
    bundle: &Path,
    signature: &Signature,
    trust: &Trust<'_>,
) -> Result<Verified, VerifyError> {
    let file = File::open(bundle).at(bundle)?;
    let digests = Digests::of_reader(file).at(bundle)?;
    verify_with_digests(bundle, &digests, signature, trust)
}

/// Verifies `bundle` whose digests were already computed (while it was downloaded).
pub fn verify_with_digests(
    bundle: &Path,
    digests: &Digests,
    signature: &Signature,
    trust: &Trust<'_>,
) -> Result<Verified, VerifyError> {
    trust.check_signer(signature.key_id())?;
    let chain = if signature.key_id() == trust.key.key_id() {
        None
    } else {
        let statements = Payload::open(bundle)?.rotations()?;
        rotation::follow(trust.key, &statements, signature.key_id(), trust.retired)?
    };
    let key = chain.as_ref().map_or(trust.key, |c| &c.end);
    if signature.is_prehashed() {
        signature.verify(key, Signed::Prehashed(&digests.blake2b))?;
    } else {
        if digests.size > MAX_LEGACY_BYTES {
            return Err(VerifyError::Mismatch(format!(
                "legacy (non-prehashed) signatures are accepted only for files up to {MAX_LEGACY_BYTES} bytes; sign with a current minisign"
            )));
        }
        let bytes = std::fs::read(bundle).at(bundle)?;
        signature.verify(key, Signed::Raw(&bytes))?;
    }
    let claim = BundleClaim::parse(signature.trusted_comment())?;
    if claim.sha256 != digests.sha256_hex() {
        return Err(VerifyError::Mismatch(format!(
            "the signature vouches for sha256 {}, but the file's sha256 is {}",
            claim.sha256,
            digests.sha256_hex()
        )));
    }
    let facts = Payload::open(bundle)?.facts()?;
    if facts.version != claim.version || facts.platform != claim.platform {
        return Err(VerifyError::Mismatch(format!(
            "the bundle holds {} for {}, but its signature says {} for {}",
            facts.version, facts.platform, claim.version, claim.platform
        )));
    }
    Ok(Verified {
        claim,
        facts,
        digests: digests.clone(),
        signature: signature.clone(),
        chain,
    })
}
