//! `POST /agent/register`, `/agent/connect` (the version directive, as the rollout says,
//! and the configuration set the agent should run) and `/agentupdate/report`.

use agent_protocol::AgentVersion;
use agent_protocol::blame;
use agent_protocol::wire::{self, AgentHello, ConnectBody, NotSupported, Report, UpdateStatus};
use axum::Json;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use agent_fleet::commands::{self, Command};
use agent_fleet::credentials::{self, Verdict};
use agent_fleet::db::{Credentials, Revocation, now_ms, now_secs};
use agent_fleet::outage::Deferred;
use agent_fleet::rollout::Answer;

use super::operators::ConnAddress;
use super::{ANSWER_WITHIN, AppState, Shared, json_body, ready};
use crate::error::ApiError;
use crate::metrics::{Holding, inc};
use crate::store::Release;
use serde::Deserialize;

fn agent_version_header(headers: &HeaderMap) -> Result<AgentVersion, ApiError> {
    let raw = headers.get(wire::AGENT_VERSION_HEADER).ok_or_else(|| {
        ApiError::bad_request(format!(
            "missing {} header (VERSION+BUILD)",
            wire::AGENT_VERSION_HEADER
        ))
    })?;
    let text = raw.to_str().map_err(|_| {
        ApiError::bad_request(format!("{} header is not text", wire::AGENT_VERSION_HEADER))
    })?;
    text.parse()
        .map_err(|e| ApiError::bad_request(format!("{} header: {e}", wire::AGENT_VERSION_HEADER)))
}

pub(super) fn check_id(id: &str) -> Result<(), ApiError> {
    if id.trim().is_empty() || id.len() > 128 {
        return Err(ApiError::bad_request("id must be 1 to 128 characters"));
    }
    Ok(())
}

fn check_hello(hello: &AgentHello) -> Result<(), ApiError> {
    check_id(&hello.id)?;
    if hello.name.len() > 256 || hello.platform.len() > 128 {
        return Err(ApiError::bad_request("name or platform is too long"));
    }
    if hello.group.as_ref().is_some_and(|g| g.len() > 64) {
        return Err(ApiError::bad_request("group is longer than 64 characters"));
    }
    if let Some(labels) = &hello.labels {
        agent_fleet::labels::check(labels).map_err(ApiError::bad_request)?;
    }
    Ok(())
}

fn check_config_hash(hash: &str) -> Result<(), ApiError> {
    if hash.len() > 64 {
        return Err(ApiError::bad_request(
            "config_hash is longer than 64 characters",
        ));
    }
    Ok(())
}

/// An agent's words about its workload are kept, within reason.
fn bounded_health(
    mut health: agent_protocol::wire::AgentHealth,
) -> agent_protocol::wire::AgentHealth {
    const MAX_ERROR: usize = 4096;
    if let Some(e) = health.last_error.as_mut()
        && e.len() > MAX_ERROR
    {
        let mut cut = MAX_ERROR;
        while !e.is_char_boundary(cut) {
            cut -= 1;
        }
        e.truncate(cut);
    }
    health
}

/// What register and connect answer: the directive, with credentials the first time.
enum Greeting {
    Accepted {
        expected: AgentVersion,
        /// Why it is accepted on a version other than the release's: the release has no
        /// bundle its platform runs.
        no_bundle: Option<String>,
        token: Option<String>,
        /// The configuration set the agent should run, when it runs another.
        config: Option<wire::ConfigPayload>,
        /// The release it installs when its maintenance window opens.
        window: Option<wire::WindowOffer>,
        /// The deployment it follows.
        deployment: Option<String>,
        /// The commands it is told (see [`agent_fleet::commands`]); made into the
        /// answer's fields only when it is sent ([`orders`]).
        orders: Vec<Command>,
        /// Where it exports its own telemetry, when that is not what it has (boxed: a
        /// held connect keeps its answer while it waits, and this is rarely there).
        telemetry: Option<Box<wire::TelemetryOffer>>,
    },
    Refused(NotSupported),
    /// Not a directive (no bundle to serve yet): answered as it is, never held.
    Other(Response),
}

impl Greeting {
    /// The answer, naming the deployment the agent follows (`agent status` shows it).
    fn in_deployment(mut self, name: String) -> Self {
        match &mut self {
            Greeting::Accepted { deployment, .. } => *deployment = Some(name),
            Greeting::Refused(ns) => ns.deployment = Some(name),
            Greeting::Other(_) => {}
        }
        self
    }

    /// Whether an agent that knows `known` (the bundle it was refused with and stays
    /// away from, if any) learns something from this answer. A held connect waits for
    /// news; anything else is answered at once.
    fn is_news(&self, known: Option<&str>, ahead: Option<&str>) -> bool {
        match self {
            Greeting::Accepted {
                token,
                config,
                window,
                orders,
                telemetry,
                ..
            } => {
                token.is_some()
                    || config.is_some()
                    || telemetry.is_some()
                    || commands::deliver(orders).news
                    || match (window, ahead) {
                        // An agent that downloads ahead learns of a release behind its
                        // window at once (until it says it has it); one that does not
                        // needs nothing until the window opens.
                        (Some(w), Some(have)) => have != w.sha256,
                        (Some(w), None) => known.is_some_and(|k| k != w.sha256),
                        (None, _) => known.is_some(),
                    }
            }
            Greeting::Refused(ns) => {
                ns.token.is_some() || ns.override_locks || ns.sha256.as_deref() != known
            }
            Greeting::Other(_) => true,
        }
    }

    /// The answer, with the agent's commands made into its fields (a rotation's new
    /// credential is made now, once, for the answer that is sent).
    async fn into_response(self, s: &Shared, hello: &AgentHello) -> Response {
        match self {
            Greeting::Accepted {
                expected,
                no_bundle,
                token,
                config,
                window,
                deployment,
                orders: open,
                telemetry,
            } => {
                let mut body =
                    serde_json::json!({ "status": "accepted", "expected": expected.to_string() });
                if let Some(name) = deployment {
                    body["deployment"] = serde_json::Value::String(name);
                }
                if let Some(why) = no_bundle {
                    body["no_bundle"] = serde_json::Value::String(why);
                }
                if let Some(token) = token {
                    body["token"] = serde_json::Value::String(token);
                }
                if let Some(set) = config {
                    body["config"] = serde_json::to_value(set).unwrap_or_default();
                }
                if let Some(w) = window {
                    body["window"] = serde_json::to_value(w).unwrap_or_default();
                }
                if let Some(t) = telemetry {
                    body["telemetry"] = serde_json::to_value(t).unwrap_or_default();
                }
                orders(s, hello, &open, &mut body).await;
                Json(body).into_response()
            }
            Greeting::Refused(ns) => (StatusCode::CONFLICT, Json(ns)).into_response(),
            Greeting::Other(response) => response,
        }
    }
}

/// The hello of a register or connect, checked.
struct Hello {
    hello: AgentHello,
    version: AgentVersion,
    /// The configuration set the agent runs (empty: none).
    config_hash: String,
    /// Where it exports its own telemetry ([`wire::TelemetryOffer::hash`]); `None`: it
    /// exports none.
    telemetry_hash: Option<String>,
}

fn hello_of(
    headers: &HeaderMap,
    body: Result<Json<ConnectBody>, JsonRejection>,
) -> Result<Hello, ApiError> {
    let ConnectBody {
        hello,
        config_hash,
        telemetry_hash,
    } = json_body(body)?;
    check_hello(&hello)?;
    check_config_hash(&config_hash)?;
    if let Some(hash) = &telemetry_hash {
        check_config_hash(hash)
            .map_err(|_| ApiError::bad_request("telemetry_hash is longer than 64 characters"))?;
    }
    let version = agent_version_header(headers)?;
    Ok(Hello {
        hello,
        version,
        config_hash,
        telemetry_hash,
    })
}

/// `POST /agent/register`: the version directive.
pub(super) async fn register(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<ConnectBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let hello = hello_of(&headers, body)?;
    let s = &state.inner;
    let greeting = greet(s, &hello, &headers).await?;
    registered(s, &hello.hello).await;
    Ok(greeting.into_response(s, &hello.hello).await)
}

/// What a register says of the agent beyond its contact: the commands it takes and the
/// URL it used, kept for `/admin/agents`. Only a register (at its start, and after a
/// failover or a move) says it, so a heartbeat costs no write of its own.
async fn registered(s: &Shared, hello: &AgentHello) {
    if s.fleet.outage.is_down() {
        return;
    }
    let capabilities = hello.capabilities.clone().unwrap_or_default();
    let capabilities: Vec<String> = capabilities
        .into_iter()
        .filter(|c| c.len() <= 64)
        .take(32)
        .collect();
    let endpoint = hello.endpoint.as_deref().filter(|e| e.len() <= 2048);
    if let Err(e) = s
        .fleet
        .record_register(&hello.id, &capabilities, endpoint)
        .await
    {
        if e.is_unavailable() {
            s.fleet.outage.went_down(&e);
        } else {
            tracing::warn!(agent = %hello.id, "cannot keep what the agent said it takes: {e}");
        }
    }
}

/// The open commands of `agent` as fields of its answer: `"command"` (a restart),
/// `"credentials"` (a rotation's new secret, whose hash becomes the agent's candidate)
/// and `"endpoint"` (a move). Each is marked carried. A command the agent cannot carry
/// out (its release does not say it takes it) is ended `FAILED` with why, rather than
/// carried forever. A failure to write leaves it for the next contact.
async fn orders(s: &Shared, hello: &AgentHello, open: &[Command], body: &mut serde_json::Value) {
    let agent = hello.id.as_str();
    let delivery = commands::deliver(open);
    // What the agent says it takes, in this very call.
    let takes = |what: &str| {
        hello
            .capabilities
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c == what))
    };
    let mut carried = Vec::new();
    if let Some(c) = delivery.restart {
        if takes(wire::CAPABILITY_RESTART) {
            let restart = if c.argument == commands::RESTART_WORKLOAD {
                wire::Restart::Workload
            } else {
                wire::Restart::Agent
            };
            body["command"] = serde_json::to_value(wire::AgentCommand {
                restart: Some(restart),
                id: c.id.clone(),
            })
            .unwrap_or_default();
            carried.push(c);
        } else {
            cannot(s, c, wire::CAPABILITY_RESTART).await;
        }
    }
    if let Some(c) = delivery.rotate {
        if takes(wire::CAPABILITY_ROTATE) {
            if let Some(token) = offer_credentials(s, agent).await {
                body["credentials"] =
                    serde_json::to_value(wire::CredentialsOffer { token }).unwrap_or_default();
                carried.push(c);
            }
        } else {
            cannot(s, c, wire::CAPABILITY_ROTATE).await;
        }
    }
    if let Some(c) = delivery.move_to {
        if takes(wire::CAPABILITY_MOVE) {
            body["endpoint"] = serde_json::to_value(wire::EndpointOffer {
                url: c.argument.clone(),
                id: c.id.clone(),
            })
            .unwrap_or_default();
            carried.push(c);
        } else {
            cannot(s, c, wire::CAPABILITY_MOVE).await;
        }
    }
    for c in carried {
        if let Err(e) = s.fleet.command_sent(c).await {
            tracing::warn!(agent = %agent, command = %c.id, "cannot mark the command carried: {e}");
        }
    }
}

/// Ends `command` `FAILED`: the agent does not say it takes `what`.
async fn cannot(s: &Shared, command: &Command, what: &str) {
    let why = format!(
        "this agent's release does not take this command (it does not declare the capability {what:?}); update it first"
    );
    tracing::info!(agent = %command.agent, command = %command.id, "{why}");
    if let Err(e) = s
        .fleet
        .finish_command(command, commands::Status::Failed, Some(&why))
        .await
    {
        tracing::warn!(agent = %command.agent, "cannot end the command: {e}");
    }
}

/// A new credential for `agent`, its hash kept as the agent's candidate: `None` when it
/// cannot be kept (the database is away), and the rotation waits for the next contact.
async fn offer_credentials(s: &Shared, agent: &str) -> Option<String> {
    let token = credentials::new_token()
        .map_err(|e| tracing::error!("no randomness for a credential: {e}"))
        .ok()?;
    match s
        .fleet
        .db
        .offer_candidate(agent, &credentials::hash_token(&token))
        .await
    {
        Ok(()) => {
            tracing::info!(agent = %agent, "offered the agent a new credential (rotation)");
            Some(token)
        }
        Err(e) => {
            tracing::warn!(agent = %agent, "cannot offer a new credential now: {e}");
            None
        }
    }
}

/// `connect?wait=<seconds>&known=<sha256>`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Hold {
    wait: Option<u64>,
    known: Option<String>,
    /// `ahead=1`, or the sha256 of the release it has: the agent downloads a release
    /// behind its maintenance window ahead, so it is told of another one at once.
    ahead: Option<String>,
}

/// `POST /agent/connect`: the directive, like register; with `wait`, a long poll held
/// until the answer is news to the agent, `wait` (at most `agents.max-wait`) runs out,
/// or the server stops. While it waits it costs a task and a watch receiver: it is
/// woken by [`agent_fleet::news`], never by reading the database. An agent whose wave
/// opened is told when [`crate::transport::pacer`] gives it its turn; its re-held connects are
/// checked against the token it proved before and its contact goes with the next
/// batch, so holding a fleet costs the database a commit a second.
pub(super) async fn connect(
    State(state): State<AppState>,
    Query(hold): Query<Hold>,
    headers: HeaderMap,
    body: Result<Json<ConnectBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let hello = hello_of(&headers, body)?;
    let wait = Duration::from_secs(hold.wait.unwrap_or(0)).min(s.max_wait);
    if wait.is_zero() {
        return Ok(greet(s, &hello, &headers)
            .await?
            .into_response(s, &hello.hello)
            .await);
    }
    let known = hold.known.as_deref();
    let ahead = hold.ahead.as_deref();
    // Taken before the first answer is worked out, so no change made meanwhile is missed.
    let mut news = s.fleet.rollouts.news().subscribe();
    let mut closing = s.fleet.rollouts.news().closing();
    let deadline = coalesced(tokio::time::Instant::now(), wait, hold_epoch());
    // The switch decides what a refused agent may download: every agent hears it flip.
    let switch = s.fleet.auto_update();
    // Boxed, like `reconsider` below: what a held connect keeps while it waits is its
    // own few fields, not room for the database futures of its first answer.
    let mut greeting = Box::pin(greet(s, &hello, &headers)).await?;
    drop(headers);
    inc(&s.metrics.held_connects);
    let _holding = Holding::new(&s.metrics.connects_held);
    while !greeting.is_news(known, ahead) {
        tokio::select! {
            changed = news.changed() => if changed.is_err() { break },
            () = tokio::time::sleep_until(deadline) => break,
            _ = closing.wait_for(|c| *c) => break,
        }
        // Its wave opened: it waits for its turn to be told (see `crate::transport::pacer`), so
        // that a wave of thousands starts downloads the server can serve.
        if matches!(greeting, Greeting::Accepted { .. })
            && s.fleet
                .deployments
                .followed_rollouts(&hello.hello.id)
                .would_refuse(
                    &hello.hello.id,
                    hello.hello.group.as_deref().unwrap_or(""),
                    &hello.version,
                )
        {
            tokio::select! {
                () = s.pacer.turn() => {}
                () = tokio::time::sleep_until(deadline) => {}
                _ = closing.wait_for(|c| *c) => {}
            }
        }
        greeting = Box::pin(reconsider(s, &hello)).await?;
        if s.fleet.auto_update() != switch {
            break;
        }
    }
    let mut response = greeting.into_response(s, &hello.hello).await;
    response.headers_mut().insert(
        wire::LONG_POLL_HEADER,
        HeaderValue::from(s.max_wait.as_secs()),
    );
    Ok(response)
}

/// Held connects that run out end on a common beat of [`HOLD_BEAT`], never later than
/// asked: a fleet re-holding every heartbeat then costs its server a wake-up per beat
/// for a batch of agents, not one per agent (the timers, the answers and the next
/// connects, which follow them, each come in bursts).
const HOLD_BEAT: Duration = Duration::from_millis(250);

/// Holds shorter than this are kept exact. An agent (and fleet-sim) takes a hold that
/// ends before 90 % of its wait with nothing new for a server letting go, and pauses at
/// random before it connects again; a beat is at most 5 % of the holds coalesced.
const COALESCED_FROM: Duration = Duration::from_secs(5);
const _: () = assert!(HOLD_BEAT.as_millis() * 20 <= COALESCED_FROM.as_millis());

/// When a hold of `wait` from `now` runs out: the last beat (counted from `epoch`) at or
/// before `now + wait`.
fn coalesced(
    now: tokio::time::Instant,
    wait: Duration,
    epoch: tokio::time::Instant,
) -> tokio::time::Instant {
    let end = now + wait;
    if wait < COALESCED_FROM || end < epoch {
        return end;
    }
    let beats = (end - epoch).as_nanos() / HOLD_BEAT.as_nanos();
    epoch + HOLD_BEAT * u32::try_from(beats).unwrap_or(u32::MAX)
}

/// The beats' origin, the same for every held connect of this process.
fn hold_epoch() -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(tokio::time::Instant::now)
}

/// The answer to a register or connect, counting as the agent's contact.
async fn greet(s: &Shared, hello: &Hello, headers: &HeaderMap) -> Result<Greeting, ApiError> {
    let release = match ready(s) {
        Ok(r) => r,
        Err(r) => return Ok(Greeting::Other(*r)),
    };
    let issue = match authenticate(s, &hello.hello.id, headers).await? {
        Verdict::Allow { issue } => issue,
        Verdict::Deny(why) => return Err(unauthorized(&hello.hello.id, why)),
    };
    let contact = Deferred::Contact {
        id: hello.hello.id.clone(),
        name: hello.hello.name.clone(),
        platform: hello.hello.platform.clone(),
        version: hello.version.to_string(),
        group: hello.hello.group.clone(),
        config_hash: Some(hello.config_hash.clone()),
        labels: hello
            .hello
            .labels
            .as_ref()
            .map(agent_fleet::labels::to_json),
        at: now_secs(),
        health: hello.hello.health.clone().map(bounded_health),
    };
    let token = if issue {
        enroll(s, headers, contact).await?
    } else {
        // A known agent's contact goes with the next batch: a held connect a heartbeat
        // costs no write of its own.
        s.fleet.contact(contact).await?;
        None
    };
    decide(s, hello, &release, token, true).await
}

/// The answer again, after news, for a connect that is held: the agent's credentials
/// were checked and its contact recorded when the hold began.
async fn reconsider(s: &Shared, hello: &Hello) -> Result<Greeting, ApiError> {
    let release = match ready(s) {
        Ok(r) => r,
        Err(r) => return Ok(Greeting::Other(*r)),
    };
    decide(s, hello, &release, None, false).await
}

async fn decide(
    s: &Shared,
    hello: &Hello,
    current: &Arc<Release>,
    token: Option<String>,
    count: bool,
) -> Result<Greeting, ApiError> {
    let mut route = route(s, &hello.hello, &hello.version).await?;
    let deployment = std::mem::take(&mut route.deployment);
    Ok(decide_routed(s, hello, current, token, count, route)
        .await?
        .in_deployment(deployment))
}

/// [`decide`] for the deployment the agent follows.
async fn decide_routed(
    s: &Shared,
    hello: &Hello,
    current: &Arc<Release>,
    token: Option<String>,
    count: bool,
    route: Routed,
) -> Result<Greeting, ApiError> {
    // Another deployment's release, or nothing to say until it is loaded: the agent
    // keeps its version meanwhile (it is never sent `default`'s release by mistake).
    let (release, named) = match route.release {
        None => (Arc::clone(current), None),
        Some(id) => match s.catalog.get(&id) {
            Some(release) => (release, Some(id)),
            None => {
                return accept(s, hello, hello.version.clone(), None, None, token, count).await;
            }
        },
    };
    let release = &*release;
    let platform = hello.hello.platform.as_str();
    // An agent that names no target triple (an old or a made-up one) is pointed at the
    // primary bundle, as before releases: the agent checks the platform it is handed.
    let bundle = if agent_protocol::platform::is_target(platform) {
        release.for_platform(platform)
    } else {
        Some(release.primary())
    };
    let answer = directive(
        s,
        &route.rollouts,
        &hello.hello,
        &hello.version,
        bundle.is_some(),
    )
    .await?;
    // Before the first rollout is read (a bundle just dropped), the release speaks alone.
    let (accepted, expected, no_bundle, window) = match answer {
        Some(a) => (a.accepted, a.expected, a.no_bundle, a.window),
        None => (
            s.policy.accepts(release.version(), &hello.version),
            release.version().clone(),
            false,
            None,
        ),
    };
    let bundle = match bundle {
        Some(b) if !no_bundle => b,
        // Nothing it could run: it keeps its version, and is told why.
        _ => {
            let note = (!accepted || no_bundle).then(|| no_bundle_note(release, platform));
            return accept(s, hello, expected, note, None, token, count).await;
        }
    };
    if accepted {
        let window = window.map(|opens_at| wire::WindowOffer {
            expected: expected.to_string(),
            sha256: bundle.info.sha256.clone(),
            opens_at,
        });
        return accept(s, hello, expected, None, window, token, count).await;
    }
    if count {
        inc(&s.metrics.registrations_refused);
    }
    tracing::info!(agent = %hello.hello.id, version = %hello.version, expected = %expected, "refused agent");
    let override_locks = s
        .fleet
        .locks_overridden(&hello.hello.id, &expected.to_string());
    Ok(Greeting::Refused(NotSupported {
        error: wire::NOT_SUPPORTED.to_owned(),
        expected: expected.to_string(),
        // A release of one bundle is downloaded as it always was; of several, the agent
        // is pointed at its own platform's.
        download: match named.as_deref() {
            // Another deployment's release is named, for this platform.
            Some(id) => wire::for_release(wire::DOWNLOAD_PATH, platform, id),
            None if release.is_single() => wire::DOWNLOAD_PATH.to_owned(),
            None => wire::for_platform(wire::DOWNLOAD_PATH, platform),
        },
        sha256: Some(bundle.info.sha256.clone()),
        token,
        override_locks,
        deployment: None,
    }))
}

/// What an agent accepted because the release has nothing for it is told.
fn no_bundle_note(release: &Release, platform: &str) -> String {
    format!(
        "the release of {} has no bundle for {platform} nor a static musl one of its architecture (it has {}); this agent keeps its version",
        release.version(),
        release.platforms().join(", ")
    )
}

async fn accept(
    s: &Shared,
    hello: &Hello,
    expected: AgentVersion,
    no_bundle: Option<String>,
    window: Option<wire::WindowOffer>,
    token: Option<String>,
    count: bool,
) -> Result<Greeting, ApiError> {
    if count {
        inc(&s.metrics.registrations_accepted);
    }
    let config = config_directive(s, &hello.hello, &hello.version, &hello.config_hash).await?;
    if config.is_some() {
        inc(&s.metrics.configs_sent);
    }
    // An agent just given its first credentials is told nothing else yet.
    let orders = if token.is_none() {
        s.fleet.open_commands(&hello.hello.id)
    } else {
        Vec::new()
    };
    let telemetry = telemetry_offer(s, hello).await.map(Box::new);
    Ok(Greeting::Accepted {
        expected,
        no_bundle,
        token,
        config,
        window,
        deployment: None,
        orders,
        telemetry,
    })
}

/// Where the agent exports its own telemetry (see [`agent_fleet::telemetry`]), when it
/// differs from what the agent says it has: `None` for an agent that exports none (it
/// sent no hash) or that has it already, and while the fleet database is away (it keeps
/// what it has).
async fn telemetry_offer(s: &Shared, hello: &Hello) -> Option<wire::TelemetryOffer> {
    let has = hello.telemetry_hash.as_deref()?;
    let table = s.fleet.telemetry();
    let offer = if table.is_empty() {
        wire::TelemetryOffer::off()
    } else {
        if s.fleet.outage.is_down() {
            return None;
        }
        let version = hello.version.to_string();
        match s
            .fleet
            .deployments
            .labels_of(&facts(&hello.hello, &version))
            .await
        {
            Ok(labels) => table.for_labels(&labels),
            Err(e) => {
                if e.is_unavailable() {
                    s.fleet.outage.went_down(&e);
                } else {
                    tracing::warn!(agent = %hello.hello.id, "cannot tell the agent's telemetry destination now: {e}");
                }
                return None;
            }
        }
    };
    (offer.hash != has).then_some(offer)
}

/// The deployment an agent follows (see [`agent_fleet::deployments`]): its rollouts and,
/// for any but `default`, the release it names.
struct Routed {
    deployment: String,
    rollouts: Arc<agent_fleet::rollout::Rollouts>,
    /// `None` for `default` (the current release).
    release: Option<String>,
}

/// What an agent says of itself at a contact, as a selector sees it (`version`: its
/// version as text).
fn facts<'a>(hello: &'a AgentHello, version: &'a str) -> agent_fleet::deployments::AgentFacts<'a> {
    agent_fleet::deployments::AgentFacts {
        id: &hello.id,
        reported: hello.labels.as_ref(),
        platform: &hello.platform,
        group: hello.group.as_deref().unwrap_or(""),
        version,
    }
}

async fn route(s: &Shared, hello: &AgentHello, version: &AgentVersion) -> Result<Routed, ApiError> {
    let version = version.to_string();
    let facts = facts(hello, &version);
    let deployments = &s.fleet.deployments;
    let route = if s.fleet.outage.is_down() {
        deployments.route_offline(&facts)
    } else {
        match deployments.route_agent(&facts).await {
            Ok(route) => route,
            Err(e) if e.is_unavailable() => {
                s.fleet.outage.went_down(&e);
                deployments.route_offline(&facts)
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(Routed {
        deployment: route.deployment,
        rollouts: route.rollouts,
        release: route.release,
    })
}

/// The directive for this agent, from the database, or from what this server last read
/// when the database is away.
async fn directive(
    s: &Shared,
    rollouts: &agent_fleet::rollout::Rollouts,
    hello: &AgentHello,
    version: &AgentVersion,
    servable: bool,
) -> Result<Option<Answer>, ApiError> {
    if !s.fleet.outage.is_down() {
        let group = hello.group.as_deref().unwrap_or("");
        match rollouts.answer(&hello.id, group, version, servable).await {
            Ok(answer) => return Ok(answer),
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => return Err(e.into()),
        }
    }
    let (answer, told) = rollouts.answer_offline(
        &hello.id,
        hello.group.as_deref().unwrap_or(""),
        version,
        servable,
    );
    if let Some(rollout) = told {
        s.fleet.outage.defer(Deferred::Told {
            rollout,
            agent: hello.id.clone(),
            at_ms: now_ms(),
        });
    }
    Ok(answer)
}

/// The configuration set this agent should run, if it runs another. While the database
/// is away no set is sent: an agent keeps the set it has until the fleet's record of
/// who was sent what can be written.
async fn config_directive(
    s: &Shared,
    hello: &AgentHello,
    version: &AgentVersion,
    running: &str,
) -> Result<Option<wire::ConfigPayload>, ApiError> {
    if s.fleet.outage.is_down() {
        return Ok(None);
    }
    let group = hello.group.as_deref().unwrap_or("");
    // A set keyed by a selector may be the agent's: its labels decide.
    let labels = if s.fleet.configs.has_selectors() {
        let version = version.to_string();
        match s.fleet.deployments.labels_of(&facts(hello, &version)).await {
            Ok(labels) => Some(labels),
            Err(e) if e.is_unavailable() => {
                s.fleet.outage.went_down(&e);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    match s
        .fleet
        .configs
        .answer(&hello.id, group, labels.as_ref(), running)
        .await
    {
        Ok(set) => Ok(set),
        Err(e) if e.is_unavailable() => {
            s.fleet.outage.went_down(&e);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// How many acquire timeouts a credential check waits through while the database is
/// busy (answering, with no connection free) before it answers `503`.
const BUSY_TRIES: usize = 3;

/// What the fleet knows of the id's credentials: from the database, or, while it is
/// away, as this server last read them. An id this server never checked cannot be
/// checked then: `503`, and the agent tries again (or another server).
async fn known_credentials(s: &Shared, id: &str) -> Result<Credentials, ApiError> {
    for _ in 0..BUSY_TRIES {
        if s.fleet.outage.is_down() {
            break;
        }
        match s.fleet.db.credentials(id).await {
            Ok(known) => {
                s.fleet.outage.remember_credentials(id, &known);
                return Ok(known);
            }
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => return Err(e.into()),
        }
        if let Some(known) = s.fleet.outage.known_credentials(id) {
            return Ok(known);
        }
        // Busy, and memory cannot answer: the agent waits for a connection rather than
        // hear 503, which sends it to the next server to register there, where it is
        // not known either (100,000 agents registered ten times each that way).
    }
    s.fleet.outage.known_credentials(id).ok_or_else(|| {
        ApiError::unavailable(
            "the fleet database is unreachable and this server has not seen this agent yet; try again shortly",
            s.retry_after,
        )
    })
}

/// `Authorization: Bearer <token>`, if sent.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Whether this request may speak for the id (see [`agent_fleet::credentials`]).
pub(super) async fn authenticate(
    s: &Shared,
    id: &str,
    headers: &HeaderMap,
) -> Result<Verdict, ApiError> {
    let presented = bearer(headers);
    // An agent re-holding its connect proves the token it proved a moment ago: memory
    // answers, until an operator forgets a token somewhere in the fleet.
    let hash = presented.map(credentials::hash_token);
    if let Some(hash) = &hash
        && s.fleet.verified(id, hash)
    {
        return Ok(Verdict::Allow { issue: false });
    }
    let known = known_credentials(s, id).await?;
    let enrollment = headers
        .get(wire::ENROLLMENT_HEADER)
        .and_then(|v| v.to_str().ok());
    let verdict = credentials::decide(&known, presented, &s.enrollment_token, enrollment);
    // Not its credential, but perhaps the one a rotation offered it: proving it is what
    // makes it the agent's credential, and the old one refused.
    if let (Verdict::Deny(_), Credentials::Hash(_), Some(hash)) = (&verdict, &known, &hash) {
        match s.fleet.accept_candidate(id, hash).await {
            Ok(true) => {
                tracing::info!(agent = %id, "the agent proved its new credential; the old one is refused from now on");
                return Ok(Verdict::Allow { issue: false });
            }
            Ok(false) => {}
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => return Err(e.into()),
        }
    }
    if let (Verdict::Allow { issue: false }, Some(hash)) = (&verdict, &hash) {
        s.fleet.remember_verified(id, hash);
    }
    Ok(verdict)
}

/// Refuses (`401`) a call from anyone but an agent that registered and presents the
/// credentials it got then: open enrollment lets anyone *register*, never *report* or
/// speak for an id (a made-up id's failure report halted a rollout). `not_enrolled`
/// says what an id without credentials is told.
pub(super) async fn authenticate_enrolled(
    s: &Shared,
    id: &str,
    headers: &HeaderMap,
    not_enrolled: &'static str,
) -> Result<(), ApiError> {
    match authenticate(s, id, headers).await? {
        Verdict::Allow { issue: false } => Ok(()),
        Verdict::Allow { issue: true } => Err(unauthorized(id, not_enrolled)),
        Verdict::Deny(why) => Err(unauthorized(id, why)),
    }
}

/// The longest `error` of a report or configuration status the server takes, in bytes.
pub(super) const MAX_ERROR_TEXT: usize = 4096;

/// The `error` of a report or configuration status (`what`) as the server keeps it:
/// refused over [`MAX_ERROR_TEXT`] (naming the field, its length and what to do), and
/// with its control characters escaped, since it is shown in terminals and logs.
pub(super) fn checked_error(error: Option<String>, what: &str) -> Result<Option<String>, ApiError> {
    match error {
        Some(e) if e.len() > MAX_ERROR_TEXT => Err(ApiError::bad_request(format!(
            "the {what}'s \"error\" field is {} bytes, over the {MAX_ERROR_TEXT} this server takes; send it shorter (agents from this release cut it themselves)",
            e.len()
        ))),
        error => Ok(error.map(|e| agent_protocol::shown::shown(&e, MAX_ERROR_TEXT))),
    }
}

/// What an id with no credentials hears when it reports.
pub(super) const REPORT_NOT_ENROLLED: &str = "this agent id has not registered with this fleet (or its credentials were reset): an agent reports only with the credentials it got at register (Authorization: Bearer, from data/agent-token); register first";

pub(super) fn unauthorized(id: &str, why: &'static str) -> ApiError {
    tracing::warn!(agent = %id, "refused a call without the agent's credentials: {why}");
    ApiError::new(StatusCode::UNAUTHORIZED, why)
}

/// The first contact of an agent without credentials, and its token, written together
/// (credentials are issued once, in the database: while it is away, the agent gets its
/// token at a later register). The token to send it, if this server made one.
async fn enroll(
    s: &Shared,
    headers: &HeaderMap,
    contact: Deferred,
) -> Result<Option<String>, ApiError> {
    if s.fleet.outage.is_down() {
        s.fleet.save(contact).await?;
        return Ok(None);
    }
    let id = contact.agent().to_owned();
    let (hash, token) =
        match bearer(headers).filter(|t| agent_protocol::credentials::is_agent_token(t)) {
            // The agent made its own secret: adopted, so a retry after a lost answer (on
            // this server or another of the fleet) proves the same secret; nothing to send.
            Some(own) => (credentials::hash_token(own), None),
            None => {
                let token = credentials::new_token().map_err(|e| {
                    tracing::error!("no randomness for a token: {e}");
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no randomness")
                })?;
                (credentials::hash_token(&token), Some(token))
            }
        };
    // `false` if another server (or a concurrent try of the same register) just gave it
    // another token, or the database went away.
    if !s.fleet.enroll(contact, &hash).await? {
        return Ok(None);
    }
    tracing::info!(agent = %id, "the agent's credentials are set");
    s.fleet
        .outage
        .remember_credentials(&id, &Credentials::Hash(hash));
    Ok(token)
}

/// `POST /agent/leave`: the agent uninstalls itself. Its credentials are revoked (`401`
/// from then on), it is listed `LEFT`, and no wave waits for it.
pub(super) async fn leave(
    State(state): State<AppState>,
    ConnAddress(address): ConnAddress,
    headers: HeaderMap,
    body: Result<Json<wire::Leave>, JsonRejection>,
) -> Result<Response, ApiError> {
    let leave = json_body(body)?;
    check_id(&leave.id)?;
    let s = &state.inner;
    // Only the agent itself, proving its credentials, may take itself out of the fleet.
    authenticate_enrolled(
        s,
        &leave.id,
        &headers,
        "this agent id has no credentials with this fleet: nothing to leave",
    )
    .await?;
    s.fleet.revoke(&leave.id, Revocation::Left).await?;
    tracing::info!(agent = %leave.id, "the agent left the fleet (agent uninstall); its credentials are revoked");
    let who = format!("agent:{}", leave.id);
    super::operators::record(
        s,
        agent_fleet::audit::Change {
            who: &who,
            address: &address,
            action: "agent.leave",
            outcome: agent_fleet::audit::Outcome::Done,
            details: serde_json::json!({ "agent": leave.id }),
        },
    )
    .await;
    Ok(Json(serde_json::json!({ "id": leave.id, "status": "LEFT" })).into_response())
}

/// `POST /agent/command-status` `{"id", "status": "DONE"|"FAILED", "error"}`: how a
/// command the agent was told ended (a restart, a move). Only the agent the command was
/// for may say (its credentials); a repeat is taken as the first was.
pub(super) async fn command_status(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<wire::CommandStatus>, JsonRejection>,
) -> Result<Response, ApiError> {
    let said = json_body(body)?;
    check_id(&said.id)?;
    let s = &state.inner;
    let error = checked_error(said.error, "command status")?;
    let Some(command) = s.fleet.db.command(&said.id).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no such command in this fleet (it was replaced by a later one, or the agent was removed)",
        ));
    };
    authenticate_enrolled(s, &command.agent, &headers, REPORT_NOT_ENROLLED).await?;
    let status = match said.status {
        wire::CommandOutcome::Done => commands::Status::Done,
        wire::CommandOutcome::Failed => commands::Status::Failed,
    };
    let taken = s
        .fleet
        .finish_command(&command, status, error.as_deref())
        .await?;
    if taken {
        tracing::info!(agent = %command.agent, command = %command.id, kind = command.kind.as_str(), argument = %command.argument, error = ?error, "command {}", status.as_str());
    }
    Ok(Json(serde_json::json!({ "id": command.id, "status": status.as_str() })).into_response())
}

/// `POST /agentupdate/report`, from any version.
pub(super) async fn report(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<Report>, JsonRejection>,
) -> Result<Response, ApiError> {
    let mut report = json_body(body)?;
    check_id(&report.id)?;
    // Nobody reports for an agent but that agent: a forged failure could halt a rollout.
    authenticate_enrolled(&state.inner, &report.id, &headers, REPORT_NOT_ENROLLED).await?;
    report.error = checked_error(report.error.take(), "report")?;
    // Agents from before RETRYING report a full disk as INSTALL_FAILED: a machine's
    // fault never counts against the bundle.
    if report.status == UpdateStatus::InstallFailed
        && report
            .error
            .as_deref()
            .is_some_and(|e| blame::of_failure(e) == blame::Blame::Machine)
    {
        report.status = UpdateStatus::Retrying;
    }
    inc(&state.inner.metrics.reports);
    let from = headers.get(wire::BUNDLE_FROM_HEADER);
    state
        .inner
        .metrics
        .bundle_from(from.and_then(|v| v.to_str().ok()));
    tracing::info!(agent = %report.id, from = %report.from, to = %report.to, status = report.status.as_str(), error = ?report.error, "update report");
    let report = Deferred::Report {
        report,
        at_ms: now_ms(),
    };
    let saved = state.inner.fleet.save_within(report, ANSWER_WITHIN).await?;
    // Queued or written, it is the server's now: the agent may forget it.
    Ok(Json(serde_json::json!({ "status": saved.as_str() })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[test]
    fn holds_end_on_a_common_beat_never_later_than_asked() {
        let epoch = Instant::now();
        let wait = Duration::from_secs(30);
        let mut ends = std::collections::BTreeSet::new();
        // A thousand agents connecting a millisecond apart over one second.
        for ms in 0..1000 {
            let now = epoch + Duration::from_millis(10_000 + ms);
            let end = coalesced(now, wait, epoch);
            assert!(end <= now + wait, "answered late at {ms} ms");
            assert!(
                end > now + wait - HOLD_BEAT,
                "answered a beat early at {ms} ms"
            );
            assert_eq!((end - epoch).as_nanos() % HOLD_BEAT.as_nanos(), 0);
            ends.insert(end);
        }
        assert_eq!(ends.len(), 4, "a second of connects ends on its four beats");
    }

    #[test]
    fn a_short_hold_is_kept_exact() {
        let epoch = Instant::now();
        let now = epoch + Duration::from_millis(1234);
        for wait in [1, 2, 4] {
            let wait = Duration::from_secs(wait);
            assert_eq!(coalesced(now, wait, epoch), now + wait);
        }
        let wait = COALESCED_FROM;
        assert_eq!(
            coalesced(now, wait, epoch),
            epoch + Duration::from_millis(6000),
        );
    }

    #[test]
    fn a_window_is_news_to_an_agent_that_downloads_ahead_until_it_has_that_release() {
        let sha = "b".repeat(64);
        let waiting = Greeting::Accepted {
            expected: "1.0.0+1".parse().unwrap(),
            no_bundle: None,
            token: None,
            config: None,
            window: Some(wire::WindowOffer {
                expected: "2.0.0+2".into(),
                sha256: sha.clone(),
                opens_at: 1,
            }),
            deployment: None,
            orders: Vec::new(),
            telemetry: None,
        };
        assert!(
            waiting.is_news(None, Some("1")),
            "it does not know the release yet"
        );
        assert!(!waiting.is_news(None, Some(&sha)), "it has it");
        assert!(
            waiting.is_news(None, Some(&"c".repeat(64))),
            "it has another"
        );
        // An agent that does not download ahead needs nothing before the opening.
        assert!(!waiting.is_news(None, None));
        assert!(
            !waiting.is_news(Some(&sha), None),
            "it stays away from that one anyway"
        );
        assert!(
            waiting.is_news(Some(&"c".repeat(64)), None),
            "accepted, unlike before"
        );
    }
}
