//! `[workload]` of agent.toml as written: the program, its health check, its clocks,
//! its configuration directory and how a new configuration takes effect; checked here for
//! what TOML's types alone do not say. The agent's configuration holds it as it is.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The operator's program the agent runs and supervises (docs/workload.md, "Shipping
/// your program").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct WorkloadSection {
    /// argv; empty: no workload. A relative first word resolves against the version
    /// directory; `{home}`, `{version_dir}` and `{config_dir}` are replaced in every word.
    pub command: Vec<String>,
    /// Extra environment for the workload.
    pub env: BTreeMap<String, String>,
    /// Healthy while a GET answers 2xx.
    pub health_url: String,
    /// Instead of `health-url`: healthy while it exits 0.
    pub health_command: Vec<String>,
    /// From start to healthy; past it the start failed.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub start_timeout: Duration,
    /// TERM to the workload's process group (Windows: the end of its job), then KILL
    /// after this; with `stop-command`, the time it has to end after that command.
    #[serde(with = "agent_protocol::settings::duration_text")]
    pub stop_timeout: Duration,
    /// Optional: asks the workload to stop before it is ended (Windows has no TERM for
    /// a program without a console); `AGENT_WORKLOAD_PID` names the workload.
    pub stop_command: Vec<String>,
    /// The workload's configuration files, relative to AGENT_HOME.
    pub config_dir: String,
    /// Validates a new configuration directory before it is applied.
    pub check_command: Vec<String>,
    /// How a new configuration takes effect: `restart` or `signal:<NAME>`.
    pub reload: String,
}

impl Default for WorkloadSection {
    fn default() -> Self {
        Self {
            command: Vec::new(),
            env: BTreeMap::new(),
            health_url: String::new(),
            health_command: Vec::new(),
            start_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
            stop_command: Vec::new(),
            config_dir: "conf/workload".into(),
            check_command: Vec::new(),
            reload: "restart".into(),
        }
    }
}

impl WorkloadSection {
    /// The checks a configuration must pass that TOML types alone do not express.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.command.first().is_some_and(|w| w.trim().is_empty()) {
            return Err(
                "workload.command starts with an empty word; write the program first, e.g. [\"bin/exporter\", \"--flag\"], or [] for no workload".into(),
            );
        }
        let url = self.health_url.trim();
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "workload.health-url {url:?} is not an http:// or https:// URL"
            ));
        }
        if !url.is_empty() && !self.health_command.is_empty() {
            return Err(
                "workload.health-url and workload.health-command are both set; keep one".into(),
            );
        }
        if self.start_timeout.is_zero() {
            return Err("workload.start-timeout must be more than 0s".into());
        }
        let config_dir = Path::new(self.config_dir.trim());
        if self.config_dir.trim().is_empty()
            || config_dir.is_absolute()
            || config_dir
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!(
                "workload.config-dir {:?} must be a path inside AGENT_HOME, such as \"conf/workload\"",
                self.config_dir
            ));
        }
        parse_reload(&self.reload)?;
        for name in self.env.keys() {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(format!(
                    "workload.env: {name:?} is not an environment variable name"
                ));
            }
        }
        Ok(())
    }

    /// True when a workload is configured.
    pub fn enabled(&self) -> bool {
        !self.command.is_empty()
    }
}

/// How a new workload configuration takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    Restart,
    /// The signal's number.
    Signal(i32),
}

/// `restart` or `signal:<NAME>` (`signal:HUP`, `signal:SIGUSR1`).
pub fn parse_reload(text: &str) -> std::result::Result<Reload, String> {
    let text = text.trim();
    if text == "restart" {
        return Ok(Reload::Restart);
    }
    let bad = || {
        format!(
            "workload.reload {text:?} is neither \"restart\" nor \"signal:<NAME>\" (e.g. \"signal:HUP\")"
        )
    };
    let name = text.strip_prefix("signal:").ok_or_else(bad)?.trim();
    let number = crate::group::signal_number(name).ok_or_else(bad)?;
    Ok(Reload::Signal(number))
}
