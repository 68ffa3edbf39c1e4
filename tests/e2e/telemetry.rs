//! Own telemetry (issue 66, item 4), end to end: an installed agent run by its supervisor
//! exports its own metrics and log lines with OTLP/HTTP (protobuf) to a real receiver on
//! loopback that decodes them, once `update-server telemetry set` names it for the agent's
//! labels, and stops once `telemetry clear` forgets it. And an OpAMP agent that declares
//! `ReportsOwnMetrics` is offered `ConnectionSettingsOffers.own_metrics`, once per change
//! (hand-made protobuf: neither registry OpAMP client reports its own telemetry).

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_opamp::proto::{AgentCapabilities, AgentToServer, ServerToAgent};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, admin_call, agent_logs, configure_agent,
    http_with_body, read_file, run_ok, stdout, wait_until,
};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use prost::Message as _;

use crate::rollout::{LONG, OLD};

/// One OTLP request the receiver decoded.
#[derive(Debug, Clone)]
struct Export {
    /// `metrics` or `logs`.
    signal: &'static str,
    /// The resource's `service.instance.id`.
    instance: String,
    service_name: String,
    /// Metric names, or log lines' bodies.
    items: Vec<String>,
    tenant: Option<String>,
}

/// An OTLP/HTTP receiver on loopback that decodes what it is sent with the
/// OpenTelemetry protocol's own types.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Export>>>,
    _runtime: tokio::runtime::Runtime,
}

fn attribute(attributes: &[KeyValue], key: &str) -> String {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            any_value::Value::StringValue(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .unwrap_or_default()
}

async fn take(
    State(got): State<Arc<Mutex<Vec<Export>>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let tenant = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut exports = Vec::new();
    match uri.path() {
        "/v1/metrics" => {
            let Ok(req) = ExportMetricsServiceRequest::decode(body) else {
                return StatusCode::BAD_REQUEST;
            };
            for rm in req.resource_metrics {
                let attrs = rm.resource.map(|r| r.attributes).unwrap_or_default();
                exports.push(Export {
                    signal: "metrics",
                    instance: attribute(&attrs, "service.instance.id"),
                    service_name: attribute(&attrs, "service.name"),
                    items: rm
                        .scope_metrics
                        .iter()
                        .flat_map(|s| s.metrics.iter().map(|m| m.name.clone()))
                        .collect(),
                    tenant: tenant.clone(),
                });
            }
        }
        "/v1/logs" => {
            let Ok(req) = ExportLogsServiceRequest::decode(body) else {
                return StatusCode::BAD_REQUEST;
            };
            for rl in req.resource_logs {
                let attrs = rl.resource.map(|r| r.attributes).unwrap_or_default();
                exports.push(Export {
                    signal: "logs",
                    instance: attribute(&attrs, "service.instance.id"),
                    service_name: attribute(&attrs, "service.name"),
                    items: rl
                        .scope_logs
                        .iter()
                        .flat_map(|s| s.log_records.iter())
                        .filter_map(|r| r.body.as_ref()?.value.as_ref())
                        .map(|v| match v {
                            any_value::Value::StringValue(s) => s.clone(),
                            other => format!("{other:?}"),
                        })
                        .collect(),
                    tenant: tenant.clone(),
                });
            }
        }
        _ => return StatusCode::NOT_FOUND,
    }
    got.lock().unwrap().extend(exports);
    StatusCode::OK
}

impl Receiver {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let got: Arc<Mutex<Vec<Export>>> = Arc::default();
        let app = axum::Router::new()
            .fallback(axum::routing::post(take))
            .with_state(Arc::clone(&got));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            got,
            _runtime: runtime,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn of(&self, instance: &str, signal: &str) -> Vec<Export> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.instance == instance && e.signal == signal)
            .cloned()
            .collect()
    }
}

fn cli(ctx: &TestContext, server: &ServerProc, args: &[&str]) -> Command {
    e2e::admin_cmd(ctx, server, TOKEN, args)
}

struct Running {
    home: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new(self.home.join("current/bin/agent-wrapper.sh"))
            .arg("stop")
            .output();
    }
}

#[test]
fn an_agent_exports_its_own_metrics_and_logs_to_the_destination_set_and_stops_when_cleared() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    let home = ctx.install(&bundle, "p");
    configure_agent(&home, &[server.url("")], "labels = { team = \"tel\" }\n");
    // The standard OTel variable: exports every 300 ms instead of every 10 s.
    fs::write(
        home.join("conf/agent-env.sh"),
        "export OTEL_METRIC_EXPORT_INTERVAL=300\n",
    )
    .unwrap();
    crate::update::start(&home);
    let running = Running { home: home.clone() };
    wait_until(LONG, "the agent to register", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == OLD)
    });
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    let receiver = Receiver::start();

    // A destination for other agents is not this one's.
    run_ok(&mut cli(
        &ctx,
        &server,
        &[
            "telemetry",
            "set",
            "--selector",
            "team=other",
            "--metrics",
            &receiver.url("/v1/metrics"),
        ],
    ));
    let set = run_ok(&mut cli(
        &ctx,
        &server,
        &[
            "telemetry",
            "set",
            "--selector",
            "team=tel",
            "--metrics",
            &receiver.url("/v1/metrics"),
            "--logs",
            &receiver.url("/v1/logs"),
            "--header",
            "X-Tenant=t1",
        ],
    ));
    assert!(stdout(&set).contains("team=tel"), "{}", stdout(&set));
    let metrics_arrive = |what: &str| {
        let start = Instant::now();
        while start.elapsed() < LONG {
            let names: BTreeSet<String> = receiver
                .of(&id, "metrics")
                .into_iter()
                .flat_map(|e| e.items)
                .collect();
            if names.contains("agent.workload.restarts") && names.contains("agent.download.bytes") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{what}: no metrics from agent {id} reached the receiver; got {:?}\n{}\n--- server.log:\n{}",
            receiver.got.lock().unwrap(),
            agent_logs(&home),
            read_file(&server.home.join("server.log"))
        );
    };
    metrics_arrive("after telemetry set");
    let first = receiver.of(&id, "metrics")[0].clone();
    assert_eq!(first.service_name, "agent");
    assert_eq!(first.tenant.as_deref(), Some("t1"), "the header goes along");
    assert!(
        fs::metadata(home.join("data/telemetry.json")).is_ok(),
        "the destination is kept"
    );
    wait_until(LONG, "the agent's log lines as OTLP logs", || {
        receiver
            .of(&id, "logs")
            .iter()
            .flat_map(|e| e.items.iter())
            .any(|line| line.contains("exporting this agent's own metrics"))
    });

    // The operator's view, with header names only.
    let list = run_ok(&mut cli(&ctx, &server, &["telemetry", "list", "--json"]));
    let list: serde_json::Value = serde_json::from_str(&stdout(&list)).unwrap();
    let ours = list["destinations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["selector"] == "team=tel")
        .cloned()
        .unwrap();
    assert_eq!(ours["headers"], serde_json::json!(["x-tenant"]), "{list}");
    let (_, audit) = admin_call(
        &server,
        TOKEN,
        "GET",
        "/admin/audit?action=telemetry.set",
        "",
    );
    assert!(audit.to_string().contains("team=tel"), "{audit}");

    // An agent that starts again exports at once, from what it kept.
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
    let before = receiver.of(&id, "metrics").len();
    crate::update::start(&home);
    wait_until(LONG, "exports from the agent started again", || {
        receiver.of(&id, "metrics").len() > before + 2
    });

    // Cleared: the agent stops exporting and forgets the destination.
    run_ok(&mut cli(
        &ctx,
        &server,
        &["telemetry", "clear", "--selector", "team=tel"],
    ));
    wait_until(LONG, "the agent to forget its destination", || {
        fs::metadata(home.join("data/telemetry.json")).is_err()
    });
    // Its last export (sent as it stops) may land a moment after.
    std::thread::sleep(Duration::from_secs(1));
    let after_clear = receiver.of(&id, "metrics").len();
    std::thread::sleep(Duration::from_secs(3));
    let late: Vec<Export> = receiver
        .of(&id, "metrics")
        .into_iter()
        .skip(after_clear)
        .collect();
    assert!(
        late.is_empty(),
        "exports went on after the destination was cleared: {late:?}\n{}",
        agent_logs(&home)
    );
    let (status, _) = admin_call(
        &server,
        TOKEN,
        "DELETE",
        "/admin/telemetry?selector=team%3Dtel",
        "",
    );
    assert_eq!(status, 404, "cleared already");
    drop(running);
}

/// `POST /v1/opamp` of `msg` (no enrollment token configured).
fn opamp_post(server: &ServerProc, msg: &AgentToServer) -> ServerToAgent {
    let answer = http_with_body(
        server.port,
        "POST",
        agent_opamp::OPAMP_PATH,
        &[("Content-Type", "application/x-protobuf")],
        &msg.encode_to_vec(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    ServerToAgent::decode(answer.body.as_slice()).unwrap()
}

#[test]
fn an_opamp_agent_that_reports_its_own_metrics_is_offered_own_metrics_once_per_change() {
    let ctx = TestContext::new();
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let reports = [
        0x01, 0x90, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0x71,
    ];
    let silent = [
        0x01, 0x90, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0x72,
    ];
    // Both carry the label the destination selects (host.name is a non-identifying
    // attribute); only one says it reports its own metrics.
    let mut msg = crate::opamp::described(reports, 1, "tel-opamp");
    msg.capabilities |= AgentCapabilities::ReportsOwnMetrics as u64;
    let mut other = crate::opamp::described(silent, 1, "tel-opamp");
    assert!(
        opamp_post(&server, &msg).connection_settings.is_none(),
        "nothing set yet"
    );
    assert!(opamp_post(&server, &other).connection_settings.is_none());

    let url = "http://127.0.0.1:9/v1/metrics";
    let body = serde_json::json!({
        "selector": "host.name=tel-opamp",
        "metrics": url,
        "headers": {"Authorization": "Bearer own"},
    });
    let (status, set) = admin_call(&server, TOKEN, "POST", "/admin/telemetry", body.to_string());
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["headers"], serde_json::json!(["authorization"]));

    msg.sequence_num = 2;
    let offered = opamp_post(&server, &msg)
        .connection_settings
        .expect("the destination is offered");
    assert!(offered.opamp.is_none(), "no OpAMP settings were asked");
    assert!(
        offered.own_logs.is_none(),
        "it does not report its own logs"
    );
    let metrics = offered.own_metrics.unwrap();
    assert_eq!(metrics.destination_endpoint, url);
    let header = &metrics.headers.unwrap().headers[0];
    assert_eq!(
        (header.key.as_str(), header.value.as_str()),
        ("authorization", "Bearer own")
    );
    msg.sequence_num = 3;
    assert!(
        opamp_post(&server, &msg).connection_settings.is_none(),
        "offered once, not at every message"
    );
    other.sequence_num = 2;
    assert!(opamp_post(&server, &other).connection_settings.is_none());

    // Cleared: told to stop, once.
    let (status, _) = admin_call(
        &server,
        TOKEN,
        "DELETE",
        "/admin/telemetry?selector=host.name%3Dtel-opamp",
        "",
    );
    assert_eq!(status, 200);
    msg.sequence_num = 4;
    let stop = opamp_post(&server, &msg).connection_settings.unwrap();
    assert_eq!(stop.own_metrics.unwrap().destination_endpoint, "");
    assert_ne!(stop.hash, offered.hash);
    msg.sequence_num = 5;
    assert!(opamp_post(&server, &msg).connection_settings.is_none());
}
