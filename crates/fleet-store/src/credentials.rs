//! Per-agent credentials and enrollment, decided from what the fleet knows of an id and
//! what the request presents. Pure: the edges fetch and store, this decides.
//!
//! An id's first `register` (trust on first use) sets its token: the secret the agent
//! made and presents (so a retry after a lost answer proves the same one), or, from an
//! agent that presents none, a random token in the answer. The server keeps only its
//! sha256, compared in constant time. From then on, a call for that id without
//! its token is `401`, so nobody can forge its reports or take the id over. With
//! `agents.enrollment-token` set, an id the fleet does not know must present it.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::db::{Credentials, Revocation};

/// What a request for an id may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go on; `issue`: the id has no token yet and gets one in this answer.
    Allow { issue: bool },
    /// `401`, with what to do about it.
    Deny(&'static str),
}

/// The hex sha256 of a token: what the fleet database keeps.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh token: 32 random bytes, hex.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Equal, compared in constant time (no timing tells how much of a hash matched).
pub fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The verdict for a request for an id the fleet knows as `known`.
pub fn decide(
    known: &Credentials,
    bearer: Option<&str>,
    enrollment_required: &str,
    enrollment_presented: Option<&str>,
) -> Verdict {
    match known {
        Credentials::Hash(hash) => match bearer {
            Some(token) if same(&hash_token(token), hash) => Verdict::Allow { issue: false },
            Some(_) => Verdict::Deny(
                "wrong credentials for this agent id; if the agent lost its data/agent-token, an operator resets it with `update-server agents forget-token ID`",
            ),
            None => Verdict::Deny(
                "this agent id has credentials: send them (Authorization: Bearer, from data/agent-token); if they were lost, an operator resets them with `update-server agents forget-token ID`",
            ),
        },
        Credentials::Revoked(Revocation::Left) => Verdict::Deny(
            "this agent left the fleet (agent uninstall) and its credentials are revoked; an agent installed again on this machine enrolls with a new id",
        ),
        Credentials::Revoked(Revocation::Removed) => Verdict::Deny(
            "an operator removed this agent from the fleet and its credentials are revoked; install the agent again (a new id) to enroll this machine",
        ),
        // Reset by an operator (forget-token), or from before credentials: it gets a token
        // now, but a forgotten id is not open to anyone: with an enrollment token set,
        // re-adoption needs it, as a new id does (ids are visible to every viewer).
        Credentials::None => {
            if enrolls(enrollment_required, enrollment_presented) {
                Verdict::Allow { issue: true }
            } else {
                Verdict::Deny(
                    "this agent id's credentials were reset (forget-token) and this server adopts it again only with its enrollment token: set server.enrollment-token in conf/agent.toml (or install with --enroll-token) and restart the agent",
                )
            }
        }
        Credentials::Unknown => {
            if enrolls(enrollment_required, enrollment_presented) {
                Verdict::Allow { issue: true }
            } else {
                Verdict::Deny(
                    "this server enrolls new agents only with its enrollment token: install the agent with --enroll-token, or set server.enrollment-token in conf/agent.toml",
                )
            }
        }
    }
}

/// Whether a request may take an id without credentials: enrollment is open, or it
/// presents the enrollment token.
fn enrolls(required: &str, presented: Option<&str>) -> bool {
    required.is_empty() || presented.is_some_and(|e| same(e, required))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_with_a_token_needs_that_token() {
        let token = new_token().unwrap();
        let known = Credentials::Hash(hash_token(&token));
        assert_eq!(
            decide(&known, Some(&token), "", None),
            Verdict::Allow { issue: false }
        );
        assert!(matches!(decide(&known, None, "", None), Verdict::Deny(_)));
        assert!(matches!(
            decide(&known, Some("guess"), "", None),
            Verdict::Deny(_)
        ));
        // An enrollment token is no credential.
        assert!(matches!(
            decide(&known, None, "e", Some("e")),
            Verdict::Deny(_)
        ));
    }

    #[test]
    fn a_revoked_id_is_refused_whatever_it_presents() {
        let token = new_token().unwrap();
        for how in [Revocation::Left, Revocation::Removed] {
            let known = Credentials::Revoked(how);
            assert!(matches!(
                decide(&known, Some(&token), "", None),
                Verdict::Deny(_)
            ));
            assert!(matches!(decide(&known, None, "", None), Verdict::Deny(_)));
            assert!(matches!(
                decide(&known, None, "enrol", Some("enrol")),
                Verdict::Deny(_)
            ));
        }
    }

    #[test]
    fn an_id_without_a_token_gets_one() {
        assert_eq!(
            decide(&Credentials::None, None, "", None),
            Verdict::Allow { issue: true }
        );
        // A forgotten id is not open to anyone: with an enrollment token set, it is needed.
        assert!(matches!(
            decide(&Credentials::None, None, "secret", None),
            Verdict::Deny(why) if why.contains("enrollment token")
        ));
        assert_eq!(
            decide(&Credentials::None, None, "secret", Some("secret")),
            Verdict::Allow { issue: true }
        );
    }

    #[test]
    fn enrollment_holds_new_ids_only() {
        assert_eq!(
            decide(&Credentials::Unknown, None, "", None),
            Verdict::Allow { issue: true }
        );
        assert!(matches!(
            decide(&Credentials::Unknown, None, "secret", None),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            decide(&Credentials::Unknown, None, "secret", Some("wrong")),
            Verdict::Deny(_)
        ));
        assert_eq!(
            decide(&Credentials::Unknown, None, "secret", Some("secret")),
            Verdict::Allow { issue: true }
        );
    }

    #[test]
    fn tokens_are_random_and_kept_only_as_hashes() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert_eq!(hash_token(&a).len(), 64);
        assert_ne!(hash_token(&a), a);
    }
}
