//! The updater end to end: real agents started through their wrapper, a real server,
//! real bundles. Rollbacks, crashes at every phase boundary, the lock and the wrapper.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::fake::{FakeServer, respond};
use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, configure_agent, failpoints_stub,
    pids_mentioning, read_file, run, run_ok, sha256_file, wait_log, wait_until,
};

use crate::agent::{serve_file, update_routes, version_text};

pub(crate) const OLD: &str = "1.0.0+1";
pub(crate) const NEW: &str = "2.0.0+2";
pub(crate) const WAIT: Duration = Duration::from_secs(90);

pub(crate) struct Setup {
    pub(crate) ctx: TestContext,
    pub(crate) home: PathBuf,
    pub(crate) b2: PathBuf,
    pub(crate) dist2: PathBuf,
}

/// 1.0.0's defaults predate `update.stability-window`, so the update adds that key.
pub(crate) fn make_old_defaults(dist: &Path) {
    let path = dist.join("conf.default/agent.toml");
    let text: String = read_file(&path)
        .lines()
        .filter(|l| !l.contains("stability-window") && !l.contains("stays healthy"))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(path, text).unwrap();
}

/// A `bin/agent` that is a shell script (a broken new version).
pub(crate) fn script_agent(dist: &Path, body: &str) {
    let path = dist.join("bin/agent");
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    run_ok(Command::new("chmod").arg("755").arg(&path));
}

/// Agent 1.0.0 installed, env lines in conf/agent-env.sh, and
/// bundle 2.0.0 made from a dist that `dist2` may change, with an optional stub.
pub(crate) fn prepare(env: &str, dist2: impl FnOnce(&Path), stub: Option<&Path>) -> Setup {
    prepare_env_file(&format!("{QUICK}{env}"), dist2, stub)
}

/// Short update timings for tests that do not measure them.
pub(crate) const QUICK: &str = "export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=20s\nexport AGENT_RESTART_BACKOFF_MAX=2\n";

/// Like [`prepare`], with exactly `env_file` as conf/agent-env.sh.
pub(crate) fn prepare_env_file(
    env_file: &str,
    dist2: impl FnOnce(&Path),
    stub: Option<&Path>,
) -> Setup {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let d1 = ctx.dist("d1");
    make_old_defaults(&d1);
    let b1 = ctx.pack(&d1, "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    fs::write(home.join("conf/agent-env.sh"), env_file).unwrap();
    fs::create_dir_all(home.join("data")).unwrap();
    fs::write(home.join("data/keep.txt"), "operator data").unwrap();

    let d2 = ctx.dist("d2");
    // A distinct binary for 2.0.0: the same agent with bytes appended (ELF ignores them).
    let mut bin = fs::read(d2.join("bin/agent")).unwrap();
    bin.extend_from_slice(b"agent 2.0.0 marker");
    fs::write(d2.join("bin/agent"), bin).unwrap();
    dist2(&d2);
    let stub = stub.map(|s| s.display().to_string());
    let extra: Vec<&str> = match &stub {
        Some(s) => vec!["--stub", s],
        None => vec![],
    };
    let b2 = ctx.pack_with(&d2, "2.0.0", "2", &key, "b2", &extra);
    Setup {
        ctx,
        home,
        b2,
        dist2: d2,
    }
}

pub(crate) fn with_server(
    env: &str,
    dist2: impl FnOnce(&Path),
    stub: Option<&Path>,
) -> (Setup, ServerProc) {
    serve_setup(prepare(env, dist2, stub))
}

/// A server (admin token [`TOKEN`]) publishing `bundle`, and the agent at `home` pointed
/// at it.
pub(crate) fn serve_to(ctx: &TestContext, home: &Path, bundle: &Path) -> ServerProc {
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, bundle);
    operator_conf(home, &server.url(""));
    server
}

/// [`serve_to`] with the setup's 2.0.0.
pub(crate) fn serve_setup(s: Setup) -> (Setup, ServerProc) {
    let server = serve_to(&s.ctx, &s.home, &s.b2);
    (s, server)
}

/// The operator's conf/agent.toml: the server, a 1 s heartbeat, one value of their own.
pub(crate) fn operator_conf(home: &Path, url: &str) {
    configure_agent(
        home,
        &[url.to_owned()],
        "\n[update]\nmax-retry-after = \"5m\"\n",
    );
}

pub(crate) fn start(home: &Path) {
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("start"));
}

pub(crate) fn current(home: &Path) -> String {
    fs::read_link(home.join("current"))
        .unwrap()
        .display()
        .to_string()
}

pub(crate) fn agent_record(server: &ServerProc) -> Option<serde_json::Value> {
    admin_agents(server.port, TOKEN).into_iter().next()
}

pub(crate) fn wait_server_status(server: &ServerProc, version: &str, status: &str, home: &Path) {
    let mut last = None;
    let ok = (0..(WAIT.as_millis() / 100)).any(|_| {
        last = agent_record(server);
        let done = last
            .as_ref()
            .is_some_and(|a| a["version"] == version && a["update_status"] == status);
        if !done {
            std::thread::sleep(Duration::from_millis(100));
        }
        done
    });
    assert!(
        ok,
        "server never listed {version} {status}; last {last:?}\n--- update.log:\n{}\n--- agent.log:\n{}\n--- wrapper.log:\n{}",
        read_file(&home.join("logs/update.log")),
        read_file(&home.join("logs/agent.log")),
        read_file(&home.join("logs/wrapper.log")),
    );
}

pub(crate) fn health(home: &Path) -> serde_json::Value {
    serde_json::from_str(&read_file(&home.join("run/health.json"))).unwrap_or_default()
}

/// Agent processes of this home (`bin/agent run`).
pub(crate) fn agents_running(home: &Path) -> Vec<u32> {
    let agents: Vec<u32> = pids_mentioning(home)
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("bin/agent\0run"))
                .unwrap_or(false)
        })
        .collect();
    // A child the agent is starting (the updater, a recovery) shows the agent's own
    // command line between its fork and its exec: it is not a second agent.
    agents
        .iter()
        .copied()
        .filter(|pid| parent_of(*pid).is_none_or(|parent| !agents.contains(&parent)))
        .collect()
}

/// The parent of `pid`, from `/proc/<pid>/stat` (its fourth field, after the command
/// name in parentheses, which may itself hold spaces).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub(crate) fn wait_running(home: &Path, version: &str) {
    wait_until(WAIT, &format!("{version} to run and report health"), || {
        let h = health(home);
        h["version"] == version
            && h["pid"]
                .as_u64()
                .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
    });
}

pub(crate) fn assert_operator_state_kept(home: &Path) {
    let conf = read_file(&home.join("conf/agent.toml"));
    assert!(
        conf.contains("max-retry-after = \"5m\""),
        "operator value lost:\n{conf}"
    );
    assert_eq!(read_file(&home.join("data/keep.txt")), "operator data");
    assert!(home.join("data/agent-id").exists());
}

#[test]
fn update_1_to_2_keeps_operator_conf_and_data() {
    let (s, server) = with_server("", |_| {}, None);
    start(&s.home);
    wait_server_status(&server, NEW, "INSTALLED", &s.home);
    assert_eq!(current(&s.home), format!("versions/{NEW}"));
    assert_eq!(
        sha256_file(&s.home.join("current/bin/agent")),
        sha256_file(&s.dist2.join("bin/agent")),
        "current/bin/agent is not 2.0.0's binary"
    );
    wait_running(&s.home, NEW);
    let out = run_ok(Command::new(s.home.join("current/bin/agent")).arg("--version"));
    assert!(String::from_utf8_lossy(&out.stdout).contains(NEW));
    let pid = health(&s.home)["pid"].as_u64().unwrap();
    let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        exe.ends_with(format!("versions/{NEW}/bin/agent")),
        "{exe:?}"
    );
    assert_operator_state_kept(&s.home);
    let conf = read_file(&s.home.join("conf/agent.toml"));
    assert!(
        conf.contains("stability-window"),
        "new default key not merged:\n{conf}"
    );
    assert!(s.home.join("conf/agent.toml.bak").exists());
    assert!(!read_file(&s.home.join("conf/agent.toml.bak")).contains("stability-window"));
    assert!(
        s.home.join(format!("versions/{OLD}")).is_dir(),
        "previous version removed"
    );
    let log = read_file(&s.home.join("logs/update.log"));
    for step in [
        "unpacked",
        "configuration merged",
        "current -> versions/2.0.0+2",
        "committed",
    ] {
        assert!(log.contains(step), "update.log lacks {step:?}:\n{log}");
    }
    // The old agent served until the new version was on disk.
    assert!(
        log.find("unpacked") < log.find("the old agent"),
        "stopped the old agent before unpacking:\n{log}"
    );
    assert_eq!(agents_running(&s.home).len(), 1);
}

pub(crate) fn assert_rolled_back(s: &Setup, server: Option<&ServerProc>, reason: &str) {
    wait_log(&s.home, "update.log", "rolled back to", WAIT);
    if let Some(server) = server {
        wait_server_status(server, OLD, "INSTALL_FAILED", &s.home);
        let rec = agent_record(server).unwrap();
        assert!(
            rec["update_error"]
                .as_str()
                .unwrap_or_default()
                .contains(reason),
            "{rec}"
        );
    }
    wait_running(&s.home, OLD);
    assert_eq!(current(&s.home), format!("versions/{OLD}"));
    assert!(
        read_file(&s.home.join("data/bad-versions")).contains(&sha256_file(&s.b2)),
        "bundle not in bad-versions"
    );
    let log = read_file(&s.home.join("logs/update.log"));
    assert!(
        log.contains("rolling back") && log.contains(reason),
        "{log}"
    );
    assert!(!s.home.join(format!("versions/{NEW}")).exists());
    assert_operator_state_kept(&s.home);
    // The old version's config must not carry keys it does not know.
    assert!(!read_file(&s.home.join("conf/agent.toml")).contains("stability-window"));
    wait_until(Duration::from_secs(20), "one agent process", || {
        agents_running(&s.home).len() == 1
    });
}

#[test]
fn rollback_when_the_new_agent_exits_at_once() {
    let (s, server) = with_server(
        "export AGENT_UPDATE_HEALTH_TIMEOUT=4s\n",
        |d| script_agent(d, "exit 1"),
        None,
    );
    start(&s.home);
    assert_rolled_back(&s, Some(&server), "2.0.0+2 did not");
}

#[test]
fn rollback_when_the_new_agent_crashes_after_two_seconds() {
    let (s, server) = with_server(
        "export AGENT_UPDATE_STABILITY_WINDOW=5s\n",
        |d| {
            script_agent(
                d,
                r#"printf '{"version":"2.0.0+2","pid":%s,"components_started":true,"last_contact":null}' $$ > "$AGENT_HOME/run/health.json"
sleep 2
exit 1"#,
            )
        },
        None,
    );
    start(&s.home);
    assert_rolled_back(&s, Some(&server), "during the stability window");
}

#[test]
fn rollback_when_the_new_agent_never_reports_healthy_and_a_second_updater_is_refused() {
    let (s, server) = with_server(
        "export AGENT_UPDATE_HEALTH_TIMEOUT=8s\n",
        |d| script_agent(d, "while :; do sleep 1; done"),
        None,
    );
    start(&s.home);
    wait_log(
        &s.home,
        "update.log",
        "started 2.0.0+2 through its wrapper",
        WAIT,
    );
    let mut second = Command::new(s.home.join("data/update/updater"));
    second.arg(format!("--update={}", s.home.display()));
    let out = run(&mut second);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another updater holds"), "{err}");
    assert_rolled_back(&s, Some(&server), "2.0.0+2 did not");
}

#[test]
fn rollback_when_the_server_refuses_the_new_version() {
    // This server refuses every version, so 2.0.0 is refused once it runs.
    let s = prepare("", |_| {}, None);
    let sig = read_file(&s.ctx.path("b2/agent-bundle-2.0.0.minisig"));
    let mut routes = update_routes(version_text(&s.b2, "2.0.0", "2"), sig, serve_file(&s.b2));
    fn refuse(_: &e2e::fake::Request, _: usize, st: &mut std::net::TcpStream) {
        let body = br#"{"error":"agent_not_supported","expected":"2.0.0+2","download":"/agentupdate/download"}"#;
        respond(st, 409, &[], body);
    }
    routes.insert("/agent/register", Box::new(refuse));
    routes.insert("/agent/connect", Box::new(refuse));
    let fake = FakeServer::start(routes);
    operator_conf(&s.home, &fake.url());
    start(&s.home);
    assert_rolled_back(&s, None, "the server refuses 2.0.0+2");
    wait_until(WAIT, "INSTALL_FAILED at the server", || {
        fake.requests("/agentupdate/report")
            .iter()
            .any(|r| String::from_utf8_lossy(&r.body).contains("\"INSTALL_FAILED\""))
    });
}

/// Kills the updater at `point` (a fault point: the process aborts there, like kill -9),
/// "reboots" (kills what is left), then lets the wrapper's start recover.
fn crash_at(point: &str, broken_new: bool) -> (Setup, ServerProc) {
    crash_at_with(point, broken_new, "")
}

fn crash_at_with(point: &str, broken_new: bool, env: &str) -> (Setup, ServerProc) {
    let stub = failpoints_stub();
    let (s, server) = with_server(
        &format!("export FAILPOINTS={point}=return\nexport AGENT_UPDATE_HEALTH_TIMEOUT=6s\n{env}"),
        |d| {
            if broken_new {
                script_agent(d, "exit 1");
            }
        },
        Some(&stub),
    );
    start(&s.home);
    let out = s.home.join("logs/update.out");
    wait_until(WAIT, &format!("the updater to die at {point}"), || {
        read_file(&out).contains(&format!("fault point {point} reached"))
    });
    run(Command::new(s.home.join("current/bin/agent-wrapper.sh")).arg("kill"));
    for pid in agents_running(&s.home) {
        e2e::signal(pid, "KILL");
    }
    let env = read_file(&s.home.join("conf/agent-env.sh"))
        .replace(&format!("export FAILPOINTS={point}=return\n"), "");
    fs::write(s.home.join("conf/agent-env.sh"), env).unwrap();
    start(&s.home);
    (s, server)
}

fn assert_recovered_to_new(s: &Setup, server: &ServerProc) {
    wait_server_status(server, NEW, "INSTALLED", &s.home);
    wait_running(&s.home, NEW);
    assert_eq!(current(&s.home), format!("versions/{NEW}"));
    assert_operator_state_kept(&s.home);
    wait_until(Duration::from_secs(20), "one agent process", || {
        agents_running(&s.home).len() == 1
    });
    let journal = read_file(&s.home.join("data/update-journal.json"));
    assert!(journal.contains("\"committed\""), "{journal}");
}

#[test]
fn crash_after_stopping_is_recovered() {
    let (s, server) = crash_at("updater-stopping", false);
    assert_recovered_to_new(&s, &server);
}

#[test]
fn crash_after_unpacking_is_recovered() {
    let (s, server) = crash_at("updater-unpacked", false);
    assert_recovered_to_new(&s, &server);
}

#[test]
fn crash_after_switching_is_recovered() {
    let (s, server) = crash_at("updater-switched", false);
    assert_recovered_to_new(&s, &server);
}

#[test]
fn crash_after_committing_is_recovered() {
    let (s, server) = crash_at("updater-committed", false);
    assert_recovered_to_new(&s, &server);
}

/// The boot counter: recovery of a switched but uncommitted version counts a start; past
/// `AGENT_UPDATER_MAX_BOOTS` it rolls back instead of trying again (0 here: at once).
#[test]
fn a_switched_version_past_its_boot_budget_is_rolled_back() {
    let (s, server) = crash_at_with(
        "updater-switched",
        false,
        "export AGENT_UPDATER_MAX_BOOTS=0\n",
    );
    assert_rolled_back(&s, Some(&server), "did not commit after 0 starts");
}

#[test]
fn crash_while_rolling_back_is_recovered() {
    let (s, server) = crash_at("updater-rolling-back", true);
    assert_rolled_back(&s, Some(&server), "2.0.0+2 did not");
}

#[test]
fn wrapper_restarts_a_crashed_agent_and_stops_it() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    configure_agent(&home, &["http://127.0.0.1:1".to_owned()], "");
    let wrapper = home.join("current/bin/agent-wrapper.sh");
    start(&home);
    assert!(run(Command::new(&wrapper).arg("status")).status.success());
    let first: u32 = read_file(&home.join("run/agent.pid"))
        .trim()
        .parse()
        .unwrap();
    e2e::signal(first, "KILL");
    wait_until(
        Duration::from_secs(20),
        "the wrapper to restart the agent",
        || {
            read_file(&home.join("run/agent.pid"))
                .trim()
                .parse::<u32>()
                .is_ok_and(|p| p != first && Path::new(&format!("/proc/{p}")).exists())
        },
    );
    let log = read_file(&home.join("logs/wrapper.log"));
    assert!(log.contains("restarting in 1s"), "{log}");
    run_ok(Command::new(&wrapper).arg("stop"));
    assert_eq!(
        run(Command::new(&wrapper).arg("status")).status.code(),
        Some(1)
    );
    wait_until(Duration::from_secs(10), "no agent process", || {
        agents_running(&home).is_empty()
    });
}
