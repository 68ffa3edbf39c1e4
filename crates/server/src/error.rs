use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    Io(String),
}

/// An answer that is not a success. 4xx carry their message; 5xx log the detail and
/// answer a generic message.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
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

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if crate::outage::is_unavailable(&e) {
            tracing::warn!("the fleet database is unreachable: {e}");
            return Self::unavailable(
                "the fleet database is unreachable; try again shortly",
                DATABASE_RETRY_AFTER,
            );
        }
        tracing::error!("database error: {e}");
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
        response
    }
}
