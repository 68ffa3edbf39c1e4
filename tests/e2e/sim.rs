//! fleet-sim against a real server: simulated agents go through a staged rollout, and
//! the summary says what happened.

use std::process::Stdio;
use std::time::Duration;

use e2e::{TestContext, wait_until};

#[test]
fn fleet_sim_follows_a_staged_rollout_to_its_end_and_reports_it() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", "t"),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "10%,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "50%"),
        ],
    );
    ctx.publish_served(&server, &b1);
    let summary = ctx.path("sim.json");
    let mut sim = ctx.cmd("fleet-sim");
    sim.args([
        "--server",
        &server.url(""),
        "--agents",
        "40",
        "--heartbeat",
        "300ms",
    ])
    .args([
        "--ramp",
        "1s",
        "--install-time",
        "200ms",
        "--download",
        "full",
    ])
    .args(["--fail-rate", "0.1", "--until-rollout-end", "--token", "t"])
    .args(["--duration", "120s", "--json"])
    .arg(&summary)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
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
