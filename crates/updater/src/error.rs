use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error(
        "another updater holds {lock} (pid {holder}); wait for it to finish, see logs/update.log"
    )]
    Locked { lock: PathBuf, holder: String },
    #[error("update state: {0}")]
    State(String),
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Extract(#[from] agent_extract::Error),
    #[error(transparent)]
    Verify(#[from] agent_extract::verify::VerifyError),
    #[error(transparent)]
    Format(#[from] agent_protocol::Error),
}

pub type Result<T, E = UpdateError> = std::result::Result<T, E>;
