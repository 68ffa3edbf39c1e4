//! The workload end to end: Debian's real node exporter packed in a bundle as the
//! operator's program, installed, supervised by the agent, crashed, orphaned, stopped,
//! and judged by the updater.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::{
    TestContext, agent_logs, free_port, http, pid_gone, read_file, require_tool, run_ok, signal,
    stdout, wait_until,
};

use crate::update::{
    QUICK, WAIT, agent_record, agents_running, current, health, serve_to, start, wait_server_status,
};

pub(crate) const NODE_EXPORTER: &str = "/usr/bin/prometheus-node-exporter";
/// A line of the textfile collector's file in conf.default/workload/, so `/metrics`
/// proves the configuration directory was seeded and `{config_dir}` filled in.
const MARKER: &str = "agent_workload_test_marker 1";

/// The `[workload]` the distribution declares: the exporter on `port`, reading its
/// textfile metrics from the workload's configuration directory.
fn workload_toml(port: u16) -> String {
    format!(
        r#"
[workload]
command = ["bin/node_exporter", "--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults", "--collector.textfile", "--collector.textfile.directory={{config_dir}}"]
health-url = "http://127.0.0.1:{port}/metrics"
start-timeout = "10s"
stop-timeout = "5s"
"#
    )
}

/// A distribution carrying the node exporter as `bin/node_exporter`, declared in its
/// `conf.default/agent.toml`, with `conf.default/workload/marker.prom`.
fn exporter_dist(ctx: &TestContext, dir: &str, port: u16) -> PathBuf {
    require_tool("prometheus-node-exporter");
    let dist = ctx.dist(dir);
    fs::copy(NODE_EXPORTER, dist.join("bin/node_exporter")).unwrap();
    let defaults = dist.join("conf.default/agent.toml");
    let text = read_file(&defaults);
    let without = text.split("\n[workload]").next().unwrap_or_default();
    fs::write(&defaults, format!("{without}\n{}", workload_toml(port))).unwrap();
    fs::create_dir_all(dist.join("conf.default/workload")).unwrap();
    fs::write(
        dist.join("conf.default/workload/marker.prom"),
        format!("{MARKER}\n"),
    )
    .unwrap();
    dist
}

/// The exporter's `/metrics`, if it answers 200.
fn metrics(port: u16) -> Option<String> {
    http(port, "GET", "/metrics", &[])
        .ok()
        .filter(|a| a.status == 200)
        .map(|a| a.text())
}

fn workload_pid(home: &Path) -> Option<u32> {
    read_file(&home.join("run/workload.pid"))
        .trim()
        .parse()
        .ok()
}

/// Live node exporters of this installation.
pub(crate) fn exporters(home: &Path) -> Vec<u32> {
    let needle = home.join("versions").display().to_string();
    e2e::pids_mentioning(&home.join("versions"))
        .into_iter()
        .filter(|pid| !pid_gone(*pid))
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe"))
                .map(|exe| {
                    exe.display().to_string().starts_with(&needle)
                        && exe.ends_with("bin/node_exporter")
                })
                .unwrap_or(false)
        })
        .collect()
}

fn exe_of(pid: u32) -> String {
    fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn wrapper(home: &Path, action: &str) -> String {
    stdout(&run_ok(
        Command::new(home.join("current/bin/agent-wrapper.sh")).arg(action),
    ))
}

/// Waits until the exporter on `port` answers with the marker and health.json says the
/// workload is healthy; returns its pid.
fn wait_healthy(home: &Path, port: u16) -> u32 {
    let start = Instant::now();
    loop {
        let h = health(home);
        let w = &h["workload"];
        if w["healthy"] == true
            && w["workload"] == "running"
            && metrics(port).is_some_and(|m| m.contains(MARKER))
            && let Some(pid) = w["pid"].as_u64()
        {
            return pid as u32;
        }
        assert!(
            start.elapsed() < WAIT,
            "the workload never became healthy; health.json {h}\n{}",
            agent_logs(home)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The installed conf/agent.toml (the distribution's defaults, workload included)
/// pointed at a server that never answers: the workload must not need one.
fn no_server(home: &Path) {
    let path = home.join("conf/agent.toml");
    let conf: String = read_file(&path)
        .lines()
        .map(|l| {
            if l.starts_with("urls = ") {
                "urls = [\"http://127.0.0.1:9\"]".to_owned()
            } else if l.starts_with("heartbeat = ") {
                "heartbeat = \"1s\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(conf.contains("bin/node_exporter"), "{conf}");
    fs::write(path, conf).unwrap();
}

#[test]
fn node_exporter_from_the_bundle_runs_answers_and_stops_with_the_wrapper() {
    let (_ctx, _, home, port) = installed(|_| {});
    assert_eq!(
        read_file(&home.join("conf/workload/marker.prom")).trim(),
        MARKER,
        "--install seeds conf/workload/ from conf.default/workload/"
    );
    // No server answers: the workload starts all the same.
    no_server(&home);
    start(&home);
    let pid = wait_healthy(&home, port);
    assert_eq!(workload_pid(&home), Some(pid), "run/workload.pid names it");
    assert!(
        exe_of(pid).starts_with(&home.join("versions/1.0.0+1").display().to_string()),
        "it runs from the version directory: {}",
        exe_of(pid)
    );
    // Its own process group.
    let stat = read_file(Path::new(&format!("/proc/{pid}/stat")));
    let pgrp: u32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .and_then(|g| g.parse().ok())
        .unwrap();
    assert_eq!(pgrp, pid, "the workload leads its own process group");
    let status = stdout(&run_ok(
        Command::new(home.join("current/bin/agent")).arg("status"),
    ));
    assert!(
        status.contains(&format!("workload: running (pid {pid}")) && status.contains("healthy"),
        "{status}"
    );
    let log = read_file(&home.join("logs/workload.log"));
    assert!(log.contains("started the workload"), "{log}");
    // The health check reads its answer: the exporter never sees a hang-up mid-answer.
    assert!(!log.contains("broken pipe"), "{log}");

    let out = wrapper(&home, "stop");
    assert!(out.contains("agent stopped"), "{out}");
    wait_until(
        Duration::from_secs(5),
        "the workload's group to end",
        || pid_gone(pid),
    );
    assert!(exporters(&home).is_empty(), "a node exporter survived stop");
    assert!(metrics(port).is_none(), "port {port} still answers");
    assert!(!home.join("run/workload.pid").exists());
    let log = read_file(&home.join("logs/workload.log"));
    assert!(
        log.contains(&format!("workload (pid {pid}) stopped")),
        "{log}"
    );
}

/// Agent 1.0.0 carrying the exporter (its distribution changed by `dist1`), installed:
/// the test's context, the signing key, AGENT_HOME and the exporter's port.
fn installed(dist1: impl FnOnce(&Path)) -> (TestContext, PathBuf, PathBuf, u16) {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let port = free_port();
    let d1 = exporter_dist(&ctx, "d1", port);
    dist1(&d1);
    let home = ctx.install(&ctx.pack(&d1, "1.0.0", "1", &key, "b1"), "p");
    (ctx, key, home, port)
}

/// Agent 1.0.0 carrying the exporter, installed and pointed at no server.
fn installed_without_server() -> (TestContext, PathBuf, u16) {
    let (ctx, _, home, port) = installed(|_| {});
    no_server(&home);
    (ctx, home, port)
}

#[test]
fn a_killed_workload_is_restarted_with_growing_delays_and_its_exits_logged() {
    let (_ctx, home, port) = installed_without_server();
    start(&home);
    let mut pid = wait_healthy(&home, port);
    let mut gaps = Vec::new();
    for _ in 0..3 {
        let killed_at = Instant::now();
        signal(pid, "KILL");
        let mut next = None;
        wait_until(Duration::from_secs(30), "a new workload", || {
            next = workload_pid(&home).filter(|&p| p != pid && !pid_gone(p));
            next.is_some()
        });
        gaps.push(killed_at.elapsed());
        pid = next.unwrap();
        wait_healthy(&home, port);
    }
    // 1 s, 2 s, 4 s of backoff: each restart waits longer than the one before.
    assert!(
        gaps[0] >= Duration::from_millis(900)
            && gaps[1] >= Duration::from_millis(1900)
            && gaps[2] >= Duration::from_millis(3900)
            && gaps[0] < gaps[1]
            && gaps[1] < gaps[2],
        "restart delays {gaps:?}"
    );
    let log = read_file(&home.join("logs/workload.log"));
    assert_eq!(
        log.matches("was killed by signal 9 (SIGKILL)").count(),
        3,
        "{log}"
    );
    for delay in ["restarting in 1s", "restarting in 2s", "restarting in 4s"] {
        assert!(log.contains(delay), "{delay} missing:\n{log}");
    }
    assert_eq!(health(&home)["workload"]["restarts"], 3);
    assert_eq!(exporters(&home), vec![pid]);
}

#[test]
fn a_sigkilled_agent_leaves_exactly_one_workload() {
    let (_ctx, home, port) = installed_without_server();
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    start(&home);
    let old = wait_healthy(&home, port);
    let agent = health(&home)["pid"].as_u64().unwrap() as u32;
    signal(agent, "KILL");
    // The wrapper's supervisor starts a new agent, which finds the old workload by
    // run/workload.pid and its start time, stops it and starts its own.
    wait_until(WAIT, "a new agent", || {
        health(&home)["pid"]
            .as_u64()
            .is_some_and(|p| p as u32 != agent && !pid_gone(p as u32))
    });
    let new = wait_healthy(&home, port);
    assert!(pid_gone(old), "the orphaned workload {old} still runs");
    assert_ne!(new, old);
    assert_eq!(exporters(&home), vec![new], "not exactly one workload");
    assert_eq!(agents_running(&home).len(), 1);
    let log = read_file(&home.join("logs/workload.log"));
    assert!(
        log.contains(&format!("found the workload (pid {old}")),
        "{log}"
    );
}

/// Agent 1.0.0 running the exporter, and 2.0.0 whose distribution `dist2` changes,
/// published by a server.
fn update_setup(dist2: impl FnOnce(&Path)) -> (TestContext, PathBuf, e2e::ServerProc, u16) {
    update_setup_with(|_| {}, dist2)
}

/// [`update_setup`], with 1.0.0's distribution changed by `dist1` too.
fn update_setup_with(
    dist1: impl FnOnce(&Path),
    dist2: impl FnOnce(&Path),
) -> (TestContext, PathBuf, e2e::ServerProc, u16) {
    let (ctx, key, home, port) = installed(dist1);
    fs::write(
        home.join("conf/agent-env.sh"),
        format!("{QUICK}export AGENT_WORKLOAD_START_TIMEOUT=3s\n"),
    )
    .unwrap();
    let d2 = exporter_dist(&ctx, "d2", port);
    let mut bin = fs::read(d2.join("bin/agent")).unwrap();
    bin.extend_from_slice(b"agent 2.0.0 marker");
    fs::write(d2.join("bin/agent"), bin).unwrap();
    dist2(&d2);
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let server = serve_to(&ctx, &home, &b2);
    // serve_to wrote the operator's agent.toml; the workload is the distribution's.
    let conf = read_file(&home.join("conf/agent.toml"));
    fs::write(
        home.join("conf/agent.toml"),
        format!("{conf}\n{}", workload_toml(port)),
    )
    .unwrap();
    (ctx, home, server, port)
}

fn script(dist: &Path, name: &str, body: &str) {
    let path = dist.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    run_ok(Command::new("chmod").arg("755").arg(&path));
}

#[test]
fn an_update_whose_workload_never_passes_its_check_rolls_back_to_the_old_workload() {
    let (_ctx, home, server, port) = update_setup(|d2| {
        // Runs, says something, never listens.
        script(
            d2,
            "bin/node_exporter",
            "echo 'node_exporter 2.0.0: cannot bind, giving up on listening' >&2\nwhile :; do sleep 1; done",
        );
    });
    start(&home);
    wait_server_status(&server, "1.0.0+1", "INSTALL_FAILED", &home);
    let record = agent_record(&server).unwrap();
    let error = record["update_error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        error.contains("workload") && error.contains("health check"),
        "INSTALL_FAILED does not name the workload's failure: {error}\n{}",
        agent_logs(&home)
    );
    assert!(
        error.contains("cannot bind, giving up on listening"),
        "INSTALL_FAILED lacks the workload's last log lines: {error}"
    );
    assert!(current(&home).ends_with("1.0.0+1"), "{}", current(&home));
    let pid = wait_healthy(&home, port);
    assert!(
        exe_of(pid).contains("versions/1.0.0+1/"),
        "the old workload runs again: {}",
        exe_of(pid)
    );
    wait_until(Duration::from_secs(10), "one workload", || {
        exporters(&home) == vec![pid]
    });
    let failed = e2e::pids_mentioning(&home.join("versions/2.0.0+2"));
    assert!(
        failed.iter().all(|&p| pid_gone(p)),
        "the failed workload still runs: {failed:?}"
    );
}

#[test]
fn an_update_whose_workload_exits_at_once_rolls_back_naming_its_exit_code() {
    let (_ctx, home, server, port) = update_setup(|d2| {
        script(
            d2,
            "bin/node_exporter",
            "echo 'node_exporter 2.0.0: unknown flag --collector.textfile' >&2\nexit 2",
        );
    });
    start(&home);
    wait_server_status(&server, "1.0.0+1", "INSTALL_FAILED", &home);
    let error = agent_record(&server).unwrap()["update_error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        error.contains("workload") && error.contains("exited with code 2"),
        "{error}\n{}",
        agent_logs(&home)
    );
    assert!(error.contains("unknown flag"), "{error}");
    let pid = wait_healthy(&home, port);
    assert!(exe_of(pid).contains("versions/1.0.0+1/"), "{}", exe_of(pid));
}

#[test]
fn an_update_whose_workload_is_healthy_runs_it_from_the_new_version() {
    let (_ctx, home, server, port) = update_setup(|_| {});
    // The operator's own workload configuration: an update never overwrites it.
    let mine = home.join("conf/workload/marker.prom");
    fs::write(&mine, format!("{MARKER}\noperator_value 7\n")).unwrap();
    start(&home);
    wait_server_status(&server, "2.0.0+2", "INSTALLED", &home);
    let pid = wait_healthy(&home, port);
    assert!(read_file(&mine).contains("operator_value 7"));
    assert!(metrics(port).is_some_and(|m| m.contains("operator_value 7")));
    assert!(
        exe_of(pid).contains("versions/2.0.0+2/bin/node_exporter"),
        "{}",
        exe_of(pid)
    );
    assert_eq!(exporters(&home), vec![pid]);
    wait_until(
        WAIT,
        "the server to list 2.0.0+2 with a healthy workload",
        || {
            agent_record(&server).is_some_and(|a| {
                a["version"] == "2.0.0+2"
                    && a["health"]["healthy"] == true
                    && a["health"]["workload"] == "running"
            })
        },
    );
}

/// Processes whose stdout is `home`'s `logs/workload.log` (the drainers a hand-over
/// starts; they end with the workload whose output they copy).
fn log_writers(home: &Path) -> Vec<u32> {
    let log = home.join("logs/workload.log");
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if fs::read_link(entry.path().join("fd/1")).is_ok_and(|l| l == log) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn an_update_leaves_the_old_workload_serving_until_the_new_agent_replaces_it() {
    // 1.0.0's workload writes a line every 100 ms, and its last words on TERM: a
    // workload whose output pipe lost its reader with the old agent would die of it
    // before it could say them.
    let (_ctx, home, server, port) = update_setup_with(
        |d1| {
            script(
                d1,
                "bin/node_exporter",
                "trap 'echo \"old workload: TERM after $n lines\"; exit 0' TERM\nn=0\nwhile :; do n=$((n+1)); echo \"old workload line $n\"; sleep 0.1; done",
            )
        },
        |_| {},
    );
    start(&home);
    wait_server_status(&server, "2.0.0+2", "INSTALLED", &home);
    let pid = wait_healthy(&home, port);
    assert!(
        exe_of(pid).contains("versions/2.0.0+2/bin/node_exporter"),
        "{}",
        exe_of(pid)
    );
    let log = read_file(&home.join("logs/workload.log"));
    let left = log.find("left the workload (pid ").unwrap_or_else(|| {
        panic!(
            "the old agent did not leave its workload serving\n{}",
            agent_logs(&home)
        )
    });
    let old_pid: String = log[left + "left the workload (pid ".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let found = log
        .find(&format!("found the workload (pid {old_pid}, "))
        .unwrap_or_else(|| {
            panic!(
                "the new agent did not stop the old workload\n{}",
                agent_logs(&home)
            )
        });
    let last_words = log.find("old workload: TERM after ").unwrap_or_else(|| {
        panic!(
            "the old workload's last words are not in its log\n{}",
            agent_logs(&home)
        )
    });
    assert!(
        left < found && found < last_words,
        "the old workload must be stopped by the new agent, after the old one left\n{}",
        agent_logs(&home)
    );
    assert!(
        !log[last_words..].contains("old workload line"),
        "the old workload wrote on after TERM\n{}",
        agent_logs(&home)
    );
    assert_eq!(exporters(&home), vec![pid]);
    wait_until(WAIT, "the old workload's output drainers to end", || {
        log_writers(&home).is_empty()
    });
    // Stopping the agent still stops its workload.
    wrapper(&home, "stop");
    wait_until(WAIT, "the workload to stop with the agent", || {
        exporters(&home).is_empty()
    });
}

#[test]
fn the_server_lists_each_agents_health_and_counts_the_unhealthy() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let port = free_port();
    let dist = exporter_dist(&ctx, "d1", port);
    // A program that dies at once, every time.
    script(
        &dist,
        "bin/node_exporter",
        "echo 'exporter: no config' >&2\nexit 3",
    );
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let home = ctx.install(&bundle, "p");
    let server = serve_to(&ctx, &home, &bundle);
    let conf = read_file(&home.join("conf/agent.toml"));
    fs::write(
        home.join("conf/agent.toml"),
        format!("{conf}\n{}", workload_toml(port)),
    )
    .unwrap();
    start(&home);
    let mut last = None;
    wait_until(WAIT, "the server to list the agent unhealthy", || {
        last = agent_record(&server);
        last.as_ref().is_some_and(|a| {
            a["health"]["healthy"] == false
                && a["health"]["restarts"].as_u64().is_some_and(|r| r >= 1)
                && a["health"]["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("exited with code 3"))
        })
    });
    let health = &last.unwrap()["health"];
    assert!(
        ["backoff", "starting"].contains(&health["workload"].as_str().unwrap_or_default()),
        "{health}"
    );
    assert_eq!(e2e::metric(&server, "agentupdate_agents_unhealthy"), 1.0);
    assert!(e2e::metric(&server, "agentupdate_workload_restarts") >= 1.0);
    // agent status says the same on the machine.
    let status = stdout(&run_ok(
        Command::new(home.join("current/bin/agent")).arg("status"),
    ));
    assert!(status.contains("exited with code 3"), "{status}");
}

#[test]
fn power_loss_during_an_update_converges_to_exactly_one_healthy_workload() {
    let (_ctx, home, server, port) = update_setup(|_| {});
    start(&home);
    e2e::wait_log(&home, "agent.log", "updating", WAIT);
    // A random moment of the update (download, unpack, stop, switch, judge): not a wait
    // for a condition, the moment the power goes.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let moment = Duration::from_millis(u64::from(nanos) % 4000);
    std::thread::sleep(moment);
    // Wrapper, agent, updater and workload all die at once.
    let victims = e2e::pids_mentioning(&home);
    for &pid in &victims {
        signal(pid, "KILL");
    }
    wait_until(Duration::from_secs(10), "every process to die", || {
        victims.iter().all(|&p| pid_gone(p))
    });
    // The machine comes back: the wrapper starts the agent (and finishes or rolls back
    // the update from its journal).
    start(&home);
    let mut last = None;
    wait_until(WAIT, "the update to end", || {
        last = agent_record(&server);
        last.as_ref().is_some_and(|a| {
            (a["version"] == "2.0.0+2" && a["update_status"] == "INSTALLED")
                || a["update_status"] == "INSTALL_FAILED"
        }) && health(&home)["workload"]["healthy"] == true
    });
    let pid = wait_healthy(&home, port);
    // Whatever the moment, one workload, from the version that runs.
    let version = health(&home)["version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        exe_of(pid).contains(&format!("versions/{version}/")),
        "killed {moment:?} into the update: workload {} for agent {version}; record {last:?}\n{}",
        exe_of(pid),
        agent_logs(&home)
    );
    assert_eq!(
        exporters(&home),
        vec![pid],
        "killed {moment:?} into the update: not exactly one workload\n{}",
        agent_logs(&home)
    );
    assert_eq!(agents_running(&home).len(), 1);
}
