//! Who calls the admin API, what their role lets them do, and the record of it:
//! `/admin/tokens` (named tokens with roles) and `/admin/audit` (the audit log).
//!
//! Every admin handler takes an [`Auth`] (the bearer token resolved to an operator, and
//! the client's address) and asks it for the [`Action`] it performs; a refusal is
//! answered `401`/`403` and, for anything but a read, written to the audit log. A change
//! that is made is recorded by the handler with [`Caller::record`], with its details.
//! Tokens are never logged, recorded or echoed: only their names are.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::audit::{Change, Filter, Outcome};
use agent_fleet::operators::{Action, BOOTSTRAP, Operator, Role};

use super::{AppState, Shared, json_body};
use crate::actions::{self, Act, Actor, Done, Via};
use crate::error::ApiError;
use crate::transport::conn::ClientAddr;

/// The name refused calls without a valid token are recorded under.
pub const NOBODY: &str = "-";

/// The admin API is off: no `admin.token` and no named token.
const API_OFF: &str =
    "the admin API is off: set admin.token (or UPDATE_SERVER_ADMIN_TOKEN) to turn it on";

/// A request's credentials, resolved; refusals are decided by [`Auth::require`].
pub struct Auth {
    who: Result<Operator, ApiError>,
    address: String,
}

/// An operator allowed to do what they asked.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    pub address: String,
}

/// The address a request came from, for the audit log (empty when unknown).
pub fn client_address(extensions: &axum::http::Extensions) -> String {
    extensions
        .get::<ClientAddr>()
        .map(|a| a.0.to_string())
        .unwrap_or_default()
}

/// The address a request came from, as an extractor (empty when unknown).
#[derive(Debug)]
pub struct ConnAddress(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ConnAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ConnAddress(client_address(&parts.extensions)))
    }
}

fn bearer(parts: &Parts) -> Option<&str> {
    bearer_of(&parts.headers)
}

/// The bearer token of a request, if it sends one.
pub fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty())
}

/// The operator `token` stands for: the bootstrap admin, a named token, or why none.
pub async fn identify(s: &Shared, token: Option<&str>) -> Result<Operator, ApiError> {
    let unauthorized = || ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    let Some(token) = token else {
        if s.admin_token.is_empty() && !s.fleet.operators().any().await? {
            return Err(ApiError::new(StatusCode::FORBIDDEN, API_OFF));
        }
        return Err(unauthorized());
    };
    if !s.admin_token.is_empty() && agent_fleet::credentials::same(token, &s.admin_token) {
        return Ok(Operator {
            name: BOOTSTRAP.to_owned(),
            role: Role::Admin,
        });
    }
    match s.fleet.operators().authenticate(token).await? {
        Some(op) => Ok(op),
        None if s.admin_token.is_empty() && !s.fleet.operators().any().await? => {
            Err(ApiError::new(StatusCode::FORBIDDEN, API_OFF))
        }
        None => Err(unauthorized()),
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let address = client_address(&parts.extensions);
        let who = identify(&state.inner, bearer(parts)).await;
        Ok(Auth { who, address })
    }
}

impl Auth {
    /// Who asks, for an operator action ([`crate::actions::perform`] decides whether
    /// their role may); `what` names the action in the audit log when the request
    /// carries no valid token.
    pub async fn actor(self, s: &Shared, what: &str) -> Result<Actor, ApiError> {
        match self.who {
            Ok(op) => Ok(Actor {
                name: op.name,
                role: op.role,
                address: self.address,
                via: Via::Api,
            }),
            Err(e) => Err(refuse_unknown(s, &self.address, what, e).await),
        }
    }

    /// The caller, if their role may do `action`; `what` names it in the audit log
    /// when it is refused (reads are not recorded).
    pub async fn require(self, s: &Shared, action: Action, what: &str) -> Result<Caller, ApiError> {
        let refusal = match self.who {
            Ok(op) if op.role.may(action) => {
                return Ok(Caller {
                    name: op.name,
                    role: op.role,
                    address: self.address,
                });
            }
            Ok(op) => {
                let e = ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "the token {:?} has the role {} and may not do this ({what}); ask someone with the role {}",
                        op.name,
                        op.role,
                        needed(action)
                    ),
                );
                (op.name, e)
            }
            Err(e) => (NOBODY.to_owned(), e),
        };
        let (who, mut e) = refusal;
        if action != Action::Read && e.status != StatusCode::SERVICE_UNAVAILABLE {
            e = e.audited();
            record(
                s,
                Change {
                    who: &who,
                    address: &self.address,
                    action: what,
                    outcome: Outcome::Refused,
                    details: serde_json::json!({ "status": e.status.as_u16() }),
                },
            )
            .await;
        }
        Err(e)
    }
}

/// A request without a valid token, refused and recorded (a database that is away
/// answers `503` and records nothing).
async fn refuse_unknown(s: &Shared, address: &str, what: &str, e: ApiError) -> ApiError {
    if e.status == StatusCode::SERVICE_UNAVAILABLE {
        return e;
    }
    let e = e.audited();
    record(
        s,
        Change {
            who: NOBODY,
            address,
            action: what,
            outcome: Outcome::Refused,
            details: serde_json::json!({ "status": e.status.as_u16() }),
        },
    )
    .await;
    e
}

fn needed(action: Action) -> Role {
    Role::ALL
        .into_iter()
        .find(|r| r.may(action))
        .unwrap_or(Role::Admin)
}

impl Caller {
    /// The caller as the actor of an operator action ([`crate::actions::perform`]).
    pub fn actor(&self) -> Actor {
        Actor {
            name: self.name.clone(),
            role: self.role,
            address: self.address.clone(),
            via: Via::Api,
        }
    }

    /// Records a change this caller made.
    pub async fn record(&self, s: &Shared, action: &str, details: serde_json::Value) {
        record(
            s,
            Change {
                who: &self.name,
                address: &self.address,
                action,
                outcome: Outcome::Done,
                details,
            },
        )
        .await;
    }

    /// Records a change this caller may make but that was refused as it stood (a
    /// configuration set that would empty the agents' files), with the reason.
    pub async fn refused(&self, s: &Shared, action: &str, details: serde_json::Value) {
        record(
            s,
            Change {
                who: &self.name,
                address: &self.address,
                action,
                outcome: Outcome::Refused,
                details,
            },
        )
        .await;
    }
}

/// Appends to the audit log ([`crate::actions::audit`]).
pub async fn record(s: &Shared, change: Change<'_>) {
    crate::actions::audit(s, &change).await;
}

/// `GET /admin/tokens`: names, roles, when created and last used; never a token.
pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::ManageTokens, "token.list").await?;
    Ok(Json(s.fleet.operators().list().await?).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewToken {
    name: String,
    role: String,
    /// How long it opens anything (`"90d"`, `"12h"`, or seconds); none: until revoked.
    #[serde(default)]
    expires: Option<serde_json::Value>,
}

/// When a token made now with `expires` (`"90d"`, or seconds) lapses, in unix ms.
pub fn expires_at(expires: &str, now_ms: i64) -> Result<i64, String> {
    let secs = agent_protocol::settings::parse_seconds(expires).map_err(|e| {
        format!(
            "expires: {e}; write {}",
            agent_protocol::settings::SECONDS_FORMS
        )
    })?;
    if secs == 0 {
        return Err(
            "expires: 0 would make a token that never opens anything; give 90d, 12h, …".into(),
        );
    }
    let ms = i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    Ok(now_ms.saturating_add(ms))
}

/// `POST /admin/tokens` `{"name", "role", "expires"?}`: the token, shown this once.
pub(super) async fn create(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<NewToken>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let new = json_body(body)?;
    let role: Role = new.role.parse()?;
    let expires_at = match &new.expires {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(text)) => {
            Some(expires_at(text, agent_fleet::db::now_ms()).map_err(ApiError::bad_request)?)
        }
        Some(serde_json::Value::Number(n)) => Some(
            expires_at(&n.to_string(), agent_fleet::db::now_ms()).map_err(ApiError::bad_request)?,
        ),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "expires: {other} is not a duration; write \"90d\", \"12h\" or seconds"
            )));
        }
    };
    let act = Act::TokenCreate {
        name: new.name.clone(),
        role,
        expires_at,
    };
    let actor = auth.actor(s, act.name()).await?;
    let Done::TokenCreated { token } = actions::perform(s, &actor, act).await? else {
        return Err(super::other_result());
    };
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({
            "name": new.name,
            "role": role.as_str(),
            "token": token,
            "expires_at": expires_at,
        })),
    )
        .into_response())
}

/// `DELETE /admin/tokens/{name}`: refused from the next request on, on every server.
pub(super) async fn revoke(
    State(state): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let act = Act::TokenRevoke { name: name.clone() };
    let actor = auth.actor(s, act.name()).await?;
    actions::perform(s, &actor, act).await?;
    Ok(Json(serde_json::json!({ "name": name, "revoked": true })).into_response())
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct AuditQuery {
    who: Option<String>,
    action: Option<String>,
    target: Option<String>,
    page: Option<i64>,
    per_page: Option<i64>,
}

/// `GET /admin/audit?who=&action=&target=&page=&per_page=`: newest first.
pub(super) async fn audit(
    State(state): State<AppState>,
    auth: Auth,
    Query(q): Query<AuditQuery>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "audit.read").await?;
    let filter = Filter {
        who: q.who.filter(|w| !w.is_empty()),
        action: q.action.filter(|a| !a.is_empty()),
        target: q.target.filter(|t| !t.is_empty()),
        page: q.page.unwrap_or(1).max(1),
        per_page: q.per_page.unwrap_or(100),
    };
    let (entries, total) = s.fleet.audit().list(&filter).await?;
    Ok(Json(serde_json::json!({
        "entries": entries,
        "total": total,
        "page": filter.page,
    }))
    .into_response())
}
