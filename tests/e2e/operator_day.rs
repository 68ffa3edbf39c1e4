//! The operator's first day (issue 47): each test is a regression test named after what
//! a newcomer met on a fresh clone, with the exact message it got.

use std::fs;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use e2e::{
    ServerProc, TOKEN, TestContext, configure_agent, free_port, http, http_with_body, read_file,
    run_fails, run_ok, stdout, wait_until,
};

fn admin(server: &ServerProc, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    e2e::admin_call(server, TOKEN, method, path, body)
}

/// A server with the admin API on, serving a 1.0.0+1 bundle.
fn server(ctx: &TestContext, env: &[(&str, &str)]) -> ServerProc {
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("dist"), "1.0.0", "1", &key, "b");
    let mut all = vec![("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)];
    all.extend_from_slice(env);
    let server = ctx.server("home", &all);
    ctx.publish_served(&server, &bundle);
    server
}

/// `update-server ARGS --server 127.0.0.1:PORT --token T`: the address as `server.listen`
/// writes it, without a scheme.
fn cli(ctx: &TestContext, server: &ServerProc, args: &[&str]) -> Command {
    let mut c = ctx.cmd("update-server");
    c.args(args).args([
        "--server",
        &format!("127.0.0.1:{}", server.port),
        "--token",
        TOKEN,
    ]);
    c
}

fn sets(server: &ServerProc) -> Vec<Value> {
    let (status, v) = admin(server, "GET", "/admin/config", b"");
    assert_eq!(status, 200, "{v}");
    v["sets"].as_array().cloned().unwrap_or_default()
}

/// Regression: `--server 127.0.0.1:7080` was `builder error: relative URL without a
/// base`; `config push --group default emptydir` stored an empty set that emptied
/// `conf/workload/` on every agent.
#[test]
fn an_empty_config_push_is_refused_and_nothing_rolls_out_and_server_takes_host_port() {
    let ctx = TestContext::new();
    let server = server(&ctx, &[]);
    let empty = ctx.path("emptydir");
    fs::create_dir_all(&empty).unwrap();
    let push = |dir: &std::path::Path, extra: &[&str]| {
        let mut c = cli(&ctx, &server, &["config", "push", "--group", "default"]);
        c.arg(dir).args(extra);
        c
    };
    let text = run_fails(&mut push(&empty, &[]), 1);
    assert!(
        text.contains("no files") && text.contains("--allow-empty"),
        "{text}"
    );
    assert!(sets(&server).is_empty(), "an empty set was stored");

    let first = ctx.path("first");
    fs::create_dir_all(&first).unwrap();
    fs::write(first.join("app.conf"), "answer = 42\n").unwrap();
    fs::write(first.join("extra.conf"), "x\n").unwrap();
    run_ok(&mut push(&first, &[]));
    let stored = sets(&server);
    assert_eq!(stored.len(), 1);
    let hash = stored[0]["hash"].clone();

    // The wrong directory: none of the files the group has now.
    let other = ctx.path("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("unrelated.txt"), "y\n").unwrap();
    let text = run_fails(&mut push(&other, &[]), 1);
    assert!(
        text.contains("app.conf, extra.conf") && text.contains("--replace-all"),
        "{text}"
    );
    let text = run_fails(&mut push(&empty, &[]), 1);
    assert!(text.contains("--allow-empty"), "{text}");
    assert_eq!(
        sets(&server)[0]["hash"],
        hash,
        "the refused pushes changed the set"
    );
    // The API refuses as the CLI does, and takes the consent as a query too.
    let body = json!({"files": {}}).to_string();
    let (status, v) = admin(&server, "PUT", "/admin/config/default", body.as_bytes());
    assert_eq!(status, 409, "{v}");
    // The refusals are in the audit log, with their reason.
    let (_, audit) = admin(&server, "GET", "/admin/audit?action=config.push", b"");
    let refused = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["outcome"] == "refused")
        .count();
    assert!(refused >= 3, "{audit}");

    // Said deliberately, both are taken.
    run_ok(&mut push(&other, &["--replace-all"]));
    assert_eq!(sets(&server)[0]["files"], json!(["unrelated.txt"]));
    push_empty_set_on_purpose(&server);
    assert_eq!(sets(&server)[0]["files"], json!([]));

    // What `--server` does not take is said, not sent.
    let mut c = ctx.cmd("update-server");
    c.args([
        "rollout",
        "status",
        "--server",
        "ftp://x:1",
        "--token",
        TOKEN,
    ]);
    let text = run_fails(&mut c, 2);
    assert!(text.contains("HOST:PORT"), "{text}");
}

/// Regression: `wave-wait = "15m"` in server.toml was `invalid type: string "15m",
/// expected u64`, while the agent takes only "30s"-style durations.
#[test]
fn server_durations_take_15m_30s_and_bare_seconds_and_a_bad_one_names_its_key() {
    let ctx = TestContext::new();
    let home = ctx.path("home");
    fs::create_dir_all(&home).unwrap();
    let conf = ctx.path("server.toml");
    fs::write(
        &conf,
        "[rollout]\nwave-wait = \"15m\"\nagent-deadline = 600\n[agents]\nmax-wait = \"30s\"\n",
    )
    .unwrap();
    let port = free_port();
    let mut c = ctx.cmd("update-server");
    c.arg("--config")
        .arg(&conf)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--home"])
        .arg(&home)
        .env("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)
        .env("UPDATE_SERVER_DOWNLOADS_RETRY_AFTER", "1m")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let pid = ctx.spawn(c);
    wait_until(Duration::from_secs(30), "the server to answer", || {
        http(port, "GET", "/healthz", &[]).is_ok_and(|a| a.status == 200)
    });
    let server = ServerProc { port, home, pid };
    let (_, v) = admin(&server, "GET", "/admin/config", b"");
    assert_eq!(v["plan"]["wave_wait"], 900, "{v}");
    assert_eq!(v["plan"]["agent_deadline"], 600, "{v}");

    fs::write(&conf, "[rollout]\nwave-wait = \"15 minutes\"\n").unwrap();
    let mut c = ctx.cmd("update-server");
    c.arg("--config").arg(&conf).args(["rollout", "status"]);
    let text = run_fails(&mut c, 1);
    assert!(
        text.contains("rollout.wave-wait") && text.contains("\"15m\"") && text.contains("(90)"),
        "{text}"
    );
}

/// Regression: with `bundle.public-key` set, a bundle signed by another key was refused
/// while `/healthz` said `ok`, and the refusal said "this agent trusts key …".
#[test]
fn healthz_says_degraded_with_the_reason_while_the_served_bundle_is_refused() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let (_, other_pub) = ctx.keygen("other");
    let bundle = ctx.pack(&ctx.dist("dist"), "1.0.0", "1", &key, "b");
    let other_pub = other_pub.display().to_string();
    let server = ctx.server("home", &[("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &other_pub)]);
    ctx.publish(&server, &bundle);
    let mut body = String::new();
    wait_until(Duration::from_secs(20), "/healthz to say degraded", || {
        body = http(server.port, "GET", "/healthz", &[]).unwrap().text();
        body.starts_with("degraded\n")
    });
    assert!(body.contains("bundle.public-key"), "{body}");
    assert!(!body.contains("this agent"), "the agent's words: {body}");
    let log = read_file(&server.home.join("server.log"));
    assert!(log.contains("bundle.public-key is key"), "{log}");

    // Fixed: a bundle signed by the trusted key is served and the server is ok again.
    let (other_key, _) = (ctx.path("other/update.key"), ());
    let good = ctx.pack(&ctx.dist("dist2"), "1.0.1", "2", &other_key, "b2");
    server.clear_bundles();
    ctx.publish_served(&server, &good);
    wait_until(Duration::from_secs(20), "/healthz to say ok", || {
        http(server.port, "GET", "/healthz", &[])
            .unwrap()
            .text()
            .starts_with("ok\n")
    });
}

/// Registers an agent of `version` in `group` over HTTP.
fn register(server: &ServerProc, id: &str, version: &str, group: &str) -> String {
    let body = json!({
        "id": id, "name": format!("host-{id}"), "platform": "x86_64-unknown-linux-gnu", "group": group,
        "health": {"healthy": true, "workload": "none", "restarts": 0},
    });
    let a = e2e::agent_post(server, "/agent/register", version, None, &body.to_string());
    assert!(a.status == 200 || a.status == 409, "{}", a.text());
    let v: Value = serde_json::from_slice(&a.body).unwrap();
    v["token"].as_str().unwrap_or_default().to_owned()
}

/// Regression: there was no `update-server agents list`; operators used curl and jq.
#[test]
fn agents_list_filters_by_version_status_and_group() {
    let ctx = TestContext::new();
    let server = server(&ctx, &[("UPDATE_SERVER_AGENTS_ACCEPT", ">=0.1.0")]);
    register(&server, "agent-a", "1.0.0+1", "canary");
    let token = register(&server, "agent-b", "0.9.0+1", "");
    register(&server, "agent-c", "1.0.0+1", "");
    let report = json!({"id": "agent-b", "from": "0.9.0+1", "to": "1.0.0+1", "status": "INSTALL_FAILED", "error": "disk full"});
    let auth = format!("Bearer {token}");
    let a = http_with_body(
        server.port,
        "POST",
        "/agentupdate/report",
        &[
            ("Agent-Version", "0.9.0+1"),
            ("Content-Type", "application/json"),
            ("Authorization", &auth),
        ],
        report.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());

    let list = |args: &[&str]| stdout(&run_ok(&mut cli(&ctx, &server, args)));
    let all = list(&["agents", "list"]);
    assert!(all.lines().next().unwrap().starts_with("id "), "{all}");
    assert!(all.contains("3 agents"), "{all}");
    let on = list(&["agents", "list", "--version", "1.0.0+1"]);
    assert!(
        on.contains("agent-a") && on.contains("agent-c") && !on.contains("agent-b"),
        "{on}"
    );
    let failed = list(&["agents", "list", "--status", "install_failed"]);
    assert!(
        failed.contains("agent-b") && failed.contains("disk full") && failed.contains("1 agent\n"),
        "{failed}"
    );
    let canary = list(&["agents", "list", "--group", "canary"]);
    assert!(
        canary.contains("agent-a") && !canary.contains("agent-c"),
        "{canary}"
    );
    let default = list(&["agents", "list", "--group", "default", "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&default).unwrap();
    let ids: Vec<&str> = rows.iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids, ["agent-b", "agent-c"]);
    let none = list(&["agents", "list", "--group", "nobody"]);
    assert_eq!(none, "no agents match\n");
}

/// Regression: `agent-bundle pack --key prodkeys/update.key` packed without a word
/// while the distribution still shipped the dev `update.pub`; every fresh install then
/// failed on the key.
#[test]
fn pack_refuses_a_distribution_that_ships_another_key_unless_allowed() {
    let ctx = TestContext::new();
    let (_, dev_pub) = ctx.keygen("dev-keys");
    let (prod_key, prod_pub) = ctx.keygen("prodkeys");
    let dist = ctx.dist("dist");
    fs::copy(&dev_pub, dist.join("conf.default/update.pub")).unwrap();
    let pack = |extra: &[&str]| {
        let mut c = ctx.cmd("agent-bundle");
        c.args(["pack", "--dist"])
            .arg(&dist)
            .args(["--version", "1.0.0", "--build", "1", "--key"])
            .arg(&prod_key)
            .args(["--out", "out"])
            .args(extra);
        c
    };
    let text = run_fails(&mut pack(&[]), 1);
    assert!(
        text.contains("conf.default/update.pub")
            && text.contains("--allow-other-key")
            && text.contains("Nothing was packed"),
        "{text}"
    );
    assert_eq!(text.trim_end().lines().count(), 1, "one line: {text}");
    assert!(!ctx.path("out/agent-bundle-1.0.0").exists());

    // Deliberately: packed, and the rotation it makes is named.
    let out = run_ok(&mut pack(&["--allow-other-key"]));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("rotation") && said.contains("--trust-key"),
        "{said}"
    );
    assert!(ctx.path("out/agent-bundle-1.0.0").exists());

    // The signing key's own public half: packed without a word about keys.
    fs::copy(&prod_pub, dist.join("conf.default/update.pub")).unwrap();
    let out = run_ok(&mut pack(&[]));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Regression: an agent installed with a server URL where nothing listens: `start` said
/// "agent started", `agent status` said `contact: last successful never`, and why was
/// only in logs/agent.log.
#[test]
fn start_and_status_name_an_unreachable_server_and_why() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b");
    let home = ctx.install(&bundle, "p");
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    configure_agent(&home, std::slice::from_ref(&nowhere), "");
    let wrapper = home.join("current/bin/agent-wrapper.sh");
    let out = run_ok(Command::new(&wrapper).arg("start"));
    let said = stdout(&out);
    assert!(said.contains("agent started (pid"), "{said}");
    assert!(
        said.contains("no contact with a server yet")
            && said.contains(&nowhere)
            && said.contains("Connection refused"),
        "{said}"
    );
    let status = stdout(&run_ok(
        Command::new(home.join("current/bin/agent")).arg("status"),
    ));
    let line = status
        .lines()
        .find(|l| l.starts_with("last contact error:"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        line.contains("s ago (") && line.contains(&nowhere),
        "{line}"
    );
    assert!(
        status.contains("last update error:        none"),
        "{status}"
    );
    assert!(status.contains("configuration: no set applied"), "{status}");
    run_ok(Command::new(&wrapper).arg("stop"));
}

/// `agent status` names the applied configuration set, and the last configuration
/// error with its time.
#[test]
fn agent_status_names_the_applied_configuration_set() {
    let ctx = TestContext::new();
    let server = server(&ctx, &[]);
    let (key, _) = (ctx.path("keys/update.key"), ());
    let bundle = ctx.pack(&ctx.dist("d2"), "1.0.0", "1", &key, "b2");
    let home = ctx.install(&bundle, "p");
    // No workload to run, but a check every set must pass.
    configure_agent(
        &home,
        &[server.url("")],
        "[workload]\ncheck-command = [\"/bin/sh\", \"-c\", \"if grep -q forbidden {config_dir}/app.conf; then echo 'forbidden word' >&2; exit 4; fi\"]\n",
    );
    let set = ctx.path("set");
    fs::create_dir_all(&set).unwrap();
    fs::write(set.join("app.conf"), "answer = 42\n").unwrap();
    let pushed = stdout(&run_ok(
        cli(&ctx, &server, &["config", "push", "--json"]).arg(&set),
    ));
    let hash = serde_json::from_str::<Value>(&pushed).unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_owned();
    let wrapper = home.join("current/bin/agent-wrapper.sh");
    let said = stdout(&run_ok(Command::new(&wrapper).arg("start")));
    assert!(!said.contains("no contact"), "{said}");
    let agent = home.join("current/bin/agent");
    wait_until(Duration::from_secs(30), "the set to be applied", || {
        stdout(&run_ok(Command::new(&agent).arg("status")))
            .contains(&format!("configuration: set {hash} applied"))
    });
    // A set the check refuses: the error of its kind, and the set before stays applied.
    fs::write(set.join("app.conf"), "forbidden\n").unwrap();
    run_ok(cli(&ctx, &server, &["config", "push"]).arg(&set));
    let mut status = String::new();
    wait_until(Duration::from_secs(30), "the configuration error", || {
        status = stdout(&run_ok(Command::new(&agent).arg("status")));
        !status.contains("last configuration error: none")
    });
    let line = status
        .lines()
        .find(|l| l.starts_with("last configuration error:"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        line.contains("s ago (") && line.contains("forbidden word"),
        "{line}"
    );
    assert!(
        status.contains(&format!("configuration: set {hash} applied")),
        "{status}"
    );
    run_ok(Command::new(&wrapper).arg("stop"));
}

/// Stores a set with no files for `default`, said on purpose (`?allow_empty=true`).
fn push_empty_set_on_purpose(server: &ServerProc) {
    let body = json!({"files": {}}).to_string();
    let (status, v) = admin(
        server,
        "PUT",
        "/admin/config/default?allow_empty=true",
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{v}");
}

/// Regression: the audit page said "1 entries" and showed raw `{"status":403}`; an empty
/// set showed as `54c4122e7637 · · stored`; "workload none" was red on an agent's page.
#[test]
fn the_page_says_entries_set_files_and_a_healthy_agents_workload_in_words() {
    let ctx = TestContext::new();
    let server = server(&ctx, &[]);
    register(&server, "agent-none", "1.0.0+1", "");
    let (status, _) = e2e::admin_call(&server, "wrong-token", "POST", "/admin/rollout/halt", b"");
    assert_eq!(status, 401);
    push_empty_set_on_purpose(&server);
    let cookie = crate::page::http_sign_in(server.port, TOKEN);
    let page = |path: &str| {
        let a = http(server.port, "GET", path, &[("Cookie", &cookie)]).unwrap();
        assert_eq!(a.status, 200, "{path}: {}", a.text());
        a.text()
    };
    let audit = page("/audit?action=rollout");
    assert!(audit.contains("1 entry ·"), "{audit}");
    assert!(
        !audit.contains("{&quot;status") && !audit.contains("{\"status"),
        "{audit}"
    );
    assert!(audit.contains("no valid token (401)"), "{audit}");
    let rollouts = page("/rollouts");
    assert!(
        rollouts.contains("no files (empties conf/workload/"),
        "{rollouts}"
    );
    let agent = page("/agents/agent-none");
    assert!(
        agent.contains("<span class=\"detail\">workload none</span>"),
        "{agent}"
    );
}

/// Starts update-server under a file limit of 2048 with `env`; the log of its start.
fn start_log_under_a_low_file_limit(ctx: &TestContext, name: &str, env: &[(&str, &str)]) -> String {
    let home = ctx.path(name);
    fs::create_dir_all(&home).unwrap();
    let log = home.join("server.log");
    let port = free_port();
    let mut c = Command::new("prlimit");
    c.args(["--nofile=2048:2048", "--"])
        .arg(e2e::bin_path("update-server"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--home"])
        .arg(&home)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    ctx.spawn(c);
    wait_until(Duration::from_secs(30), "the server to answer", || {
        http(port, "GET", "/healthz", &[]).is_ok_and(|a| a.status == 200)
    });
    read_file(&log)
}

/// Regression: every start warned `server.max-connections = 25000 does not fit the file
/// limit of 20000`, although nobody had set it.
#[test]
fn unset_max_connections_takes_what_the_file_limit_allows_without_a_warning() {
    e2e::require_tool("prlimit");
    let ctx = TestContext::new();
    let log = start_log_under_a_low_file_limit(&ctx, "default", &[]);
    assert!(!log.contains("WARN"), "{log}");
    assert_eq!(
        log.matches("server.max-connections (unset) is 1920")
            .count(),
        1,
        "{log}"
    );
    // An operator's own number that does not fit is still a warning.
    let log = start_log_under_a_low_file_limit(
        &ctx,
        "set",
        &[("UPDATE_SERVER_SERVER_MAX_CONNECTIONS", "25000")],
    );
    assert!(
        log.contains("WARN") && log.contains("does not fit the file limit of 2048"),
        "{log}"
    );
}

/// Regression: the README had no walkthrough from a key to a rollout; this runs its
/// "Your first release" commands as written, in order, against a throw-away server.
#[test]
fn readme_first_release_walkthrough_runs_as_written() {
    e2e::require_tool("curl");
    let ctx = TestContext::new();
    let bin_dir = e2e::bin_path("agent").parent().unwrap().to_path_buf();
    let out = e2e::run(
        Command::new("timeout")
            .arg("300")
            .arg(e2e::repo_root().join("scripts/readme-walkthrough.sh"))
            .env("AGENT_BIN_DIR", &bin_dir)
            .env("WALKTHROUGH_SERVER", format!("127.0.0.1:{}", free_port()))
            .env("WALKTHROUGH_DIR", ctx.path("walk"))
            .env_remove("UPDATE_SERVER_ADMIN_TOKEN"),
    );
    let said = stdout(&out);
    let trace = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}\n{trace}");
    assert!(
        said.contains("agent 1.1.0+2") && said.contains("1.0.0+1 -> 1.1.0+2 committed"),
        "the canary did not update:\n{said}\n{trace}"
    );
    // `agents list` showed the machine on 1.0.0+1 in the canary group.
    assert!(
        said.lines()
            .any(|l| l.contains("1.0.0+1") && l.contains("canary")),
        "{said}"
    );
    let halted = said
        .lines()
        .rev()
        .find(|l| l.starts_with("rollout of 1.1.0+2"))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(halted.contains("halted"), "{said}");
    assert!(
        said.contains("the canary's dashboards look wrong"),
        "{said}"
    );
    // Back to 1.0.0 by the README's rollback: signed again, the canary switched back.
    assert!(
        said.contains("Skipped") && said.contains("1.1.0+2 -> 1.0.0+1 committed"),
        "the rollback did not bring the canary back:
{said}
{trace}"
    );
}

/// `agent status` names the last update error, with its time: here a bundle signed by a
/// key this agent does not trust.
#[test]
fn agent_status_names_the_last_update_error() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let (other, _) = ctx.keygen("other");
    let old = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&old, "p");
    let server = ctx.server("home", &[]);
    let foreign = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &other, "b2");
    ctx.publish_served(&server, &foreign);
    configure_agent(&home, &[server.url("")], "");
    let wrapper = home.join("current/bin/agent-wrapper.sh");
    run_ok(Command::new(&wrapper).arg("start"));
    let agent = home.join("current/bin/agent");
    let mut status = String::new();
    wait_until(
        Duration::from_secs(60),
        "an update error in agent status",
        || {
            status = stdout(&run_ok(Command::new(&agent).arg("status")));
            !status.contains("last update error:        none")
        },
    );
    let line = status
        .lines()
        .find(|l| l.starts_with("last update error:"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(line.contains("s ago (") && line.contains("key"), "{line}");
    assert!(
        status.contains("last contact error:       none"),
        "{status}"
    );
    run_ok(Command::new(&wrapper).arg("stop"));
}
