//! The fleet page: its session and CSRF rules driven with `oneshot`, then the real server
//! in a real headless Chromium (sign in, counts, escaping, filters, Halt and Resume, sign
//! out), and curl for what a browser would not send.

use std::process::Command;
use std::time::{Duration, Instant};

use agent_protocol::settings::VarMap;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use update_server::{Config, build_state, page_options, web};

use e2e::webdriver::Browser;
use e2e::{ServerProc, TOKEN, TestContext, admin_agents, http, http_with_body, wait_until};

const SCRIPT_NAME: &str = "<script>alert(1)</script>";
const IMG_NAME: &str = "<img src=x onerror=alert(1)>";

// ---------------------------------------------------------------------------------
// Handler tests: the page's router over a real state, no socket.

struct Handlers {
    _ctx: TestContext,
    router: axum::Router,
}

async fn handlers() -> Handlers {
    let ctx = TestContext::new();
    let vars = vec![
        (
            "UPDATE_SERVER_SERVER_HOME".to_owned(),
            ctx.path("home").display().to_string(),
        ),
        ("UPDATE_SERVER_ADMIN_TOKEN".to_owned(), TOKEN.to_owned()),
    ];
    let config = Config::load(None, &VarMap(vars)).unwrap();
    let state = build_state(&config).await.unwrap();
    Handlers {
        _ctx: ctx,
        router: web::router(state, page_options(&config)),
    }
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

impl Answer {
    fn cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.starts_with(&format!("{name}=")))
            .map(str::to_owned)
    }

    /// The value a `Set-Cookie` gave `name`.
    fn cookie_value(&self, name: &str) -> String {
        let c = self
            .cookie(name)
            .unwrap_or_else(|| panic!("no {name} cookie set: {:?}", self.headers));
        c[name.len() + 1..].split(';').next().unwrap().to_owned()
    }

    /// The value of the first hidden `csrf` field.
    fn csrf(&self) -> String {
        hidden_csrf(&self.body)
    }
}

pub(crate) fn hidden_csrf(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in {html}"));
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

async fn send(router: &axum::Router, req: Request<Body>) -> Answer {
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn get(path: &str, cookie: &str) -> Request<Body> {
    Request::get(path)
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap()
}

fn post(path: &str, cookie: &str, form: &str, extra: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::post(path)
        .header(header::HOST, "127.0.0.1:7080")
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (k, v) in extra {
        r = r.header(*k, *v);
    }
    r.body(Body::from(form.to_owned())).unwrap()
}

/// Signs in through the form; the session cookie and its CSRF token.
async fn sign_in(router: &axum::Router) -> (String, String) {
    let form = send(router, get("/", "")).await;
    let nonce = form.cookie_value("fleet_signin");
    let signed = send(
        router,
        post(
            "/signin",
            &format!("fleet_signin={nonce}"),
            &format!("csrf={}&token={TOKEN}", form.csrf()),
            &[],
        ),
    )
    .await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
    let cookie = format!("fleet_session={}", signed.cookie_value("fleet_session"));
    let home = send(router, get("/", &cookie)).await;
    assert_eq!(home.status, StatusCode::OK);
    (cookie, home.csrf())
}

#[tokio::test]
async fn signed_out_the_root_is_the_sign_in_form_under_a_strict_policy() {
    let h = handlers().await;
    let a = send(&h.router, get("/", "")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("<form method=\"post\" action=\"/signin\">"));
    assert!(
        a.body
            .contains("type=\"password\" id=\"token\" name=\"token\"")
    );
    let csp = a.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    let nonce = a.cookie("fleet_signin").unwrap();
    assert!(
        nonce.contains("HttpOnly") && nonce.contains("SameSite=Strict"),
        "{nonce}"
    );
    for path in ["/agents", "/agents/x", "/rollouts"] {
        let a = send(&h.router, get(path, "")).await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(a.headers[header::LOCATION], "/", "{path}");
    }
    let css = send(&h.router, get("/static/fleet.css", "")).await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
}

#[tokio::test]
async fn sign_in_needs_the_forms_csrf_and_the_right_token_and_wrong_ones_are_slowed() {
    let h = handlers().await;
    let form = send(&h.router, get("/", "")).await;
    let nonce = form.cookie_value("fleet_signin");
    let jar = format!("fleet_signin={nonce}");
    let csrf = form.csrf();

    let no_csrf = send(
        &h.router,
        post("/signin", &jar, &format!("token={TOKEN}"), &[]),
    )
    .await;
    assert_eq!(no_csrf.status, StatusCode::FORBIDDEN);
    assert!(no_csrf.cookie("fleet_session").is_none());
    let no_cookie = send(
        &h.router,
        post("/signin", "", &format!("csrf={csrf}&token={TOKEN}"), &[]),
    )
    .await;
    assert_eq!(no_cookie.status, StatusCode::FORBIDDEN);
    let forged = send(
        &h.router,
        post(
            "/signin",
            &jar,
            &format!("csrf={csrf}&token={TOKEN}"),
            &[("origin", "https://evil.example")],
        ),
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);

    let started = Instant::now();
    let wrong = send(
        &h.router,
        post("/signin", &jar, &format!("csrf={csrf}&token=guess"), &[]),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(
        started.elapsed() >= web::WRONG_TOKEN_DELAY,
        "a wrong token is slowed"
    );
    assert!(wrong.cookie("fleet_session").is_none());
    assert!(wrong.body.contains("not the admin token"));

    let right = send(
        &h.router,
        post("/signin", &jar, &format!("csrf={csrf}&token={TOKEN}"), &[]),
    )
    .await;
    assert_eq!(right.status, StatusCode::SEE_OTHER);
    assert_eq!(right.headers[header::LOCATION], "/");
    let session = right.cookie("fleet_session").unwrap();
    assert!(
        session.contains("HttpOnly") && session.contains("SameSite=Strict"),
        "{session}"
    );
    assert!(!session.contains(TOKEN), "the token is not the cookie");
}

#[tokio::test]
async fn buttons_refuse_a_missing_or_wrong_csrf_a_foreign_origin_and_a_cookie_replayed_after_sign_out()
 {
    let h = handlers().await;
    let (cookie, csrf) = sign_in(&h.router).await;
    let refused = |a: &Answer, what: &str| {
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{what}: {}", a.body);
    };
    refused(
        &send(&h.router, post("/rollouts/halt", &cookie, "", &[])).await,
        "no csrf",
    );
    refused(
        &send(&h.router, post("/rollouts/halt", &cookie, "csrf=0000", &[])).await,
        "wrong csrf",
    );
    refused(
        &send(
            &h.router,
            post(
                "/rollouts/halt",
                &cookie,
                &format!("csrf={csrf}"),
                &[("origin", "http://evil.example")],
            ),
        )
        .await,
        "another origin",
    );
    refused(
        &send(
            &h.router,
            post(
                "/rollouts/halt",
                &cookie,
                &format!("csrf={csrf}"),
                &[("sec-fetch-site", "cross-site")],
            ),
        )
        .await,
        "a cross-site form",
    );
    refused(
        &send(
            &h.router,
            post("/rollouts/halt", "", &format!("csrf={csrf}"), &[]),
        )
        .await,
        "no session",
    );
    // With everything in order the button reaches the rollout, which has nothing to halt.
    let through = send(
        &h.router,
        post(
            "/rollouts/halt",
            &cookie,
            &format!("csrf={csrf}"),
            &[
                ("origin", "http://127.0.0.1:7080"),
                ("sec-fetch-site", "same-origin"),
            ],
        ),
    )
    .await;
    assert_eq!(through.status, StatusCode::CONFLICT, "{}", through.body);
    assert!(
        through.body.contains("there is no rollout"),
        "{}",
        through.body
    );

    refused(
        &send(&h.router, post("/signout", &cookie, "", &[])).await,
        "sign-out without csrf",
    );
    let out = send(
        &h.router,
        post("/signout", &cookie, &format!("csrf={csrf}"), &[]),
    )
    .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(out.cookie("fleet_session").unwrap().contains("Max-Age=0"));
    refused(
        &send(
            &h.router,
            post("/rollouts/halt", &cookie, &format!("csrf={csrf}"), &[]),
        )
        .await,
        "a replayed cookie after sign-out",
    );
    let page = send(&h.router, get("/agents", &cookie)).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
}

// ---------------------------------------------------------------------------------
// The real server, in a real browser.

/// Registers (or, with its `token`, connects) an agent of 1.0.0+1 over plain HTTP; the
/// credential token a first register hands out.
fn register(server: &ServerProc, id: &str, name: &str, group: &str, token: &str) -> String {
    let body =
        json!({"id": id, "name": name, "platform": "x86_64-unknown-linux-gnu", "group": group});
    let bearer = (!token.is_empty()).then_some(token);
    let a = e2e::agent_post(
        server,
        "/agent/register",
        "1.0.0+1",
        bearer,
        &body.to_string(),
    );
    assert!(
        a.status == 200 || a.status == 409,
        "{}: {}",
        a.status,
        a.text()
    );
    let v: Value = serde_json::from_slice(&a.body).unwrap();
    v["token"].as_str().unwrap_or_default().to_owned()
}

/// Posts `body` to `path` as the agent of 1.0.0+1 whose credential is `token`; fails
/// the test unless it is taken.
fn agent_post(server: &ServerProc, path: &str, token: &str, body: &Value) {
    let auth = format!("Bearer {token}");
    let a = http_with_body(
        server.port,
        "POST",
        path,
        &[
            ("Agent-Version", "1.0.0+1"),
            ("Content-Type", "application/json"),
            ("Authorization", &auth),
        ],
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
}

/// An admin API call with the page's admin token.
fn admin(server: &ServerProc, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let body = body.map(Value::to_string).unwrap_or_default();
    e2e::admin_call(server, TOKEN, method, path, body)
}

fn report_failed(server: &ServerProc, id: &str, token: &str, error: &str) {
    let body = json!({"id": id, "from": "1.0.0+1", "to": "2.0.0+2", "status": "INSTALL_FAILED", "error": error});
    agent_post(server, "/agentupdate/report", token, &body);
}

/// Stores a one-file configuration set for `group`; its hash.
fn push_config(server: &ServerProc, group: &str) -> String {
    let body = json!({"files": {"app.conf": "answer = 42\n"}});
    let (status, v) = admin(
        server,
        "PUT",
        &format!("/admin/config/{group}"),
        Some(&body),
    );
    assert_eq!(status, 200, "{v}");
    v["hash"].as_str().unwrap().to_owned()
}

fn config_failed(server: &ServerProc, id: &str, token: &str, hash: &str, error: &str) {
    let body = json!({"id": id, "hash": hash, "status": "FAILED", "error": error});
    agent_post(server, "/agent/config-status", token, &body);
}

/// The state of `group`'s config rollout, as `/admin/config` says it.
fn config_state(server: &ServerProc, group: &str) -> String {
    let (_, v) = admin(server, "GET", "/admin/config", None);
    v["sets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|set| set["group"] == group)
        .and_then(|set| set["state"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn rollout_state(server: &ServerProc) -> String {
    let (_, v) = admin(server, "GET", "/admin/rollout", None);
    v["state"].as_str().unwrap_or_default().to_owned()
}

fn sign_in_browser(b: &Browser, server: &ServerProc, token: &str) {
    b.goto(&server.url("/"));
    let field = b.find("form[action='/signin'] input[type=password][name=token]");
    b.type_into(&field, token);
    b.click(&b.find("form[action='/signin'] button[type=submit]"));
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_operator_signs_in_sees_the_fleet_halts_and_resumes_its_rollout_and_signs_out() {
    e2e::require_tool("curl");
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d"), "2.0.0", "2", &key, "b");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            // The one failure reported below must not halt it: the test halts it.
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "100%"),
            // Nobody heartbeats here: every agent is stale 6 s after it registered.
            ("UPDATE_SERVER_AGENTS_HEARTBEAT", "2"),
        ],
    );
    ctx.publish_served(&server, &bundle);

    // A small fleet, two of whose names are markup, one of which failed with markup.
    let token = register(&server, "agent-script", SCRIPT_NAME, "", "");
    report_failed(
        &server,
        "agent-script",
        &token,
        "<script>alert(2)</script> disk full",
    );
    register(&server, "agent-img", IMG_NAME, "", "");
    let mut canary_token = String::new();
    for i in 0..60 {
        let group = if i < 5 { "canary" } else { "" };
        let token = register(
            &server,
            &format!("agent-{i:03}"),
            &format!("web-{i:03}"),
            group,
            "",
        );
        if i == 0 {
            canary_token = token;
        }
    }
    // A configuration set for the canary group, which agent-000 fails to apply.
    let hash = push_config(&server, "canary");
    register(&server, "agent-000", "web-000", "canary", &canary_token);
    config_failed(
        &server,
        "agent-000",
        &canary_token,
        &hash,
        "<b>bad</b> line 3",
    );
    let listed = admin_agents(server.port, TOKEN);
    assert_eq!(listed.len(), 62);
    wait_until(Duration::from_secs(20), "the rollout to run", || {
        rollout_state(&server) == "running"
    });

    let b = Browser::start(&ctx);

    // A wrong token is refused and signs no one in.
    sign_in_browser(&b, &server, "not-the-token");
    b.wait_text("p.error", "not the admin token");
    assert!(b.try_find("form[action='/signout']").is_none());

    sign_in_browser(&b, &server, TOKEN);
    assert_eq!(b.text(&b.wait_for("#total")), listed.len().to_string());
    let cookie = b
        .cookies()
        .into_iter()
        .find(|c| c["name"] == "fleet_session")
        .unwrap();
    assert_eq!(cookie["httpOnly"], true, "{cookie}");
    assert_eq!(cookie["sameSite"], "Strict", "{cookie}");
    assert!(
        !b.url().contains(TOKEN),
        "the token is never in a URL: {}",
        b.url()
    );
    // The counts match the admin API's rows.
    let by_version: usize = listed.iter().filter(|a| a["version"] == "1.0.0+1").count();
    let version_row = b
        .texts("table.counts tr")
        .into_iter()
        .find(|t| t.starts_with("1.0.0+1"))
        .unwrap();
    assert!(
        version_row.contains(&by_version.to_string()),
        "{version_row}"
    );
    // Markup an agent sent is text on the page; no script ran.
    let failures = b.texts("#failures td");
    // An agent is named with the start of its id (several may share a host's name).
    assert!(
        failures
            .iter()
            .any(|t| t.starts_with(&format!("{SCRIPT_NAME} · "))),
        "{failures:?}"
    );
    assert!(
        failures
            .iter()
            .any(|t| t.contains("<script>alert(2)</script> disk full")),
        "{failures:?}"
    );
    assert_eq!(b.alert(), None, "a script ran");
    let shot = ctx.path("overview.png");
    b.screenshot(&shot);
    // Kept for a reviewer: target/page-overview.png.
    let _ = std::fs::copy(&shot, e2e::repo_root().join("target/page-overview.png"));

    // The list: search, filters, paging.
    b.goto(&server.url("/agents"));
    assert!(
        b.text(&b.find("#summary"))
            .starts_with("62 agents · page 1 of 2"),
        "{}",
        b.text(&b.find("#summary"))
    );
    assert_eq!(b.texts("#agents tbody tr").len(), 50);
    b.click(&b.find("a[rel=next]"));
    b.wait_url("/agents?page=2");
    assert_eq!(b.texts("#agents tbody tr").len(), 12);
    let names = b.texts("#agents tbody td:first-child");
    assert!(names.iter().any(|n| n == IMG_NAME), "{names:?}");
    assert_eq!(b.alert(), None, "a script ran");
    b.goto(&server.url("/agents?group=canary"));
    assert_eq!(b.texts("#agents tbody tr").len(), 5);
    // The form keeps the group and adds the search.
    let search = b.find("input[name=q]");
    b.type_into(&search, "WEB-003");
    b.click(&b.find("form.filters button[type=submit]"));
    wait_until(Duration::from_secs(30), "the search to be sent", || {
        b.url().contains("q=WEB-003")
    });
    assert!(b.url().contains("group=canary"), "{}", b.url());
    assert_eq!(b.texts("#agents tbody td:first-child"), ["web-003"]);
    b.goto(&server.url("/agents?q=WEB-05"));
    let names = b.texts("#agents tbody td:first-child");
    assert_eq!(
        names,
        [
            "web-050", "web-051", "web-052", "web-053", "web-054", "web-055", "web-056", "web-057",
            "web-058", "web-059"
        ]
    );
    b.goto(&server.url("/agents?status=INSTALL_FAILED"));
    assert_eq!(b.texts("#agents tbody td:first-child"), [SCRIPT_NAME]);

    // The configuration failure, counted and explained, as text.
    b.goto(&server.url("/agents?config=FAILED"));
    assert_eq!(b.texts("#agents tbody td:first-child"), ["web-000"]);
    assert!(
        b.source().contains("&lt;b&gt;bad&lt;/b&gt; line 3"),
        "{}",
        b.source()
    );

    // One agent's page, its id in the path.
    b.goto(&server.url("/agents/agent-script"));
    assert!(b.source().contains("disk full"));
    assert_eq!(b.alert(), None, "a script ran");

    // A POST without the CSRF field, with the session's own cookie, is refused.
    let session = format!("fleet_session={}", cookie["value"].as_str().unwrap());
    assert_eq!(
        curl(&["-X", "POST", "-b", &session, &server.url("/rollouts/halt")]),
        "403"
    );
    assert_eq!(rollout_state(&server), "running");

    // A forged form on another site, clicked by the signed-in operator: refused.
    let forged = format!(
        "<form method=post action='{}'><input type=hidden name=csrf value=forged><button>Halt</button></form>",
        server.url("/rollouts/halt")
    );
    b.goto(&format!(
        "data:text/html,{}",
        forged.replace(' ', "%20").replace('#', "%23")
    ));
    b.click(&b.find("button"));
    b.wait_text("p.error", "refused");
    assert_eq!(rollout_state(&server), "running");

    // Halt, then Resume, with the buttons.
    b.goto(&server.url("/rollouts"));
    assert!(b.text(&b.find("#state")).contains("running"));
    assert!(b.try_find("form[method=post] button").is_some());
    b.click(&b.find("form[action='/rollouts/halt'] button"));
    b.wait_text("#state", "halted");
    assert_eq!(rollout_state(&server), "halted");
    assert!(b.try_find("form[action='/rollouts/halt']").is_none());
    b.click(&b.find("form[action='/rollouts/resume'] button"));
    b.wait_text("#state", "running");
    assert_eq!(rollout_state(&server), "running");

    // Silent for three heartbeats: stale, counted and listed.
    wait_until(
        Duration::from_secs(20),
        "the silent agents to be stale",
        || {
            b.goto(&server.url("/"));
            b.text(&b.find("#stale")) == "62"
        },
    );
    b.goto(&server.url("/agents?stale=1"));
    assert!(
        b.text(&b.find("#summary"))
            .starts_with("62 matching of 62 agents"),
        "{}",
        b.text(&b.find("#summary"))
    );

    // The canary group's config rollout has its own buttons, calling the config API.
    assert_eq!(config_state(&server, "canary"), "running");
    b.goto(&server.url("/rollouts"));
    b.click(&b.find("form[action='/rollouts/config/canary/halt'] button"));
    b.wait_for("form[action='/rollouts/config/canary/resume']");
    assert_eq!(config_state(&server, "canary"), "halted");
    assert_eq!(
        rollout_state(&server),
        "running",
        "the bundle's rollout is another"
    );
    b.click(&b.find("form[action='/rollouts/config/canary/resume'] button"));
    b.wait_for("form[action='/rollouts/config/canary/halt']");
    assert_eq!(config_state(&server, "canary"), "running");

    // Sign out: the page is gone, and the old cookie with it.
    b.click(&b.find("form[action='/signout'] button"));
    b.wait_for("form[action='/signin']");
    b.goto(&server.url("/rollouts"));
    assert!(
        b.try_find("form[action='/signin']").is_some(),
        "{}",
        b.source()
    );
    assert_eq!(curl(&["-b", &session, &server.url("/agents")]), "303");
    assert_eq!(
        curl(&[
            "-X",
            "POST",
            "-b",
            &session,
            "-d",
            "csrf=anything",
            &server.url("/rollouts/halt")
        ]),
        "403"
    );
}

// ---------------------------------------------------------------------------------
// Scale: 10,000 simulated agents.

/// Signs in with `token` over plain HTTP; the session cookie.
pub(crate) fn http_sign_in(port: u16, token: &str) -> String {
    let form = http(port, "GET", "/", &[]).unwrap();
    let nonce = form
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| v.strip_prefix("fleet_signin="))
        .map(|v| v.split(';').next().unwrap().to_owned())
        .unwrap();
    let body = format!("csrf={}&token={token}", hidden_csrf(&form.text()));
    let jar = format!("fleet_signin={nonce}");
    let signed = http_with_body(
        port,
        "POST",
        "/signin",
        &[
            ("Cookie", &jar),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(signed.status, 303, "{}", signed.text());
    signed
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| v.strip_prefix("fleet_session="))
        .map(|v| format!("fleet_session={}", v.split(';').next().unwrap()))
        .unwrap()
}

/// The fastest of five answers to `path`, and the last answer's body.
fn fastest(port: u16, path: &str, cookie: &str) -> (Duration, String) {
    let mut best = Duration::MAX;
    let mut body = String::new();
    for _ in 0..5 {
        let start = Instant::now();
        let a = http(port, "GET", path, &[("Cookie", cookie)]).unwrap();
        best = best.min(start.elapsed());
        assert_eq!(a.status, 200, "{path}: {}", a.text());
        body = a.text();
    }
    (best, body)
}

#[test]
fn ten_thousand_agents_the_overview_counts_them_all_and_a_filtered_list_pages_them() {
    const AGENTS: usize = 10_000;
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url(""), "--agents", &AGENTS.to_string()])
        .args(["--heartbeat", "600s", "--ramp", "20s", "--duration", "300s"])
        .args(["--group", "canary=0.1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    ctx.spawn(sim);
    wait_until(
        Duration::from_secs(180),
        "10,000 agents to register",
        || e2e::admin_agents_answered(server.port, TOKEN).is_some_and(|a| a.len() == AGENTS),
    );

    let cookie = http_sign_in(server.port, TOKEN);
    let (overview, body) = fastest(server.port, "/", &cookie);
    assert!(
        body.contains(&format!("<span class=\"big\" id=\"total\">{AGENTS}</span>")),
        "{body}"
    );
    let (list, body) = fastest(
        server.port,
        "/agents?q=sim&version=1.0.0%2B1&group=canary&page=2",
        &cookie,
    );
    assert!(body.contains("page 2 of"), "{body}");
    assert_eq!(body.matches("<td class=\"id\">").count(), 50, "{body}");
    // Said, not asserted: a timed test on a shared machine is a coin toss (it failed
    // at 474 ms with the suite beside it and took 33 ms alone); speed is the
    // benchmarks' to measure.
    eprintln!("10,000 agents: overview {overview:?}, filtered list {list:?}");
}

/// The Remove button of an agent's page is a POST like the others: without its CSRF
/// field it is refused; with it, the fleet list follows.
#[tokio::test]
async fn remove_needs_the_forms_csrf() {
    let h = handlers().await;
    let (cookie, csrf) = sign_in(&h.router).await;
    let path = "/agents/0190f0a0-0000-7000-8000-000000000009/remove";
    let bare = send(&h.router, post(path, &cookie, "", &[])).await;
    assert_eq!(bare.status, StatusCode::FORBIDDEN);
    let forged = send(&h.router, post(path, &cookie, "csrf=0000", &[])).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let done = send(&h.router, post(path, &cookie, &format!("csrf={csrf}"), &[])).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.headers[header::LOCATION], "/agents");
}

/// The deployments on the page, in Chromium (the deployments issue): each with its
/// selector, release and rollout, halted and resumed with its own buttons while
/// `default`'s stays as it is, and each agent listed with the deployment it follows.
#[test]
fn deployments_show_on_the_page_and_their_buttons_steer_only_their_rollout() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    ctx.two_releases(&key);
    let public = public.display().to_string();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );
    e2e::run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")));
    e2e::run_ok(
        ctx.cmd("update-server")
            .args(["deployment", "create", "prod", "--selector", "env=prod"])
            .args([
                "--release",
                "1.0.0+1",
                "--waves",
                "1,100%",
                "--wave-wait",
                "3600",
            ])
            .args(["--server", &server.url(""), "--token", TOKEN]),
    );
    let prod_token = register(&server, "agent-p", "web-prod", "", "");
    register(&server, "agent-d", "web-default", "", "");
    let (status, body) = e2e::admin_call(
        &server,
        TOKEN,
        "POST",
        "/admin/agents/agent-p/labels",
        r#"{"set": {"env": "prod"}}"#,
    );
    assert_eq!(status, 200, "{body}");
    e2e::run_ok(
        e2e::release_cmd(&ctx, &server, TOKEN, &["publish", "--deployment", "prod"])
            .arg(ctx.path("b2")),
    );
    let prod_state = || {
        let (_, d) = e2e::admin_call(&server, TOKEN, "GET", "/admin/deployments/prod", "");
        (
            d["release"].as_str().unwrap_or("").to_owned(),
            d["rollout"]["state"].as_str().unwrap_or("").to_owned(),
        )
    };
    // Its agent is told 2.0.0+2 at its next contact, and does not report: it runs on.
    wait_until(
        Duration::from_secs(60),
        "prod's rollout of 2.0.0+2 to run",
        || {
            register(&server, "agent-p", "web-prod", "", &prod_token);
            prod_state() == ("2.0.0+2".to_owned(), "running".to_owned())
        },
    );

    let b = Browser::start(&ctx);
    sign_in_browser(&b, &server, TOKEN);
    b.goto(&server.url("/rollouts"));
    let heading = b.text(&b.wait_for("#deployment-prod"));
    assert!(
        heading.contains("env=prod") && heading.contains("release 2.0.0+2"),
        "{heading}"
    );
    let default_before = rollout_state(&server);
    b.click(&b.find("form[action='/rollouts/deployment/prod/halt'] button"));
    wait_until(Duration::from_secs(30), "prod halted", || {
        prod_state().1 == "halted"
    });
    b.wait_text("#deployments", "halted");
    assert_eq!(
        rollout_state(&server),
        default_before,
        "default's rollout moved"
    );
    b.click(&b.find("form[action='/rollouts/deployment/prod/resume'] button"));
    wait_until(Duration::from_secs(30), "prod running again", || {
        prod_state().1 == "running"
    });

    // Each agent with the deployment it follows.
    b.goto(&server.url("/agents"));
    let rows = b.texts("#agents tbody tr");
    assert!(
        rows.iter()
            .any(|r| r.contains("web-prod") && r.contains("prod")),
        "{rows:?}"
    );
    assert!(
        rows.iter()
            .any(|r| r.contains("web-default") && r.contains("default")),
        "{rows:?}"
    );
    assert_eq!(b.alert(), None, "a script ran");
}

/// The agent view's Restart buttons, in Chromium (the commands issue, item 1): each asks
/// its command of that agent through the page's form (CSRF), the admin API lists it as
/// the agent's last command, and the audit log says it came from the page.
#[test]
fn the_agent_views_restart_buttons_ask_a_restart_of_that_agent() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    register(&server, "agent-r", "web-restart", "", "");
    register(&server, "agent-q", "web-quiet", "", "");
    let last_command = |id: &str| {
        admin_agents(server.port, TOKEN)
            .into_iter()
            .find(|a| a["id"] == id)
            .map(|a| a["last_command"].clone())
            .unwrap_or(Value::Null)
    };

    let b = Browser::start(&ctx);
    sign_in_browser(&b, &server, TOKEN);
    b.goto(&server.url("/agents/agent-r"));
    b.click(&b.find("form.restart-workload button"));
    wait_until(
        Duration::from_secs(30),
        "the workload restart asked",
        || last_command("agent-r")["argument"] == "workload",
    );
    let asked = last_command("agent-r");
    assert_eq!(asked["kind"], "restart", "{asked}");
    b.goto(&server.url("/agents/agent-r"));
    b.click(&b.find("form.restart button"));
    wait_until(Duration::from_secs(30), "the agent restart asked", || {
        last_command("agent-r")["argument"] == "agent"
    });
    assert_eq!(
        last_command("agent-q"),
        Value::Null,
        "another agent was asked"
    );
    let (status, audit) = e2e::admin_call(
        &server,
        TOKEN,
        "GET",
        "/admin/audit?action=agent.restart",
        "",
    );
    assert_eq!(status, 200, "{audit}");
    let entries = audit["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{audit}");
    assert!(
        entries
            .iter()
            .all(|e| e["outcome"] == "done" && e["details"]["via"] == "page"),
        "{audit}"
    );
    assert_eq!(b.alert(), None, "a script ran");
}
