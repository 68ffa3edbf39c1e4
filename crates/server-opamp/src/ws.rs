//! OpAMP over WebSocket on the same path: each binary message one `AgentToServer`
//! (the one-byte `0x00` header, or none), each answered at once; news for the agent (its
//! wave opened, its group's set pushed) is pushed at once. Messages over the
//! limit close the socket with `1009`, throttling answers `UNAVAILABLE` with
//! `RetryInfo` and closes, the server pings every [`PING_INTERVAL`] and closes a
//! socket silent for three of them, and a socket that says nothing within
//! `server.header-timeout` of opening is closed (a thousand idle sockets hold nothing
//! for long). The socket counts as a busy connection while it lives (no idle timeout,
//! never evicted for room), within `server.max-connections`.

use std::time::Duration;

use agent_fleet::db::now_ms;
use agent_opamp::answer;
use agent_opamp::codec;
use agent_opamp::uid::InstanceUid;
use axum::Extension;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::{MAX_MESSAGE, Refused, authorized, exchange, push, retry_after};
use server_core::error::ApiError;
use server_core::state::{AppState, Shared};
use server_core::transport::conn::ConnHold;

/// How often the server pings an OpAMP socket.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// Bytes read off a socket at a time (larger messages are still assembled whole, up to
/// the limit).
const READ_BUFFER: usize = 4 * 1024;

/// Close codes (RFC 6455 §7.4.1).
const NORMAL: u16 = 1000;
const GOING_AWAY: u16 = 1001;
const PROTOCOL_ERROR: u16 = 1002;
const UNSUPPORTED: u16 = 1003;
const POLICY: u16 = 1008;
const TOO_BIG: u16 = 1009;
const INTERNAL: u16 = 1011;
const TRY_AGAIN_LATER: u16 = 1013;

/// `GET /v1/opamp` with `Upgrade: websocket`.
pub async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    hold: Option<Extension<ConnHold>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !authorized(&state.inner, auth.as_deref()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "OpAMP connections need Authorization: Bearer <agents.enrollment-token>",
        )
        .into_response();
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return e.into_response(),
    };
    // The library refuses (and we close 1009) before buffering more than this.
    ws.max_message_size(MAX_MESSAGE + 1)
        .max_frame_size(MAX_MESSAGE + 1)
        // Its default buffers (128 KiB each way, per socket) were 1.5 GiB at 10,000
        // sockets; status messages are a few hundred bytes, and every answer is flushed
        // as it is sent. A client that stops reading can hold at most two answers.
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(0)
        .max_write_buffer_size(2 * MAX_MESSAGE)
        .on_upgrade(move |socket| async move {
            let _held = hold.map(|Extension(h)| h.hold());
            serve(&state.inner, socket, auth.as_deref()).await;
        })
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn is_too_long(e: &axum::Error) -> bool {
    let text = e.to_string();
    text.contains("too long") || text.contains("limit exceeded") || text.contains("too big")
}

/// `authorization`: the upgrade's header, which speaks for every message of the socket.
async fn serve(s: &Shared, mut socket: WebSocket, authorization: Option<&str>) {
    let opened = Instant::now();
    let mut uid: Option<InstanceUid> = None;
    let mut said_goodbye = false;
    let mut last_heard = Instant::now();
    // When an exchange last stored the agent (and with it its contact time).
    let mut last_saved: Option<Instant> = None;
    let mut ping = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
    let mut closing = s.fleet.rollouts.news().closing();
    // News (a wave opened, a set pushed) is pushed at once, not at the next message.
    let mut news = s.fleet.rollouts.news().subscribe();
    let mut sent_uid: Vec<u8> = Vec::new();
    // What the last exchange stored of the agent: news is answered from it.
    let mut view: Option<agent_opamp::view::AgentView> = None;
    let first_deadline = opened + s.request_timeout;
    loop {
        let message = tokio::select! {
            m = socket.recv() => m,
            _ = ping.tick() => {
                if last_heard.elapsed() >= 3 * PING_INTERVAL {
                    let _ = socket.send(close(GOING_AWAY, "silent for three pings")).await;
                    break;
                }
                // An agent that sent a message since the last ping was stored then; only a
                // quiet one needs its contact time written (a heartbeating fleet would
                // otherwise write twice per agent per interval).
                if let Some(u) = &uid
                    && last_saved.is_none_or(|t| t.elapsed() >= PING_INTERVAL)
                    && !s.fleet.outage.is_down()
                    && let Err(e) = s.fleet.db.opamp_seen(&u.to_string(), now_ms()).await
                    && e.is_unavailable()
                {
                    s.fleet.outage.went_down(&e);
                }
                if socket.send(Message::Ping(Default::default())).await.is_err() {
                    break;
                }
                continue;
            }
            changed = news.changed(), if uid.is_some() => {
                if changed.is_err() {
                    continue;
                }
                if let (Some(u), Some(v)) = (uid, view.as_mut())
                    && let Some(answer) = push(s, u, &sent_uid, v).await
                    && socket
                        .send(Message::Binary(codec::encode_ws_message(&answer).into()))
                        .await
                        .is_err()
                {
                    break;
                }
                continue;
            }
            () = tokio::time::sleep_until(first_deadline), if uid.is_none() => {
                let _ = socket.send(close(POLICY, "no OpAMP message within server.header-timeout")).await;
                break;
            }
            () = async { drop(closing.wait_for(|c| *c).await) } => {
                let _ = socket.send(close(GOING_AWAY, "the server is stopping")).await;
                break;
            }
        };
        let bytes = match message {
            None => break,
            Some(Err(e)) => {
                if is_too_long(&e) {
                    let _ = socket
                        .send(close(TOO_BIG, "message over the size limit"))
                        .await;
                } else {
                    tracing::debug!("OpAMP socket: {e}");
                }
                break;
            }
            Some(Ok(Message::Binary(bytes))) => bytes,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                last_heard = Instant::now();
                continue;
            }
            Some(Ok(Message::Text(_))) => {
                let _ = socket
                    .send(close(UNSUPPORTED, "OpAMP messages are binary"))
                    .await;
                break;
            }
            Some(Ok(Message::Close(_))) => break,
        };
        last_heard = Instant::now();
        let msg = match codec::decode_ws_message(&bytes, MAX_MESSAGE) {
            Ok(m) => m,
            Err(e) if e.is_too_large() => {
                let _ = socket
                    .send(close(TOO_BIG, "message over the size limit"))
                    .await;
                break;
            }
            Err(e) => {
                tracing::info!("OpAMP socket: {e}");
                let _ = socket
                    .send(close(PROTOCOL_ERROR, "not an AgentToServer message"))
                    .await;
                break;
            }
        };
        let in_use = InstanceUid::from_wire(&msg.instance_uid)
            .is_ok_and(|(u, _)| s.opamp_sockets.held_elsewhere(&u, uid.as_ref()));
        let answer = match exchange(s, &msg, uid.is_none(), in_use, authorization).await {
            Ok(done) => {
                if !done.duplicate && uid != Some(done.uid) {
                    if let Some(old) = uid.take() {
                        s.opamp_sockets.remove(&old);
                    }
                    s.opamp_sockets.add(done.uid);
                    uid = Some(done.uid);
                }
                if !done.duplicate {
                    last_saved = Some(Instant::now());
                    sent_uid.clone_from(&msg.instance_uid);
                    view = Some(done.view);
                }
                said_goodbye = done.disconnected;
                done.answer
            }
            Err(Refused::BadRequest(answer, why)) => {
                tracing::info!("OpAMP socket: refused a message: {why}");
                *answer
            }
            Err(Refused::Unavailable) => {
                let answer = answer::unavailable(
                    &msg.instance_uid,
                    "the fleet database is unreachable; try again shortly",
                    retry_after(),
                );
                let _ = socket
                    .send(Message::Binary(codec::encode_ws_message(&answer).into()))
                    .await;
                let _ = socket
                    .send(close(TRY_AGAIN_LATER, "try again after RetryInfo"))
                    .await;
                break;
            }
            Err(Refused::Internal) => {
                let _ = socket.send(close(INTERNAL, "internal error")).await;
                break;
            }
            Err(Refused::Unauthorized(why)) => {
                tracing::info!("OpAMP socket: {why}");
                let _ = socket.send(close(POLICY, why)).await;
                break;
            }
        };
        if socket
            .send(Message::Binary(codec::encode_ws_message(&answer).into()))
            .await
            .is_err()
        {
            break;
        }
        if said_goodbye {
            let _ = socket.send(close(NORMAL, "goodbye")).await;
            break;
        }
    }
    if let Some(u) = uid
        && s.opamp_sockets.remove(&u)
        && !said_goodbye
        && !s.fleet.outage.is_down()
        && let Err(e) = s.fleet.db.opamp_offline(&u.to_string()).await
    {
        tracing::debug!("OpAMP socket: marking {u} offline: {e}");
    }
}
