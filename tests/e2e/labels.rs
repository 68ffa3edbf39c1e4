//! Labels and selectors (the deployments issue, items 1 and 2): an agent installed with
//! `--label` reports them, the server keeps its own on top (`agent label ID k=v k-`,
//! audited), and `agents list --selector`, `GET /admin/agents?selector=` choose agents
//! by them; a selector that does not parse is refused naming the column.

use std::fs;
use std::process::Command;

use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, admin_call, cross_env, http, read_file,
    run_fails, run_ok, stdout, wait_until,
};
use serde_json::Value;

use crate::rollout::{LONG, OLD};

fn cli(ctx: &TestContext, server: &ServerProc, args: &[&str]) -> Command {
    e2e::admin_cmd(ctx, server, TOKEN, args)
}

fn row(server: &ServerProc, id: &str) -> Value {
    admin_agents(server.port, TOKEN)
        .into_iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("agent {id} is not listed"))
}

/// The ids `GET /admin/agents?selector=<encoded>` lists.
fn selected(server: &ServerProc, encoded: &str) -> Vec<String> {
    let (status, answer) = admin_call(
        server,
        TOKEN,
        "GET",
        &format!("/admin/agents?selector={encoded}"),
        "",
    );
    assert_eq!(status, 200, "{answer}");
    let mut ids: Vec<String> = answer
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// A made-up agent registers with `labels` (JSON): the answer's status and body.
fn register(server: &ServerProc, id: &str, labels: &str) -> (u16, String) {
    register_with(server, id, labels, None)
}

/// [`register`], presenting the agent's credentials (`token`: what its first register
/// answered).
fn register_with(
    server: &ServerProc,
    id: &str,
    labels: &str,
    token: Option<&str>,
) -> (u16, String) {
    let body = format!(
        r#"{{"id":"{id}","name":"host-{id}","platform":"x86_64-unknown-linux-gnu","labels":{labels}}}"#
    );
    let answer = e2e::agent_post(server, "/agent/register", OLD, token, &body);
    (answer.status, answer.text())
}

#[test]
fn labels_from_the_install_and_the_server_are_listed_and_selected_and_a_bad_selector_names_its_column()
 {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);

    // A label that is not a plain name is refused by the installer, naming it.
    let refused = run_fails(
        cross_env(&mut Command::new(&b1))
            .arg(format!("--install={}", ctx.path("bad").display()))
            .args(["--label", "env=pr od"]),
        1,
    );
    assert!(refused.contains("--label: label env="), "{refused}");
    assert!(!ctx.path("bad/agent").exists());

    let installed = run_ok(
        cross_env(&mut Command::new(&b1))
            .arg(format!("--install={}", ctx.path("p").display()))
            .args(["--server-url", &server.url("")])
            .args(["--label", "env=prod", "--label", "region=eu"]),
    );
    assert!(
        stdout(&installed).contains("Its labels: env=prod, region=eu"),
        "{}",
        stdout(&installed)
    );
    let home = fs::canonicalize(ctx.path("p/agent")).unwrap();
    let toml = read_file(&home.join("conf/agent.toml"));
    assert!(toml.contains("labels = {"), "{toml}");
    crate::update::start(&home);
    wait_until(LONG, "the agent to register with its labels", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["labels"]["env"] == "prod")
    });
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    let labels = row(&server, &id)["labels"].clone();
    assert_eq!(labels["env"], "prod", "{labels}");
    assert_eq!(labels["region"], "eu", "{labels}");
    // The built-in labels every agent has.
    assert_eq!(labels["version"], OLD, "{labels}");
    assert_eq!(labels["os"], "linux", "{labels}");
    assert_eq!(labels["group"], "", "{labels}");
    assert!(
        labels["platform"]
            .as_str()
            .is_some_and(|p| p.contains("linux")),
        "{labels}"
    );

    // A second agent, from dev; one whose label is built in is refused naming it.
    assert_eq!(register(&server, "dev-1", r#"{"env":"dev"}"#).0, 200);
    let (status, said) = register(&server, "liar", r#"{"os":"plan9"}"#);
    assert_eq!(status, 400, "{said}");
    assert!(said.contains("label os is built in"), "{said}");

    // The server's own labels win on the same key; `k-` removes one of them.
    let said = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &["agent", "label", &id, "env=staging"],
    )));
    assert!(said.contains("server labels env=staging"), "{said}");
    assert_eq!(row(&server, &id)["labels"]["env"], "staging");
    let said = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &["agent", "label", &id, "tier=web", "env-"],
    )));
    assert!(said.contains("server labels tier=web"), "{said}");
    let labels = row(&server, &id)["labels"].clone();
    assert_eq!(
        (labels["env"].as_str(), labels["tier"].as_str()),
        (Some("prod"), Some("web")),
        "the agent's own env is back, the server's tier is added: {labels}"
    );
    // Both changes are in the audit log, under the admin token's name.
    let (status, audit) = admin_call(
        &server,
        TOKEN,
        "GET",
        "/admin/audit?action=agent.labels",
        "",
    );
    assert_eq!(status, 200, "{audit}");
    let entries = audit["entries"].as_array().unwrap();
    let ok: Vec<&Value> = entries
        .iter()
        .filter(|e| e["outcome"] == "done" && e["who"] == "admin.token")
        .collect();
    assert_eq!(ok.len(), 2, "{audit}");
    assert!(
        ok.iter().all(|e| e["details"].to_string().contains(&id)),
        "{audit}"
    );
    assert!(ok[0]["details"].to_string().contains("tier"), "{audit}");

    // A built-in label cannot be set, nor an unknown agent labelled; the refusal names it.
    let (status, answer) = admin_call(
        &server,
        TOKEN,
        "POST",
        &format!("/admin/agents/{id}/labels"),
        r#"{"set": {"version": "9"}}"#,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.to_string().contains("label version is built in"),
        "{answer}"
    );
    let (status, _) = admin_call(
        &server,
        TOKEN,
        "POST",
        "/admin/agents/nobody/labels",
        r#"{"set": {"a": "b"}}"#,
    );
    assert_eq!(status, 404);
    let said = run_fails(
        &mut cli(&ctx, &server, &["agent", "label", &id, "Bad=x"]),
        1,
    );
    assert!(said.contains("label key \"Bad\""), "{said}");

    // Selectors, on the API and the command line.
    assert_eq!(selected(&server, "env%3Dprod"), vec![id.clone()]);
    assert_eq!(selected(&server, "env%3D%3Ddev"), vec!["dev-1".to_owned()]);
    assert_eq!(
        selected(&server, "tier%2Cregion%20in%20(eu)"),
        vec![id.clone()]
    );
    assert_eq!(selected(&server, "!tier"), vec!["dev-1".to_owned()]);
    assert_eq!(selected(&server, "env%20notin%20(dev)"), vec![id.clone()]);
    assert_eq!(
        selected(&server, "env!%3Dprod%2Cos%3Dlinux"),
        vec!["dev-1".to_owned()]
    );
    assert_eq!(selected(&server, ""), {
        let mut all = vec![id.clone(), "dev-1".to_owned()];
        all.sort();
        all
    });
    let table = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &["agents", "list", "--selector", "env=prod,region in (eu)"],
    )));
    assert!(table.contains(&id) && !table.contains("dev-1"), "{table}");
    assert!(table.contains("env=prod,region=eu,tier=web"), "{table}");
    assert!(table.contains("1 agent\n"), "{table}");
    let json = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &[
            "agents",
            "list",
            "--json",
            "--selector",
            "env in (dev,staging)",
        ],
    )));
    let rows: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{json}");
    assert_eq!(rows[0]["id"], "dev-1", "{json}");

    // A selector that does not parse is a 400 that names the column.
    let auth = format!("Bearer {TOKEN}");
    let answer = http(
        server.port,
        "GET",
        "/admin/agents?selector=env%20in%20(",
        &[("Authorization", &auth)],
    )
    .unwrap();
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains("column 9: expected a value after `in (`"),
        "{}",
        answer.text()
    );
    let said = run_fails(
        &mut cli(
            &ctx,
            &server,
            &["agents", "list", "--selector", "env=prod,,x"],
        ),
        1,
    );
    assert!(said.contains("column 10"), "{said}");
}

/// The same on PostgreSQL, two servers of one fleet: labels an agent reports through one
/// are listed and selected by the other, and so are the labels an operator sets there.
#[test]
fn on_a_postgres_fleet_labels_said_to_one_server_are_selected_on_the_other() {
    let pg = e2e::Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let url = pg.url();
    let env = |name: &'static str| {
        vec![
            ("UPDATE_SERVER_DATABASE_URL", url.clone()),
            ("UPDATE_SERVER_SERVER_NAME", name.to_owned()),
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN.to_owned()),
        ]
    };
    let start = |home: &str, env: Vec<(&str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ctx.server(home, &env)
    };
    let a = start("srv-a", env("a"));
    let b = start("srv-b", env("b"));
    ctx.publish_served(&a, &b1);
    ctx.publish_served(&b, &b1);

    assert_eq!(
        register(&a, "eu-1", r#"{"env":"prod","region":"eu"}"#).0,
        200
    );
    let (status, first) = register(&a, "us-1", r#"{"env":"prod","region":"us"}"#);
    assert_eq!(status, 200, "{first}");
    let first: Value = serde_json::from_str(&first).unwrap();
    let token = first["token"].as_str().unwrap().to_owned();
    assert_eq!(selected(&b, "region%3Deu"), vec!["eu-1".to_owned()]);
    let (status, answer) = admin_call(
        &b,
        TOKEN,
        "POST",
        "/admin/agents/us-1/labels",
        r#"{"set": {"canary": "yes"}, "remove": []}"#,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["labels"]["region"], "us", "{answer}");
    assert_eq!(selected(&a, "env%3Dprod%2Ccanary"), vec!["us-1".to_owned()]);
    // The agent says other labels through b: the server's canary stays.
    let (status, said) = register_with(&b, "us-1", r#"{"env":"staging"}"#, Some(&token));
    assert_eq!(status, 200, "{said}");
    // b writes what it heard with its next batch of contacts (at once when it lists).
    assert_eq!(row(&b, "us-1")["labels"]["env"], "staging");
    let labels = row(&a, "us-1")["labels"].clone();
    assert_eq!(
        (labels["env"].as_str(), labels["canary"].as_str()),
        (Some("staging"), Some("yes")),
        "{labels}"
    );
    assert!(labels.get("region").is_none(), "{labels}");
}

/// OpAMP agents' non-identifying attributes that are well-formed labels are their labels:
/// fleet-sim's say `agent.group`, `os.type`, `host.arch`, and selectors choose by them.
#[test]
fn opamp_agents_non_identifying_attributes_are_their_labels() {
    let ctx = TestContext::new();
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url(""), "--protocol", "opamp"])
        .args(["--agents", "2", "--group", "edge=1"])
        .args(["--heartbeat", "500ms", "--ramp", "1s", "--duration", "120s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    ctx.spawn(sim);
    wait_until(LONG, "two OpAMP agents listed", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .filter(|a| a["protocol"] == "opamp")
            .count()
            == 2
    });
    for a in admin_agents(server.port, TOKEN) {
        let labels = &a["labels"];
        assert_eq!(labels["agent.group"], "edge", "{a}");
        assert_eq!(labels["group"], "edge", "{a}");
        assert!(labels["os.type"].is_string(), "{a}");
        assert!(labels["version"].is_string(), "{a}");
    }
    assert_eq!(selected(&server, "agent.group%3Dedge%2Cos.type").len(), 2);
    assert!(selected(&server, "agent.group%3Dcore").is_empty());
}

/// `install.sh --label` (repeatable) passes each to the installer: the agent registers
/// with them; a label that is not one plain word is refused before anything is fetched.
#[test]
fn install_sh_passes_labels_to_the_installer() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let one_liner = |args: &str| {
        e2e::run(Command::new("sh").arg("-c").arg(format!(
            "curl -fsSL {} | sh -s -- {args}",
            server.url("/install.sh")
        )))
    };
    let prefix = ctx.path("p");
    let bad = one_liner(&format!(
        "--prefix {} --label 'env=a;b' --no-systemd",
        prefix.display()
    ));
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("--label env=a;b"), "{said}");
    assert!(!prefix.join("agent").exists());

    let out = one_liner(&format!(
        "--prefix {} --label env=prod --label=region=eu --no-systemd",
        prefix.display()
    ));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(LONG, "the agent to register with its labels", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["labels"]["env"] == "prod" && a["labels"]["region"] == "eu")
    });
}
