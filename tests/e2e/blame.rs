//! Failures blamed right and told at once (issue 42): what an agent refuses before it
//! installs (an untrusted key) reaches the server within seconds and halts the rollout
//! with the agent's own words, not at the deadline; a canary that rolls back during its
//! stability window never lets the next wave open. A release without its signature
//! never gets that far: the server refuses it (issue 59).

use std::fs;
use std::path::Path;
use std::time::Duration;

use e2e::{TOKEN, admin_agents, read_file, wait_until};
use serde_json::Value;

use crate::rollout::{Fleet, LONG, NEW, OLD, agent_home, fleet_with};

/// Well inside the default agent deadline (30 min): a halt this soon is the report's.
const AT_ONCE: Duration = Duration::from_secs(60);

fn two_agents(agent_env: &str, dist2: impl FnOnce(&Path)) -> Fleet {
    fleet_with(
        2,
        &[("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%")],
        &[],
        agent_env,
        dist2,
    )
}

/// Waits for the rollout of 2.0.0 to halt; its status.
fn halted(f: &Fleet) -> Value {
    e2e::wait_rollout(&f.server, TOKEN, AT_ONCE, "the rollout to halt", |r| {
        r["version"] == NEW && r["state"] == "halted"
    })
}

/// The first wave's agent failed with `words`; the other was never told, and both
/// run the old version, accepted.
fn only_the_canary_failed(f: &Fleet, status: &Value, words: &str) {
    let reason = status["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(words), "halt reason: {reason}");
    assert_eq!(status["wave"], 1, "{status}");
    let agents = admin_agents(f.server.port, TOKEN);
    let failed: Vec<&Value> = agents
        .iter()
        .filter(|a| a["update_status"] == "INSTALL_FAILED")
        .collect();
    assert_eq!(failed.len(), 1, "{agents:?}");
    let error = failed[0]["update_error"].as_str().unwrap_or_default();
    assert!(error.contains(words), "the agent's words: {error}");
    for a in &agents {
        assert_eq!(a["version"], OLD, "{a}");
        if a["wave"] != 1 {
            assert!(a["told_at"].is_null(), "told outside the first wave: {a}");
            let home = agent_home(f, a["id"].as_str().unwrap_or_default());
            let log = read_file(&home.join("logs/agent.log"));
            assert!(
                !log.contains(&format!("expects {NEW}; updating")),
                "{}: {log}",
                home.display()
            );
        }
    }
}

/// Issue 59: a release dropped without its signature was served, its rollout started,
/// and the canary refused it (`.minisig` missing). The server refuses it now, as `release
/// publish` does: `/healthz` says why, no agent is told, nothing halts.
#[test]
fn a_release_without_its_signature_is_refused_by_the_server_before_any_agent_is_told() {
    let f = two_agents(crate::rollout::FLEET_AGENT_ENV, |_| {});
    f.server.clear_bundles();
    let name = f.b2.file_name().unwrap();
    fs::copy(&f.b2, f.server.download_dir().join(name)).unwrap();
    let healthz = || {
        e2e::http(f.server.port, "GET", "/healthz", &[])
            .unwrap()
            .text()
    };
    wait_until(AT_ONCE, "/healthz to say the release is refused", || {
        healthz().starts_with("degraded\n")
    });
    let health = healthz();
    assert!(
        health.contains("agent-bundle-2.0.0.minisig") && health.contains("agent-bundle sign"),
        "{health}"
    );
    // Looked at for a while: no rollout of it, no agent told or failed.
    std::thread::sleep(Duration::from_secs(5));
    let rollout = e2e::admin_rollout(&f.server, TOKEN).unwrap();
    assert_eq!(rollout["version"], OLD, "{rollout}");
    assert_eq!(rollout["state"], "completed", "{rollout}");
    for a in admin_agents(f.server.port, TOKEN) {
        assert_eq!(a["version"], OLD, "{a}");
        assert_ne!(a["update_status"], "INSTALL_FAILED", "{a}");
    }
}

#[test]
fn a_release_signed_by_an_untrusted_key_halts_at_once_with_the_agents_words() {
    let f = two_agents(crate::rollout::FLEET_AGENT_ENV, |_| {});
    let (stranger, _) = f.ctx.keygen("stranger");
    let foreign = f.ctx.pack(
        &f.ctx.dist("d2-foreign"),
        "2.0.0",
        "2",
        &stranger,
        "b2-foreign",
    );
    f.ctx.republish(&f.server, &foreign);
    let status = halted(&f);
    only_the_canary_failed(&f, &status, "signature check failed");
    // The agent says it too.
    let canary = admin_agents(f.server.port, TOKEN)
        .into_iter()
        .find(|a| a["update_status"] == "INSTALL_FAILED")
        .unwrap();
    let home = agent_home(&f, canary["id"].as_str().unwrap());
    let status =
        e2e::run_ok(std::process::Command::new(home.join("current/bin/agent")).arg("status"));
    let said = e2e::stdout(&status);
    assert!(
        said.contains("INSTALL_FAILED") && said.contains("signature check failed"),
        "{said}"
    );
}

/// The canary's new agent registers on 2.0.0 and is killed four seconds later, inside its
/// eight-second stability window: it rolls back, and the next wave never opens.
#[test]
fn a_canary_that_rolls_back_in_its_stability_window_never_opens_the_next_wave() {
    let env = "export AGENT_UPDATE_STABILITY_WINDOW=8s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=120s\n";
    let f = two_agents(env, |d| {
        fs::rename(d.join("bin/agent"), d.join("bin/agent.real")).unwrap();
        crate::update::script_agent(
            d,
            r#"real="$(dirname "$0")/agent.real"
[ "$1" = run ] || exec "$real" "$@"
"$real" "$@" &
pid=$!
trap 'kill -TERM $pid; wait $pid; exit 0' TERM INT
sleep 4
kill -9 $pid
exit 1"#,
        );
    });
    f.ctx.republish(&f.server, &f.b2);
    // The canary calls in on the new version before its window ends...
    wait_until(LONG, "the canary to call in on 2.0.0", || {
        admin_agents(f.server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == NEW)
    });
    // ... and is not done for it.
    let status = halted(&f);
    only_the_canary_failed(&f, &status, "");
}
