//! Talking to update-servers: register/connect under the version directive, with
//! failover across `server.urls`, and the small requests of the update.
//!
//! Nothing a server sends is trusted: bodies are size-capped, redirects are limited,
//! every request has a deadline, and a server that answers garbage is treated like one
//! that is down.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use agent_protocol::busy::{self, AfterBusy};
use agent_protocol::minisign::Signature;
use agent_protocol::properties::Properties;
use agent_protocol::wire::{
    self, AgentHello, ConfigPayload, ConfigStatus, ConnectBody, NotSupported, Report, VersionInfo,
};
use agent_protocol::{AgentVersion, layout};
use futures_util::StreamExt;
use reqwest::StatusCode;
use reqwest::header::RETRY_AFTER;

use crate::contact::proxy::Proxies;
use crate::contact::rotation;

/// Cap on the small bodies (version properties, 409 answers, signatures).
const MAX_SMALL_BODY: usize = 64 * 1024;
/// Cap on a `200` to register/connect: it may carry a configuration set (1 MiB of
/// files, escaped in JSON).
const MAX_ANSWER_BODY: usize = 8 * 1024 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const MAX_REDIRECTS: usize = 5;
/// Shorter than the server's default `server.idle-timeout`.
const POOL_IDLE: Duration = Duration::from_secs(45);

#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("{url}: {message}")]
    Network { url: String, message: String },
    #[error("{url}: answered {status}{detail}")]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{url}: {message}")]
    Garbage { url: String, message: String },
    /// `503` with `Retry-After` to a register or connect: the server is up and asks to
    /// be asked again later (see [`agent_protocol::busy`]).
    #[error("{url}: busy (503{detail}), asks to come back in {}s", retry_after.as_secs())]
    Busy {
        url: String,
        retry_after: Duration,
        detail: String,
    },
    /// Which servers were tried; `why` keeps each one's failure for `agent status` and
    /// the wrapper (the log has said each failure once already, so the message does
    /// not repeat them).
    #[error("no update-server answered (tried {tried})")]
    AllDown { tried: String, why: String },
}

impl CommError {
    /// The wait a busy server asked for.
    pub fn busy_for(&self) -> Option<Duration> {
        match self {
            CommError::Busy { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The whole reason, for a person asking why: each server's failure when none
    /// answered.
    pub fn why(&self) -> String {
        match self {
            CommError::AllDown { why, .. } => format!("no update-server answered: {why}"),
            other => other.to_string(),
        }
    }
}

/// What a server said to register or connect.
#[derive(Debug, Clone)]
pub enum Directive {
    Accepted,
    /// `409`: this version is not the one the server speaks to.
    Refused(NotSupported),
}

impl Directive {
    /// What the agent acts on: accepted, or refused for which bundle. Two answers with
    /// the same key bring no news.
    pub fn key(&self) -> (bool, Option<&str>, Option<&str>) {
        match self {
            Directive::Accepted => (true, None, None),
            Directive::Refused(ns) => (false, Some(&ns.expected), ns.sha256.as_deref()),
        }
    }
}

/// A `connect` the server may hold (a long poll).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hold {
    /// How long the server may hold the answer.
    pub wait: Duration,
    /// The bundle this agent was refused with and stays away from (it failed here):
    /// a `409` naming it again is no news, so the server holds that too.
    pub known_offer: Option<String>,
    /// The agent downloads ahead of maintenance windows: `Some("1")`, or the sha256 of
    /// the release it already acted on (another one is news to it).
    pub ahead: Option<String>,
}

/// A server's answer to register or connect.
#[derive(Debug, Clone)]
pub struct Answer {
    pub directive: Directive,
    /// The server honours holds ([`wire::LONG_POLL_HEADER`]).
    pub server_holds: bool,
    /// The configuration set the agent should run, when it runs another.
    pub config: Option<ConfigPayload>,
    /// Accepted while its maintenance window is closed: the release it installs when the
    /// window opens.
    pub window: Option<wire::WindowOffer>,
    /// An operator's command (a restart).
    pub command: Option<wire::AgentCommand>,
    /// Another server URL an operator moves this agent to.
    pub endpoint: Option<wire::EndpointOffer>,
    /// Where to export its own telemetry, when it changed (off: nowhere any more).
    pub telemetry: Option<wire::TelemetryOffer>,
    /// The deployment the server says the agent follows (a plain name, or nothing).
    pub deployment: Option<String>,
}

/// A deployment's name as a server said it, if it is one (a plain name of at most 64
/// characters: nothing a server says goes to the status screen unchecked).
fn plain_name(said: Option<&str>) -> Option<String> {
    said.filter(|name| agent_protocol::names::is_plain(name, 64))
        .map(str::to_owned)
}

/// Time allowed on top of a hold for the answer to arrive.
const HOLD_GRACE: Duration = Duration::from_secs(15);

/// How the agent proves who it is and whom it trusts.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// Verify HTTPS servers against this CA alone (PEM); `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Where the agent keeps the credentials a server issued it (`data/agent-token`).
    pub token_file: Option<PathBuf>,
    /// Presented when registering with a server that requires enrollment.
    pub enrollment_token: Option<String>,
    /// `server.proxy`: which proxy, if any, the requests go through.
    pub proxy: crate::contact::proxy::Setting,
}

impl Trust {
    /// As `conf/agent.toml` says, for the installation at `home`.
    pub fn of(config: &crate::config::Config, home: &agent_protocol::layout::AgentHome) -> Self {
        let enrollment = config.server.enrollment_token.trim();
        Self {
            ca_file: config.ca_file(home.root()),
            token_file: Some(home.agent_token()),
            enrollment_token: (!enrollment.is_empty()).then(|| enrollment.to_owned()),
            proxy: config.proxy(),
        }
    }
}

/// The server's enrollment check (`update-server`'s `install::CHECK_PATH`), which
/// `install.sh` asks too.
const CHECK_ENROLLMENT_PATH: &str = "/install/check-enrollment";

pub struct Client {
    http: reqwest::Client,
    urls: Vec<String>,
    current: usize,
    version: AgentVersion,
    hello: AgentHello,
    /// The configuration set the agent runs (empty: none), told in register/connect.
    config_hash: String,
    /// Where the agent exports its own telemetry (empty: nowhere), told likewise.
    telemetry_hash: String,
    trust: Trust,
    /// The routes every request of this client takes (a proxy, or direct).
    proxies: Proxies,
    token: Mutex<Option<String>>,
    /// A rotation's credential not yet taken by a server (see [`rotation`]).
    candidate: Mutex<Option<String>>,
    /// The last failure said of each server, so each is said once, not every heartbeat.
    last_failure: Mutex<HashMap<String, String>>,
    /// What the server last said of a release without a bundle for this platform.
    no_bundle: Mutex<Option<String>>,
    /// Busy answers in a row from the current server.
    busy_in_a_row: u32,
}

impl Client {
    pub fn new(
        urls: Vec<String>,
        version: AgentVersion,
        hello: AgentHello,
        trust: Trust,
    ) -> Result<Self, CommError> {
        let setup = |message: String| CommError::Network {
            url: String::new(),
            message,
        };
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::limited(MAX_REDIRECTS))
            .connect_timeout(Duration::from_secs(10))
            // Let go of an idle connection before the server's keep-alive clock
            // (server.idle-timeout, 60 s) closes it under a request.
            .pool_idle_timeout(POOL_IDLE)
            .user_agent(format!("agent/{version}"));
        if let Some(ca) = &trust.ca_file {
            // A private CA, pinned: the system's roots are not consulted.
            let pem = std::fs::read(ca).map_err(|e| {
                setup(format!(
                    "server.ca-file {}: {e}; put the CA that signed the servers' certificates there",
                    ca.display()
                ))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                setup(format!(
                    "server.ca-file {}: not PEM certificates: {e}",
                    ca.display()
                ))
            })?;
            if certs.is_empty() {
                return Err(setup(format!(
                    "server.ca-file {}: no certificate in it",
                    ca.display()
                )));
            }
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let proxies =
            Proxies::decide(&trust.proxy, &|name| std::env::var(name).ok()).map_err(setup)?;
        let builder = proxies.apply(builder);
        let http = builder.build().map_err(|e| setup(e.to_string()))?;
        let token = trust.token_file.as_deref().and_then(read_token);
        let candidate = trust
            .token_file
            .as_deref()
            .map(candidate_path)
            .as_deref()
            .and_then(rotation::read);
        if candidate.is_some() {
            tracing::info!(
                "a rotated credential waits in {}: this agent presents it first",
                layout::AGENT_TOKEN_CANDIDATE_FILE
            );
        }
        Ok(Self {
            http,
            urls: urls
                .into_iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            current: 0,
            version,
            hello,
            config_hash: String::new(),
            telemetry_hash: String::new(),
            trust,
            proxies,
            token: Mutex::new(token),
            candidate: Mutex::new(candidate),
            last_failure: Mutex::new(HashMap::new()),
            no_bundle: Mutex::new(None),
            busy_in_a_row: 0,
        })
    }

    fn token(&self) -> Option<String> {
        self.token.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn candidate(&self) -> Option<String> {
        self.candidate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A rotation's new credential from an answer: kept as the candidate, on disk
    /// before it is ever presented, so an agent that dies now presents it at its next
    /// start. Without a token file (an agent that keeps no credentials) it is not taken.
    fn keep_candidate(&self, offer: Option<&wire::CredentialsOffer>) {
        let Some(token) = offer
            .map(|o| o.token.trim())
            .filter(|t| !t.is_empty() && t.len() <= 256)
        else {
            return;
        };
        let Some(path) = self.trust.token_file.as_deref().map(candidate_path) else {
            return;
        };
        match rotation::keep(&path, token) {
            Ok(()) => {
                tracing::info!(
                    "{} offered this agent a new credential; kept in {} until a server takes it",
                    self.base(),
                    path.display()
                );
                *self.candidate.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.to_owned());
            }
            Err(e) => tracing::warn!(
                "cannot keep the new credential the server offered ({e}); this agent keeps its old one, and the server offers another later"
            ),
        }
    }

    /// What follows for the credentials from a hello that presented `presented` and
    /// heard `heard` (see [`rotation::after`]); true if the hello is to be made again
    /// with the old credential.
    fn rotated(&self, presented: rotation::Presented, heard: rotation::Heard) -> bool {
        let Some(current) = self.trust.token_file.clone() else {
            return false;
        };
        let path = candidate_path(&current);
        match rotation::after(presented, heard) {
            rotation::Step::Keep => false,
            rotation::Step::Promote => {
                match rotation::promote(&path, &current) {
                    Ok(()) => tracing::info!(
                        "{} took this agent's new credential; the old one is deleted",
                        self.base()
                    ),
                    Err(e) => tracing::error!(
                        "the server took the new credential, but {} cannot replace {}: {e}; it is presented again at the next contact",
                        path.display(),
                        current.display()
                    ),
                }
                if let Some(token) = self.candidate().filter(|_| !path.exists()) {
                    *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token);
                    *self.candidate.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                false
            }
            rotation::Step::FallBack => {
                tracing::warn!(
                    "{} refused this agent's new credential; it is deleted and the old one is used again",
                    self.base()
                );
                let _ = std::fs::remove_file(&path);
                *self.candidate.lock().unwrap_or_else(|p| p.into_inner()) = None;
                true
            }
        }
    }

    /// Keeps credentials a server issued in an answer: in `data/agent-token` (0600).
    /// Says once that the server's release has nothing this platform runs (the agent
    /// keeps its version), and once that it has again.
    fn note_no_bundle(&self, note: Option<&str>) {
        let mut said = self.no_bundle.lock().unwrap_or_else(|p| p.into_inner());
        if said.as_deref() == note {
            return;
        }
        match note {
            Some(note) => tracing::warn!("the server has no bundle for this agent: {note}"),
            None => tracing::info!("the server's release has a bundle for this agent again"),
        }
        *said = note.map(str::to_owned);
    }

    fn keep_token(&self, token: Option<&str>) {
        let Some(token) = token
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= 256)
        else {
            return;
        };
        if let Some(path) = &self.trust.token_file {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            match agent_extract::atomic::write_with_mode(path, token.as_bytes(), Some(0o600)) {
                Ok(()) => tracing::info!(
                    "received this agent's credentials from {}; kept in {}",
                    self.base(),
                    path.display()
                ),
                Err(e) => tracing::error!(
                    "cannot keep the credentials the server issued: {e}; the next register asks again"
                ),
            }
        }
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.to_owned());
    }

    /// An agent-to-server call with this agent's identity: its version, and its
    /// credentials (or, to register without them, the enrollment token).
    fn identified(
        &self,
        request: reqwest::RequestBuilder,
        register: bool,
    ) -> reqwest::RequestBuilder {
        let mut request = request.header(wire::AGENT_VERSION_HEADER, self.version.to_string());
        let token = match self.token() {
            Some(token) => Some(token),
            None if register => self.own_token(),
            None => None,
        };
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        // A first register proves the agent's own secret and, where the server asks for
        // it, the enrollment token too.
        if register && let Some(enrollment) = &self.trust.enrollment_token {
            request = request.header(wire::ENROLLMENT_HEADER, enrollment);
        }
        request
    }

    /// The agent's own secret for its first register, made and kept in `data/agent-token`
    /// (0600) before it is sent: the server adopts it, so an answer lost on the way (a
    /// timeout, a cut connection, a server killed after its commit) costs nothing, and
    /// the retry proves the same secret. `None` if it cannot be kept: then the agent
    /// registers as before credentials and takes the token the server issues.
    fn own_token(&self) -> Option<String> {
        let path = self.trust.token_file.as_ref()?;
        let token = agent_protocol::credentials::new_agent_token()
            .map_err(|e| tracing::warn!("no randomness for this agent's credentials: {e}"))
            .ok()?;
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match agent_extract::atomic::write_with_mode(path, token.as_bytes(), Some(0o600)) {
            Ok(()) => {
                tracing::info!(
                    "made this agent's credentials, kept in {}; its first register proves them",
                    path.display()
                );
                *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
                Some(token)
            }
            Err(e) => {
                tracing::warn!(
                    "cannot keep this agent's credentials in {}: {e}; registering without, the server issues them",
                    path.display()
                );
                None
            }
        }
    }

    /// Says a server's failure once per distinct reason (a certificate that does not
    /// verify would otherwise fill the log every heartbeat).
    fn say_failure(&self, server: &str, e: &CommError) {
        let text = self.explained(server, &e.to_string());
        let mut last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        if last.get(server) != Some(&text) {
            tracing::warn!("{text}");
            last.insert(server.to_owned(), text);
        }
    }

    fn say_success(&self, server: &str) {
        let mut last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        if last.remove(server).is_some() {
            tracing::info!("{server} answers again");
        }
    }

    /// The `"health"` the next `register` or `connect` carries.
    pub fn set_health(&mut self, health: agent_protocol::wire::AgentHealth) {
        self.hello.health = Some(health);
    }

    /// The `"config_hash"` the next `register` or `connect` carries.
    pub fn set_config_hash(&mut self, hash: String) {
        self.config_hash = hash;
    }

    /// The `"telemetry_hash"` the next `register` or `connect` carries.
    pub fn set_telemetry_hash(&mut self, hash: String) {
        self.telemetry_hash = hash;
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The routes this client's requests take.
    pub fn proxies(&self) -> &Proxies {
        &self.proxies
    }

    /// `message`, a failure of a request to `url`, with the proxy it went through named
    /// (never its password) and, when the proxy caused it, what that means.
    pub fn explained(&self, url: &str, message: &str) -> String {
        let message = crate::contact::proxy::redact(message);
        match self.proxies.for_url(url) {
            None => message,
            Some(via) => match crate::contact::proxy::explain(&message, via) {
                Some(meaning) => format!("{message}; {meaning}"),
                None => format!("{message}{}", self.proxies.note(url)),
            },
        }
    }

    pub fn version(&self) -> &AgentVersion {
        &self.version
    }

    /// The server this agent talks to now.
    pub fn base(&self) -> &str {
        &self.urls[self.current.min(self.urls.len() - 1)]
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }

    /// `connect` (or `register` when `first`) to the current server; on network
    /// trouble or a 5xx, fails over to the next server in order and registers there,
    /// so the new server checks the version again. A busy server (`503` with
    /// `Retry-After`) is asked again after its wait, and failed over from only when
    /// it is busy [`busy::BUSY_ROUNDS`] times in a row.
    pub async fn hello(&mut self, first: bool) -> Result<Directive, CommError> {
        self.contact(first, None).await.map(|a| a.directive)
    }

    /// Like [`Client::hello`], with a `connect` the server may hold as `hold` says. A
    /// register (the first contact, or one after a failover) is never held.
    pub async fn contact(&mut self, first: bool, hold: Option<&Hold>) -> Result<Answer, CommError> {
        let mut register = first;
        let mut tried = Vec::new();
        for _ in 0..self.urls.len() {
            let path = if register {
                wire::REGISTER_PATH
            } else {
                wire::CONNECT_PATH
            };
            let held = if register { None } else { hold };
            match self.hello_once(path, register, held).await {
                Ok(d) => {
                    self.busy_in_a_row = 0;
                    self.say_success(self.base());
                    return Ok(d);
                }
                Err(e) => {
                    self.say_failure(self.base(), &e);
                    if e.busy_for().is_some() {
                        self.busy_in_a_row += 1;
                        if busy::after_busy(self.busy_in_a_row, self.urls.len())
                            == AfterBusy::AskAgain
                        {
                            return Err(e);
                        }
                    }
                    self.busy_in_a_row = 0;
                    tried.push((self.base().to_owned(), e.to_string()));
                    if self.urls.len() > 1 {
                        self.current = (self.current + 1) % self.urls.len();
                        tracing::info!("failing over to {}", self.base());
                    }
                    register = true;
                }
            }
        }
        Err(all_down(&tried))
    }

    async fn hello_once(
        &self,
        path: &str,
        register: bool,
        hold: Option<&Hold>,
    ) -> Result<Answer, CommError> {
        let presented = rotation::presented(self.token().is_some(), self.candidate().is_some());
        let result = self.hello_as(path, register, hold, presented).await;
        let heard = match &result {
            Ok(_) => rotation::Heard::Taken,
            Err(CommError::Status { status: 401, .. }) => rotation::Heard::Refused,
            Err(_) => rotation::Heard::Nothing,
        };
        if self.rotated(presented, heard) {
            return self
                .hello_as(path, register, hold, rotation::Presented::Current)
                .await;
        }
        result
    }

    async fn hello_as(
        &self,
        path: &str,
        register: bool,
        hold: Option<&Hold>,
        presented: rotation::Presented,
    ) -> Result<Answer, CommError> {
        let url = self.url(path);
        let mut hello = self.hello.clone();
        hello.endpoint = Some(self.base().to_owned());
        let body = ConnectBody {
            hello,
            config_hash: self.config_hash.clone(),
            telemetry_hash: Some(self.telemetry_hash.clone()),
        };
        let mut request = self.http.post(&url).json(&body);
        request = match hold {
            Some(hold) => {
                let mut query = vec![(wire::WAIT_QUERY, hold.wait.as_secs().max(1).to_string())];
                if let Some(sha) = &hold.known_offer {
                    query.push((wire::KNOWN_QUERY, sha.clone()));
                }
                if let Some(have) = &hold.ahead {
                    query.push((wire::AHEAD_QUERY, have.clone()));
                }
                request.query(&query).timeout(hold.wait + HOLD_GRACE)
            }
            None => request.timeout(REQUEST_TIMEOUT),
        };
        let request = match (presented, self.candidate()) {
            (rotation::Presented::Candidate, Some(candidate)) => request
                .header(wire::AGENT_VERSION_HEADER, self.version.to_string())
                .bearer_auth(candidate),
            _ => self.identified(request, register),
        };
        let resp = request.send().await.map_err(|e| network(&url, e))?;
        let server_holds = resp.headers().contains_key(wire::LONG_POLL_HEADER);
        let answer = |directive| Answer {
            directive,
            server_holds,
            config: None,
            window: None,
            deployment: None,
            command: None,
            endpoint: None,
            telemetry: None,
        };
        let status = resp.status();
        match status {
            s if s.is_success() => {
                // The body is the directive's answer; it may carry credentials and a
                // configuration set.
                let mut accepted = answer(Directive::Accepted);
                if let Ok(body) = capped_body(resp, &url, MAX_ANSWER_BODY).await
                    && let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(&body)
                {
                    self.keep_token(json.get("token").and_then(|t| t.as_str()));
                    self.note_no_bundle(json.get("no_bundle").and_then(|t| t.as_str()));
                    accepted.deployment =
                        plain_name(json.get("deployment").and_then(|d| d.as_str()));
                    let credentials = json
                        .get_mut("credentials")
                        .map(serde_json::Value::take)
                        .and_then(|c| serde_json::from_value::<wire::CredentialsOffer>(c).ok());
                    // Taken only from an answer to the credential the server knows: an
                    // answer to a candidate is that candidate taken.
                    if presented != rotation::Presented::Candidate {
                        self.keep_candidate(credentials.as_ref());
                    }
                    accepted.command = json
                        .get_mut("command")
                        .map(serde_json::Value::take)
                        .and_then(|c| serde_json::from_value::<wire::AgentCommand>(c).ok());
                    accepted.endpoint = json
                        .get_mut("endpoint")
                        .map(serde_json::Value::take)
                        .and_then(|e| serde_json::from_value::<wire::EndpointOffer>(e).ok());
                    accepted.telemetry = json
                        .get_mut("telemetry")
                        .map(serde_json::Value::take)
                        .and_then(|t| serde_json::from_value::<wire::TelemetryOffer>(t).ok())
                        .map(|mut t| {
                            // What the server compares next time is what it says, checked.
                            t.hash = t.hash_of();
                            t
                        });
                    accepted.window = json
                        .get_mut("window")
                        .map(serde_json::Value::take)
                        .and_then(|w| serde_json::from_value::<wire::WindowOffer>(w).ok());
                    if let Some(config) = json.get_mut("config").map(serde_json::Value::take) {
                        match serde_json::from_value::<ConfigPayload>(config) {
                            Ok(set) => accepted.config = Some(set),
                            Err(e) => tracing::warn!(
                                "{url}: a \"config\" that is not a configuration set ({e}); ignored"
                            ),
                        }
                    }
                }
                Ok(accepted)
            }
            StatusCode::CONFLICT => {
                let body = small_body(resp, &url).await?;
                let ns: NotSupported =
                    serde_json::from_slice(&body).map_err(|e| CommError::Garbage {
                        url: url.clone(),
                        message: format!("409 with a body that is not the directive: {e}"),
                    })?;
                if ns.expected.parse::<AgentVersion>().is_err() {
                    return Err(CommError::Garbage {
                        url,
                        message: format!("409 names {:?}, which is not VERSION+BUILD", ns.expected),
                    });
                }
                if let Some(sha) = &ns.sha256
                    && (sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    return Err(CommError::Garbage {
                        url,
                        message: "409 names a bundle sha256 that is not 64 hex digits".into(),
                    });
                }
                self.keep_token(ns.token.as_deref());
                let deployment = plain_name(ns.deployment.as_deref());
                Ok(Answer {
                    deployment,
                    ..answer(Directive::Refused(ns))
                })
            }
            StatusCode::SERVICE_UNAVAILABLE if resp.headers().contains_key(RETRY_AFTER) => {
                let retry_after = crate::contact::backoff::retry_after_of(&resp, Duration::ZERO);
                match status_error(&url, status, resp).await {
                    CommError::Status { detail, .. } => Err(CommError::Busy {
                        url,
                        retry_after,
                        detail,
                    }),
                    other => Err(other),
                }
            }
            s => Err(status_error(&url, s, resp).await),
        }
    }

    /// `GET path` of the current server as UTF-8 text of at most [`MAX_SMALL_BODY`] bytes.
    async fn get_text(&self, path: &str) -> Result<(String, String), CommError> {
        let url = self.url(path);
        let resp = self
            .http
            .get(&url)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| network(&url, e))?;
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(status_error(&url, status, resp).await);
        }
        let body = small_body(resp, &url).await?;
        match String::from_utf8(body) {
            Ok(text) => Ok((url, text)),
            Err(_) => Err(CommError::Garbage {
                url,
                message: "answer is not UTF-8 text".into(),
            }),
        }
    }

    /// `GET /agentupdate/version?platform=<this agent's platform>`, parsed and checked
    /// (a server that knows no releases ignores the query); with `release` (what the
    /// server's directive named: its deployment's release), `&release=<version>+<build>`.
    pub async fn version_info(
        &self,
        release: Option<&AgentVersion>,
    ) -> Result<VersionInfo, CommError> {
        let path = match release {
            Some(release) => {
                wire::for_release(wire::VERSION_PATH, layout::PLATFORM, &release.to_string())
            }
            None => wire::for_platform(wire::VERSION_PATH, layout::PLATFORM),
        };
        let (url, text) = self.get_text(&path).await?;
        let garbage = |message: String| CommError::Garbage {
            url: url.clone(),
            message,
        };
        let props = Properties::parse(&text).map_err(|e| garbage(e.to_string()))?;
        VersionInfo::from_properties(&props).map_err(|e| garbage(e.to_string()))
    }

    /// `GET /agentupdate/download.minisig?platform=<this agent's platform>&release=<release>`.
    pub async fn signature(&self, release: &AgentVersion) -> Result<Signature, CommError> {
        let path = wire::for_release(wire::SIGNATURE_PATH, layout::PLATFORM, &release.to_string());
        let (url, text) = self.get_text(&path).await?;
        Signature::parse(&text).map_err(|e| CommError::Garbage {
            url,
            message: e.to_string(),
        })
    }

    /// `POST /agent/config-status`.
    pub async fn config_status(&self, status: &ConfigStatus) -> Result<(), CommError> {
        self.post_status(self.url(wire::CONFIG_STATUS_PATH), status)
            .await
    }

    /// Posts an agent's status `body` to `url` with its credentials: taken, or the
    /// server's refusal in words.
    async fn post_status(
        &self,
        url: String,
        body: &impl serde::Serialize,
    ) -> Result<(), CommError> {
        let request = self.http.post(&url).timeout(REQUEST_TIMEOUT).json(body);
        let resp = self
            .identified(request, false)
            .send()
            .await
            .map_err(|e| network(&url, e))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            let status = resp.status();
            Err(status_error(&url, status, resp).await)
        }
    }

    /// `POST /agent/command-status`: how a command ended, to the server this agent talks
    /// to now (one of the fleet that told it, which shares its commands).
    pub async fn command_status(&self, status: &wire::CommandStatus) -> Result<(), CommError> {
        self.command_status_to(self.base(), status).await
    }

    /// `POST /agent/command-status` to the server at `base`.
    pub async fn command_status_to(
        &self,
        base: &str,
        status: &wire::CommandStatus,
    ) -> Result<(), CommError> {
        self.post_status(format!("{base}{}", wire::COMMAND_STATUS_PATH), status)
            .await
    }

    /// A register at `base` (a server this agent is moved to), with this agent's
    /// credentials: whether that server speaks to it (`2xx`, or a `409` directive).
    pub async fn register_at(&self, base: &str) -> Result<(), CommError> {
        let base = base.trim_end_matches('/');
        let url = format!("{base}{}", wire::REGISTER_PATH);
        let mut hello = self.hello.clone();
        hello.endpoint = Some(base.to_owned());
        let body = ConnectBody {
            hello,
            config_hash: self.config_hash.clone(),
            telemetry_hash: Some(self.telemetry_hash.clone()),
        };
        let request = self.http.post(&url).timeout(REQUEST_TIMEOUT).json(&body);
        let resp = self
            .identified(request, true)
            .send()
            .await
            .map_err(|e| network(&url, e))?;
        match resp.status() {
            s if s.is_success() || s == StatusCode::CONFLICT => Ok(()),
            s => Err(status_error(&url, s, resp).await),
        }
    }

    /// From now on this agent talks to `base` alone (a move it kept).
    pub fn move_to(&mut self, base: &str) {
        self.urls = vec![base.trim_end_matches('/').to_owned()];
        self.current = 0;
    }

    /// `POST /agent/leave` to each server in turn until one takes it: this agent leaves
    /// the fleet (its credentials are revoked there).
    pub async fn leave(&self, id: &str) -> Result<String, CommError> {
        let mut tried = Vec::new();
        for base in &self.urls {
            let url = format!("{base}{}", wire::LEAVE_PATH);
            let request = self
                .http
                .post(&url)
                .timeout(LEAVE_TIMEOUT)
                .json(&wire::Leave { id: id.to_owned() });
            let answer = self.identified(request, false).send().await;
            match answer {
                Ok(resp) if resp.status().is_success() => return Ok(base.clone()),
                Ok(resp) => {
                    let status = resp.status();
                    let e = status_error(&url, status, resp).await;
                    tried.push((base.clone(), e.to_string()));
                }
                Err(e) => tried.push((base.clone(), network(&url, e).to_string())),
            }
        }
        Err(all_down(&tried))
    }

    /// `GET /install/check-enrollment` with the enrollment token, of each server in turn
    /// until one answers: `Ok(server)` when it would enroll this agent, `Err((server,
    /// its words))` when it would not. Registers nothing.
    pub async fn check_enrollment(&self) -> Result<Result<String, (String, String)>, CommError> {
        let mut tried = Vec::new();
        for base in &self.urls {
            let url = format!("{base}{CHECK_ENROLLMENT_PATH}");
            let mut request = self.http.get(&url).timeout(REQUEST_TIMEOUT);
            if let Some(token) = &self.trust.enrollment_token {
                request = request.header(wire::ENROLLMENT_HEADER, token);
            }
            let resp = match request.send().await {
                Ok(resp) if resp.status().is_success() => resp,
                Ok(resp) => {
                    let status = resp.status();
                    tried.push((
                        base.clone(),
                        status_error(&url, status, resp).await.to_string(),
                    ));
                    continue;
                }
                Err(e) => {
                    tried.push((base.clone(), network(&url, e).to_string()));
                    continue;
                }
            };
            let body = small_body(resp, &url).await?;
            let text = String::from_utf8_lossy(&body);
            let mut lines = text.lines();
            return Ok(match lines.next().map(str::trim) {
                Some("ok") => Ok(base.clone()),
                Some("refused") => {
                    Err((base.clone(), lines.next().unwrap_or("").trim().to_owned()))
                }
                _ => {
                    return Err(CommError::Garbage {
                        url,
                        message: "not an answer to an enrollment check (ok or refused)".into(),
                    });
                }
            });
        }
        Err(all_down(&tried))
    }

    /// `POST /agentupdate/report`.
    pub async fn report(&self, report: &Report) -> Result<(), CommError> {
        self.report_from(report, None).await
    }

    /// `POST /agentupdate/report`, saying where the bundle's bytes came from when the
    /// server named a download source ([`wire::BUNDLE_FROM_HEADER`]).
    pub async fn report_from(
        &self,
        report: &Report,
        bundle_from: Option<&str>,
    ) -> Result<(), CommError> {
        let url = self.url(wire::REPORT_PATH);
        let mut request = self.http.post(&url).timeout(REQUEST_TIMEOUT).json(report);
        if let Some(from) = bundle_from {
            request = request.header(wire::BUNDLE_FROM_HEADER, from);
        }
        let resp = self
            .identified(request, false)
            .send()
            .await
            .map_err(|e| network(&url, e))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            let status = resp.status();
            Err(status_error(&url, status, resp).await)
        }
    }
}

/// `data/agent-token.candidate` beside `data/agent-token`.
fn candidate_path(token_file: &std::path::Path) -> PathBuf {
    token_file.with_file_name(layout::AGENT_TOKEN_CANDIDATE_FILE)
}

/// A leaving agent does not wait long for a server that is gone.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The credentials kept in `data/agent-token`, if any.
fn read_token(path: &std::path::Path) -> Option<String> {
    match agent_extract::atomic::read_text(path, 1024) {
        Ok(text) => Some(text.trim().to_owned()).filter(|t| !t.is_empty()),
        Err(_) => None,
    }
}

// reqwest hides the useful part of an error, such as "connection refused", in its sources.
pub(crate) use agent_protocol::shown::error_chain;

/// Every server failed: `(base URL, its failure)` of each.
fn all_down(tried: &[(String, String)]) -> CommError {
    CommError::AllDown {
        tried: tried
            .iter()
            .map(|(base, _)| base.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        why: tried
            .iter()
            .map(|(_, why)| why.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn network(url: &str, e: reqwest::Error) -> CommError {
    let mut message = error_chain(&e);
    if e.is_redirect() {
        message = format!("too many redirects (more than {MAX_REDIRECTS}): {message}");
    } else if message.to_ascii_lowercase().contains("certificate") {
        message = format!(
            "{message}; the server's certificate does not verify: set server.ca-file to the CA that issued it, or give the server a certificate this machine's roots trust"
        );
    }
    CommError::Network {
        url: url.to_owned(),
        message,
    }
}

async fn status_error(url: &str, status: StatusCode, resp: reqwest::Response) -> CommError {
    let detail = small_body(resp, url)
        .await
        .ok()
        .map(|b| {
            String::from_utf8_lossy(&b)
                .chars()
                .take(200)
                .collect::<String>()
        })
        .filter(|s| !s.trim().is_empty())
        .map(|s| format!(": {}", s.trim()))
        .unwrap_or_default();
    CommError::Status {
        url: url.to_owned(),
        status: status.as_u16(),
        detail,
    }
}

/// Reads at most [`MAX_SMALL_BODY`] bytes; more is an error, never a truncation.
async fn small_body(resp: reqwest::Response, url: &str) -> Result<Vec<u8>, CommError> {
    capped_body(resp, url, MAX_SMALL_BODY).await
}

/// Reads at most `cap` bytes; more is an error, never a truncation.
async fn capped_body(resp: reqwest::Response, url: &str, cap: usize) -> Result<Vec<u8>, CommError> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| network(url, e))?;
        if out.len() + chunk.len() > cap {
            return Err(CommError::Garbage {
                url: url.to_owned(),
                message: format!("answer longer than {cap} bytes"),
            });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}
