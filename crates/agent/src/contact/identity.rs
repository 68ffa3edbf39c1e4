//! The agent's stable identity: a UUIDv7 made once and kept in `data/agent-id`.

use std::fs;

use agent_extract::atomic;
use agent_protocol::layout::AgentHome;

use crate::error::{AgentError, Result};

/// Reads the id, or makes one on first start. A damaged id file is an error, not a new
/// identity: the server would see a second agent.
pub fn load_or_create(home: &AgentHome) -> Result<String> {
    let path = home.identity();
    match atomic::read_text(&path, 1024) {
        Ok(text) => {
            let id = text.trim();
            uuid::Uuid::parse_str(id).map_err(|e| AgentError::Config {
                path: path.clone(),
                message: format!(
                    "{e}; the agent id is damaged. Restore it from a backup, or delete the file to register as a new agent"
                ),
            })?;
            Ok(id.to_owned())
        }
        Err(agent_extract::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            fs::create_dir_all(home.data()).map_err(|source| AgentError::Io {
                path: home.data(),
                source,
            })?;
            let id = uuid::Uuid::now_v7().to_string();
            atomic::write(&path, format!("{id}\n").as_bytes())?;
            Ok(id)
        }
        Err(e) => Err(e.into()),
    }
}

/// The name shown to the server: `agent.name`, else the host name.
pub fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// How this agent introduces itself: `id`, the host name, its platform and group.
pub fn hello(id: &str, config: &crate::config::Config) -> agent_protocol::wire::AgentHello {
    agent_protocol::wire::AgentHello {
        id: id.to_owned(),
        name: host_name(),
        platform: agent_protocol::layout::PLATFORM.to_owned(),
        group: config.agent.group(),
        health: None,
        labels: Some(config.agent.labels.clone()),
        capabilities: Some(
            agent_protocol::wire::CAPABILITIES
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
        ),
        endpoint: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        let a = load_or_create(&home).unwrap();
        let b = load_or_create(&home).unwrap();
        assert_eq!(a, b);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 7);
        fs::write(home.identity(), "not an id").unwrap();
        assert!(load_or_create(&home).is_err());
    }
}
