//! Bytes to messages and back, for both transports.
//!
//! HTTP (spec "Plain HTTP Transport"): the body of a `POST` is one `AgentToServer`,
//! uncompressed or gzipped (`Content-Encoding: gzip`, which a server must accept); the
//! answer is one `ServerToAgent` with `Content-Type: application/x-protobuf`, gzipped
//! only when the request's `Accept-Encoding` allows it. The size limit applies to the
//! decompressed bytes, read no further than one byte past it, so a gzip bomb costs
//! the limit and no more. The edge should also cap the bytes it reads off the
//! socket (the limit plus a little for gzip's overhead on incompressible data).
//!
//! WebSocket (spec "WebSocket Message Format"): each binary message is a varint
//! header, 0 in this version, then the protobuf. A varint 0 is the single byte
//! `0x00`, and no protobuf message can start with `0x00` (field number 0 does not
//! exist), so a message whose first byte is not `0x00` is taken as a bare protobuf:
//! clients written before the header existed send those, and opamp-go's server
//! accepts them the same way (`internal/wsmessage.go`).

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use prost::Message;

use crate::error::{Error, Result};
use crate::proto::{AgentToServer, ServerToAgent};

/// The media type of both directions on HTTP. Answers carry exactly this value, with
/// no parameters: the Node client compares the header with it as a string.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// The header a client may send with its instance uid in UUID text form (v0.15+).
pub const INSTANCE_UID_HEADER: &str = "OpAMP-Instance-UID";

/// A bound on one decoded message for callers without one of their own. opamp-go's
/// server defaults to 64 MiB; status reports are kilobytes, and a server holding
/// thousands of connections cannot let each buffer 64 MiB.
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 20;

/// How an HTTP body is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentEncoding {
    Identity,
    Gzip,
}

impl ContentEncoding {
    /// Reads a `Content-Encoding` header value (absent: identity).
    pub fn from_header(value: Option<&str>) -> Result<Self> {
        let Some(value) = value else {
            return Ok(ContentEncoding::Identity);
        };
        let value = value.trim();
        if value.is_empty() || value.eq_ignore_ascii_case("identity") {
            Ok(ContentEncoding::Identity)
        } else if value.eq_ignore_ascii_case("gzip") || value.eq_ignore_ascii_case("x-gzip") {
            Ok(ContentEncoding::Gzip)
        } else {
            Err(Error::Encoding(value.to_owned()))
        }
    }
}

/// Whether a request's `Content-Type` says plain HTTP transport. The spec tells a
/// server to treat any other request on the path as a WebSocket upgrade.
pub fn is_protobuf_content_type(value: &str) -> bool {
    let media_type = value.split(';').next().unwrap_or_default().trim();
    media_type.eq_ignore_ascii_case(CONTENT_TYPE)
}

/// Decodes an HTTP request body, decompressing it first when it says gzip.
pub fn decode_http_body(
    body: &[u8],
    encoding: ContentEncoding,
    limit: usize,
) -> Result<AgentToServer> {
    match encoding {
        ContentEncoding::Identity => {
            if body.len() > limit {
                return Err(Error::TooLarge { limit });
            }
            decode_agent(body)
        }
        ContentEncoding::Gzip => {
            let plain = gunzip_bounded(body, limit)?;
            decode_agent(&plain)
        }
    }
}

/// Decompresses at most `limit` bytes; one more is an error, whatever the rest holds.
fn gunzip_bounded(body: &[u8], limit: usize) -> Result<Vec<u8>> {
    let mut plain = Vec::new();
    // Several gzip members in a row are one valid body (RFC 1952), as Go reads them.
    let mut reader = MultiGzDecoder::new(body).take(limit as u64 + 1);
    reader.read_to_end(&mut plain).map_err(Error::Gzip)?;
    if plain.len() > limit {
        return Err(Error::TooLarge { limit });
    }
    Ok(plain)
}

fn decode_agent(bytes: &[u8]) -> Result<AgentToServer> {
    AgentToServer::decode(bytes).map_err(|source| Error::Decode {
        what: "AgentToServer",
        source,
    })
}

/// Encodes an HTTP answer body; `gzip` when the request's `Accept-Encoding` allows
/// it (see [`accepts_gzip`]), in which case the answer says `Content-Encoding: gzip`.
pub fn encode_http_body(message: &ServerToAgent, gzip: bool) -> Result<Vec<u8>> {
    let plain = message.encode_to_vec();
    if !gzip {
        return Ok(plain);
    }
    let mut encoder = GzEncoder::new(
        Vec::with_capacity(plain.len() / 2 + 32),
        Compression::fast(),
    );
    encoder.write_all(&plain).map_err(Error::Compress)?;
    encoder.finish().map_err(Error::Compress)
}

/// Whether an `Accept-Encoding` value allows gzip: listed (or `*`) with a q-value
/// above zero, an explicit `gzip;q=0` winning over `*` (RFC 9110 §12.5.3, as
/// opamp-go's server reads it).
pub fn accepts_gzip(accept_encoding: Option<&str>) -> bool {
    let Some(value) = accept_encoding else {
        return false;
    };
    let mut wildcard = false;
    for item in value.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim();
        if name.is_empty() {
            continue;
        }
        let q = quality(parts);
        if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            return q > 0.0;
        }
        if name == "*" && q > 0.0 {
            wildcard = true;
        }
    }
    wildcard
}

fn quality<'a>(params: impl Iterator<Item = &'a str>) -> f32 {
    for param in params {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("q") {
            return match value.trim().parse::<f32>() {
                Ok(q) if (0.0..=1.0).contains(&q) => q,
                _ => 0.0,
            };
        }
    }
    1.0
}

/// The WebSocket header of this spec version: varint 0.
const WS_HEADER: u8 = 0x00;

/// Decodes one binary WebSocket message, with or without the one-byte header.
/// `limit` bounds the whole message (the WebSocket library should refuse longer
/// frames before they are buffered; this is the same rule for callers that cannot).
pub fn decode_ws_message(message: &[u8], limit: usize) -> Result<AgentToServer> {
    if message.len() > limit {
        return Err(Error::TooLarge { limit });
    }
    let body = match message.split_first() {
        Some((&WS_HEADER, rest)) => rest,
        _ => message,
    };
    decode_agent(body)
}

/// Encodes one binary WebSocket message: the header, then the protobuf.
pub fn encode_ws_message(message: &ServerToAgent) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + message.encoded_len());
    out.push(WS_HEADER);
    // Encoding into a Vec cannot run out of room.
    message.encode_raw(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AgentDescription, AnyValue, KeyValue, any_value};

    fn sample() -> AgentToServer {
        AgentToServer {
            instance_uid: vec![7; 16],
            sequence_num: 3,
            capabilities: 1,
            agent_description: Some(AgentDescription {
                identifying_attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("svc".into())),
                    }),
                }],
                non_identifying_attributes: vec![],
            }),
            ..Default::default()
        }
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn plain_and_gzip_bodies_decode_the_same() {
        let bytes = sample().encode_to_vec();
        let plain = decode_http_body(&bytes, ContentEncoding::Identity, 1024).unwrap();
        let zipped = decode_http_body(&gzip(&bytes), ContentEncoding::Gzip, 1024).unwrap();
        assert_eq!(plain, sample());
        assert_eq!(zipped, sample());
    }

    #[test]
    fn two_gzip_members_are_one_body() {
        let bytes = sample().encode_to_vec();
        let (a, b) = bytes.split_at(5);
        let mut body = gzip(a);
        body.extend(gzip(b));
        assert_eq!(
            decode_http_body(&body, ContentEncoding::Gzip, 1024).unwrap(),
            sample()
        );
    }

    #[test]
    fn limit_is_exact_for_plain_bodies() {
        let bytes = sample().encode_to_vec();
        assert!(decode_http_body(&bytes, ContentEncoding::Identity, bytes.len()).is_ok());
        let err = decode_http_body(&bytes, ContentEncoding::Identity, bytes.len() - 1).unwrap_err();
        assert!(err.is_too_large(), "{err}");
    }

    #[test]
    fn gzip_bomb_is_too_large_after_reading_only_the_limit() {
        // 64 MiB of zeros compress to about 64 KiB; the limit is 1 MiB.
        let mut e = GzEncoder::new(Vec::new(), Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            e.write_all(&zeros).unwrap();
        }
        let bomb = e.finish().unwrap();
        assert!(bomb.len() < 1 << 20);
        let err = decode_http_body(&bomb, ContentEncoding::Gzip, 1 << 20).unwrap_err();
        assert!(err.is_too_large(), "{err}");
    }

    #[test]
    fn decompressed_size_counts_not_compressed_size() {
        // Small on the wire, exactly at the limit once inflated: accepted.
        let mut msg = sample();
        msg.agent_description = None;
        msg.custom_message = Some(crate::proto::CustomMessage {
            capability: "x".into(),
            r#type: "y".into(),
            data: vec![b'a'; 10_000],
        });
        let bytes = msg.encode_to_vec();
        let body = gzip(&bytes);
        assert!(body.len() < 1_000);
        assert!(decode_http_body(&body, ContentEncoding::Gzip, bytes.len()).is_ok());
        let err = decode_http_body(&body, ContentEncoding::Gzip, bytes.len() - 1).unwrap_err();
        assert!(err.is_too_large());
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_size_error() {
        let err =
            decode_http_body(b"\xff\xff\xff\xff", ContentEncoding::Identity, 1024).unwrap_err();
        assert!(matches!(err, Error::Decode { .. }), "{err}");
        assert!(!err.is_too_large());
        let err = decode_http_body(b"not gzip", ContentEncoding::Gzip, 1024).unwrap_err();
        assert!(matches!(err, Error::Gzip(_)), "{err}");
        // Truncated gzip is an error, not a short message.
        let body = gzip(&sample().encode_to_vec());
        let err = decode_http_body(&body[..body.len() - 4], ContentEncoding::Gzip, 1024);
        assert!(err.is_err());
    }

    #[test]
    fn content_encoding_header() {
        assert_eq!(
            ContentEncoding::from_header(None).unwrap(),
            ContentEncoding::Identity
        );
        assert_eq!(
            ContentEncoding::from_header(Some(" GZIP ")).unwrap(),
            ContentEncoding::Gzip
        );
        assert_eq!(
            ContentEncoding::from_header(Some("identity")).unwrap(),
            ContentEncoding::Identity
        );
        let err = ContentEncoding::from_header(Some("br")).unwrap_err();
        assert!(err.to_string().contains("\"br\""), "{err}");
    }

    #[test]
    fn content_type_decides_http_or_websocket() {
        assert!(is_protobuf_content_type("application/x-protobuf"));
        assert!(is_protobuf_content_type(
            "Application/X-Protobuf; charset=binary"
        ));
        assert!(!is_protobuf_content_type("application/json"));
        assert!(!is_protobuf_content_type(""));
    }

    #[test]
    fn answers_gzip_only_when_asked() {
        let answer = ServerToAgent {
            instance_uid: vec![1; 16],
            capabilities: 0x1f,
            ..Default::default()
        };
        let plain = encode_http_body(&answer, false).unwrap();
        assert_eq!(ServerToAgent::decode(plain.as_slice()).unwrap(), answer);
        let zipped = encode_http_body(&answer, true).unwrap();
        assert_eq!(&zipped[..2], &[0x1f, 0x8b]);
        let mut out = Vec::new();
        MultiGzDecoder::new(zipped.as_slice())
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, plain);
    }

    #[test]
    fn accept_encoding_rules() {
        // requests (the Python client) sends this by default.
        assert!(accepts_gzip(Some("gzip, deflate")));
        assert!(accepts_gzip(Some("br;q=1, GZIP;q=0.5")));
        assert!(accepts_gzip(Some("*")));
        assert!(!accepts_gzip(Some("gzip;q=0, *")));
        assert!(!accepts_gzip(Some("gzip;q=bogus")));
        assert!(!accepts_gzip(Some("deflate, br")));
        assert!(!accepts_gzip(Some("")));
        // undici (the Node client) sends none.
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn websocket_messages_with_and_without_header() {
        let bytes = sample().encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&bytes);
        assert_eq!(decode_ws_message(&framed, 1024).unwrap(), sample());
        assert_eq!(decode_ws_message(&bytes, 1024).unwrap(), sample());
        // Header alone: an empty message, which the spec allows.
        assert_eq!(
            decode_ws_message(&[0], 1024).unwrap(),
            AgentToServer::default()
        );
        let err = decode_ws_message(&framed, framed.len() - 1).unwrap_err();
        assert!(err.is_too_large());
        // A header of 1 (reserved) is not a valid protobuf start either.
        let mut bad = vec![0x01];
        bad.extend_from_slice(&bytes);
        assert!(decode_ws_message(&bad, 1024).is_err());
    }

    #[test]
    fn websocket_answers_carry_the_header() {
        let answer = ServerToAgent {
            instance_uid: vec![2; 16],
            flags: 1,
            ..Default::default()
        };
        let framed = encode_ws_message(&answer);
        assert_eq!(framed[0], 0);
        assert_eq!(ServerToAgent::decode(&framed[1..]).unwrap(), answer);
    }
}
