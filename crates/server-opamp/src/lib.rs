//! The OpAMP edge: `POST /v1/opamp` ([`http`]) and a WebSocket on the same path
//! ([`ws`]), around one exchange ([`exchange`]): a message in, the answer out, as
//! opamp-go's server shapes it. The per-message decision is `agent_opamp::session`;
//! the fleet (storage, waves, reports) is `agent_fleet`; this module reads what they
//! need from the fleet, stores what they decided and builds the offers.
//!
//! It must not decide rollouts or parse bodies itself: transports translate, the
//! exchange connects the protocol crate with the fleet model.

pub mod http;
pub mod ws;

use std::sync::Arc;
use std::time::Duration;

use agent_fleet::commands;
use agent_fleet::db::now_ms;
use agent_fleet::deployments::{AgentFacts, Route};
use agent_fleet::opamp::OpampAgent;
use agent_fleet::outage::Deferred;
use agent_opamp::answer::{self, AgentPackage, Offers};
use agent_opamp::proto::{AgentCapabilities, AgentToServer, ServerToAgent};
use agent_opamp::session::{Contact, observe};
use agent_opamp::uid::InstanceUid;
use agent_opamp::view::AgentView;
use agent_protocol::AgentVersion;
use agent_protocol::wire::{self, Report};
use axum::Router;
use axum::routing::post;

use server_core::state::{AppState, Shared};
use server_core::store::Current;

/// Largest OpAMP message accepted, after decompression: status reports and effective
/// configurations are kilobytes; a collector's whole configuration fits many times.
pub const MAX_MESSAGE: usize = 1 << 20;

/// Seconds an OpAMP client is asked to wait while the fleet database is away.
pub const RETRY_AFTER: u64 = 5;

/// `GET` (WebSocket upgrade) and `POST` on [`agent_opamp::OPAMP_PATH`].
pub fn router() -> Router<AppState> {
    Router::new().route(agent_opamp::OPAMP_PATH, post(http::post).get(ws::upgrade))
}

/// Why a message got no answer of its own.
#[derive(Debug)]
pub enum Refused {
    /// It decoded but cannot be taken (no usable instance uid): the answer to send.
    BadRequest(Box<ServerToAgent>, String),
    /// The fleet database is away: come back after [`RETRY_AFTER`].
    Unavailable,
    /// The request does not carry this agent's credential (`401`), with why.
    Unauthorized(&'static str),
    /// The server's fault, logged.
    Internal,
}

/// What an exchange settled, beyond the answer.
pub struct Exchanged {
    pub answer: ServerToAgent,
    pub uid: InstanceUid,
    /// The message collided with another agent's uid.
    pub duplicate: bool,
    pub disconnected: bool,
    /// What the server now knows of the agent (as stored, unless `duplicate`): a
    /// WebSocket keeps it to answer news without reading it back.
    pub view: AgentView,
}

/// Whether the request may go on to its message: it carries the enrollment token as its
/// bearer (always, without one configured), or a bearer shaped like the credential a
/// rotation gives an agent (64 hex digits), which [`exchange`] checks against the
/// message's uid. Anything else is refused before its body is read.
pub fn authorized(s: &Shared, authorization: Option<&str>) -> bool {
    enrolls(s, authorization)
        || bearer_of(authorization)
            .is_some_and(|b| b.len() == 64 && b.bytes().all(|c| c.is_ascii_hexdigit()))
}

fn bearer_of(authorization: Option<&str>) -> Option<&str> {
    authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Whether the request carries the enrollment token (always, without one configured).
fn enrolls(s: &Shared, authorization: Option<&str>) -> bool {
    use subtle::ConstantTimeEq;
    if s.enrollment_token.is_empty() {
        return true;
    }
    let given = bearer_of(authorization).unwrap_or("");
    given.as_bytes().ct_eq(s.enrollment_token.as_bytes()).into()
}

/// What an agent without a credential of its own is told.
const NEEDS_ENROLLMENT: &str =
    "OpAMP requests need Authorization: Bearer <agents.enrollment-token>";
/// What an agent whose credential was rotated is told when it sends another.
const NEEDS_OWN: &str = "this OpAMP agent has a credential of its own (its connection settings were rotated): send Authorization: Bearer <that credential>";

/// Whether `authorization` may speak for the agent `id`: once a rotation gave it a
/// credential of its own, only that one (the enrollment token no longer); until then,
/// the enrollment token. A rotation's offered credential, proved, becomes its own here.
async fn admitted(
    s: &Shared,
    id: &str,
    authorization: Option<&str>,
    known: &agent_fleet::db::Credentials,
) -> Result<(), Refused> {
    use agent_fleet::credentials::{hash_token, same};
    use agent_fleet::db::Credentials;
    let hash = bearer_of(authorization).map(hash_token);
    let refusal = match known {
        Credentials::Hash(own) => {
            if hash.as_deref().is_some_and(|h| same(own, h)) {
                return Ok(());
            }
            NEEDS_OWN
        }
        _ if enrolls(s, authorization) => return Ok(()),
        Credentials::Revoked(_) => return Err(Refused::Unauthorized(NEEDS_ENROLLMENT)),
        _ => NEEDS_ENROLLMENT,
    };
    // Not its credential (nor the enrollment token), but perhaps the one its rotation
    // offered: proving it makes it the agent's own.
    let Some(hash) = hash else {
        return Err(Refused::Unauthorized(refusal));
    };
    match s.fleet.accept_candidate(id, &hash).await {
        Ok(true) => {
            tracing::info!(agent = %id, "OpAMP: the agent proved its new credential; the old one is refused from now on");
            Ok(())
        }
        Ok(false) => Err(Refused::Unauthorized(refusal)),
        Err(e) => Err(fleet_error(&e, s)),
    }
}

fn fleet_error(e: &agent_fleet::FleetError, s: &Shared) -> Refused {
    if e.is_unavailable() {
        s.fleet.outage.went_down(e);
        Refused::Unavailable
    } else {
        tracing::error!("OpAMP: fleet model: {e}");
        Refused::Internal
    }
}

/// One message in, its answer out. `first` is the first message on its connection
/// (every HTTP request), `in_use_elsewhere` another live WebSocket holds its uid.
pub async fn exchange(
    s: &Shared,
    msg: &AgentToServer,
    first: bool,
    in_use_elsewhere: bool,
    authorization: Option<&str>,
) -> Result<Exchanged, Refused> {
    if s.fleet.outage.is_down() {
        return Err(Refused::Unavailable);
    }
    let (uid, _) = InstanceUid::from_wire(&msg.instance_uid).map_err(|e| {
        Refused::BadRequest(
            Box::new(answer::bad_request(&msg.instance_uid, e.to_string())),
            e.to_string(),
        )
    })?;
    let id = uid.to_string();
    let known = s
        .fleet
        .db
        .credentials(&id)
        .await
        .map_err(|e| fleet_error(&e, s))?;
    admitted(s, &id, authorization, &known).await?;
    let stored = s
        .fleet
        .db
        .opamp_agent(&id)
        .await
        .map_err(|e| fleet_error(&e, s))?;
    let stored_view: Option<AgentView> = stored
        .as_ref()
        .and_then(|st| serde_json::from_str::<AgentView>(&st.view).ok())
        .map(|mut v| {
            // Fallen silent counts as gone: a uid coming back is not a duplicate.
            v.online = stored.as_ref().is_some_and(|st| st.shows_online(now_ms()));
            v
        });
    let mut obs = observe(
        stored_view.as_ref(),
        Contact {
            message: msg,
            first_on_connection: first,
            uid_in_use_elsewhere: in_use_elsewhere,
        },
    )
    .map_err(|e| {
        Refused::BadRequest(
            Box::new(answer::bad_request(&msg.instance_uid, e.to_string())),
            e.to_string(),
        )
    })?;
    // An operator removed the agent of this uid: the uid is refused from then on. Like a
    // duplicate, it is answered with a new one and nothing for it, and the agent
    // enrolls again under the new uid (only a uid the fleet does not know is looked up).
    if stored.is_none() && matches!(known, agent_fleet::db::Credentials::Revoked(_)) {
        tracing::info!(agent = %id, "OpAMP: a removed agent's uid is refused; it is given a new one");
        obs.duplicate = true;
        obs.new_instance_uid = Some(InstanceUid::new_v7());
    }
    // The agent is new here, or the server lost track of it: its own-telemetry settings
    // go again (the specification wants them in the first answer).
    let fresh = stored_view.is_none() || obs.report_full_state;
    let mut telemetry_offered = None;
    let view = &obs.view;
    let route = route(s, &id, view).await;
    let package = agent_package(s, view, route.release.as_deref());
    let mut offers = Offers::default();
    if !obs.duplicate {
        let at_ms = now_ms();
        let record = OpampAgent {
            id: id.clone(),
            name: name_of(view),
            platform: platform_of(view),
            version: version_of(view),
            group: view.group().to_owned(),
            view: serde_json::to_string(view).map_err(|e| {
                tracing::error!("OpAMP: storing the view of {id}: {e}");
                Refused::Internal
            })?,
            sequence_num: view.sequence_num,
            online: view.online,
            accepts_packages: view.has(AgentCapabilities::AcceptsPackages),
            accepts_remote_config: view.has(AgentCapabilities::AcceptsRemoteConfig),
            at_ms,
        };
        s.fleet
            .db
            .save_opamp(&record)
            .await
            .map_err(|e| fleet_error(&e, s))?;
        if obs.changes.remote_config {
            count_config_status(s, &id, view).await?;
        }
        // A restart goes alone: the offers wait for the agent's next message.
        if answer::may_command(&obs) && restart_command(s, &id, view).await {
            return Ok(Exchanged {
                answer: answer::restart(&msg.instance_uid, obs.send_capabilities),
                uid,
                duplicate: false,
                disconnected: false,
                view: obs.view,
            });
        }
        if !obs.disconnected {
            let own = own_telemetry(s, &id, view, fresh).await;
            telemetry_offered = own.as_ref().map(|o| o.hash.clone());
            offers.connection_settings = connection_offer(s, &id, view, &known, own).await;
        }
        if !obs.disconnected && view.has(AgentCapabilities::AcceptsRemoteConfig) {
            offers.remote_config = offer_config(s, &id, view).await?;
        }
        if let Some(pkg) = &package
            && view.has(AgentCapabilities::AcceptsPackages)
        {
            if obs.changes.packages {
                count_package_report(s, &id, view, pkg).await?;
            }
            if !obs.disconnected {
                offers.packages = offer_package(s, &id, view, pkg, &route).await?;
            }
        }
        if package.is_none()
            && view.has(AgentCapabilities::AcceptsPackages)
            && !obs.disconnected
            && lacks_bundle(s, view, &route)
            && s.fleet.auto_update()
        {
            let running = running_agent_version(view);
            route
                .rollouts
                .offer(&id, view.group(), running.as_ref(), false)
                .await
                .map_err(|e| fleet_error(&e, s))?;
        }
    }
    let answer = answer::answer(&msg.instance_uid, &obs, offers);
    let carried = answer
        .connection_settings
        .as_ref()
        .is_some_and(|c| c.own_metrics.is_some() || c.own_logs.is_some());
    if let Some(hash) = telemetry_offered.filter(|_| carried) {
        obs.view.own_telemetry = hash;
        remember_view(s, &id, &obs.view).await;
    }
    Ok(Exchanged {
        answer,
        uid,
        duplicate: obs.duplicate,
        disconnected: obs.disconnected,
        view: obs.view,
    })
}

/// What the fleet has for a connected agent now, without a message from it (a
/// WebSocket push after news: a wave opened, a set pushed): the answer carrying the
/// offers it does not have yet, or `None`. `sent_uid` is the uid as the agent writes it;
/// `view` what its socket last stored of it (only its socket writes it, so it is not
/// read back: news wakes every socket at once, and ten thousand reads of the fleet
/// database for one pushed set were most of a push's cost). The offers themselves
/// come from the rollouts' memory, which checks the database only before sending.
pub async fn push(
    s: &Shared,
    uid: InstanceUid,
    sent_uid: &[u8],
    kept: &mut AgentView,
) -> Option<ServerToAgent> {
    if s.fleet.outage.is_down() {
        return None;
    }
    let id = uid.to_string();
    let view = kept.clone();
    // An operator's command for this agent, pushed at once like any news.
    if !s.fleet.open_commands(&id).is_empty() {
        if restart_command(s, &id, &view).await {
            return Some(answer::restart(sent_uid, false));
        }
        let known = s.fleet.db.credentials(&id).await.ok()?;
        if let Some(settings) = connection_offer(s, &id, &view, &known, None).await {
            return Some(ServerToAgent {
                instance_uid: sent_uid.to_vec(),
                connection_settings: Some(settings),
                ..Default::default()
            });
        }
    }
    // Its own-telemetry destination set or cleared: told at once, once.
    if let Some(own) = own_telemetry(s, &id, &view, false).await {
        let hash = own.hash.clone();
        let offer = answer::ConnectionOffer {
            own_telemetry: Some(own),
            ..Default::default()
        };
        let settings = answer::settings_for(answer::connection_settings(&offer), &view)?;
        kept.own_telemetry = hash;
        remember_view(s, &id, kept).await;
        return Some(ServerToAgent {
            instance_uid: sent_uid.to_vec(),
            connection_settings: Some(settings),
            ..Default::default()
        });
    }
    let mut offers = Offers::default();
    if view.has(AgentCapabilities::AcceptsRemoteConfig) {
        offers.remote_config = offer_config(s, &id, &view).await.ok()?;
    }
    let route = route(s, &id, &view).await;
    if view.has(AgentCapabilities::AcceptsPackages)
        && let Some(pkg) = agent_package(s, &view, route.release.as_deref())
    {
        offers.packages = offer_package(s, &id, &view, &pkg, &route).await.ok()?;
    }
    let obs = agent_opamp::session::Observation {
        uid,
        uid_form: InstanceUid::from_wire(sent_uid).ok()?.1,
        view,
        changes: Default::default(),
        report_full_state: false,
        send_capabilities: false,
        new_instance_uid: None,
        duplicate: false,
        disconnected: false,
    };
    let out = answer::answer(sent_uid, &obs, offers);
    (out.remote_config.is_some() || out.packages_available.is_some()).then_some(out)
}

/// Whether the agent `id` is told to restart now: an operator asked, and it declared
/// `AcceptsRestartCommand`. OpAMP has no acknowledgement of a command: it is `DONE` once
/// sent (and only sent once marked so, or it would be told again and again). A restart
/// it cannot take ends `FAILED` with why.
async fn restart_command(s: &Shared, id: &str, view: &AgentView) -> bool {
    let open = s.fleet.open_commands(id);
    let Some(command) = commands::deliver(&open).restart else {
        return false;
    };
    let (status, why) = if !view.has(AgentCapabilities::AcceptsRestartCommand) {
        (
            commands::Status::Failed,
            Some("the OpAMP agent does not declare AcceptsRestartCommand"),
        )
    } else if command.argument == commands::RESTART_WORKLOAD {
        (
            commands::Status::Failed,
            Some("OpAMP has no command to restart only an agent's workload; restart the agent"),
        )
    } else {
        (commands::Status::Done, None)
    };
    match s.fleet.finish_command(command, status, why).await {
        Ok(_) => {
            tracing::info!(agent = %id, command = %command.id, "OpAMP: restart {}", why.unwrap_or("sent"));
            status == commands::Status::Done
        }
        Err(e) => {
            tracing::warn!(agent = %id, "OpAMP: cannot record the restart; not sent now: {e}");
            false
        }
    }
}

/// The connection settings the agent `id` is offered now: a rotation's new credential
/// (its hash kept as the agent's candidate until it proves it), a move's endpoint, and
/// `own_telemetry` when given. A move carries a credential too, since offered settings replace the
/// agent's: a new one for an agent with its own, else the enrollment token. Only to an
/// agent that declared `AcceptsOpAMPConnectionSettings`; for another, the commands end
/// `FAILED` with why. A move is `DONE` once offered (OpAMP agents do not say how a
/// connection setting ended).
async fn connection_offer(
    s: &Shared,
    id: &str,
    view: &AgentView,
    known: &agent_fleet::db::Credentials,
    own_telemetry: Option<answer::OwnTelemetry>,
) -> Option<agent_opamp::proto::ConnectionSettingsOffers> {
    let open = s.fleet.open_commands(id);
    let delivery = commands::deliver(&open);
    let telemetry_alone = answer::ConnectionOffer {
        own_telemetry: own_telemetry.clone(),
        ..Default::default()
    };
    let alone = || {
        own_telemetry
            .is_some()
            .then(|| answer::connection_settings(&telemetry_alone))
    };
    if delivery.rotate.is_none() && delivery.move_to.is_none() {
        return alone();
    }
    let asked = [delivery.rotate, delivery.move_to];
    if !view.has(AgentCapabilities::AcceptsOpAmpConnectionSettings) {
        for c in asked.into_iter().flatten() {
            let why = "the OpAMP agent does not declare AcceptsOpAMPConnectionSettings";
            if let Err(e) = s
                .fleet
                .finish_command(c, commands::Status::Failed, Some(why))
                .await
            {
                tracing::warn!(agent = %id, "OpAMP: cannot end the command: {e}");
            }
        }
        return alone();
    }
    let mut offer = answer::ConnectionOffer::default();
    let own = matches!(known, agent_fleet::db::Credentials::Hash(_));
    if delivery.rotate.is_some() || own {
        let Ok(token) = agent_fleet::credentials::new_token() else {
            return alone();
        };
        let hash = agent_fleet::credentials::hash_token(&token);
        if let Err(e) = s.fleet.db.offer_candidate(id, &hash).await {
            tracing::warn!(agent = %id, "OpAMP: cannot offer a new credential now: {e}");
            return alone();
        }
        offer.bearer = Some(token);
    } else if !s.enrollment_token.is_empty() {
        offer.bearer = Some(s.enrollment_token.clone());
    }
    if let Some(m) = delivery.move_to {
        offer.destination_endpoint = Some(format!("{}{}", m.argument, agent_opamp::OPAMP_PATH));
        if let Err(e) = s
            .fleet
            .finish_command(m, commands::Status::Done, None)
            .await
        {
            tracing::warn!(agent = %id, "OpAMP: cannot record the move: {e}");
        }
    }
    if let Some(r) = delivery.rotate
        && let Err(e) = s.fleet.command_sent(r).await
    {
        tracing::warn!(agent = %id, "OpAMP: cannot mark the rotation carried: {e}");
    }
    tracing::info!(agent = %id, "OpAMP: offered connection settings (credential: {}, endpoint: {:?})", offer.bearer.is_some(), offer.destination_endpoint);
    offer.own_telemetry = own_telemetry;
    Some(answer::connection_settings(&offer))
}

/// The own-telemetry settings the agent `id` is offered now (see
/// [`agent_fleet::telemetry`]): the destination its labels select (or none), when it
/// reports its own metrics or logs and was last offered another ([`answer::wants_own_telemetry`]).
/// Nothing while the fleet database is away: it keeps what it has.
async fn own_telemetry(
    s: &Shared,
    id: &str,
    view: &AgentView,
    fresh: bool,
) -> Option<answer::OwnTelemetry> {
    if !(view.has(AgentCapabilities::ReportsOwnMetrics)
        || view.has(AgentCapabilities::ReportsOwnLogs))
    {
        return None;
    }
    let table = s.fleet.telemetry();
    let offer = if table.is_empty() {
        wire::TelemetryOffer::off()
    } else {
        let described = Described::of(view);
        match s
            .fleet
            .deployments
            .labels_of(&described.facts(id, view))
            .await
        {
            Ok(labels) => table.for_labels(&labels),
            Err(e) => {
                if e.is_unavailable() {
                    s.fleet.outage.went_down(&e);
                } else {
                    tracing::warn!(agent = %id, "OpAMP: the agent's telemetry destination: {e}");
                }
                return None;
            }
        }
    };
    if !answer::wants_own_telemetry(view, &offer.hash, fresh) {
        return None;
    }
    tracing::info!(agent = %id, "OpAMP: offering own telemetry settings (metrics {:?})", offer.metrics);
    Some(answer::OwnTelemetry {
        metrics: offer.metrics,
        logs: offer.logs.unwrap_or_default(),
        headers: offer.headers.into_iter().collect(),
        hash: offer.hash,
    })
}

/// Keeps the agent's view as it is now (what it was offered changed since its message
/// was stored). A failure only means the offer may go again.
async fn remember_view(s: &Shared, id: &str, view: &AgentView) {
    let Ok(text) = serde_json::to_string(view) else {
        return;
    };
    if let Err(e) = s.fleet.db.set_opamp_view(id, &text).await {
        tracing::warn!(agent = %id, "OpAMP: cannot keep what the agent was offered: {e}");
    }
}

/// The deployment an OpAMP agent follows, as a native agent's is found: its labels are
/// its non-identifying attributes, with the server's own and the built-in ones of its
/// platform, group and version. While the fleet database is away, the one this server
/// last answered it by.
async fn route(s: &Shared, id: &str, view: &AgentView) -> Route {
    let described = Described::of(view);
    let facts = described.facts(id, view);
    let deployments = &s.fleet.deployments;
    if s.fleet.outage.is_down() {
        return deployments.route_offline(&facts);
    }
    match deployments.route_agent(&facts).await {
        Ok(route) => route,
        Err(e) => {
            if e.is_unavailable() {
                s.fleet.outage.went_down(&e);
            } else {
                tracing::warn!(agent = %id, "OpAMP: which deployment the agent follows: {e}");
            }
            deployments.route_offline(&facts)
        }
    }
}

/// What an OpAMP agent says of itself for a selector: its non-identifying attributes
/// that are labels, its platform and its version.
struct Described {
    reported: agent_fleet::labels::Labels,
    platform: String,
    version: String,
}

impl Described {
    fn of(view: &AgentView) -> Self {
        let reported = view
            .description
            .as_ref()
            .map_or_else(Default::default, |d| {
                agent_fleet::labels::from_attributes(
                    d.non_identifying
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str())),
                )
            });
        Self {
            reported,
            platform: platform_of(view),
            version: version_of(view),
        }
    }

    fn facts<'a>(&'a self, id: &'a str, view: &'a AgentView) -> AgentFacts<'a> {
        AgentFacts {
            id,
            reported: Some(&self.reported),
            platform: &self.platform,
            group: view.group(),
            version: &self.version,
        }
    }
}

/// The bundle of the release of the agent's deployment (`release`; `None`: the served
/// one) as the `agent` package, when there is one to offer ([`bundle_for`]). A release a
/// deployment names that this server has not loaded yet offers nothing meanwhile.
fn agent_package(s: &Shared, view: &AgentView, release: Option<&str>) -> Option<AgentPackage> {
    let (release, named) = match release {
        Some(id) => (s.catalog.get(id)?, Some(id)),
        None => match s.store.current() {
            Current::Ready(release) => (release, None),
            Current::Unavailable(_) => return None,
        },
    };
    let os = attribute(view, "os.type").unwrap_or_default();
    let arch = attribute(view, "host.arch").unwrap_or_default();
    let bundle = bundle_for(&release, os, arch)?;
    let path = match named {
        Some(id) => wire::for_release(wire::DOWNLOAD_PATH, &bundle.platform, id),
        None if release.is_single() => wire::DOWNLOAD_PATH.to_owned(),
        None => wire::for_platform(wire::DOWNLOAD_PATH, &bundle.platform),
    };
    Some(AgentPackage {
        version: bundle.version().to_string(),
        download_url: format!("{}{path}", s.public_url),
        sha256: bundle.info.sha256.clone(),
        signature: bundle.signature.clone().unwrap_or_default().into_bytes(),
        headers: Vec::new(),
    })
}

/// The bundle an OpAMP agent of `os.type` and `host.arch` runs, as a native agent of
/// that platform would get it: its own (the static musl one first, as OpAMP does not
/// say the C library), else none. An agent that names no architecture cannot be told
/// apart and is offered a release of one bundle of its OS (or of any, naming none), as
/// before platforms were known.
fn bundle_for<'a>(
    release: &'a server_core::store::Release,
    os: &str,
    arch: &str,
) -> Option<&'a Arc<server_core::store::ServedBundle>> {
    if arch.is_empty() && release.is_single() {
        let primary = release.primary();
        return (os.is_empty() || primary.platform.contains(os)).then_some(primary);
    }
    opamp_targets(os, arch)
        .iter()
        .find_map(|t| release.bundles().iter().find(|b| b.platform == *t))
}

/// Whether the release of the agent's deployment has bundles but none this agent runs.
fn lacks_bundle(s: &Shared, view: &AgentView, route: &Route) -> bool {
    let loaded = match &route.release {
        Some(id) => s.catalog.get(id).is_some(),
        None => matches!(s.store.current(), Current::Ready(_)),
    };
    loaded && agent_package(s, view, route.release.as_deref()).is_none()
}

/// The package offer when the agent's wave is open, the fleet may update and the
/// agent does not run the target yet.
async fn offer_package(
    s: &Shared,
    id: &str,
    view: &AgentView,
    pkg: &AgentPackage,
    route: &Route,
) -> Result<Option<agent_opamp::proto::PackagesAvailable>, Refused> {
    if !s.fleet.auto_update() {
        return Ok(None);
    }
    let running = running_agent_version(view);
    let target = route
        .rollouts
        .offer(id, view.group(), running.as_ref(), true)
        .await
        .map_err(|e| fleet_error(&e, s))?;
    match target {
        Some(v) if v.to_string() == pkg.version => Ok(answer::agent_package_offer(pkg).ok()),
        _ => Ok(None),
    }
}

/// `PackageStatuses` about the offered bundle count like a native agent's report.
async fn count_package_report(
    s: &Shared,
    id: &str,
    view: &AgentView,
    pkg: &AgentPackage,
) -> Result<(), Refused> {
    let (Some(report), Ok(offered)) = (view.packages.as_ref(), pkg.offered()) else {
        return Ok(());
    };
    let Some(status) = report.outcome(&offered) else {
        return Ok(());
    };
    let p = report.packages.get(answer::AGENT_PACKAGE);
    let error = p
        .map(|p| p.error.clone())
        .filter(|e| !e.is_empty())
        .or_else(|| (!report.error.is_empty()).then(|| report.error.clone()));
    let report = Report {
        id: id.to_owned(),
        from: p.map(|p| p.agent_has_version.clone()).unwrap_or_default(),
        to: pkg.version.clone(),
        status,
        error: error.map(|e| e.chars().take(4096).collect()),
    };
    tracing::info!(agent = %id, to = %report.to, status = report.status.as_str(), "OpAMP package status");
    s.fleet
        .save(Deferred::Report {
            report,
            at_ms: now_ms(),
        })
        .await
        .map_err(|e| fleet_error(&e, s))
}

/// The group's configuration set as `AgentRemoteConfig`, when the agent's wave of its
/// config rollout is open and it does not run the set yet.
async fn offer_config(
    s: &Shared,
    id: &str,
    view: &AgentView,
) -> Result<Option<agent_opamp::proto::AgentRemoteConfig>, Refused> {
    let running = view
        .remote_config
        .as_ref()
        .filter(|r| r.status == Some(agent_opamp::view::ConfigStatus::Applied))
        .map(|r| r.hash.as_str())
        .unwrap_or_default();
    // A set keyed by a selector may be the agent's: its labels decide.
    let labels = if s.fleet.configs.has_selectors() {
        let described = Described::of(view);
        Some(
            s.fleet
                .deployments
                .labels_of(&described.facts(id, view))
                .await
                .map_err(|e| fleet_error(&e, s))?,
        )
    } else {
        None
    };
    let set = s
        .fleet
        .configs
        .answer(id, view.group(), labels.as_ref(), running)
        .await
        .map_err(|e| fleet_error(&e, s))?;
    Ok(set.and_then(|set| {
        answer::remote_config(
            set.files.iter().map(|(n, b)| (n.as_str(), b.as_bytes())),
            &set.hash,
        )
        .map_err(|e| tracing::error!("OpAMP: configuration set {}: {e}", set.hash))
        .ok()
    }))
}

/// `RemoteConfigStatus` `APPLIED` / `FAILED` counts in the config rollout like a
/// native agent's `/agent/config-status`.
async fn count_config_status(s: &Shared, id: &str, view: &AgentView) -> Result<(), Refused> {
    use agent_opamp::view::ConfigStatus as Opamp;
    use agent_protocol::wire::{ConfigOutcome, ConfigStatus};
    let Some(rc) = view.remote_config.as_ref().filter(|r| !r.hash.is_empty()) else {
        return Ok(());
    };
    let outcome = match rc.status {
        Some(Opamp::Applied) => ConfigOutcome::Applied,
        Some(Opamp::Failed) => ConfigOutcome::Failed,
        Some(Opamp::Applying) | None => return Ok(()),
    };
    let status = ConfigStatus {
        id: id.to_owned(),
        hash: rc.hash.clone(),
        status: outcome,
        error: (!rc.error.is_empty()).then(|| rc.error.chars().take(4096).collect()),
    };
    s.fleet
        .save(Deferred::ConfigStatus {
            status,
            at_ms: now_ms(),
        })
        .await
        .map_err(|e| fleet_error(&e, s))
}

/// The version of the `agent` package the agent says it runs.
fn running_agent_version(view: &AgentView) -> Option<AgentVersion> {
    view.packages
        .as_ref()?
        .packages
        .get(answer::AGENT_PACKAGE)?
        .agent_has_version
        .parse()
        .ok()
}

fn attribute<'a>(view: &'a AgentView, key: &str) -> Option<&'a str> {
    view.description.as_ref()?.get(key)
}

fn name_of(view: &AgentView) -> String {
    attribute(view, "service.name")
        .or_else(|| attribute(view, "host.name"))
        .unwrap_or_default()
        .chars()
        .take(256)
        .collect()
}

/// The target triples an OpAMP agent of `os.type` and `host.arch` (OpenTelemetry's
/// values) runs, best first: on Linux the static musl one (OpAMP does not say the C
/// library), then the glibc one; on Windows the one Windows target released. None
/// elsewhere or for an architecture not known here.
fn opamp_targets(os: &str, arch: &str) -> Vec<String> {
    let arch = match arch {
        "amd64" | "x86_64" => "x86_64",
        "arm64" | "aarch64" => "aarch64",
        _ => return Vec::new(),
    };
    if os == "windows" && arch == "x86_64" {
        return vec![format!("{arch}-pc-windows-gnu")];
    }
    if os != "linux" {
        return Vec::new();
    }
    vec![
        format!("{arch}-unknown-linux-musl"),
        format!("{arch}-unknown-linux-gnu"),
    ]
}

fn platform_of(view: &AgentView) -> String {
    let os = attribute(view, "os.type").unwrap_or_default();
    let arch = attribute(view, "host.arch").unwrap_or_default();
    let platform = match (os.is_empty(), arch.is_empty()) {
        (false, false) => format!("{arch}-{os}"),
        (false, true) => os.to_owned(),
        (true, false) => arch.to_owned(),
        (true, true) => String::new(),
    };
    platform.chars().take(128).collect()
}

/// The `agent` package's version for agents that take packages (the rollout compares
/// it), else `service.version`.
fn version_of(view: &AgentView) -> String {
    if view.has(AgentCapabilities::AcceptsPackages) {
        return running_agent_version(view)
            .map(|v| v.to_string())
            .unwrap_or_default();
    }
    attribute(view, "service.version")
        .unwrap_or_default()
        .chars()
        .take(128)
        .collect()
}

/// `Retry-After` as a duration, for `RetryInfo`.
pub fn retry_after() -> Duration {
    Duration::from_secs(RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_opamp::view::Description;

    fn view(pairs: &[(&str, &str)], caps: u64) -> AgentView {
        AgentView {
            capabilities: caps,
            description: Some(Description {
                identifying: pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                non_identifying: Default::default(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_agent_is_offered_only_a_bundle_of_its_own_platform() {
        use agent_releases::store::sample_bundle;
        use server_core::store::Release;

        fn bundle(v: &str, p: &str) -> std::sync::Arc<agent_releases::store::ServedBundle> {
            sample_bundle(v.parse().unwrap(), p)
        }
        let x86 =
            Release::assemble(vec![bundle("2.0.0+2", "x86_64-unknown-linux-gnu")], "").unwrap();
        assert!(bundle_for(&x86, "linux", "amd64").is_some());
        assert!(
            bundle_for(&x86, "linux", "arm64").is_none(),
            "an arm64 agent is not offered an x86_64-only release"
        );
        assert!(bundle_for(&x86, "windows", "amd64").is_none());
        assert!(
            bundle_for(&x86, "", "").is_some(),
            "one that says nothing, as before"
        );
        let both = Release::assemble(
            vec![
                bundle("2.0.0+2", "x86_64-unknown-linux-gnu"),
                bundle("2.0.0+2", "aarch64-unknown-linux-musl"),
            ],
            "",
        )
        .unwrap();
        let arm = bundle_for(&both, "linux", "arm64").unwrap();
        assert_eq!(arm.platform, "aarch64-unknown-linux-musl");
        assert!(bundle_for(&both, "", "").is_none());
    }

    #[test]
    fn rows_are_named_from_the_description() {
        let v = view(
            &[
                ("service.name", "checkout"),
                ("service.version", "1.4.2"),
                ("os.type", "linux"),
                ("host.arch", "amd64"),
                ("host.name", "vm"),
            ],
            1,
        );
        assert_eq!(name_of(&v), "checkout");
        assert_eq!(platform_of(&v), "amd64-linux");
        assert_eq!(
            opamp_targets("linux", "amd64"),
            ["x86_64-unknown-linux-musl", "x86_64-unknown-linux-gnu"]
        );
        assert_eq!(
            opamp_targets("linux", "arm64")[1],
            "aarch64-unknown-linux-gnu"
        );
        assert_eq!(opamp_targets("windows", "amd64"), ["x86_64-pc-windows-gnu"]);
        assert!(opamp_targets("windows", "arm64").is_empty());
        assert!(opamp_targets("darwin", "amd64").is_empty());
        assert!(opamp_targets("linux", "s390x").is_empty());
        assert_eq!(version_of(&v), "1.4.2");
        // An agent that takes packages is known by its agent package, not its service.
        let v = view(
            &[("service.version", "1.4.2")],
            1 | AgentCapabilities::AcceptsPackages as u64,
        );
        assert_eq!(version_of(&v), "");
        let v = view(&[("host.name", "vm")], 1);
        assert_eq!((name_of(&v).as_str(), platform_of(&v).as_str()), ("vm", ""));
    }
}
