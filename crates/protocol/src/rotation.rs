//! Signing-key rotation: statements that hand trust from one key to the next, and the
//! walk along a chain of them.
//!
//! A statement is a minisign signature, by the old key, over the exact bytes of the new
//! key's public key file, with the trusted comment `rotate-to=<new key id>
//! signed-at=<unix seconds>`. Because it is an ordinary prehashed signature over a file,
//! `minisign -Vm new.pub -x rotation-<id>.minisig -p old.pub` checks it by hand.
//!
//! A bundle carries the chain oldest first. An agent trusting key A follows the chain
//! from the first statement A signed; statements before it are links the agent already
//! passed (or never needed) and are skipped. From there every statement must be signed
//! by the key the previous one named, and the last one must name the bundle's signer.
//! Nothing here reads a file: callers hand in the bytes.

use std::fmt;
use std::str::FromStr;

use blake2::{Blake2b512, Digest};

use crate::error::{Error, Result};
use crate::minisign::{KeyId, PublicKey, SecretKey, Signature, Signed};

/// Most statements a bundle may carry: a key rotated every month for five years.
pub const MAX_STATEMENTS: usize = 64;
/// Largest public key file accepted in a statement (a minisign one is about 100 bytes).
pub const MAX_KEY_FILE: usize = 4096;

/// What a rotation statement's trusted comment says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationClaim {
    pub to: KeyId,
    pub signed_at: u64,
}

impl RotationClaim {
    pub fn to_comment(&self) -> String {
        format!("rotate-to={} signed-at={}", self.to, self.signed_at)
    }

    pub fn parse(comment: &str) -> Result<Self> {
        let mut to = None;
        let mut signed_at = None;
        for field in comment.split_whitespace() {
            let Some((k, v)) = field.split_once('=') else {
                return Err(Error::Rotation(format!(
                    "trusted comment field {field:?} is not name=value"
                )));
            };
            let slot = match k {
                "rotate-to" => &mut to,
                "signed-at" => &mut signed_at,
                _ => continue,
            };
            if slot.replace(v).is_some() {
                return Err(Error::Rotation(format!(
                    "trusted comment field {k} appears twice"
                )));
            }
        }
        let to = to
            .ok_or_else(|| {
                Error::Rotation(format!(
                    "{comment:?} is not a rotation statement (no rotate-to=)"
                ))
            })?
            .parse()?;
        let signed_at = signed_at
            .ok_or_else(|| Error::Rotation(format!("no signed-at= in {comment:?}")))?
            .parse()
            .map_err(|_| Error::Rotation("signed-at= is not a number of seconds".into()))?;
        Ok(Self { to, signed_at })
    }
}

impl FromStr for KeyId {
    type Err = Error;

    /// Parses a key id as minisign prints it: 16 hex digits.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Key(format!("{s:?} is not a key id (16 hex digits)")));
        }
        let n = u64::from_str_radix(s, 16).map_err(|e| Error::Key(e.to_string()))?;
        Ok(KeyId::from_bytes(n.to_le_bytes()))
    }
}

/// One link of a chain: the new key's public key file and the old key's signature of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The public key file exactly as signed.
    pub key_file: Vec<u8>,
    pub signature: Signature,
}

impl Statement {
    /// Signs `new_key_file` (a public key file's exact bytes) with the old key.
    pub fn sign(old: &SecretKey, new_key_file: &[u8], signed_at: u64) -> Result<Self> {
        let new_key = parse_key_file(new_key_file)?;
        if new_key.key_id() == old.key_id() {
            return Err(Error::Rotation(format!(
                "the new key is the old key ({}); make a new one with `agent-bundle keygen`",
                old.key_id()
            )));
        }
        let claim = RotationClaim {
            to: new_key.key_id(),
            signed_at,
        };
        let signature = old
            .sign_prehashed(&blake2b(new_key_file), &claim.to_comment())?
            .with_untrusted_comment(&format!(
                "rotation of the update signing key {} to {}",
                old.key_id(),
                new_key.key_id()
            ));
        Ok(Self {
            key_file: new_key_file.to_vec(),
            signature,
        })
    }

    /// The key this statement hands trust to, as the file names it (not yet verified).
    pub fn new_key(&self) -> Result<PublicKey> {
        parse_key_file(&self.key_file)
    }

    /// Checks the statement under `old` and returns the key it hands trust to.
    pub fn verify(&self, old: &PublicKey) -> Result<(PublicKey, RotationClaim)> {
        self.signature
            .verify(old, Signed::Prehashed(&blake2b(&self.key_file)))?;
        let claim = RotationClaim::parse(self.signature.trusted_comment())?;
        let new_key = self.new_key()?;
        if claim.to != new_key.key_id() {
            return Err(Error::Rotation(format!(
                "the statement signed by {} says rotate-to={} but carries key {}",
                old.key_id(),
                claim.to,
                new_key.key_id()
            )));
        }
        Ok((new_key, claim))
    }
}

fn parse_key_file(bytes: &[u8]) -> Result<PublicKey> {
    if bytes.len() > MAX_KEY_FILE {
        return Err(Error::Rotation(format!(
            "a rotation's public key file has {} bytes, more than {MAX_KEY_FILE}",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Error::Rotation("a rotation's public key file is not text".into()))?;
    PublicKey::parse(text)
}

fn blake2b(bytes: &[u8]) -> [u8; 64] {
    Blake2b512::digest(bytes).into()
}

/// The keys trust passed through, from the trusted key to the signer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Key ids in order: the trusted key first, the signer last.
    pub keys: Vec<KeyId>,
    /// The signer's public key file, as the last statement carried it.
    pub end_file: Vec<u8>,
    pub end: PublicKey,
}

impl Chain {
    /// Every key of the chain but the last: the ones an update along it retires.
    pub fn retired(&self) -> &[KeyId] {
        &self.keys[..self.keys.len().saturating_sub(1)]
    }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, key) in self.keys.iter().enumerate() {
            if i > 0 {
                f.write_str(" -> ")?;
            }
            write!(f, "{key}")?;
        }
        Ok(())
    }
}

/// Why a bundle's signer is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error(
        "key_retired: the bundle is signed by key {signer}, which this agent retired after a key rotation (data/retired-keys); sign it with the current key"
    )]
    Retired { signer: KeyId },
    #[error(
        "the bundle is signed by key {signer}, but this agent trusts key {trusted} and the bundle carries no rotation from it: arbitrary installation refused (sign with key {trusted}, or pack the rotation statements with pack --rotation)"
    )]
    NoRotation { trusted: KeyId, signer: KeyId },
    #[error(
        "the bundle is signed by key {signer}, but its rotation chain from the trusted key {trusted} breaks at statement {index}: {reason}"
    )]
    Broken {
        trusted: KeyId,
        signer: KeyId,
        index: usize,
        reason: String,
    },
    #[error(
        "the bundle is signed by key {signer}, but its rotation chain from the trusted key {trusted} ends at key {reached}"
    )]
    Short {
        trusted: KeyId,
        signer: KeyId,
        reached: KeyId,
    },
    #[error(
        "the bundle's rotation chain returns to key {key}, which this agent retired or already passed"
    )]
    ThroughRetired { key: KeyId },
}

/// Follows `statements` (oldest first) from `trusted` to `signer`. `Ok(None)` when the
/// signer is the trusted key and no rotation is needed.
pub fn follow(
    trusted: &PublicKey,
    statements: &[Statement],
    signer: KeyId,
    retired: &[KeyId],
) -> Result<Option<Chain>, ChainError> {
    if signer == trusted.key_id() {
        return Ok(None);
    }
    if retired.contains(&signer) {
        return Err(ChainError::Retired { signer });
    }
    let start = statements
        .iter()
        .position(|s| s.signature.key_id() == trusted.key_id())
        .ok_or(ChainError::NoRotation {
            trusted: trusted.key_id(),
            signer,
        })?;
    let mut current = trusted.clone();
    let mut keys = vec![trusted.key_id()];
    let mut end_file = Vec::new();
    let mut last_signed_at = 0;
    for (index, statement) in statements.iter().enumerate().skip(start) {
        let broken = |reason: String| ChainError::Broken {
            trusted: trusted.key_id(),
            signer,
            index: index + 1,
            reason,
        };
        if statement.signature.key_id() != current.key_id() {
            return Err(broken(format!(
                "it is signed by key {}, not by key {} that the statement before it named",
                statement.signature.key_id(),
                current.key_id()
            )));
        }
        let (next, claim) = statement
            .verify(&current)
            .map_err(|e| broken(e.to_string()))?;
        if claim.signed_at < last_signed_at {
            return Err(broken(format!(
                "it was signed at {}, before the statement it follows ({last_signed_at})",
                claim.signed_at
            )));
        }
        last_signed_at = claim.signed_at;
        if retired.contains(&next.key_id()) || keys.contains(&next.key_id()) {
            return Err(ChainError::ThroughRetired { key: next.key_id() });
        }
        keys.push(next.key_id());
        end_file.clone_from(&statement.key_file);
        current = next;
        if current.key_id() == signer {
            break;
        }
    }
    if current.key_id() != signer {
        return Err(ChainError::Short {
            trusted: trusted.key_id(),
            signer,
            reached: current.key_id(),
        });
    }
    Ok(Some(Chain {
        keys,
        end_file,
        end: current,
    }))
}

/// Checks what can be checked without the first key: each statement after the first is
/// signed by the key the one before it named, and the last names `signer`. For `pack`,
/// so a broken chain is caught before it ships.
pub fn check_links(statements: &[Statement], signer: KeyId) -> Result<()> {
    let Some(last) = statements.last() else {
        return Ok(());
    };
    for (index, pair) in statements.windows(2).enumerate() {
        let named = pair[0].new_key()?;
        pair[1].verify(&named).map_err(|e| {
            Error::Rotation(format!(
                "statement {} does not follow statement {}: {e}",
                index + 2,
                index + 1
            ))
        })?;
    }
    let end = last.new_key()?;
    if end.key_id() != signer {
        return Err(Error::Rotation(format!(
            "the last rotation statement hands trust to key {}, but the bundle is signed with key {signer}; the chain must end at the signing key",
            end.key_id()
        )));
    }
    Ok(())
}

/// Reads `data/retired-keys`: one key id a line (anything after it on the line is a note).
pub fn parse_retired(text: &str) -> Vec<KeyId> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|id| id.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Keys {
        secret: SecretKey,
        file: Vec<u8>,
    }

    fn key() -> Keys {
        let secret = SecretKey::generate().unwrap();
        let file = secret.public_key().to_file_string().into_bytes();
        Keys { secret, file }
    }

    fn rotate(from: &Keys, to: &Keys, at: u64) -> Statement {
        Statement::sign(&from.secret, &to.file, at).unwrap()
    }

    #[test]
    fn claim_round_trips_and_key_ids_parse_like_minisign_prints_them() {
        let k = key();
        let claim = RotationClaim {
            to: k.secret.key_id(),
            signed_at: 1_700_000_000,
        };
        assert_eq!(RotationClaim::parse(&claim.to_comment()).unwrap(), claim);
        assert!(RotationClaim::parse("version=1 build=2").is_err());
        let id: KeyId = k.secret.key_id().to_string().parse().unwrap();
        assert_eq!(id, k.secret.key_id());
        assert!("xyz".parse::<KeyId>().is_err());
    }

    #[test]
    fn the_trusted_signer_needs_no_chain() {
        let a = key();
        assert_eq!(
            follow(&a.secret.public_key(), &[], a.secret.key_id(), &[]),
            Ok(None)
        );
    }

    #[test]
    fn a_to_b_is_followed_and_retires_a() {
        let (a, b) = (key(), key());
        let chain = follow(
            &a.secret.public_key(),
            &[rotate(&a, &b, 10)],
            b.secret.key_id(),
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(chain.end, b.secret.public_key());
        assert_eq!(chain.end_file, b.file);
        assert_eq!(chain.retired(), &[a.secret.key_id()]);
    }

    #[test]
    fn an_unrelated_signer_is_refused() {
        let (a, b) = (key(), key());
        let err = follow(&a.secret.public_key(), &[], b.secret.key_id(), &[]).unwrap_err();
        assert!(matches!(err, ChainError::NoRotation { .. }), "{err}");
    }

    #[test]
    fn a_retired_signer_is_refused_by_name() {
        let (a, b) = (key(), key());
        let err = follow(
            &b.secret.public_key(),
            &[rotate(&a, &b, 10)],
            a.secret.key_id(),
            &[a.secret.key_id()],
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("key_retired"), "{err}");
    }

    #[test]
    fn an_agent_that_skipped_b_follows_a_b_c_and_one_on_b_skips_the_first_link() {
        let (a, b, c) = (key(), key(), key());
        let statements = [rotate(&a, &b, 10), rotate(&b, &c, 20)];
        let from_a = follow(&a.secret.public_key(), &statements, c.secret.key_id(), &[])
            .unwrap()
            .unwrap();
        assert_eq!(
            from_a.keys,
            vec![a.secret.key_id(), b.secret.key_id(), c.secret.key_id()]
        );
        let from_b = follow(
            &b.secret.public_key(),
            &statements,
            c.secret.key_id(),
            &[a.secret.key_id()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(from_b.keys, vec![b.secret.key_id(), c.secret.key_id()]);
    }

    #[test]
    fn a_middle_link_signed_by_the_wrong_key_breaks_the_chain() {
        let (a, b, c, x) = (key(), key(), key(), key());
        let statements = [rotate(&a, &b, 10), rotate(&x, &c, 20)];
        let err = follow(&a.secret.public_key(), &statements, c.secret.key_id(), &[]).unwrap_err();
        assert!(matches!(err, ChainError::Broken { index: 2, .. }), "{err}");
        assert!(check_links(&statements, c.secret.key_id()).is_err());
        assert!(check_links(&[rotate(&a, &b, 10), rotate(&b, &c, 20)], c.secret.key_id()).is_ok());
    }

    #[test]
    fn a_swapped_key_file_or_edited_comment_is_refused() {
        let (a, b, x) = (key(), key(), key());
        let mut swapped = rotate(&a, &b, 10);
        swapped.key_file = x.file.clone();
        let err = follow(&a.secret.public_key(), &[swapped], x.secret.key_id(), &[]).unwrap_err();
        assert!(matches!(err, ChainError::Broken { .. }), "{err}");

        let statement = rotate(&a, &b, 10);
        let edited = statement
            .signature
            .to_file_string()
            .replace("signed-at=10", "signed-at=11");
        let edited = Statement {
            key_file: statement.key_file.clone(),
            signature: Signature::parse(&edited).unwrap(),
        };
        assert!(follow(&a.secret.public_key(), &[edited], b.secret.key_id(), &[]).is_err());
    }

    #[test]
    fn a_chain_back_to_a_retired_key_is_refused() {
        let (a, b) = (key(), key());
        let c = key();
        // B rotates "forward" to A, which the agent retired; then A signs C.
        let statements = [rotate(&b, &a, 10), rotate(&a, &c, 20)];
        let err = follow(
            &b.secret.public_key(),
            &statements,
            c.secret.key_id(),
            &[a.secret.key_id()],
        )
        .unwrap_err();
        assert!(matches!(err, ChainError::ThroughRetired { .. }), "{err}");
    }

    #[test]
    fn retired_list_ignores_notes_and_garbage() {
        let a = key();
        let text = format!("{} retired-at=5\n\nnot-a-key\n", a.secret.key_id());
        assert_eq!(parse_retired(&text), vec![a.secret.key_id()]);
    }

    #[test]
    fn rotating_to_the_same_key_is_an_error() {
        let a = key();
        assert!(Statement::sign(&a.secret, &a.file, 1).is_err());
    }
}
