//! Prompt delivery: agents at the default 30 s heartbeat hold a long-polling connect and
//! learn within two seconds that their wave opened or that a fixed bundle is served; a
//! configuration set pushed on one server of two (PostgreSQL) reaches an agent held on
//! the other within five; a held connect works over HTTPS and HTTP/2; two thousand held
//! agents come back after a server restart without arriving all at once.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{
    Pki, Postgres, ServerProc, TOKEN, TestContext, admin_agents, configure_agent, http_with_body,
    log_time, metric, read_file, run_ok, signal, wait_until,
};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(120);

/// The default heartbeat, and long polls on (the default), for agents installed from
/// `bundle` and pointed at `server`.
fn held_agents(ctx: &TestContext, server: &ServerProc, bundle: &Path, n: usize) -> Vec<PathBuf> {
    let homes: Vec<PathBuf> = (0..n)
        .map(|i| {
            let home = ctx.install(bundle, &format!("fleet/{i}"));
            configure_agent(&home, &[server.url("")], "");
            let conf = read_file(&home.join("conf/agent.toml")).replace(
                "heartbeat = \"1s\"",
                "heartbeat = \"30s\"\nlong-poll = true",
            );
            fs::write(home.join("conf/agent.toml"), conf).unwrap();
            fs::write(
                home.join("conf/agent-env.sh"),
                "export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=30s\n",
            )
            .unwrap();
            home
        })
        .collect();
    e2e::start_wrappers(&homes);
    wait_until(LONG, "every agent to hold a connect", || {
        metric(server, "agentupdate_connects_held") >= n as f64
    });
    homes
}

/// When the agent's log says it was refused for `version` and started updating.
fn started_update(home: &Path, version: &str) -> Option<f64> {
    read_file(&home.join("logs/agent.log"))
        .lines()
        .find(|l| l.contains(&format!("expects {version}; updating")))
        .and_then(log_time)
}

fn secs(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a time: {v}"))
}

#[test]
fn held_agents_start_their_download_within_two_seconds_of_their_wave_opening() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
        ],
    );
    ctx.publish_served(&server, &b1);
    e2e::wait_rollout(
        &server,
        TOKEN,
        LONG,
        "the rollout of 1.0.0 to complete",
        |r| r["state"] == "completed",
    );
    let homes = held_agents(&ctx, &server, &b1, 2);
    ctx.republish(&server, &b2);
    let done = e2e::wait_rollout(
        &server,
        TOKEN,
        LONG,
        "the rollout of 2.0.0 to complete",
        |r| r["version"] == "2.0.0+2" && r["state"] == "completed",
    );
    let waves = done["waves"].as_array().unwrap();
    assert_eq!(waves.len(), 2, "{done}");
    for a in admin_agents(server.port, TOKEN) {
        let wave = a["wave"].as_u64().unwrap() as usize;
        let opened = secs(&waves[wave - 1]["opened_at"]);
        let home = homes
            .iter()
            .find(|h| read_file(&h.join("data/agent-id")).trim() == a["id"])
            .unwrap();
        let started = started_update(home, "2.0.0+2")
            .unwrap_or_else(|| panic!("{} never started the update", home.display()));
        assert!(
            started - opened < 2.0,
            "wave {wave} opened at {opened:.3}, its agent started updating {:.3} s later (heartbeat 30 s)",
            started - opened
        );
    }
}

#[test]
fn a_degraded_agent_takes_a_fixed_bundle_within_two_seconds() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let d2 = ctx.dist("d2");
    crate::update::script_agent(&d2, "exit 1");
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let b3 = ctx.pack(&ctx.dist("d3"), "3.0.0", "3", &key, "b3");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let homes = held_agents(&ctx, &server, &b1, 1);
    let home = &homes[0];
    ctx.republish(&server, &b2);
    // Rolled back, and told at once (issue 30): the rollout of 2.0.0 halts on it.
    wait_until(LONG, "the server to record the failed update", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["update_status"] == "INSTALL_FAILED")
    });
    // Held again: on 1.0.0, accepted by the halted rollout or staying away from 2.0.0.
    wait_until(LONG, "the degraded agent to hold a connect", || {
        metric(&server, "agentupdate_connects_held") >= 1.0
    });
    ctx.republish(&server, &b3);
    let started3 = e2e::wait_rollout(&server, TOKEN, LONG, "the rollout of 3.0.0 to start", |r| {
        r["version"] == "3.0.0+3"
    });
    let started_at = secs(&started3["started_at"]);
    e2e::wait_log(home, "agent.log", "expects 3.0.0+3; updating", LONG);
    let began = started_update(home, "3.0.0+3").unwrap();
    assert!(
        began - started_at < 2.0,
        "the fixed bundle's rollout started at {started_at:.3}; the degraded agent took it {:.3} s later",
        began - started_at
    );
    wait_until(LONG, "the agent to run 3.0.0", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == "3.0.0+3")
    });
}

#[test]
fn a_set_pushed_on_one_server_reaches_an_agent_held_on_the_other_within_five_seconds() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let (a, b) = e2e::two_servers_on(&ctx, &pg, TOKEN, &b1);
    // The agent knows only b, and holds its connect there.
    let home = held_agents(&ctx, &b, &b1, 1).remove(0);
    let auth = format!("Bearer {TOKEN}");
    let body = serde_json::json!({ "files": { "web.yml": "pushed on a\n" } }).to_string();
    let pushed = Instant::now();
    let answer = http_with_body(
        a.port,
        "PUT",
        "/admin/config/default",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let file = home.join("conf/workload/web.yml");
    wait_until(
        Duration::from_secs(5),
        "the agent held on b to apply the set pushed on a",
        || fs::read_to_string(&file).is_ok_and(|text| text == "pushed on a\n"),
    );
    let took = pushed.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the set reached the agent {took:?} after it was pushed (heartbeat 30 s)"
    );
    // What it applied is what the fleet counts, on either server.
    wait_until(LONG, "a to count the agent's APPLIED", || {
        admin_agents(a.port, TOKEN)
            .first()
            .is_some_and(|row| row["config_status"] == "APPLIED")
    });
}

fn register(curl: impl Fn() -> Command, url: &str, id: &str) -> String {
    let out = run_ok(
        curl()
            .args(["-sS", "-X", "POST", "-H", "Agent-Version: 1.0.0+1"])
            .args(["-H", "Content-Type: application/json", "--data"])
            .arg(format!(
                r#"{{"id":"{id}","name":"h","platform":"x86_64-unknown-linux-gnu"}}"#
            ))
            .arg(format!("{url}/agent/register")),
    );
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    body["token"].as_str().unwrap().to_owned()
}

/// A held connect with curl (its extra arguments in `curl`), answered when the fleet
/// switch flips: held at least a second before, answered within two seconds after,
/// with the long-poll header, over the HTTP version asked for.
fn held_connect_is_answered_on_news(
    curl: impl Fn() -> Command + Send + 'static,
    url: String,
    flip: impl FnOnce(),
    http_version: &str,
) {
    let token = register(&curl, &url, "held-1");
    let mut connect = curl();
    connect
        .args(["-sS", "-i", "-X", "POST", "-H", "Agent-Version: 1.0.0+1"])
        .args(["-H", "Content-Type: application/json"])
        .args(["-H", &format!("Authorization: Bearer {token}"), "--data"])
        .arg(r#"{"id":"held-1","name":"h","platform":"x86_64-unknown-linux-gnu"}"#)
        .arg(format!("{url}/agent/connect?wait=30"))
        .stdout(Stdio::piped());
    let asked = Instant::now();
    let child = connect.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let flipped = Instant::now();
    flip();
    let out = child.wait_with_output().unwrap();
    let answered = Instant::now();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(out.status.success(), "{text}");
    assert!(
        flipped.duration_since(asked) >= Duration::from_secs(1)
            && answered.duration_since(flipped) < Duration::from_secs(2),
        "held {:?}, answered {:?} after the switch flipped:\n{text}",
        flipped.duration_since(asked),
        answered.duration_since(flipped)
    );
    assert!(text.starts_with(http_version), "{text}");
    assert!(text.contains("agent-long-poll: "), "{text}");
    assert!(text.contains("\"accepted\""), "{text}");
}

fn flip_switch(port: u16, on: bool) {
    let auth = format!("Bearer {TOKEN}");
    let answer = http_with_body(
        port,
        "PUT",
        "/admin/settings",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        format!(r#"{{"auto_update": {on}}}"#).as_bytes(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[test]
fn a_held_connect_is_answered_on_news_over_http2_and_https() {
    e2e::require_tool("curl");
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");

    // HTTP/2 without TLS (prior knowledge).
    let plain = ctx.server("plain", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&plain, &b1);
    let port = plain.port;
    held_connect_is_answered_on_news(
        || {
            let mut c = Command::new("curl");
            c.arg("--http2-prior-knowledge");
            c
        },
        plain.url(""),
        || flip_switch(port, false),
        "http/2 200",
    );

    // HTTPS, HTTP/2 by ALPN.
    let pki = Pki::new(&ctx.path("pki"));
    let tls = ctx.server_tls("tls", &pki, &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish(&tls, &b1);
    let ca = pki.ca.clone();
    let tls_url = tls.https_url("");
    wait_until(LONG, "the HTTPS server to serve the bundle", || {
        pki.curl()
            .arg(tls.https_url("/agentupdate/version"))
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("1.0.0"))
    });
    let flip = {
        let pki_curl = pki.curl();
        let url = tls.https_url("/admin/settings");
        move || {
            let mut c = pki_curl;
            run_ok(
                c.args(["-sS", "-X", "PUT", "-H"])
                    .arg(format!("Authorization: Bearer {TOKEN}"))
                    .args(["-H", "Content-Type: application/json", "--data"])
                    .arg(r#"{"auto_update": false}"#)
                    .arg(url),
            );
        }
    };
    held_connect_is_answered_on_news(
        move || {
            let mut c = Command::new("curl");
            c.arg("--cacert").arg(&ca).arg("--http2");
            c
        },
        tls_url,
        flip,
        "http/2 200",
    );
}

#[test]
fn two_thousand_held_agents_come_back_after_a_restart_without_a_herd() {
    const AGENTS: usize = 2000;
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let env = [("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)];
    let server = ctx.server("srv", &env);
    ctx.publish_served(&server, &b1);
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url(""), "--agents", "2000"])
        .args(["--heartbeat", "10s", "--ramp", "5s", "--long-poll"])
        .args(["--duration", "100s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let sim_pid = ctx.spawn(sim);
    wait_until(LONG, "2,000 simulated agents to hold a connect", || {
        metric(&server, "agentupdate_connects_held") >= (AGENTS - 20) as f64
    });
    // Agents hold right after they register: the last may still be registering.
    wait_until(LONG, "the fleet to know all 2,000 agents", || {
        e2e::admin_agents_answered(server.port, TOKEN).is_some_and(|a| a.len() == AGENTS)
    });
    let port = server.port;
    signal(server.pid, "TERM");
    wait_until(LONG, "the server to stop", || e2e::pid_gone(server.pid));
    let restarted_at = e2e::now_secs() as f64;
    let server = ctx.server_on("srv", port, &env);
    // Sample how many are held again, ten times a second, until all are back.
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(40) {
        let held = metric(&server, "agentupdate_connects_held");
        samples.push(held);
        if held >= (AGENTS - 20) as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let agents = admin_agents(server.port, TOKEN);
    assert_eq!(agents.len(), AGENTS, "an agent was lost from the fleet");
    let last = *samples.last().unwrap();
    assert!(
        last >= (AGENTS - 20) as f64,
        "only {last} agents held a connect again within 40 s: {samples:?}"
    );
    let back = agents
        .iter()
        .filter(|a| {
            a["last_contact"]
                .as_str()
                .and_then(|t| httpdate::parse_http_date(t).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .is_some_and(|t| t.as_secs_f64() >= restarted_at - 1.0)
        })
        .count();
    assert!(back >= AGENTS - 20, "{back} agents came back");
    // No herd: in no tenth of a second did more than a quarter of the fleet arrive.
    let biggest_step = samples
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(0.0_f64, f64::max);
    assert!(
        biggest_step < AGENTS as f64 / 4.0,
        "{biggest_step} agents reconnected within 100 ms: {samples:?}"
    );
    signal(sim_pid, "TERM");
}
