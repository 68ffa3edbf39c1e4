//! The HTTP interface (docs/reference/admin-api.md), as an axum `Router` that tests
//! drive without a socket.
//! By area: [`download`] (version, bundle, signature, the Windows MSI), [`delta`] (deltas between bundles), [`agents`] (register, connect,
//! report: the version directive, and the configuration set to run), [`config`]
//! (configuration sets, `/agent/config-status`) and [`admin`] (settings, agents,
//! rollout, metrics).

mod admin;
mod agents;
pub(crate) mod approvals;
mod config;
mod delta;
mod deployments;
mod download;
mod install;
mod maintenance;
pub mod opamp_fields;
pub mod operators;
pub mod refusals;
pub(crate) mod releases;
mod telemetry;
mod webhooks;

use std::sync::Arc;

use agent_protocol::wire;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use tower_http::timeout::TimeoutLayer;

use crate::error::ApiError;
use crate::state::{AppState, Shared};
use crate::store::{Current, Release};

/// How long a release upload may take, its bytes included.
const UPLOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// How long a report or configuration status waits for the database before it is
/// answered `queued` (and written meanwhile): well within an agent's request clock.
pub const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest JSON body accepted; larger ones get `413`.
pub const MAX_BODY: usize = 64 * 1024;

/// The native routes (with their timeouts); `update_server::app` adds OpAMP's and the body
/// limit, and gives them the state.
pub fn router(state: &AppState) -> Router<AppState> {
    // A request with a body (or that waits on the database) is done within this, or
    // answered 408: a client trickling a body cannot hold its connection for ever.
    // Downloads are not bounded here; their clock is the stall timeout.
    let request_timeout =
        TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, state.inner.request_timeout);
    // A connect may be held for agents.max-wait (a long poll) before its own clock runs.
    let held = Router::new().route(
        wire::CONNECT_PATH,
        post(agents::connect).route_layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            state.inner.request_timeout + state.inner.max_wait,
        )),
    );
    let downloads = Router::new()
        .route(wire::VERSION_PATH, get(download::version))
        .route(
            wire::DOWNLOAD_PATH,
            get(download::download).head(download::download),
        )
        .route(wire::SIGNATURE_PATH, get(download::signature))
        .route(wire::MSI_PATH, get(download::msi).head(download::msi))
        .route(wire::MSI_SIGNATURE_PATH, get(download::msi_signature))
        .route(wire::DELTA_PATH, get(delta::delta).head(delta::delta))
        .route(install::SCRIPT_PATH, get(install::script))
        .route(install::CHECK_PATH, get(install::check_enrollment))
        .route(install::BUNDLES_PATH, get(install::bundles));
    // A release's bundles take longer to send than a request's clock allows.
    let uploads = Router::new().route(
        "/admin/releases",
        post(releases::publish)
            .layer(DefaultBodyLimit::max(releases::MAX_RELEASE_BODY))
            .route_layer(TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                UPLOAD_TIMEOUT,
            )),
    );
    Router::new()
        .route(wire::REGISTER_PATH, post(agents::register))
        .route(wire::REPORT_PATH, post(agents::report))
        .route(wire::CONFIG_STATUS_PATH, post(config::status))
        .route("/admin/config", get(config::list))
        .route(
            "/admin/config/{group}",
            axum::routing::put(config::put)
                .layer(DefaultBodyLimit::max(config::MAX_CONFIG_BODY))
                .delete(config::delete),
        )
        .route("/admin/config/{group}/{action}", post(config::steer))
        .route(
            "/admin/settings",
            get(admin::settings)
                .put(admin::update_settings)
                .patch(admin::update_settings),
        )
        .route("/admin/agents", get(admin::agents))
        .route(
            "/admin/agents/{id}",
            axum::routing::delete(admin::remove_agent),
        )
        .route(wire::LEAVE_PATH, post(agents::leave))
        .route(
            "/admin/agents/{id}/override-locks",
            post(admin::override_locks),
        )
        .route("/admin/agents/{id}/labels", post(admin::set_labels))
        .route("/admin/agents/{id}/restart", post(admin::restart_agent))
        .route(
            "/admin/agents/{id}/rotate-credentials",
            post(admin::rotate_credentials),
        )
        .route("/admin/agents/{id}/move", post(admin::move_agent))
        .route(wire::COMMAND_STATUS_PATH, post(agents::command_status))
        .route(
            "/admin/agents/{id}/token",
            axum::routing::delete(admin::forget_token),
        )
        .route(
            "/admin/tokens",
            get(operators::list).post(operators::create),
        )
        .route(
            "/admin/tokens/{name}",
            axum::routing::delete(operators::revoke),
        )
        .route("/admin/audit", get(operators::audit))
        .route("/admin/audit/export", get(webhooks::export))
        .route("/admin/webhooks", get(webhooks::list).post(webhooks::add))
        .route(
            "/admin/webhooks/{id}",
            axum::routing::delete(webhooks::remove),
        )
        .route("/admin/webhooks/{id}/test", post(webhooks::test))
        .route("/admin/webhooks/{id}/deliveries", get(webhooks::deliveries))
        .route("/admin/approvals", get(approvals::list))
        .route("/admin/approvals/{id}", get(approvals::show))
        .route("/admin/approvals/{id}/{decision}", post(approvals::decide))
        .route("/admin/approval", axum::routing::put(approvals::require))
        .route("/admin/releases", get(releases::list))
        .route("/admin/releases/rollback", post(releases::rollback))
        .route("/admin/releases/{id}/files/{name}", get(releases::file))
        .route("/admin/rollout", get(admin::rollout))
        .route(
            "/admin/deployments",
            get(deployments::list).post(deployments::create),
        )
        .route(
            "/admin/deployments/{name}",
            get(deployments::show)
                .patch(deployments::set)
                .delete(deployments::remove),
        )
        .route("/admin/deployments/{name}/{step}", post(deployments::step))
        .route(
            "/admin/maintenance",
            get(maintenance::list).post(maintenance::add),
        )
        .route("/admin/maintenance/{id}", delete(maintenance::remove))
        .route(
            "/admin/telemetry",
            get(telemetry::list)
                .post(telemetry::set)
                .delete(telemetry::clear),
        )
        .route("/admin/rollout/halt", post(admin::rollout_halt))
        .route("/admin/rollout/resume", post(admin::rollout_resume))
        .route("/admin/rollout/advance", post(admin::rollout_advance))
        .route("/metrics", get(admin::metrics))
        .route("/healthz", get(admin::healthz))
        .route_layer(request_timeout)
        .merge(held)
        .merge(downloads)
        .merge(uploads)
}

/// A change parked for another operator's approval, as every route answers it: `202`
/// and the approval (`"state": "awaiting-approval"`, its id, what it would do).
fn parked(approval: &agent_fleet::approvals::Approval) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(approval.to_json(agent_fleet::db::now_ms())),
    )
        .into_response()
}

/// An action answered with another action's result: a bug, said as one.
pub fn other_result() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the server answered an action with another's result; please report this",
    )
}

fn unavailable(problem: &str, retry_after: u64) -> Response {
    let mut r = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, problem).into_response();
    // The generic 5xx text would hide what the operator must fix; this one is safe to show.
    *r.body_mut() = Body::from(serde_json::json!({ "error": problem }).to_string());
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    r
}

/// The release to serve, or the `503` that says why there is none.
fn ready(state: &Shared) -> Result<Arc<Release>, Box<Response>> {
    match state.store.current() {
        Current::Ready(b) => Ok(b),
        Current::Unavailable(problem) => {
            Err(Box::new(unavailable(&problem.public, state.retry_after)))
        }
    }
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    match body {
        Ok(Json(v)) => Ok(v),
        Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::new(
                e.status(),
                format!(
                    "the body is over this server's limit of {MAX_BODY} bytes for a JSON request; send less"
                ),
            ))
        }
        Err(JsonRejection::BytesRejection(e)) => Err(ApiError::new(
            e.status(),
            format!("body refused: {}", e.body_text()),
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "malformed JSON body: {}",
            e.body_text()
        ))),
    }
}
