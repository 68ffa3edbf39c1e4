use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// The delta is damaged or was made for other bytes: the caller falls back to the
    /// whole bundle.
    #[error("unusable delta: {0}")]
    Corrupt(String),

    /// The bundle given as the base is not the one the delta was made from.
    #[error("the delta was made from bundle sha256 {expected}, this one is {actual}")]
    WrongBase { expected: String, actual: String },

    /// A bundle that cannot be taken apart into the parts a delta names.
    #[error("{path} cannot be diffed: {reason}")]
    Bundle { path: PathBuf, reason: String },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = DeltaError> = std::result::Result<T, E>;

pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| DeltaError::Io {
            path: path.into(),
            source,
        })
    }
}
