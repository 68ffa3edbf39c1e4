use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(
        "cannot tell where this agent is installed ({0}); pass --home AGENT_HOME or run it as {run_as}",
        run_as = crate::os::RUN_AS
    )]
    NoHome(String),
    #[error(transparent)]
    Format(#[from] agent_protocol::Error),
    #[error(transparent)]
    Extract(#[from] agent_extract::Error),
    #[error("{0}")]
    Update(String),
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;
