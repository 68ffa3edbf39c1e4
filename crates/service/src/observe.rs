//! What `start` reads from the agent's own files and words, as pure functions of their
//! text: whether `run/health.json` names the agent it started and a contact with a
//! server, why there was none (`data/last-errors.json`), and which servers the
//! configuration names.

/// Whether `run/health.json` names `pid` (`"pid": 123`).
pub fn health_names(json: &str, pid: u32) -> bool {
    field(json, "pid").is_some_and(|p| p.as_u64() == Some(u64::from(pid)))
}

/// Whether `run/health.json` records a successful contact with a server.
pub fn has_contact(json: &str) -> bool {
    field(json, "last_contact").is_some_and(|c| c.as_u64().is_some())
}

/// One field of a JSON object; `None` when the text is not one (half written, say).
fn field(json: &str, name: &str) -> Option<serde_json::Value> {
    let mut value: serde_json::Value = serde_json::from_str(json).ok()?;
    Some(value.get_mut(name)?.take())
}

/// The last contact error the agent recorded at or after `since` (unix seconds), from
/// `data/last-errors.json` (written by the agent's `last_errors`: `{"contact": {"at":
/// <unix seconds>, "error": "<why>"}, …}`), on one line as `agent status` shows it.
pub fn contact_error_since(last_errors: &str, since: u64) -> Option<String> {
    let contact = field(last_errors, "contact")?;
    if contact.get("at")?.as_u64()? < since {
        return None;
    }
    let why = contact
        .get("error")?
        .as_str()?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    (!why.is_empty()).then_some(why)
}

/// The `urls = …` of an agent.toml as written (its first such line), for messages.
pub fn servers(agent_toml: &str) -> Option<String> {
    agent_toml.lines().find_map(|line| {
        let rest = line.trim_start().strip_prefix("urls")?;
        let value = rest.trim_start().strip_prefix('=')?.trim();
        (!value.is_empty()).then(|| value.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_names_its_agent_and_its_contact() {
        let json = r#"{"version": "1.0.0+1", "pid": 1234, "last_contact": null}"#;
        assert!(health_names(json, 1234));
        assert!(!health_names(json, 123));
        assert!(!health_names(json, 12345));
        assert!(!has_contact(json));
        assert!(has_contact(r#"{"pid": 1, "last_contact": 1700000000}"#));
        assert!(!health_names(r#"{"pid": 12"#, 12), "half written");
    }

    #[test]
    fn the_contact_error_is_the_agents_own_words_since_the_start() {
        let json = r#"{"contact": {"at": 1700000010, "error": "no update-server answered:\n  http://127.0.0.1:1/agent/register: Connection refused"}, "update": {"at": 1, "error": "x"}}"#;
        assert_eq!(
            contact_error_since(json, 1_700_000_010).as_deref(),
            Some(
                "no update-server answered: http://127.0.0.1:1/agent/register: Connection refused"
            )
        );
        assert_eq!(contact_error_since(json, 1_700_000_011), None, "older");
        assert_eq!(
            contact_error_since(r#"{"update": {"at": 1, "error": "x"}}"#, 0),
            None
        );
    }

    #[test]
    fn servers_are_named_as_written() {
        let toml = "[server]\n  urls = [\"http://a:7080\", \"http://b:7080\"]\n";
        assert_eq!(
            servers(toml).as_deref(),
            Some("[\"http://a:7080\", \"http://b:7080\"]")
        );
        assert_eq!(servers("[server]\n"), None);
    }
}
