//! Agents' API requests served beside hyper, so that a held connect costs its server a
//! few hundred bytes instead of a connection's worth of buffers.
//!
//! A plain HTTP/1.1 connection's requests are read here while they are `POST /agent/…`
//! (register, connect, reports: small JSON both ways) with a small body. Each is parsed
//! into an owned request, with no read or write buffer kept while the router holds it (a
//! held connect waits there for up to a minute), and its answer is written here. From
//! the first request that is anything else (a download, the page, a chunked body,
//! `Expect`, HTTP/2's preface, a head this parser does not take) the connection is
//! hyper's, with the bytes already read put back in front, so hyper answers it exactly as
//! it would have. The router, its middleware and the connection's clocks are the same
//! either way: this module only moves bytes.
//!
//! What it must not do: answer anything itself. A head it cannot take whole is hyper's.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, Version, header, response};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The requests served here: the agents' own API, where connects are held.
const AGENT_API: &[u8] = b"POST /agent/";
/// A connect's body is a hello and a hash, a report's a few lines; anything larger is
/// hyper's to judge.
const MAX_BODY: usize = 64 * 1024;
/// Headers an agent sends; a request with more is hyper's.
const MAX_HEADERS: usize = 32;

/// What a connection's next bytes turned out to be.
#[derive(Debug)]
pub enum Next {
    /// An agent's request, whole: the request, and whether the client asked to close
    /// after it.
    Agent {
        request: Box<Request<Body>>,
        close: bool,
    },
    /// Something for hyper; the bytes read so far are in the buffer.
    Hyper,
    /// The client closed between requests.
    Closed,
}

/// What a buffer holds so far.
#[derive(Debug)]
enum Parsed {
    /// Could still be an agent's request: read on.
    Incomplete,
    /// Not one this module takes.
    Hyper,
    /// A whole agent's request taking the first `used` bytes of the buffer.
    Agent {
        request: Box<Request<Body>>,
        close: bool,
        used: usize,
    },
}

/// Reads the connection's next request into `buf` (which may already hold bytes), as far
/// as needed to know whether it is an agent's request. Its bytes are taken out of `buf`;
/// anything else leaves `buf` holding every byte read, for hyper.
pub async fn next_request<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut Vec<u8>,
    max_head: usize,
) -> io::Result<Next> {
    loop {
        match parse(buf, max_head) {
            Parsed::Hyper => return Ok(Next::Hyper),
            Parsed::Agent {
                request,
                close,
                used,
            } => {
                buf.drain(..used);
                if buf.is_empty() {
                    // Nothing kept while a connect is held.
                    *buf = Vec::new();
                }
                return Ok(Next::Agent { request, close });
            }
            Parsed::Incomplete => {}
        }
        if buf.capacity() == buf.len() {
            buf.reserve(if buf.is_empty() { 1024 } else { buf.len() });
        }
        let n = io.read_buf(buf).await?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(Next::Closed)
            } else {
                // A head cut short: hyper says how.
                Ok(Next::Hyper)
            };
        }
    }
}

/// Decides from the bytes so far; pure, so every boundary is tested without a socket.
fn parse(buf: &[u8], max_head: usize) -> Parsed {
    let start = &buf[..buf.len().min(AGENT_API.len())];
    if !AGENT_API.starts_with(start) {
        return Parsed::Hyper;
    }
    if buf.len() <= AGENT_API.len() {
        return Parsed::Incomplete;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    let head_len = match head.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Parsed::Incomplete,
        _ => return Parsed::Hyper,
    };
    if head_len > max_head || head.version != Some(1) {
        return Parsed::Hyper;
    }
    // The method and the route were matched by the first bytes.
    let Some(target) = head.path else {
        return Parsed::Hyper;
    };
    let mut request = Request::builder()
        .method(Method::POST)
        .version(Version::HTTP_11);
    let mut length = None;
    let mut close = false;
    for h in head.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            return Parsed::Hyper;
        };
        let Ok(value) = HeaderValue::from_bytes(h.value) else {
            return Parsed::Hyper;
        };
        if name == header::CONTENT_LENGTH {
            let parsed = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
            match (length, parsed) {
                (None, Some(n)) if n <= MAX_BODY => length = Some(n),
                _ => return Parsed::Hyper,
            }
        } else if name == header::TRANSFER_ENCODING
            || name == header::EXPECT
            || name == header::UPGRADE
        {
            return Parsed::Hyper;
        } else if name == header::CONNECTION {
            for token in h.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Parsed::Hyper;
                }
            }
        }
        request = request.header(name, value);
    }
    let Some(length) = length else {
        return Parsed::Hyper;
    };
    let used = head_len + length;
    if buf.len() < used {
        return Parsed::Incomplete;
    }
    let body = Body::from(Bytes::copy_from_slice(&buf[head_len..used]));
    match request.uri(target).body(body) {
        Ok(request) => Parsed::Agent {
            request: Box::new(request),
            close,
            used,
        },
        Err(_) => Parsed::Hyper,
    }
}

/// A response as HTTP/1.1 bytes: its head with `content-length`, a `date` and, when the
/// connection ends after it, `connection: close`; then the body.
pub fn encode(parts: &response::Parts, body: &[u8], close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .status
            .canonical_reason()
            .unwrap_or("Unknown")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || (close && name == header::CONNECTION)
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    // RFC 9110 §8.6: no length on an answer that cannot have a body.
    let bodiless = parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    if !bodiless {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !bodiless {
        out.extend_from_slice(body);
    }
    out
}

/// Whether a response ends its connection (`connection: close` set by the router).
pub fn closes(parts: &response::Parts) -> bool {
    parts.headers.get_all(header::CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

/// An I/O that yields `prefix` before its own bytes: hyper reads a connection whose first
/// bytes were already read here.
pub struct Prefixed<I> {
    prefix: Bytes,
    inner: I,
}

impl<I> Prefixed<I> {
    pub fn new(prefix: Vec<u8>, inner: I) -> Self {
        Self {
            prefix: Bytes::from(prefix),
            inner,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "POST /agent/connect?wait=30 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Agent-Version: 1.0.0+1\r\nContent-Length: 2\r\n\r\n{}";

    fn connect(parsed: Parsed) -> (Box<Request<Body>>, bool, usize) {
        match parsed {
            Parsed::Agent {
                request,
                close,
                used,
            } => (request, close, used),
            other => panic!("expected an agent's request, got {other:?}"),
        }
    }

    #[test]
    fn a_whole_connect_is_taken_with_its_headers_and_body() {
        let mut bytes = HEAD.as_bytes().to_vec();
        bytes.extend_from_slice(b"GET /next");
        let (request, close, used) = connect(parse(&bytes, 16 * 1024));
        assert_eq!(used, HEAD.len(), "the next request's bytes are left");
        assert!(!close);
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "/agent/connect?wait=30");
        assert_eq!(request.headers()["x-agent-version"], "1.0.0+1");
        assert_eq!(request.headers()[header::HOST], "x");
    }

    #[test]
    fn every_prefix_of_a_connect_reads_on() {
        for end in 0..HEAD.len() {
            assert!(
                matches!(
                    parse(&HEAD.as_bytes()[..end], 16 * 1024),
                    Parsed::Incomplete
                ),
                "at {end} bytes"
            );
        }
    }

    #[test]
    fn anything_else_is_hyper_s_at_its_first_telling_byte() {
        for other in [
            "GET /agentupdate/version HTTP/1.1\r\n",
            "PRI * HTTP/2.0\r\n",
            "POST /agentupdate/download HTTP/1.1\r\n",
            "GET /agent/connect HTTP/1.1\r\n",
            "POST /agent/connect?wait=30 HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        ] {
            assert!(
                matches!(parse(other.as_bytes(), 16 * 1024), Parsed::Hyper),
                "{other:?}"
            );
        }
        assert!(matches!(parse(b"G", 16 * 1024), Parsed::Hyper));
    }

    #[test]
    fn heads_this_parser_does_not_take_whole_go_to_hyper() {
        for extra in [
            "Transfer-Encoding: chunked\r\n",
            "Expect: 100-continue\r\n",
            "Connection: upgrade\r\nUpgrade: websocket\r\n",
            "Content-Length: 3\r\n",
            "Bad Header: x\r\n",
        ] {
            let head = HEAD.replacen("Host: x\r\n", &format!("Host: x\r\n{extra}"), 1);
            assert!(
                matches!(parse(head.as_bytes(), 16 * 1024), Parsed::Hyper),
                "{extra:?}"
            );
        }
        let no_length = "POST /agent/connect HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(matches!(
            parse(no_length.as_bytes(), 16 * 1024),
            Parsed::Hyper
        ));
        let too_big = HEAD.replace("Content-Length: 2", "Content-Length: 999999");
        assert!(matches!(
            parse(too_big.as_bytes(), 16 * 1024),
            Parsed::Hyper
        ));
        // A head past the limit is hyper's to refuse (431), whole or not.
        let long = HEAD.replacen(
            "Host: x",
            &format!("Host: x\r\nX-Pad: {}", "a".repeat(200)),
            1,
        );
        assert!(matches!(parse(long.as_bytes(), 100), Parsed::Hyper));
        assert!(matches!(parse(&long.as_bytes()[..150], 100), Parsed::Hyper));
    }

    #[test]
    fn connection_close_is_honoured() {
        let head = HEAD.replacen(
            "Host: x\r\n",
            "Host: x\r\nConnection: keep-alive, Close\r\n",
            1,
        );
        let (_, close, _) = connect(parse(head.as_bytes(), 16 * 1024));
        assert!(close);
    }

    #[test]
    fn a_response_is_encoded_with_its_length_and_a_date() {
        let (mut parts, ()) = axum::http::Response::new(()).into_parts();
        parts.status = StatusCode::CONFLICT;
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        let text = String::from_utf8(encode(&parts, b"{\"a\":1}", false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 409 Conflict\r\n"), "{text}");
        assert!(text.contains("\r\ncontent-type: application/json\r\n"));
        assert!(text.contains("\r\ncontent-length: 7\r\n"));
        assert!(!text.contains("999"));
        assert!(text.contains("\r\ndate: "));
        assert!(!text.contains("connection"));
        assert!(text.ends_with("\r\n\r\n{\"a\":1}"));
        assert!(!closes(&parts));
        let closing = String::from_utf8(encode(&parts, b"", true)).unwrap();
        assert!(closing.contains("\r\nconnection: close\r\n"));
        parts.status = StatusCode::NO_CONTENT;
        let empty = String::from_utf8(encode(&parts, b"", false)).unwrap();
        assert!(empty.starts_with("HTTP/1.1 204 No Content\r\n"), "{empty}");
        assert!(!empty.contains("content-length"), "{empty}");
        assert!(empty.ends_with("\r\n\r\n"));
    }

    #[tokio::test]
    async fn hyper_reads_the_bytes_put_back_first() {
        let (client, server) = tokio::io::duplex(64);
        let mut prefixed = Prefixed::new(b"GET / HTTP/1.1\r\n".to_vec(), server);
        drop(client);
        let mut all = Vec::new();
        prefixed.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET / HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn a_connect_split_across_reads_is_taken_and_the_rest_left() {
        let (mut client, mut server) = tokio::io::duplex(16);
        let sent = format!("{HEAD}GET /agentupdate/version HTTP/1.1\r\n");
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            client.write_all(sent.as_bytes()).await.unwrap();
        });
        let mut buf = Vec::new();
        let next = next_request(&mut server, &mut buf, 16 * 1024)
            .await
            .unwrap();
        assert!(matches!(next, Next::Agent { close: false, .. }), "{next:?}");
        let next = next_request(&mut server, &mut buf, 16 * 1024)
            .await
            .unwrap();
        assert!(matches!(next, Next::Hyper));
        // What was read of the next request is left for hyper, which reads the rest.
        assert!(!buf.is_empty());
        assert!(b"GET /agentupdate/version HTTP/1.1\r\n".starts_with(&buf));
        // The writer waits for hyper's reads of the rest; there is no hyper here.
        writer.abort();
    }
}
