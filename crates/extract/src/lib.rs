//! Filesystem primitives that must never lose or misplace a byte.
//!
//! - [`unpack`]: the one safe unpacker of distribution archives, shared by `--install`
//!   and the updater. It trusts nothing in the archive.
//! - [`payload`]: reading the zip payload appended to a bundle executable (up to its
//!   Authenticode signature, [`pe`], when it is signed).
//! - [`atomic`]: replace-by-rename writes, directory fsyncs and symlink flips, so that a
//!   crash at any instant leaves either the old or the new state on disk.
//! - [`current`]: which version an installation runs, a symlink or (Windows) a file.
//! - [`os`]: what differs between Unix and Windows filesystems.
//!
//! This crate never deletes or modifies anything outside the paths its callers name,
//! and never follows a link that an archive created.

pub mod atomic;
pub mod current;
pub mod error;
pub mod os;
pub mod payload;
pub mod pe;
pub mod unpack;
pub mod verify;

pub use error::{Error, Result};
