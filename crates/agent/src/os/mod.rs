//! What the agent does differently on Unix and on Windows: how it is asked to stop, how
//! it starts the updater so that it outlives it, and how two directories trade places.
//! Each platform module exports the same functions.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;
