//! `GET /admin/maintenance` (role `viewer`): the maintenance windows and their next
//! openings.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use agent_fleet::db::now_ms;
use agent_fleet::operators::Action;

use super::AppState;
use super::operators::Auth;
use crate::error::ApiError;

pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "maintenance.read").await?;
    let now = now_ms().div_euclid(1000);
    Ok(Json(crate::maintenance::listing(
        &s.fleet.rollouts.maintenance(),
        now,
    ))
    .into_response())
}
