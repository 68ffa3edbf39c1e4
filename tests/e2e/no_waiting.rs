//! Nothing an agent must do waits for its held connect (issue 30): a transient failure
//! (a full disk) is retried on its backoff while the agent long-polls, and a report the
//! updater writes after a rollback reaches the server at once, not a heartbeat later.
//! Each test runs with long polls on (the default) and off (heartbeats).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, configure_agent, failpoints_stub, log_time,
    read_file, wait_until,
};

use crate::full_disk::{Filler, Tmpfs, version_of};
use crate::update::{QUICK, agents_running, current, script_agent};

const LONG: Duration = Duration::from_secs(60);
/// Full-disk cycles per test: each is a new release the disk fills under.
const CYCLES: usize = 3;
/// Space returns: the update must go through by itself within this.
const CONVERGE: Duration = Duration::from_secs(10);

fn now_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Sets the agent's heartbeat and long polls in its conf/agent.toml.
fn agent_conf(home: &Path, server: &ServerProc, heartbeat: &str, long_poll: bool) {
    configure_agent(home, &[server.url("")], "");
    let conf = read_file(&home.join("conf/agent.toml")).replace(
        "heartbeat = \"1s\"",
        &format!("heartbeat = \"{heartbeat}\"\nlong-poll = {long_poll}"),
    );
    fs::write(home.join("conf/agent.toml"), conf).unwrap();
}

/// How many rounds ended without the switch so far (the agent's own words).
fn failed_rounds(home: &Path) -> usize {
    read_file(&home.join("logs/agent.log"))
        .lines()
        .filter(|l| {
            l.contains("running degraded")
                || l.contains("stopped before the switch")
                || l.contains("asking the updater to close it")
        })
        .count()
}
/// Moves the agent's `logs/` off its small disk (a symlink to a directory on the test's
/// own), as `/var/log` often is. This test reads the agent's words to count its rounds,
/// and on a full disk a log takes lines only until its last page is full: how many
/// fit depended on what came before (a busy machine makes the agent log more waits),
/// and a round that left no line was a round the test could not see.
fn logs_on_another_disk(ctx: &TestContext, home: &Path) {
    let logs = home.join("logs");
    let elsewhere = ctx.path("agent-logs");
    fs::create_dir_all(&elsewhere).unwrap();
    for entry in fs::read_dir(&logs).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), elsewhere.join(entry.file_name())).unwrap();
    }
    fs::remove_dir_all(&logs).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &logs).unwrap();
}

/// Polls `cond` for [`LONG`]; on timeout, fails showing the agent's logs.
fn wait_logged(home: &Path, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + LONG;
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {LONG:?} waiting for {what}\n{}",
            e2e::agent_logs(home)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A real server and agent at a 1 s heartbeat; the agent's home on a small tmpfs. In
/// each cycle a new release is published, the disk fills the moment the agent hands
/// the bundle to the updater (whose unpack is held a second by a fault point, so the
/// fill is never late), the agent keeps running its version, the space returns, and the update
/// goes through by itself within [`CONVERGE`].
fn full_disk_cycles(long_poll: bool) {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let stub = failpoints_stub().display().to_string();
    let versions: Vec<String> = (1..=CYCLES + 1).map(|v| format!("{v}.0.0")).collect();
    let bundles: Vec<PathBuf> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let build = (i + 1).to_string();
            let d = ctx.dist(&format!("d{build}"));
            ctx.pack_with(
                &d,
                v,
                &build,
                &key,
                &format!("b{build}"),
                &["--stub", &stub],
            )
        })
        .collect();
    // The default [rollout]: one agent, whose rounds the full disk abandons. A machine's
    // fault (RETRYING) must never halt the rollout, or nothing would be offered again.
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundles[0]);

    let dir = ctx.path("disk");
    let agent_bytes = fs::metadata(e2e::bin_path("agent")).unwrap().len();
    let bundle_bytes = fs::metadata(&bundles[1]).unwrap().len();
    // Room for the installed version and an update (the agent wants four times the
    // bundle free before it downloads), the versions kept for rollback with the bundle
    // each came from (the base of a delta), and little more.
    let _disk = Tmpfs::mount(&dir, 2 * agent_bytes + 8 * bundle_bytes + (48 << 20));
    let filler = Filler { dir: dir.clone() };
    let home = ctx.install(&bundles[0], "disk");
    logs_on_another_disk(&ctx, &home);
    agent_conf(&home, &server, "1s", long_poll);
    fs::write(
        home.join("conf/agent-env.sh"),
        format!("{QUICK}export FAILPOINTS='updater-unpacking=sleep(1000)'\n"),
    )
    .unwrap();
    crate::update::start(&home);
    wait_until(LONG, "the agent to register", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == "1.0.0+1")
    });

    for cycle in 1..=CYCLES {
        let old = format!("{}+{cycle}", versions[cycle - 1]);
        let new = format!("{}+{}", versions[cycle], cycle + 1);
        let failed_before = failed_rounds(&home);
        ctx.republish(&server, &bundles[cycle]);
        // The agent has its bundle (downloaded, or rebuilt from a delta) and has written
        // the journal that hands it to the updater: the disk fills while the updater's
        // unpack is held, not in the instant the agent writes the journal.
        let journal = home.join("data/update-journal.json");
        let to = format!("\"{new}\"");
        let end = Instant::now() + LONG;
        while !read_file(&journal).contains(&to) {
            assert!(
                Instant::now() < end,
                "cycle {cycle}: the hand-off to {new} was never written\n{}",
                e2e::agent_logs(&home)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        filler.fill();
        wait_logged(&home, "the round to fail on the full disk", || {
            failed_rounds(&home) > failed_before
        });
        // While the disk stays full the agent keeps at it: it asks the updater to close
        // the update it could not close, or tries again, on its own.
        wait_logged(&home, "a retry while the disk is full", || {
            failed_rounds(&home) > failed_before + 1
        });
        wait_logged(&home, "the server to list the agent RETRYING", || {
            admin_agents(server.port, TOKEN)
                .iter()
                .any(|a| a["update_status"] == "RETRYING")
        });
        let rollout = e2e::admin_rollout(&server, TOKEN).unwrap();
        assert_ne!(
            rollout["state"], "halted",
            "cycle {cycle}: a full disk halted the rollout: {rollout}"
        );
        let running = agents_running(&home);
        assert_eq!(
            running.len(),
            1,
            "cycle {cycle}: agents {running:?}\n{}",
            e2e::agent_logs(&home)
        );
        assert_eq!(
            version_of(running[0]).as_deref(),
            Some(old.as_str()),
            "cycle {cycle}: the agent does not run its old version\n{}",
            e2e::agent_logs(&home)
        );

        filler.free();
        let freed = Instant::now();
        let mut through = false;
        while freed.elapsed() < LONG {
            let agents = agents_running(&home);
            through = current(&home) == format!("versions/{new}")
                && agents.len() == 1
                && version_of(agents[0]).as_deref() == Some(new.as_str())
                && admin_agents(server.port, TOKEN)
                    .iter()
                    .any(|a| a["version"] == new.as_str() && a["update_status"] == "INSTALLED");
            if through {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let took = freed.elapsed();
        assert!(
            through && took < CONVERGE,
            "cycle {cycle} (long polls {long_poll}): {new} {} {:.1}s after the space returned (limit {CONVERGE:?})\n{}",
            if through {
                "went through"
            } else {
                "had not gone through"
            },
            took.as_secs_f64(),
            e2e::agent_logs(&home)
        );
        eprintln!(
            "cycle {cycle} (long polls {long_poll}): {new} installed {:.1}s after the space returned",
            took.as_secs_f64()
        );
    }
}

#[test]
fn a_full_disk_is_retried_while_the_agent_long_polls() {
    full_disk_cycles(true);
}

#[test]
fn a_full_disk_is_retried_with_heartbeats() {
    full_disk_cycles(false);
}

/// Rounds of [`failed_update_told_at_once`] with long polls and with heartbeats: a path
/// that left the report for the next heartbeat was seen once in five; ten rounds over
/// the two tests catch it with 89 %. A heartbeat round waits a heartbeat (30 s) for its
/// offer, so most rounds hold.
const HALT_ROUNDS: (usize, usize) = (7, 3);

/// Three agents at the default 30 s heartbeat, waves `["1", "100%"]`, no failure allowed.
/// In each of its [`HALT_ROUNDS`] a new bundle whose agent exits at once rolls back on
/// its first wave's agent; its `INSTALL_FAILED` reaches the server within 1 s of the
/// rolled-back agent starting, and the rollout halts within 5 s of the rollback.
fn failed_update_told_at_once(long_poll: bool) {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    ctx.publish_served(&server, &b1);
    let homes: Vec<PathBuf> = (0..3)
        .map(|i| {
            let home = ctx.install(&b1, &format!("fleet/{i}"));
            agent_conf(&home, &server, "30s", long_poll);
            fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
            home
        })
        .collect();
    e2e::start_wrappers(&homes);
    wait_until(LONG, "three agents to register", || {
        admin_agents(server.port, TOKEN).len() == 3
    });

    let rounds = if long_poll {
        HALT_ROUNDS.0
    } else {
        HALT_ROUNDS.1
    };
    for round in 0..rounds {
        let major = round + 2;
        let version = format!("{major}.0.0+{major}");
        let d = ctx.dist(&format!("d{major}"));
        script_agent(&d, "exit 1");
        let bundle = ctx.pack(
            &d,
            &format!("{major}.0.0"),
            &major.to_string(),
            &key,
            &format!("b{major}"),
        );
        if long_poll {
            wait_until(LONG, "every agent to hold a connect", || {
                e2e::metric(&server, "agentupdate_connects_held") >= 3.0
            });
        }
        ctx.republish(&server, &bundle);
        // Watched as it happens: when the server first counts the failure, and the halt.
        let mut reported_at = None;
        let mut halted_at = None;
        let end = Instant::now() + LONG;
        while reported_at.is_none() || halted_at.is_none() {
            assert!(
                Instant::now() < end,
                "round {round}: no INSTALL_FAILED ({reported_at:?}) or no halt ({halted_at:?}) within {LONG:?}: {:?}",
                e2e::admin_rollout(&server, TOKEN)
            );
            let rollout =
                e2e::admin_rollout(&server, TOKEN).filter(|r| r["version"] == version.as_str());
            if reported_at.is_none()
                && rollout
                    .as_ref()
                    .is_some_and(|r| r["waves"][0]["failed"].as_u64() == Some(1))
            {
                reported_at = Some(now_secs_f64());
            }
            if halted_at.is_none() && rollout.as_ref().is_some_and(|r| r["state"] == "halted") {
                halted_at = Some(now_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (reported_at, halted_at) = (reported_at.unwrap(), halted_at.unwrap());

        // The round's canary: the agent whose updater rolled this version back.
        let rolled_back_line = format!("-> {version}] rolled back to 1.0.0+1");
        let said = Instant::now() + Duration::from_secs(10);
        let home = loop {
            if let Some(h) = homes
                .iter()
                .find(|h| read_file(&h.join("logs/update.log")).contains(&rolled_back_line))
            {
                break h;
            }
            assert!(
                Instant::now() < said,
                "round {round}: no agent rolled {version} back"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // The old version's agent, started again by the updater as the rollback's last
        // step (update.log counts whole seconds; the agent's log has the instant).
        let restarted = read_file(&home.join("logs/agent.log"))
            .lines()
            .filter(|l| l.contains("agent 1.0.0+1 started"))
            .filter_map(log_time)
            .next_back()
            .unwrap_or_else(|| {
                panic!(
                    "the old agent did not start again\n{}",
                    e2e::agent_logs(home)
                )
            });
        eprintln!(
            "long polls {long_poll}, round {round}: the old agent started again at {restarted:.3}; INSTALL_FAILED counted {:+.3}s, halted {:+.3}s",
            reported_at - restarted,
            halted_at - restarted
        );
        assert!(
            reported_at - restarted < 1.0,
            "round {round}: INSTALL_FAILED reached the server {:.3}s after the rolled-back agent started (limit 1 s)\n{}",
            reported_at - restarted,
            e2e::agent_logs(home)
        );
        assert!(
            halted_at - restarted < 5.0,
            "round {round}: the rollout halted {:.3}s after the rollback (limit 5 s)\n{}",
            halted_at - restarted,
            e2e::agent_logs(home)
        );
        // The other agents were never told: they stay on 1.0.0.
        for a in admin_agents(server.port, TOKEN) {
            assert_eq!(a["version"], "1.0.0+1", "{a}");
        }
    }
}

#[test]
fn a_failed_update_halts_its_wave_at_once_while_agents_long_poll() {
    failed_update_told_at_once(true);
}

#[test]
fn a_failed_update_halts_its_wave_at_once_with_heartbeats() {
    failed_update_told_at_once(false);
}
