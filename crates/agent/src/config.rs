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
    pub workload: WorkloadSection,
    pub log: LogSection,
}

/// The agent's log files and their rotation by size (see [`agent_updater::logfiles`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct LogSection {
    /// A log file past this is rotated (`"10MiB"`, `"512KiB"`, bytes; `"0"`: never).
    pub max_size: String,
    /// Rotated copies kept of each log file (`agent.log.1` … `agent.log.<keep>`).
    pub keep: u32,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            max_size: "10MiB".into(),
            keep: 5,
        }
    }
}

impl LogSection {
    /// The limits, read (`max-size` was checked when the file was loaded).
    pub fn limits(&self) -> agent_updater::logfiles::Limits {
        agent_updater::logfiles::Limits {
            max_size: agent_updater::logfiles::parse_size(&self.max_size)
                .unwrap_or(agent_updater::logfiles::Limits::default().max_size),
            keep: self.keep,
        }
    }
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
    /// The HTTP proxy every request goes through, `http://[user:password@]host:port`;
    /// `"none"`: always direct; empty: the environment's `https_proxy`, `http_proxy`
    /// and `no_proxy` decide (see [`crate::contact::proxy`]).
    pub proxy: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AgentSection {
    /// The longest silence between the agent and its server.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub heartbeat: Duration,
    /// Ask the server to hold each `connect` until something changes for this agent
    /// (at most a heartbeat), so news arrives at once instead of at the next heartbeat.
    pub long_poll: bool,
    /// Shown to the server; defaults to the host name.
    pub name: String,
    /// Sent when registering: rollout waves written `group:NAME` take these agents
    /// first (a canary group, say). Empty: no group.
    pub group: String,
    /// `labels = { env = "prod", region = "eu" }`: sent with every register and
    /// connect, for selectors (`env=prod`) to choose agents by. Spelling rules:
    /// [`agent_protocol::labels`]. The server's own labels win on the same key.
    pub labels: agent_protocol::labels::Labels,
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
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub health_timeout: Duration,
    /// How long a new version must stay healthy before the updater commits it.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub stability_window: Duration,
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub max_retry_after: Duration,
    /// Cap on one bundle download, from first to last byte.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub download_timeout: Duration,
    /// A download that delivers no byte for this long is abandoned and resumed later.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub read_timeout: Duration,
    /// Ask the server for a delta from the bundle this version was installed from before
    /// downloading a whole bundle.
    pub deltas: bool,
    /// Told of a release behind a maintenance window, download and verify it before the
    /// window opens, so the install at the opening starts at once.
    pub download_ahead: bool,
    /// The longest update locks (`run/update-locks/`) hold off one offer; past it the
    /// agent updates and logs the locks it overrode.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub max_defer: Duration,
}

pub use agent_workload::config::{Reload, WorkloadSection, parse_reload};

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            urls: vec!["http://127.0.0.1:7080".into()],
            ca_file: String::new(),
            enrollment_token: String::new(),
            proxy: String::new(),
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
            labels: Default::default(),
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
            deltas: true,
            download_ahead: true,
            max_defer: Duration::from_secs(24 * 3600),
        }
    }
}

/// Every key; the environment variable is `AGENT_<SECTION>_<KEY>`.
pub const KEYS: &[Key] = &[
    key("server", "urls", Kind::List),
    key("server", "ca-file", Kind::Str),
    key("server", "enrollment-token", Kind::Str),
    key("server", "proxy", Kind::Str),
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
    key("update", "deltas", Kind::Bool),
    key("update", "download-ahead", Kind::Bool),
    key("update", "max-defer", Kind::Str),
    key("workload", "command", Kind::List),
    key("workload", "env", Kind::Map),
    key("workload", "health-url", Kind::Str),
    key("workload", "health-command", Kind::List),
    key("workload", "start-timeout", Kind::Str),
    key("workload", "stop-timeout", Kind::Str),
    key("workload", "stop-command", Kind::List),
    key("workload", "config-dir", Kind::Str),
    key("workload", "check-command", Kind::List),
    key("workload", "reload", Kind::Str),
    key("log", "max-size", Kind::Str),
    key("log", "keep", Kind::Int),
];

pub const ENV_PREFIX: &str = "AGENT";

/// A typed error (an unknown key, a wrong type) knows its key but not its place: the
/// first line that sets that key is named, so the operator goes straight to it.
fn with_line(text: &str, message: &str) -> String {
    let key = message
        .split('`')
        .nth(1)
        .filter(|k| !k.is_empty() && !k.contains(char::is_whitespace));
    let line = key.and_then(|key| {
        text.lines().position(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
    });
    match (key, line) {
        (Some(key), Some(n)) => format!("line {}, key `{key}`: {message}", n + 1),
        _ => message.to_owned(),
    }
}

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
        // A proxy's password may sit on the line a TOML error quotes.
        let bad = |message: String| AgentError::Config {
            path: path.to_owned(),
            message: crate::contact::proxy::redact(&message),
        };
        let mut table: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        // AGENT_ is shared with process knobs (AGENT_LOG, AGENT_HOME, ...): only names in
        // a section of agent.toml must be keys.
        settings::apply_env(&mut table, ENV_PREFIX, KEYS, env, Strictness::KnownSections)
            .map_err(bad)?;
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| bad(with_line(text, &e.to_string())))?;
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
        config.workload.validate().map_err(bad)?;
        agent_protocol::labels::check(&config.agent.labels)
            .map_err(|e| bad(format!("agent.labels: {e}")))?;
        agent_updater::logfiles::parse_size(&config.log.max_size)
            .map_err(|e| bad(format!("log.max-size: {e}")))?;
        crate::contact::proxy::Setting::parse(&config.server.proxy).map_err(bad)?;
        Ok(config)
    }

    pub fn public_key_path(&self, home: &Path) -> PathBuf {
        home.join(&self.update.public_key)
    }

    /// `server.proxy`, read (it was checked when the file was loaded).
    pub fn proxy(&self) -> crate::contact::proxy::Setting {
        crate::contact::proxy::Setting::parse(&self.server.proxy).unwrap_or_default()
    }

    /// The pinned CA, if one is configured.
    pub fn ca_file(&self, home: &Path) -> Option<PathBuf> {
        (!self.server.ca_file.trim().is_empty()).then(|| home.join(self.server.ca_file.trim()))
    }
}

pub use agent_protocol::settings::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let text = "[server]\nurls = [\"http://x\"]\n\n[agent]\nheartbeet = \"1s\"\n";
        let e = Config::parse(
            text,
            Path::new("conf/agent.toml"),
            &settings::VarMap(Vec::new()),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("conf/agent.toml") && e.contains("line 5, key `heartbeet`"),
            "{e}"
        );
    }

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
    fn labels_are_read_from_the_agent_section_and_a_bad_one_is_named() {
        let c = Config::parse(
            "[agent]\nlabels = { env = \"prod\", region = \"eu\" }\n",
            Path::new("a.toml"),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.agent.labels["env"], "prod");
        assert_eq!(c.agent.labels.len(), 2);
        let e = Config::parse(
            "[agent]\nlabels = { os = \"linux\" }\n",
            Path::new("a.toml"),
            &no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("a.toml") && e.contains("label os is built in"),
            "{e}"
        );
        let e = Config::parse(
            "[agent]\nlabels = { env = \"pr od\" }\n",
            Path::new("a.toml"),
            &no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("agent.labels: label env="), "{e}");
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
    fn workload_section_parses_with_environment_overrides() {
        let text = r#"
[workload]
command = ["bin/node_exporter", "--web.listen-address=127.0.0.1:9100"]
env = { GOMAXPROCS = "1" }
health-url = "http://127.0.0.1:9100/metrics"
start-timeout = "5s"
stop-timeout = "2s"
reload = "signal:HUP"
"#;
        let env = VarMap(vec![
            ("AGENT_WORKLOAD_STOP_TIMEOUT".into(), "3s".into()),
            ("AGENT_WORKLOAD_ENV".into(), "A=1,B=2".into()),
        ]);
        let c = Config::parse(text, Path::new("a.toml"), &env).unwrap();
        assert_eq!(c.workload.command[0], "bin/node_exporter");
        assert_eq!(c.workload.start_timeout, Duration::from_secs(5));
        assert_eq!(c.workload.stop_timeout, Duration::from_secs(3));
        assert_eq!(c.workload.env.get("B").map(String::as_str), Some("2"));
        assert_eq!(c.workload.config_dir, "conf/workload");
        assert_eq!(parse_reload(&c.workload.reload), Ok(Reload::Signal(1)));
        assert!(!Config::default().workload.enabled());
    }

    #[test]
    fn workload_mistakes_are_named() {
        for (text, needle) in [
            ("[workload]\ncomand = [\"x\"]\n", "comand"),
            ("[workload]\nstart-timeout = \"soon\"\n", "soon"),
            ("[workload]\nstop-timeout = \"10\"\n", "no unit"),
            ("[workload]\nreload = \"signal:NOPE\"\n", "signal:NOPE"),
            ("[workload]\nreload = \"kick\"\n", "restart"),
            (
                "[workload]\nhealth-url = \"localhost:9100\"\n",
                "health-url",
            ),
            (
                "[workload]\nhealth-url = \"http://x/\"\nhealth-command = [\"true\"]\n",
                "both",
            ),
            ("[workload]\nconfig-dir = \"../etc\"\n", "config-dir"),
            ("[workload]\ncommand = [\"\"]\n", "empty word"),
        ] {
            let err = Config::parse(text, Path::new("/h/conf/agent.toml"), &no_env)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(needle) && err.contains("/h/conf/agent.toml"),
                "{text}: {err}"
            );
        }
        let typo = VarMap(vec![("AGENT_WORKLOAD_COMAND".into(), "x".into())]);
        let err = Config::parse("", Path::new("a.toml"), &typo)
            .unwrap_err()
            .to_string();
        assert!(err.contains("AGENT_WORKLOAD_COMMAND"), "{err}");
    }

    #[test]
    fn server_proxy_is_a_key_and_its_password_is_never_quoted() {
        let c = Config::parse(
            "[server]\nproxy = \"http://alice:hunter2@proxy:3128\"\n",
            Path::new("a.toml"),
            &no_env,
        )
        .unwrap();
        assert!(matches!(c.proxy(), crate::contact::proxy::Setting::Url(_)));
        let env = VarMap(vec![("AGENT_SERVER_PROXY".into(), "none".into())]);
        let c = Config::parse("", Path::new("a.toml"), &env).unwrap();
        assert_eq!(c.proxy(), crate::contact::proxy::Setting::Direct);
        for text in [
            "[server]\nproxy = \"http://alice:hunter2@proxy\"\n",
            "[server]\nproxy = \"http://alice:hunter2@proxy:3128\"\nurls = 7\n",
            "[server]\nproxy = \"http://alice:hunter2@proxy:3128\" x\n",
        ] {
            let err = Config::parse(text, Path::new("a.toml"), &no_env)
                .unwrap_err()
                .to_string();
            assert!(!err.contains("hunter2"), "{text}: {err}");
            assert!(err.contains("a.toml"), "{text}: {err}");
        }
    }

    #[test]
    fn log_rotation_is_configured_in_the_file_or_the_environment() {
        let defaults = Config::default().log.limits();
        assert_eq!((defaults.max_size, defaults.keep), (10 << 20, 5));
        let c = Config::parse(
            "[log]\nmax-size = \"512KiB\"\nkeep = 2\n",
            Path::new("a.toml"),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.log.limits().max_size, 512 << 10);
        assert_eq!(c.log.limits().keep, 2);
        let env = VarMap(vec![
            ("AGENT_LOG_MAX_SIZE".into(), "1MiB".into()),
            ("AGENT_LOG_KEEP".into(), "9".into()),
        ]);
        let c = Config::parse("", Path::new("a.toml"), &env).unwrap();
        assert_eq!((c.log.limits().max_size, c.log.keep), (1 << 20, 9));
        for (text, needle) in [
            ("[log]\nmax-size = \"lots\"\n", "log.max-size"),
            ("[log]\nkeep = -1\n", "keep"),
            ("[log]\nmaxsize = \"1MiB\"\n", "maxsize"),
        ] {
            let err = Config::parse(text, Path::new("/h/agent.toml"), &no_env)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(needle) && err.contains("/h/agent.toml"),
                "{text}: {err}"
            );
        }
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
