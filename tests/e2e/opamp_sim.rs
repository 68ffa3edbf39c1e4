//! The project's own OpAMP client (`fleet-sim --protocol opamp`) over both transports
//! against a real update-server: a staged rollout offers the `agent` package to its
//! first wave only, which fetches it with the offered URL, checks its hash and its
//! signature, installs it and reports `INSTALLED`; the next wave opens on `advance`
//! and the rollout completes. A failing install (a simulated one over HTTP, a
//! signature from another key over WebSocket) halts the rollout in its first wave.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use e2e::{ServerProc, TestContext, admin_agents, http, http_with_body, pid_gone, wait_until};
use serde_json::Value;

const ADMIN: &str = "opamp-sim-admin";
const ENROLL: &str = "opamp-sim-enroll";
const AGENTS: usize = 20;
/// The first wave: 10 % of 20.
const FIRST_WAVE: usize = 2;
const OLD: &str = "1.0.0+1";
const NEW: &str = "2.0.0+2";
const LONG: Duration = Duration::from_secs(90);

struct Setup {
    ctx: TestContext,
    server: ServerProc,
    b2: PathBuf,
    public_key: PathBuf,
}

/// A server serving 1.0.0+1, with waves `10%, 100%`, no failure allowed and a first
/// wave that soaks for ten minutes (`advance` opens the next).
fn setup() -> Setup {
    let ctx = TestContext::new();
    let (key, public_key) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "10%,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "600"),
        ],
    );
    ctx.publish_served(&server, &b1);
    Setup {
        ctx,
        server,
        b2,
        public_key,
    }
}

/// Starts `fleet-sim --protocol opamp` with 20 agents; returns its pid and summary path.
fn start_sim(s: &Setup, transport: &str, trust_key: &Path, fail_rate: &str) -> (u32, PathBuf) {
    let summary = s.ctx.path(&format!("sim-{transport}.json"));
    let mut sim = s.ctx.cmd("fleet-sim");
    sim.args(["--server", &s.server.url(""), "--protocol", "opamp"])
        .args(["--transport", transport, "--agents", &AGENTS.to_string()])
        .args([
            "--heartbeat",
            "500ms",
            "--ramp",
            "1s",
            "--install-time",
            "200ms",
        ])
        .args([
            "--download",
            "full",
            "--fail-rate",
            fail_rate,
            "--trust-key",
        ])
        .arg(trust_key)
        .args(["--enrollment-token", ENROLL, "--token", ADMIN])
        .args(["--until-rollout-end", "--duration", "120s", "--json"])
        .arg(&summary)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.ctx.path(&format!("sim-{transport}.log"))).unwrap());
    (s.ctx.spawn(sim), summary)
}

fn rollout(server: &ServerProc) -> Value {
    let auth = format!("Bearer {ADMIN}");
    let a = http(
        server.port,
        "GET",
        "/admin/rollout",
        &[("Authorization", &auth)],
    )
    .unwrap();
    serde_json::from_slice(&a.body).unwrap_or_default()
}

fn opamp_rows(server: &ServerProc) -> Vec<Value> {
    admin_agents(server.port, ADMIN)
        .into_iter()
        .filter(|r| r["protocol"] == "opamp")
        .collect()
}

fn count(rows: &[Value], key: &str, value: &str) -> usize {
    rows.iter().filter(|r| r[key] == value).count()
}

/// All the simulated agents online and reporting 1.0.0+1 (the served version: offered
/// to them as installed already), then 2.0.0+2 published.
fn join_then_publish(s: &Setup) {
    wait_until(LONG, "the simulated OpAMP agents to report in", || {
        let rows = opamp_rows(&s.server);
        rows.len() == AGENTS && count(&rows, "version", OLD) == AGENTS
    });
    let rows = opamp_rows(&s.server);
    for r in &rows {
        assert_eq!(r["online"], true, "{r}");
        assert!(
            r["description"]["service.name"]
                .as_str()
                .is_some_and(|n| n.starts_with("sim-")),
            "{r}"
        );
        assert_eq!(r["description"]["service.version"], OLD, "{r}");
    }
    s.ctx.republish(&s.server, &s.b2);
}

fn read_summary(path: &Path, pid: u32) -> Value {
    wait_until(LONG, "fleet-sim to finish", || pid_gone(pid));
    serde_json::from_str(&e2e::read_file(path)).unwrap_or_else(|e| panic!("{e}"))
}

fn first_wave_then_advance_to_completion(transport: &str) {
    let s = setup();
    let (pid, summary) = start_sim(&s, transport, &s.public_key, "0");
    join_then_publish(&s);
    wait_until(LONG, "the first wave to complete and soak", || {
        let r = rollout(&s.server);
        r["version"] == NEW && r["state"] == "soaking"
    });
    // Only the first wave was offered the package: it runs 2.0.0+2, the rest were
    // never told and still run 1.0.0+1.
    let rows = opamp_rows(&s.server);
    assert_eq!(count(&rows, "version", NEW), FIRST_WAVE, "{rows:#?}");
    assert_eq!(count(&rows, "version", OLD), AGENTS - FIRST_WAVE);
    for r in rows.iter().filter(|r| r["version"] == NEW) {
        assert_eq!(r["description"]["service.version"], NEW, "{r}");
    }
    let auth = format!("Bearer {ADMIN}");
    let advanced = http_with_body(
        s.server.port,
        "POST",
        "/admin/rollout/advance",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        b"",
    )
    .unwrap();
    assert_eq!(advanced.status, 200, "{}", advanced.text());
    let report = read_summary(&summary, pid);
    assert_eq!(report["rollout"]["version"], NEW, "{report:#}");
    assert_eq!(report["rollout"]["state"], "completed", "{report:#}");
    assert_eq!(report["versions"][NEW], AGENTS as u64, "{report:#}");
    assert_eq!(report["simulated_failures"], 0, "{report:#}");
    // Each agent fetched the whole bundle, and checked it.
    let size = std::fs::metadata(&s.b2).unwrap().len();
    assert!(
        report["bundle_bytes"].as_u64().unwrap() >= AGENTS as u64 * size,
        "{report:#}"
    );
    assert_eq!(report["errors"], serde_json::json!({}), "{report:#}");
    let rows = opamp_rows(&s.server);
    assert_eq!(count(&rows, "version", NEW), AGENTS, "{rows:#?}");
}

/// `trust_key`: the key the agents trust (default: the one the bundles are signed with).
fn a_failing_install_halts_the_first_wave(
    transport: &str,
    trust_key: Option<&Path>,
    fail_rate: &str,
) -> Vec<Value> {
    let s = setup();
    let (pid, summary) = start_sim(&s, transport, trust_key.unwrap_or(&s.public_key), fail_rate);
    join_then_publish(&s);
    let report = read_summary(&summary, pid);
    assert_eq!(report["rollout"]["state"], "halted", "{report:#}");
    assert_eq!(report["rollout"]["wave"], 1, "{report:#}");
    assert_eq!(report["versions"][OLD], AGENTS as u64, "{report:#}");
    let rows = opamp_rows(&s.server);
    // The halt came at the first failure: at most the first wave tried, nobody after.
    let failed = count(&rows, "update_status", "INSTALL_FAILED");
    assert!((1..=FIRST_WAVE).contains(&failed), "{rows:#?}");
    assert_eq!(count(&rows, "version", OLD), AGENTS, "{rows:#?}");
    rows.into_iter()
        .filter(|r| r["update_status"] == "INSTALL_FAILED")
        .collect()
}

#[test]
fn opamp_sim_over_http_updates_the_first_wave_then_completes() {
    first_wave_then_advance_to_completion("http");
}

#[test]
fn opamp_sim_over_websocket_updates_the_first_wave_then_completes() {
    first_wave_then_advance_to_completion("ws");
}

#[test]
fn opamp_sim_over_http_a_failed_install_halts_the_rollout() {
    // The installs themselves fail (`--fail-rate 1`).
    let failed = a_failing_install_halts_the_first_wave("http", None, "1");
    assert!(
        failed[0]["update_error"]
            .as_str()
            .is_some_and(|e| e.contains("simulated")),
        "{failed:#?}"
    );
}

#[test]
fn opamp_sim_over_websocket_a_bad_signature_halts_the_rollout() {
    // The agents trust another key than the one the bundle is signed with.
    let other = TestContext::new();
    let (_, other_key) = other.keygen("other");
    let failed = a_failing_install_halts_the_first_wave("ws", Some(&other_key), "0");
    assert!(
        failed[0]["update_error"]
            .as_str()
            .is_some_and(|e| e.contains("signature")),
        "{failed:#?}"
    );
}

const ARM: &str = "aarch64-unknown-linux-musl";

/// A server serving 1.0.0, and `AGENTS` simulated OpAMP agents on it, about half of them
/// on aarch64: the setup, the simulator's pid and where its summary goes.
fn half_arm_fleet() -> (Setup, PathBuf, u32, PathBuf) {
    let ctx = TestContext::new();
    let (key, public_key) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    ctx.publish_served(&server, &b1);
    let s = Setup {
        ctx,
        server,
        b2: PathBuf::new(),
        public_key,
    };
    // Half the fleet says it runs on aarch64 (as `os.type` linux, `host.arch` arm64).
    let arm = ARM;
    let (pid, summary) = {
        let summary = s.ctx.path("sim.json");
        let mut sim = s.ctx.cmd("fleet-sim");
        sim.args(["--server", &s.server.url(""), "--protocol", "opamp"])
            .args(["--transport", "http", "--agents", &AGENTS.to_string()])
            .args([
                "--heartbeat",
                "500ms",
                "--ramp",
                "1s",
                "--install-time",
                "200ms",
            ])
            // The first bytes and the signature: what is offered is the point here, and
            // twenty whole debug bundles at once would only load the machine.
            .args(["--download", "head", "--trust-key"])
            .arg(&s.public_key)
            .args(["--platform", &format!("{arm}=0.5")])
            .args(["--enrollment-token", ENROLL, "--token", ADMIN])
            .args(["--until-rollout-end", "--duration", "120s", "--json"])
            .arg(&summary)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(s.ctx.path("sim.log")).unwrap());
        (s.ctx.spawn(sim), summary)
    };
    wait_until(LONG, "the simulated OpAMP agents to report in", || {
        let rows = opamp_rows(&s.server);
        rows.len() == AGENTS && count(&rows, "version", OLD) == AGENTS
    });
    let rows = opamp_rows(&s.server);
    // (Spread over the fleet by a low-discrepancy sequence: about half, not exactly.)
    let (arm64, amd64) = (
        count(&rows, "platform", "arm64-linux"),
        count(&rows, "platform", "amd64-linux"),
    );
    assert!(
        arm64 + amd64 == AGENTS && (8..=12).contains(&arm64),
        "{arm64} arm64, {amd64} amd64: {rows:#?}"
    );
    (s, key, pid, summary)
}

#[test]
fn opamp_sim_agents_describe_their_platform_and_each_takes_its_releases_bundle() {
    let (s, key, pid, summary) = half_arm_fleet();
    let arm = ARM;
    // 2.0.0 for x86_64 glibc and static aarch64: each half is offered its own.
    // Both copied in under hidden names first, then renamed: a server that saw one of
    // them alone would serve a release of one bundle for a moment (offered at the plain
    // download path, which answers 300 once the second arrives).
    s.server.clear_bundles();
    let dir = s.server.download_dir();
    let mut names = Vec::new();
    for platform in ["x86_64-unknown-linux-gnu", arm] {
        let bundle = s.ctx.pack_with(
            &s.ctx.dist(&format!("d2-{platform}")),
            "2.0.0",
            "2",
            &key,
            &format!("b2-{platform}"),
            &["--platform", platform],
        );
        let name = format!("agent-bundle-2.0.0-{platform}");
        std::fs::copy(
            format!("{}.minisig", bundle.display()),
            dir.join(format!("{name}.minisig")),
        )
        .unwrap();
        std::fs::copy(&bundle, dir.join(format!(".{name}"))).unwrap();
        names.push(name);
    }
    for name in &names {
        std::fs::rename(dir.join(format!(".{name}")), dir.join(name)).unwrap();
    }
    let report = read_summary(&summary, pid);
    assert_eq!(report["rollout"]["version"], NEW, "{report:#}");
    assert_eq!(report["rollout"]["state"], "completed", "{report:#}");
    assert_eq!(report["versions"][NEW], AGENTS as u64, "{report:#}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report:#}");
    let r = rollout(&s.server);
    // (`no_bundle` is left out when none.)
    assert_eq!(r["waves"][0]["no_bundle"].as_u64().unwrap_or(0), 0, "{r}");
    assert_eq!(r["waves"][0]["installed"], AGENTS, "{r}");
}

/// A release of x86_64 alone is offered to the x86_64 half only: the aarch64 agents are
/// `NO_BUNDLE` and keep their version, and the rollout completes without them.
#[test]
fn opamp_sim_agents_on_arm64_are_not_offered_an_x86_64_only_release() {
    let (s, key, pid, summary) = half_arm_fleet();
    let rows = opamp_rows(&s.server);
    let arm64 = count(&rows, "platform", "arm64-linux");
    let b2 = s.ctx.pack_with(
        &s.ctx.dist("d2"),
        "2.0.0",
        "2",
        &key,
        "b2",
        &["--platform", "x86_64-unknown-linux-gnu"],
    );
    s.ctx.republish(&s.server, &b2);
    let report = read_summary(&summary, pid);
    assert_eq!(report["rollout"]["version"], NEW, "{report:#}");
    assert_eq!(report["rollout"]["state"], "completed", "{report:#}");
    assert_eq!(
        report["versions"][NEW],
        (AGENTS - arm64) as u64,
        "{report:#}"
    );
    assert_eq!(report["versions"][OLD], arm64 as u64, "{report:#}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report:#}");
    let rows = opamp_rows(&s.server);
    for row in rows.iter().filter(|r| r["platform"] == "arm64-linux") {
        assert_eq!(row["version"], OLD, "{row}");
        assert_eq!(row["update_status"], "NO_BUNDLE", "{row}");
    }
}

/// A configuration set pushed to a group reaches fleet-sim's OpAMP agents on both
/// transports (pushed at once over WebSocket, at the next poll over HTTP), and each
/// reports it `APPLIED` with its hash and runs it as its effective configuration.
#[test]
fn opamp_sim_applies_a_pushed_configuration_over_both_transports() {
    let ctx = TestContext::new();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
        ],
    );
    for transport in ["http", "ws"] {
        let mut sim = ctx.cmd("fleet-sim");
        sim.args(["--server", &server.url(""), "--protocol", "opamp"])
            .args([
                "--transport",
                transport,
                "--agents",
                "10",
                "--group",
                "edge=1",
            ])
            .args(["--heartbeat", "500ms", "--ramp", "1s", "--duration", "120s"])
            .args(["--enrollment-token", ENROLL])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        ctx.spawn(sim);
    }
    wait_until(LONG, "20 OpAMP agents in group edge", || {
        let rows = opamp_rows(&server);
        rows.len() == 20 && count(&rows, "group", "edge") == 20
    });
    let auth = format!("Bearer {ADMIN}");
    let files = serde_json::json!({"files": {"app.json": "{\"sampling\": 0.25}"}});
    let put = http_with_body(
        server.port,
        "PUT",
        "/admin/config/edge",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        files.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(put.status, 200, "{}", put.text());
    let hash = serde_json::from_slice::<Value>(&put.body).unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_until(LONG, "every agent to report the set APPLIED", || {
        let rows = opamp_rows(&server);
        rows.iter().all(|r| {
            r["remote_config_status"] == "APPLIED" && r["remote_config_hash"] == hash.as_str()
        })
    });
    let rows = opamp_rows(&server);
    // They all run the same files now: one effective configuration hash, not the empty one.
    let effective = rows[0]["effective_config_hash"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        rows.iter()
            .all(|r| r["effective_config_hash"] == effective.as_str()),
        "{rows:#?}"
    );
    assert_ne!(
        effective,
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}
