//! OpAMP clients that break the protocol's rules or hold the server's resources: a
//! `sequence_num` gap, a second agent claiming a live agent's instance_uid, and a
//! thousand WebSockets that open and say nothing. Each is answered as docs/opamp.md says
//! ("What the server owes the protocol"), in bounded memory, while well-behaved agents
//! are served.

use std::time::{Duration, Instant};

use agent_opamp::proto::{
    AgentCapabilities, AgentToServer, ComponentHealth, ServerToAgent, ServerToAgentFlags,
};

use crate::opamp::{WsStream, described as message, ws_connect as connect};
use e2e::{ServerProc, TestContext, admin_agents, http_with_body, wait_until};
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const ADMIN: &str = "opamp-admin";
const ENROLL: &str = "opamp-enroll";
const LONG: Duration = Duration::from_secs(60);

fn server(ctx: &TestContext, env: &[(&str, &str)]) -> ServerProc {
    let mut all = vec![
        ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
        ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
    ];
    all.extend_from_slice(env);
    ctx.server("home", &all)
}

/// The same agent with nothing new to say: every sub-message omitted.
fn heartbeat(uid: [u8; 16], seq: u64) -> AgentToServer {
    AgentToServer {
        instance_uid: uid.to_vec(),
        sequence_num: seq,
        capabilities: AgentCapabilities::ReportsStatus as u64
            | AgentCapabilities::ReportsHealth as u64,
        ..Default::default()
    }
}

fn post(port: u16, m: &AgentToServer) -> ServerToAgent {
    let auth = format!("Bearer {ENROLL}");
    let a = http_with_body(
        port,
        "POST",
        agent_opamp::OPAMP_PATH,
        &[
            ("Content-Type", "application/x-protobuf"),
            ("Authorization", auth.as_str()),
        ],
        &m.encode_to_vec(),
    )
    .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    ServerToAgent::decode(a.body.as_slice()).unwrap()
}

fn asks_full_state(a: &ServerToAgent) -> bool {
    a.flags & ServerToAgentFlags::ReportFullState as u64 != 0
}

fn row(server: &ServerProc, id: &str) -> Option<Value> {
    admin_agents(server.port, ADMIN)
        .into_iter()
        .find(|r| r["id"] == id)
}

fn uuid_text(uid: [u8; 16]) -> String {
    let hex: String = uid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[test]
fn a_sequence_gap_is_answered_with_report_full_state_and_a_retry_is_not() {
    let ctx = TestContext::new();
    let server = server(&ctx, &[]);
    let uid = [0x21; 16];
    assert!(!asks_full_state(&post(
        server.port,
        &message(uid, 1, "gappy")
    )));
    assert!(!asks_full_state(&post(server.port, &heartbeat(uid, 2))));
    // The same number again is a retry of a message, not a gap.
    assert!(!asks_full_state(&post(server.port, &heartbeat(uid, 2))));
    // Messages 3 and 4 were lost: the server cannot trust what it holds.
    assert!(asks_full_state(&post(server.port, &heartbeat(uid, 5))));
    // The full state, numbered on from there, settles it; and is what the server keeps.
    let mut full = message(uid, 6, "gappy");
    full.health = Some(ComponentHealth {
        healthy: false,
        status: "degraded after the gap".into(),
        ..Default::default()
    });
    assert!(!asks_full_state(&post(server.port, &full)));
    assert!(!asks_full_state(&post(server.port, &heartbeat(uid, 7))));
    let r = row(&server, &uuid_text(uid)).expect("the agent is listed");
    assert_eq!(r["health"]["healthy"], false, "{r}");
    assert_eq!(r["health"]["status"], "degraded after the gap", "{r}");
}

async fn exchange(ws: &mut WsStream, m: &AgentToServer) -> ServerToAgent {
    let mut framed = vec![0u8];
    framed.extend(m.encode_to_vec());
    ws.send(Message::Binary(framed.into())).await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => {
                return ServerToAgent::decode(&b[1..]).unwrap();
            }
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            other => panic!("expected an answer, got {other:?}"),
        }
    }
}

#[test]
fn a_second_agent_claiming_a_live_instance_uid_is_given_a_new_one() {
    let ctx = TestContext::new();
    let server = server(&ctx, &[]);
    let uid = [0x31; 16];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut first = connect(&server).await;
        let a = exchange(&mut first, &message(uid, 1, "first")).await;
        assert!(a.agent_identification.is_none());
        exchange(&mut first, &heartbeat(uid, 2)).await;

        // A second machine, cloned with the same uid, starting its own count.
        let mut second = connect(&server).await;
        let a = exchange(&mut second, &message(uid, 1, "second")).await;
        let new = a
            .agent_identification
            .expect("a duplicate is given a new instance_uid")
            .new_instance_uid;
        assert_eq!(new.len(), 16, "in the form the agent used");
        assert_ne!(new, uid.to_vec());
        let new: [u8; 16] = new.try_into().unwrap();

        // The live agent keeps its uid and its record: the clash was not merged into it.
        let a = exchange(&mut first, &heartbeat(uid, 3)).await;
        assert!(a.agent_identification.is_none());
        assert!(!asks_full_state(&a));
        let r = row(&server, &uuid_text(uid)).expect("the first agent is listed");
        assert_eq!(r["online"], true, "{r}");
        assert!(r.to_string().contains("first"), "{r}");
        assert!(!r.to_string().contains("second"), "{r}");

        // The second, under the uid it was given, is an agent of its own.
        let a = exchange(&mut second, &message(new, 2, "second")).await;
        assert!(a.agent_identification.is_none());
        let r = row(&server, &uuid_text(new)).expect("the second agent is listed");
        assert_eq!(r["protocol"], "opamp");
        assert!(r.to_string().contains("second"), "{r}");
        first.close(None).await.unwrap();
        second.close(None).await.unwrap();
    });
}

#[test]
fn a_thousand_silent_websockets_are_closed_and_others_served_meanwhile() {
    e2e::raise_fd_limit();
    let ctx = TestContext::new();
    // Silent sockets are closed after server.header-timeout (3 s here, 30 by default).
    let server = server(&ctx, &[("UPDATE_SERVER_SERVER_HEADER_TIMEOUT", "3")]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let before = e2e::status_kib(server.pid, "VmRSS");
        let mut silent = Vec::new();
        for _ in 0..1000 {
            silent.push(connect(&server).await);
        }
        let opened = Instant::now();
        let peak = e2e::status_kib(server.pid, "VmRSS");

        // Meanwhile a real agent over each transport is answered.
        let mut ws = connect(&server).await;
        let a = exchange(&mut ws, &message([0x41; 16], 1, "busy-ws")).await;
        assert_eq!(a.instance_uid, vec![0x41; 16]);
        let a = tokio::task::spawn_blocking({
            let port = server.port;
            move || post(port, &message([0x42; 16], 1, "busy-http"))
        })
        .await
        .unwrap();
        assert_eq!(a.instance_uid, vec![0x42; 16]);

        // Each silent socket is closed by the server, none of them answered anything.
        let mut closed = 0;
        for mut s in silent {
            let end = tokio::time::timeout(LONG, async {
                loop {
                    match s.next().await {
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                        Some(Ok(Message::Binary(_))) => return false,
                        _ => return true,
                    }
                }
            })
            .await;
            assert_eq!(
                end,
                Ok(true),
                "a silent socket was answered or never closed"
            );
            closed += 1;
        }
        assert_eq!(closed, 1000);
        assert!(
            opened.elapsed() >= Duration::from_secs(2),
            "closed before the header timeout: {:?}",
            opened.elapsed()
        );
        eprintln!("1,000 silent sockets: server RSS {before} KiB -> {peak} KiB");
        // A thousand sockets held cost little, and the server answers on.
        assert!(
            peak.saturating_sub(before) < 64 * 1024,
            "1,000 silent sockets took {} KiB",
            peak.saturating_sub(before)
        );
        let a = exchange(&mut ws, &heartbeat([0x41; 16], 2)).await;
        assert_eq!(a.instance_uid, vec![0x41; 16]);
        ws.close(None).await.unwrap();
    });
    wait_until(LONG, "both busy agents listed", || {
        let rows = admin_agents(server.port, ADMIN);
        ["busy-ws", "busy-http"]
            .iter()
            .all(|n| rows.iter().any(|r| r.to_string().contains(n)))
    });
}
