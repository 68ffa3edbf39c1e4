//! A bundle the server refuses, said from the server's side: the verifier's words are
//! the agent's ("this agent trusts key …"), while here the trust is `bundle.public-key`
//! and the fix is the operator's.

use agent_extract::verify::VerifyError;
use agent_protocol::rotation::ChainError;

/// Why the bundle does not verify against `bundle.public-key`, and what to do.
pub fn in_servers_words(e: &VerifyError) -> String {
    match e {
        VerifyError::Chain(ChainError::NoRotation { trusted, signer }) => format!(
            "it is signed by key {signer}, but bundle.public-key is key {trusted} and the bundle carries no rotation from it \
             (sign it with the key whose public half bundle.public-key names, set bundle.public-key to key {signer}'s public key, \
             or pack the rotation statements with pack --rotation)"
        ),
        VerifyError::Chain(ChainError::Broken {
            trusted,
            signer,
            index,
            reason,
        }) => format!(
            "it is signed by key {signer}, but its rotation chain from bundle.public-key (key {trusted}) breaks at statement {index}: {reason}"
        ),
        VerifyError::Chain(ChainError::Short {
            trusted,
            signer,
            reached,
        }) => format!(
            "it is signed by key {signer}, but its rotation chain from bundle.public-key (key {trusted}) ends at key {reached}"
        ),
        other => other.to_string(),
    }
}
