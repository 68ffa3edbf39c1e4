//! fleet-sim against a real server: simulated agents go through a staged rollout, and
//! the summary says what happened.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::{TestContext, wait_until};

/// A server (admin token `t`, `env` besides) serving 1.0.0+1, and 2.0.0+2's bundle to
/// publish next.
fn serving_1_0_0(ctx: &TestContext, env: &[(&str, &str)]) -> (e2e::ServerProc, PathBuf) {
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let mut all = vec![("UPDATE_SERVER_ADMIN_TOKEN", "t")];
    all.extend_from_slice(env);
    let server = ctx.server("srv", &all);
    ctx.publish_served(&server, &b1);
    (server, b2)
}

/// fleet-sim against `server` with `args` (the fleet and how it behaves), agents
/// started over a second, installs of 200 ms, until the rollout ends (at most two
/// minutes), its summary written to `summary`.
fn fleet_sim(
    ctx: &TestContext,
    server: &e2e::ServerProc,
    summary: &Path,
    args: &[&str],
) -> Command {
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url("")])
        .args(args)
        .args(["--ramp", "1s", "--install-time", "200ms"])
        .args(["--until-rollout-end", "--token", "t"])
        .args(["--duration", "120s", "--json"])
        .arg(summary)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    sim
}

#[test]
fn fleet_sim_follows_a_staged_rollout_to_its_end_and_reports_it() {
    let ctx = TestContext::new();
    let (server, b2) = serving_1_0_0(
        &ctx,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "10%,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "50%"),
        ],
    );
    let summary = ctx.path("sim.json");
    let sim = fleet_sim(
        &ctx,
        &server,
        &summary,
        &[
            "--agents",
            "40",
            "--heartbeat",
            "300ms",
            "--download",
            "full",
            "--fail-rate",
            "0.1",
        ],
    );
    let pid = ctx.spawn(sim);
    wait_until(
        Duration::from_secs(30),
        "the simulated agents to register",
        || e2e::admin_agents(server.port, "t").len() == 40,
    );
    ctx.republish(&server, &b2);
    wait_until(Duration::from_secs(120), "fleet-sim to finish", || {
        e2e::pid_gone(pid)
    });
    let report: serde_json::Value =
        serde_json::from_str(&e2e::read_file(&summary)).unwrap_or_else(|e| panic!("{e}"));
    let rollout = &report["rollout"];
    assert_eq!(rollout["version"], "2.0.0+2", "{report}");
    assert_eq!(rollout["state"], "completed", "{report}");
    assert!(rollout["seconds"].as_f64().is_some(), "{report}");
    let failures = report["simulated_failures"].as_u64().unwrap();
    let updated = report["versions"]["2.0.0+2"].as_u64().unwrap_or(0);
    assert_eq!(updated + failures, 40, "{report}");
    assert!(
        report["bundle_bytes"].as_u64().unwrap() >= updated * std::fs::metadata(&b2).unwrap().len()
    );
    assert!(report["endpoints"]["connect"]["count"].as_u64().unwrap() > 40);
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
}

/// `--http2 N`: a process's agents share N HTTP/2 connections, so one process holds more
/// agents than it has descriptors. Every agent still registers, is held and updates.
#[test]
fn fleet_sim_agents_held_over_shared_http2_connections_register_and_update() {
    let ctx = TestContext::new();
    let (server, b2) = serving_1_0_0(&ctx, &[("UPDATE_SERVER_ROLLOUT_WAVES", "100%")]);
    let summary = ctx.path("sim.json");
    let sim = fleet_sim(
        &ctx,
        &server,
        &summary,
        &[
            "--agents",
            "300",
            "--heartbeat",
            "20s",
            "--download",
            "head",
            "--fail-rate",
            "0",
            "--long-poll",
            "--http2",
            "2",
        ],
    );
    let pid = ctx.spawn(sim);
    wait_until(
        Duration::from_secs(60),
        "300 agents held over two connections",
        || e2e::metric(&server, "agentupdate_connects_held") >= 300.0,
    );
    // The 300 held connects are streams of two connections (and the test's own).
    let open = e2e::metric(&server, "agentupdate_connections_open");
    assert!(open <= 4.0, "{open} connections open for 300 held agents");
    assert_eq!(e2e::admin_agents(server.port, "t").len(), 300);
    ctx.republish(&server, &b2);
    wait_until(Duration::from_secs(120), "fleet-sim to finish", || {
        e2e::pid_gone(pid)
    });
    let report: serde_json::Value =
        serde_json::from_str(&e2e::read_file(&summary)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report["rollout"]["state"], "completed", "{report}");
    assert_eq!(report["versions"]["2.0.0+2"], 300, "{report}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
}

/// More held agents a connection than the server's streams allow is refused at once,
/// saying how many connections would do.
#[test]
fn fleet_sim_refuses_more_held_agents_a_connection_than_the_server_allows() {
    let ctx = TestContext::new();
    let out = e2e::run(
        ctx.cmd("fleet-sim")
            .args(["--server", "http://127.0.0.1:1", "--agents", "1000"])
            .args(["--long-poll", "--http2", "2", "--duration", "1s"]),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use --http2 7 or more"), "{err}");
}
