//! Remote configuration end to end: a real agent whose workload is a small script that
//! reads its configuration directory, a real update-server, sets pushed with the CLI.
//! A good set is applied and acknowledged; a set the workload refuses is undone, the
//! workload runs again on the set before, and the server hears why.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::{TOKEN, TestContext, read_file, run_ok, signal, wait_until};
use serde_json::Value;

use crate::update::{QUICK, WAIT, agent_record, agents_running, health, serve_to, start};

/// Runs while `app.conf` in its configuration directory does not say "bad".
const APP: &str = r#"#!/bin/sh
if grep -q bad "$1/app.conf"; then
  echo "app: app.conf says bad, refusing to run" >&2
  exit 1
fi
echo "app: running with $(cat "$1/app.conf")"
while :; do sleep 1; done
"#;

fn workload_toml() -> &'static str {
    r#"
[workload]
command = ["bin/app", "{config_dir}"]
health-command = ["/bin/sh", "-c", "! grep -q bad {config_dir}/app.conf"]
start-timeout = "4s"
stop-timeout = "2s"
"#
}
fn push(ctx: &TestContext, server: &e2e::ServerProc, name: &str, app_conf: &str) -> String {
    let dir = ctx.path(name);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("app.conf"), app_conf).unwrap();
    let out = run_ok(
        ctx.cmd("update-server")
            .args(["config", "push", "--group", "default"])
            .arg(&dir)
            .args(["--server", &server.url(""), "--token", TOKEN, "--json"]),
    );
    let pushed: Value = serde_json::from_slice(&out.stdout).unwrap();
    pushed["hash"].as_str().unwrap().to_owned()
}

fn wait_config(server: &e2e::ServerProc, home: &Path, hash: &str, status: &str) -> Value {
    let mut last = None;
    let ok = (0..(WAIT.as_millis() / 100)).any(|_| {
        last = agent_record(server);
        let done = last
            .as_ref()
            .is_some_and(|a| a["config_status"] == status && a["config_hash"] == hash);
        if !done {
            std::thread::sleep(Duration::from_millis(100));
        }
        done
    });
    assert!(
        ok,
        "server never listed config {hash} {status}; last {last:?}\n{}",
        e2e::agent_logs(home)
    );
    last.unwrap()
}

fn wait_workload_healthy(home: &Path) -> u64 {
    let mut pid = 0;
    wait_until(WAIT, "the workload to run healthy", || {
        let h = health(home);
        let w = &h["workload"];
        pid = w["pid"].as_u64().unwrap_or(0);
        w["healthy"] == true && w["workload"] == "running" && pid != 0
    });
    pid
}

/// An agent at 1.0.0 whose distribution runs `app` as its workload with `workload`
/// (a `[workload]` section), and a server with admin token [`TOKEN`] serving it.
fn setup(app: &str, workload: &str) -> (TestContext, std::path::PathBuf, e2e::ServerProc) {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d1");
    fs::write(dist.join("bin/app"), app).unwrap();
    run_ok(Command::new("chmod").arg("755").arg(dist.join("bin/app")));
    fs::create_dir_all(dist.join("conf.default/workload")).unwrap();
    fs::write(dist.join("conf.default/workload/app.conf"), "good 0\n").unwrap();
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let home = ctx.install(&bundle, "p");
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    let server = serve_to(&ctx, &home, &bundle);
    let conf = read_file(&home.join("conf/agent.toml"));
    fs::write(home.join("conf/agent.toml"), format!("{conf}\n{workload}")).unwrap();
    (ctx, home, server)
}

#[test]
fn a_pushed_set_is_applied_and_a_set_the_workload_refuses_is_undone() {
    let (ctx, home, server) = setup(APP, workload_toml());
    start(&home);
    let first = wait_workload_healthy(&home);
    wait_until(WAIT, "the agent to register", || {
        agent_record(&server).is_some()
    });

    let good = push(&ctx, &server, "good", "good 1\n");
    wait_config(&server, &home, &good, "APPLIED");
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    assert_eq!(
        read_file(&home.join("conf/workload.prev/app.conf")),
        "good 0\n"
    );
    let second = wait_workload_healthy(&home);
    assert_ne!(first, second, "workload.reload = restart starts a new run");
    assert!(
        read_file(&home.join("logs/workload.log")).contains("app: running with good 1"),
        "{}",
        e2e::agent_logs(&home)
    );

    let bad = push(&ctx, &server, "bad", "bad\n");
    wait_until(WAIT, "the agent to report the bad set FAILED", || {
        agent_record(&server).is_some_and(|a| a["config_status"] == "FAILED")
    });
    let row = agent_record(&server).unwrap();
    let error = row["config_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("app.conf says bad, refusing to run")
            && error.contains("exited with code 1"),
        "FAILED without the workload's words: {row}\n{}",
        e2e::agent_logs(&home)
    );
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    wait_workload_healthy(&home);
    assert_eq!(read_file(&home.join("data/config-hash")).trim(), good);
    assert_eq!(read_file(&home.join("data/config-failed")).trim(), bad);
    // Not tried again: the workload's log gains no refusal over several contacts.
    let refusals = || {
        read_file(&home.join("logs/workload.log"))
            .matches("says bad")
            .count()
    };
    let before = refusals();
    let contact = |h: &Value| h["last_contact"].as_u64().unwrap_or(0);
    let seen = contact(&health(&home));
    wait_until(WAIT, "three more contacts", || {
        contact(&health(&home)) >= seen + 3
    });
    assert_eq!(
        refusals(),
        before,
        "the bad set was applied again\n{}",
        e2e::agent_logs(&home)
    );
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
}

/// Reads its configuration at start and again on HUP; a "bad" one makes it exit.
const HUP_APP: &str = r#"#!/bin/sh
load() {
  if grep -q bad "$1/app.conf"; then
    echo "app: app.conf says bad, refusing to run" >&2
    exit 1
  fi
  echo "app: running with $(cat "$1/app.conf")"
}
load "$1"
trap 'load "$1"' HUP
while :; do sleep 1 & wait $!; done
"#;

#[test]
fn check_command_refusals_change_nothing_and_signal_reload_keeps_the_run() {
    let (ctx, home, server) = setup(
        HUP_APP,
        r#"
[workload]
command = ["bin/app", "{config_dir}"]
health-command = ["/bin/sh", "-c", "! grep -q bad {config_dir}/app.conf"]
check-command = ["/bin/sh", "-c", "if grep -q forbidden {config_dir}/app.conf; then echo 'check: forbidden word in app.conf' >&2; exit 4; fi"]
reload = "signal:HUP"
start-timeout = "4s"
stop-timeout = "2s"
"#,
    );
    start(&home);
    let first = wait_workload_healthy(&home);
    wait_until(WAIT, "the agent to register", || {
        agent_record(&server).is_some()
    });

    let good = push(&ctx, &server, "good", "good 1\n");
    wait_config(&server, &home, &good, "APPLIED");
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    wait_until(WAIT, "the workload to read the new set on HUP", || {
        read_file(&home.join("logs/workload.log")).contains("app: running with good 1")
    });
    assert_eq!(
        wait_workload_healthy(&home),
        first,
        "a signal reload keeps the same run"
    );

    let forbidden = push(&ctx, &server, "forbidden", "forbidden\n");
    wait_until(WAIT, "the check-command's refusal at the server", || {
        agent_record(&server).is_some_and(|a| {
            a["config_status"] == "FAILED"
                && a["config_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("check: forbidden word in app.conf"))
        })
    });
    let row = agent_record(&server).unwrap();
    assert!(
        row["config_error"]
            .as_str()
            .unwrap()
            .contains("exit code 4"),
        "{row}"
    );
    assert_eq!(
        read_file(&home.join("data/config-failed")).trim(),
        forbidden
    );
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    assert_eq!(
        wait_workload_healthy(&home),
        first,
        "a refused check touches nothing"
    );
    let leftovers: Vec<String> = fs::read_dir(home.join("conf"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".workload"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let bad = push(&ctx, &server, "bad", "bad\n");
    wait_until(WAIT, "the workload's refusal at the server", || {
        agent_record(&server).is_some_and(|a| {
            a["config_status"] == "FAILED"
                && a["config_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("says bad"))
        })
    });
    assert_eq!(read_file(&home.join("data/config-failed")).trim(), bad);
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    wait_workload_healthy(&home);
    assert_eq!(read_file(&home.join("data/config-hash")).trim(), good);
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
}

#[test]
fn an_agent_killed_while_applying_comes_back_on_the_set_that_worked() {
    let (ctx, home, server) = setup(APP, workload_toml());
    start(&home);
    wait_workload_healthy(&home);
    wait_until(WAIT, "the agent to register", || {
        agent_record(&server).is_some()
    });
    let bad = push(&ctx, &server, "bad", "bad\n");
    // Swapped in, the verdict not yet known: the moment to die.
    wait_until(WAIT, "the agent to swap the bad set in", || {
        home.join("data/config-applying").exists()
            && read_file(&home.join("conf/workload/app.conf")) == "bad\n"
    });
    let agents = agents_running(&home);
    assert_eq!(agents.len(), 1, "{agents:?}");
    signal(agents[0], "KILL");
    // The wrapper's supervisor starts a new agent; it puts the set before back, is
    // offered the bad set again, and refuses it in its own time.
    wait_until(WAIT, "the agent to report the bad set FAILED", || {
        agent_record(&server).is_some_and(|a| a["config_status"] == "FAILED")
    });
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 0\n");
    assert_eq!(read_file(&home.join("data/config-failed")).trim(), bad);
    assert!(!home.join("data/config-applying").exists());
    wait_workload_healthy(&home);
    assert!(
        read_file(&home.join("logs/agent.log"))
            .contains("was being applied when the agent stopped"),
        "{}",
        e2e::agent_logs(&home)
    );
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
}
