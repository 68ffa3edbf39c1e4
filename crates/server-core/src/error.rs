use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use agent_fleet::FleetError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("configuration: {0}")]
    Config(String),
    /// The fleet model's (its database's) own error, in its own words.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error("{0}")]
    Io(String),
    /// The release model's.
    #[error(transparent)]
    Release(#[from] agent_releases::ReleaseError),
}

/// A certificate that cannot serve is a configuration error, as it always said.
impl From<server_transport::TlsError> for ServerError {
    fn from(e: server_transport::TlsError) -> Self {
        Self::Config(e.0)
    }
}

/// On an answer whose refusal its handler already recorded (the refusals layer,
/// `routes::refusals`, records the others).
#[derive(Debug, Clone, Copy)]
pub struct Audited;

/// An answer that is not a success. 4xx carry their message; 5xx log the detail and
/// answer a generic message.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// The refusal is in the audit log already (see [`crate::routes::refusals`]).
    pub audited: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
            audited: false,
        }
    }

    /// Marks a refusal its handler recorded in the audit log.
    #[must_use]
    pub fn audited(mut self) -> Self {
        self.audited = true;
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// `503` with `Retry-After`: nothing is wrong with the request; try again later.
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }
}

/// Seconds a client is asked to wait when the fleet database is away.
const DATABASE_RETRY_AFTER: u64 = 5;

/// The fleet database away is `503` with `Retry-After`; any other fault of the model is
/// the server's (`500`, detail in the log).
/// How the API and the page answer an operator action's refusal.
pub fn refused_status(refused: &crate::actions::Refused) -> StatusCode {
    use crate::actions::Refused;
    match refused {
        Refused::NotAllowed(_) => StatusCode::FORBIDDEN,
        Refused::Unknown(_) => StatusCode::NOT_FOUND,
        Refused::Conflict(_) => StatusCode::CONFLICT,
        Refused::Invalid(_) => StatusCode::BAD_REQUEST,
    }
}

impl From<crate::actions::ActionError> for ApiError {
    fn from(e: crate::actions::ActionError) -> Self {
        use crate::actions::ActionError;
        match e {
            // Recorded in the audit log by the action itself.
            ActionError::Refused(refused) => {
                Self::new(refused_status(&refused), refused.message()).audited()
            }
            ActionError::Fleet(e) => e.into(),
            ActionError::Failed(detail) => {
                tracing::error!("{detail}");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, detail)
            }
        }
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        match e {
            FleetError::Invalid(message) => return Self::bad_request(message),
            FleetError::Conflict(message) => return Self::new(StatusCode::CONFLICT, message),
            FleetError::NotFound(message) => return Self::new(StatusCode::NOT_FOUND, message),
            _ => {}
        }
        if e.is_unavailable() {
            tracing::warn!("the fleet database is unreachable: {e}");
            return Self::unavailable(
                "the fleet database is unreachable; try again shortly",
                DATABASE_RETRY_AFTER,
            );
        }
        tracing::error!("fleet model: {e}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // 503s say what is unavailable; other 5xx log their detail and say no more.
        let message = if self.status.is_server_error() && self.retry_after.is_none() {
            "internal error; see the server log".to_owned()
        } else {
            self.message
        };
        let mut response =
            (self.status, Json(serde_json::json!({ "error": message }))).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        if self.audited {
            response.extensions_mut().insert(Audited);
        }
        response
    }
}
