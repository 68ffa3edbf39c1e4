//! What `--install` does after unpacking to have the agent run at boot: on Unix it says
//! how to start it (the wrapper; `installer/agent.service` for systemd); on Windows it
//! installs `<home>\bin\agent-service.exe`, registers the service and starts it.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

/// How the service is to be set up: `--service-name`, `--no-service`, `--add-to-path`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceRequest<'a> {
    pub name: Option<&'a str>,
    pub none: bool,
    /// `--add-to-path`: `<home>\bin` (the launcher) on the system `Path`.
    pub add_to_path: bool,
}
