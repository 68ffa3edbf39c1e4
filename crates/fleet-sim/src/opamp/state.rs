//! What one simulated OpAMP agent knows and says, without a socket or a clock: the
//! next `AgentToServer` (sequence numbers, only the parts that changed unless a full
//! state is due), and what an answer or a push asks of it (an install, a remote
//! configuration applied at once, a new instance uid, a wait). The transports in
//! [`super`] carry the bytes and run the installs.

use std::collections::HashSet;
use std::time::Duration;

use agent_opamp::answer::AGENT_PACKAGE;
use agent_opamp::proto::{
    AgentCapabilities, AgentConfigMap, AgentDescription, AgentDisconnect, AgentRemoteConfig,
    AgentToServer, AnyValue, ComponentHealth, EffectiveConfig, KeyValue, PackageStatus,
    PackageStatusEnum, PackageStatuses, PackagesAvailable, RemoteConfigStatus,
    RemoteConfigStatuses, ServerErrorResponseType, ServerToAgent, ServerToAgentFlags, any_value,
    server_error_response,
};
use agent_protocol::AgentVersion;

/// What the simulated agent declares it does: everything a managed agent with
/// packages does, nothing about connection settings.
pub const CAPABILITIES: u64 = AgentCapabilities::ReportsStatus as u64
    | AgentCapabilities::AcceptsRemoteConfig as u64
    | AgentCapabilities::ReportsEffectiveConfig as u64
    | AgentCapabilities::AcceptsPackages as u64
    | AgentCapabilities::ReportsPackageStatuses as u64
    | AgentCapabilities::ReportsHealth as u64
    | AgentCapabilities::ReportsRemoteConfig as u64
    | AgentCapabilities::ReportsHeartbeat as u64;

/// The `agent` package as offered: what to fetch and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub version: AgentVersion,
    pub download_url: String,
    pub headers: Vec<(String, String)>,
    /// sha256 of the file.
    pub content_hash: Vec<u8>,
    /// The `.minisig` file's bytes.
    pub signature: Vec<u8>,
    /// `PackageAvailable.hash`.
    pub package_hash: Vec<u8>,
    pub all_packages_hash: Vec<u8>,
}

/// What an answer (or a push) asks the agent to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaction {
    /// Fetch, check and install this.
    pub install: Option<Offer>,
    /// Something changed that the server should hear now, not at the next heartbeat.
    pub send_now: bool,
    /// The server is throttling: say nothing more for this long.
    pub retry_after: Option<Duration>,
    /// The server refused the message as malformed (a bug on one side: counted).
    pub refused: Option<String>,
}

/// Parts of the status that changed since they were last sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Dirty {
    description: bool,
    health: bool,
    effective_config: bool,
    remote_config: bool,
    packages: bool,
}

impl Dirty {
    const ALL: Dirty = Dirty {
        description: true,
        health: true,
        effective_config: true,
        remote_config: true,
        packages: true,
    };
}

/// One simulated OpAMP agent's state.
#[derive(Debug, Clone)]
pub struct AgentState {
    pub uid: [u8; 16],
    /// The `sequence_num` of the last message built (0: none yet).
    seq: u64,
    name: String,
    group: Option<String>,
    /// `os.type` and `host.arch` as OpenTelemetry writes them (`linux`, `amd64`): what
    /// the server picks a release's bundle by.
    os_type: String,
    host_arch: String,
    pub version: AgentVersion,
    /// Unix nanoseconds the running version started.
    started_ns: u64,
    /// The configuration it runs: hash and files (empty until one is offered).
    config_hash: Vec<u8>,
    config: AgentConfigMap,
    packages: PackageStatuses,
    dirty: Dirty,
    /// An install runs: further offers wait until it ends.
    installing: bool,
    /// `all_packages_hash` values already taken up (offers are repeated until reported on).
    taken: HashSet<Vec<u8>>,
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
    }
}

/// `(os.type, host.arch)` in OpenTelemetry's words for a Rust target triple
/// (`<arch>-<vendor>-<os>[-<env>]`): `x86_64-unknown-linux-musl` is `("linux", "amd64")`.
/// OpAMP has no word for the C library. An architecture OpenTelemetry does not name is
/// passed on as the triple writes it.
pub fn otel_platform(triple: &str) -> (String, String) {
    let mut parts = triple.split('-');
    let arch = match parts.next().unwrap_or_default() {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "i686" | "i586" => "x86",
        "arm" | "armv7" => "arm32",
        "powerpc64" | "powerpc64le" => "ppc64",
        other => other,
    };
    let os = match parts.nth(1).unwrap_or_default() {
        "apple" | "darwin" => "darwin",
        other => other,
    };
    (os.to_owned(), arch.to_owned())
}

impl AgentState {
    pub fn new(
        uid: [u8; 16],
        index: usize,
        version: AgentVersion,
        group: Option<String>,
        now_ns: u64,
    ) -> Self {
        let mut state = Self {
            uid,
            seq: 0,
            name: format!("sim-{index:05}"),
            group,
            os_type: String::new(),
            host_arch: String::new(),
            version: version.clone(),
            started_ns: now_ns,
            config_hash: Vec::new(),
            config: AgentConfigMap::default(),
            packages: PackageStatuses::default(),
            dirty: Dirty::ALL,
            installing: false,
            taken: HashSet::new(),
        };
        state.set_package(PackageStatus {
            name: AGENT_PACKAGE.to_owned(),
            agent_has_version: version.to_string(),
            status: PackageStatusEnum::Installed as i32,
            ..Default::default()
        });
        state.on(agent_protocol::layout::PLATFORM)
    }

    /// This agent describes itself as running on `platform` (a Rust target triple, as
    /// `fleet-sim --platform` names it).
    pub fn on(mut self, platform: &str) -> Self {
        (self.os_type, self.host_arch) = otel_platform(platform);
        self.dirty.description = true;
        self
    }

    fn set_package(&mut self, status: PackageStatus) {
        self.packages
            .packages
            .insert(AGENT_PACKAGE.to_owned(), status);
        self.dirty.packages = true;
    }

    fn description(&self) -> AgentDescription {
        let mut non_identifying = vec![
            text("os.type", &self.os_type),
            text("host.arch", &self.host_arch),
            text("host.name", &self.name),
        ];
        if let Some(group) = &self.group {
            non_identifying.push(text("agent.group", group));
        }
        AgentDescription {
            identifying_attributes: vec![
                text("service.name", &self.name),
                text("service.version", &self.version.to_string()),
            ],
            non_identifying_attributes: non_identifying,
        }
    }

    fn health(&self) -> ComponentHealth {
        ComponentHealth {
            healthy: true,
            start_time_unix_nano: self.started_ns,
            status: "running".to_owned(),
            ..Default::default()
        }
    }

    /// The next message: a new `sequence_num`, the changed parts (all of them when
    /// `full`, as on a new connection), the capabilities always.
    pub fn next_message(&mut self, full: bool) -> AgentToServer {
        if full {
            self.dirty = Dirty::ALL;
        }
        self.seq += 1;
        let dirty = std::mem::take(&mut self.dirty);
        AgentToServer {
            instance_uid: self.uid.to_vec(),
            sequence_num: self.seq,
            capabilities: CAPABILITIES,
            agent_description: dirty.description.then(|| self.description()),
            health: dirty.health.then(|| self.health()),
            effective_config: dirty.effective_config.then(|| EffectiveConfig {
                config_map: Some(self.config.clone()),
            }),
            remote_config_status: dirty.remote_config.then(|| RemoteConfigStatus {
                last_remote_config_hash: self.config_hash.clone(),
                status: if self.config_hash.is_empty() {
                    RemoteConfigStatuses::Unset as i32
                } else {
                    RemoteConfigStatuses::Applied as i32
                },
                error_message: String::new(),
            }),
            package_statuses: dirty.packages.then(|| self.packages.clone()),
            ..Default::default()
        }
    }

    /// The goodbye: the next number, `agent_disconnect` and nothing else.
    pub fn goodbye(&mut self) -> AgentToServer {
        self.seq += 1;
        AgentToServer {
            instance_uid: self.uid.to_vec(),
            sequence_num: self.seq,
            capabilities: CAPABILITIES,
            agent_disconnect: Some(AgentDisconnect {}),
            ..Default::default()
        }
    }

    /// `msg` never reached the server: the next message takes its number again and
    /// carries what it carried (a repeated number is a retry to the server, not a gap).
    pub fn unsent(&mut self, msg: &AgentToServer) {
        if msg.sequence_num == self.seq {
            self.seq -= 1;
        }
        self.dirty.description |= msg.agent_description.is_some();
        self.dirty.health |= msg.health.is_some();
        self.dirty.effective_config |= msg.effective_config.is_some();
        self.dirty.remote_config |= msg.remote_config_status.is_some();
        self.dirty.packages |= msg.package_statuses.is_some();
    }

    /// Something to tell the server that has not been sent yet.
    pub fn has_news(&self) -> bool {
        self.dirty != Dirty::default()
    }

    /// Takes in an answer or a push.
    pub fn on_answer(&mut self, answer: &ServerToAgent) -> Reaction {
        let mut reaction = Reaction::default();
        if let Some(err) = &answer.error_response {
            if err.r#type == ServerErrorResponseType::Unavailable as i32 {
                let wait = match &err.details {
                    Some(server_error_response::Details::RetryInfo(r)) => {
                        Duration::from_nanos(r.retry_after_nanoseconds)
                    }
                    None => Duration::ZERO,
                };
                reaction.retry_after = Some(wait);
            } else {
                reaction.refused = Some(err.error_message.clone());
            }
            return reaction;
        }
        if let Some(id) = &answer.agent_identification
            && let Ok(uid) = <[u8; 16]>::try_from(id.new_instance_uid.as_slice())
        {
            self.uid = uid;
            self.dirty = Dirty::ALL;
            reaction.send_now = true;
        }
        if answer.flags & ServerToAgentFlags::ReportFullState as u64 != 0 {
            self.dirty = Dirty::ALL;
            reaction.send_now = true;
        }
        if let Some(rc) = &answer.remote_config {
            reaction.send_now |= self.apply_config(rc);
        }
        if let Some(pa) = &answer.packages_available {
            let (install, changed) = self.take_offer(pa);
            reaction.install = install;
            reaction.send_now |= changed;
        }
        reaction
    }

    /// Runs the offered configuration at once: `APPLIED` and the files as the
    /// effective configuration. True if it was new.
    fn apply_config(&mut self, rc: &AgentRemoteConfig) -> bool {
        if rc.config_hash.is_empty() || rc.config_hash == self.config_hash {
            return false;
        }
        self.config_hash.clone_from(&rc.config_hash);
        self.config = rc.config.clone().unwrap_or_default();
        self.dirty.remote_config = true;
        self.dirty.effective_config = true;
        true
    }

    /// An offer of the `agent` package: the install to run, if any, and whether a
    /// status changed (an offer of the version it runs is installed already; an offer
    /// that cannot be used is failed at once).
    fn take_offer(&mut self, pa: &PackagesAvailable) -> (Option<Offer>, bool) {
        if self.installing || self.taken.contains(&pa.all_packages_hash) {
            return (None, false);
        }
        let Some(pkg) = pa.packages.get(AGENT_PACKAGE) else {
            return (None, false);
        };
        self.taken.insert(pa.all_packages_hash.clone());
        let failed = |state: &mut Self, why: String| {
            state.packages.server_provided_all_packages_hash = pa.all_packages_hash.clone();
            state.set_package(PackageStatus {
                name: AGENT_PACKAGE.to_owned(),
                agent_has_version: state.version.to_string(),
                server_offered_version: pkg.version.clone(),
                server_offered_hash: pkg.hash.clone(),
                status: PackageStatusEnum::InstallFailed as i32,
                error_message: why,
                ..Default::default()
            });
            (None, true)
        };
        let version = match pkg.version.parse::<AgentVersion>() {
            Ok(v) => v,
            Err(e) => return failed(self, format!("offered version {:?}: {e}", pkg.version)),
        };
        let Some(file) = &pkg.file else {
            return failed(self, "the offer has no file to download".to_owned());
        };
        if version == self.version {
            self.packages.server_provided_all_packages_hash = pa.all_packages_hash.clone();
            self.set_package(PackageStatus {
                name: AGENT_PACKAGE.to_owned(),
                agent_has_version: version.to_string(),
                agent_has_hash: pkg.hash.clone(),
                server_offered_version: pkg.version.clone(),
                server_offered_hash: pkg.hash.clone(),
                status: PackageStatusEnum::Installed as i32,
                ..Default::default()
            });
            return (None, true);
        }
        self.installing = true;
        let offer = Offer {
            version,
            download_url: file.download_url.clone(),
            headers: file
                .headers
                .as_ref()
                .map(|h| {
                    h.headers
                        .iter()
                        .map(|h| (h.key.clone(), h.value.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            content_hash: file.content_hash.clone(),
            signature: file.signature.clone(),
            package_hash: pkg.hash.clone(),
            all_packages_hash: pa.all_packages_hash.clone(),
        };
        (Some(offer), false)
    }

    fn offered_status(&self, offer: &Offer, status: PackageStatusEnum) -> PackageStatus {
        PackageStatus {
            name: AGENT_PACKAGE.to_owned(),
            agent_has_version: self.version.to_string(),
            server_offered_version: offer.version.to_string(),
            server_offered_hash: offer.package_hash.clone(),
            status: status as i32,
            ..Default::default()
        }
    }

    /// The download could not be had (refused, cut off): nothing to report; the next
    /// offer of the same package is taken up again.
    pub fn fetch_gave_up(&mut self, offer: &Offer) {
        self.installing = false;
        self.taken.remove(&offer.all_packages_hash);
    }

    /// Fetched and checked: `INSTALLING`.
    pub fn installing(&mut self, offer: &Offer) {
        self.packages.server_provided_all_packages_hash = offer.all_packages_hash.clone();
        let status = self.offered_status(offer, PackageStatusEnum::Installing);
        self.set_package(status);
    }

    /// `INSTALL_FAILED`: the old version keeps running, this offer is not taken again.
    pub fn install_failed(&mut self, offer: &Offer, why: String) {
        self.installing = false;
        self.packages.server_provided_all_packages_hash = offer.all_packages_hash.clone();
        let mut status = self.offered_status(offer, PackageStatusEnum::InstallFailed);
        status.error_message = why;
        self.set_package(status);
    }

    /// The new version runs: `INSTALLED`, its version in the description, its start in
    /// the health. Returns the version it ran before.
    pub fn installed(&mut self, offer: &Offer, now_ns: u64) -> AgentVersion {
        self.installing = false;
        let from = std::mem::replace(&mut self.version, offer.version.clone());
        self.started_ns = now_ns;
        self.packages.server_provided_all_packages_hash = offer.all_packages_hash.clone();
        let mut status = self.offered_status(offer, PackageStatusEnum::Installed);
        status.agent_has_hash = offer.package_hash.clone();
        self.set_package(status);
        self.dirty.description = true;
        self.dirty.health = true;
        from
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use agent_opamp::proto::{
        AgentConfigFile, AgentIdentification, DownloadableFile, PackageAvailable, RetryInfo,
        ServerErrorResponse,
    };

    fn v(s: &str) -> AgentVersion {
        s.parse().unwrap()
    }

    fn agent() -> AgentState {
        AgentState::new([7; 16], 3, v("1.0.0+1"), Some("canary".into()), 42)
    }

    fn offer_of(version: &str) -> PackagesAvailable {
        PackagesAvailable {
            packages: BTreeMap::from([(
                AGENT_PACKAGE.to_owned(),
                PackageAvailable {
                    version: version.to_owned(),
                    hash: vec![9; 32],
                    file: Some(DownloadableFile {
                        download_url: "http://s/agentupdate/download".into(),
                        content_hash: vec![1; 32],
                        signature: b"sig".to_vec(),
                        headers: None,
                    }),
                    ..Default::default()
                },
            )]),
            all_packages_hash: version.as_bytes().to_vec(),
        }
    }

    fn attr<'a>(d: &'a AgentDescription, key: &str) -> Option<&'a str> {
        d.identifying_attributes
            .iter()
            .chain(&d.non_identifying_attributes)
            .find(|kv| kv.key == key)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.as_str()),
                _ => None,
            })
    }

    #[test]
    fn the_description_names_the_platform_as_opentelemetry_does() {
        let mut a = agent().on("aarch64-unknown-linux-musl");
        let first = a.next_message(false);
        let d = first.agent_description.as_ref().unwrap();
        assert_eq!(attr(d, "os.type"), Some("linux"));
        assert_eq!(attr(d, "host.arch"), Some("arm64"));
        assert_eq!(
            otel_platform("x86_64-unknown-linux-gnu"),
            ("linux".to_owned(), "amd64".to_owned())
        );
        assert_eq!(
            otel_platform("riscv64gc-unknown-linux-gnu"),
            ("linux".to_owned(), "riscv64gc".to_owned())
        );
        // By default, the machine the simulator was built for.
        let mut native = agent();
        let d = native.next_message(false).agent_description.unwrap();
        let (os, arch) = otel_platform(agent_protocol::layout::PLATFORM);
        assert_eq!(
            (attr(&d, "os.type"), attr(&d, "host.arch")),
            (Some(os.as_str()), Some(arch.as_str()))
        );
    }

    #[test]
    fn first_message_is_full_then_only_the_sequence_moves() {
        let mut a = agent();
        let first = a.next_message(false);
        assert_eq!(first.sequence_num, 1);
        assert_eq!(first.capabilities, CAPABILITIES);
        let d = first.agent_description.as_ref().unwrap();
        assert_eq!(attr(d, "service.name"), Some("sim-00003"));
        assert_eq!(attr(d, "service.version"), Some("1.0.0+1"));
        assert_eq!(attr(d, "agent.group"), Some("canary"));
        assert!(first.health.as_ref().unwrap().healthy);
        assert!(first.effective_config.is_some() && first.remote_config_status.is_some());
        assert_eq!(
            first.package_statuses.unwrap().packages["agent"].agent_has_version,
            "1.0.0+1"
        );
        let second = a.next_message(false);
        assert_eq!(second.sequence_num, 2);
        assert!(second.agent_description.is_none() && second.package_statuses.is_none());
        assert!(!a.has_news());
        // A full state on demand, numbers still in order.
        let third = a.next_message(true);
        assert_eq!(third.sequence_num, 3);
        assert!(third.agent_description.is_some() && third.package_statuses.is_some());
    }

    #[test]
    fn a_message_that_did_not_arrive_is_sent_again_with_its_number() {
        let mut a = agent();
        let first = a.next_message(false);
        a.unsent(&first);
        let again = a.next_message(false);
        assert_eq!(again, first);
        let hb = a.next_message(false);
        a.unsent(&hb);
        assert_eq!(a.next_message(false).sequence_num, 2);
    }

    #[test]
    fn report_full_state_and_a_new_uid_are_obeyed() {
        let mut a = agent();
        a.next_message(false);
        let r = a.on_answer(&ServerToAgent {
            flags: ServerToAgentFlags::ReportFullState as u64,
            ..Default::default()
        });
        assert!(r.send_now);
        assert!(a.next_message(false).agent_description.is_some());
        let r = a.on_answer(&ServerToAgent {
            agent_identification: Some(AgentIdentification {
                new_instance_uid: vec![8; 16],
            }),
            ..Default::default()
        });
        assert!(r.send_now);
        let m = a.next_message(false);
        assert_eq!(m.instance_uid, vec![8; 16]);
        assert!(m.agent_description.is_some());
    }

    #[test]
    fn remote_config_is_applied_once_and_reported_with_its_hash() {
        let mut a = agent();
        a.next_message(false);
        let rc = AgentRemoteConfig {
            config: Some(AgentConfigMap {
                config_map: BTreeMap::from([(
                    "app.json".to_owned(),
                    AgentConfigFile {
                        body: b"{}".to_vec(),
                        content_type: "application/json".into(),
                    },
                )]),
            }),
            config_hash: vec![5; 32],
        };
        let answer = ServerToAgent {
            remote_config: Some(rc.clone()),
            ..Default::default()
        };
        assert!(a.on_answer(&answer).send_now);
        let m = a.next_message(false);
        let status = m.remote_config_status.unwrap();
        assert_eq!(status.last_remote_config_hash, vec![5; 32]);
        assert_eq!(status.status, RemoteConfigStatuses::Applied as i32);
        assert_eq!(
            m.effective_config.unwrap().config_map.unwrap(),
            rc.config.unwrap()
        );
        // The same set again is nothing new.
        assert!(!a.on_answer(&answer).send_now);
        assert!(!a.has_news());
    }

    #[test]
    fn an_offer_is_installed_once_and_reported_through_its_states() {
        let mut a = agent();
        a.next_message(false);
        let pa = offer_of("2.0.0+2");
        let r = a.on_answer(&ServerToAgent {
            packages_available: Some(pa.clone()),
            ..Default::default()
        });
        let offer = r.install.expect("an install");
        assert_eq!(offer.version, v("2.0.0+2"));
        assert_eq!(offer.content_hash, vec![1; 32]);
        assert_eq!(offer.signature, b"sig");
        // Repeated (the server offers until it hears back): not a second install.
        let again = a.on_answer(&ServerToAgent {
            packages_available: Some(pa.clone()),
            ..Default::default()
        });
        assert_eq!(again.install, None);
        a.installing(&offer);
        let p = a.next_message(false).package_statuses.unwrap();
        assert_eq!(p.server_provided_all_packages_hash, pa.all_packages_hash);
        assert_eq!(
            p.packages["agent"].status,
            PackageStatusEnum::Installing as i32
        );
        assert_eq!(p.packages["agent"].server_offered_hash, vec![9; 32]);
        assert_eq!(a.installed(&offer, 99), v("1.0.0+1"));
        let m = a.next_message(false);
        let p = m.package_statuses.unwrap();
        assert_eq!(
            p.packages["agent"].status,
            PackageStatusEnum::Installed as i32
        );
        assert_eq!(p.packages["agent"].agent_has_version, "2.0.0+2");
        assert_eq!(p.packages["agent"].agent_has_hash, vec![9; 32]);
        let d = m.agent_description.unwrap();
        assert_eq!(attr(&d, "service.version"), Some("2.0.0+2"));
        assert_eq!(m.health.unwrap().start_time_unix_nano, 99);
        // The version it now runs, offered again: installed already, nothing to fetch.
        let mut b = agent();
        b.next_message(false);
        let r = b.on_answer(&ServerToAgent {
            packages_available: Some(offer_of("1.0.0+1")),
            ..Default::default()
        });
        assert!(r.install.is_none() && r.send_now);
    }

    #[test]
    fn a_failed_install_is_reported_and_not_retried_but_a_failed_fetch_is() {
        let mut a = agent();
        a.next_message(false);
        let answer = ServerToAgent {
            packages_available: Some(offer_of("2.0.0+2")),
            ..Default::default()
        };
        let offer = a.on_answer(&answer).install.unwrap();
        a.fetch_gave_up(&offer);
        assert!(!a.has_news());
        let offer = a.on_answer(&answer).install.expect("taken up again");
        a.install_failed(&offer, "sha256 mismatch".into());
        let p = a.next_message(false).package_statuses.unwrap();
        assert_eq!(
            p.packages["agent"].status,
            PackageStatusEnum::InstallFailed as i32
        );
        assert_eq!(p.packages["agent"].error_message, "sha256 mismatch");
        assert_eq!(p.packages["agent"].agent_has_version, "1.0.0+1");
        assert!(a.on_answer(&answer).install.is_none());
        // An offer that cannot be read fails at once.
        let mut b = agent();
        let r = b.on_answer(&ServerToAgent {
            packages_available: Some(offer_of("not a version")),
            ..Default::default()
        });
        assert!(r.install.is_none() && r.send_now);
        let p = b.next_message(false).package_statuses.unwrap();
        assert_eq!(
            p.packages["agent"].status,
            PackageStatusEnum::InstallFailed as i32
        );
    }

    #[test]
    fn throttling_and_refusals() {
        let mut a = agent();
        let r = a.on_answer(&ServerToAgent {
            error_response: Some(ServerErrorResponse {
                r#type: ServerErrorResponseType::Unavailable as i32,
                error_message: "busy".into(),
                details: Some(server_error_response::Details::RetryInfo(RetryInfo {
                    retry_after_nanoseconds: 5_000_000_000,
                })),
            }),
            ..Default::default()
        });
        assert_eq!(r.retry_after, Some(Duration::from_secs(5)));
        let r = a.on_answer(&ServerToAgent {
            error_response: Some(ServerErrorResponse {
                r#type: ServerErrorResponseType::BadRequest as i32,
                error_message: "no uid".into(),
                details: None,
            }),
            ..Default::default()
        });
        assert_eq!(r.refused.as_deref(), Some("no uid"));
        let bye = a.goodbye();
        assert!(bye.agent_disconnect.is_some());
    }
}
