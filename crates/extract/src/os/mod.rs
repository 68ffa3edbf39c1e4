//! What the filesystem primitives do differently on Unix and on Windows: file modes,
//! links, directory syncs and the atomic replacement of a file. Each platform module
//! exports the same functions.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;
