//! Handler tests: the router driven with `oneshot`, no socket, one test per status code
//! and per directive policy.

use agent_protocol::settings::VarMap;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use update_server::{AppState, Config, app, build_state};

use e2e::TestContext;

struct Fixture {
    _ctx: TestContext,
    state: AppState,
}

/// A server state over a published 2.2.0+1234 bundle, with `env` settings.
fn fixture(env: &[(&str, &str)], publish: bool) -> Fixture {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("dist");
    let bundle = ctx.pack(&dist, "2.2.0", "1234", &key, "out");
    let home = ctx.path("home");
    let mut vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.push((
        "UPDATE_SERVER_SERVER_HOME".into(),
        home.display().to_string(),
    ));
    let config = Config::load(None, &VarMap(vars)).unwrap();
    if publish {
        let dir = config.download_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&bundle, dir.join("agent-bundle-2.2.0")).unwrap();
        std::fs::copy(
            format!("{}.minisig", bundle.display()),
            dir.join("agent-bundle-2.2.0.minisig"),
        )
        .unwrap();
    }
    let state = runtime().block_on(build_state(&config)).unwrap();
    Fixture { _ctx: ctx, state }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn call(f: &Fixture, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    runtime().block_on(async {
        let resp = app(f.state.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    })
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn register(version: &str, body: &str) -> Request<Body> {
    register_as(version, body, None)
}

/// A register with the agent's credentials, as an agent sends every call after its first.
fn register_as(version: &str, body: &str, token: Option<&str>) -> Request<Body> {
    let mut req = Request::post("/agent/register")
        .header("Agent-Version", version)
        .header("Content-Type", "application/json");
    if let Some(token) = token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    req.body(Body::from(body.to_owned())).unwrap()
}

/// The credentials issued in an answer.
fn token_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {body}"))
        .to_owned()
}

const HELLO: &str = r#"{"id":"0190f0a0-0000-7000-8000-000000000001","name":"host1","platform":"x86_64-unknown-linux-gnu"}"#;

#[test]
fn version_and_download_status_codes() {
    let f = fixture(&[], true);
    let (status, headers, body) = call(&f, get("/agentupdate/version"));
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("agent.latest.version=2.2.0\nagent.latest.build-number=1234\n"),
        "{body}"
    );
    assert_eq!(headers["cache-control"], "no-store");

    let (status, headers, _) = call(&f, get("/agentupdate/download"));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"agent-bundle-2.2.0\""
    );
    for h in ["etag", "last-modified", "content-length"] {
        assert!(headers.contains_key(h), "{h} missing");
    }
    assert_eq!(headers["accept-ranges"], "bytes");
    let etag = headers["etag"].to_str().unwrap().to_owned();

    let ranged = Request::get("/agentupdate/download")
        .header("Range", "bytes=0-9")
        .body(Body::empty())
        .unwrap();
    let (status, headers, _) = call(&f, ranged);
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(headers["content-length"], "10");

    let stale = Request::get("/agentupdate/download")
        .header("Range", "bytes=0-9")
        .header("If-Range", "\"other\"")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        call(&f, stale).0,
        StatusCode::OK,
        "If-Range with another ETag gets the whole file"
    );

    let beyond = Request::get("/agentupdate/download")
        .header("Range", "bytes=999999999-")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&f, beyond).0, StatusCode::RANGE_NOT_SATISFIABLE);

    let same = Request::get("/agentupdate/download")
        .header("If-None-Match", etag)
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&f, same).0, StatusCode::NOT_MODIFIED);

    let head = Request::head("/agentupdate/download")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(&f, head);
    assert_eq!((status, body.len()), (StatusCode::OK, 0));
}

#[test]
fn no_bundle_is_503_with_a_reason() {
    let f = fixture(&[], false);
    for path in ["/agentupdate/version", "/agentupdate/download"] {
        let (status, headers, body) = call(&f, get(path));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(headers.contains_key("retry-after"));
        assert!(body.contains("no bundle to serve"), "{body}");
    }
}

#[test]
fn limit_zero_is_403() {
    let f = fixture(&[("UPDATE_SERVER_DOWNLOADS_LIMIT", "0")], true);
    assert_eq!(
        call(&f, get("/agentupdate/download")).0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&f, get("/agentupdate/download.minisig")).0,
        StatusCode::OK
    );
}

#[test]
fn directive_exact() {
    let f = fixture(&[], true);
    let (status, _, body) = call(&f, register("2.2.0+1234", HELLO));
    assert_eq!(status, StatusCode::OK);
    let token = token_of(&body);
    let register = |version: &str, body: &str| register_as(version, body, Some(&token));
    let (status, _, body) = call(&f, register("2.2.0+1235", HELLO));
    assert_eq!(status, StatusCode::CONFLICT, "other build");
    assert!(
        !body.contains("\"token\""),
        "a second token was issued: {body}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "agent_not_supported");
    assert_eq!(v["expected"], "2.2.0+1234");
    assert_eq!(v["download"], "/agentupdate/download");
    assert_eq!(
        call(&f, register("2.1.0+1234", HELLO)).0,
        StatusCode::CONFLICT,
        "other version"
    );
    assert_eq!(
        call(&f, register("garbage", HELLO)).0,
        StatusCode::BAD_REQUEST
    );
    let no_header = Request::post("/agent/connect")
        .header("Content-Type", "application/json")
        .body(Body::from(HELLO))
        .unwrap();
    assert_eq!(call(&f, no_header).0, StatusCode::BAD_REQUEST);
    assert_eq!(
        call(&f, register("2.2.0+1234", "{not json")).0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        call(&f, register("2.2.0+1234", r#"{"id":"x"}"#)).0,
        StatusCode::BAD_REQUEST,
        "missing fields"
    );
    let huge = format!(
        r#"{{"id":"x","name":"{}","platform":"p"}}"#,
        "a".repeat(70 * 1024)
    );
    assert_eq!(
        call(&f, register("2.2.0+1234", &huge)).0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
}

#[test]
fn an_agents_own_secret_is_adopted_so_a_lost_answer_costs_nothing() {
    let f = fixture(&[], true);
    let secret = "5e".repeat(32);
    let (status, _, body) = call(&f, register_as("2.2.0+1234", HELLO, Some(&secret)));
    assert_eq!(status, StatusCode::OK, "{body}");
    // Nothing to send back: the agent already holds its credentials.
    assert!(!body.contains("\"token\""), "{body}");
    // The answer was lost: the retry proves the same secret and is answered again.
    let (status, _, body) = call(&f, register_as("2.2.0+1234", HELLO, Some(&secret)));
    assert_eq!(status, StatusCode::OK, "the retry: {body}");
    // A stranger with the id and no secret, or another one, is refused.
    assert_eq!(
        call(&f, register("2.2.0+1234", HELLO)).0,
        StatusCode::UNAUTHORIZED
    );
    let other = "7a".repeat(32);
    assert_eq!(
        call(&f, register_as("2.2.0+1234", HELLO, Some(&other))).0,
        StatusCode::UNAUTHORIZED
    );
    // A weak secret is never adopted: such an id gets a token from the server instead.
    let weak = HELLO.replace("000000000001", "000000000002");
    let (status, _, body) = call(&f, register_as("2.2.0+1234", &weak, Some("password")));
    assert_eq!(status, StatusCode::OK, "{body}");
    let issued = token_of(&body);
    assert_ne!(issued, "password");
    assert_eq!(
        call(&f, register_as("2.2.0+1234", &weak, Some("password"))).0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&f, register_as("2.2.0+1234", &weak, Some(&issued))).0,
        StatusCode::OK
    );
}

#[test]
fn directive_same_minor_and_requirement() {
    let f = fixture(&[("UPDATE_SERVER_AGENTS_ACCEPT", "same-minor")], true);
    let (status, _, body) = call(&f, register("2.2.9+1", HELLO));
    assert_eq!(status, StatusCode::OK);
    let token = token_of(&body);
    assert_eq!(
        call(&f, register_as("2.3.0+1234", HELLO, Some(&token))).0,
        StatusCode::CONFLICT
    );
    let f = fixture(&[("UPDATE_SERVER_AGENTS_ACCEPT", ">=2.1, <2.3")], true);
    let (status, _, body) = call(&f, register("2.1.4+9", HELLO));
    assert_eq!(status, StatusCode::OK);
    let token = token_of(&body);
    assert_eq!(
        call(&f, register_as("2.0.0+1", HELLO, Some(&token))).0,
        StatusCode::CONFLICT
    );
}

#[test]
fn reports_from_any_version_are_listed_for_admins() {
    let f = fixture(&[("UPDATE_SERVER_ADMIN_TOKEN", "t0k3n")], true);
    let (_, _, body) = call(&f, register("2.1.0+1100", HELLO));
    let token = token_of(&body);
    let report = r#"{"id":"0190f0a0-0000-7000-8000-000000000001","from":"2.1.0+1100","to":"2.2.0+1234","status":"INSTALLED","error":null}"#;
    let req = Request::post("/agentupdate/report")
        .header("Content-Type", "application/json")
        .header("Authorization", format!("Bearer {token}"))
        .body(Body::from(report))
        .unwrap();
    assert_eq!(call(&f, req).0, StatusCode::OK);
    let bad = Request::post("/agentupdate/report")
        .header("Content-Type", "application/json")
        .body(Body::from(r#"{"id":"x","status":"DONE"}"#))
        .unwrap();
    assert_eq!(call(&f, bad).0, StatusCode::BAD_REQUEST);

    assert_eq!(call(&f, get("/admin/agents")).0, StatusCode::UNAUTHORIZED);
    let list = Request::get("/admin/agents?status=INSTALLED")
        .header("Authorization", "Bearer t0k3n")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(&f, list);
    assert_eq!(status, StatusCode::OK);
    let agents: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(agents[0]["version"], "2.2.0+1234");
    assert_eq!(agents[0]["update_status"], "INSTALLED");
    assert_eq!(agents[0]["name"], "host1");
    let (_, _, metrics) = call(&f, get("/metrics"));
    assert!(
        metrics.contains("agentupdate_agents{version=\"2.2.0+1234\"} 1"),
        "{metrics}"
    );
}

#[test]
fn admin_api_off_without_token() {
    let f = fixture(&[], true);
    let (status, _, body) = call(&f, get("/admin/settings"));
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("admin API is off"), "{body}");
}

#[test]
fn install_script_names_the_release_and_no_secret() {
    let f = fixture(
        &[
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", "s3cret-enroll"),
            ("UPDATE_SERVER_ADMIN_TOKEN", "s3cret-admin"),
        ],
        true,
    );
    let (status, headers, body) = call(&f, get("/install.sh"));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["cache-control"], "no-store");
    assert!(body.starts_with("#!/bin/sh\n"), "{body}");
    let platform = agent_protocol::layout::PLATFORM;
    assert!(
        body.lines()
            .any(|l| l.starts_with(&format!("BUNDLES='{platform} "))
                && l.ends_with(
                    " /agentupdate/download /agentupdate/download.minisig agent-bundle-2.2.0'"
                )),
        "{body}"
    );
    assert!(body.contains("\nENROLLMENT_REQUIRED=yes\n"));
    assert!(!body.contains("s3cret"), "a secret in the script");

    let check = |token: Option<&str>| {
        let mut req = Request::get("/install/check-enrollment");
        if let Some(token) = token {
            req = req.header("Enrollment-Token", token);
        }
        call(&f, req.body(Body::empty()).unwrap())
    };
    let (status, _, body) = check(Some("s3cret-enroll"));
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    let (status, _, body) = check(Some("wrong"));
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.starts_with("refused\nthe enrollment token is wrong"),
        "{body}"
    );
    let (_, _, body) = check(None);
    assert!(body.starts_with("refused\n"), "{body}");
}

#[test]
fn install_script_without_a_bundle_offers_nothing() {
    let f = fixture(&[], false);
    let (status, _, body) = call(&f, get("/install.sh"));
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\nBUNDLES=''\n"), "{body}");
    assert!(body.contains("\nENROLLMENT_REQUIRED=no\n"));
    let (_, _, body) = call(&f, get("/install/check-enrollment"));
    assert_eq!(body, "ok\n");
}
