//! The fleet page: `GET /` and its few addresses, for people, in a browser
//! (docs/operations.md, "The fleet page"). Server-rendered HTML from templates compiled
//! into the binary, one stylesheet served from here, no script at all.
//!
//! It signs people in and checks them (sign-in with the admin token, a session cookie,
//! a CSRF token on every form); the sessions themselves are kept in the fleet database
//! ([`agent_fleet::sessions`]), so a restart signs no one out. It never decides
//! anything about the fleet: it reads the rows the admin API lists ([`source`]) and its buttons
//! call the functions the admin API calls. Every string an agent sent is untrusted text;
//! the templates escape it and the Content-Security-Policy forbids any script.
//!
//! Pure parts: [`model`] (the row, staleness), [`overview`] (counts), [`query`]
//! (filters, paging), [`session`] (cookies, CSRF, origins), [`views`] (templates).

pub mod model;
pub mod overview;
pub mod query;
pub mod session;
pub mod source;
pub mod views;
pub mod windows;
pub mod words;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};

use agent_fleet::FleetError;
use agent_fleet::db::{now_ms, now_secs};

use agent_fleet::operators::{self as ops, Role};
use server_core::actions::{self, Act, ActionError, Actor, Refused, Step, Target, Via};
use server_core::error::ApiError;
use server_core::state::AppState;
use session::{COOKIE, CSRF_FIELD, SIGNIN_COOKIE, SignedIn};
use views::Frame;

/// What the page needs from the server's configuration.
#[derive(Debug, Clone)]
pub struct Options {
    /// `admin.token`: the one secret that signs a person in.
    pub admin_token: String,
    /// `agents.heartbeat`: staleness is counted in these.
    pub heartbeat: Duration,
    /// The server speaks HTTPS: cookies get `Secure`.
    pub secure: bool,
}

/// How long a wrong token waits for its answer; wrong tries are answered one at a time.
pub const WRONG_TOKEN_DELAY: Duration = Duration::from_secs(1);

/// Largest form accepted (a sign-in or a button).
const MAX_FORM: usize = 16 * 1024;

/// Forbids every script, inline or fetched, and everything not from this server.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLESHEET: &str = include_str!("../static/fleet.css");

#[derive(Clone)]
struct Page {
    app: AppState,
    /// Held while a wrong token waits, so that guesses are answered one at a time.
    wrong_tries: Arc<tokio::sync::Mutex<()>>,
    options: Arc<Options>,
}

/// The page's routes, to merge into the server's router when `admin.token` is set.
pub fn router(app: AppState, options: Options) -> Router {
    let timeout = tower_http::timeout::TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        app.inner.request_timeout,
    );
    let page = Page {
        app,
        wrong_tries: Arc::default(),
        options: Arc::new(options),
    };
    Router::new()
        .route("/", get(home))
        .route("/signin", get(to_home).post(sign_in))
        .route("/signout", get(to_home).post(sign_out))
        .route("/agents", get(agents))
        .route("/agents/{id}", get(agent))
        .route("/agents/{id}/{button}", post(agent_button))
        .route("/rollouts", get(rollouts))
        .route("/rollouts/{action}", post(act_bundle))
        .route("/rollouts/config/{group}/{action}", post(act_config))
        .route("/rollouts/deployment/{name}/{action}", post(act_deployment))
        .route("/approvals/{id}/{decision}", post(decide))
        .route("/audit", get(audit))
        .route("/tokens", get(tokens).post(create_token))
        .route("/tokens/{name}/revoke", post(revoke_token))
        .route("/static/fleet.css", get(stylesheet))
        .layer(axum::middleware::map_response(protect))
        .layer(DefaultBodyLimit::max(MAX_FORM))
        .layer(timeout)
        .with_state(page)
}

/// Headers on every answer of the page: no script, no framing, no caching of what a
/// signed-in person saw.
async fn protect(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |h: &mut HeaderMap, name: header::HeaderName, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        CONTENT_SECURITY_POLICY,
    );
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    // Not `no-referrer`: under it a browser sends `Origin: null` with the page's own
    // forms, and the origin check could not tell them from a forged one.
    set(headers, header::REFERRER_POLICY, "same-origin");
    if !headers.contains_key(header::CACHE_CONTROL) {
        set(headers, header::CACHE_CONTROL, "no-store");
    }
    response
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        STYLESHEET,
    )
        .into_response()
}

async fn to_home() -> Redirect {
    Redirect::to("/")
}

fn render(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!("fleet page template: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error; see the server log",
            )
                .into_response()
        }
    }
}

/// A page that could not be made: the admin API's status and words, as HTML.
struct Trouble(ApiError);

impl From<FleetError> for Trouble {
    fn from(e: FleetError) -> Self {
        Self(ApiError::from(e))
    }
}

impl IntoResponse for Trouble {
    fn into_response(self) -> Response {
        let message = if self.0.status.is_server_error() && self.0.retry_after.is_none() {
            "internal error; see the server log".to_owned()
        } else {
            self.0.message
        };
        let mut response = render(
            self.0.status,
            &views::Message::new(Frame::new("Trouble", "", now_secs()), &message),
        );
        if let Some(secs) = self.0.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A live session: its id, its CSRF token, and who signed in.
struct Signed {
    id: String,
    csrf: String,
    who: SignedIn,
}

/// The request's live session, if it has one. A session of a named token ends the
/// moment the token is revoked (on any server of the fleet): it is looked up again on
/// every request.
async fn signed_in(page: &Page, headers: &HeaderMap) -> Result<Option<Signed>, Trouble> {
    let Some(id) = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie(c, COOKIE))
    else {
        return Ok(None);
    };
    let sessions = page.app.inner.fleet.sessions();
    let Some(agent_fleet::sessions::Session { csrf, who }) = sessions.check(id, now_ms()).await?
    else {
        return Ok(None);
    };
    if let Some(hash) = &who.token_hash
        && page
            .app
            .inner
            .fleet
            .operators()
            .by_hash(hash)
            .await?
            .is_none()
    {
        sessions.end(id).await?;
        tracing::info!(name = %who.name, "fleet page: a session of a revoked token ended");
        return Ok(None);
    }
    Ok(Some(Signed {
        id: id.to_owned(),
        csrf,
        who,
    }))
}

fn same_origin(headers: &HeaderMap, request_host: Option<&str>) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host = get("host").or(request_host);
    session::same_origin(get("origin"), host, get("sec-fetch-site"))
}

fn refused(status: StatusCode, message: &str) -> Response {
    let mut response = render(
        status,
        &views::Message::new(Frame::new("Refused", "", now_secs()), message),
    );
    // The audit layer records it with these words (the body is the page's HTML).
    response
        .extensions_mut()
        .insert(server_core::routes::refusals::Reason(message.to_owned()));
    response
}

/// A refusal this page's handler recorded in the audit log itself.
fn refused_and_audited(status: StatusCode, message: &str) -> Response {
    audited(refused(status, message))
}

/// `response`, marked as a refusal its handler already recorded in the audit log (the
/// audit layer then records it no second time).
fn audited(mut response: Response) -> Response {
    response
        .extensions_mut()
        .insert(server_core::routes::refusals::Audited);
    response
}

/// The sign-in form, with a fresh CSRF pair (cookie and field).
fn sign_in_form(page: &Page, status: StatusCode, message: &str) -> Response {
    let nonce = session::random_token();
    let mut response = render(
        status,
        &views::SignIn::new(
            Frame::new("Sign in", "", now_secs()),
            nonce.clone(),
            message,
        ),
    );
    let cookie = session::set_cookie(SIGNIN_COOKIE, &nonce, session::IDLE, page.options.secure);
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
        .extensions_mut()
        .insert(server_core::routes::refusals::Reason(message.to_owned()));
    response
}

async fn home(State(page): State<Page>, headers: HeaderMap) -> Result<Response, Trouble> {
    let Some(Signed { csrf, .. }) = signed_in(&page, &headers).await? else {
        return Ok(sign_in_form(&page, StatusCode::OK, ""));
    };
    let s = &page.app.inner;
    let now = now_secs();
    let heartbeat = page.options.heartbeat;
    let agents = source::agents(s).await?;
    let rollout = source::rollout(s).await?;
    let configs = source::config_sets(s).await?;
    let o = overview::overview(&agents, heartbeat, now);
    let failed = agents.iter().filter(|a| a.failed()).count();
    let now_ms = now_ms();
    let waiting = s
        .fleet
        .approvals()
        .list()
        .await?
        .iter()
        .filter(|a| a.state_at(now_ms) == agent_fleet::approvals::State::AwaitingApproval)
        .count();
    Ok(render(
        StatusCode::OK,
        &views::OverviewPage::new(
            Frame::new("Overview", &csrf, now),
            &o,
            failed,
            heartbeat * model::STALE_HEARTBEATS,
            rollout.as_ref().map(|r| views::RolloutView::new(r, now)),
            views::ConfigView::all(&configs, now),
            now,
        )
        .with_waiting(waiting),
    ))
}

async fn sign_in(State(page): State<Page>, headers: HeaderMap, request: Request) -> Response {
    let (host, form) = read_form(request).await;
    if !same_origin(&headers, host.as_deref()) {
        return refused(
            StatusCode::FORBIDDEN,
            "refused: this form was not sent from this server's own page",
        );
    }
    let field = form.get(CSRF_FIELD).map_or("", String::as_str);
    let nonce = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| session::cookie(c, SIGNIN_COOKIE))
        .unwrap_or("");
    if !session::secret_matches(field, nonce) {
        return refused(
            StatusCode::FORBIDDEN,
            "refused: the form's CSRF token is missing or stale; open the sign-in page again and sign in from there",
        );
    }
    let token = form.get("token").map_or("", String::as_str);
    let who = if session::secret_matches(token, &page.options.admin_token) {
        Some(SignedIn {
            name: ops::BOOTSTRAP.to_owned(),
            role: Role::Admin,
            token_hash: None,
        })
    } else if token.is_empty() {
        None
    } else {
        match page.app.inner.fleet.operators().authenticate(token).await {
            Ok(found) => found.map(|op| SignedIn {
                name: op.name,
                role: op.role,
                token_hash: Some(agent_fleet::credentials::hash_token(token)),
            }),
            Err(e) => return Trouble::from(e).into_response(),
        }
    };
    let Some(who) = who else {
        let _one_at_a_time = page.wrong_tries.lock().await;
        tokio::time::sleep(WRONG_TOKEN_DELAY).await;
        tracing::warn!("fleet page: a sign-in with a wrong token was refused");
        return sign_in_form(
            &page,
            StatusCode::UNAUTHORIZED,
            "That is not the admin token, nor an operator's token. Try again.",
        );
    };
    tracing::info!(name = %who.name, role = %who.role, "fleet page: signed in");
    let (id, _) = match page.app.inner.fleet.sessions().start(&who, now_ms()).await {
        Ok(started) => started,
        Err(e) => return Trouble::from(e).into_response(),
    };
    let mut response = Redirect::to("/").into_response();
    for cookie in [
        session::set_cookie(COOKIE, &id, session::MAX_AGE, page.options.secure),
        session::set_cookie(SIGNIN_COOKIE, "", Duration::ZERO, page.options.secure),
    ] {
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    response
}

/// The checks every button's POST passes: a live session, its CSRF token in the form,
/// sent from this server's own page. The inner `Err` says why it is refused (`403`).
async fn check_post(
    page: &Page,
    headers: &HeaderMap,
    host: Option<&str>,
    form: &HashMap<String, String>,
) -> Result<Result<Signed, &'static str>, Trouble> {
    if !same_origin(headers, host) {
        return Ok(Err(
            "refused: this form was not sent from this server's own page",
        ));
    }
    let Some(signed) = signed_in(page, headers).await? else {
        return Ok(Err(
            "refused: you are not signed in (or your session ended); sign in again",
        ));
    };
    let field = form.get(CSRF_FIELD).map_or("", String::as_str);
    if !session::secret_matches(field, &signed.csrf) {
        return Ok(Err(
            "refused: the form's CSRF token is missing or wrong; reload the page and try again",
        ));
    }
    Ok(Ok(signed))
}

/// The form of a POST, and the request's authority (HTTP/2 has no `Host`). A body that
/// is not a form reads as an empty one: the CSRF check then refuses it with `403`.
async fn read_form(request: Request) -> (Option<String>, HashMap<String, String>) {
    let host = request.uri().authority().map(|a| a.as_str().to_owned());
    let form = <Form<HashMap<String, String>> as axum::extract::FromRequest<()>>::from_request(
        request,
        &(),
    )
    .await
    .map(|Form(form)| form)
    .unwrap_or_default();
    (host, form)
}

async fn sign_out(State(page): State<Page>, headers: HeaderMap, request: Request) -> Response {
    let (host, form) = read_form(request).await;
    let id = match check_post(&page, &headers, host.as_deref(), &form).await {
        Ok(Ok(signed)) => signed.id,
        Ok(Err(why)) => return refused(StatusCode::FORBIDDEN, why),
        Err(trouble) => return trouble.into_response(),
    };
    if let Err(e) = page.app.inner.fleet.sessions().end(&id).await {
        return Trouble::from(e).into_response();
    }
    tracing::info!("fleet page: signed out");
    let mut response = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(
        COOKIE,
        "",
        Duration::ZERO,
        page.options.secure,
    )) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

async fn agents(
    State(page): State<Page>,
    headers: HeaderMap,
    Query(pairs): Query<HashMap<String, String>>,
) -> Result<Response, Trouble> {
    let Some(Signed { csrf, .. }) = signed_in(&page, &headers).await? else {
        return Ok(Redirect::to("/").into_response());
    };
    let now = now_secs();
    let heartbeat = page.options.heartbeat;
    let all = source::agents(&page.app.inner).await?;
    let q = query::AgentQuery::from_pairs(&pairs);
    let p = query::page(&all, &q, heartbeat, now);
    let mut rows: Vec<model::Agent> = p.rows.iter().map(|a| (*a).clone()).collect();
    source::add_waves(&page.app.inner, &mut rows).await?;
    Ok(render(
        StatusCode::OK,
        &views::AgentsPage::new(
            Frame::new("Agents", &csrf, now),
            q.clone(),
            views::Choices::of(&all),
            &p,
            &rows,
            heartbeat,
            now,
        ),
    ))
}

async fn agent(
    State(page): State<Page>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Trouble> {
    let Some(Signed { csrf, .. }) = signed_in(&page, &headers).await? else {
        return Ok(Redirect::to("/").into_response());
    };
    let now = now_secs();
    let s = &page.app.inner;
    let Some(a) = source::agent(s, &id).await? else {
        return Ok(render(
            StatusCode::NOT_FOUND,
            &views::Message::new(
                Frame::new("No such agent", &csrf, now),
                &format!("No agent {id:?} is known to the fleet."),
            ),
        ));
    };
    let history = source::history(s, &id).await?;
    let last_command = s.fleet.db.last_commands().await?.remove(&id);
    let mut view = views::AgentPage::new(
        Frame::new("Agent", &csrf, now),
        views::AgentView::new(&a, page.options.heartbeat, now),
        &history,
        now,
    );
    view.last_command = last_command.map(|c| views::CommandView::new(&c, now));
    Ok(render(StatusCode::OK, &view))
}

async fn rollouts_page(
    page: &Page,
    signed: &Signed,
    status: StatusCode,
    message: &str,
) -> Result<Response, Trouble> {
    let now = now_secs();
    let s = &page.app.inner;
    let rollout = source::rollout(s).await?;
    let configs = source::config_sets(s).await?;
    let history = s.releases.releases().history(s.releases.keep()).await?;
    let mut rollout = rollout.as_ref().map(|r| views::RolloutView::new(r, now));
    let mut configs = views::ConfigView::all(&configs, now);
    let mut deployments: Vec<views::DeploymentView> = source::deployments(s)
        .await?
        .iter()
        .map(|(d, r)| views::DeploymentView::new(d, r.as_ref(), now))
        .collect();
    // The buttons a role may not use are not shown (and refused if forged).
    if !signed.who.role.may(ops::Action::Change) {
        let views = rollout
            .iter_mut()
            .chain(configs.iter_mut().filter_map(|c| c.rollout.as_mut()))
            .chain(deployments.iter_mut().filter_map(|d| d.rollout.as_mut()));
        for r in views {
            r.can_halt = false;
            r.can_resume = false;
            r.can_advance = false;
        }
    }
    let approvals = s.fleet.approvals();
    let waiting = views::ApprovalView::waiting(
        &approvals.list().await?,
        &signed.who.name,
        signed.who.role.may(ops::Action::Change),
        now_ms(),
    );
    let required = approvals.required().await?;
    Ok(render(
        status,
        &views::RolloutsPage::new(
            Frame::new("Rollouts", &signed.csrf, now),
            rollout,
            configs,
            message,
        )
        .with_approvals(required, waiting)
        .with_windows(windows::WindowView::all(
            &agent_fleet::policy::windows(&s.fleet.db).await?,
            now,
        ))
        .with_releases(&history)
        .with_deployments(deployments),
    ))
}

async fn rollouts(State(page): State<Page>, headers: HeaderMap) -> Result<Response, Trouble> {
    let Some(signed) = signed_in(&page, &headers).await? else {
        return Ok(Redirect::to("/").into_response());
    };
    rollouts_page(&page, &signed, StatusCode::OK, "").await
}

async fn act_bundle(
    State(page): State<Page>,
    Path(step): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    act(page, Target::Bundle, &step, headers, request).await
}

async fn act_deployment(
    State(page): State<Page>,
    Path((name, step)): Path<(String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    act(page, Target::Deployment(name), &step, headers, request).await
}

async fn act_config(
    State(page): State<Page>,
    Path((group, step)): Path<(String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    act(page, Target::Config(group), &step, headers, request).await
}

/// A rollout's button: checked like every POST, then the very action the admin API
/// performs; the rollouts page then shows the new state (or why nothing changed).
async fn act(
    page: Page,
    target: Target,
    step: &str,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    let step = match step {
        "halt" => Step::Halt { reason: None },
        "resume" => Step::Resume,
        "advance" => Step::Advance,
        _ => {
            return Ok(refused(
                StatusCode::NOT_FOUND,
                "no such action: the buttons are Halt, Resume and Advance",
            ));
        }
    };
    let (signed, actor) = match posted_by(&page, &headers, request).await? {
        Ok(v) => v,
        Err(response) => return Ok(response),
    };
    let s = &page.app.inner;
    match actions::perform(s, &actor, Act::Rollout { target, step }).await {
        Ok(_) => Ok(Redirect::to("/rollouts").into_response()),
        Err(ActionError::Refused(Refused::Conflict(why))) => Ok(audited(
            rollouts_page(&page, &signed, StatusCode::CONFLICT, &why).await?,
        )),
        Err(e) => action_failed(e),
    }
}

/// A waiting change's button (Approve, Reject, or Withdraw for the one who asked):
/// checked like every POST, then the decision the admin API takes; the rollouts page
/// then shows what is left waiting (or why nothing changed).
async fn decide(
    State(page): State<Page>,
    Path((id, decision)): Path<(String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    let decision = match decision.as_str() {
        "approve" => agent_fleet::approvals::Decision::Approve,
        "reject" => agent_fleet::approvals::Decision::Reject,
        _ => {
            return Ok(refused(
                StatusCode::NOT_FOUND,
                "no such action: a waiting change's buttons are Approve and Reject",
            ));
        }
    };
    let Ok(id) = id.parse::<i64>() else {
        return Ok(refused(StatusCode::NOT_FOUND, "no such change waits"));
    };
    let (signed, actor) = match posted_by(&page, &headers, request).await? {
        Ok(v) => v,
        Err(response) => return Ok(response),
    };
    let act = Act::Decide {
        id,
        decision,
        reason: None,
    };
    match actions::perform(&page.app.inner, &actor, act).await {
        Ok(_) => Ok(Redirect::to("/rollouts").into_response()),
        Err(ActionError::Refused(Refused::Conflict(why))) => Ok(audited(
            rollouts_page(&page, &signed, StatusCode::CONFLICT, &why).await?,
        )),
        Err(e) => action_failed(e),
    }
}

/// An agent page's button, checked like every POST, then the action the admin API
/// performs: **Remove** (then the fleet list, without it), **Override locks** (the
/// agent's update locks no longer hold off the release the fleet rolls out), **Restart**
/// or **Restart workload** (at its next contact); back to the agent's page, which shows
/// it.
async fn agent_button(
    State(page): State<Page>,
    Path((agent, button)): Path<(String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    let back = format!("/agents/{}", query::encode(&agent));
    let (act, done_at) = match button.as_str() {
        "remove" => (Act::RemoveAgent { agent }, "/agents".to_owned()),
        "override-locks" => (Act::OverrideLocks { agent }, back),
        "restart" => (
            Act::Restart {
                agent,
                workload: false,
            },
            back,
        ),
        "restart-workload" => (
            Act::Restart {
                agent,
                workload: true,
            },
            back,
        ),
        _ => {
            return Ok(refused(
                StatusCode::NOT_FOUND,
                "no such action: an agent's buttons are Remove, Override locks, Restart and Restart workload",
            ));
        }
    };
    let removing = matches!(act, Act::RemoveAgent { .. });
    let (_, actor) = match posted_by(&page, &headers, request).await? {
        Ok(v) => v,
        Err(response) => return Ok(response),
    };
    match actions::perform(&page.app.inner, &actor, act).await {
        Ok(_) => Ok(Redirect::to(&done_at).into_response()),
        // An agent someone else removed first is gone all the same.
        Err(ActionError::Refused(Refused::Unknown(_))) if removing => {
            Ok(Redirect::to(&done_at).into_response())
        }
        Err(e) => action_failed(e),
    }
}

/// A form's POST checked (session, CSRF, origin): who sent it, as the person signed in
/// and as the actor of an operator action; or the refusal to answer.
async fn posted_by(
    page: &Page,
    headers: &HeaderMap,
    request: Request,
) -> Result<Result<(Signed, Actor), Response>, Trouble> {
    let address = server_core::routes::operators::client_address(request.extensions());
    let (host, form) = read_form(request).await;
    let signed = match check_post(page, headers, host.as_deref(), &form).await? {
        Ok(v) => v,
        Err(why) => return Ok(Err(refused(StatusCode::FORBIDDEN, why))),
    };
    let actor = Actor {
        name: signed.who.name.clone(),
        role: signed.who.role,
        address,
        via: Via::Page,
    };
    Ok(Ok((signed, actor)))
}

/// An action refused (and already recorded) or failed, as the page answers it.
fn action_failed(e: ActionError) -> Result<Response, Trouble> {
    match e {
        ActionError::Refused(refused) => Ok(refused_and_audited(
            server_core::error::refused_status(&refused),
            refused.message(),
        )),
        ActionError::Fleet(e) => Err(e.into()),
        ActionError::Failed(detail) => Err(Trouble(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            detail,
        ))),
    }
}

/// `/tokens`: who is signed in and with which role; for an admin, the named tokens
/// (never a token), the form that makes one and a Revoke button each.
async fn tokens(State(page): State<Page>, headers: HeaderMap) -> Result<Response, Trouble> {
    let Some(signed) = signed_in(&page, &headers).await? else {
        return Ok(Redirect::to("/").into_response());
    };
    tokens_page(&page, &signed, StatusCode::OK, "", None).await
}

async fn tokens_page(
    page: &Page,
    signed: &Signed,
    status: StatusCode,
    message: &str,
    made: Option<(&str, String)>,
) -> Result<Response, Trouble> {
    let role = signed.who.role;
    // Only an admin's page reads the tokens at all.
    let listed = if role.may(ops::Action::ManageTokens) {
        page.app.inner.fleet.operators().list().await?
    } else {
        Vec::new()
    };
    let mut view = views::TokensPage::new(
        Frame::new("Tokens", &signed.csrf, now_secs()),
        &signed.who.name,
        role,
        &listed,
        now_ms(),
    )
    .with_message(message);
    if let Some((name, token)) = made {
        view = view.with_new_token(name, token);
    }
    let mut response = render(status, &view);
    if !message.is_empty() {
        // A refusal the audit layer records (unless its action did): in these words.
        response
            .extensions_mut()
            .insert(server_core::routes::refusals::Reason(message.to_owned()));
    }
    // A page that shows a token is never kept by a cache (protect adds no-store too).
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// The Create button of `/tokens`: the admin API's token action; the page then shows
/// the token this once.
async fn create_token(
    State(page): State<Page>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    let address = server_core::routes::operators::client_address(request.extensions());
    let (host, form) = read_form(request).await;
    let signed = match check_post(&page, &headers, host.as_deref(), &form).await? {
        Ok(v) => v,
        Err(why) => return Ok(refused(StatusCode::FORBIDDEN, why)),
    };
    let field = |k: &str| form.get(k).map_or("", |v| v.trim());
    let (name, role, expires) = (field("name"), field("role"), field("expires"));
    let checked = role
        .parse::<Role>()
        .map_err(|e| e.to_string())
        .and_then(|role| {
            let expires_at = if expires.is_empty() {
                None
            } else {
                Some(server_core::routes::operators::expires_at(
                    expires,
                    now_ms(),
                )?)
            };
            Ok((role, expires_at))
        });
    let (role, expires_at) = match checked {
        Ok(v) => v,
        Err(why) => {
            return tokens_page(&page, &signed, StatusCode::BAD_REQUEST, &why, None).await;
        }
    };
    let actor = Actor {
        name: signed.who.name.clone(),
        role: signed.who.role,
        address,
        via: Via::Page,
    };
    let act = Act::TokenCreate {
        name: name.to_owned(),
        role,
        expires_at,
    };
    match actions::perform(&page.app.inner, &actor, act).await {
        Ok(actions::Done::TokenCreated { token }) => {
            tokens_page(&page, &signed, StatusCode::CREATED, "", Some((name, token))).await
        }
        Ok(_) => Err(Trouble(server_core::routes::other_result())),
        Err(ActionError::Refused(r @ (Refused::Invalid(_) | Refused::Conflict(_)))) => Ok(audited(
            tokens_page(
                &page,
                &signed,
                server_core::error::refused_status(&r),
                r.message(),
                None,
            )
            .await?,
        )),
        Err(e) => action_failed(e),
    }
}

/// A token's Revoke button: refused from the next request on, on every server.
async fn revoke_token(
    State(page): State<Page>,
    Path(name): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, Trouble> {
    let (_, actor) = match posted_by(&page, &headers, request).await? {
        Ok(v) => v,
        Err(response) => return Ok(response),
    };
    match actions::perform(&page.app.inner, &actor, Act::TokenRevoke { name }).await {
        // Revoked by someone else first: gone all the same.
        Ok(_) | Err(ActionError::Refused(Refused::Unknown(_))) => {
            Ok(Redirect::to("/tokens").into_response())
        }
        Err(e) => action_failed(e),
    }
}

#[derive(Debug, Default, serde::Deserialize)]
struct AuditQuery {
    who: Option<String>,
    action: Option<String>,
    target: Option<String>,
    page: Option<i64>,
}

/// `/audit`: the audit log, newest first, paged, filterable by who, what and what to.
async fn audit(
    State(page): State<Page>,
    headers: HeaderMap,
    Query(q): Query<AuditQuery>,
) -> Result<Response, Trouble> {
    let Some(Signed { csrf, .. }) = signed_in(&page, &headers).await? else {
        return Ok(Redirect::to("/").into_response());
    };
    let filter = agent_fleet::audit::Filter {
        who: q.who.clone().filter(|w| !w.is_empty()),
        action: q.action.clone().filter(|a| !a.is_empty()),
        target: q.target.clone().filter(|t| !t.is_empty()),
        page: q.page.unwrap_or(1).max(1),
        per_page: views::AUDIT_PER_PAGE,
    };
    let (entries, total) = page.app.inner.fleet.audit().list(&filter).await?;
    let now = now_secs();
    Ok(render(
        StatusCode::OK,
        &views::AuditPage::new(Frame::new("Audit", &csrf, now), &filter, &entries, total),
    ))
}
