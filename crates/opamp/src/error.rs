//! What can be wrong with an OpAMP message or with what the server was asked to offer.

/// Every error of this crate. The edges map [`Error::TooLarge`] to `413` (HTTP) or
/// close code `1009` (WebSocket) and the other message errors to `400`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the OpAMP message is larger than {limit} bytes once decompressed; send a smaller one")]
    TooLarge { limit: usize },

    #[error("the OpAMP body is not valid gzip ({0}); send it uncompressed or gzip it again")]
    Gzip(#[source] std::io::Error),

    #[error(
        "the OpAMP body has Content-Encoding {0:?}; only gzip and uncompressed bodies are accepted"
    )]
    Encoding(String),

    #[error("the OpAMP body is not a valid {what} protobuf message ({source})")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },

    #[error("the OpAMP instance_uid has {len} bytes; it must be 16 bytes (a UUID, v7 recommended)")]
    InstanceUid { len: usize },

    #[error("the OpAMP instance uid {0:?} is not a UUID like 0190f8a2-7b1c-7def-8a00-1234567890ab")]
    InstanceUidText(String),

    #[error("{what} {value:?} is not an even number of hex digits")]
    Hex { what: &'static str, value: String },

    #[error("could not compress the OpAMP answer: {0}")]
    Compress(#[source] std::io::Error),
}

impl Error {
    /// The message was refused for its size, not its content (`413`, close `1009`).
    pub fn is_too_large(&self) -> bool {
        matches!(self, Error::TooLarge { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
