use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("refused archive entry {entry:?}: {reason}")]
    UnsafeEntry { entry: String, reason: String },

    #[error("archive has more than {limit} entries; refusing to unpack it")]
    TooManyEntries { limit: u64 },

    #[error(
        "archive unpacks to more than {limit} bytes (at entry {entry:?}); refusing to unpack it"
    )]
    TooLarge { entry: String, limit: u64 },

    #[error("damaged archive: {0}")]
    Corrupt(String),

    #[error("interrupted; nothing was kept")]
    Interrupted,

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{path} is not a bundle: {reason}")]
    NotABundle { path: PathBuf, reason: String },

    /// No zip at the end of the file, or one that cannot be read: a bare program, or a
    /// bundle cut short or damaged.
    #[error("{path} is not a bundle: no zip payload ({reason})")]
    NoZip { path: PathBuf, reason: String },

    #[error("{path}: entry {entry}: {source}")]
    Format {
        path: PathBuf,
        entry: String,
        #[source]
        source: agent_protocol::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a path to an I/O error.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            path: path.into(),
            source,
        })
    }
}

impl Error {
    /// True if the error means the disk (or quota) is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.raw_os_error() == Some(28))
    }
}
