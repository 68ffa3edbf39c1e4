//! An operator's commands to this agent (docs/commands.md): restart the agent or only
//! its workload, move to another server URL. (A credential rotation is the client's: see
//! `contact::rotation`.)
//!
//! A server carries a command at every contact until it hears how it ended, so the
//! agent keeps the last one in `data/command.json` with its outcome and whether a
//! server heard it: a command carried again is not done again, only told again
//! ([`decide`]). A restart of the agent is kept as done before the agent exits for its
//! supervisor to start it again; the agent that starts tells it.
//!
//! A move is tried before it is kept: the agent registers at the new URL, and only if
//! that server speaks to it is the URL written to `conf/agent.toml` ([`with_url`]) and
//! used; otherwise it stays where it is and says why (its log, `agent status`, and the
//! server that asked).

use agent_protocol::layout::AgentHome;
use agent_protocol::wire::{CommandOutcome, CommandStatus};
use serde::{Deserialize, Serialize};

/// The last command, as `data/command.json` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub id: String,
    /// `restart agent`, `restart workload`, `move <url>`: for people reading the file.
    pub what: String,
    pub status: CommandOutcome,
    #[serde(default)]
    pub error: Option<String>,
    /// A server heard how it ended.
    #[serde(default)]
    pub told: bool,
}

impl Kept {
    pub fn status(&self) -> CommandStatus {
        CommandStatus {
            id: self.id.clone(),
            status: self.status,
            error: self.error.clone(),
        }
    }
}

/// What the agent does with a command a server carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A new command: do it.
    Act,
    /// Done already, and the server has not heard: tell it again, do nothing.
    Tell,
    /// Done and told: the answer that carried it again crossed the report.
    Nothing,
}

pub fn decide(kept: Option<&Kept>, id: &str) -> Decision {
    match kept {
        Some(k) if k.id == id && k.told => Decision::Nothing,
        Some(k) if k.id == id => Decision::Tell,
        _ => Decision::Act,
    }
}

pub fn read(home: &AgentHome) -> Option<Kept> {
    let text = agent_extract::atomic::read_text(&home.command_file(), 64 * 1024).ok()?;
    serde_json::from_str(&text).ok()
}

/// Keeps `kept`; a failure is said, and the command may then be done twice (a restart
/// more), which is the lesser harm than not doing it.
pub fn keep(home: &AgentHome, kept: &Kept) {
    let text = serde_json::to_vec_pretty(kept).unwrap_or_default();
    let _ = std::fs::create_dir_all(home.data());
    if let Err(e) = agent_extract::atomic::write(&home.command_file(), &text) {
        tracing::warn!(
            "cannot keep command {} in {}: {e}",
            kept.id,
            home.command_file().display()
        );
    }
}

/// `conf/agent.toml`'s text with `[server] urls = [url]`, everything else as it was
/// (comments and order too): the operator's file, changed in the one value a move
/// changes.
pub fn with_url(text: &str, url: &str) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| e.to_string())?;
    let server = doc
        .entry("server")
        .or_insert_with(toml_edit::table)
        .as_table_like_mut()
        .ok_or("[server] is not a table")?;
    let mut urls = toml_edit::Array::new();
    urls.push(url);
    server.insert("urls", toml_edit::value(urls));
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(id: &str, told: bool) -> Kept {
        Kept {
            id: id.into(),
            what: "restart agent".into(),
            status: CommandOutcome::Done,
            error: None,
            told,
        }
    }

    #[test]
    fn a_command_carried_again_is_told_again_not_done_again() {
        assert_eq!(decide(None, "c1"), Decision::Act);
        assert_eq!(decide(Some(&kept("c1", false)), "c1"), Decision::Tell);
        assert_eq!(decide(Some(&kept("c1", true)), "c1"), Decision::Nothing);
        assert_eq!(decide(Some(&kept("c1", true)), "c2"), Decision::Act);
    }

    #[test]
    fn a_kept_move_changes_the_urls_and_nothing_else() {
        let text = "# the operator's\n[server]\nurls = [\"http://a:7080\", \"http://b:7080\"] # two\nca-file = \"conf/ca.pem\"\n\n[agent]\nheartbeat = \"5s\"\n";
        let moved = with_url(text, "http://c:7080").unwrap();
        assert!(moved.starts_with("# the operator's\n[server]\n"), "{moved}");
        assert!(moved.contains("urls = [\"http://c:7080\"]"), "{moved}");
        assert!(moved.contains("ca-file = \"conf/ca.pem\""), "{moved}");
        assert!(moved.contains("[agent]\nheartbeat = \"5s\""), "{moved}");
        let parsed: toml::Table = toml::from_str(&moved).unwrap();
        assert_eq!(
            parsed["server"]["urls"].as_array().unwrap().len(),
            1,
            "{moved}"
        );
        // A file without [server] gets one.
        let fresh = with_url("[agent]\ngroup = \"web\"\n", "http://c:7080").unwrap();
        let parsed: toml::Table = toml::from_str(&fresh).unwrap();
        assert_eq!(parsed["server"]["urls"][0].as_str(), Some("http://c:7080"));
        assert!(with_url("[server\n", "http://c").is_err());
    }

    #[test]
    fn the_kept_command_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        assert_eq!(read(&home), None);
        let k = Kept {
            error: Some("why".into()),
            status: CommandOutcome::Failed,
            ..kept("c9", false)
        };
        keep(&home, &k);
        assert_eq!(read(&home), Some(k.clone()));
        assert_eq!(k.status().status, CommandOutcome::Failed);
    }
}
