//! OpAMP's plain HTTP transport: one `AgentToServer` per `POST`, one `ServerToAgent`
//! back at once (the server cannot push; what it has waits for the next poll, and an
//! answer is never held: the Python client gives up after 1 s).

use agent_opamp::codec::{self, ContentEncoding};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{MAX_MESSAGE, RETRY_AFTER, Refused, authorized, exchange};
use server_core::error::ApiError;
use server_core::state::AppState;

/// Bytes read off the socket at most: the message limit plus room for gzip's framing
/// of incompressible data.
pub const MAX_WIRE_BODY: usize = MAX_MESSAGE + MAX_MESSAGE / 16 + 1024;

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the OpAMP message is larger than {MAX_MESSAGE} bytes once decompressed; send a smaller one"
        ),
    )
}

/// `POST /v1/opamp`.
pub async fn post(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    if !authorized(s, header_text(&headers, header::AUTHORIZATION)) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "OpAMP requests need Authorization: Bearer <agents.enrollment-token>",
        ));
    }
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
        Err(e) => return Err(ApiError::new(e.status(), e.body_text())),
    };
    let encoding = ContentEncoding::from_header(header_text(&headers, header::CONTENT_ENCODING))
        .map_err(|e| ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, e.to_string()))?;
    let msg = codec::decode_http_body(&body, encoding, MAX_MESSAGE).map_err(|e| {
        if e.is_too_large() {
            too_large()
        } else {
            ApiError::bad_request(e.to_string())
        }
    })?;
    let gzip = codec::accepts_gzip(header_text(&headers, header::ACCEPT_ENCODING));
    let authorization = header_text(&headers, header::AUTHORIZATION);
    let (status, answer) = match exchange(s, &msg, true, false, authorization).await {
        Ok(done) => (StatusCode::OK, done.answer),
        Err(Refused::BadRequest(answer, why)) => {
            tracing::info!("OpAMP: refused a message: {why}");
            (StatusCode::BAD_REQUEST, *answer)
        }
        Err(Refused::Unauthorized(why)) => {
            return Err(ApiError::new(StatusCode::UNAUTHORIZED, why));
        }
        Err(Refused::Unavailable) => {
            return Err(ApiError::unavailable(
                "the fleet database is unreachable; try again shortly",
                RETRY_AFTER,
            ));
        }
        Err(Refused::Internal) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error",
            ));
        }
    };
    let bytes = codec::encode_http_body(&answer, gzip).map_err(|e| {
        tracing::error!("OpAMP: {e}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    })?;
    let mut response = (status, Body::from(bytes)).into_response();
    let h = response.headers_mut();
    // Exactly this, no parameters: the Node client compares the string.
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec::CONTENT_TYPE),
    );
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    Ok(response)
}
