//! Credential rotation on the agent's side, as the OpAMP specification's steps have it:
//! the server offers a new credential in a connect answer; the agent keeps it as a
//! *candidate* (`data/agent-token.candidate`, 0600) beside its credential
//! (`data/agent-token`); it connects with the candidate; once a server takes it, the
//! candidate becomes the credential and the old one is gone (the server refuses it from
//! then on). An agent that dies in between finds the candidate on disk and tries it
//! first; a candidate the server refuses is dropped, and the old credential is used
//! again (the server offers another at a later contact).
//!
//! Which credential a call presents, and what follows from the server's answer, is
//! decided here from what is on disk and what the server said ([`presented`],
//! [`after`]); the client does the files.

use std::path::Path;

/// Which credential a call presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// The rotation's candidate: a call with it is how the server learns the agent has it.
    Candidate,
    /// The credential the server knows.
    Current,
    /// None yet (a first register makes its own).
    Nothing,
}

/// The candidate while there is one: until a server took it, the agent cannot know
/// whether the server already did (the answer may have been lost), and the candidate
/// is what works in either case.
pub fn presented(current: bool, candidate: bool) -> Presented {
    if candidate {
        Presented::Candidate
    } else if current {
        Presented::Current
    } else {
        Presented::Nothing
    }
}

/// How a server answered a call, as far as credentials go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// It spoke to the agent as itself (`2xx`, or a `409` directive): the credential
    /// was taken.
    Taken,
    /// `401`: not this agent's credential.
    Refused,
    /// Nothing about credentials (no answer, a `5xx`, a busy server).
    Nothing,
}

/// What the agent does with its credentials after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The candidate was taken: it is the credential now; the old one is deleted.
    Promote,
    /// The candidate was refused: it is deleted, and the call is made again with the
    /// old credential.
    FallBack,
    /// Nothing changes.
    Keep,
}

pub fn after(presented: Presented, heard: Heard) -> Step {
    match (presented, heard) {
        (Presented::Candidate, Heard::Taken) => Step::Promote,
        (Presented::Candidate, Heard::Refused) => Step::FallBack,
        _ => Step::Keep,
    }
}

/// A credential as a file holds it: trimmed, and only if it looks like one.
pub fn read(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let token = text.trim();
    (!token.is_empty() && token.len() <= 256).then(|| token.to_owned())
}

/// Keeps `token` at `path` (0600), written whole or not at all.
pub fn keep(path: &Path, token: &str) -> Result<(), agent_extract::Error> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    agent_extract::atomic::write_with_mode(path, token.as_bytes(), Some(0o600))
}

/// The candidate becomes the credential: one rename, so the agent has at every moment
/// either both files or the new credential alone.
pub fn promote(candidate: &Path, current: &Path) -> std::io::Result<()> {
    std::fs::rename(candidate, current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_candidate_is_tried_first_and_kept_only_if_taken() {
        assert_eq!(presented(true, true), Presented::Candidate);
        assert_eq!(presented(true, false), Presented::Current);
        assert_eq!(presented(false, false), Presented::Nothing);
        // An agent that died after keeping the candidate but before the server took it
        // (or before it heard that the server did) presents it at its next start.
        assert_eq!(presented(true, true), Presented::Candidate);

        assert_eq!(after(Presented::Candidate, Heard::Taken), Step::Promote);
        assert_eq!(after(Presented::Candidate, Heard::Refused), Step::FallBack);
        assert_eq!(
            after(Presented::Candidate, Heard::Nothing),
            Step::Keep,
            "no answer says nothing of the candidate: tried again next time"
        );
        for heard in [Heard::Taken, Heard::Refused, Heard::Nothing] {
            assert_eq!(after(Presented::Current, heard), Step::Keep);
            assert_eq!(after(Presented::Nothing, heard), Step::Keep);
        }
    }

    #[test]
    fn promoting_leaves_the_new_credential_alone_in_place_of_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("agent-token");
        let candidate = dir.path().join("agent-token.candidate");
        keep(&current, "old").unwrap();
        keep(&candidate, "new").unwrap();
        assert_eq!(read(&candidate).as_deref(), Some("new"));
        promote(&candidate, &current).unwrap();
        assert_eq!(read(&current).as_deref(), Some("new"));
        assert!(!candidate.exists());
        assert_eq!(read(&candidate), None);
    }
}
