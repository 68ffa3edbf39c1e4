//! What the server says back: the `ServerToAgent` for an [`Observation`], the offers
//! it may carry (a configuration set as `AgentRemoteConfig`, the `agent` package as
//! `PackagesAvailable`), and the error answers.
//!
//! An offer goes only to an agent that declared it accepts it, and only while the
//! agent has not acknowledged the same hash: a configuration the agent reported (even
//! as `FAILED`) or a package offer it received is not sent again until it changes.

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::proto::{
    AgentCapabilities, AgentConfigFile, AgentConfigMap, AgentIdentification, AgentRemoteConfig,
    CommandType, ConnectionSettingsOffers, DownloadableFile, Header, Headers,
    OpAmpConnectionSettings, PackageAvailable, PackageType, PackagesAvailable, RetryInfo,
    ServerCapabilities, ServerErrorResponse, ServerErrorResponseType, ServerToAgent,
    ServerToAgentCommand, ServerToAgentFlags, TelemetryConnectionSettings, server_error_response,
};
use crate::session::Observation;
use crate::view::{AgentView, OfferedPackage};

/// The name of the one top-level package this server offers: its agent bundle.
pub const AGENT_PACKAGE: &str = "agent";

/// What this server does: status, effective configuration and package statuses in;
/// remote configuration, packages and OpAMP connection settings (a rotated credential,
/// another endpoint) out.
pub const SERVER_CAPABILITIES: u64 = ServerCapabilities::AcceptsStatus as u64
    | ServerCapabilities::OffersRemoteConfig as u64
    | ServerCapabilities::AcceptsEffectiveConfig as u64
    | ServerCapabilities::OffersPackages as u64
    | ServerCapabilities::AcceptsPackagesStatus as u64
    | ServerCapabilities::OffersConnectionSettings as u64;

/// What the fleet wants one agent to have now. Either may be absent (no set for its
/// group, no bundle or its wave not open).
#[derive(Debug, Clone, Default)]
pub struct Offers {
    pub remote_config: Option<AgentRemoteConfig>,
    pub packages: Option<PackagesAvailable>,
    /// Built with [`connection_settings`]; sent only to an agent that accepts them.
    pub connection_settings: Option<ConnectionSettingsOffers>,
}

/// The answer to a message the server accepted. `sent_uid` is the message's
/// `instance_uid` as it came: clients compare the echo byte for byte.
pub fn answer(sent_uid: &[u8], obs: &Observation, offers: Offers) -> ServerToAgent {
    let mut out = ServerToAgent {
        instance_uid: sent_uid.to_vec(),
        ..Default::default()
    };
    if obs.send_capabilities {
        out.capabilities = SERVER_CAPABILITIES;
    }
    if obs.report_full_state {
        out.flags |= ServerToAgentFlags::ReportFullState as u64;
    }
    if let Some(new) = obs.new_instance_uid {
        out.agent_identification = Some(AgentIdentification {
            new_instance_uid: new.to_wire(obs.uid_form),
        });
    }
    // A uid that belongs to another agent gets nothing meant for that agent.
    if obs.duplicate || obs.disconnected {
        return out;
    }
    out.remote_config = offers
        .remote_config
        .filter(|rc| wants_remote_config(&obs.view, &rc.config_hash));
    out.packages_available = offers
        .packages
        .filter(|p| wants_packages(&obs.view, &p.all_packages_hash));
    out.connection_settings = offers
        .connection_settings
        .and_then(|c| settings_for(c, &obs.view));
    out
}

/// Of `offers`, what the agent of `view` takes: the OpAMP connection's settings if it
/// declared `AcceptsOpAMPConnectionSettings`, `own_metrics` if `ReportsOwnMetrics`,
/// `own_logs` if `ReportsOwnLogs`; `None` when nothing is left.
pub fn settings_for(
    mut offers: ConnectionSettingsOffers,
    view: &AgentView,
) -> Option<ConnectionSettingsOffers> {
    if !view.has(AgentCapabilities::AcceptsOpAmpConnectionSettings) {
        offers.opamp = None;
    }
    if !view.has(AgentCapabilities::ReportsOwnMetrics) {
        offers.own_metrics = None;
    }
    if !view.has(AgentCapabilities::ReportsOwnLogs) {
        offers.own_logs = None;
    }
    (offers.opamp.is_some() || offers.own_metrics.is_some() || offers.own_logs.is_some())
        .then_some(offers)
}

/// Whether the agent of `view` is offered its own-telemetry settings whose hash is
/// `hash` (empty: none) now: it reports its own metrics or logs, and it was last offered
/// others, or (`fresh`: the server lost track of it, or first hears it) there is a
/// destination, which the specification wants in the first answer.
pub fn wants_own_telemetry(view: &AgentView, hash: &str, fresh: bool) -> bool {
    let reports = view.has(AgentCapabilities::ReportsOwnMetrics)
        || view.has(AgentCapabilities::ReportsOwnLogs);
    reports && (view.own_telemetry != hash || (fresh && !hash.is_empty()))
}

/// Whether the answer to `obs` may be a command: one that carries nothing else the
/// agent must hear first (a new uid, a request for its full state), for an agent that
/// is still there. A command waits for the next message otherwise.
pub fn may_command(obs: &Observation) -> bool {
    !obs.duplicate && !obs.disconnected && !obs.report_full_state && obs.new_instance_uid.is_none()
}

/// `ServerToAgentCommand{Restart}` alone, as the specification requires of a command:
/// only `instance_uid` and, on a connection's first answer, `capabilities` beside it.
pub fn restart(sent_uid: &[u8], send_capabilities: bool) -> ServerToAgent {
    ServerToAgent {
        instance_uid: sent_uid.to_vec(),
        capabilities: if send_capabilities {
            SERVER_CAPABILITIES
        } else {
            0
        },
        command: Some(ServerToAgentCommand {
            r#type: CommandType::Restart as i32,
        }),
        ..Default::default()
    }
}

/// What the server offers of an agent's connections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionOffer {
    /// A new credential: the agent sends `Authorization: Bearer <it>` from then on.
    pub bearer: Option<String>,
    /// Another server's OpAMP URL to connect to.
    pub destination_endpoint: Option<String>,
    /// Where it sends its own telemetry.
    pub own_telemetry: Option<OwnTelemetry>,
}

/// `own_metrics` and `own_logs`: full OTLP/HTTP URLs (an empty one: send none of it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnTelemetry {
    pub metrics: String,
    pub logs: String,
    pub headers: Vec<(String, String)>,
    /// Identifies these settings (the fleet's destination hash; empty when off).
    pub hash: String,
}

fn headers_of(pairs: &[(String, String)]) -> Option<Headers> {
    (!pairs.is_empty()).then(|| Headers {
        headers: pairs
            .iter()
            .map(|(key, value)| Header {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    })
}

/// `ConnectionSettingsOffers`: its `opamp` settings (when a credential or an endpoint is
/// offered) with the credential as the `Authorization` header and the endpoint as
/// `destination_endpoint`, and `own_metrics` / `own_logs`; `hash` covers them all, so an
/// agent told the same settings again knows they are the same.
pub fn connection_settings(offer: &ConnectionOffer) -> ConnectionSettingsOffers {
    let headers = offer.bearer.as_ref().map(|token| Headers {
        headers: vec![Header {
            key: "Authorization".to_owned(),
            value: format!("Bearer {token}"),
        }],
    });
    let endpoint = offer.destination_endpoint.clone().unwrap_or_default();
    let mut h = Sha256::new();
    let own = offer.own_telemetry.as_ref();
    for part in [
        offer.bearer.as_deref().unwrap_or_default().as_bytes(),
        endpoint.as_bytes(),
        own.map(|o| o.hash.as_str()).unwrap_or_default().as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    let telemetry = |url: &str, o: &OwnTelemetry| TelemetryConnectionSettings {
        destination_endpoint: url.to_owned(),
        headers: headers_of(&o.headers),
        ..Default::default()
    };
    let opamp = (offer.bearer.is_some() || offer.destination_endpoint.is_some()).then(|| {
        OpAmpConnectionSettings {
            destination_endpoint: endpoint,
            headers,
            ..Default::default()
        }
    });
    ConnectionSettingsOffers {
        hash: h.finalize().to_vec(),
        opamp,
        own_metrics: own.map(|o| telemetry(&o.metrics, o)),
        own_logs: own.map(|o| telemetry(&o.logs, o)),
        ..Default::default()
    }
}

/// Whether an offer of this configuration is due: the agent accepts remote
/// configuration and has not reported on this hash.
pub fn wants_remote_config(view: &AgentView, config_hash: &[u8]) -> bool {
    view.has(AgentCapabilities::AcceptsRemoteConfig)
        && view
            .remote_config
            .as_ref()
            .is_none_or(|r| !r.hash.eq_ignore_ascii_case(&hex::encode(config_hash)))
}

/// Whether an offer of these packages is due: the agent accepts packages and has
/// not received this `all_packages_hash`.
pub fn wants_packages(view: &AgentView, all_packages_hash: &[u8]) -> bool {
    view.has(AgentCapabilities::AcceptsPackages)
        && view.packages.as_ref().is_none_or(|p| {
            !p.all_packages_hash
                .eq_ignore_ascii_case(&hex::encode(all_packages_hash))
        })
}

/// A configuration set as `AgentRemoteConfig`: one `AgentConfigFile` per named file,
/// with a `content_type` from its extension (the Python client parses only JSON it
/// is told is JSON), and `config_hash` the set's hash (hex) as bytes.
pub fn remote_config<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    set_hash: &str,
) -> Result<AgentRemoteConfig> {
    let config_hash = from_hex("configuration set hash", set_hash)?;
    let config_map: BTreeMap<String, AgentConfigFile> = files
        .into_iter()
        .map(|(name, body)| {
            (
                name.to_owned(),
                AgentConfigFile {
                    body: body.to_vec(),
                    content_type: content_type_for(name).to_owned(),
                },
            )
        })
        .collect();
    Ok(AgentRemoteConfig {
        config: Some(AgentConfigMap { config_map }),
        config_hash,
    })
}

/// The MIME type a file's name suggests; empty (unknown) when it suggests none.
pub fn content_type_for(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("json") => "application/json",
        Some("yaml" | "yml") => "text/yaml",
        Some("toml") => "application/toml",
        Some("xml") => "application/xml",
        Some("ini" | "conf" | "cfg" | "txt" | "properties" | "env") => "text/plain",
        _ => "",
    }
}

/// The `agent` bundle as offered to OpAMP agents (docs/opamp.md, "OpAMP agents").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPackage {
    /// `VERSION+BUILD` of the bundle.
    pub version: String,
    /// `server.public-url` + `/agentupdate/download`.
    pub download_url: String,
    /// The bundle's sha256, hex.
    pub sha256: String,
    /// The `.minisig` file's bytes.
    pub signature: Vec<u8>,
    /// Headers the download needs (e.g. a credential); usually none.
    pub headers: Vec<(String, String)>,
}

impl AgentPackage {
    /// What agents will report back about this offer, to keep with the rollout and
    /// pass to [`crate::view::PackagesReport::outcome`].
    pub fn offered(&self) -> Result<OfferedPackage> {
        let offer = agent_package_offer(self)?;
        let package_hash = offer
            .packages
            .get(AGENT_PACKAGE)
            .map(|p| hex::encode(&p.hash))
            .unwrap_or_default();
        Ok(OfferedPackage {
            name: AGENT_PACKAGE.to_owned(),
            version: self.version.clone(),
            package_hash,
            all_packages_hash: hex::encode(&offer.all_packages_hash),
        })
    }
}

/// `PackageAvailable.hash`: sha256 over the name, the version and the file's sha256,
/// so that any change to what is offered changes it.
fn package_hash(name: &str, version: &str, content_hash: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [name.as_bytes(), version.as_bytes(), content_hash] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The offer of the `agent` package: a top-level package whose file is the bundle.
/// `all_packages_hash` is sha256 over each package's name and hash (one package
/// here), as the spec asks of an aggregate hash.
pub fn agent_package_offer(pkg: &AgentPackage) -> Result<PackagesAvailable> {
    let content_hash = from_hex("bundle sha256", &pkg.sha256)?;
    let hash = package_hash(AGENT_PACKAGE, &pkg.version, &content_hash);
    let mut all = Sha256::new();
    all.update((AGENT_PACKAGE.len() as u64).to_be_bytes());
    all.update(AGENT_PACKAGE.as_bytes());
    all.update(hash);
    let headers = (!pkg.headers.is_empty()).then(|| Headers {
        headers: pkg
            .headers
            .iter()
            .map(|(key, value)| Header {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    });
    let package = PackageAvailable {
        r#type: PackageType::TopLevel as i32,
        version: pkg.version.clone(),
        file: Some(DownloadableFile {
            download_url: pkg.download_url.clone(),
            content_hash,
            signature: pkg.signature.clone(),
            headers,
        }),
        hash: hash.to_vec(),
    };
    Ok(PackagesAvailable {
        packages: BTreeMap::from([(AGENT_PACKAGE.to_owned(), package)]),
        all_packages_hash: all.finalize().to_vec(),
    })
}

/// The answer to a message that decoded but makes no sense (no usable uid, …).
/// The client should not send it again.
pub fn bad_request(sent_uid: &[u8], message: impl Into<String>) -> ServerToAgent {
    error_answer(
        sent_uid,
        ServerErrorResponseType::BadRequest,
        message.into(),
        None,
    )
}

/// The throttling answer over WebSocket: `UNAVAILABLE` with `RetryInfo`; the client
/// disconnects and comes back after `retry_after`. (Over HTTP the edge answers
/// `503`/`429` with `Retry-After` instead.)
pub fn unavailable(
    sent_uid: &[u8],
    message: impl Into<String>,
    retry_after: Duration,
) -> ServerToAgent {
    let retry = RetryInfo {
        retry_after_nanoseconds: u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX),
    };
    error_answer(
        sent_uid,
        ServerErrorResponseType::Unavailable,
        message.into(),
        Some(retry),
    )
}

fn error_answer(
    sent_uid: &[u8],
    kind: ServerErrorResponseType,
    error_message: String,
    retry: Option<RetryInfo>,
) -> ServerToAgent {
    ServerToAgent {
        instance_uid: sent_uid.to_vec(),
        error_response: Some(ServerErrorResponse {
            r#type: kind as i32,
            error_message,
            details: retry.map(server_error_response::Details::RetryInfo),
        }),
        ..Default::default()
    }
}

fn from_hex(what: &'static str, value: &str) -> Result<Vec<u8>> {
    hex::decode(value).map_err(|_| Error::Hex {
        what,
        value: value.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{
        AgentToServer, PackageStatus, PackageStatusEnum, PackageStatuses, RemoteConfigStatus,
        RemoteConfigStatuses,
    };
    use crate::session::{Contact, observe};
    use crate::view::{ConfigStatus, config_files_hash};
    use agent_protocol::wire::UpdateStatus;
    use prost::Message;

    const UID: [u8; 16] = [0x01, 0x90, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 2];
    const ACCEPTS_ALL: u64 = 1 | 0x2 | 0x8 | 0x10 | 0x1000;

    fn set() -> (AgentRemoteConfig, String) {
        let files = [
            ("collector.yaml", &b"receivers: {}"[..]),
            ("extra.json", &b"{}"[..]),
        ];
        let hash = config_files_hash(files);
        (remote_config(files, &hash).unwrap(), hash)
    }

    fn bundle() -> AgentPackage {
        AgentPackage {
            version: "2.2.0+1234".into(),
            download_url: "https://updates.example:7080/agentupdate/download".into(),
            sha256: "ab".repeat(32),
            signature: b"untrusted comment: x\nRWQ...\n".to_vec(),
            headers: vec![],
        }
    }

    fn msg(seq: u64, caps: u64) -> AgentToServer {
        AgentToServer {
            instance_uid: UID.to_vec(),
            sequence_num: seq,
            capabilities: caps,
            agent_description: Some(Default::default()),
            ..Default::default()
        }
    }

    fn observe_http(stored: Option<&AgentView>, m: &AgentToServer) -> Observation {
        observe(
            stored,
            Contact {
                message: m,
                first_on_connection: true,
                uid_in_use_elsewhere: false,
            },
        )
        .unwrap()
    }

    #[test]
    fn remote_config_carries_the_files_their_types_and_the_hash() {
        let (rc, hash) = set();
        assert_eq!(hex::encode(&rc.config_hash), hash);
        let files = &rc.config.as_ref().unwrap().config_map;
        assert_eq!(files["collector.yaml"].content_type, "text/yaml");
        assert_eq!(files["extra.json"].content_type, "application/json");
        assert_eq!(files["extra.json"].body, b"{}");
        assert_eq!(content_type_for("README"), "");
        assert_eq!(content_type_for("A.JSON"), "application/json");
        let err = remote_config([], "not hex").unwrap_err();
        assert!(err.to_string().contains("not hex"), "{err}");
    }

    #[test]
    fn a_restart_is_alone_in_its_message_with_the_capabilities_of_a_first_answer() {
        let a = restart(&UID, true);
        assert_eq!(
            a.command.map(|c| c.r#type),
            Some(CommandType::Restart as i32)
        );
        assert_eq!(a.capabilities, SERVER_CAPABILITIES);
        assert_eq!(a.instance_uid, UID);
        let bare = ServerToAgent {
            instance_uid: UID.to_vec(),
            command: restart(&UID, false).command,
            ..Default::default()
        };
        assert_eq!(restart(&UID, false), bare, "nothing else beside it");
    }

    #[test]
    fn connection_settings_carry_the_credential_as_a_header_and_go_only_to_agents_that_take_them() {
        let offer = ConnectionOffer {
            bearer: Some("n3w".into()),
            ..Default::default()
        };
        let settings = connection_settings(&offer);
        let opamp = settings.opamp.clone().unwrap();
        let header = &opamp.headers.unwrap().headers[0];
        assert_eq!(
            (header.key.as_str(), header.value.as_str()),
            ("Authorization", "Bearer n3w")
        );
        let moved = connection_settings(&ConnectionOffer {
            bearer: Some("n3w".into()),
            destination_endpoint: Some("http://b:7080/v1/opamp".into()),
            own_telemetry: None,
        });
        assert_ne!(moved.hash, settings.hash, "the hash tells offers apart");
        let offers = || Offers {
            connection_settings: Some(settings.clone()),
            ..Offers::default()
        };
        let plain = observe_http(None, &msg(1, ACCEPTS_ALL));
        assert!(answer(&UID, &plain, offers()).connection_settings.is_none());
        let takes = observe_http(
            None,
            &msg(
                1,
                ACCEPTS_ALL | AgentCapabilities::AcceptsOpAmpConnectionSettings as u64,
            ),
        );
        assert_eq!(
            answer(&UID, &takes, offers()).connection_settings,
            Some(settings)
        );
    }

    #[test]
    fn own_telemetry_goes_to_agents_that_report_it_and_again_only_when_it_changes() {
        let own = OwnTelemetry {
            metrics: "http://c:4318/v1/metrics".into(),
            logs: String::new(),
            headers: vec![("x-tenant".into(), "t".into())],
            hash: "h1".into(),
        };
        let settings = connection_settings(&ConnectionOffer {
            own_telemetry: Some(own.clone()),
            ..Default::default()
        });
        assert!(settings.opamp.is_none(), "no OpAMP settings were offered");
        let metrics = settings.own_metrics.clone().unwrap();
        assert_eq!(metrics.destination_endpoint, own.metrics);
        assert_eq!(metrics.headers.unwrap().headers[0].key, "x-tenant");
        assert_eq!(
            settings.own_logs.clone().unwrap().destination_endpoint,
            "",
            "no logs URL: send no logs"
        );
        let other = connection_settings(&ConnectionOffer {
            own_telemetry: Some(OwnTelemetry {
                hash: "h2".into(),
                ..own.clone()
            }),
            ..Default::default()
        });
        assert_ne!(other.hash, settings.hash);

        let metrics_only = ACCEPTS_ALL | AgentCapabilities::ReportsOwnMetrics as u64;
        let view = observe_http(None, &msg(1, metrics_only)).view;
        let kept = settings_for(settings.clone(), &view).unwrap();
        assert!(kept.own_metrics.is_some() && kept.own_logs.is_none());
        let plain = observe_http(None, &msg(1, ACCEPTS_ALL)).view;
        assert!(settings_for(settings, &plain).is_none());

        assert!(wants_own_telemetry(&view, "h1", false), "never offered");
        assert!(!wants_own_telemetry(&view, "", false), "nothing to offer");
        assert!(
            !wants_own_telemetry(&plain, "h1", true),
            "it does not report any"
        );
        let told = AgentView {
            own_telemetry: "h1".into(),
            ..view
        };
        assert!(!wants_own_telemetry(&told, "h1", false), "offered already");
        assert!(
            wants_own_telemetry(&told, "h1", true),
            "again to one afresh"
        );
        assert!(wants_own_telemetry(&told, "h2", false), "changed");
        assert!(
            wants_own_telemetry(&told, "", false),
            "cleared: told to stop"
        );
    }

    #[test]
    fn config_is_offered_until_the_agent_reports_on_its_hash() {
        let (rc, hash) = set();
        let offers = || Offers {
            remote_config: Some(rc.clone()),
            packages: None,
            connection_settings: None,
        };
        let first = observe_http(None, &msg(1, ACCEPTS_ALL));
        let a = answer(&UID, &first, offers());
        assert_eq!(a.remote_config.as_ref(), Some(&rc));
        assert_eq!(a.capabilities, SERVER_CAPABILITIES);
        assert_eq!(a.instance_uid, UID);

        // A poll without a report: offered again (HTTP cannot know it arrived).
        let poll = observe_http(Some(&first.view), &msg(2, ACCEPTS_ALL));
        assert!(answer(&UID, &poll, offers()).remote_config.is_some());

        // Reported FAILED for this hash: not offered again, and the rollout sees FAILED.
        let mut failed = msg(3, ACCEPTS_ALL);
        failed.remote_config_status = Some(RemoteConfigStatus {
            last_remote_config_hash: rc.config_hash.clone(),
            status: RemoteConfigStatuses::Failed as i32,
            error_message: "unknown receiver".into(),
        });
        let o = observe_http(Some(&poll.view), &failed);
        assert!(answer(&UID, &o, offers()).remote_config.is_none());
        assert_eq!(
            o.view.remote_config.as_ref().unwrap().status_of(&hash),
            Some(ConfigStatus::Failed)
        );

        // An agent that does not accept remote config is never offered one.
        let o = observe_http(None, &msg(1, 1));
        assert!(answer(&UID, &o, offers()).remote_config.is_none());
    }

    #[test]
    fn package_offer_has_what_design_names() {
        let pkg = bundle();
        let offer = agent_package_offer(&pkg).unwrap();
        let p = &offer.packages[AGENT_PACKAGE];
        assert_eq!(p.r#type, PackageType::TopLevel as i32);
        assert_eq!(p.version, "2.2.0+1234");
        let file = p.file.as_ref().unwrap();
        assert_eq!(file.download_url, pkg.download_url);
        assert_eq!(file.content_hash, vec![0xab; 32]);
        assert_eq!(file.signature, pkg.signature);
        assert!(file.headers.is_none());
        let offered = pkg.offered().unwrap();
        assert_eq!(hex::encode(&p.hash), offered.package_hash);
        assert_eq!(
            hex::encode(&offer.all_packages_hash),
            offered.all_packages_hash
        );
        assert_eq!(
            (offered.name.as_str(), offered.version.as_str()),
            (AGENT_PACKAGE, "2.2.0+1234")
        );
        assert_eq!(offer.all_packages_hash.len(), 32);
        // Another bundle, another hash at every level.
        let other = agent_package_offer(&AgentPackage {
            sha256: "cd".repeat(32),
            ..bundle()
        })
        .unwrap();
        assert_ne!(other.all_packages_hash, offer.all_packages_hash);
        assert_ne!(other.packages[AGENT_PACKAGE].hash, p.hash);
        let with_headers = agent_package_offer(&AgentPackage {
            headers: vec![("Authorization".into(), "Bearer t".into())],
            ..bundle()
        })
        .unwrap();
        let h = with_headers.packages[AGENT_PACKAGE]
            .file
            .as_ref()
            .unwrap()
            .headers
            .as_ref()
            .unwrap();
        assert_eq!(h.headers[0].key, "Authorization");
        assert!(
            agent_package_offer(&AgentPackage {
                sha256: "xyz".into(),
                ..bundle()
            })
            .is_err()
        );
    }

    #[test]
    fn package_offer_goes_to_accepting_agents_until_received_then_statuses_count() {
        let pkg = bundle();
        let offer = agent_package_offer(&pkg).unwrap();
        let offered = pkg.offered().unwrap();
        let offers = || Offers {
            remote_config: None,
            packages: Some(offer.clone()),
            connection_settings: None,
        };

        // Neither registry client accepts packages: never offered.
        let o = observe_http(None, &msg(1, 1 | 0x2 | 0x1000));
        assert!(answer(&UID, &o, offers()).packages_available.is_none());

        let first = observe_http(None, &msg(1, ACCEPTS_ALL));
        assert_eq!(
            answer(&UID, &first, offers()).packages_available.as_ref(),
            Some(&offer)
        );

        let statuses = |status: PackageStatusEnum, has: Vec<u8>| PackageStatuses {
            packages: BTreeMap::from([(
                AGENT_PACKAGE.to_string(),
                PackageStatus {
                    name: AGENT_PACKAGE.into(),
                    agent_has_version: "2.2.0+1234".into(),
                    agent_has_hash: has,
                    server_offered_version: "2.2.0+1234".into(),
                    server_offered_hash: offer.packages[AGENT_PACKAGE].hash.clone(),
                    status: status as i32,
                    error_message: String::new(),
                    download_details: None,
                },
            )]),
            server_provided_all_packages_hash: offer.all_packages_hash.clone(),
            error_message: String::new(),
        };
        let mut installing = msg(2, ACCEPTS_ALL);
        installing.package_statuses = Some(statuses(PackageStatusEnum::Downloading, vec![1; 32]));
        let o = observe_http(Some(&first.view), &installing);
        assert!(answer(&UID, &o, offers()).packages_available.is_none());
        let packages = o.view.packages.as_ref().unwrap();
        assert_eq!(packages.outcome(&offered), Some(UpdateStatus::Installing));

        let mut done = msg(3, ACCEPTS_ALL);
        done.package_statuses = Some(statuses(
            PackageStatusEnum::Installed,
            offer.packages[AGENT_PACKAGE].hash.clone(),
        ));
        let o = observe_http(Some(&o.view), &done);
        let packages = o.view.packages.as_ref().unwrap();
        assert_eq!(packages.outcome(&offered), Some(UpdateStatus::Installed));
    }

    #[test]
    fn answers_carry_duties_and_nothing_for_a_duplicate() {
        let (rc, _) = set();
        let first = observe_http(None, &msg(1, ACCEPTS_ALL));
        let mut gap = msg(9, ACCEPTS_ALL);
        gap.agent_description = None;
        let o = observe_http(Some(&first.view), &gap);
        let a = answer(&UID, &o, Offers::default());
        assert_eq!(a.flags, ServerToAgentFlags::ReportFullState as u64);

        let o = observe(
            Some(&first.view),
            Contact {
                message: &msg(1, ACCEPTS_ALL),
                first_on_connection: false,
                uid_in_use_elsewhere: true,
            },
        )
        .unwrap();
        let a = answer(
            &UID,
            &o,
            Offers {
                remote_config: Some(rc),
                packages: None,
                connection_settings: None,
            },
        );
        let new = a
            .agent_identification
            .as_ref()
            .unwrap()
            .new_instance_uid
            .clone();
        assert_eq!(new.len(), 16);
        assert_ne!(new, UID);
        assert!(a.remote_config.is_none());
        assert_eq!(a.capabilities, 0);
        assert_eq!(a.flags, 0);
    }

    #[test]
    fn new_uid_is_written_in_the_form_the_client_used() {
        let mut m = msg(1, 1);
        m.instance_uid = b"01ARZ3NDEKTSV4RRFFQ69G5FAV".to_vec();
        m.flags = 1;
        let o = observe_http(None, &m);
        let a = answer(&m.instance_uid, &o, Offers::default());
        assert_eq!(a.instance_uid, m.instance_uid);
        assert_eq!(a.agent_identification.unwrap().new_instance_uid.len(), 26);
    }

    #[test]
    fn error_answers() {
        let a = bad_request(&UID, "instance_uid must be 16 bytes");
        let e = a.error_response.as_ref().unwrap();
        assert_eq!(e.r#type, ServerErrorResponseType::BadRequest as i32);
        assert!(e.details.is_none());
        assert_eq!(a.instance_uid, UID);

        let a = unavailable(&UID, "busy", Duration::from_secs(30));
        let e = a.error_response.as_ref().unwrap();
        assert_eq!(e.r#type, ServerErrorResponseType::Unavailable as i32);
        assert_eq!(
            e.details,
            Some(server_error_response::Details::RetryInfo(RetryInfo {
                retry_after_nanoseconds: 30_000_000_000
            }))
        );
        // Nothing else set beside an error, as the spec requires.
        let bytes = a.encode_to_vec();
        let back = ServerToAgent::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.capabilities, 0);
        assert!(back.remote_config.is_none());
    }
}
