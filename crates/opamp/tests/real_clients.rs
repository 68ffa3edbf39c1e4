//! Messages captured from the two registry clients (PyPI opentelemetry-opamp-client
//! 0.5b0 and npm @elastic/opamp-client-node 0.5.0, run by tests/clients/*), decoded
//! and decided on as the server will: proof that the generated types read what the
//! real clients write, and that their quirks raise no false alarms.
//!
//! Both clients ran with service.name `{python,node}-opamp-test`, host.name `vm` and
//! agent.group `canary`, against a server that offered a configuration of hash
//! 32aba49d… and answered the Node client's second request with a 503.

#![allow(clippy::unwrap_used, reason = "a test: a panic is the failure report")]

use agent_opamp::answer::{self, Offers, SERVER_CAPABILITIES};
use agent_opamp::codec::{self, ContentEncoding};
use agent_opamp::proto::{AgentCapabilities, ServerToAgent};
use agent_opamp::session::{Contact, Observation, observe};
use agent_opamp::view::{AgentView, ConfigStatus, config_files_hash};
use prost::Message;

const CONFIG_HASH: &str = "32aba49dd008941db715d15dabc0824b15ed14e5435d2dc2c3f544baa374c431";

/// Python: its first message (full state at sequence 0).
const PY_FIRST: &str = "0a1001a20989057c7268ad90057ff5473bc41a510a230a0c736572766963652e6e616d6512130a11707974686f6e2d6f70616d702d7465737412110a09686f73742e6e616d6512040a02766d12170a0b6167656e742e67726f757012080a0663616e617279208760";
/// Python: the full state sent after applying the configuration (status APPLIED and
/// the files as effective configuration).
const PY_APPLIED: &str = "0a1001a20989057c7268ad90057ff5473bc410011a510a230a0c736572766963652e6e616d6512130a11707974686f6e2d6f70616d702d7465737412110a09686f73742e6e616d6512040a02766d12170a0b6167656e742e67726f757012080a0663616e617279208760325f0a5d0a2b0a086170702e6a736f6e121f0a117b2273616d706c696e67223a20302e357d120a746578742f706c61696e0a2e0a0e636f6c6c6563746f722e79616d6c121c0a0e7265636569766572733a207b7d0a120a746578742f706c61696e3a240a2032aba49dd008941db715d15dabc0824b15ed14e5435d2dc2c3f544baa374c4311001";
/// Python: a heartbeat (sequence 2).
const PY_HEARTBEAT: &str = "0a1001a20989057c7268ad90057ff5473bc41002208760";
/// Python: the AgentDisconnect its stop() sends; atexit sends a second one.
const PY_BYE_1: &str = "0a1001a20989057c7268ad90057ff5473bc410052087604a00";
const PY_BYE_2: &str = "0a1001a20989057c7268ad90057ff5473bc410062087604a00";

/// Node: its first message (sequence 1, with an empty RemoteConfigStatus).
const NODE_FIRST: &str = "0a1001a20989377f72ed894abad149b5664f10011a4f0a210a0c736572766963652e6e616d6512110a0f6e6f64652d6f70616d702d7465737412110a09686f73742e6e616d6512040a02766d12170a0b6167656e742e67726f757012080a0663616e6172792083603a00";
/// Node: its report of the configuration (sequence 2; the server answered 503).
const NODE_APPLIED_2: &str = "0a1001a20989377f72ed894abad149b5664f10022083603a240a2032aba49dd008941db715d15dabc0824b15ed14e5435d2dc2c3f544baa374c4311001";
/// Node: the retry 30 s later takes a new number (3), same content.
const NODE_APPLIED_3: &str = "0a1001a20989377f72ed894abad149b5664f10032083603a240a2032aba49dd008941db715d15dabc0824b15ed14e5435d2dc2c3f544baa374c4311001";

fn decode(hex_body: &str) -> agent_opamp::proto::AgentToServer {
    let bytes = hex::decode(hex_body).unwrap();
    codec::decode_http_body(
        &bytes,
        ContentEncoding::Identity,
        codec::DEFAULT_MAX_MESSAGE,
    )
    .unwrap()
}

/// Feeds bodies as HTTP requests; the 503 case never reaches the model.
fn run(bodies: &[&str]) -> Vec<Observation> {
    let mut stored: Option<AgentView> = None;
    bodies
        .iter()
        .map(|b| {
            let msg = decode(b);
            let o = observe(
                stored.as_ref(),
                Contact {
                    message: &msg,
                    first_on_connection: true,
                    uid_in_use_elsewhere: false,
                },
            )
            .unwrap();
            stored = Some(o.view.clone());
            o
        })
        .collect()
}

#[test]
fn python_client_messages() {
    let obs = run(&[PY_FIRST, PY_APPLIED, PY_HEARTBEAT]);
    assert_eq!(
        obs[0].uid.to_string(),
        "01a20989-057c-7268-ad90-057ff5473bc4"
    );
    let v = &obs[0].view;
    assert_eq!(v.sequence_num, Some(0));
    assert_eq!(v.capabilities, 0x3007);
    assert!(v.has(AgentCapabilities::AcceptsRemoteConfig));
    assert!(!v.has(AgentCapabilities::AcceptsPackages));
    let d = v.description.as_ref().unwrap();
    assert_eq!(d.service_name(), Some("python-opamp-test"));
    assert_eq!(d.get("host.name"), Some("vm"));
    assert_eq!(v.group(), "canary");
    // Sequence 0 without the remote config status it promises: a fresh start.
    assert!(obs.iter().all(|o| !o.report_full_state));

    let v = &obs[1].view;
    let rc = v.remote_config.as_ref().unwrap();
    assert_eq!(rc.status_of(CONFIG_HASH), Some(ConfigStatus::Applied));
    let eff = v.effective_config.as_ref().unwrap();
    assert_eq!(eff.files, ["app.json", "collector.yaml"]);
    assert_eq!(
        eff.hash,
        config_files_hash([
            ("app.json", &br#"{"sampling": 0.5}"#[..]),
            ("collector.yaml", &b"receivers: {}\n"[..]),
        ])
    );
    assert!(obs[1].changes.remote_config && obs[1].changes.effective_config);
    // The heartbeat keeps all of it.
    assert_eq!(obs[2].view.remote_config, obs[1].view.remote_config);
    assert!(!obs[2].changes.any());
}

#[test]
fn python_client_says_goodbye_twice() {
    let obs = run(&[PY_FIRST, PY_BYE_1, PY_BYE_2]);
    // Sequence 0 then 5: the client's counter ran on (it had sent four more).
    assert!(obs[1].disconnected && obs[2].disconnected);
    assert!(!obs[1].view.online && !obs[2].view.online);
    assert!(!obs[1].report_full_state && !obs[2].report_full_state);
}

#[test]
fn python_retry_of_the_first_message_is_not_a_gap() {
    // Its retries re-send the same bytes: sequence 0 twice.
    let obs = run(&[PY_FIRST, PY_FIRST]);
    assert!(!obs[1].report_full_state);
}

#[test]
fn node_client_messages_and_the_503_gap() {
    let obs = run(&[NODE_FIRST, NODE_APPLIED_3]);
    let v = &obs[0].view;
    assert_eq!(
        obs[0].uid.to_string(),
        "01a20989-377f-72ed-894a-bad149b5664f"
    );
    assert_eq!(v.sequence_num, Some(1));
    assert_eq!(v.capabilities, 0x3003);
    assert_eq!(v.group(), "canary");
    assert_eq!(
        v.description.as_ref().unwrap().service_name(),
        Some("node-opamp-test")
    );
    let rc = v.remote_config.as_ref().unwrap();
    assert_eq!((rc.hash.as_str(), rc.status), ("", None));
    assert!(!obs[0].report_full_state);
    // Sequence 2 was refused with 503 before the model saw it; 3 is a gap, and the
    // client answers ReportFullState with a full message at once.
    assert!(obs[1].report_full_state);
    assert_eq!(
        obs[1]
            .view
            .remote_config
            .as_ref()
            .unwrap()
            .status_of(CONFIG_HASH),
        Some(ConfigStatus::Applied)
    );

    let obs = run(&[NODE_FIRST, NODE_APPLIED_2]);
    assert!(!obs[1].report_full_state);
}

#[test]
fn answers_the_clients_can_use() {
    let files = [
        ("app.json", &br#"{"sampling": 0.5}"#[..]),
        ("collector.yaml", &b"receivers: {}\n"[..]),
    ];
    let hash = config_files_hash(files);
    let offers = || Offers {
        remote_config: Some(answer::remote_config(files, &hash).unwrap()),
        packages: None,
        connection_settings: None,
    };
    let first = decode(NODE_FIRST);
    let obs = run(&[NODE_FIRST]);
    let a = answer::answer(&first.instance_uid, &obs[0], offers());
    // Node drops answers whose uid is not its own, byte for byte.
    assert_eq!(a.instance_uid, first.instance_uid);
    assert_eq!(a.capabilities, SERVER_CAPABILITIES);
    let rc = a.remote_config.as_ref().unwrap();
    // Node refuses to report a status without a hash.
    assert_eq!(hex::encode(&rc.config_hash), hash);
    // Python parses only files it is told are JSON.
    assert_eq!(
        rc.config.as_ref().unwrap().config_map["app.json"].content_type,
        "application/json"
    );

    let body = codec::encode_http_body(&a, false).unwrap();
    assert_eq!(ServerToAgent::decode(body.as_slice()).unwrap(), a);
}
