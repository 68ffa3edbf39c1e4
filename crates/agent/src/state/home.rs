//! Where the agent is installed and which version it is.

use std::path::{Path, PathBuf};

use agent_protocol::AgentVersion;
use agent_protocol::layout::{self, AgentHome};

use crate::error::{AgentError, Result};

/// The installation this process belongs to, and the version directory it runs from.
#[derive(Debug, Clone)]
pub struct Installation {
    pub home: AgentHome,
    pub version_dir: PathBuf,
    pub version: AgentVersion,
}

impl Installation {
    /// From `--home`, or from the binary's own path `<home>/versions/<v>/bin/agent`
    /// (what `<home>/current/bin/agent` resolves to).
    pub fn discover(home: Option<&Path>) -> Result<Self> {
        let exe = std::env::current_exe().map_err(|e| AgentError::NoHome(e.to_string()))?;
        let exe_version_dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf);
        match home {
            Some(home) => {
                let home = AgentHome::new(home);
                // Prefer the version the binary belongs to; else whatever `current` is.
                let version_dir = match &exe_version_dir {
                    Some(dir) if dir.join(layout::AGENT_VERSION_FILE).is_file() => dir.clone(),
                    _ => agent_extract::current::read_dir(&home.current())
                        .map_err(|e| AgentError::NoHome(e.to_string()))?,
                };
                Self::at(home, version_dir)
            }
            None => {
                let version_dir = exe_version_dir.ok_or_else(|| {
                    AgentError::NoHome(format!("{} has no parent", exe.display()))
                })?;
                let root = version_dir.parent().and_then(Path::parent).ok_or_else(|| {
                    AgentError::NoHome(format!("{} is not inside versions/", exe.display()))
                })?;
                if !version_dir.join(layout::AGENT_VERSION_FILE).is_file() {
                    return Err(AgentError::NoHome(format!(
                        "no {} beside {}",
                        layout::AGENT_VERSION_FILE,
                        exe.display()
                    )));
                }
                Self::at(AgentHome::new(root), version_dir)
            }
        }
    }

    pub fn at(home: AgentHome, version_dir: PathBuf) -> Result<Self> {
        let version = read_version(&version_dir)?;
        Ok(Self {
            home,
            version_dir,
            version,
        })
    }
}

/// The version recorded in `<version_dir>/agent-version.properties`.
pub fn read_version(version_dir: &Path) -> Result<AgentVersion> {
    Ok(agent_extract::payload::installed_version(version_dir)?)
}
