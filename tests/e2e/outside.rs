//! Defects found from outside (issue 64), each with the exact request that found it: an
//! anonymous report must not halt a rollout, a forgotten id is not open to anyone,
//! refused operator actions are audited, and the small ones (the database's mode, the
//! leave's address, forget-token on an agent that left).

use std::time::Duration;

use serde_json::{Value, json};

use e2e::{ServerProc, TestContext, admin_call, http_with_body, wait_until};

const ADMIN: &str = "outside-admin-token";
const ENROLL: &str = "outside-enrol";

fn platform() -> &'static str {
    agent_protocol::layout::PLATFORM
}

/// A server of `env` serving a 2.0.0+2 bundle (so a rollout runs).
fn serving(ctx: &TestContext, env: &[(&str, &str)]) -> ServerProc {
    serving_to(ctx, env, |_| {})
}

/// [`serving`], with `before` run (agents registered, say) before the bundle is served.
fn serving_to(
    ctx: &TestContext,
    env: &[(&str, &str)],
    before: impl FnOnce(&ServerProc),
) -> ServerProc {
    let (key, _) = ctx.keygen("keys");
    let first = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let bundle = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let mut all = vec![("UPDATE_SERVER_ADMIN_TOKEN", ADMIN)];
    all.extend_from_slice(env);
    let server = ctx.server("srv", &all);
    ctx.publish_served(&server, &first);
    before(&server);
    ctx.republish(&server, &bundle);
    wait_until(
        Duration::from_secs(30),
        "the rollout of 2.0.0+2 to start",
        || admin_call(&server, ADMIN, "GET", "/admin/rollout", "").1["version"] == "2.0.0+2",
    );
    server
}

fn post(server: &ServerProc, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String) {
    let mut all = vec![
        ("Content-Type", "application/json"),
        ("Agent-Version", "1.0.0+1"),
    ];
    all.extend_from_slice(headers);
    let answer =
        http_with_body(server.port, "POST", path, &all, body.to_string().as_bytes()).unwrap();
    (answer.status, answer.text())
}

fn hello(id: &str, group: &str) -> Value {
    json!({ "id": id, "name": "outsider", "platform": platform(), "group": group })
}

fn rollout(server: &ServerProc) -> Value {
    let (status, r) = admin_call(server, ADMIN, "GET", "/admin/rollout", "");
    assert_eq!(status, 200, "{r}");
    r
}

fn agents(server: &ServerProc) -> Vec<Value> {
    e2e::admin_agents(server.port, ADMIN)
}

fn audit(server: &ServerProc) -> Vec<Value> {
    let (status, answer) = admin_call(server, ADMIN, "GET", "/admin/audit?per_page=500", "");
    assert_eq!(status, 200, "{answer}");
    answer["entries"].as_array().cloned().unwrap_or_default()
}

/// Registers `id` in `group` with its own secret (as an agent does), on 1.0.0+1; the
/// answer's status.
fn register(server: &ServerProc, id: &str, group: &str, secret: &str) -> u16 {
    let auth = format!("Bearer {secret}");
    let (status, text) = post(
        server,
        "/agent/register",
        &[("Authorization", &auth)],
        &hello(id, group),
    );
    assert!(status == 200 || status == 409, "{status} {text}");
    status
}

#[test]
fn an_anonymous_report_or_config_status_is_refused_and_halts_nothing() {
    let ctx = TestContext::new();
    // A real agent on 1.0.0+1: the rollout waits for it.
    let server = serving_to(
        &ctx,
        &[("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%")],
        |server| {
            register(server, "real-1", "default", &"34".repeat(32));
        },
    );
    // The exact requests: a made-up id, the public target version, a failure.
    let report = json!({
        "id": "made-up-1", "from": "1.0.0+1", "to": "2.0.0+2",
        "status": "INSTALL_FAILED", "error": "forged",
    });
    let (status, text) = post(&server, "/agentupdate/report", &[], &report);
    assert_eq!(status, 401, "{text}");
    assert!(
        text.contains("register"),
        "the refusal says what to do: {text}"
    );
    let config = json!({
        "id": "made-up-2", "hash": "a".repeat(64), "status": "FAILED", "error": "forged",
    });
    let (status, text) = post(&server, "/agent/config-status", &[], &config);
    assert_eq!(status, 401, "{text}");
    let known: Vec<Value> = agents(&server);
    assert_eq!(known.len(), 1, "no agent was made: {known:?}");
    assert_no_failure(&rollout(&server));
}

#[test]
fn a_report_of_a_release_the_agent_was_never_told_is_not_counted() {
    let ctx = TestContext::new();
    // Wave 1 is the canary group, which stays open until its agent reports; an agent of
    // another group, known when the rollout starts, waits for wave 2, untold.
    let id = "later-1";
    let secret = "ab".repeat(32);
    let auth = format!("Bearer {secret}");
    let server = serving_to(
        &ctx,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "group:canary,100%"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "3600"),
        ],
        |server| {
            register(server, "canary-1", "canary", &"56".repeat(32));
            register(server, id, "later", &secret);
        },
    );
    let report = json!({
        "id": id, "from": "1.0.0+1", "to": "2.0.0+2",
        "status": "INSTALL_FAILED", "error": "made up by an enrolled agent",
    });
    let (status, text) = post(
        &server,
        "/agentupdate/report",
        &[("Authorization", &auth)],
        &report,
    );
    assert_eq!(status, 200, "{text}");
    // Recorded against the agent, and nothing else.
    wait_until(Duration::from_secs(20), "the report to be recorded", || {
        agents(&server)
            .iter()
            .any(|a| a["id"] == id && a["update_status"] == "INSTALL_FAILED")
    });
    assert_no_failure(&rollout(&server));
}

/// The rollout is not halted and counts no failure in any wave.
fn assert_no_failure(r: &Value) {
    assert_ne!(r["state"], "halted", "{r}");
    for wave in r["waves"].as_array().into_iter().flatten() {
        assert_eq!(wave["failed"].as_u64().unwrap_or(0), 0, "{r}");
    }
}

#[test]
fn a_forgotten_id_needs_the_enrollment_token_again() {
    let ctx = TestContext::new();
    let server = serving(&ctx, &[("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL)]);
    let real = format!("Bearer {}", "cd".repeat(32));
    let (status, text) = post(
        &server,
        "/agent/register",
        &[("Authorization", &real), ("Enrollment-Token", ENROLL)],
        &hello("e-1", "default"),
    );
    assert!(status == 200 || status == 409, "{status} {text}");

    let (status, answer) = admin_call(&server, ADMIN, "DELETE", "/admin/agents/e-1/token", "");
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["next"]
            .as_str()
            .unwrap_or_default()
            .contains("enrollment token"),
        "forget-token says what the agent must present next: {answer}"
    );
    // A stranger with its own fresh secret and no enrollment token: refused, and told why.
    let stranger = format!("Bearer {}", "ef".repeat(32));
    let (status, text) = post(
        &server,
        "/agent/register",
        &[("Authorization", &stranger)],
        &hello("e-1", "default"),
    );
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("enrollment token"), "{text}");
    // The real agent, installed with the enrollment token, is adopted again.
    let (status, text) = post(
        &server,
        "/agent/register",
        &[("Authorization", &real), ("Enrollment-Token", ENROLL)],
        &hello("e-1", "default"),
    );
    assert!(status == 200 || status == 409, "{status} {text}");
}

#[test]
fn refused_operator_actions_are_audited_with_who_where_and_why() {
    let ctx = TestContext::new();
    let server = serving(&ctx, &[]);
    let auth = format!("Bearer {ADMIN}");
    let multipart = |name: &str, body: &[u8]| -> (String, Vec<u8>) {
        let boundary = "XoutsideX";
        let mut b = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"f\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        b.extend_from_slice(body);
        (format!("multipart/form-data; boundary={boundary}"), b)
    };
    let send = |content_type: &str, body: &[u8]| {
        http_with_body(
            server.port,
            "POST",
            "/admin/releases",
            &[("Authorization", &auth), ("Content-Type", content_type)],
            body,
        )
        .unwrap()
    };
    // A 5,000-character file name: refused, and cut in the answer.
    let long = "n".repeat(5000);
    let (ct, mut body) = multipart(&long, b"bytes");
    body.extend_from_slice(b"\r\n--XoutsideX--\r\n");
    let answer = send(&ct, &body);
    assert!(answer.status >= 400, "{}", answer.text());
    assert!(
        answer.text().len() < 1500,
        "the answer is cut: {} bytes: {}",
        answer.text().len(),
        answer.text()
    );
    // A truncated body: the part never ends.
    let (ct, body) = multipart("agent-bundle-9.0.0", b"half a bundle");
    let answer = send(&ct, &body);
    assert_eq!(answer.status, 400, "{}", answer.text());
    // A rollback with a malformed body.
    let (status, _) = admin_call(
        &server,
        ADMIN,
        "POST",
        "/admin/releases/rollback",
        "{not json",
    );
    assert_eq!(status, 400);
    // A page form without a session or its CSRF token.
    let page = http_with_body(
        server.port,
        "POST",
        "/rollouts/halt",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"csrf=forged",
    )
    .unwrap();
    assert_eq!(page.status, 403, "{}", page.text());

    let entries = audit(&server);
    let shown = serde_json::to_string_pretty(&entries).unwrap();
    let refused: Vec<&Value> = entries
        .iter()
        .filter(|e| e["outcome"] == "refused")
        .collect();
    let publishes: Vec<&&Value> = refused
        .iter()
        .filter(|e| e["action"].as_str().is_some_and(|a| a.contains("release")))
        .collect();
    assert!(
        publishes.len() >= 3,
        "publish x2 and rollback refused, audited:\n{shown}"
    );
    for e in &publishes {
        assert_eq!(e["address"], "127.0.0.1", "{e}");
        assert!(
            e.to_string().len() < 2000,
            "the 5,000-character name is cut in the log: {e}"
        );
    }
    assert!(
        publishes.iter().any(|e| e["who"] == "admin.token"),
        "who is named from the bearer token:\n{shown}"
    );
    let csrf = refused
        .iter()
        .find(|e| {
            e["action"]
                .as_str()
                .is_some_and(|a| a.contains("/rollouts/halt"))
        })
        .unwrap_or_else(|| panic!("the page's CSRF refusal is audited:\n{shown}"));
    assert!(
        csrf["details"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("refused"),
        "{csrf}"
    );
}

#[test]
fn forget_token_on_an_agent_that_left_says_it_stays_revoked_and_leave_has_an_address() {
    let ctx = TestContext::new();
    let server = serving(&ctx, &[]);
    let auth = format!("Bearer {}", "12".repeat(32));
    let (status, text) = post(
        &server,
        "/agent/register",
        &[("Authorization", &auth)],
        &hello("gone-1", "default"),
    );
    assert!(status == 200 || status == 409, "{status} {text}");
    let (status, text) = post(
        &server,
        "/agent/leave",
        &[("Authorization", &auth)],
        &json!({ "id": "gone-1" }),
    );
    assert_eq!(status, 200, "{text}");
    let (status, answer) = admin_call(&server, ADMIN, "DELETE", "/admin/agents/gone-1/token", "");
    assert_eq!(status, 409, "{answer}");
    assert!(answer.to_string().contains("left the fleet"), "{answer}");
    let entries = audit(&server);
    let leave = entries
        .iter()
        .find(|e| e["action"] == "agent.leave")
        .unwrap_or_else(|| panic!("no leave in {entries:?}"));
    assert_eq!(leave["address"], "127.0.0.1", "{leave}");

    // The fleet's database holds token hashes and the audit log: its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(ctx.path("srv/fleet.db"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "fleet.db is {:o}", mode & 0o777);
}
