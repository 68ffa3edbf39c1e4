use std::io;
use std::path::PathBuf;

use agent_extract::verify::VerifyError;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} already exists; pass --force to replace it")]
    Exists(PathBuf),
    #[error(
        "this agent-bundle carries no agent (no zip payload); run a bundle made by `agent-bundle pack`, \
         e.g. the one served at /agentupdate/download"
    )]
    NoPayload,
    #[error(
        "{0}. Download it again (wget --content-disposition http://SERVER:7080/agentupdate/download) and check it with `agent-bundle verify`"
    )]
    Damaged(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Extract(#[from] agent_extract::Error),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Format(#[from] agent_protocol::Error),
    #[error(transparent)]
    Update(#[from] agent_updater::UpdateError),
    #[error(transparent)]
    Delta(#[from] agent_delta::DeltaError),
}

pub type Result<T, E = BundleError> = std::result::Result<T, E>;

pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| BundleError::Io {
            path: path.into(),
            source,
        })
    }
}
