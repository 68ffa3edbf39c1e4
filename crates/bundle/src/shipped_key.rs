//! The key a distribution ships (`conf.default/update.pub`) against the key that signs
//! it: a fresh install trusts the shipped key, so a bundle signed by another key with no
//! rotation from the shipped one fails on every new machine. `pack` refuses it unless
//! the operator says the mismatch is deliberate (`--allow-other-key`).

use agent_protocol::minisign::{KeyId, PublicKey};
use agent_protocol::rotation::{self, Statement};

/// What `pack` makes of the shipped key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No shipped key (the signing key's public half is added) or the signing key's own.
    Matches,
    /// Another key, and the carried rotation statements lead from it to the signer.
    Rotation(String),
    /// Another key with no way from it to the signer, and the operator said it is meant.
    Allowed { shipped: KeyId, signer: KeyId },
    /// Another key with no way from it to the signer: refused.
    Refused { shipped: KeyId, signer: KeyId },
}

/// Decides on `shipped` (the distribution's key, if any) for a bundle signed by
/// `signer`, carrying `rotations`.
pub fn verdict(
    shipped: Option<&PublicKey>,
    signer: &PublicKey,
    rotations: &[Statement],
    allow_other_key: bool,
) -> Verdict {
    let Some(shipped) = shipped else {
        return Verdict::Matches;
    };
    match rotation::follow(shipped, rotations, signer.key_id(), &[]) {
        Ok(None) => Verdict::Matches,
        Ok(Some(chain)) => Verdict::Rotation(chain.to_string()),
        Err(_) if allow_other_key => Verdict::Allowed {
            shipped: shipped.key_id(),
            signer: signer.key_id(),
        },
        Err(_) => Verdict::Refused {
            shipped: shipped.key_id(),
            signer: signer.key_id(),
        },
    }
}

/// The refusal, saying what a fresh install would do and the ways out.
pub fn refusal(dist_key: &std::path::Path, shipped: KeyId, signer: KeyId) -> String {
    format!(
        "{} is key {shipped}, but --key is key {signer}: every fresh install of this bundle would trust key {shipped} \
         and refuse the bundle. Nothing was packed. Put the signing key's public half there (the update.pub that \
         `agent-bundle keygen` wrote beside the secret key), or delete it and pack adds it; for a deliberate \
         rotation pack the statement from `agent-bundle rotate-key` with --rotation, or pass --allow-other-key \
         (installs then need --trust-key)",
        dist_key.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::minisign::SecretKey;

    #[test]
    fn another_shipped_key_is_refused_unless_allowed_or_rotated_to() {
        let signer = SecretKey::generate().unwrap();
        let other = SecretKey::generate().unwrap();
        let signer_pub = signer.public_key();
        assert_eq!(verdict(None, &signer_pub, &[], false), Verdict::Matches);
        assert_eq!(
            verdict(Some(&signer_pub), &signer_pub, &[], false),
            Verdict::Matches
        );
        let refused = verdict(Some(&other.public_key()), &signer_pub, &[], false);
        assert_eq!(
            refused,
            Verdict::Refused {
                shipped: other.key_id(),
                signer: signer.key_id()
            }
        );
        assert!(matches!(
            verdict(Some(&other.public_key()), &signer_pub, &[], true),
            Verdict::Allowed { .. }
        ));
        let statement = Statement::sign(
            &other,
            signer_pub.to_file_string().as_bytes(),
            1_700_000_000,
        )
        .unwrap();
        let Verdict::Rotation(chain) =
            verdict(Some(&other.public_key()), &signer_pub, &[statement], false)
        else {
            panic!("a rotation from the shipped key is followed");
        };
        assert!(chain.contains(&other.key_id().to_string()), "{chain}");
    }
}
