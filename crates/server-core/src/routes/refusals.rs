//! Every refused operator action lands in the audit log, whoever refused it: a handler
//! (it records the refusal itself and marks the answer [`Audited`]), or a layer before
//! any handler runs (a body over the limit, a cut or malformed upload, a request that
//! took too long, a page form without its CSRF token). This layer records the rest, with
//! who (when the request names an operator), from where and why.

use agent_fleet::audit::{Change, Outcome};
use agent_protocol::shown::shown;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::operators::{self, client_address};
use crate::state::AppState;

// Set by `ApiError` itself, which is below the routes.
pub use crate::error::Audited;

/// On a refusal whose body is not the API's JSON (the page's HTML): why, in words.
#[derive(Debug, Clone)]
pub struct Reason(pub String);

/// The longest reason kept in an audit entry (the answer itself is not cut here).
const REASON_CHARS: usize = 300;

/// The largest refusal body read back for its reason.
const BODY_READ: usize = 64 * 1024;

/// Whether a request is an operator's action (API or page), not an agent's call or a
/// read.
fn is_operator_action(method: &Method, path: &str) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    !(path.starts_with("/agentupdate/") || path.starts_with("/agent/") || path.starts_with("/v1/"))
}

/// The layer: passes the request on and records the answer if it is an unrecorded
/// refusal of an operator's action.
pub async fn audit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    if !is_operator_action(&method, &path) {
        return next.run(request).await;
    }
    let address = client_address(request.extensions());
    let bearer = operators::bearer_of(request.headers()).map(str::to_owned);
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE)
        || response.extensions().get::<Audited>().is_some()
    {
        return response;
    }
    let (response, why) = reason_of(response).await;
    let who = match bearer {
        Some(token) => operators::identify(&state.inner, Some(&token))
            .await
            .map_or_else(|_| operators::NOBODY.to_owned(), |op| op.name),
        None => operators::NOBODY.to_owned(),
    };
    let action = format!("{method} {}", shown(&path, 200));
    operators::record(
        &state.inner,
        Change {
            who: &who,
            address: &address,
            action: &action,
            outcome: Outcome::Refused,
            details: serde_json::json!({ "status": status.as_u16(), "reason": shown(&why, REASON_CHARS) }),
        },
    )
    .await;
    response
}

/// The refusal's reason ([`Reason`], or the JSON body's `error`, or its text), and the
/// response as it was.
async fn reason_of(response: Response) -> (Response, String) {
    if let Some(Reason(why)) = response.extensions().get::<Reason>() {
        let why = why.clone();
        return (response, why);
    }
    // A body too large to read back is passed on untouched, its status the reason.
    let fits = http_body::Body::size_hint(response.body())
        .upper()
        .is_some_and(|n| n <= BODY_READ as u64);
    if !fits {
        let why = response
            .status()
            .canonical_reason()
            .unwrap_or("refused")
            .to_owned();
        return (response, why);
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_READ)
        .await
        .unwrap_or_default();
    let why = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let why = if why.trim().is_empty() {
        parts
            .status
            .canonical_reason()
            .unwrap_or("refused")
            .to_owned()
    } else {
        why
    };
    (Response::from_parts(parts, Body::from(bytes)), why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_actions_are_the_posts_that_are_not_an_agents() {
        assert!(is_operator_action(&Method::POST, "/admin/releases"));
        assert!(is_operator_action(&Method::DELETE, "/admin/agents/a/token"));
        assert!(is_operator_action(&Method::POST, "/agents/a/remove"));
        assert!(!is_operator_action(&Method::GET, "/admin/agents"));
        assert!(!is_operator_action(&Method::POST, "/agentupdate/report"));
        assert!(!is_operator_action(&Method::POST, "/agent/config-status"));
        assert!(!is_operator_action(&Method::POST, "/v1/opamp"));
    }
}
