//! The few settings the updater needs, read from `conf/agent.toml` and the environment
//! the agent passed on (`AGENT_UPDATE_*`), so the updater does not depend on the agent.

use std::time::Duration;

use agent_protocol::layout::AgentHome;
use agent_protocol::settings::{Kind, Strictness, apply_env, key, parse_duration};

#[derive(Debug, Clone)]
pub struct Settings {
    /// From start of the new version to a verdict.
    pub health_timeout: Duration,
    /// How long the new version must stay healthy before the update commits.
    pub stability_window: Duration,
    /// How long to wait for the old agent to exit by itself before TERM.
    pub stop_patience: Duration,
    /// Starts of an uncommitted new version before recovery rolls it back.
    pub max_boots: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            health_timeout: Duration::from_secs(60),
            stability_window: Duration::from_secs(10),
            stop_patience: Duration::from_secs(30),
            max_boots: 3,
        }
    }
}

const KEYS: &[agent_protocol::settings::Key] = &[
    key("update", "health-timeout", Kind::Str),
    key("update", "stability-window", Kind::Str),
];

impl Settings {
    /// Never fails: a value that does not parse keeps its default (the agent itself
    /// reports a broken config; the updater must still be able to roll back).
    pub fn load(home: &AgentHome, env: &dyn Fn(&str) -> Option<String>) -> (Self, Vec<String>) {
        let mut s = Settings::default();
        let mut warnings = Vec::new();
        let text = std::fs::read_to_string(home.agent_toml()).unwrap_or_default();
        let mut table: toml::Table = toml::from_str(&text).unwrap_or_default();
        if let Err(e) = apply_env(&mut table, "AGENT", KEYS, &env, Strictness::Lenient) {
            warnings.push(e);
        }
        let update = table.get("update").and_then(|v| v.as_table());
        let mut duration = |name: &str, slot: &mut Duration| {
            if let Some(v) = update.and_then(|u| u.get(name)).and_then(|v| v.as_str()) {
                match parse_duration(v) {
                    Ok(d) => *slot = d,
                    Err(e) => warnings.push(format!("update.{name}: {e}; using {slot:?}")),
                }
            }
        };
        duration("health-timeout", &mut s.health_timeout);
        duration("stability-window", &mut s.stability_window);
        if let Some(d) = env("AGENT_UPDATER_STOP_PATIENCE").and_then(|v| parse_duration(&v).ok()) {
            s.stop_patience = d;
        }
        if let Some(n) = env("AGENT_UPDATER_MAX_BOOTS").and_then(|v| v.parse().ok()) {
            s.max_boots = n;
        }
        if s.stability_window >= s.health_timeout {
            warnings.push(format!(
                "update.stability-window ({:?}) is not shorter than update.health-timeout ({:?}); no update could pass",
                s.stability_window, s.health_timeout
            ));
        }
        (s, warnings)
    }
}
