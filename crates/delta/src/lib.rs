//! Deltas between agent bundles: what changed is sent, the whole bundle is what is trusted.
//!
//! - [`segmented`]: the distribution tarball's compressed layout. Each tar entry is
//!   deflated by a fresh compressor and ends on a byte boundary, so a file that did not
//!   change keeps its compressed bytes from one release to the next, and the stream stays
//!   one ordinary gzip member any `tar xz` reads.
//! - [`make`]: a delta from an old bundle to a new one (the server, off the request path).
//! - [`apply`]: the new bundle rebuilt from the old one and a delta (the agent). The
//!   result is only ever trusted after the caller has checked it as a downloaded bundle
//!   (sizes, hashes, signature); a delta that lies yields bytes that fail those checks.
//!
//! This crate reads the bundles it is given and writes only to the writers and paths its
//! callers name; it knows no HTTP, no fleet and no signature.

pub mod apply;
pub mod error;
pub mod format;
pub mod make;
mod os;
pub mod segmented;

pub use error::{DeltaError, Result};
