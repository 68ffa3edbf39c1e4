//! Remote configuration at the server: sets pushed through the admin API and the CLI,
//! refused with clear `400`s, delivered to agents (simulated over HTTP) in waves, once,
//! never again after `APPLIED` nor after `FAILED`; a config rollout halted by failures;
//! a bundle rollout and a config rollout side by side.

use std::collections::BTreeMap;
use std::fs;
use std::time::Duration;

use e2e::{
    Postgres, ServerProc, TOKEN, TestContext, admin_agents, http, http_with_body, metric, run_ok,
    wait_until,
};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

fn admin(server: &ServerProc, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    e2e::admin_call(server, TOKEN, method, path, body)
}

fn put_set(server: &ServerProc, group: &str, files: &BTreeMap<String, String>) -> (u16, Value) {
    let body = json!({ "files": files }).to_string();
    admin(
        server,
        "PUT",
        &format!("/admin/config/{group}"),
        body.as_bytes(),
    )
}

fn config_status(server: &ServerProc) -> Value {
    let (status, json) = admin(server, "GET", "/admin/config", b"");
    assert_eq!(status, 200, "{json}");
    json
}

fn set_of<'a>(status: &'a Value, group: &str) -> &'a Value {
    status["sets"]
        .as_array()
        .and_then(|sets| sets.iter().find(|s| s["group"] == group))
        .unwrap_or_else(|| panic!("no set for {group} in {status}"))
}

/// A server serving a bundle of `version` with `env`; its download dir is ready.
fn server_with_bundle(ctx: &TestContext, version: &str, env: &[(&str, &str)]) -> ServerProc {
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("dist"), version, "1", &key, "b");
    let mut all = vec![("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)];
    all.extend_from_slice(env);
    let server = ctx.server("home", &all);
    ctx.publish_served(&server, &bundle);
    server
}

/// An agent as the server sees it: register, connect, report, config-status over HTTP.
struct SimAgent {
    id: String,
    version: String,
    group: String,
    token: Option<String>,
    config_hash: String,
    labels: Option<Value>,
}

impl SimAgent {
    fn new(id: &str, version: &str, group: &str) -> Self {
        Self {
            id: id.into(),
            version: version.into(),
            group: group.into(),
            token: None,
            config_hash: String::new(),
            labels: None,
        }
    }

    fn with_labels(mut self, labels: Value) -> Self {
        self.labels = Some(labels);
        self
    }

    fn post(&self, server: &ServerProc, path: &str, body: &Value) -> (u16, Value) {
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![
            ("Agent-Version", self.version.as_str()),
            ("Content-Type", "application/json"),
        ];
        if let Some(b) = &bearer {
            headers.push(("Authorization", b));
        }
        let answer = http_with_body(
            server.port,
            "POST",
            path,
            &headers,
            body.to_string().as_bytes(),
        )
        .unwrap();
        let json = serde_json::from_slice(&answer.body).unwrap_or(Value::String(answer.text()));
        (answer.status, json)
    }

    /// A `connect` (the first is a `register`); the answer's status and body.
    fn connect(&mut self, server: &ServerProc) -> (u16, Value) {
        let path = if self.token.is_none() {
            "/agent/register"
        } else {
            "/agent/connect"
        };
        let mut body = json!({ "id": self.id, "name": self.id, "platform": "sim" });
        if !self.group.is_empty() {
            body["group"] = json!(self.group);
        }
        if !self.config_hash.is_empty() {
            body["config_hash"] = json!(self.config_hash);
        }
        if let Some(labels) = &self.labels {
            body["labels"] = labels.clone();
        }
        let (status, json) = self.post(server, path, &body);
        if let Some(token) = json["token"].as_str() {
            self.token = Some(token.to_owned());
        }
        assert!(status == 200 || status == 409, "{path}: {status} {json}");
        (status, json)
    }

    fn config_status(&mut self, server: &ServerProc, hash: &str, ok: bool, error: &str) {
        let body = json!({
            "id": self.id,
            "hash": hash,
            "status": if ok { "APPLIED" } else { "FAILED" },
            "error": if ok { Value::Null } else { json!(error) },
        });
        let (status, json) = self.post(server, "/agent/config-status", &body);
        assert_eq!(status, 200, "{json}");
        if ok {
            self.config_hash = hash.to_owned();
        }
    }
}

fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(n, c)| ((*n).to_owned(), (*c).to_owned()))
        .collect()
}

#[test]
fn config_sets_with_bad_names_or_over_the_limits_are_refused_with_400s() {
    let ctx = TestContext::new();
    let server = server_with_bundle(&ctx, "1.0.0", &[]);
    for (why, set) in [
        ("..", files(&[("..", "x")])),
        ("a slash", files(&[("conf/web.yml", "x")])),
        ("an absolute path", files(&[("/etc/passwd", "x")])),
        ("NUL", files(&[("a\0b", "x")])),
        ("empty", files(&[("", "x")])),
    ] {
        let (status, body) = put_set(&server, "default", &set);
        assert_eq!(status, 400, "{why}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("not a plain file name"),
            "{why}: {body}"
        );
    }
    let many: BTreeMap<String, String> = (0..65).map(|i| (format!("f{i}"), "x".into())).collect();
    let (status, body) = put_set(&server, "default", &many);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("at most 64"),
        "{body}"
    );
    let big = files(&[("big.yml", &"x".repeat(1024 * 1024 + 1))]);
    let (status, body) = put_set(&server, "default", &big);
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("1 MiB"), "{body}");
    // Not UTF-8 text: the JSON itself is refused.
    let (status, body) = admin(
        &server,
        "PUT",
        "/admin/config/default",
        b"{\"files\": {\"a\": \"\xff\xfe\"}}",
    );
    assert_eq!(status, 400, "{body}");
    // A group is a plain name too.
    let (status, body) = put_set(&server, "a%20b", &files(&[("a", "b")]));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("group"), "{body}");
    let (status, body) = put_set(&server, "a/b", &files(&[("a", "b")]));
    assert!(matches!(status, 400 | 404 | 405), "{status} {body}");
    // Nothing was stored.
    assert_eq!(config_status(&server)["sets"], json!([]));
    // And without the token, nothing at all.
    let answer = http(server.port, "GET", "/admin/config", &[]).unwrap();
    assert_eq!(answer.status, 401);
}

#[test]
fn a_set_pushed_with_the_cli_reaches_an_agent_once_and_not_again_after_applied() {
    let ctx = TestContext::new();
    let server = server_with_bundle(&ctx, "1.0.0", &[]);
    let mut agent = SimAgent::new("agent-a", "1.0.0+1", "");
    let (_, first) = agent.connect(&server);
    assert!(first.get("config").is_none(), "no set yet: {first}");

    let dir = ctx.path("conf-set");
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("web.yml"), "basic_auth_users:\n  admin: x\n").unwrap();
    fs::write(dir.join("extra.txt"), "hello\n").unwrap();
    fs::write(dir.join("sub/ignored"), "not a regular file of DIR").unwrap();
    let out = run_ok(
        ctx.cmd("update-server")
            .args(["config", "push", "--group", "default"])
            .arg(&dir)
            .args(["--server", &server.url(""), "--token", TOKEN, "--json"]),
    );
    let pushed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hash = pushed["hash"].as_str().unwrap().to_owned();
    assert_eq!(pushed["group"], "default");
    assert_eq!(hash.len(), 64);
    assert!(pushed["created_at"].as_f64().unwrap() > 0.0);
    // The same files again: the same set, no new rollout.
    let again = put_set(
        &server,
        "default",
        &files(&[
            ("web.yml", "basic_auth_users:\n  admin: x\n"),
            ("extra.txt", "hello\n"),
        ]),
    );
    assert_eq!(again.1["hash"], json!(hash), "{:?}", again);
    assert_eq!(again.1["created_at"], pushed["created_at"]);

    let (status, answer) = agent.connect(&server);
    assert_eq!(status, 200);
    assert_eq!(answer["config"]["hash"], json!(hash), "{answer}");
    assert_eq!(
        answer["config"]["files"],
        json!({ "web.yml": "basic_auth_users:\n  admin: x\n", "extra.txt": "hello\n" })
    );
    let row = &admin_agents(server.port, TOKEN)[0];
    assert_eq!(row["config_status"], "APPLYING", "{row}");

    agent.config_status(&server, &hash, true, "");
    for _ in 0..3 {
        let (status, answer) = agent.connect(&server);
        assert_eq!(status, 200);
        assert!(
            answer.get("config").is_none(),
            "re-sent after APPLIED: {answer}"
        );
    }
    let row = &admin_agents(server.port, TOKEN)[0];
    assert_eq!(row["config_hash"], json!(hash), "{row}");
    assert_eq!(row["config_status"], "APPLIED", "{row}");
    assert_eq!(row["config_error"], Value::Null, "{row}");
    wait_until(LONG, "the config rollout to complete", || {
        set_of(&config_status(&server), "default")["rollout"]["state"] == "completed"
    });

    let out = run_ok(
        ctx.cmd("update-server")
            .args(["config", "status", "--json"])
            .args(["--server", &server.url(""), "--token", TOKEN]),
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let set = set_of(&status, "default");
    assert_eq!(set["applied"], 1, "{status}");
    assert_eq!(set["applying"], 0, "{status}");
    assert_eq!(set["failed"], 0, "{status}");
    assert_eq!(set["rollout"]["state"], "completed", "{status}");
    let out = run_ok(ctx.cmd("update-server").args(["config", "status"]).args([
        "--server",
        &server.url(""),
        "--token",
        TOKEN,
    ]));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("group default") && table.contains("applied 1"),
        "{table}"
    );
    assert_eq!(metric(&server, "agentupdate_config_sent_total"), 1.0);

    // A group of its own: only its agents get its set; deleted, they get default's.
    let mut canary = SimAgent::new("agent-c", "1.0.0+1", "canary");
    let (_, answer) = canary.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(hash), "{answer}");
    let (status, body) = put_set(&server, "canary", &files(&[("web.yml", "canary\n")]));
    assert_eq!(status, 200, "{body}");
    let canary_hash = body["hash"].as_str().unwrap().to_owned();
    let (_, answer) = canary.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(canary_hash), "{answer}");
    let (_, answer) = agent.connect(&server);
    assert!(answer.get("config").is_none(), "{answer}");
    let (status, _) = admin(&server, "DELETE", "/admin/config/canary", b"");
    assert_eq!(status, 200);
    let (_, answer) = canary.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(hash), "{answer}");
    let (status, _) = admin(&server, "DELETE", "/admin/config/canary", b"");
    assert_eq!(status, 404);
}

#[test]
fn failed_sets_halt_the_config_rollout_at_max_failures_and_are_not_resent() {
    let ctx = TestContext::new();
    let server = server_with_bundle(
        &ctx,
        "1.0.0",
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    let mut agents: Vec<SimAgent> = (0..4)
        .map(|i| SimAgent::new(&format!("agent-{i}"), "1.0.0+1", ""))
        .collect();
    for a in &mut agents {
        a.connect(&server);
    }
    let (status, body) = put_set(&server, "default", &files(&[("web.yml", "broken: [")]));
    assert_eq!(status, 200, "{body}");
    let hash = body["hash"].as_str().unwrap().to_owned();
    // Wave 1 is one agent: exactly one is sent the set.
    let told: Vec<usize> = (0..agents.len())
        .filter(|&i| agents[i].connect(&server).1.get("config").is_some())
        .collect();
    assert_eq!(told.len(), 1, "wave 1 holds one agent");
    let failed = told[0];
    agents[failed].config_status(
        &server,
        &hash,
        false,
        "web.yml: yaml: line 1: did not find expected node content",
    );
    wait_until(LONG, "the config rollout to halt", || {
        set_of(&config_status(&server), "default")["rollout"]["state"] == "halted"
    });
    let status = config_status(&server);
    let set = set_of(&status, "default");
    assert_eq!(set["failed"], 1, "{status}");
    let reason = set["rollout"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("did not find expected node content"),
        "{reason}"
    );
    for (i, a) in agents.iter_mut().enumerate() {
        let (_, answer) = a.connect(&server);
        assert!(
            answer.get("config").is_none(),
            "agent {i} was sent the set after the halt (or again after FAILED): {answer}"
        );
    }
    let rows = admin_agents(server.port, TOKEN);
    let row = rows
        .iter()
        .find(|r| r["id"] == agents[failed].id.as_str())
        .unwrap();
    assert_eq!(row["config_status"], "FAILED", "{row}");
    assert!(
        row["config_error"].as_str().unwrap().contains("yaml"),
        "{row}"
    );
    assert_eq!(row["config_hash"], "", "{row}");
    assert_eq!(
        metric(
            &server,
            "agentupdate_config_rollout_halts_total{cause=\"failures\"}"
        ),
        1.0
    );
    // An operator lets it go on: the others are sent it, the failed one still is not.
    let (status, body) = admin(&server, "POST", "/admin/config/default/resume", b"");
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin(&server, "POST", "/admin/config/default/advance", b"");
    assert!(status == 200 || status == 409, "{body}");
    wait_until(LONG, "wave 2 to open", || {
        set_of(&config_status(&server), "default")["rollout"]["wave"] == 2
    });
    for (i, a) in agents.iter_mut().enumerate() {
        let (_, answer) = a.connect(&server);
        assert_eq!(
            answer.get("config").is_some(),
            i != failed,
            "agent {i}: {answer}"
        );
    }
    let (status, body) = admin(
        &server,
        "POST",
        "/admin/config/default/halt",
        b"{\"reason\": \"enough\"}",
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin(&server, "POST", "/admin/config/default/halt", b"");
    assert_eq!(status, 409, "{body}");
}

#[test]
fn a_bundle_rollout_and_a_config_rollout_side_by_side_both_complete() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let server = ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
        ],
    );
    ctx.publish_served(&server, &b1);
    let rollout = |server: &ServerProc| admin(server, "GET", "/admin/rollout", b"").1;
    wait_until(LONG, "the rollout of 1.0.0 to complete", || {
        let r = rollout(&server);
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    let mut agents: Vec<SimAgent> = (0..3)
        .map(|i| SimAgent::new(&format!("agent-{i}"), "1.0.0+1", ""))
        .collect();
    for a in &mut agents {
        assert_eq!(a.connect(&server).0, 200);
    }
    ctx.republish(&server, &b2);
    wait_until(LONG, "the rollout of 2.0.0 to start", || {
        rollout(&server)["version"] == "2.0.0+2"
    });
    let (status, body) = put_set(&server, "default", &files(&[("web.yml", "ok: true\n")]));
    assert_eq!(status, 200, "{body}");
    let hash = body["hash"].as_str().unwrap().to_owned();
    // The agents do what they are told: install on a 409, apply a set they are sent.
    wait_until(LONG, "both rollouts to complete", || {
        for a in &mut agents {
            let (status, answer) = a.connect(&server);
            if status == 409 {
                let report = json!({
                    "id": a.id, "from": a.version, "to": "2.0.0+2", "status": "INSTALLED", "error": null,
                });
                assert_eq!(a.post(&server, "/agentupdate/report", &report).0, 200);
                a.version = "2.0.0+2".into();
            } else if let Some(set) = answer.get("config") {
                assert_eq!(set["hash"], json!(hash));
                a.config_status(&server, &hash, true, "");
            }
        }
        let bundle = rollout(&server);
        let config = config_status(&server);
        bundle["state"] == "completed"
            && set_of(&config, "default")["rollout"]["state"] == "completed"
    });
    let bundle = rollout(&server);
    assert_eq!(bundle["waves"][0]["installed"], 1, "{bundle}");
    // /admin/rollout shows the config rollout beside the bundle's.
    assert_eq!(bundle["config"][0]["group"], "default", "{bundle}");
    assert_eq!(
        bundle["config"][0]["rollout"]["state"], "completed",
        "{bundle}"
    );
    assert_eq!(bundle["waves"][0]["failed"], 0, "{bundle}");
    let config = config_status(&server);
    let set = set_of(&config, "default");
    assert_eq!(set["applied"], 3, "{config}");
    assert_eq!(set["rollout"]["waves"][0]["agents"], 1, "{config}");
    for row in admin_agents(server.port, TOKEN) {
        assert_eq!(row["version"], "2.0.0+2", "{row}");
        assert_eq!(row["config_hash"], json!(hash), "{row}");
        assert_eq!(row["config_status"], "APPLIED", "{row}");
    }
}

#[test]
fn a_set_pushed_on_one_server_is_delivered_by_another_on_postgresql() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let (a, b) = e2e::two_servers_on(&ctx, &pg, TOKEN, &b1);
    let mut agent = SimAgent::new("agent-pg", "1.0.0+1", "");
    assert_eq!(agent.connect(&b).0, 200);
    let (status, body) = put_set(&a, "default", &files(&[("web.yml", "on postgres\n")]));
    assert_eq!(status, 200, "{body}");
    let hash = body["hash"].as_str().unwrap().to_owned();
    // b reads the set another server stored, and sends it.
    wait_until(LONG, "b to send the set pushed on a", || {
        agent
            .connect(&b)
            .1
            .get("config")
            .is_some_and(|c| c["hash"] == json!(hash))
    });
    agent.config_status(&b, &hash, true, "");
    wait_until(LONG, "a to count the agent's APPLIED", || {
        set_of(&config_status(&a), "default")["applied"] == 1
    });
    let (_, answer) = agent.connect(&a);
    assert!(
        answer.get("config").is_none(),
        "a re-sent the set: {answer}"
    );
    let row = &admin_agents(a.port, TOKEN)[0];
    assert_eq!(row["config_status"], "APPLIED", "{row}");
    assert_eq!(row["config_hash"], json!(hash), "{row}");
}

#[test]
fn fleet_sim_agents_apply_a_set_in_waves_and_each_is_counted_once() {
    let ctx = TestContext::new();
    let server = server_with_bundle(
        &ctx,
        "1.0.0",
        &[("UPDATE_SERVER_ROLLOUT_WAVES", "10%,50%,100%")],
    );
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url(""), "--agents", "40"])
        .args([
            "--agent-version",
            "1.0.0+1",
            "--heartbeat",
            "300ms",
            "--ramp",
            "1s",
        ])
        .args(["--duration", "60s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let pid = ctx.spawn(sim);
    wait_until(LONG, "the simulated agents to register", || {
        admin_agents(server.port, TOKEN).len() == 40
    });
    let (status, body) = put_set(&server, "default", &files(&[("web.yml", "sim\n")]));
    assert_eq!(status, 200, "{body}");
    let hash = body["hash"].as_str().unwrap().to_owned();
    wait_until(LONG, "every simulated agent to apply the set", || {
        let status = config_status(&server);
        let set = set_of(&status, "default");
        set["applied"] == 40 && set["rollout"]["state"] == "completed"
    });
    let status = config_status(&server);
    let waves = &set_of(&status, "default")["rollout"]["waves"];
    assert_eq!(waves[0]["agents"], 4, "{status}");
    assert_eq!(waves[1]["agents"], 16, "{status}");
    assert_eq!(waves[2]["agents"], 20, "{status}");
    // Opened in order, each after the one before it completed.
    for w in 1..3 {
        let opened = waves[w]["opened_at"].as_f64().unwrap();
        let before = waves[w - 1]["completed_at"].as_f64().unwrap();
        assert!(
            opened >= before,
            "wave {} opened before wave {w} completed: {status}",
            w + 1
        );
    }
    // Sent once each: the agents send its hash back and nothing is sent again.
    assert_eq!(metric(&server, "agentupdate_config_sent_total"), 40.0);
    assert_eq!(metric(&server, "agentupdate_config_status_total"), 40.0);
    for row in admin_agents(server.port, TOKEN) {
        assert_eq!(row["config_hash"], json!(hash), "{row}");
        assert_eq!(row["config_status"], "APPLIED", "{row}");
    }
    e2e::signal(pid, "TERM");
}

/// `config push --selector S` (the deployments issue, item 6): the agents a selector
/// chooses run its set before their group's, in its own config rollout; a label the
/// server sets moves an agent to it; deleted, they run their group's set again.
#[test]
fn a_set_pushed_for_a_selector_reaches_the_agents_it_chooses_before_their_groups() {
    let ctx = TestContext::new();
    let server = server_with_bundle(&ctx, "1.0.0", &[]);
    let mut prod =
        SimAgent::new("agent-p", "1.0.0+1", "canary").with_labels(json!({"env": "prod"}));
    let mut other = SimAgent::new("agent-o", "1.0.0+1", "canary");
    prod.connect(&server);
    other.connect(&server);
    let (status, body) = put_set(&server, "canary", &files(&[("web.yml", "canary\n")]));
    assert_eq!(status, 200, "{body}");
    let canary = body["hash"].as_str().unwrap().to_owned();

    let cli = |args: &[&str]| {
        let mut cmd = ctx.cmd("update-server");
        cmd.args(["config"])
            .args(args)
            .args(["--server", &server.url(""), "--token", TOKEN]);
        cmd
    };
    let refused = e2e::run_fails(&mut cli(&["push", "--selector", "env in (", "x"]), 1);
    assert!(refused.contains("column"), "{refused}");
    let dir = ctx.path("prod-set");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("web.yml"), "prod\n").unwrap();
    let said = e2e::stdout(&run_ok(
        cli(&["push", "--selector", "env in (prod)"]).arg(&dir),
    ));
    assert!(
        said.contains("for the agents of selector env in (prod)"),
        "{said}"
    );
    let key = "selector:env in (prod)";
    let selected = set_of(&config_status(&server), key)["hash"]
        .as_str()
        .unwrap()
        .to_owned();

    let (_, answer) = prod.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(selected), "{answer}");
    prod.config_status(&server, &selected, true, "");
    let (_, answer) = other.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(canary), "{answer}");
    other.config_status(&server, &canary, true, "");
    // Its rollout placed the agent it chooses, and only that one.
    wait_until(LONG, "the selector's config rollout to complete", || {
        set_of(&config_status(&server), key)["rollout"]["state"] == "completed"
    });
    let status = config_status(&server);
    let set = set_of(&status, key);
    assert_eq!(set["applied"], 1, "{set}");

    // The server labels the other agent env=prod: it follows the selector's set.
    let (status, body) = admin(
        &server,
        "POST",
        "/admin/agents/agent-o/labels",
        br#"{"set": {"env": "prod"}}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (_, answer) = other.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(selected), "{answer}");

    // Deleted: the agents it chose run their group's set again.
    let said = e2e::stdout(&run_ok(&mut cli(&[
        "delete",
        "--selector",
        "env in (prod)",
    ])));
    assert!(
        said.contains("deleted the set of the agents of selector"),
        "{said}"
    );
    let (_, answer) = prod.connect(&server);
    assert_eq!(answer["config"]["hash"], json!(canary), "{answer}");
}
