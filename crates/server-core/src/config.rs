//! `server.toml`; every key also `UPDATE_SERVER_<SECTION>_<KEY>`, `--listen` and `--home` flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use agent_protocol::AcceptPolicy;
use agent_protocol::settings::{self, Environment, Key, Kind, Strictness, key};
use serde::Deserialize;

use crate::error::ServerError;
use agent_fleet::rollout::plan::Plan;

pub const ENV_PREFIX: &str = "UPDATE_SERVER";

/// Open connections by default: every agent of a fleet of 20,000 holds one (a long
/// poll), with room to spare for downloads and operators. Unset, it is lowered to what
/// the process's file limit allows, said once in the log; set, lowering it is a warning.
pub const DEFAULT_MAX_CONNECTIONS: usize = 25_000;

pub use agent_releases::DEFAULT_MAX_UNPACKED_MIB;

/// The longest `agents.max-wait` accepted.
pub const MAX_WAIT_CAP: u64 = 3600;

pub const KEYS: &[Key] = &[
    key("server", "listen", Kind::Str),
    key("server", "home", Kind::Str),
    key("server", "max-connections", Kind::Int),
    key("server", "shutdown-grace", Kind::Seconds),
    key("server", "name", Kind::Str),
    key("server", "header-timeout", Kind::Seconds),
    key("server", "idle-timeout", Kind::Seconds),
    key("server", "public-url", Kind::Str),
    key("downloads", "dir", Kind::Str),
    key("downloads", "limit", Kind::Int),
    key("downloads", "retry-after", Kind::Seconds),
    key("downloads", "stall-timeout", Kind::Seconds),
    key("downloads", "public-url", Kind::Str),
    key("bundle", "public-key", Kind::Str),
    key("releases", "trusted-keys", Kind::List),
    key("releases", "keep", Kind::Int),
    key("releases", "max-unpacked", Kind::Int),
    key("agents", "accept", Kind::Str),
    key("agents", "enrollment-token", Kind::Str),
    key("agents", "max-wait", Kind::Seconds),
    key("agents", "heartbeat", Kind::Seconds),
    key("agents", "rotate-every", Kind::Seconds),
    key("admin", "token", Kind::Str),
    key("database", "url", Kind::Str),
    key("database", "pool-size", Kind::Int),
    key("tls", "cert", Kind::Str),
    key("tls", "key", Kind::Str),
    key("tls", "agent-ca", Kind::Str),
    key("rollout", "waves", Kind::List),
    key("rollout", "wave-wait", Kind::Seconds),
    key("rollout", "max-failures", Kind::Str),
    key("rollout", "agent-deadline", Kind::Seconds),
    key("audit", "keep", Kind::Seconds),
    key("webhooks", "retry-for", Kind::Seconds),
    key("approval", "required", Kind::Bool),
    key("approval", "expires", Kind::Seconds),
];

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Config {
    pub server: ServerSection,
    pub downloads: DownloadsSection,
    pub bundle: BundleSection,
    pub releases: ReleasesSection,
    pub agents: AgentsSection,
    pub admin: AdminSection,
    pub database: DatabaseSection,
    pub rollout: RolloutSection,
    pub tls: TlsSection,
    /// `[[maintenance]]` windows (config-file only).
    pub maintenance: Vec<crate::maintenance::MaintenanceSection>,
    pub audit: AuditSection,
    pub webhooks: WebhooksSection,
    pub approval: ApprovalSection,
}

/// `[approval]`: a second operator's approval of changes that move agents.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ApprovalSection {
    /// Seeds the fleet's switch when the fleet database is new; after that the fleet's
    /// own (`update-server approval require on|off`) holds.
    pub required: bool,
    /// Seconds a change waits for approval before it lapses (`"24h"`).
    pub expires: u64,
}

impl Default for ApprovalSection {
    fn default() -> Self {
        Self {
            required: false,
            expires: agent_fleet::approvals::DEFAULT_EXPIRES_SECS,
        }
    }
}

/// `[audit]`: how long the audit log keeps an entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AuditSection {
    /// Seconds an entry is kept (`"400d"`); older ones are deleted by one server of the
    /// fleet, and that is recorded. 0: kept for ever.
    pub keep: u64,
}

impl Default for AuditSection {
    fn default() -> Self {
        Self { keep: 400 * 86_400 }
    }
}

/// `[webhooks]`: how long an event is retried.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct WebhooksSection {
    /// Seconds an event is tried again, with backoff, before it is given up (`"24h"`).
    pub retry_for: u64,
}

impl Default for WebhooksSection {
    fn default() -> Self {
        Self { retry_for: 86_400 }
    }
}

/// `[tls]`: when both are set, the server speaks HTTPS only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct TlsSection {
    /// PEM: the certificate, then the chain to its issuer.
    pub cert: String,
    /// PEM: its private key.
    pub key: String,
    /// PEM: the CA that agents pin to verify this server (`/install.sh` hands it to
    /// `--install --ca-file`); empty: agents use the system's roots.
    pub agent_ca: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ServerSection {
    pub listen: String,
    pub home: PathBuf,
    /// Unset: [`DEFAULT_MAX_CONNECTIONS`], or what the file limit allows.
    pub max_connections: Option<usize>,
    /// Seconds running downloads get to finish after SIGTERM.
    pub shutdown_grace: u64,
    /// Names this server in the fleet database (its download limit, the decisions it
    /// took); empty: the host name and port.
    pub name: String,
    /// Seconds a client has to send a whole request head.
    pub header_timeout: u64,
    /// Seconds a keep-alive connection may wait between requests.
    pub idle_timeout: u64,
    /// How agents reach this server, for URLs it hands out (the OpAMP package's
    /// `download_url`); empty: `http(s)://<listen address>`.
    pub public_url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DownloadsSection {
    pub dir: PathBuf,
    pub limit: usize,
    pub retry_after: u64,
    /// Seconds a download may go without its client taking a byte before it is ended
    /// and its slot freed.
    pub stall_timeout: u64,
    /// Where agents fetch bundle bytes (`<public-url>/<bundle file name>`): an nginx, a
    /// CDN, an object store holding the release's files. Empty: from this server.
    pub public_url: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct BundleSection {
    pub public_key: String,
}

/// `[releases]`: what `release publish` checks a release against, and how many are kept.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ReleasesSection {
    /// Public key files any of which may vouch for a published bundle (through a
    /// rotation chain the bundle carries); empty: `bundle.public-key`.
    pub trusted_keys: Vec<String>,
    /// Releases kept before the current one, for `release list` and `release rollback`.
    pub keep: usize,
    /// MiB a published bundle's distribution may inflate to; a bundle over it is refused.
    pub max_unpacked: u64,
}

impl Default for ReleasesSection {
    fn default() -> Self {
        Self {
            trusted_keys: Vec::new(),
            keep: agent_fleet::releases::DEFAULT_KEEP,
            max_unpacked: DEFAULT_MAX_UNPACKED_MIB,
        }
    }
}

impl ReleasesSection {
    /// `max-unpacked` in bytes.
    pub fn max_unpacked_bytes(&self) -> u64 {
        self.max_unpacked.saturating_mul(1024 * 1024)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AgentsSection {
    pub accept: String,
    /// When set, an id the fleet does not know must present it (`Enrollment-Token`) to
    /// register. Empty: open enrollment.
    pub enrollment_token: String,
    /// Seconds a long-polling `connect?wait=` may be held.
    pub max_wait: u64,
    /// Seconds between the agents' heartbeats (their `agent.heartbeat`): the fleet page
    /// calls an agent stale after three without a word.
    pub heartbeat: u64,
    /// Seconds after which an agent's credential is rotated (`"90d"`); 0: never (an
    /// operator's `agent rotate-credentials` still does).
    pub rotate_every: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AdminSection {
    pub token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DatabaseSection {
    pub url: String,
    /// Connections to PostgreSQL this server keeps at most (SQLite uses a few of its own).
    pub pool_size: u32,
}

impl Default for DatabaseSection {
    fn default() -> Self {
        Self {
            url: String::new(),
            pool_size: 16,
        }
    }
}

/// `[rollout]`: how a new bundle reaches the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct RolloutSection {
    /// Cumulative: a count ("1"), a share ("10%") or "group:NAME".
    pub waves: Vec<String>,
    /// Seconds a completed wave soaks before the next opens.
    pub wave_wait: u64,
    /// Of the agents told so far: a count or a share. More halts the rollout.
    pub max_failures: CountOrShare,
    /// Seconds an agent told to update has to report.
    pub agent_deadline: u64,
}

/// `max-failures` may be written `3`, `"3"` or `"10%"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CountOrShare {
    Count(u64),
    Text(String),
}

impl std::fmt::Display for CountOrShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountOrShare::Count(n) => write!(f, "{n}"),
            CountOrShare::Text(t) => f.write_str(t),
        }
    }
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            waves: vec!["100%".into()],
            wave_wait: 0,
            max_failures: CountOrShare::Text("10%".into()),
            agent_deadline: 1800,
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7080".into(),
            home: PathBuf::from("server-home"),
            max_connections: None,
            shutdown_grace: 30,
            name: String::new(),
            header_timeout: 30,
            idle_timeout: 60,
            public_url: String::new(),
        }
    }
}

impl Default for DownloadsSection {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("downloads/agent"),
            limit: 45,
            retry_after: 30,
            stall_timeout: 60,
            public_url: String::new(),
        }
    }
}

impl Default for AgentsSection {
    fn default() -> Self {
        Self {
            accept: "exact".into(),
            enrollment_token: String::new(),
            max_wait: 60,
            heartbeat: 30,
            rotate_every: 0,
        }
    }
}

/// An error of the configuration as a whole (an unknown key, a wrong type), with the line
/// and column of the file when the file alone has it: the environment is merged in before
/// the whole is read, which loses where each value came from, so the file is read once
/// more on its own to find it.
fn located(e: &toml::de::Error, text: &str) -> String {
    match toml::from_str::<Config>(text) {
        Err(in_file) if in_file.message() == e.message() && in_file.span().is_some() => {
            in_file.to_string().trim_end().to_owned()
        }
        _ => e.to_string(),
    }
}

/// Where the configuration comes from: the file and the flags that override it, so that
/// it can be read again while the server runs (see [`crate::reload`]).
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// `--config`; none: defaults and the environment only.
    pub file: Option<PathBuf>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--home`.
    pub home: Option<PathBuf>,
}

impl ConfigSource {
    /// Reads the file and the environment, applies the flags, checks the whole.
    pub fn load(&self, env: &dyn Environment) -> Result<Config, ServerError> {
        let mut config = Config::load(self.file.as_deref(), env)?;
        if let Some(listen) = &self.listen {
            config.server.listen = listen.clone();
        }
        if let Some(home) = &self.home {
            config.server.home = home.clone();
        }
        config.validate().map_err(|e| match &self.file {
            Some(file) => ServerError::Config(format!("{}: {e}", file.display())),
            None => ServerError::Config(e),
        })?;
        Ok(config)
    }
}

impl Config {
    /// Reads `path` if given, then the environment; then checks the values.
    pub fn load(path: Option<&Path>, env: &dyn Environment) -> Result<Self, ServerError> {
        let (text, shown) = match path {
            Some(p) => (
                std::fs::read_to_string(p)
                    .map_err(|e| ServerError::Config(format!("{}: {e}", p.display())))?,
                p.display().to_string(),
            ),
            None => (String::new(), "the environment".to_owned()),
        };
        let bad = |m: String| ServerError::Config(format!("{shown}: {m}"));
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        settings::apply_env(&mut table, ENV_PREFIX, KEYS, env, Strictness::WholePrefix)
            .map_err(bad)?;
        settings::normalize_seconds(&mut table, KEYS).map_err(bad)?;
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| bad(located(&e, &text)))?;
        // A window's error names its table's line; the rest name their key.
        crate::maintenance::schedule(&config.maintenance).map_err(|e| bad(e.located(&text)))?;
        config.validate().map_err(bad)?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.listen_addr()?;
        self.accept_policy().map_err(|e| e.to_string())?;
        if self.downloads.limit > self.max_connections() {
            return Err(format!(
                "downloads.limit ({}) may not exceed server.max-connections ({})",
                self.downloads.limit,
                self.max_connections()
            ));
        }
        if self.server.max_connections == Some(0) {
            return Err("server.max-connections must be at least 1".into());
        }
        if self.agents.max_wait > MAX_WAIT_CAP {
            return Err(format!(
                "agents.max-wait ({}) is more than {MAX_WAIT_CAP} seconds; proxies and agents would give up on such holds first (0 turns holds off)",
                self.agents.max_wait
            ));
        }
        let agents_unpack = agent_extract::unpack::Limits::default().max_bytes;
        if self.releases.max_unpacked == 0 || self.releases.max_unpacked_bytes() > agents_unpack {
            return Err(format!(
                "releases.max-unpacked ({}) is in MiB, from 1 to {} (what agents unpack at most); the default is {DEFAULT_MAX_UNPACKED_MIB}",
                self.releases.max_unpacked,
                agents_unpack / (1024 * 1024)
            ));
        }
        if self.database.pool_size == 0 {
            return Err("database.pool-size must be at least 1".into());
        }
        self.rollout_plan()?;
        self.maintenance_schedule()?;
        let source = self.downloads.public_url.trim();
        if !source.is_empty() && !agent_protocol::wire::is_download_source(source) {
            return Err(format!(
                "downloads.public-url {source:?} is not an http:// or https:// URL without a query; name the directory that holds the release's files, e.g. https://cdn.example/agent"
            ));
        }
        if self.tls.cert.is_empty() != self.tls.key.is_empty() {
            return Err("tls.cert and tls.key go together: set both for HTTPS, or neither".into());
        }
        for (name, value) in [
            ("server.header-timeout", self.server.header_timeout),
            ("server.idle-timeout", self.server.idle_timeout),
            ("downloads.stall-timeout", self.downloads.stall_timeout),
            ("agents.heartbeat", self.agents.heartbeat),
        ] {
            if value == 0 {
                return Err(format!("{name} must be at least 1 second"));
            }
        }
        Ok(())
    }

    /// The open connections asked for: `server.max-connections`, or the default.
    pub fn max_connections(&self) -> usize {
        self.server
            .max_connections
            .unwrap_or(DEFAULT_MAX_CONNECTIONS)
    }

    /// `(cert, key)` when HTTPS is asked for.
    pub fn tls_files(&self) -> Option<(PathBuf, PathBuf)> {
        (!self.tls.cert.is_empty() || !self.tls.key.is_empty())
            .then(|| (PathBuf::from(&self.tls.cert), PathBuf::from(&self.tls.key)))
    }

    /// The clocks every connection is held to.
    pub fn timeouts(&self) -> crate::transport::conn::Timeouts {
        crate::transport::conn::Timeouts {
            header: std::time::Duration::from_secs(self.server.header_timeout),
            idle: std::time::Duration::from_secs(self.server.idle_timeout),
            stall: std::time::Duration::from_secs(self.downloads.stall_timeout),
        }
    }

    /// The plan new rollouts run under.
    pub fn rollout_plan(&self) -> Result<Plan, String> {
        Plan::new(
            &self.rollout.waves,
            self.rollout.wave_wait,
            &self.rollout.max_failures.to_string(),
            self.rollout.agent_deadline,
        )
    }

    /// The maintenance windows new bundles wait for.
    pub fn maintenance_schedule(&self) -> Result<agent_fleet::maintenance::Schedule, String> {
        crate::maintenance::schedule(&self.maintenance).map_err(|e| e.to_string())
    }

    /// `[[maintenance]]` as deployment `default`'s windows (what seeds a new fleet).
    pub fn maintenance_windows(&self) -> Result<Vec<agent_fleet::policy::NewWindow>, String> {
        crate::maintenance::windows(&self.maintenance).map_err(|e| e.to_string())
    }

    /// The URL of this server's admin API, from `server.listen` (a wildcard address is
    /// reached on loopback).
    pub fn admin_url(&self) -> String {
        let scheme = if self.tls_files().is_some() {
            "https"
        } else {
            "http"
        };
        match self.listen_addr() {
            Ok(addr) if addr.ip().is_unspecified() => {
                format!("{scheme}://127.0.0.1:{}", addr.port())
            }
            Ok(addr) => format!("{scheme}://{addr}"),
            Err(_) => format!("{scheme}://{}", self.server.listen),
        }
    }

    /// `downloads.public-url` without a trailing `/`; `None`: agents download from here.
    pub fn download_source(&self) -> Option<String> {
        let url = self.downloads.public_url.trim().trim_end_matches('/');
        (!url.is_empty()).then(|| url.to_owned())
    }

    /// `server.public-url` without a trailing `/`, or this server's own address.
    pub fn public_url(&self) -> String {
        let url = if self.server.public_url.trim().is_empty() {
            self.admin_url()
        } else {
            self.server.public_url.trim().to_owned()
        };
        url.trim_end_matches('/').to_owned()
    }

    /// `server.name`, or the host name and port.
    pub fn server_name(&self) -> String {
        if !self.server.name.is_empty() {
            return self.server.name.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let port = self
            .listen_addr()
            .map(|a| a.port().to_string())
            .unwrap_or_default();
        format!(
            "{}:{port}",
            if host.is_empty() { "localhost" } else { &host }
        )
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.server.listen.parse().map_err(|_| {
            format!(
                "server.listen {:?} is not an address such as 127.0.0.1:7080",
                self.server.listen
            )
        })
    }

    pub fn accept_policy(&self) -> Result<AcceptPolicy, agent_protocol::Error> {
        self.agents.accept.parse()
    }

    pub fn download_dir(&self) -> PathBuf {
        self.server.home.join(&self.downloads.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::settings::VarMap;

    #[test]
    fn defaults_match_the_design() {
        let c = Config::load(None, &VarMap::default()).unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:7080");
        assert_eq!(c.downloads.limit, 45);
        assert_eq!(c.downloads.retry_after, 30);
        assert_eq!(c.download_dir(), Path::new("server-home/downloads/agent"));
    }

    #[test]
    fn environment_and_validation() {
        let env = |k: &str| (k == "UPDATE_SERVER_DOWNLOADS_LIMIT").then(|| "5".to_owned());
        assert_eq!(Config::load(None, &env).unwrap().downloads.limit, 5);
        let too_many = |k: &str| match k {
            "UPDATE_SERVER_DOWNLOADS_LIMIT" => Some("2000".to_owned()),
            "UPDATE_SERVER_SERVER_MAX_CONNECTIONS" => Some("1000".to_owned()),
            _ => None,
        };
        assert!(Config::load(None, &too_many).is_err());
        let long_wait =
            |k: &str| (k == "UPDATE_SERVER_AGENTS_MAX_WAIT").then(|| "86400".to_owned());
        assert!(Config::load(None, &long_wait).is_err());
        let no_holds = |k: &str| (k == "UPDATE_SERVER_AGENTS_MAX_WAIT").then(|| "0".to_owned());
        assert_eq!(Config::load(None, &no_holds).unwrap().agents.max_wait, 0);
        let bad_policy =
            |k: &str| (k == "UPDATE_SERVER_AGENTS_ACCEPT").then(|| "sometimes".to_owned());
        assert!(Config::load(None, &bad_policy).is_err());
    }

    #[test]
    fn max_unpacked_is_in_mib_and_within_what_agents_unpack() {
        let c = Config::load(None, &VarMap::default()).unwrap();
        assert_eq!(c.releases.max_unpacked, DEFAULT_MAX_UNPACKED_MIB);
        assert_eq!(c.releases.max_unpacked_bytes(), 512 << 20);
        let set = |value: &'static str| {
            move |k: &str| (k == "UPDATE_SERVER_RELEASES_MAX_UNPACKED").then(|| value.to_owned())
        };
        assert_eq!(
            Config::load(None, &set("64"))
                .unwrap()
                .releases
                .max_unpacked_bytes(),
            64 << 20
        );
        for bad in ["0", "4097"] {
            let err = Config::load(None, &set(bad)).unwrap_err().to_string();
            assert!(
                err.contains("releases.max-unpacked") && err.contains("MiB"),
                "{err}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("server.toml");
        std::fs::write(&file, "[releases]\nmax-unpacked = 100\n").unwrap();
        let c = Config::load(Some(&file), &VarMap::default()).unwrap();
        assert_eq!(c.releases.max_unpacked, 100);
    }

    /// Regression: `UPDATE_SERVER_DOWNLOADS_LIMT=5` was silently ignored while the same
    /// typo in server.toml was an error.
    #[test]
    fn a_misspelt_environment_variable_is_an_error_naming_it() {
        let env = VarMap(vec![("UPDATE_SERVER_DOWNLOADS_LIMT".into(), "5".into())]);
        let err = Config::load(None, &env).unwrap_err().to_string();
        assert!(
            err.contains("UPDATE_SERVER_DOWNLOADS_LIMT")
                && err.contains("UPDATE_SERVER_DOWNLOADS_LIMIT"),
            "{err}"
        );
    }

    #[test]
    fn rollout_plan_from_the_file_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.toml");
        std::fs::write(
            &p,
            "[rollout]\nwaves = [\"2\", \"50%\", \"100%\"]\nwave-wait = 30\nmax-failures = 3\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &VarMap::default()).unwrap();
        let plan = c.rollout_plan().unwrap();
        assert_eq!(plan.waves.len(), 3);
        assert_eq!(plan.wave_wait, 30);
        assert_eq!(plan.max_failures.to_string(), "3");
        let env = VarMap(vec![
            (
                "UPDATE_SERVER_ROLLOUT_WAVES".into(),
                "group:canary, 10%".into(),
            ),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES".into(), "5%".into()),
        ]);
        let plan = Config::load(None, &env).unwrap().rollout_plan().unwrap();
        assert_eq!(
            plan.waves
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["group:canary", "10%", "100%"]
        );
        let bad = VarMap(vec![("UPDATE_SERVER_ROLLOUT_WAVES".into(), "ten".into())]);
        let err = Config::load(None, &bad).unwrap_err().to_string();
        assert!(err.contains("rollout.waves"), "{err}");
    }

    /// Regression: `wave-wait = "15m"` was `invalid type: string "15m", expected u64`
    /// while the agent takes only durations with units.
    #[test]
    fn durations_take_units_or_bare_seconds_and_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.toml");
        std::fs::write(
            &p,
            "[rollout]\nwave-wait = \"15m\"\nagent-deadline = \"1h\"\n[agents]\nmax-wait = \"30s\"\n[downloads]\nretry-after = 20\n",
        )
        .unwrap();
        let c = Config::load(Some(&p), &VarMap::default()).unwrap();
        assert_eq!(c.rollout.wave_wait, 900);
        assert_eq!(c.rollout.agent_deadline, 3600);
        assert_eq!(c.agents.max_wait, 30);
        assert_eq!(c.downloads.retry_after, 20);
        let env = VarMap(vec![(
            "UPDATE_SERVER_SERVER_IDLE_TIMEOUT".into(),
            "2m".into(),
        )]);
        assert_eq!(Config::load(None, &env).unwrap().server.idle_timeout, 120);
        std::fs::write(&p, "[rollout]\nwave-wait = \"15 minutes\"\n").unwrap();
        let err = Config::load(Some(&p), &VarMap::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rollout.wave-wait") && err.contains("\"15m\"") && err.contains("(90)"),
            "{err}"
        );
    }

    #[test]
    fn a_download_source_is_an_http_url_and_empty_means_this_server() {
        assert_eq!(
            Config::load(None, &VarMap::default())
                .unwrap()
                .download_source(),
            None
        );
        let env = VarMap(vec![(
            "UPDATE_SERVER_DOWNLOADS_PUBLIC_URL".into(),
            "https://cdn.example/agent/".into(),
        )]);
        assert_eq!(
            Config::load(None, &env)
                .unwrap()
                .download_source()
                .as_deref(),
            Some("https://cdn.example/agent")
        );
        for bad in ["cdn.example/agent", "ftp://cdn/", "https://cdn/?x=1"] {
            let env = VarMap(vec![(
                "UPDATE_SERVER_DOWNLOADS_PUBLIC_URL".into(),
                bad.into(),
            )]);
            let err = Config::load(None, &env).unwrap_err().to_string();
            assert!(err.contains("downloads.public-url"), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_key_names_the_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.toml");
        std::fs::write(&p, "[downloads]\nlimt = 3\n").unwrap();
        let err = Config::load(Some(&p), &VarMap::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("limt") && err.contains("server.toml"), "{err}");
    }
}
