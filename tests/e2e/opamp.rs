//! OpAMP agents of other vendors in the fleet: the two registry OpAMP clients (PyPI
//! opentelemetry-opamp-client 0.5b0, npm @elastic/opamp-client-node 0.5.0, installed
//! by scripts/test.sh and found through OPAMP_PYTHON and OPAMP_NODE_MODULES) against
//! a real update-server; bodies that do not decode or are too large; a WebSocket
//! client that is answered and closed with 1009 over the limit.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_opamp::proto::{
    AgentCapabilities, AgentDescription, AgentToServer, AnyValue, ComponentHealth, KeyValue,
    ServerToAgent, any_value,
};
use e2e::{
    ServerProc, TestContext, admin_agents, http_with_body, read_file, repo_root, signal, wait_until,
};
use flate2::Compression;
use flate2::write::GzEncoder;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const ADMIN: &str = "opamp-admin";
const ENROLL: &str = "opamp-enroll";
const LONG: Duration = Duration::from_secs(60);

fn env_path(var: &str) -> PathBuf {
    let value = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run scripts/test.sh, which installs the registry OpAMP clients (scripts/opamp-clients.sh target/opamp-clients) and sets it")
    });
    let path = PathBuf::from(value);
    assert!(
        path.exists(),
        "{var}={} does not exist: run scripts/opamp-clients.sh target/opamp-clients",
        path.display()
    );
    path
}

fn clients_dir() -> PathBuf {
    repo_root().join("crates/opamp/tests/clients")
}

/// A server whose fleet database is `pg`.
fn server_on(ctx: &TestContext, pg: &e2e::Postgres) -> ServerProc {
    ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
            ("UPDATE_SERVER_DATABASE_URL", &pg.url()),
        ],
    )
}

/// An OpAMP WebSocket to `server`, with the enrollment token.
pub(crate) async fn ws_connect(server: &ServerProc) -> WsStream {
    let mut req = format!("ws://127.0.0.1:{}/v1/opamp", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {ENROLL}").parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

pub(crate) type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn server(ctx: &TestContext) -> ServerProc {
    ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
        ],
    )
}

fn start_client(ctx: &TestContext, server: &ServerProc, which: &str, out: &Path) -> u32 {
    std::fs::create_dir_all(out).unwrap();
    let endpoint = server.url(agent_opamp::OPAMP_PATH);
    let mut cmd = if which == "python" {
        let mut c = Command::new(env_path("OPAMP_PYTHON"));
        c.arg(clients_dir().join("python_client.py"));
        c
    } else {
        let mut c = Command::new("node");
        c.env("NODE_PATH", env_path("OPAMP_NODE_MODULES"))
            .arg(clients_dir().join("node_client.js"));
        c
    };
    cmd.args(["--endpoint", &endpoint, "--out"])
        .arg(out)
        .args(["--group", "canary", "--token", ENROLL, "--interval", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out.with_extension("log")).unwrap());
    ctx.spawn(cmd)
}

fn row<'a>(rows: &'a [Value], id: &str) -> Option<&'a Value> {
    rows.iter().find(|r| r["id"] == id)
}

#[test]
fn both_registry_clients_appear_as_opamp_agents() {
    let ctx = TestContext::new();
    let server = server(&ctx);
    let py_out = ctx.path("python");
    let node_out = ctx.path("node");
    let py = start_client(&ctx, &server, "python", &py_out);
    start_client(&ctx, &server, "node", &node_out);
    let uid = |out: &Path| {
        let mut id = String::new();
        wait_until(LONG, "the client to write its instance_uid", || {
            id = read_file(&out.join("instance_uid")).trim().to_owned();
            !id.is_empty()
        });
        id
    };
    let (py_id, node_id) = (uid(&py_out), uid(&node_out));
    let mut rows = Vec::new();
    wait_until(LONG, "both clients in /admin/agents", || {
        rows = admin_agents(server.port, ADMIN);
        row(&rows, &py_id).is_some() && row(&rows, &node_id).is_some()
    });
    for (id, service) in [(&py_id, "python-opamp-test"), (&node_id, "node-opamp-test")] {
        let r = row(&rows, id).unwrap();
        assert_eq!(r["protocol"], "opamp", "{r}");
        assert_eq!(r["name"], service, "{r}");
        assert_eq!(r["description"]["service.name"], service, "{r}");
        assert_eq!(r["description"]["agent.group"], "canary", "{r}");
        assert_eq!(r["group"], "canary", "{r}");
        assert_eq!(r["online"], true, "{r}");
        // Neither client reports health; the field is there, empty.
        assert!(r.as_object().unwrap().contains_key("health"), "{r}");
        assert!(
            r.as_object().unwrap().contains_key("remote_config_status"),
            "{r}"
        );
        assert!(
            r.as_object().unwrap().contains_key("effective_config_hash"),
            "{r}"
        );
    }
    // The group's configuration set reaches both, and both report it APPLIED.
    let files = serde_json::json!({"files": {"collector.yaml": "receivers: {}\n", "app.json": "{\"sampling\": 0.5}"}});
    let auth = format!("Bearer {ADMIN}");
    let a = e2e::http_with_body(
        server.port,
        "PUT",
        "/admin/config/canary",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        files.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    let hash = serde_json::from_slice::<Value>(&a.body).unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_owned();
    for out in [&py_out, &node_out] {
        wait_until(LONG, "the client to receive the set", || {
            serde_json::from_str::<Value>(&read_file(&out.join("config.json")))
                .is_ok_and(|c| c["config_hash"] == hash.as_str())
        });
        let got: Value = serde_json::from_str(&read_file(&out.join("config.json"))).unwrap();
        assert_eq!(got["files"]["collector.yaml"]["body"], "receivers: {}\n");
        assert_eq!(got["files"]["app.json"]["content_type"], "application/json");
    }
    wait_until(LONG, "both clients APPLIED with the set's hash", || {
        let rows = admin_agents(server.port, ADMIN);
        [&py_id, &node_id].iter().all(|id| {
            row(&rows, id).is_some_and(|r| {
                r["remote_config_status"] == "APPLIED" && r["remote_config_hash"] == hash.as_str()
            })
        })
    });
    let a = e2e::http(
        server.port,
        "GET",
        "/admin/config",
        &[("Authorization", &auth)],
    )
    .unwrap();
    let listed = a.text();
    assert!(listed.contains(&hash), "{listed}");

    // The Python client says goodbye (AgentDisconnect) when stopped: offline at once.
    signal(py, "TERM");
    wait_until(LONG, "the stopped client to show offline", || {
        let rows = admin_agents(server.port, ADMIN);
        row(&rows, &py_id).is_some_and(|r| r["online"] == false)
    });
    let rows = admin_agents(server.port, ADMIN);
    assert_eq!(row(&rows, &node_id).unwrap()["online"], true);
    let log = read_file(&server.home.join("server.log"));
    assert!(!log.contains("panicked"), "{log}");
}

fn message(uid: [u8; 16], seq: u64) -> AgentToServer {
    described(uid, seq, "ws-test")
}

pub(crate) fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
    }
}

/// A full-state message of an agent naming itself `service` (also its host), in group
/// `edge`.
pub(crate) fn described(uid: [u8; 16], seq: u64, service: &str) -> AgentToServer {
    AgentToServer {
        instance_uid: uid.to_vec(),
        sequence_num: seq,
        capabilities: AgentCapabilities::ReportsStatus as u64
            | AgentCapabilities::ReportsHealth as u64,
        agent_description: Some(AgentDescription {
            identifying_attributes: vec![kv("service.name", service)],
            non_identifying_attributes: vec![
                kv("agent.group", "edge"),
                kv("host.name", service),
                kv("os.type", "linux"),
            ],
        }),
        health: Some(ComponentHealth {
            healthy: true,
            status: "running".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn post(server: &ServerProc, headers: &[(&str, &str)], body: &[u8]) -> e2e::HttpAnswer {
    let auth = format!("Bearer {ENROLL}");
    let mut all = vec![
        ("Content-Type", "application/x-protobuf"),
        ("Authorization", auth.as_str()),
    ];
    all.extend_from_slice(headers);
    http_with_body(server.port, "POST", agent_opamp::OPAMP_PATH, &all, body).unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn http_bodies_are_checked_and_answers_are_protobuf() {
    let ctx = TestContext::new();
    let server = server(&ctx);
    let body = message([7; 16], 1).encode_to_vec();

    // Without the enrollment token: 401.
    let a = http_with_body(
        server.port,
        "POST",
        "/v1/opamp",
        &[("Content-Type", "application/x-protobuf")],
        &body,
    )
    .unwrap();
    assert_eq!(a.status, 401, "{}", a.text());

    // A plain body, no gzip asked: a plain answer, the exact Content-Type.
    let a = post(&server, &[], &body);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("Content-Type"), Some("application/x-protobuf"));
    assert_eq!(a.header("Content-Encoding"), None);
    let answer = ServerToAgent::decode(a.body.as_slice()).unwrap();
    assert_eq!(answer.instance_uid, vec![7; 16]);
    assert_ne!(
        answer.capabilities, 0,
        "the first answer carries capabilities"
    );

    // A gzip body, gzip asked: a gzip answer.
    let a = post(
        &server,
        &[("Content-Encoding", "gzip"), ("Accept-Encoding", "gzip")],
        &gzip(&message([7; 16], 2).encode_to_vec()),
    );
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("Content-Encoding"), Some("gzip"));
    let mut plain = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(a.body.as_slice()),
        &mut plain,
    )
    .unwrap();
    assert_eq!(
        ServerToAgent::decode(plain.as_slice())
            .unwrap()
            .instance_uid,
        vec![7; 16]
    );

    // Undecodable: 400. Not gzip though it says so: 400.
    assert_eq!(post(&server, &[], b"\xff\xff\xff\xff").status, 400);
    assert_eq!(
        post(&server, &[("Content-Encoding", "gzip")], b"not gzip").status,
        400
    );
    // Over the limit on the wire, and a gzip bomb under it that inflates past it: 413.
    let big = vec![0x0a_u8; 3 << 20];
    assert_eq!(post(&server, &[], &big).status, 413);
    let bomb = gzip(&vec![0u8; 64 << 20]);
    assert!(bomb.len() < 1 << 20);
    assert_eq!(
        post(&server, &[("Content-Encoding", "gzip")], &bomb).status,
        413
    );

    // curl, as an operator would probe it.
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", &format!("Authorization: Bearer {ENROLL}")])
        .args([
            "-H",
            "Content-Type: application/x-protobuf",
            "--data-binary",
            "garbage\u{1}",
        ])
        .arg(server.url("/v1/opamp"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "400");

    // The agent is listed with its health and description.
    let rows = admin_agents(server.port, ADMIN);
    let id = "07070707-0707-0707-0707-070707070707";
    let r = row(&rows, id).unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(r["protocol"], "opamp");
    assert_eq!(r["health"]["healthy"], true);
    assert_eq!(r["health"]["status"], "running");
    assert_eq!(r["group"], "edge");
    assert_eq!(r["platform"], "linux");
}

#[test]
fn websocket_clients_are_answered_and_closed_with_1009_over_the_limit() {
    let ctx = TestContext::new();
    let server = server(&ctx);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let connect = || ws_connect(&server);
        let mut ws = connect().await;
        // With the one-byte header.
        let mut framed = vec![0u8];
        framed.extend(message([9; 16], 1).encode_to_vec());
        ws.send(Message::Binary(framed.into())).await.unwrap();
        let answer = next_answer(&mut ws).await;
        assert_eq!(answer.instance_uid, vec![9; 16]);
        assert_ne!(answer.capabilities, 0);
        // Without it: accepted too.
        ws.send(Message::Binary(message([9; 16], 2).encode_to_vec().into()))
            .await
            .unwrap();
        let answer = next_answer(&mut ws).await;
        assert_eq!(answer.instance_uid, vec![9; 16]);
        assert_eq!(answer.flags, 0, "no gap, no full state asked");

        let rows = admin_agents(server.port, ADMIN);
        let r = row(&rows, "09090909-0909-0909-0909-090909090909")
            .unwrap()
            .clone();
        assert_eq!(r["protocol"], "opamp");
        assert_eq!(r["online"], true);

        // Over the limit: close 1009.
        let mut big = vec![0u8];
        big.extend(vec![0x0a; 2 << 20]);
        let _ = ws.send(Message::Binary(big.into())).await;
        let code = loop {
            match ws.next().await {
                Some(Ok(Message::Close(Some(frame)))) => break u16::from(frame.code),
                Some(Ok(_)) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        };
        assert_eq!(code, 1009);
        // The socket closed without a goodbye: the agent shows offline.
        wait_until(LONG, "the closed socket's agent offline", || {
            let rows = admin_agents(server.port, ADMIN);
            row(&rows, "09090909-0909-0909-0909-090909090909").is_some_and(|r| r["online"] == false)
        });
        // The server still serves others; a set pushed for the agent's group reaches it
        // at once, without a message of its own.
        let mut ws = connect().await;
        let mut m = message([10; 16], 1);
        m.capabilities |= AgentCapabilities::AcceptsRemoteConfig as u64
            | AgentCapabilities::ReportsRemoteConfig as u64;
        ws.send(Message::Binary(m.encode_to_vec().into()))
            .await
            .unwrap();
        let first = next_answer(&mut ws).await;
        assert_eq!(first.instance_uid, vec![10; 16]);
        assert!(first.remote_config.is_none(), "no set yet");
        let auth = format!("Bearer {ADMIN}");
        let a = e2e::http_with_body(
            server.port,
            "PUT",
            "/admin/config/edge",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            br#"{"files": {"edge.yaml": "x: 1"}}"#,
        )
        .unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        let hash = serde_json::from_slice::<Value>(&a.body).unwrap()["hash"]
            .as_str()
            .unwrap()
            .to_owned();
        let pushed = next_answer(&mut ws).await;
        let rc = pushed.remote_config.expect("the set is pushed");
        assert_eq!(hex(&rc.config_hash), hash);
        assert_eq!(rc.config.unwrap().config_map["edge.yaml"].body, b"x: 1");
        ws.close(None).await.unwrap();
    });
}

async fn next_answer<S>(ws: &mut S) -> ServerToAgent
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => {
                assert_eq!(b[0], 0, "answers carry the 0x00 header");
                return ServerToAgent::decode(&b[1..]).unwrap();
            }
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            other => panic!("expected an answer, got {other:?}"),
        }
    }
}

/// The router alone, driven with `oneshot`: the HTTP transport's answers.
mod handlers {
    use super::*;
    use agent_protocol::settings::VarMap;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    use update_server::{Config, app, build_state};

    fn call(token: &str, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let ctx = TestContext::new();
        let home = ctx.path("home");
        let config = Config::load(
            None,
            &VarMap(vec![
                (
                    "UPDATE_SERVER_SERVER_HOME".into(),
                    home.display().to_string(),
                ),
                ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN".into(), token.into()),
            ]),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let state = build_state(&config).await.unwrap();
            let resp = app(state).oneshot(req).await.unwrap();
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, headers, body.to_vec())
        })
    }

    fn request(headers: &[(&str, &str)], body: Vec<u8>) -> Request<Body> {
        let mut b =
            Request::post(agent_opamp::OPAMP_PATH).header("Content-Type", "application/x-protobuf");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::from(body)).unwrap()
    }

    /// An operator removes an OpAMP agent: its uid is refused from then on (answered with
    /// a new uid and nothing for it), and it is not listed again.
    #[test]
    fn a_removed_opamp_agents_uid_is_refused_with_a_new_one() {
        let ctx = TestContext::new();
        let config = Config::load(
            None,
            &VarMap(vec![
                (
                    "UPDATE_SERVER_SERVER_HOME".into(),
                    ctx.path("home").display().to_string(),
                ),
                ("UPDATE_SERVER_ADMIN_TOKEN".into(), "op-token".into()),
            ]),
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let state = build_state(&config).await.unwrap();
            let send = |req: Request<Body>| {
                let app = app(state.clone());
                async move {
                    let resp = app.oneshot(req).await.unwrap();
                    let status = resp.status();
                    let body = resp.into_body().collect().await.unwrap().to_bytes();
                    (status, body.to_vec())
                }
            };
            let admin = |method: &str, path: &str| {
                Request::builder()
                    .method(method)
                    .uri(path)
                    .header("Authorization", "Bearer op-token")
                    .body(Body::empty())
                    .unwrap()
            };
            let (status, body) = send(request(&[], message([7; 16], 1).encode_to_vec())).await;
            assert_eq!(status, StatusCode::OK);
            let first = ServerToAgent::decode(body.as_slice()).unwrap();
            assert!(first.agent_identification.is_none());
            let (_, listed) = send(admin("GET", "/admin/agents")).await;
            let rows: Vec<serde_json::Value> = serde_json::from_slice(&listed).unwrap();
            assert_eq!(rows.len(), 1, "{rows:?}");
            let id = rows[0]["id"].as_str().unwrap().to_owned();

            let (status, _) = send(admin("DELETE", &format!("/admin/agents/{id}"))).await;
            assert_eq!(status, StatusCode::OK);
            let (status, body) = send(request(&[], message([7; 16], 2).encode_to_vec())).await;
            assert_eq!(status, StatusCode::OK);
            let refused = ServerToAgent::decode(body.as_slice()).unwrap();
            let new = refused
                .agent_identification
                .expect("a removed uid is given a new one")
                .new_instance_uid;
            assert!(!new.is_empty() && new != vec![7; 16]);
            let (_, listed) = send(admin("GET", "/admin/agents")).await;
            let rows: Vec<serde_json::Value> = serde_json::from_slice(&listed).unwrap();
            assert!(
                rows.is_empty(),
                "the removed agent is listed again: {rows:?}"
            );
        });
    }

    #[test]
    fn answers_are_exactly_protobuf_and_plain_unless_gzip_is_asked() {
        let (status, headers, body) = call("", request(&[], message([1; 16], 1).encode_to_vec()));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert!(headers.get("content-encoding").is_none());
        assert_eq!(
            ServerToAgent::decode(body.as_slice()).unwrap().instance_uid,
            vec![1; 16]
        );
        let (status, headers, body) = call(
            "",
            request(
                &[
                    ("Content-Encoding", "gzip"),
                    ("Accept-Encoding", "gzip;q=0.5, br"),
                ],
                gzip(&message([1; 16], 1).encode_to_vec()),
            ),
        );
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-encoding"], "gzip");
        assert_eq!(&body[..2], &[0x1f, 0x8b]);
    }

    #[test]
    fn bad_bodies_are_400_and_large_ones_413() {
        let (status, _, _) = call("", request(&[], b"\x0a\x05ab".to_vec()));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        // Decodes, but a 3-byte instance_uid is no uid.
        let mut m = message([1; 16], 1);
        m.instance_uid = vec![1, 2, 3];
        let (status, headers, body) = call("", request(&[], m.encode_to_vec()));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(headers["content-type"], "application/x-protobuf");
        let answer = ServerToAgent::decode(body.as_slice()).unwrap();
        assert!(
            answer
                .error_response
                .unwrap()
                .error_message
                .contains("16 bytes")
        );
        let (status, _, _) = call("", request(&[("Content-Encoding", "br")], vec![1]));
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let (status, _, body) = call("", request(&[], vec![0x0a; 2 << 20]));
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{}",
            String::from_utf8_lossy(&body)
        );
        let bomb = gzip(&vec![0u8; 8 << 20]);
        let (status, _, _) = call("", request(&[("Content-Encoding", "gzip")], bomb));
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn the_enrollment_token_is_the_bearer() {
        let body = message([1; 16], 1).encode_to_vec();
        let (status, _, _) = call("sesame", request(&[], body.clone()));
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, _) = call(
            "sesame",
            request(&[("Authorization", "Bearer nope")], body.clone()),
        );
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, _) = call(
            "sesame",
            request(&[("Authorization", "Bearer sesame")], body),
        );
        assert_eq!(status, StatusCode::OK);
    }
}

/// OpAMP agents that take packages: the ones of an open wave are offered the served
/// bundle as the `agent` package (URL, hash, signature), the others not yet; a failed
/// install counts in the rollout like a native agent's report and halts it. An agent
/// that does not take packages is never placed in a wave nor offered anything.
#[test]
fn agents_that_take_packages_are_offered_the_bundle_in_their_wave() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("dist");
    let bundle = ctx.pack(&dist, "2.2.0", "1234", &key, "out");
    let server = ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    let takes = |uid: [u8; 16], seq: u64| {
        let mut m = message(uid, seq);
        m.capabilities |= AgentCapabilities::AcceptsPackages as u64
            | AgentCapabilities::ReportsPackageStatuses as u64;
        m
    };
    let send = |m: &AgentToServer| {
        let a = post(&server, &[], &m.encode_to_vec());
        assert_eq!(a.status, 200, "{}", a.text());
        ServerToAgent::decode(a.body.as_slice()).unwrap()
    };
    // Known to the fleet before the bundle arrives: nothing to offer yet.
    assert!(send(&message([3; 16], 1)).packages_available.is_none());
    assert!(send(&takes([4; 16], 1)).packages_available.is_none());
    assert!(send(&takes([5; 16], 1)).packages_available.is_none());

    ctx.publish_served(&server, &bundle);
    let sha256 = e2e::sha256_file(&bundle);
    let signature = std::fs::read(format!("{}.minisig", bundle.display())).unwrap();
    let auth = format!("Bearer {ADMIN}");
    let rollout = || -> Value {
        let a = e2e::http(
            server.port,
            "GET",
            "/admin/rollout",
            &[("Authorization", &auth)],
        )
        .unwrap();
        serde_json::from_slice(&a.body).unwrap_or_default()
    };
    wait_until(LONG, "the rollout to open its first wave", || {
        rollout()["wave"] == 1
    });
    let placed: u64 = rollout()["waves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["agents"].as_u64().unwrap())
        .sum();
    assert_eq!(
        placed,
        2,
        "only the agents that take packages are placed: {:#}",
        rollout()
    );

    assert!(send(&message([3; 16], 2)).packages_available.is_none());
    let a = send(&takes([4; 16], 2)).packages_available;
    let b = send(&takes([5; 16], 2)).packages_available;
    assert!(
        a.is_some() != b.is_some(),
        "one agent in the first wave of one: {a:?} {b:?}"
    );
    let (uid, offer) = match (a, b) {
        (Some(o), None) => ([4u8; 16], o),
        (None, Some(o)) => ([5u8; 16], o),
        _ => unreachable!(),
    };
    let pkg = &offer.packages["agent"];
    assert_eq!(pkg.version, "2.2.0+1234");
    let file = pkg.file.as_ref().unwrap();
    assert_eq!(file.download_url, server.url("/agentupdate/download"));
    assert_eq!(hex(&file.content_hash), sha256);
    assert_eq!(file.signature, signature);
    assert!(!offer.all_packages_hash.is_empty());

    // Its install failed.
    let mut failed = takes(uid, 3);
    failed.package_statuses = Some(agent_opamp::proto::PackageStatuses {
        packages: [(
            "agent".to_owned(),
            agent_opamp::proto::PackageStatus {
                name: "agent".into(),
                server_offered_version: pkg.version.clone(),
                server_offered_hash: pkg.hash.clone(),
                status: agent_opamp::proto::PackageStatusEnum::InstallFailed as i32,
                error_message: "signature check failed".into(),
                ..Default::default()
            },
        )]
        .into(),
        server_provided_all_packages_hash: offer.all_packages_hash.clone(),
        ..Default::default()
    });
    send(&failed);
    let rows = admin_agents(server.port, ADMIN);
    let id = uuid_text(uid);
    let r = row(&rows, &id).unwrap();
    assert_eq!(r["update_status"], "INSTALL_FAILED", "{r}");
    assert_eq!(r["update_error"], "signature check failed", "{r}");
    let r = row(&rows, "03030303-0303-0303-0303-030303030303").unwrap();
    assert_eq!(r["update_status"], Value::Null, "{r}");
    wait_until(LONG, "the failure to halt the rollout", || {
        rollout()["state"] == "halted"
    });
    assert_eq!(rollout()["waves"][0]["failed"], 1, "{:#}", rollout());
    // Halted: the failed agent is not offered it again, the next wave never is.
    assert!(send(&takes([4; 16], 4)).packages_available.is_none());
    assert!(send(&takes([5; 16], 4)).packages_available.is_none());
}

fn uuid_text(uid: [u8; 16]) -> String {
    let h = hex(&uid);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// While the fleet database is away OpAMP agents are asked to come back later: `503`
/// with `Retry-After` over HTTP, `UNAVAILABLE` with `RetryInfo` (then close 1013) over
/// a WebSocket; once it is back they are answered again.
#[test]
fn agents_are_throttled_while_the_database_is_away() {
    let ctx = TestContext::new();
    let pg = e2e::Postgres::start();
    let server = server_on(&ctx, &pg);
    let body = message([11; 16], 1).encode_to_vec();
    assert_eq!(post(&server, &[], &body).status, 200);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut ws = rt.block_on(async {
        let mut ws = ws_connect(&server).await;
        ws.send(Message::Binary(message([12; 16], 1).encode_to_vec().into()))
            .await
            .unwrap();
        assert_eq!(next_answer(&mut ws).await.instance_uid, vec![12; 16]);
        ws
    });

    pg.stop();
    let mut seq = 2;
    let mut last = None;
    wait_until(LONG, "a 503 while the database is away", || {
        seq += 1;
        let a = post(&server, &[], &message([11; 16], seq).encode_to_vec());
        let done = a.status == 503;
        last = Some(a);
        done
    });
    let a = last.unwrap();
    let retry: u64 = a.header("Retry-After").unwrap().parse().unwrap();
    assert!(retry > 0);

    rt.block_on(async {
        ws.send(Message::Binary(message([12; 16], 2).encode_to_vec().into()))
            .await
            .unwrap();
        let answer = next_answer(&mut ws).await;
        let err = answer.error_response.expect("an error response");
        assert_eq!(
            err.r#type,
            agent_opamp::proto::ServerErrorResponseType::Unavailable as i32
        );
        match err.details {
            Some(agent_opamp::proto::server_error_response::Details::RetryInfo(r)) => {
                assert!(r.retry_after_nanoseconds > 0);
            }
            other => panic!("no RetryInfo: {other:?}"),
        }
        let code = loop {
            match ws.next().await {
                Some(Ok(Message::Close(Some(frame)))) => break u16::from(frame.code),
                Some(Ok(_)) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        };
        assert_eq!(code, 1013);
    });

    pg.start_server();
    wait_until(LONG, "answers again once the database is back", || {
        seq += 1;
        post(&server, &[], &message([11; 16], seq).encode_to_vec()).status == 200
    });
}

/// The client's `events.jsonl` (node_client.js), one JSON object a line.
fn events(out: &Path) -> Vec<Value> {
    read_file(&out.join("events.jsonl"))
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The Node client honours a real `503` + `Retry-After` from the server (the fleet
/// database away): after the refused send it says nothing for the time it was told (at
/// least its own 30 s floor), though its heartbeat is 1 s; then it is answered again.
#[test]
fn the_node_client_honours_a_503_and_its_retry_after() {
    let ctx = TestContext::new();
    let pg = e2e::Postgres::start();
    let server = server_on(&ctx, &pg);
    let out = ctx.path("node");
    start_client(&ctx, &server, "node", &out);
    wait_until(LONG, "the Node client's first answered send", || {
        events(&out).iter().any(|e| e["event"] == "send_success")
    });
    pg.stop();
    let mut refused = Value::Null;
    wait_until(LONG, "a send refused with a Retry-After", || {
        refused = events(&out)
            .into_iter()
            .find(|e| e["event"] == "send_fail" && e["retry_after_ms"].is_number())
            .unwrap_or(Value::Null);
        !refused.is_null()
    });
    let log = read_file(&out.join("events.jsonl"));
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("503"),
        "{log}"
    );
    let wait_s = refused["retry_after_ms"].as_f64().unwrap() / 1000.0;
    assert!(wait_s >= 30.0, "{log}");
    let at = refused["time"].as_f64().unwrap();
    // The client counts the wait from when it sent the refused request (the server may
    // take a few seconds to find its database gone), which was after its last answer.
    let sent_after = events(&out)
        .iter()
        .filter(|e| e["event"] == "send_success")
        .filter_map(|e| e["time"].as_f64())
        .filter(|&t| t < at)
        .fold(0.0, f64::max);
    pg.start_server();
    wait_until(
        Duration::from_secs(wait_s as u64 + 60),
        "the Node client answered again",
        || {
            events(&out)
                .iter()
                .any(|e| e["event"] == "send_success" && e["time"].as_f64() > Some(at))
        },
    );
    let log = read_file(&out.join("events.jsonl"));
    let next = events(&out)
        .iter()
        .filter(|e| e["event"] == "send_success" || e["event"] == "send_fail")
        .filter_map(|e| e["time"].as_f64())
        .find(|&t| t > at)
        .unwrap();
    // Its events carry the time it handled an answer, not when the request went out: on
    // a loaded machine (three tests at a time) a send began up to a second or two before
    // the event of the one it overlapped was written (seen: 0.7 s early by this count).
    // Against its 1 s heartbeat, 28 s of silence is still the 30 s it was told.
    assert!(
        next - sent_after >= wait_s - 2.0,
        "the client sent again {:.1}s after its refused request, told to wait {wait_s}s\n{log}",
        next - sent_after
    );
}

/// OpAMP agents follow deployments as native agents do: their non-identifying
/// attributes are their labels, so one saying `env=prod` is offered prod's pinned
/// release (downloaded by name) while another is offered the fleet's current one.
#[test]
fn an_opamp_agents_attributes_choose_its_deployment_and_the_release_offered() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    ctx.two_releases(&key);
    let public = public.display().to_string();
    let server = ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );
    e2e::run_ok(e2e::release_cmd(&ctx, &server, ADMIN, &["publish"]).arg(ctx.path("b1")));
    e2e::run_ok(
        ctx.cmd("update-server")
            .args(["deployment", "create", "prod", "--selector", "env=prod"])
            .args([
                "--release",
                "1.0.0+1",
                "--server",
                &server.url(""),
                "--token",
                ADMIN,
            ]),
    );
    e2e::run_ok(e2e::release_cmd(&ctx, &server, ADMIN, &["publish"]).arg(ctx.path("b2")));

    let agent = |uid: [u8; 16], seq: u64, env: Option<&str>| {
        let mut m = described(uid, seq, "deployed");
        m.capabilities |= AgentCapabilities::AcceptsPackages as u64
            | AgentCapabilities::ReportsPackageStatuses as u64;
        if let (Some(env), Some(d)) = (env, m.agent_description.as_mut()) {
            d.non_identifying_attributes.push(kv("env", env));
        }
        m
    };
    let offered = |uid: [u8; 16], env: Option<&str>| {
        let mut seq = 0;
        let mut offer = None;
        wait_until(LONG, "a package offer", || {
            seq += 1;
            let a = post(&server, &[], &agent(uid, seq, env).encode_to_vec());
            assert_eq!(a.status, 200, "{}", a.text());
            offer = ServerToAgent::decode(a.body.as_slice())
                .unwrap()
                .packages_available;
            offer.is_some()
        });
        offer.unwrap().packages["agent"].clone()
    };
    let prod = offered([7; 16], Some("prod"));
    assert_eq!(prod.version, "1.0.0+1");
    let url = &prod.file.as_ref().unwrap().download_url;
    assert!(url.contains("release=1.0.0%2B1"), "{url}");
    let other = offered([8; 16], None);
    assert_eq!(other.version, "2.0.0+2");
    assert!(
        !other
            .file
            .as_ref()
            .unwrap()
            .download_url
            .contains("release="),
        "{other:?}"
    );
    let rows = admin_agents(server.port, ADMIN);
    let deployment_of = |uid: [u8; 16]| {
        row(&rows, &uuid_text(uid)).map(|r| r["deployment"].as_str().unwrap_or("?").to_owned())
    };
    assert_eq!(deployment_of([7; 16]).as_deref(), Some("prod"));
    assert_eq!(deployment_of([8; 16]).as_deref(), Some("default"));
}
