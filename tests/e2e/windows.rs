//! Windows machines (docs/install.md, "Windows machines"), under Wine: the bundle
//! installs the agent as a Windows service, the agent registers with its platform, a new
//! release updates it through the service, a release whose agent cannot run rolls back, a
//! killed agent is restarted by the service, and stopping the service leaves nothing
//! running. An MSI installs, upgrades and removes it (`msi`); build-dist.sh signs every
//! Windows file with Authenticode (`authenticode`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::wine::{WINDOWS, WinMachine, run_ok_wine, windows_app, windows_bin};
use e2e::{ServerProc, TOKEN, TestContext, admin_agents, http, read_file, stdout, wait_until};

mod authenticode;
mod crash;
mod msi;

/// Wine starts processes several times slower than Linux, and a debug agent is large.
pub(crate) const WAIT: Duration = Duration::from_secs(120);

/// A Windows distribution: the Windows agent (with `marker` appended: PE files ignore
/// trailing bytes, so each version's program is its own), the service, the stub, and
/// short timings for the tests.
pub(crate) fn dist(ctx: &TestContext, dir: &str, marker: &str, key_pub: &Path) -> PathBuf {
    let root = ctx.path(dir);
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("conf.default")).unwrap();
    let mut agent = fs::read(windows_bin("agent")).unwrap();
    agent.extend_from_slice(marker.as_bytes());
    fs::write(root.join("bin/agent.exe"), agent).unwrap();
    fs::copy(
        windows_bin("agent-service"),
        root.join("bin/agent-service.exe"),
    )
    .unwrap();
    fs::copy(
        windows_bin("agent-bundle"),
        root.join("bin/agent-bundle.exe"),
    )
    .unwrap();
    fs::copy(
        windows_bin("agent-launcher"),
        root.join("bin/agent-launcher.exe"),
    )
    .unwrap();
    let defaults = read_file(&e2e::repo_root().join("installer/agent.toml"))
        .replace("heartbeat = \"30s\"", "heartbeat = \"1s\"")
        .replace("stability-window = \"10s\"", "stability-window = \"1s\"")
        .replace("health-timeout = \"60s\"", "health-timeout = \"90s\"");
    fs::write(root.join("conf.default/agent.toml"), defaults).unwrap();
    fs::copy(key_pub, root.join("conf.default/update.pub")).unwrap();
    fs::write(root.join("README.txt"), "The test agent for Windows.\n").unwrap();
    fs::write(root.join("LICENSE"), "Apache-2.0\n").unwrap();
    root
}

/// Packs `dist` with the Windows stub as `agent-bundle-<v>-x86_64-pc-windows-gnu.exe`
/// and its `.exe.minisig`, as scripts/build-dist.sh names them.
pub(crate) fn pack(
    ctx: &TestContext,
    dist: &Path,
    version: &str,
    build: &str,
    key: &Path,
) -> PathBuf {
    pack_with_stub(ctx, dist, version, build, key, &windows_bin("agent-bundle"))
}

/// [`pack`] with another Windows stub (the one with the updater's fault points).
pub(crate) fn pack_with_stub(
    ctx: &TestContext,
    dist: &Path,
    version: &str,
    build: &str,
    key: &Path,
    stub: &Path,
) -> PathBuf {
    let out = format!("out-{version}");
    let packed = ctx.pack_with(
        dist,
        version,
        build,
        key,
        &out,
        &["--stub", &stub.display().to_string(), "--platform", WINDOWS],
    );
    let named = ctx
        .path(&out)
        .join(format!("agent-bundle-{version}-{WINDOWS}.exe"));
    fs::rename(&packed, &named).unwrap();
    fs::rename(
        format!("{}.minisig", packed.display()),
        format!("{}.minisig", named.display()),
    )
    .unwrap();
    named
}

pub(crate) struct Fleet {
    pub(crate) ctx: TestContext,
    pub(crate) key: PathBuf,
    pub(crate) key_pub: PathBuf,
    pub(crate) server: ServerProc,
    pub(crate) machine: WinMachine,
}

/// A server serving 1.0.0 for Windows, and a Windows machine that installed it as a
/// service pointed at that server.
pub(crate) fn installed() -> Fleet {
    let ctx = TestContext::new();
    let (key, key_pub) = ctx.keygen("keys");
    let d1 = dist(&ctx, "d1", "agent 1.0.0", &key_pub);
    let b1 = pack(&ctx, &d1, "1.0.0", "1", &key);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let machine = WinMachine::new(&ctx, "win");
    let out = machine.install(&b1, &["--server-url", &server.url("")]);
    let text = stdout(&out);
    assert!(text.contains("agent started (pid"), "{text}");
    assert!(
        text.contains(&format!("registered the service {}", machine.service)),
        "{text}"
    );
    Fleet {
        ctx,
        key,
        key_pub,
        server,
        machine,
    }
}

fn row(server: &ServerProc) -> Option<serde_json::Value> {
    admin_agents(server.port, TOKEN).into_iter().next()
}

pub(crate) fn wait_row(
    fleet: &Fleet,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let last = row(&fleet.server);
        if let Some(r) = last.as_ref().filter(|r| cond(r)) {
            return r.clone();
        }
        assert!(
            start.elapsed() < WAIT,
            "{what}: not within {WAIT:?}; last row {last:?}\n--- service.log:\n{}\n--- update.log:\n{}\n--- agent.log:\n{}",
            read_file(&fleet.machine.home().join("logs/service.log")),
            read_file(&fleet.machine.home().join("logs/update.log")),
            e2e::tail(&fleet.machine.home().join("logs/agent.log"), 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_bundle_installs_a_running_service_whose_agent_registers_with_its_platform() {
    let fleet = installed();
    let home = fleet.machine.home();
    // `current` is a file naming the version (Windows cannot swap a directory link).
    assert_eq!(read_file(&home.join("current")).trim(), "1.0.0+1");
    assert!(
        fs::symlink_metadata(home.join("current"))
            .unwrap()
            .file_type()
            .is_file()
    );
    assert!(home.join("bin/agent-service.exe").is_file());

    let agent = wait_row(&fleet, "the Windows agent to register", |r| {
        r["platform"] == WINDOWS && r["version"] == "1.0.0+1"
    });
    assert_eq!(agent["platform"], WINDOWS, "{agent}");

    let status = run_ok_wine(fleet.machine.agent_cmd().arg("status"));
    let text = stdout(&status);
    assert!(
        text.contains(&format!("agent 1.0.0+1 ({WINDOWS})")),
        "{text}"
    );
    assert!(text.contains("(running)"), "{text}");
    let service = run_ok_wine(&mut fleet.machine.service_cmd("status"));
    assert!(
        stdout(&service).contains("agent is running"),
        "{}",
        stdout(&service)
    );

    // The server names the Windows bundle by its own name.
    let download = http(
        fleet.server.port,
        "HEAD",
        &format!("/agentupdate/download?platform={WINDOWS}"),
        &[],
    )
    .unwrap();
    assert_eq!(download.status, 200);
    assert_eq!(
        download.header("content-disposition"),
        Some(format!("attachment; filename=\"agent-bundle-1.0.0-{WINDOWS}.exe\"").as_str())
    );
}

#[test]
fn a_new_release_reaches_the_windows_agent_as_a_delta_and_updates_it_through_its_service() {
    let fleet = installed();
    wait_row(&fleet, "the agent to register", |r| {
        r["version"] == "1.0.0+1"
    });
    // The same programs, one file changed: the delta names the unchanged files, so the
    // server makes it at once (a debug agent.exe is too large to diff in a test's time).
    let d2 = dist(&fleet.ctx, "d2", "agent 1.0.0", &fleet.key_pub);
    fs::write(
        d2.join("README.txt"),
        "The test agent for Windows, 2.0.0.\n",
    )
    .unwrap();
    let b2 = pack(&fleet.ctx, &d2, "2.0.0", "2", &fleet.key);
    fleet.ctx.republish(&fleet.server, &b2);

    wait_row(&fleet, "the agent to report 2.0.0+2 INSTALLED", |r| {
        r["version"] == "2.0.0+2" && r["update_status"] == "INSTALLED"
    });
    let home = fleet.machine.home();
    assert_eq!(read_file(&home.join("current")).trim(), "2.0.0+2");
    // 1.0.0's bundle, kept beside its version, was the base of a delta.
    let agent_log = read_file(&home.join("logs/agent.log"));
    assert!(
        agent_log.contains("from a delta of"),
        "the Windows agent did not update through a delta:\n{agent_log}"
    );
    fleet.machine.wait_agent_running(WAIT);
    // The old agent left on its own once the new version was on disk.
    let update_log = read_file(&home.join("logs/update.log"));
    assert!(!update_log.contains("did not exit"), "{update_log}");
    let log = read_file(&home.join("logs/service.log"));
    assert!(
        log.contains("the updater takes over"),
        "the service did not see the hand-over:\n{log}"
    );
    let pid = fleet.machine.agent_pid().unwrap();
    assert!(
        log.contains(&format!("started agent (pid {pid}) ")) && log.contains("2.0.0+2"),
        "{log}"
    );
}

#[test]
fn a_release_whose_agent_exits_at_once_rolls_back_on_windows() {
    let fleet = installed();
    wait_row(&fleet, "the agent to register", |r| {
        r["version"] == "1.0.0+1"
    });
    let d2 = dist(&fleet.ctx, "d2", "", &fleet.key_pub);
    // The stub without a payload: it exits at once with an error.
    fs::copy(windows_bin("agent-bundle"), d2.join("bin/agent.exe")).unwrap();
    let b2 = pack(&fleet.ctx, &d2, "2.0.0", "2", &fleet.key);
    fleet.ctx.republish(&fleet.server, &b2);

    let failed = wait_row(&fleet, "INSTALL_FAILED for 2.0.0+2", |r| {
        r["update_status"] == "INSTALL_FAILED" && r["version"] == "1.0.0+1"
    });
    let error = failed["update_error"].as_str().unwrap_or_default();
    assert!(!error.is_empty(), "{failed}");
    let home = fleet.machine.home();
    assert_eq!(read_file(&home.join("current")).trim(), "1.0.0+1");
    assert!(
        !home.join("versions/2.0.0+2").exists(),
        "{}",
        read_file(&home.join("logs/update.log"))
    );
    fleet.machine.wait_agent_running(WAIT);
}

#[test]
fn a_killed_windows_agent_is_restarted_and_net_stop_leaves_no_process() {
    let fleet = installed();
    let m = &fleet.machine;
    m.wait_agent_running(WAIT);
    let first = m.agent_pid().unwrap();
    run_ok_wine(m.cmd("taskkill").args(["/F", "/PID", &first.to_string()]));
    wait_until(WAIT, "the service to start another agent", || {
        m.agent_pid().is_some_and(|p| p != first) && m.agent_running()
    });
    let log = read_file(&m.home().join("logs/service.log"));
    assert!(log.contains("restarting in"), "{log}");

    assert!(!m.processes().is_empty());
    run_ok_wine(m.cmd("net").args(["stop", &m.service]));
    wait_until(
        Duration::from_secs(30),
        "no process of the machine to run",
        || m.processes().is_empty(),
    );
    assert!(!m.agent_running());
    let log = read_file(&m.home().join("logs/service.log"));
    assert!(log.contains("stopped agent"), "{log}");
}

#[test]
fn a_release_with_another_agent_service_replaces_the_running_services_program() {
    let fleet = installed();
    wait_row(&fleet, "the agent to register", |r| {
        r["version"] == "1.0.0+1"
    });
    let home = fleet.machine.home();
    let installed_before = fs::read(home.join("bin/agent-service.exe")).unwrap();
    let d2 = dist(&fleet.ctx, "d2", "agent 2.0.0", &fleet.key_pub);
    let mut service = fs::read(d2.join("bin/agent-service.exe")).unwrap();
    service.extend_from_slice(b"agent-service 2.0.0");
    fs::write(d2.join("bin/agent-service.exe"), &service).unwrap();
    let b2 = pack(&fleet.ctx, &d2, "2.0.0", "2", &fleet.key);
    fleet.ctx.republish(&fleet.server, &b2);

    wait_row(&fleet, "the agent to report 2.0.0+2 INSTALLED", |r| {
        r["version"] == "2.0.0+2" && r["update_status"] == "INSTALLED"
    });
    let installed_after = fs::read(home.join("bin/agent-service.exe")).unwrap();
    assert_ne!(installed_after, installed_before);
    assert_eq!(
        installed_after, service,
        "bin\\agent-service.exe is not 2.0.0's"
    );
    let log = read_file(&home.join("logs/service.log"));
    assert!(log.contains("the service restarts itself"), "{log}");
    assert!(log.contains("runs again on its new program"), "{log}");
    // The service runs on, from its new program, with the new agent.
    fleet.machine.wait_agent_running(WAIT);
    let service_pid = fs::read_to_string(home.join("run/service.pid")).unwrap();
    let status = stdout(&run_ok_wine(&mut fleet.machine.service_cmd("status")));
    assert!(
        status.contains(&format!("Running (pid {})", service_pid.trim())),
        "{status}"
    );
}

#[test]
fn a_windows_agent_never_takes_a_linux_bundle() {
    let fleet = installed();
    wait_row(&fleet, "the agent to register", |r| {
        r["version"] == "1.0.0+1"
    });
    // 2.0.0 for Linux only: the Windows agent has no bundle in it.
    let linux = fleet.ctx.dist("linux2");
    let b2 = fleet
        .ctx
        .pack(&linux, "2.0.0", "2", &fleet.key, "linux-out");
    fleet.ctx.republish(&fleet.server, &b2);
    let row = wait_row(&fleet, "the Windows agent to be NO_BUNDLE", |r| {
        r["update_status"] == "NO_BUNDLE"
    });
    assert_eq!(row["version"], "1.0.0+1", "{row}");
    let home = fleet.machine.home();
    assert_eq!(read_file(&home.join("current")).trim(), "1.0.0+1");
    assert!(!home.join("versions/2.0.0+2").exists());
    assert!(fleet.machine.agent_running());
}

#[test]
fn a_linux_agent_never_takes_a_windows_bundle() {
    let ctx = TestContext::new();
    let (key, key_pub) = ctx.keygen("keys");
    let linux = ctx.dist("linux1");
    let b1 = ctx.pack(&linux, "1.0.0", "1", &key, "linux-out");
    let home = ctx.install(&b1, "p");
    let server = crate::update::serve_to(&ctx, &home, &b1);
    crate::update::start(&home);
    wait_until(WAIT, "the Linux agent to register", || {
        crate::update::agent_record(&server).is_some_and(|r| r["version"] == "1.0.0+1")
    });
    // 2.0.0 for Windows only: nothing in it runs on Linux.
    let d2 = dist(&ctx, "d2", "agent 2.0.0", &key_pub);
    let b2 = pack(&ctx, &d2, "2.0.0", "2", &key);
    ctx.republish(&server, &b2);
    wait_until(WAIT, "the Linux agent to be NO_BUNDLE", || {
        crate::update::agent_record(&server).is_some_and(|r| r["update_status"] == "NO_BUNDLE")
    });
    let row = crate::update::agent_record(&server).unwrap();
    assert_eq!(row["version"], "1.0.0+1", "{row}");
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/1.0.0+1")
    );
    assert!(!home.join("versions/2.0.0+2").exists());
}

fn push(ctx: &TestContext, server: &ServerProc, name: &str, app_conf: &str) -> String {
    let dir = ctx.path(name);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("app.conf"), app_conf).unwrap();
    let out = e2e::run_ok(
        ctx.cmd("update-server")
            .args(["config", "push", "--group", "default"])
            .arg(&dir)
            .args(["--server", &server.url(""), "--token", TOKEN, "--json"]),
    );
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    pushed["hash"].as_str().unwrap().to_owned()
}

/// A server serving 1.0.0 whose workload is the test app (`bin/app.exe {config_dir}`,
/// shipped with `app.conf` saying "good 0"), its agent.toml changed by `conf`, and a
/// Windows machine that installed it.
fn installed_with_app(conf: impl Fn(String) -> String) -> (TestContext, ServerProc, WinMachine) {
    let ctx = TestContext::new();
    let (key, key_pub) = ctx.keygen("keys");
    let d1 = dist(&ctx, "d1", "agent 1.0.0", &key_pub);
    fs::copy(windows_app(), d1.join("bin/app.exe")).unwrap();
    fs::create_dir_all(d1.join("conf.default/workload")).unwrap();
    fs::write(d1.join("conf.default/workload/app.conf"), "good 0\n").unwrap();
    let defaults = read_file(&d1.join("conf.default/agent.toml")).replace(
        "\ncommand = []",
        "\ncommand = [\"bin/app.exe\", \"{config_dir}\"]",
    );
    fs::write(d1.join("conf.default/agent.toml"), conf(defaults)).unwrap();
    let b1 = pack(&ctx, &d1, "1.0.0", "1", &key);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let machine = WinMachine::new(&ctx, "win");
    machine.install(&b1, &["--server-url", &server.url("")]);
    (ctx, server, machine)
}

/// `net stop` of a machine running the test app: the service, its agent and app.exe
/// run before, and nothing of the machine after.
fn net_stop_ends_the_service_agent_and_app(machine: &WinMachine) {
    assert!(
        machine.processes().len() >= 3,
        "the service, the agent and app.exe"
    );
    run_ok_wine(machine.cmd("net").args(["stop", &machine.service]));
    wait_until(
        Duration::from_secs(30),
        "no process of the machine to run",
        || machine.processes().is_empty(),
    );
}

#[test]
fn a_configuration_set_applies_on_windows_and_one_the_workload_refuses_is_undone() {
    let (ctx, server, machine) = installed_with_app(|toml| {
        toml.replace("start-timeout = \"30s\"", "start-timeout = \"8s\"")
            .replace("stop-timeout = \"10s\"", "stop-timeout = \"2s\"")
    });
    let home = machine.home();
    let workload_log = || read_file(&home.join("logs/workload.log"));
    wait_until(
        WAIT,
        "the workload to run on the set it shipped with",
        || workload_log().contains("app: running with good 0"),
    );
    let fleet_row = |what: &str, cond: &dyn Fn(&serde_json::Value) -> bool| {
        let start = std::time::Instant::now();
        loop {
            let r = row(&server);
            if let Some(r) = r.as_ref().filter(|r| cond(r)) {
                return r.clone();
            }
            assert!(
                start.elapsed() < WAIT,
                "{what}: last {r:?}\n--- workload.log:\n{}\n--- agent.log:\n{}",
                workload_log(),
                e2e::tail(&home.join("logs/agent.log"), 40)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    let good = push(&ctx, &server, "good", "good 1\n");
    fleet_row("the good set APPLIED", &|r| {
        r["config_status"] == "APPLIED" && r["config_hash"] == good.as_str()
    });
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    assert_eq!(
        read_file(&home.join("conf/workload.prev/app.conf")),
        "good 0\n"
    );
    assert!(
        workload_log().contains("app: running with good 1"),
        "{}",
        workload_log()
    );

    let good_runs = || workload_log().matches("app: running with good 1").count();
    let runs_before = good_runs();
    let bad = push(&ctx, &server, "bad", "bad\n");
    let failed = fleet_row("the bad set FAILED", &|r| r["config_status"] == "FAILED");
    let error = failed["config_error"].as_str().unwrap_or_default();
    assert!(error.contains("app.conf says bad"), "{failed}");
    assert_eq!(read_file(&home.join("conf/workload/app.conf")), "good 1\n");
    assert_eq!(read_file(&home.join("data/config-failed")).trim(), bad);
    assert!(!home.join("conf/workload.exchange").exists());
    // The workload runs again on the set before: a new run of it.
    wait_until(WAIT, "the workload to run again on the good set", || {
        good_runs() > runs_before && machine.agent_running()
    });
    // Stopping the service ends the agent and its workload (app.exe) with its job.
    net_stop_ends_the_service_agent_and_app(&machine);
}

#[test]
fn agent_uninstall_removes_the_windows_service_and_leaves_no_process() {
    let fleet = installed();
    let m = &fleet.machine;
    wait_row(&fleet, "the agent to register", |r| {
        r["version"] == "1.0.0+1"
    });
    m.wait_agent_running(WAIT);
    let home = m.home();
    let out = run_ok_wine(m.agent_cmd().args(["uninstall", "--yes"]));
    let said = stdout(&out);
    assert!(
        said.contains(&format!(
            "stopped and removed the Windows service {}",
            m.service
        )),
        "{said}"
    );
    assert!(said.contains("left the fleet"), "{said}");
    // The service manager no longer knows it: nothing starts the agent again.
    let query = e2e::wine::output(m.cmd("sc").args(["query", &m.service]));
    assert!(!query.status.success(), "{}", stdout(&query));
    wait_until(WAIT, "every process of the installation to end", || {
        m.processes().is_empty()
    });
    for gone in ["versions", "current", "run", "bin"] {
        assert!(
            home.join(gone).symlink_metadata().is_err(),
            "{gone} is still there:\n{said}"
        );
    }
    for kept in ["conf/agent.toml", "logs/agent.log", "logs/service.log"] {
        assert!(home.join(kept).is_file(), "{kept} was not kept");
    }
    let row = row(&fleet.server).unwrap();
    assert_eq!(row["update_status"], "LEFT", "{row}");
}

#[test]
fn net_stop_asks_the_workload_to_stop_with_its_stop_command() {
    let (_ctx, _server, machine) = installed_with_app(|toml| {
        let with = toml.replace(
            "\nstop-command = []",
            "\nstop-command = [\"bin/app.exe\", \"--stop\", \"{config_dir}\"]",
        );
        assert!(with.contains("--stop"), "{with}");
        with
    });
    let home = machine.home();
    let workload_log = || read_file(&home.join("logs/workload.log"));
    wait_until(WAIT, "the workload to run", || {
        workload_log().contains("app: running with good 0")
    });
    net_stop_ends_the_service_agent_and_app(&machine);
    // It ended by itself, asked, not with its job (which would leave no word of it).
    let log = workload_log();
    assert!(
        log.contains("app: asked to stop by its stop command"),
        "{log}\n--- agent.log:\n{}",
        e2e::tail(&home.join("logs/agent.log"), 30)
    );
    assert!(log.contains("ended on its workload.stop-command"), "{log}");
}
