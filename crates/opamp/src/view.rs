//! What the server keeps of an OpAMP agent: plain values, serialisable, with no
//! protobuf types, so the fleet can store them beside native agents and show them in
//! `/admin/agents`. Hashes are lower-case hex.

use std::collections::BTreeMap;

use agent_protocol::wire::UpdateStatus;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::proto::{
    self, AgentCapabilities, AnyValue, ComponentHealth, EffectiveConfig, KeyValue,
    PackageStatusEnum, PackageStatuses, RemoteConfigStatus, RemoteConfigStatuses, any_value,
};

/// The description attribute that names an OpAMP agent's group (identifying or not),
/// like `agent.group` in a native agent's `agent.toml`.
pub const GROUP_ATTRIBUTE: &str = "agent.group";

/// Everything the server knows of one agent instance, as of its last message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentView {
    /// `sequence_num` of the last message merged; `None` before the first.
    pub sequence_num: Option<u64>,
    /// Bits of `AgentCapabilities`.
    pub capabilities: u64,
    pub description: Option<Description>,
    pub health: Option<Health>,
    pub effective_config: Option<EffectiveConfigSummary>,
    pub remote_config: Option<RemoteConfigReport>,
    pub packages: Option<PackagesReport>,
    /// False once the agent said `agent_disconnect` (or the edge saw it fall silent).
    pub online: bool,
    /// The hash of the own-telemetry settings (`own_metrics`, `own_logs`) this server
    /// last offered the agent; empty before any. Kept with what the agent said, since
    /// OpAMP agents do not say which they have: an offer goes again only when it differs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub own_telemetry: String,
}

impl AgentView {
    pub fn has(&self, capability: AgentCapabilities) -> bool {
        has_capability(self.capabilities, capability)
    }

    /// The agent's group: the `agent.group` attribute, empty when it has none.
    pub fn group(&self) -> &str {
        self.description
            .as_ref()
            .and_then(|d| d.get(GROUP_ATTRIBUTE))
            .unwrap_or_default()
    }
}

pub fn has_capability(bits: u64, capability: AgentCapabilities) -> bool {
    bits & capability as u64 != 0
}

/// The capabilities set in `bits`, named as the specification names them
/// (`AcceptsRestartCommand`); a bit this server does not know is left out.
pub fn capability_names(bits: u64) -> Vec<String> {
    (0..32)
        .map(|shift| 1u64 << shift)
        .filter(|bit| bits & bit != 0)
        .filter_map(|bit| AgentCapabilities::try_from(i32::try_from(bit).ok()?).ok())
        .map(|c| {
            let name = c.as_str_name();
            name.strip_prefix("AgentCapabilities_")
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}

/// `AgentDescription`, attribute values rendered as text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    pub identifying: BTreeMap<String, String>,
    pub non_identifying: BTreeMap<String, String>,
}

impl Description {
    /// An attribute's value, identifying attributes first.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.identifying
            .get(key)
            .or_else(|| self.non_identifying.get(key))
            .map(String::as_str)
    }

    pub fn service_name(&self) -> Option<&str> {
        self.get("service.name")
    }
}

impl From<&proto::AgentDescription> for Description {
    fn from(d: &proto::AgentDescription) -> Self {
        Description {
            identifying: attributes(&d.identifying_attributes),
            non_identifying: attributes(&d.non_identifying_attributes),
        }
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), value_text(kv.value.as_ref())))
        .collect()
}

/// Attribute values as a person reads them: strings as they are, numbers and bools
/// in decimal, bytes in hex, arrays and maps in a JSON-like form.
pub fn value_text(value: Option<&AnyValue>) -> String {
    let Some(value) = value.and_then(|v| v.value.as_ref()) else {
        return String::new();
    };
    match value {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        any_value::Value::BytesValue(b) => hex::encode(b),
        any_value::Value::ArrayValue(a) => {
            let items: Vec<String> = a.values.iter().map(|v| value_text(Some(v))).collect();
            format!("[{}]", items.join(", "))
        }
        any_value::Value::KvlistValue(l) => {
            let items: Vec<String> = l
                .values
                .iter()
                .map(|kv| format!("{}: {}", kv.key, value_text(kv.value.as_ref())))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// `ComponentHealth` of the agent as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub healthy: bool,
    pub status: String,
    pub last_error: String,
    pub start_time_unix_nano: u64,
    pub status_time_unix_nano: u64,
    /// Paths (`a/b`) of sub-components that report themselves unhealthy.
    pub unhealthy_components: Vec<String>,
}

impl From<&ComponentHealth> for Health {
    fn from(h: &ComponentHealth) -> Self {
        let mut unhealthy = Vec::new();
        collect_unhealthy(&h.component_health_map, "", &mut unhealthy, 0);
        Health {
            healthy: h.healthy,
            status: h.status.clone(),
            last_error: h.last_error.clone(),
            start_time_unix_nano: h.start_time_unix_nano,
            status_time_unix_nano: h.status_time_unix_nano,
            unhealthy_components: unhealthy,
        }
    }
}

/// Deep enough for a collector's pipelines and their components; a deeper (or
/// hostile) tree is cut off rather than walked.
const MAX_HEALTH_DEPTH: usize = 8;
const MAX_UNHEALTHY_LISTED: usize = 64;

fn collect_unhealthy(
    map: &BTreeMap<String, ComponentHealth>,
    prefix: &str,
    out: &mut Vec<String>,
    depth: usize,
) {
    if depth >= MAX_HEALTH_DEPTH {
        return;
    }
    for (name, h) in map {
        if out.len() >= MAX_UNHEALTHY_LISTED {
            return;
        }
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if !h.healthy {
            out.push(path.clone());
        }
        collect_unhealthy(&h.component_health_map, &path, out, depth + 1);
    }
}

/// What an agent runs with: the names of its effective configuration files and a hash
/// over names and bodies ([`config_files_hash`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveConfigSummary {
    pub hash: String,
    pub files: Vec<String>,
}

impl From<&EffectiveConfig> for EffectiveConfigSummary {
    fn from(c: &EffectiveConfig) -> Self {
        let files = c
            .config_map
            .as_ref()
            .map(|m| &m.config_map)
            .cloned()
            .unwrap_or_default();
        EffectiveConfigSummary {
            hash: config_files_hash(files.iter().map(|(n, f)| (n.as_str(), f.body.as_slice()))),
            files: files.into_keys().collect(),
        }
    }
}

/// sha256 over named files, in name order, each as the length of its name (8 bytes,
/// big-endian), the name, the length of its body and the body, in hex. Lengths keep
/// `("ab", "c")` and `("a", "bc")` apart. A configuration set hashed the same way
/// compares equal with an agent's effective configuration when the files are the same.
pub fn config_files_hash<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut sorted: Vec<(&str, &[u8])> = files.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Sha256::new();
    for (name, body) in sorted {
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((body.len() as u64).to_be_bytes());
        h.update(body);
    }
    hex::encode(h.finalize())
}

/// The configuration rollout's view of an agent's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConfigStatus {
    Applied,
    Applying,
    Failed,
}

impl ConfigStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigStatus::Applied => "APPLIED",
            ConfigStatus::Applying => "APPLYING",
            ConfigStatus::Failed => "FAILED",
        }
    }

    /// `RemoteConfigStatuses` to the rollout's statuses; `UNSET` (and values from a
    /// later spec) say nothing.
    pub fn from_wire(status: i32) -> Option<Self> {
        match RemoteConfigStatuses::try_from(status).ok()? {
            RemoteConfigStatuses::Unset => None,
            RemoteConfigStatuses::Applied => Some(ConfigStatus::Applied),
            RemoteConfigStatuses::Applying => Some(ConfigStatus::Applying),
            RemoteConfigStatuses::Failed => Some(ConfigStatus::Failed),
        }
    }
}

/// `RemoteConfigStatus`: which remote configuration (by the `config_hash` the server
/// gave it) the agent is reporting on, and how it went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteConfigReport {
    /// Hex of `last_remote_config_hash`; empty before any remote configuration.
    pub hash: String,
    pub status: Option<ConfigStatus>,
    pub error: String,
}

impl From<&RemoteConfigStatus> for RemoteConfigReport {
    fn from(s: &RemoteConfigStatus) -> Self {
        RemoteConfigReport {
            hash: hex::encode(&s.last_remote_config_hash),
            status: ConfigStatus::from_wire(s.status),
            error: s.error_message.clone(),
        }
    }
}

impl RemoteConfigReport {
    /// The status this report gives the configuration set of hash `set_hash`: none
    /// when it is about another set (an older one, or nothing yet).
    pub fn status_of(&self, set_hash: &str) -> Option<ConfigStatus> {
        if self.hash.eq_ignore_ascii_case(set_hash) {
            self.status
        } else {
            None
        }
    }
}

/// `PackageStatusEnum` as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PackageState {
    Installed,
    InstallPending,
    Installing,
    InstallFailed,
    Downloading,
}

impl PackageState {
    /// Values from a later spec read as still installing: not done, not failed.
    pub fn from_wire(status: i32) -> Self {
        match PackageStatusEnum::try_from(status) {
            Ok(PackageStatusEnum::Installed) => PackageState::Installed,
            Ok(PackageStatusEnum::InstallPending) => PackageState::InstallPending,
            Ok(PackageStatusEnum::Installing) => PackageState::Installing,
            Ok(PackageStatusEnum::InstallFailed) => PackageState::InstallFailed,
            Ok(PackageStatusEnum::Downloading) | Err(_) => PackageState::Downloading,
        }
    }

    /// The rollout's statuses, as a native agent reports them.
    pub fn update_status(self) -> UpdateStatus {
        match self {
            PackageState::Installed => UpdateStatus::Installed,
            PackageState::InstallFailed => UpdateStatus::InstallFailed,
            PackageState::InstallPending | PackageState::Installing | PackageState::Downloading => {
                UpdateStatus::Installing
            }
        }
    }
}

/// One `PackageStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageReport {
    pub agent_has_version: String,
    pub agent_has_hash: String,
    pub server_offered_version: String,
    pub server_offered_hash: String,
    pub state: PackageState,
    pub error: String,
}

/// `PackageStatuses`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackagesReport {
    /// Hex of `server_provided_all_packages_hash`: the last offer the agent received.
    pub all_packages_hash: String,
    pub error: String,
    pub packages: BTreeMap<String, PackageReport>,
}

impl From<&PackageStatuses> for PackagesReport {
    fn from(s: &PackageStatuses) -> Self {
        PackagesReport {
            all_packages_hash: hex::encode(&s.server_provided_all_packages_hash),
            error: s.error_message.clone(),
            packages: s
                .packages
                .iter()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        PackageReport {
                            agent_has_version: p.agent_has_version.clone(),
                            agent_has_hash: hex::encode(&p.agent_has_hash),
                            server_offered_version: p.server_offered_version.clone(),
                            server_offered_hash: hex::encode(&p.server_offered_hash),
                            state: PackageState::from_wire(p.status),
                            error: p.error_message.clone(),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// A package as the server offered it, in the terms agents report back (hex hashes);
/// see [`crate::answer::AgentPackage::offered`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedPackage {
    pub name: String,
    pub version: String,
    /// `PackageAvailable.hash`.
    pub package_hash: String,
    /// `PackagesAvailable.all_packages_hash` of the offer that carried it.
    pub all_packages_hash: String,
}

impl PackagesReport {
    /// How the agent is doing with an offered package, for the rollout: `None` while
    /// the report is about something else (the agent has not seen the offer yet, or
    /// reports an older one).
    pub fn outcome(&self, offer: &OfferedPackage) -> Option<UpdateStatus> {
        let Some(p) = self.packages.get(&offer.name) else {
            // The agent could not process the offer as a whole (spec: error_message
            // "not related to any particular single package").
            let failed_offer = !self.error.is_empty()
                && self
                    .all_packages_hash
                    .eq_ignore_ascii_case(&offer.all_packages_hash);
            return failed_offer.then_some(UpdateStatus::InstallFailed);
        };
        let has_it = if p.agent_has_hash.is_empty() {
            !p.agent_has_version.is_empty() && p.agent_has_version == offer.version
        } else {
            p.agent_has_hash.eq_ignore_ascii_case(&offer.package_hash)
        };
        let about_offer = if p.server_offered_hash.is_empty() {
            p.server_offered_version == offer.version
        } else {
            p.server_offered_hash
                .eq_ignore_ascii_case(&offer.package_hash)
        };
        match p.state {
            PackageState::Installed if has_it => Some(UpdateStatus::Installed),
            PackageState::Installed => None,
            // A failed update that left the old package in place still failed.
            state if about_offer => Some(state.update_status()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_named_as_the_specification_names_them() {
        let bits = AgentCapabilities::ReportsStatus as u64
            | AgentCapabilities::AcceptsRestartCommand as u64
            | (1 << 40);
        assert_eq!(
            capability_names(bits),
            ["ReportsStatus", "AcceptsRestartCommand"]
        );
        assert!(capability_names(0).is_empty());
    }
    use crate::proto::{AgentConfigFile, AgentConfigMap, PackageStatus};

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }

    #[test]
    fn description_values_become_text_and_group_is_found_in_either_list() {
        use any_value::Value::*;
        let d = proto::AgentDescription {
            identifying_attributes: vec![
                kv("service.name", StringValue("checkout".into())),
                kv("service.version", StringValue("1.4.2".into())),
            ],
            non_identifying_attributes: vec![
                kv("agent.group", StringValue("canary".into())),
                kv("cpus", IntValue(8)),
                kv("ratio", DoubleValue(0.5)),
                kv("debug", BoolValue(true)),
                kv("raw", BytesValue(vec![0xde, 0xad])),
                kv(
                    "tags",
                    ArrayValue(proto::ArrayValue {
                        values: vec![
                            AnyValue {
                                value: Some(StringValue("a".into())),
                            },
                            AnyValue { value: None },
                        ],
                    }),
                ),
                kv(
                    "nested",
                    KvlistValue(proto::KeyValueList {
                        values: vec![kv("k", IntValue(1))],
                    }),
                ),
                KeyValue {
                    key: "null".into(),
                    value: None,
                },
            ],
        };
        let d = Description::from(&d);
        assert_eq!(d.service_name(), Some("checkout"));
        assert_eq!(d.get("cpus"), Some("8"));
        assert_eq!(d.get("ratio"), Some("0.5"));
        assert_eq!(d.get("debug"), Some("true"));
        assert_eq!(d.get("raw"), Some("dead"));
        assert_eq!(d.get("tags"), Some("[a, ]"));
        assert_eq!(d.get("nested"), Some("{k: 1}"));
        assert_eq!(d.get("null"), Some(""));
        let view = AgentView {
            description: Some(d),
            ..Default::default()
        };
        assert_eq!(view.group(), "canary");

        // Identifying wins when both lists name it.
        let both = Description::from(&proto::AgentDescription {
            identifying_attributes: vec![kv("agent.group", StringValue("a".into()))],
            non_identifying_attributes: vec![kv("agent.group", StringValue("b".into()))],
        });
        assert_eq!(both.get(GROUP_ATTRIBUTE), Some("a"));
        assert_eq!(AgentView::default().group(), "");
    }

    #[test]
    fn health_lists_unhealthy_components_by_path() {
        let leaf = |healthy| ComponentHealth {
            healthy,
            ..Default::default()
        };
        let h = ComponentHealth {
            healthy: false,
            status: "degraded".into(),
            last_error: "exporter down".into(),
            component_health_map: BTreeMap::from([(
                "pipeline:traces".to_string(),
                ComponentHealth {
                    healthy: true,
                    component_health_map: BTreeMap::from([
                        ("exporter:otlp".to_string(), leaf(false)),
                        ("receiver:otlp".to_string(), leaf(true)),
                    ]),
                    ..Default::default()
                },
            )]),
            ..Default::default()
        };
        let h = Health::from(&h);
        assert!(!h.healthy);
        assert_eq!(h.status, "degraded");
        assert_eq!(h.unhealthy_components, ["pipeline:traces/exporter:otlp"]);
    }

    #[test]
    fn deep_health_trees_are_cut_off() {
        let mut h = ComponentHealth::default();
        for _ in 0..100 {
            h = ComponentHealth {
                healthy: false,
                component_health_map: BTreeMap::from([("c".to_string(), h)]),
                ..Default::default()
            };
        }
        assert_eq!(
            Health::from(&h).unhealthy_components.len(),
            MAX_HEALTH_DEPTH
        );
    }

    #[test]
    fn effective_config_hash_is_over_names_and_bodies() {
        let cfg = |files: &[(&str, &str)]| EffectiveConfig {
            config_map: Some(AgentConfigMap {
                config_map: files
                    .iter()
                    .map(|(n, b)| {
                        (
                            n.to_string(),
                            AgentConfigFile {
                                body: b.as_bytes().to_vec(),
                                content_type: "text/yaml".into(),
                            },
                        )
                    })
                    .collect(),
            }),
        };
        let a = EffectiveConfigSummary::from(&cfg(&[("a.yaml", "x: 1"), ("b.yaml", "y: 2")]));
        assert_eq!(a.files, ["a.yaml", "b.yaml"]);
        assert_eq!(
            a.hash,
            config_files_hash([("b.yaml", &b"y: 2"[..]), ("a.yaml", &b"x: 1"[..])])
        );
        let moved = EffectiveConfigSummary::from(&cfg(&[("a.yaml", "x: 1b"), ("b.yaml", ": 2")]));
        assert_ne!(a.hash, moved.hash);
        let empty = EffectiveConfigSummary::from(&EffectiveConfig { config_map: None });
        assert_eq!(empty.files.len(), 0);
        assert_eq!(empty.hash, config_files_hash([]));
    }

    #[test]
    fn remote_config_statuses_map_and_unset_says_nothing() {
        assert_eq!(ConfigStatus::from_wire(0), None);
        assert_eq!(ConfigStatus::from_wire(1), Some(ConfigStatus::Applied));
        assert_eq!(ConfigStatus::from_wire(2), Some(ConfigStatus::Applying));
        assert_eq!(ConfigStatus::from_wire(3), Some(ConfigStatus::Failed));
        assert_eq!(ConfigStatus::from_wire(9), None);
        // The Node client's first report: an empty RemoteConfigStatus.
        let r = RemoteConfigReport::from(&RemoteConfigStatus::default());
        assert_eq!(
            r,
            RemoteConfigReport {
                hash: String::new(),
                status: None,
                error: String::new()
            }
        );
        let r = RemoteConfigReport::from(&RemoteConfigStatus {
            last_remote_config_hash: vec![0xab; 32],
            status: RemoteConfigStatuses::Failed as i32,
            error_message: "bad yaml".into(),
        });
        assert_eq!(r.status_of(&"AB".repeat(32)), Some(ConfigStatus::Failed));
        assert_eq!(r.status_of(&"cd".repeat(32)), None);
        assert_eq!(
            serde_json::to_string(&ConfigStatus::Applied).unwrap(),
            "\"APPLIED\""
        );
    }

    fn report(state: PackageStatusEnum, has: &[u8], offered: &[u8]) -> PackagesReport {
        PackagesReport::from(&PackageStatuses {
            packages: BTreeMap::from([(
                "agent".to_string(),
                PackageStatus {
                    name: "agent".into(),
                    agent_has_version: if has.is_empty() {
                        String::new()
                    } else {
                        "2.1.0".into()
                    },
                    agent_has_hash: has.to_vec(),
                    server_offered_version: "2.2.0".into(),
                    server_offered_hash: offered.to_vec(),
                    status: state as i32,
                    error_message: String::new(),
                    download_details: None,
                },
            )]),
            server_provided_all_packages_hash: vec![9; 32],
            error_message: String::new(),
        })
    }

    #[test]
    fn package_statuses_map_to_update_statuses_for_the_offer_only() {
        let new = [2u8; 32];
        let old = [1u8; 32];
        let offer = OfferedPackage {
            name: "agent".into(),
            version: "2.2.0".into(),
            package_hash: hex::encode(new),
            all_packages_hash: hex::encode([9u8; 32]),
        };
        let outcome = |r: PackagesReport| r.outcome(&offer);
        assert_eq!(
            outcome(report(PackageStatusEnum::Installed, &new, &new)),
            Some(UpdateStatus::Installed)
        );
        // Still on the old package: not done.
        assert_eq!(
            outcome(report(PackageStatusEnum::Installed, &old, &[])),
            None
        );
        assert_eq!(
            outcome(report(PackageStatusEnum::Downloading, &old, &new)),
            Some(UpdateStatus::Installing)
        );
        assert_eq!(
            outcome(report(PackageStatusEnum::InstallPending, &old, &new)),
            Some(UpdateStatus::Installing)
        );
        assert_eq!(
            outcome(report(PackageStatusEnum::Installing, &old, &new)),
            Some(UpdateStatus::Installing)
        );
        assert_eq!(
            outcome(report(PackageStatusEnum::InstallFailed, &old, &new)),
            Some(UpdateStatus::InstallFailed)
        );
        // A failure of some earlier offer is not this rollout's failure.
        assert_eq!(
            outcome(report(PackageStatusEnum::InstallFailed, &old, &old)),
            None
        );
        // No such package at all.
        let other = OfferedPackage {
            name: "other".into(),
            ..offer.clone()
        };
        assert_eq!(
            report(PackageStatusEnum::Installed, &new, &new).outcome(&other),
            None
        );
        // An error with the whole offer, before any package was touched.
        let whole = |all: u8| PackagesReport {
            all_packages_hash: hex::encode([all; 32]),
            error: "no space left on device".into(),
            packages: BTreeMap::new(),
        };
        assert_eq!(whole(9).outcome(&offer), Some(UpdateStatus::InstallFailed));
        assert_eq!(whole(8).outcome(&offer), None);
        assert_eq!(PackagesReport::default().outcome(&offer), None);
        assert_eq!(PackageState::from_wire(42), PackageState::Downloading);
        assert_eq!(
            PackageState::from_wire(3).update_status().as_str(),
            "INSTALL_FAILED"
        );
    }
}
