use std::io;

/// Everything that can go wrong while reading or checking a shared format.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid version {value:?}: {reason}; expected VERSION+BUILD such as 2.2.0+1234")]
    Version { value: String, reason: String },

    #[error(
        "invalid accept policy {value:?}: {reason}; use exact, same-minor or a semver requirement such as \">=2.2, <2.3\""
    )]
    Policy { value: String, reason: String },

    #[error("line {line}: {reason}")]
    Properties { line: usize, reason: String },

    #[error("missing property {0:?}")]
    MissingProperty(String),

    #[error("invalid key: {0}")]
    Key(String),

    #[error("invalid signature file: {0}")]
    SignatureFormat(String),

    #[error(
        "signature was made by key {signed_by}, but the trusted key is {trusted}; \
         check that the bundle was signed with the key this agent trusts"
    )]
    WrongKey { signed_by: String, trusted: String },

    #[error("signature does not match the file (key {key_id}); the file was modified or truncated")]
    BadSignature { key_id: String },

    #[error("trusted comment does not verify (key {key_id}); the signature file was edited")]
    BadTrustedComment { key_id: String },

    #[error("trusted comment is not a bundle description: {0}")]
    TrustedComment(String),

    #[error("{0}")]
    Mismatch(String),

    #[error("key rotation: {0}")]
    Rotation(String),

    #[error("invalid journal: {0}")]
    Journal(String),

    #[error(transparent)]
    Io(#[from] io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
