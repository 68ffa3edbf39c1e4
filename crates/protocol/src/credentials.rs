//! An agent's credentials: the secret it proves on every call for its id.
//!
//! An agent makes its own secret and keeps it before its first `register`; the server
//! adopts the first well-formed secret it is shown for an id that has none, and keeps
//! only its hash. The format is fixed here so the agent (which makes it), the server
//! (which adopts only this shape) and fleet-sim agree.

/// Random bytes in a secret: 256 bits, beyond guessing.
const SECRET_BYTES: usize = 32;

/// A fresh secret: 32 random bytes as 64 lowercase hex digits.
pub fn new_agent_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Whether `token` has the shape of a secret an agent made: a server adopts nothing
/// weaker (a short or guessable string) as an id's credentials.
pub fn is_agent_token(token: &str) -> bool {
    token.len() == SECRET_BYTES * 2
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_secrets_have_the_adopted_shape_and_differ() -> Result<(), getrandom::Error> {
        let a = new_agent_token()?;
        let b = new_agent_token()?;
        assert!(is_agent_token(&a) && is_agent_token(&b));
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn weak_or_malformed_secrets_are_not_adopted() {
        assert!(!is_agent_token(""));
        assert!(!is_agent_token("secret"));
        assert!(!is_agent_token(&"0".repeat(63)));
        assert!(!is_agent_token(&"A".repeat(64)));
        assert!(!is_agent_token(&"g".repeat(64)));
        assert!(!is_agent_token(&"0".repeat(65)));
        assert!(is_agent_token(&"0f".repeat(32)));
    }
}
