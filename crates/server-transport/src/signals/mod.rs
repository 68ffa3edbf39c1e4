//! The signals update-server answers: TERM and Ctrl-C stop it gracefully, HUP reads its
//! configuration again (the server's `reload` module). How each arrives is the platform's
//! ([`unix`], [`windows`]); each exports the same two things. Windows has no HUP: there
//! a reload never comes, and a restart changes the configuration.

#[cfg(unix)]
mod unix;
#[cfg(windows)]
mod windows;

#[cfg(unix)]
use unix as os;
#[cfg(windows)]
use windows as os;

/// Resolves when the server is asked to stop.
pub async fn shutdown() {
    os::shutdown().await;
}

/// The requests to read the configuration again, one per signal received (signals that
/// arrive together may count once).
pub struct Reloads(os::Reloads);

impl Reloads {
    /// Starts listening; from now on a request is not lost, even before [`Self::next`]
    /// is awaited.
    pub fn listen() -> std::io::Result<Self> {
        os::Reloads::listen().map(Self)
    }

    /// Resolves at the next request.
    pub async fn next(&mut self) {
        self.0.next().await;
    }
}
