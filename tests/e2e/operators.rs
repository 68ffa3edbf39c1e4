//! Operators (issue 35): named tokens with roles, refused where their role may not go
//! (the API and the page, a forged form included), revoked at once on every server of a
//! PostgreSQL fleet, and every change in the audit log under the right name, tokens in
//! no log.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::{
    Postgres, ServerProc, TestContext, http, http_with_body, read_file, run_ok, stdout, wait_until,
};
use serde_json::Value;

const BOOT: &str = "bootstrap-admin-token-0123456789";
const LONG: Duration = Duration::from_secs(60);

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `METHOD path` with `token`: the status and the JSON answered.
fn api(server: &ServerProc, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    e2e::admin_call(server, token, method, path, body)
}

fn rollout_state(server: &ServerProc) -> String {
    let (status, r) = api(server, "GET", "/admin/rollout", BOOT, "");
    assert_eq!(status, 200, "{r}");
    r["state"].as_str().unwrap_or_default().to_owned()
}

/// `update-server ARGS --server URL --token TOKEN`, which must succeed; its stdout.
fn cli(ctx: &TestContext, server: &ServerProc, token: &str, args: &[&str]) -> String {
    let mut cmd = ctx.cmd("update-server");
    cmd.args(args)
        .arg("--server")
        .arg(server.url(""))
        .arg("--token")
        .arg(token);
    stdout(&run_ok(&mut cmd)).trim().to_owned()
}

/// A made-up agent on 1.0.0+1 registers (its credentials are returned) or connects.
fn hello(server: &ServerProc, path: &str, id: &str, token: &str) -> String {
    let body =
        format!(r#"{{"id":"{id}","name":"host-{id}","platform":"x86_64-unknown-linux-gnu"}}"#);
    let auth = bearer(token);
    let mut headers = vec![
        ("Agent-Version", "1.0.0+1"),
        ("Content-Type", "application/json"),
    ];
    if !token.is_empty() {
        headers.push(("Authorization", &auth));
    }
    let answer = http_with_body(
        server.port,
        "POST",
        &format!("/agent/{path}"),
        &headers,
        body.as_bytes(),
    )
    .unwrap();
    assert!(
        matches!(answer.status, 200 | 409),
        "{path}: {}",
        answer.text()
    );
    let json: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    json["token"].as_str().unwrap_or_default().to_owned()
}

/// A browser's sign-in, with curl and a cookie jar: the session cookie's jar.
struct Browser {
    jar: std::path::PathBuf,
    base: String,
}

impl Browser {
    fn new(ctx: &TestContext, server: &ServerProc, name: &str) -> Self {
        Self {
            jar: ctx.path(&format!("{name}.cookies")),
            base: server.url(""),
        }
    }

    fn curl(&self, args: &[&str]) -> (u16, String) {
        let out = run_ok(
            Command::new("curl")
                .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "-c"])
                .arg(&self.jar)
                .arg("-b")
                .arg(&self.jar)
                .args(args),
        );
        let text = stdout(&out);
        let (body, code) = text.trim_end().rsplit_once('\n').unwrap_or(("", "0"));
        (code.parse().unwrap_or(0), body.to_owned())
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.curl(&[&format!("{}{path}", self.base)])
    }

    fn post(&self, path: &str, form: &[(&str, &str)]) -> (u16, String) {
        let mut args = vec![format!("{}{path}", self.base)];
        for (k, v) in form {
            args.push("--data-urlencode".into());
            args.push(format!("{k}={v}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.curl(&args)
    }

    /// The value of the first hidden `csrf` field of `html`.
    fn csrf(html: &str) -> String {
        let at = html
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no CSRF field in\n{html}"));
        let rest = &html[at + "name=\"csrf\" value=\"".len()..];
        rest[..rest.find('"').unwrap()].to_owned()
    }

    fn sign_in(&self, token: &str) {
        let (_, form) = self.get("/");
        let (status, _) = self.post("/signin", &[("csrf", &Self::csrf(&form)), ("token", token)]);
        assert_eq!(status, 303, "signing in");
    }
}

fn audit(server: &ServerProc) -> Vec<Value> {
    let (status, answer) = api(server, "GET", "/admin/audit?per_page=500", BOOT, "");
    assert_eq!(status, 200, "{answer}");
    answer["entries"].as_array().cloned().unwrap_or_default()
}

fn find<'a>(entries: &'a [Value], who: &str, action: &str, outcome: &str) -> Option<&'a Value> {
    entries
        .iter()
        .find(|e| e["who"] == who && e["action"] == action && e["outcome"] == outcome)
}

fn assert_no_token_in(log: &Path, tokens: &[&str]) {
    let text = read_file(log);
    for token in tokens {
        assert!(
            !text.contains(token),
            "a token is in {}:\n{text}",
            log.display()
        );
    }
}

#[test]
fn roles_are_enforced_on_the_api_and_the_page_and_every_change_is_audited() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", BOOT),
            ("UPDATE_SERVER_SERVER_NAME", "east"),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    ctx.publish_served(&server, &b1);
    // Two machines on 1.0.0; then 2.0.0: the first wave (one of them) is told to update
    // and stays pending, so the rollout runs.
    let agents: Vec<(String, String)> = ["a1", "a2"]
        .iter()
        .map(|id| (id.to_string(), hello(&server, "register", id, "")))
        .collect();
    ctx.republish(&server, &b2);
    wait_until(LONG, "the rollout of 2.0.0 to run", || {
        let (_, r) = api(&server, "GET", "/admin/rollout", BOOT, "");
        r["version"] == "2.0.0+2" && r["state"] == "running"
    });
    // Told now (a report counts only from an agent the rollout told).
    for (id, token) in &agents {
        hello(&server, "connect", id, token);
    }

    let vera = cli(
        &ctx,
        &server,
        BOOT,
        &["token", "create", "--name", "vera", "--role", "viewer"],
    );
    let oscar = cli(
        &ctx,
        &server,
        BOOT,
        &["token", "create", "--name", "oscar", "--role", "operator"],
    );
    assert_eq!(vera.len(), 64, "{vera}");
    let listed = cli(&ctx, &server, BOOT, &["token", "list"]);
    assert!(
        listed.contains("vera") && listed.contains("oscar"),
        "{listed}"
    );
    assert!(
        !listed.contains(&vera) && !listed.contains(&oscar),
        "{listed}"
    );

    // A viewer reads, and may not halt or make tokens; an operator may not make tokens.
    assert_eq!(api(&server, "GET", "/admin/agents", &vera, "").0, 200);
    let (status, refusal) = api(&server, "POST", "/admin/rollout/halt", &vera, "");
    assert_eq!(status, 403, "{refusal}");
    assert!(
        refusal["error"].as_str().unwrap().contains("viewer"),
        "{refusal}"
    );
    assert_eq!(rollout_state(&server), "running");
    let new_token = r#"{"name":"mallory","role":"admin"}"#;
    assert_eq!(
        api(&server, "POST", "/admin/tokens", &vera, new_token).0,
        403
    );
    assert_eq!(
        api(&server, "POST", "/admin/tokens", &oscar, new_token).0,
        403
    );
    assert_eq!(api(&server, "GET", "/admin/tokens", &oscar, "").0, 403);

    // The page: the viewer sees no Halt button, and a forged halt with a valid CSRF
    // token is refused and changes nothing.
    let viewer = Browser::new(&ctx, &server, "vera");
    viewer.sign_in(&vera);
    let (status, page) = viewer.get("/rollouts");
    assert_eq!(status, 200);
    assert!(
        !page.contains(">Halt</button>"),
        "a viewer sees a Halt button:\n{page}"
    );
    let (status, refused) = viewer.post("/rollouts/halt", &[("csrf", &Browser::csrf(&page))]);
    assert_eq!(status, 403, "{refused}");
    assert!(refused.contains("viewer"), "{refused}");
    assert_eq!(rollout_state(&server), "running");

    // The operator halts from the page, and resumes with the API.
    let operator = Browser::new(&ctx, &server, "oscar");
    operator.sign_in(&oscar);
    let (_, page) = operator.get("/rollouts");
    assert!(page.contains(">Halt</button>"), "{page}");
    let (status, _) = operator.post("/rollouts/halt", &[("csrf", &Browser::csrf(&page))]);
    assert_eq!(status, 303);
    assert_eq!(rollout_state(&server), "halted");
    assert_eq!(
        api(&server, "POST", "/admin/rollout/resume", &oscar, "").0,
        200
    );
    assert_eq!(rollout_state(&server), "running");

    // A configuration set pushed from the CLI with the operator's token.
    let set = ctx.path("set");
    fs::create_dir_all(&set).unwrap();
    fs::write(set.join("exporter.yml"), "scrape: 15s\n").unwrap();
    cli(
        &ctx,
        &server,
        &oscar,
        &[
            "config",
            "push",
            "--group",
            "default",
            set.to_str().unwrap(),
        ],
    );

    // The first wave's machine fails: the server halts the rollout by itself.
    let rows = e2e::admin_agents(server.port, BOOT);
    let first = rows
        .iter()
        .find(|a| a["wave"] == 1)
        .unwrap_or_else(|| panic!("no agent in wave 1: {rows:?}"));
    let (_, agent_token) = agents
        .iter()
        .find(|(id, _)| first["id"] == id.as_str())
        .unwrap();
    let report = format!(
        r#"{{"id":"{}","from":"1.0.0+1","to":"2.0.0+2","status":"INSTALL_FAILED","error":"exited at once"}}"#,
        first["id"].as_str().unwrap()
    );
    let auth = bearer(agent_token);
    let answer = http_with_body(
        server.port,
        "POST",
        "/agentupdate/report",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        report.as_bytes(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    wait_until(LONG, "the server to halt the rollout", || {
        rollout_state(&server) == "halted"
    });

    // The admin revokes the viewer: refused from the next request on.
    cli(&ctx, &server, BOOT, &["token", "revoke", "vera"]);
    assert_eq!(api(&server, "GET", "/admin/agents", &vera, "").0, 401);
    assert_eq!(
        viewer.get("/rollouts").0,
        303,
        "the revoked viewer's session goes on"
    );

    let entries = audit(&server);
    let shown = serde_json::to_string_pretty(&entries).unwrap();
    let push = find(&entries, "oscar", "config.push", "done")
        .unwrap_or_else(|| panic!("no config push by oscar:\n{shown}"));
    assert_eq!(push["details"]["files"][0], "exporter.yml", "{push}");
    assert_eq!(
        push["details"]["hash"].as_str().map(str::len),
        Some(64),
        "{push}"
    );
    assert_eq!(push["address"], "127.0.0.1", "{push}");
    let page_halt = find(&entries, "oscar", "rollout.halt", "done")
        .unwrap_or_else(|| panic!("no halt by oscar:\n{shown}"));
    assert_eq!(page_halt["details"]["via"], "page", "{page_halt}");
    let by_server = find(&entries, "server:east", "rollout.halt", "done")
        .unwrap_or_else(|| panic!("no halt by the server:\n{shown}"));
    assert!(
        by_server["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("exited at once") || r.contains("fail")),
        "{by_server}"
    );
    let refused = find(&entries, "vera", "rollout.halt", "refused")
        .unwrap_or_else(|| panic!("no refused halt by vera:\n{shown}"));
    assert_eq!(refused["details"]["status"], 403, "{refused}");
    let revoked = find(&entries, "admin.token", "token.revoke", "done")
        .unwrap_or_else(|| panic!("no revocation:\n{shown}"));
    assert_eq!(revoked["details"]["name"], "vera", "{revoked}");
    // Two refused halts of the viewer (the API's and the page's forged form), and her
    // attempt to make a token.
    assert!(
        find(&entries, "vera", "token.create", "refused").is_some(),
        "{shown}"
    );
    assert_eq!(
        entries
            .iter()
            .filter(|e| e["who"] == "vera"
                && e["action"] == "rollout.halt"
                && e["outcome"] == "refused")
            .count(),
        2,
        "{shown}"
    );
    // The audit page shows the same, escaped.
    let (status, html) = operator.get("/audit?who=oscar");
    assert_eq!(status, 200);
    assert!(
        html.contains("config.push") && html.contains("rollout.halt"),
        "{html}"
    );
    let cli_audit = cli(&ctx, &server, &oscar, &["audit", "--action", "rollout"]);
    assert!(cli_audit.contains("server:east"), "{cli_audit}");

    assert_no_token_in(&server.home.join("server.log"), &[BOOT, &vera, &oscar]);
    for entry in &entries {
        let text = entry.to_string();
        assert!(!text.contains(&vera) && !text.contains(&oscar) && !text.contains(BOOT));
    }
}

/// Two servers of one PostgreSQL fleet: a token made on one works on the other, and a
/// revocation on one is refused by the other on its very next request.
#[test]
fn a_revoked_token_is_refused_at_once_by_every_server_of_the_fleet() {
    let ctx = TestContext::new();
    let pg = Postgres::start();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let (a, b) = e2e::two_servers_on(&ctx, &pg, BOOT, &b1);
    let token = cli(
        &ctx,
        &a,
        BOOT,
        &["token", "create", "--name", "olga", "--role", "operator"],
    );
    assert_eq!(api(&b, "GET", "/admin/settings", &token, "").0, 200);
    assert_eq!(
        api(
            &b,
            "PATCH",
            "/admin/settings",
            &token,
            r#"{"downloads_limit": 7}"#
        )
        .0,
        200
    );
    cli(&ctx, &a, BOOT, &["token", "revoke", "olga"]);
    let revoked = Instant::now();
    let (status, answer) = api(&b, "GET", "/admin/settings", &token, "");
    let took = revoked.elapsed();
    assert_eq!(
        status, 401,
        "server b still takes the revoked token: {answer}"
    );
    eprintln!(
        "revoked on a, refused by b on the next request, {:.1} ms later",
        took.as_secs_f64() * 1000.0
    );
    // The change made on b is in the fleet's one audit log, seen from a.
    let entries = audit(&a);
    let limit = find(&entries, "olga", "settings.downloads_limit", "done")
        .unwrap_or_else(|| panic!("{entries:?}"));
    assert_eq!(limit["details"]["new"], 7);
    assert_eq!(limit["details"]["server"], "b");
    let _ = http(a.port, "GET", "/healthz", &[]);
    for s in [&a, &b] {
        assert_no_token_in(&s.home.join("server.log"), &[BOOT, &token]);
    }
}
