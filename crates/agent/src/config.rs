//! `conf/agent.toml`, every key also settable as `AGENT_<SECTION>_<KEY>`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_protocol::settings::{self, Environment, Key, Kind, Strictness, key};
use serde::Deserialize;

use crate::error::{AgentError, Result};

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Config {
    pub server: ServerSection,
    pub agent: AgentSection,
    pub update: UpdateSection,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ServerSection {
    /// Tried in order; a failover re-checks the version with `connect`.
    pub urls: Vec<String>,
    /// PEM file (relative to AGENT_HOME): when set, HTTPS servers are verified against
    /// this CA only (a private CA pinned); empty: the system's roots.
    pub ca_file: String,
    /// Sent when registering with a server that requires enrollment
    /// (`agents.enrollment-token`); not needed once the agent has its credentials.
    pub enrollment_token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AgentSection {
    /// The longest silence between the agent and its server.
    #[serde(with = "humantime_str")]
    pub heartbeat: Duration,
    /// Ask the server to hold each `connect` until something changes for this agent
    /// (at most a heartbeat), so news arrives at once instead of at the next heartbeat.
    pub long_poll: bool,
    /// Shown to the server; defaults to the host name.
    pub name: String,
    /// Sent when registering: rollout waves written `group:NAME` take these agents
    /// first (a canary group, say). Empty: no group.
    pub group: String,
}

impl AgentSection {
    /// The group as sent to the server, if any.
    pub fn group(&self) -> Option<String> {
        let group = self.group.trim();
        (!group.is_empty()).then(|| group.to_owned())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct UpdateSection {
    pub enabled: bool,
    /// Relative to AGENT_HOME.
    pub public_key: PathBuf,
    #[serde(with = "humantime_str")]
    pub health_timeout: Duration,
    /// How long a new version must stay healthy before the updater commits it.
    #[serde(with = "humantime_str")]
    pub stability_window: Duration,
    #[serde(with = "humantime_str")]
    pub max_retry_after: Duration,
    /// Cap on one bundle download, from first to last byte.
    #[serde(with = "humantime_str")]
    pub download_timeout: Duration,
    /// A download that delivers no byte for this long is abandoned and resumed later.
    #[serde(with = "humantime_str")]
    pub read_timeout: Duration,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            urls: vec!["http://127.0.0.1:7080".into()],
            ca_file: String::new(),
            enrollment_token: String::new(),
        }
    }
}

impl Default for AgentSection {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(30),
            long_poll: true,
            name: String::new(),
            group: String::new(),
        }
    }
}

impl Default for UpdateSection {
    fn default() -> Self {
        Self {
            enabled: true,
            public_key: PathBuf::from("conf/update.pub"),
            health_timeout: Duration::from_secs(60),
            stability_window: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(3600),
            download_timeout: Duration::from_secs(30 * 60),
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// Every key; the environment variable is `AGENT_<SECTION>_<KEY>`.
pub const KEYS: &[Key] = &[
    key("server", "urls", Kind::List),
    key("server", "ca-file", Kind::Str),
    key("server", "enrollment-token", Kind::Str),
    key("agent", "heartbeat", Kind::Str),
    key("agent", "long-poll", Kind::Bool),
    key("agent", "name", Kind::Str),
    key("agent", "group", Kind::Str),
    key("update", "enabled", Kind::Bool),
    key("update", "public-key", Kind::Str),
    key("update", "health-timeout", Kind::Str),
    key("update", "stability-window", Kind::Str),
    key("update", "max-retry-after", Kind::Str),
    key("update", "download-timeout", Kind::Str),
    key("update", "read-timeout", Kind::Str),
];

pub const ENV_PREFIX: &str = "AGENT";

impl Config {
    /// Reads `path` (a missing file means defaults), then applies `env` overrides.
    pub fn load(path: &Path, env: &dyn Environment) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(AgentError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Self::parse(&text, path, env)
    }

    pub fn parse(text: &str, path: &Path, env: &dyn Environment) -> Result<Self> {
        let bad = |message: String| AgentError::Config {
            path: path.to_owned(),
            message,
        };
        let mut table: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        // AGENT_ is shared with process knobs (AGENT_LOG, AGENT_HOME, ...): only names in
        // a section of agent.toml must be keys.
        settings::apply_env(&mut table, ENV_PREFIX, KEYS, env, Strictness::KnownSections)
            .map_err(bad)?;
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.to_string()))?;
        if config.server.urls.is_empty() {
            return Err(bad(
                "server.urls is empty; name at least one update-server".into()
            ));
        }
        for url in &config.server.urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(bad(format!(
                    "server.urls: {url:?} is not an http:// or https:// URL"
                )));
            }
        }
        Ok(config)
    }

    pub fn public_key_path(&self, home: &Path) -> PathBuf {
        home.join(&self.update.public_key)
    }

    /// The pinned CA, if one is configured.
    pub fn ca_file(&self, home: &Path) -> Option<PathBuf> {
        (!self.server.ca_file.trim().is_empty()).then(|| home.join(self.server.ca_file.trim()))
    }
}

pub use agent_protocol::settings::parse_duration;

mod humantime_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use agent_protocol::settings::VarMap;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn empty_file_is_defaults() {
        let c = Config::parse("", Path::new("agent.toml"), &no_env).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn design_example_parses() {
        let text = r#"
[server]
urls = ["http://127.0.0.1:7080"]
[agent]
heartbeat = "30s"
long-poll = true
group = ""
[update]
enabled = true
public-key = "conf/update.pub"
health-timeout = "60s"
max-retry-after = "1h"
"#;
        let c = Config::parse(text, Path::new("agent.toml"), &no_env).unwrap();
        assert_eq!(c.update.max_retry_after, Duration::from_secs(3600));
    }

    #[test]
    fn unknown_key_is_named_with_the_file() {
        let err = Config::parse(
            "[update]\nenabeld = true\n",
            Path::new("/x/agent.toml"),
            &no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("enabeld") && err.contains("/x/agent.toml"),
            "{err}"
        );
    }

    #[test]
    fn environment_overrides_file() {
        let env = |k: &str| match k {
            "AGENT_UPDATE_ENABLED" => Some("false".to_owned()),
            "AGENT_SERVER_URLS" => Some("http://a:1, http://b:2".to_owned()),
            "AGENT_AGENT_HEARTBEAT" => Some("2s".to_owned()),
            _ => None,
        };
        let c = Config::parse("[update]\nenabled = true\n", Path::new("a.toml"), &env).unwrap();
        assert!(!c.update.enabled);
        assert_eq!(c.server.urls, vec!["http://a:1", "http://b:2"]);
        assert_eq!(c.agent.heartbeat, Duration::from_secs(2));
    }

    #[test]
    fn a_misspelt_variable_in_a_section_is_an_error_but_process_knobs_are_not() {
        let typo = VarMap(vec![("AGENT_UPDATE_ENABELD".into(), "false".into())]);
        let err = Config::parse("", Path::new("a.toml"), &typo)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("AGENT_UPDATE_ENABELD") && err.contains("AGENT_UPDATE_ENABLED"),
            "{err}"
        );
        let knobs = VarMap(vec![
            ("AGENT_LOG".into(), "debug".into()),
            ("AGENT_HOME".into(), "/opt/agent".into()),
            ("AGENT_UPDATER_STOP_PATIENCE".into(), "5s".into()),
            ("AGENT_START_TIMEOUT".into(), "5".into()),
        ]);
        assert!(Config::parse("", Path::new("a.toml"), &knobs).is_ok());
    }

    #[test]
    fn bad_values_are_errors() {
        for text in [
            "[agent]\nheartbeat = \"soon\"\n",
            "[server]\nurls = []\n",
            "[server]\nurls = [\"ftp://x\"]\n",
            "not toml",
        ] {
            assert!(
                Config::parse(text, Path::new("a.toml"), &no_env).is_err(),
                "{text}"
            );
        }
    }
}
