//! What crosses the wire between agents and the server: paths, headers, the
//! `/agentupdate/version` properties and the JSON bodies.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::properties::Properties;
use crate::version::AgentVersion;

pub const VERSION_PATH: &str = "/agentupdate/version";
pub const DOWNLOAD_PATH: &str = "/agentupdate/download";
pub const SIGNATURE_PATH: &str = "/agentupdate/download.minisig";
/// The Windows MSI of the release (`?release=` as for bundles): what
/// `msiexec /i https://SERVER/agentupdate/agent.msi /qn SERVER_URL=… ENROLL_TOKEN=…` installs.
pub const MSI_PATH: &str = "/agentupdate/agent.msi";
/// The MSI's minisign signature.
pub const MSI_SIGNATURE_PATH: &str = "/agentupdate/agent.msi.minisig";
/// The query parameter that asks version, download and signature for one platform's
/// bundle of the release: `?platform=<target triple>`.
pub const PLATFORM_QUERY: &str = "platform";
/// `/agentupdate/version` lists the release's platforms under this key.
pub const PROP_LATEST_PLATFORMS: &str = "agent.latest.platforms";
/// `/agentupdate/version` names the server's download source (`downloads.public-url`)
/// under this key: the bundle's bytes are at `<it>/<agent.latest.filename>`.
pub const PROP_DOWNLOAD_SOURCE: &str = "downloads.public-url";
/// On an `INSTALLING` report: where the agent took the bundle's bytes from when the
/// server named a download source, [`FROM_SOURCE`] or [`FROM_SERVER`] (the source failed).
pub const BUNDLE_FROM_HEADER: &str = "Agent-Bundle-From";
pub const FROM_SOURCE: &str = "source";
pub const FROM_SERVER: &str = "server";

/// `path?platform=<platform>`, or `path` alone for a platform that is not a plain
/// target triple (nothing else is ever put into a URL).
pub fn for_platform(path: &str, platform: &str) -> String {
    if crate::platform::is_target(platform) {
        format!("{path}?{PLATFORM_QUERY}={platform}")
    } else {
        path.to_owned()
    }
}
/// Names a release (`<version>+<build>`) other than the server's current one: its
/// deployment's, which the directive named.
pub const RELEASE_QUERY: &str = "release";

/// `path?platform=<platform>&release=<id>`: a release of a deployment, for a platform
/// (the platform is left out when it is not a target triple).
pub fn for_release(path: &str, platform: &str, release: &str) -> String {
    with_release(for_platform(path, platform), release)
}

/// `path` with `release=<id>` added to its query (a build's `+` written `%2B`).
fn with_release(path: String, release: &str) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}{RELEASE_QUERY}={}", release.replace('+', "%2B"))
}

/// A delta from the bundle an agent runs to the served one:
/// `?from=<sha256 of the agent's bundle>&platform=<target triple>`.
pub const DELTA_PATH: &str = "/agentupdate/delta";
pub const DELTA_FROM_QUERY: &str = "from";

/// The delta URL path for an agent whose bundle has sha256 `from` (lowercase hex).
pub fn delta_path(from: &str, platform: &str) -> String {
    let with_platform = for_platform(DELTA_PATH, platform);
    let joiner = if with_platform.contains('?') {
        '&'
    } else {
        '?'
    };
    format!("{with_platform}{joiner}{DELTA_FROM_QUERY}={from}")
}

/// [`delta_path`] to `release`, a deployment's release (the agent names the release its
/// directive names, as for the version and the download).
pub fn delta_path_to(from: &str, platform: &str, release: &str) -> String {
    with_release(delta_path(from, platform), release)
}

pub const REPORT_PATH: &str = "/agentupdate/report";
pub const REGISTER_PATH: &str = "/agent/register";
/// `POST` `{"id"}`, with the agent's credentials: it leaves the fleet (`agent uninstall`).
pub const LEAVE_PATH: &str = "/agent/leave";

/// Body of `POST /agent/leave`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leave {
    pub id: String,
}
pub const CONNECT_PATH: &str = "/agent/connect";
/// `POST`: an agent says whether it applied a configuration set.
pub const CONFIG_STATUS_PATH: &str = "/agent/config-status";
pub const AGENT_VERSION_HEADER: &str = "Agent-Version";
/// `connect?wait=<seconds>`: hold the answer until something changes for the agent, or
/// the wait runs out (a long poll).
pub const WAIT_QUERY: &str = "wait";
/// `connect?known=<sha256>`: the agent was refused with this bundle and stays where it
/// is (it failed here before); a `409` naming the same bundle is no news to it.
pub const KNOWN_QUERY: &str = "known";
/// `connect?ahead=<sha256 or 1>`: the agent downloads a release behind its maintenance
/// window ahead; an accepted answer naming another release than this one is news to it.
pub const AHEAD_QUERY: &str = "ahead";
/// On a `connect` answer: the server honours `wait`, holding at most this many seconds.
/// An answer without it comes from a server that answers at once.
pub const LONG_POLL_HEADER: &str = "Agent-Long-Poll";
/// The `error` of a 409 answer to an agent the directive refuses.
pub const NOT_SUPPORTED: &str = "agent_not_supported";

/// The answer of `GET /agentupdate/version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    pub server_version: String,
    pub server_build: String,
    pub agent: AgentVersion,
    pub md5: String,
    pub sha256: String,
    pub size: u64,
    pub filename: String,
    /// `downloads.public-url`: where the bundle's bytes may be fetched instead of the
    /// server (`None`: from the server). Sizes and hashes above still decide.
    pub download_source: Option<String>,
}

impl VersionInfo {
    pub fn to_properties(&self) -> Properties {
        let mut p = Properties::new();
        p.set("server.version", &self.server_version);
        p.set("server.build-number", &self.server_build);
        p.set("agent.latest.version", &self.agent.version_str());
        p.set("agent.latest.build-number", self.agent.build());
        p.set("agent.latest.md5", &self.md5);
        p.set("agent.latest.sha256", &self.sha256);
        p.set("agent.latest.size", &self.size.to_string());
        p.set("agent.latest.filename", &self.filename);
        if let Some(source) = &self.download_source {
            p.set(PROP_DOWNLOAD_SOURCE, source);
        }
        p
    }

    /// `<downloads.public-url>/<filename>`, when the server names a download source.
    pub fn source_url(&self) -> Option<String> {
        self.download_source
            .as_deref()
            .map(|base| format!("{}/{}", base.trim_end_matches('/'), self.filename))
    }

    /// Reads and checks what a server said; nothing in it is trusted until it parses.
    pub fn from_properties(p: &Properties) -> Result<Self> {
        let agent = AgentVersion::new(
            p.require("agent.latest.version")?,
            p.require("agent.latest.build-number")?,
        )?;
        let md5 = hex_field(p, "agent.latest.md5", 32)?;
        let sha256 = hex_field(p, "agent.latest.sha256", 64)?;
        let size = p
            .require("agent.latest.size")?
            .parse::<u64>()
            .map_err(|_| Error::Mismatch("agent.latest.size is not a number of bytes".into()))?;
        let filename = p.require("agent.latest.filename")?.to_owned();
        if filename.contains(['/', '\\']) || filename.starts_with('.') {
            return Err(Error::Mismatch(format!(
                "agent.latest.filename {filename:?} is not a plain file name"
            )));
        }
        // A source that is no plain URL is no source: the bundle comes from the server,
        // as it would after any other failure of the source.
        let download_source = p
            .get(PROP_DOWNLOAD_SOURCE)
            .map(str::trim)
            .filter(|url| is_download_source(url))
            .map(str::to_owned);
        Ok(Self {
            server_version: p.get("server.version").unwrap_or_default().to_owned(),
            server_build: p.get("server.build-number").unwrap_or_default().to_owned(),
            agent,
            md5,
            sha256,
            size,
            filename,
            download_source,
        })
    }
}

/// A download source must be a plain `http(s)://host[:port][/path]`: nothing that
/// could turn a file name appended to it into another request (a query, a fragment).
pub fn is_download_source(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|rest| {
        !rest.is_empty()
            && !rest.starts_with('/')
            && !rest.contains(['?', '#', ' ', '\t', '\n', '\r'])
    })
}

fn hex_field(p: &Properties, name: &str, len: usize) -> Result<String> {
    let value = p.require(name)?.to_ascii_lowercase();
    if value.len() != len || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Mismatch(format!("{name} is not {len} hex digits")));
    }
    Ok(value)
}

/// Body of `POST /agent/register` and `POST /agent/connect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHello {
    pub id: String,
    pub name: String,
    pub platform: String,
    /// `agent.group`: rollout waves written `group:NAME` take these agents first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The agent's and its workload's health, as of this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<AgentHealth>,
    /// `agent.labels` (see [`crate::labels`]); `None` from an agent from before labels,
    /// whose labels the server keeps as recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<crate::labels::Labels>,
    /// What the agent takes beyond a release ([`CAPABILITIES`]); `None` from an agent
    /// from before commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
    /// The server URL this call was sent to, as the agent has it in `server.urls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// What an agent of this release takes beyond a release, as it says in its hello.
pub const CAPABILITIES: [&str; 4] = [
    CAPABILITY_RESTART,
    CAPABILITY_ROTATE,
    CAPABILITY_MOVE,
    CAPABILITY_TELEMETRY,
];
/// `"command": {"restart": …}`: it restarts itself or its workload.
pub const CAPABILITY_RESTART: &str = "restart";
/// `"credentials"`: it keeps a rotated credential as a candidate until a server takes it.
pub const CAPABILITY_ROTATE: &str = "rotate-credentials";
/// `"endpoint"`: it tries another server URL and keeps it only if it answers.
pub const CAPABILITY_MOVE: &str = "move";
/// `"telemetry"`: it exports its own metrics (and logs) with OTLP/HTTP where it is told.
pub const CAPABILITY_TELEMETRY: &str = "telemetry";

/// `"telemetry"` of a connect answer: where the agent exports its own telemetry, with
/// OTLP/HTTP (protobuf), as `update-server telemetry set` named it for the agent's labels.
/// Sent only when it differs from what the agent said it has ([`ConnectBody::telemetry_hash`]);
/// an empty `metrics` (and `hash`) says: export nothing any more.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetryOffer {
    /// The full OTLP/HTTP metrics URL (`http://collector:4318/v1/metrics`); empty: none.
    #[serde(default)]
    pub metrics: String,
    /// The full OTLP/HTTP logs URL, when the agent's own log lines are wanted too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
    /// Headers every export carries (an `Authorization`, a tenant).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// [`TelemetryOffer::hash_of`] the rest; empty when off.
    #[serde(default)]
    pub hash: String,
}

impl TelemetryOffer {
    /// A destination with its hash.
    pub fn new(
        metrics: String,
        logs: Option<String>,
        headers: std::collections::BTreeMap<String, String>,
    ) -> Self {
        let mut offer = Self {
            metrics,
            logs,
            headers,
            hash: String::new(),
        };
        offer.hash = offer.hash_of();
        offer
    }

    /// No destination: the agent stops exporting.
    pub fn off() -> Self {
        Self::default()
    }

    pub fn is_off(&self) -> bool {
        self.metrics.is_empty()
    }

    /// sha256 (hex) over every field, each length-prefixed so no two destinations share
    /// one; empty for none. Both ends compare it: the agent says the one it has, and a
    /// server that names the same sends nothing.
    pub fn hash_of(&self) -> String {
        use sha2::{Digest, Sha256};
        if self.is_off() {
            return String::new();
        }
        let mut h = Sha256::new();
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        part(self.metrics.as_bytes());
        part(self.logs.as_deref().unwrap_or_default().as_bytes());
        for (k, v) in &self.headers {
            part(k.as_bytes());
            part(v.as_bytes());
        }
        hex::encode(h.finalize())
    }
}

/// `"command"` of a connect answer: `{"restart": "agent"|"workload", "id": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCommand {
    /// What to restart; `None`: a command this agent does not know (from a later server),
    /// reported `FAILED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<Restart>,
    /// What the agent reports against (`POST /agent/command-status`).
    pub id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Restart {
    /// The agent itself, through its supervisor (and so its workload with it).
    Agent,
    /// Only the workload; the agent stays.
    Workload,
}

/// `"credentials"` of a connect answer: a rotation's new secret, kept as a candidate
/// (`data/agent-token.candidate`) until a server takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialsOffer {
    pub token: String,
}

/// `"endpoint"` of a connect answer: a server URL to move to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointOffer {
    pub url: String,
    pub id: String,
}

/// `POST`: how a command (a restart, a move) ended.
pub const COMMAND_STATUS_PATH: &str = "/agent/command-status";

/// Body of `POST /agent/command-status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandStatus {
    /// The command's id.
    pub id: String,
    pub status: CommandOutcome,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CommandOutcome {
    Done,
    Failed,
}

/// Where the workload (the operator's program the agent runs) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadState {
    /// Up, and healthy or being checked.
    Running,
    /// Started, not yet healthy; `start-timeout` has not passed.
    Starting,
    /// Exited or failed to start; waiting before the next start.
    Backoff,
    /// Not running and not about to be (the agent is stopping, or cannot start it).
    Stopped,
    /// No workload is configured (`workload.command` is empty).
    None,
}

impl WorkloadState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadState::Running => "running",
            WorkloadState::Starting => "starting",
            WorkloadState::Backoff => "backoff",
            WorkloadState::Stopped => "stopped",
            WorkloadState::None => "none",
        }
    }
}

/// `"health"` of a `connect` or `register` body, and of `/admin/agents` rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AgentHealth {
    /// The agent runs and its workload runs and passes its check (or there is none).
    pub healthy: bool,
    pub workload: WorkloadState,
    /// Restarts of the workload since the agent started.
    pub restarts: u64,
    /// The workload's last failure, in words for an operator.
    #[serde(default)]
    pub last_error: Option<String>,
}

impl AgentHealth {
    /// An agent with no workload.
    pub fn no_workload() -> Self {
        Self {
            healthy: true,
            workload: WorkloadState::None,
            restarts: 0,
            last_error: None,
        }
    }
}

/// A `register` or `connect` body as the server reads it: the [`AgentHello`] and the
/// hash of the configuration set the agent runs. An agent from before remote
/// configuration sends no `config_hash`: it reads as empty (no set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectBody {
    #[serde(flatten)]
    pub hello: AgentHello,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config_hash: String,
    /// The [`TelemetryOffer::hash`] of where the agent exports its own telemetry (empty:
    /// nowhere). `None` from an agent that does not export any: it is told none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry_hash: Option<String>,
}

/// `"config"` in a `200` to `register`/`connect`: the set the agent should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigPayload {
    /// See [`crate::config_set::hash`].
    pub hash: String,
    pub files: std::collections::BTreeMap<String, String>,
}

/// What an agent made of a configuration set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConfigOutcome {
    Applied,
    Failed,
}

impl ConfigOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigOutcome::Applied => "APPLIED",
            ConfigOutcome::Failed => "FAILED",
        }
    }
}

/// Body of `POST /agent/config-status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigStatus {
    pub id: String,
    pub hash: String,
    pub status: ConfigOutcome,
    #[serde(default)]
    pub error: Option<String>,
}

/// `"window"` in a `200` to register or connect: the agent's wave is open but its
/// maintenance window is not; it is refused (told to update to `expected`) at `opens_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowOffer {
    pub expected: String,
    pub sha256: String,
    /// Unix seconds.
    pub opens_at: i64,
}

/// Body of a `409` to an agent the directive refuses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotSupported {
    pub error: String,
    pub expected: String,
    pub download: String,
    /// sha256 of the bundle the server serves, so that an agent whose update failed
    /// sees a new bundle at its next heartbeat without asking `/agentupdate/version`.
    /// Absent from servers before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The agent's credential, in the answer to its first register (trust on first use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// An operator overrode this agent's update locks for this bundle: it updates now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub override_locks: bool,
    /// The deployment the agent follows (also in a `200`'s `"deployment"`); absent from
    /// servers before deployments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
}

/// Header of a `register` from an id the fleet does not know, when the server requires
/// enrollment (`agents.enrollment-token`).
pub const ENROLLMENT_HEADER: &str = "Enrollment-Token";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UpdateStatus {
    Installing,
    Installed,
    /// The bundle is at fault (see [`crate::blame`]): counts toward `max-failures`.
    InstallFailed,
    /// The machine is at fault (a full disk, a cut download): the agent tries again on
    /// its backoff, and the rollout does not count it as a failure.
    Retrying,
    /// Update locks on the machine hold the update off (their names and reasons in
    /// `error`); the agent updates once they are released or `update.max-defer` passes.
    Deferred,
    /// The agent's group installs only inside a maintenance window, which is not open.
    WaitingWindow,
}

/// The status of an agent that left the fleet (`agent uninstall`), beside the update
/// statuses in `/admin/agents`.
pub const LEFT_STATUS: &str = "LEFT";

impl UpdateStatus {
    pub const ALL: [UpdateStatus; 6] = [
        UpdateStatus::Installing,
        UpdateStatus::Installed,
        UpdateStatus::InstallFailed,
        UpdateStatus::Retrying,
        UpdateStatus::Deferred,
        UpdateStatus::WaitingWindow,
    ];

    /// A status an agent list may be filtered by (any case), as the API spells it; or
    /// the refusal that lists the known ones.
    pub fn filter_name(text: &str) -> Result<String, String> {
        let upper = text.trim().to_ascii_uppercase();
        if upper == LEFT_STATUS || Self::ALL.iter().any(|s| s.as_str() == upper) {
            return Ok(upper);
        }
        let known: Vec<&str> = Self::ALL
            .iter()
            .map(|s| s.as_str())
            .chain([LEFT_STATUS])
            .collect();
        Err(format!(
            "no agent status is called {:?}; the statuses are {}",
            crate::shown::shown(text, 40),
            known.join(", ")
        ))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UpdateStatus::Installing => "INSTALLING",
            UpdateStatus::Installed => "INSTALLED",
            UpdateStatus::InstallFailed => "INSTALL_FAILED",
            UpdateStatus::Retrying => "RETRYING",
            UpdateStatus::Deferred => "DEFERRED",
            UpdateStatus::WaitingWindow => "WAITING_WINDOW",
        }
    }
}

/// Body of `POST /agentupdate/report`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub id: String,
    pub from: String,
    pub to: String,
    pub status: UpdateStatus,
    pub error: Option<String>,
}

/// One row of `GET /admin/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub name: String,
    pub platform: String,
    pub version: String,
    pub last_contact: String,
    /// `INSTALLING`, `INSTALLED`, `INSTALL_FAILED`, or `TIMED_OUT` (recorded by the
    /// server when a rollout's deadline passed without a report).
    pub update_status: Option<String>,
    pub update_error: Option<String>,
    #[serde(default)]
    pub group: String,
    /// The agent's wave in the fleet's rollout (1 is the first).
    #[serde(default)]
    pub wave: Option<u32>,
    /// When the fleet's rollout first told it to update (unix seconds).
    #[serde(default)]
    pub told_at: Option<f64>,
    /// The configuration set the agent runs (empty: none).
    #[serde(default)]
    pub config_hash: String,
    /// `APPLIED`, `APPLYING` (sent, not answered yet) or `FAILED`, of the set it was
    /// last sent.
    #[serde(default)]
    pub config_status: Option<String>,
    #[serde(default)]
    pub config_error: Option<String>,
    /// The health it reported with its last register or connect (`null` if none).
    #[serde(default)]
    pub health: Option<AgentHealth>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_named_in_the_query_with_its_plus_escaped() {
        assert_eq!(
            for_release(VERSION_PATH, "x86_64-unknown-linux-musl", "2.3.0+1"),
            "/agentupdate/version?platform=x86_64-unknown-linux-musl&release=2.3.0%2B1"
        );
        let from = "ab".repeat(32);
        assert_eq!(
            delta_path_to(&from, "x86_64-unknown-linux-musl", "2.3.0+1"),
            format!(
                "/agentupdate/delta?platform=x86_64-unknown-linux-musl&from={from}&release=2.3.0%2B1"
            )
        );
    }

    #[test]
    fn only_a_plain_target_triple_goes_into_a_url() {
        assert_eq!(
            for_platform(DOWNLOAD_PATH, "x86_64-unknown-linux-musl"),
            "/agentupdate/download?platform=x86_64-unknown-linux-musl"
        );
        assert_eq!(for_platform(DOWNLOAD_PATH, "linux&x=1"), DOWNLOAD_PATH);
        assert_eq!(for_platform(VERSION_PATH, ""), VERSION_PATH);
    }

    #[test]
    fn a_connect_body_without_config_hash_still_parses() {
        let old: ConnectBody =
            serde_json::from_str(r#"{"id":"a","name":"n","platform":"p","group":"g"}"#).unwrap();
        assert_eq!(old.config_hash, "");
        assert_eq!(old.hello.group.as_deref(), Some("g"));
        let new: ConnectBody =
            serde_json::from_str(r#"{"id":"a","name":"n","platform":"p","config_hash":"ab"}"#)
                .unwrap();
        assert_eq!(new.config_hash, "ab");
        let status: ConfigStatus =
            serde_json::from_str(r#"{"id":"a","hash":"h","status":"FAILED","error":"bad"}"#)
                .unwrap();
        assert_eq!(status.status, ConfigOutcome::Failed);
        assert!(
            serde_json::from_str::<ConfigStatus>(r#"{"id":"a","hash":"h","status":"APPLYING"}"#)
                .is_err()
        );
    }

    fn info() -> VersionInfo {
        VersionInfo {
            server_version: "1.2.0".into(),
            server_build: "1852".into(),
            agent: "2.2.0+1234".parse().unwrap(),
            md5: "0".repeat(32),
            sha256: "a".repeat(64),
            size: 42,
            filename: "agent-bundle-2.2.0".into(),
            download_source: None,
        }
    }

    #[test]
    fn version_info_round_trips_in_design_order() {
        let p = info().to_properties();
        let text = p.to_text();
        assert!(text.starts_with(
            "server.version=1.2.0\nserver.build-number=1852\nagent.latest.version=2.2.0\n"
        ));
        assert_eq!(VersionInfo::from_properties(&p).unwrap(), info());
    }

    #[test]
    fn a_download_source_names_where_the_bytes_are() {
        let mut with = info();
        with.download_source = Some("https://cdn.example/agent/".into());
        let p = with.to_properties();
        assert!(
            p.to_text()
                .contains("downloads.public-url=https://cdn.example/agent/\n")
        );
        let back = VersionInfo::from_properties(&p).unwrap();
        assert_eq!(
            back.source_url().as_deref(),
            Some("https://cdn.example/agent/agent-bundle-2.2.0")
        );
        assert_eq!(info().source_url(), None);
        for bad in ["ftp://x/", "https://x/?a=", "file:///etc", "https://", ""] {
            let mut p = info().to_properties();
            p.set(PROP_DOWNLOAD_SOURCE, bad);
            let read = VersionInfo::from_properties(&p).unwrap();
            assert_eq!(read.source_url(), None, "{bad}");
        }
    }

    #[test]
    fn version_info_rejects_lies() {
        for (key, value) in [
            ("agent.latest.size", "-1"),
            ("agent.latest.sha256", "xyz"),
            ("agent.latest.md5", &"0".repeat(31)),
            ("agent.latest.filename", "../../etc/passwd"),
            ("agent.latest.version", "two"),
        ] {
            let mut p = info().to_properties();
            p.set(key, value);
            assert!(
                VersionInfo::from_properties(&p).is_err(),
                "{key}={value} accepted"
            );
        }
    }

    #[test]
    fn health_json_matches_design() {
        let h = AgentHealth {
            healthy: false,
            workload: WorkloadState::Backoff,
            restarts: 3,
            last_error: Some("exited with code 1".into()),
        };
        assert_eq!(
            serde_json::to_string(&h).unwrap(),
            r#"{"healthy":false,"workload":"backoff","restarts":3,"last_error":"exited with code 1"}"#
        );
        let hello: AgentHello =
            serde_json::from_str(r#"{"id":"a","name":"n","platform":"p"}"#).unwrap();
        assert_eq!(hello.health, None);
    }

    #[test]
    fn report_json_matches_design() {
        let r = Report {
            id: "x".into(),
            from: "2.1.0+1100".into(),
            to: "2.2.0+1234".into(),
            status: UpdateStatus::InstallFailed,
            error: None,
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"id":"x","from":"2.1.0+1100","to":"2.2.0+1234","status":"INSTALL_FAILED","error":null}"#
        );
    }

    #[test]
    fn a_telemetry_destinations_hash_changes_with_any_field_and_is_empty_when_off() {
        use std::collections::BTreeMap;
        let base = TelemetryOffer::new("http://c:4318/v1/metrics".into(), None, BTreeMap::new());
        assert_eq!(base.hash.len(), 64);
        assert_eq!(base.hash, base.hash_of());
        let logs = TelemetryOffer::new(
            base.metrics.clone(),
            Some("http://c:4318/v1/logs".into()),
            BTreeMap::new(),
        );
        let header = TelemetryOffer::new(
            base.metrics.clone(),
            None,
            BTreeMap::from([("authorization".to_owned(), "Bearer x".to_owned())]),
        );
        assert_ne!(base.hash, logs.hash);
        assert_ne!(base.hash, header.hash);
        assert_ne!(logs.hash, header.hash);
        // Length-prefixed: moving bytes from the URL into the logs URL is another hash.
        let shifted = TelemetryOffer::new(
            "http://c:4318/v1/metric".into(),
            Some("s".into()),
            BTreeMap::new(),
        );
        assert_ne!(shifted.hash, logs.hash);
        assert!(TelemetryOffer::off().is_off());
        assert_eq!(TelemetryOffer::off().hash_of(), "");
        let json = serde_json::to_string(&TelemetryOffer::off()).unwrap();
        assert_eq!(json, r#"{"metrics":"","hash":""}"#);
        let back: TelemetryOffer =
            serde_json::from_str(&serde_json::to_string(&header).unwrap()).unwrap();
        assert_eq!(back, header);
    }
}
