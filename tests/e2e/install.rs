//! `GET /install.sh`: one command joins a machine. In a booted Debian with a real systemd,
//! in a root holding only busybox, and on this host for the ways it must refuse.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::machine::{Machine, busybox_command, busybox_root, musl_bin};
use e2e::{
    Pki, ServerProc, TOKEN, TestContext, admin_agents, bin_path, describe, read_file, require_tool,
    run, run_ok, sha256_file, wait_until,
};

const WAIT: Duration = Duration::from_secs(90);

/// A distribution whose defaults make a quick agent (1 s heartbeat, 1 s stability window):
/// the script installs it as it is, so the test cannot reach into conf/ first.
fn quick_dist(ctx: &TestContext, dir: &str, agent: Option<&Path>, marker: &str) -> PathBuf {
    let dist = ctx.dist(dir);
    let conf = dist.join("conf.default/agent.toml");
    let text = read_file(&conf)
        .replace("heartbeat = \"30s\"", "heartbeat = \"1s\"")
        .replace("stability-window = \"10s\"", "stability-window = \"1s\"");
    fs::write(&conf, text).unwrap();
    let mut bin = fs::read(agent.map_or_else(|| bin_path("agent"), Path::to_path_buf)).unwrap();
    // A distinct binary per version: ELF ignores bytes appended to it.
    bin.extend_from_slice(marker.as_bytes());
    fs::write(dist.join("bin/agent"), bin).unwrap();
    // Another platform's agent comes with that platform's supervisor, built beside it.
    if let Some(agent) = agent {
        fs::copy(
            agent.with_file_name("agent-service"),
            dist.join("bin/agent-service"),
        )
        .unwrap();
    }
    dist
}

/// The server's script as `sh` would read it.
fn fetch_script(server: &ServerProc) -> String {
    let out = run_ok(Command::new("curl").args(["-fsS", &server.url("/install.sh")]));
    String::from_utf8(out.stdout).unwrap()
}

fn agents(server: &ServerProc) -> Vec<serde_json::Value> {
    admin_agents(server.port, TOKEN)
}

/// Waits until the server lists exactly one agent, at `version`.
fn wait_registered(server: &ServerProc, version: &str, what: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let last = agents(server);
        if last.len() == 1 && last[0]["version"] == version {
            return last[0].clone();
        }
        assert!(
            started.elapsed() < WAIT,
            "{what}: the server never listed one agent at {version}; it lists {last:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the one-liner on this host (no systemd here, and `--no-systemd` anyway).
fn one_liner_here(server: &ServerProc, args: &str) -> std::process::Output {
    run(Command::new("sh").arg("-c").arg(format!(
        "curl -fsSL {} | sh -s -- {args}",
        server.url("/install.sh")
    )))
}

/// Every file under `dir` with its size and modification time, for "nothing changed".
fn tree_listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap().flatten() {
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            // The agent's own moving parts (logs, health, state it writes as it runs) are
            // not what the script may change.
            let rel = entry
                .path()
                .strip_prefix(dir)
                .unwrap()
                .display()
                .to_string();
            if rel.starts_with("logs") || rel.starts_with("run") || rel.starts_with("data") {
                continue;
            }
            if meta.is_dir() {
                stack.push(entry.path());
            }
            out.push(format!("{rel} {} {:?}", meta.len(), meta.modified().ok()));
        }
    }
    out.sort();
    out
}

#[test]
fn install_script_passes_dash_and_shellcheck() {
    require_tool("dash");
    require_tool("shellcheck");
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = quick_dist(&ctx, "d1", None, "");
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[]);
    ctx.publish_served(&server, &bundle);
    let script = ctx.path("install.sh");
    fs::write(&script, fetch_script(&server)).unwrap();
    let text = read_file(&script);
    assert!(
        text.contains(&sha256_file(&bundle)),
        "the script names the bundle's sha256"
    );
    assert!(text.contains(&format!("SERVER_URL='{}'", server.url(""))));
    run_ok(Command::new("dash").arg("-n").arg(&script));
    run_ok(Command::new("shellcheck").args(["-s", "sh"]).arg(&script));
    // With no bundle served the script still parses, and says there is nothing to install.
    fs::remove_file(server.download_dir().join("agent-bundle-1.0.0")).unwrap();
    wait_until(
        Duration::from_secs(30),
        "the server to serve nothing",
        || !fetch_script(&server).contains(&sha256_file(&bundle)),
    );
    fs::write(&script, fetch_script(&server)).unwrap();
    run_ok(Command::new("dash").arg("-n").arg(&script));
    run_ok(Command::new("shellcheck").args(["-s", "sh"]).arg(&script));
    let out = run(Command::new("sh")
        .arg(&script)
        .args(["--no-systemd", "--prefix"])
        .arg(ctx.path("p")));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("serves no agent bundle"));
    assert!(!ctx.path("p/agent").exists());
}

#[test]
fn install_twice_changes_nothing_and_says_so() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = quick_dist(&ctx, "d1", None, "");
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    let prefix = ctx.path("p");
    let args = format!("--prefix {} --group canary --no-systemd", prefix.display());

    let out = one_liner_here(&server, &args);
    assert!(
        out.status.success(),
        "first run: {}",
        describe(&Command::new("sh"), &out)
    );
    let home = prefix.join("agent");
    let row = wait_registered(&server, "1.0.0+1", "after the first run");
    assert_eq!(row["platform"], "x86_64-unknown-linux-gnu");
    let conf = read_file(&home.join("conf/agent.toml"));
    assert!(conf.contains("group = \"canary\""), "{conf}");
    assert!(conf.contains(&server.url("")), "{conf}");
    let before = tree_listing(&home);
    let pid = read_file(&home.join("run/agent.pid"));

    let out = one_liner_here(&server, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "second run: {}",
        describe(&Command::new("sh"), &out)
    );
    assert!(
        stdout.contains("already installed") && stdout.contains("nothing was changed"),
        "{stdout}"
    );
    assert_eq!(
        tree_listing(&home),
        before,
        "the second run changed the tree"
    );
    assert_eq!(
        read_file(&home.join("run/agent.pid")),
        pid,
        "the agent was restarted"
    );
    assert_eq!(agents(&server).len(), 1);

    // A stopped agent is no joined machine: the script says so and fails.
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
    let out = one_liner_here(&server, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a stopped agent: {stderr}");
    assert!(stderr.contains("not running"), "{stderr}");

    // What an uninstall leaves (conf/, data/, logs/) is no installed agent: the
    // one-liner installs again, with a new identity, keeping conf/.
    let old_id = read_file(&home.join("data/agent-id")).trim().to_owned();
    fs::write(home.join("conf/operator-note.txt"), "mine").unwrap();
    run_ok(Command::new(home.join("current/bin/agent")).args(["uninstall", "--yes"]));
    assert!(!home.join("current").exists());
    let out = one_liner_here(&server, &args);
    assert!(
        out.status.success(),
        "the run after an uninstall: {}",
        describe(&Command::new("sh"), &out)
    );
    assert!(home.join("current/bin/agent").exists());
    assert_eq!(read_file(&home.join("conf/operator-note.txt")), "mine");
    wait_until(
        WAIT,
        "the machine to join again with a new identity",
        || {
            agents(&server).iter().any(|a| {
                a["id"] != old_id.as_str()
                    && a["version"] == "1.0.0+1"
                    && a["update_status"] != "LEFT"
            })
        },
    );
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("status"));
}

#[test]
fn install_with_a_wrong_enrollment_token_fails_with_the_servers_words() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = quick_dist(&ctx, "d1", None, "");
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", "the-right-one"),
        ],
    );
    ctx.publish_served(&server, &bundle);
    let prefix = ctx.path("p");
    fs::create_dir_all(ctx.path("tmp")).unwrap();

    for (args, words) in [
        ("--enroll-token wrong", "the enrollment token is wrong"),
        ("", "enrolls new agents only with its enrollment token"),
    ] {
        let out = run(Command::new("sh")
            .env("TMPDIR", ctx.path("tmp"))
            .arg("-c")
            .arg(format!(
                "curl -fsSL {} | sh -s -- --prefix {} --no-systemd {args}",
                server.url("/install.sh"),
                prefix.display()
            )));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args}: {}",
            describe(&Command::new("sh"), &out)
        );
        assert!(stderr.contains(words), "{args}: {stderr}");
        assert!(
            !prefix.join("agent").exists(),
            "{args}: something was installed"
        );
        assert_eq!(
            fs::read_dir(ctx.path("tmp")).unwrap().count(),
            0,
            "left files in TMPDIR"
        );
    }
    assert!(agents(&server).is_empty());

    // The right token installs, and the agent registers with it.
    let out = one_liner_here(
        &server,
        &format!(
            "--prefix {} --no-systemd --enroll-token the-right-one",
            prefix.display()
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    wait_registered(&server, "1.0.0+1", "with the right token");
}

#[test]
fn install_refuses_a_bundle_that_changed_after_the_script_was_fetched() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let d1 = quick_dist(&ctx, "d1", None, "");
    let b1 = ctx.pack(&d1, "1.0.0", "1", &key, "b1");
    let d2 = quick_dist(&ctx, "d2", None, "2.0.0");
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let script = ctx.path("install.sh");
    fs::write(&script, fetch_script(&server)).unwrap();
    ctx.republish(&server, &b2);
    fs::create_dir_all(ctx.path("tmp")).unwrap();

    let prefix = ctx.path("p");
    let out = run(Command::new("sh")
        .env("TMPDIR", ctx.path("tmp"))
        .arg(&script)
        .args(["--no-systemd", "--prefix"])
        .arg(&prefix));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    assert!(
        stderr.contains("sha256") && stderr.contains(&sha256_file(&b1)),
        "{stderr}"
    );
    assert!(!prefix.join("agent").exists(), "something was installed");
    assert_eq!(
        fs::read_dir(ctx.path("tmp")).unwrap().count(),
        0,
        "left files in TMPDIR"
    );
    assert!(agents(&server).is_empty());
}

/// The agent's home inside the Debian machine, as the host sees it.
fn machine_home(machine: &Machine) -> PathBuf {
    machine.root.join("opt/agent")
}

/// A workload for the agent to run: a process that is easy to find.
fn with_workload(dist: &Path) {
    let conf = dist.join("conf.default/agent.toml");
    let text =
        read_file(&conf).replacen("command = []", "command = [\"/bin/sleep\", \"86400\"]", 1);
    fs::write(&conf, text).unwrap();
}

fn workloads(machine: &Machine) -> Vec<u32> {
    machine.pids(|argv| argv.len() >= 2 && argv[0] == b"/bin/sleep" && argv[1] == b"86400")
}

fn wait_one_agent(machine: &Machine, what: &str) -> u32 {
    let mut pids = Vec::new();
    wait_until(WAIT, &format!("{what}: exactly one agent process"), || {
        pids = machine.agent_pids();
        pids.len() == 1
    });
    // And it stays one (a second one would start within the wrapper's start timeout).
    std::thread::sleep(Duration::from_millis(500));
    let again = machine.agent_pids();
    assert_eq!(
        again, pids,
        "{what}: agents came and went: {pids:?} then {again:?}"
    );
    pids[0]
}

#[test]
fn install_under_systemd_survives_restart_update_and_reboot() {
    require_tool("systemd-nspawn");
    require_tool("nsenter");
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let d1 = quick_dist(&ctx, "d1", None, "");
    with_workload(&d1);
    let b1 = ctx.pack(&d1, "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let mut machine = Machine::boot_copy(&ctx.path("debian"));
    let home = machine_home(&machine);
    let logs = |home: &Path| {
        format!(
            "--- wrapper.log\n{}\n--- update.log\n{}\n--- agent.out\n{}",
            read_file(&home.join("logs/wrapper.log")),
            read_file(&home.join("logs/update.log")),
            read_file(&home.join("logs/agent.out"))
        )
    };

    let said = machine.sh(&format!("curl -fsSL {} | sh", server.url("/install.sh")));
    assert!(said.contains("systemd service agent.service"), "{said}");
    assert_eq!(machine.sh("systemctl is-enabled agent").trim(), "enabled");
    assert_eq!(machine.sh("systemctl is-active agent").trim(), "active");
    let unit = read_file(&machine.root.join("etc/systemd/system/agent.service"));
    assert!(
        unit.contains("ExecStart=/opt/agent/current/bin/agent-wrapper.sh start"),
        "{unit}"
    );
    wait_registered(&server, "1.0.0+1", "after the install");
    let first = wait_one_agent(&machine, "after the install");

    machine.sh("systemctl restart agent");
    assert_eq!(machine.sh("systemctl is-active agent").trim(), "active");
    let restarted = wait_one_agent(&machine, "after systemctl restart");
    assert_ne!(
        first, restarted,
        "systemctl restart did not restart the agent"
    );

    // An update from the server runs the new version under the unit.
    let d2 = quick_dist(&ctx, "d2", None, "agent 2.0.0");
    with_workload(&d2);
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    ctx.republish(&server, &b2);
    let mut last = Vec::new();
    let started = Instant::now();
    while !last.first().is_some_and(|a: &serde_json::Value| {
        a["version"] == "2.0.0+2" && a["update_status"] == "INSTALLED"
    }) {
        assert!(
            started.elapsed() < WAIT,
            "the update never reported INSTALLED: {last:?}\n{}",
            logs(&home)
        );
        std::thread::sleep(Duration::from_millis(200));
        last = agents(&server);
    }
    assert_eq!(
        machine.sh("readlink /opt/agent/current").trim(),
        "versions/2.0.0+2"
    );
    assert_eq!(machine.sh("systemctl is-active agent").trim(), "active");
    let updated = wait_one_agent(&machine, "after the update");
    // The running agent is the new binary (its marker), not the old one.
    let exe = fs::read(format!("/proc/{updated}/exe")).unwrap();
    assert!(
        exe.ends_with(b"agent 2.0.0"),
        "the running agent is not 2.0.0"
    );
    wait_until(WAIT, "one workload under the updated agent", || {
        workloads(&machine).len() == 1
    });
    // And `systemctl stop` stops it and its workload, even now that the updater started it.
    machine.sh("systemctl stop agent");
    wait_until(
        Duration::from_secs(30),
        "no agent after systemctl stop",
        || machine.agent_pids().is_empty(),
    );
    assert!(
        workloads(&machine).is_empty(),
        "the workload outlived systemctl stop"
    );
    machine.sh("systemctl start agent");
    wait_one_agent(&machine, "after systemctl start");
    wait_until(WAIT, "the workload after systemctl start", || {
        workloads(&machine).len() == 1
    });

    // After a reboot the agent runs again, on the new version.
    machine.reboot();
    let after = wait_one_agent(&machine, "after the reboot");
    let exe = fs::read(format!("/proc/{after}/exe")).unwrap();
    assert!(
        exe.ends_with(b"agent 2.0.0"),
        "after the reboot the agent is not 2.0.0"
    );
    assert_eq!(machine.sh("systemctl is-active agent").trim(), "active");
    let before = agents(&server)[0]["last_contact"].clone();
    wait_until(WAIT, "the rebooted agent to speak to the server", || {
        let rows = agents(&server);
        rows.len() == 1 && rows[0]["last_contact"] != before && rows[0]["version"] == "2.0.0+2"
    });

    // Leaving: the unit goes with the agent, the server lists it LEFT, and nothing starts
    // it again, not even a reboot.
    let said = machine.sh("cd / && /opt/agent/current/bin/agent uninstall --yes");
    assert!(
        said.contains("removed the systemd unit") && said.contains("left the fleet"),
        "{said}"
    );
    wait_until(
        Duration::from_secs(30),
        "no agent after the uninstall",
        || machine.agent_pids().is_empty() && workloads(&machine).is_empty(),
    );
    assert!(
        !machine
            .root
            .join("etc/systemd/system/agent.service")
            .exists()
    );
    assert!(!home.join("versions").exists() && home.join("conf/agent.toml").exists());
    assert_eq!(agents(&server)[0]["update_status"], "LEFT");
    machine.reboot();
    let state = machine.sh("systemctl is-enabled agent 2>&1 || true");
    assert!(
        !state.trim().starts_with("enabled"),
        "the unit is still there: {state}"
    );
    // Booted, and it stays without an agent.
    for _ in 0..10 {
        assert!(
            machine.agent_pids().is_empty(),
            "an agent started after the reboot"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = machine.console();
}

#[test]
fn install_in_a_busybox_root_runs_the_static_musl_agent_and_it_updates_itself() {
    require_tool("unshare");
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let stub = musl_bin("agent-bundle").display().to_string();
    let musl_bundle = |dir: &str, version: &str, build: &str, marker: &str| {
        let dist = quick_dist(&ctx, &format!("d{dir}"), Some(&musl_bin("agent")), marker);
        ctx.pack_with(
            &dist,
            version,
            build,
            &key,
            &format!("b{dir}"),
            &["--stub", &stub, "--platform", "x86_64-unknown-linux-musl"],
        )
    };
    let bundle = musl_bundle("1", "1.0.0", "1", "");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    let root = ctx.path("bb");
    busybox_root(&root);
    assert!(!root.join("lib64").exists() && !root.join("usr/bin/curl").exists());

    // The machine lives as long as this command: it installs, then holds the namespace.
    let log = ctx.path("bb.out");
    let script = format!(
        "wget -qO- {} | sh -s -- --no-systemd > /tmp/install.out 2>&1; echo \"exit $?\" >> /tmp/install.out; exec sleep 600",
        server.url("/install.sh")
    );
    let mut cmd = busybox_command(&root, &script);
    cmd.stdout(fs::File::create(&log).unwrap())
        .stderr(fs::File::create(ctx.path("bb.err")).unwrap());
    ctx.spawn(cmd);
    let out_file = root.join("tmp/install.out");
    wait_until(WAIT, "the install in the busybox root to finish", || {
        read_file(&out_file).contains("exit ")
    });
    let said = read_file(&out_file);
    assert!(
        said.contains("exit 0"),
        "{said}\n--- outer stderr\n{}",
        read_file(&ctx.path("bb.err"))
    );
    assert!(said.contains("x86_64-unknown-linux-musl"), "{said}");
    let row = wait_registered(&server, "1.0.0+1", "the busybox agent");
    assert_eq!(row["platform"], "x86_64-unknown-linux-musl");
    assert!(root.join("opt/agent/current/bin/agent").exists());

    // A new release: the agent there downloads it, its (static) updater swaps it in with
    // busybox's tools alone, starts it and sees it healthy.
    let b2 = musl_bundle("2", "2.0.0", "2", "agent 2.0.0 musl");
    ctx.republish(&server, &b2);
    let home = root.join("opt/agent");
    let started = Instant::now();
    let mut last = Vec::new();
    while !last.first().is_some_and(|a: &serde_json::Value| {
        a["version"] == "2.0.0+2" && a["update_status"] == "INSTALLED"
    }) {
        assert!(
            started.elapsed() < WAIT,
            "the busybox agent never reported 2.0.0+2 INSTALLED: {last:?}\n--- wrapper.log\n{}\n--- update.log\n{}\n--- agent.out\n{}",
            read_file(&home.join("logs/wrapper.log")),
            read_file(&home.join("logs/update.log")),
            read_file(&home.join("logs/agent.out"))
        );
        std::thread::sleep(Duration::from_millis(200));
        last = agents(&server);
    }
    assert_eq!(last.len(), 1, "{last:?}");
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/2.0.0+2")
    );
    let bin = fs::read(home.join("current/bin/agent")).unwrap();
    assert!(
        bin.ends_with(b"agent 2.0.0 musl"),
        "the installed agent is not 2.0.0's"
    );
    // And the new version is what runs there: one agent, the new binary.
    let mut running = Vec::new();
    wait_until(WAIT, "one agent process running 2.0.0", || {
        running = agent_processes(&home);
        running.len() == 1
    });
    let exe = fs::read(format!("/proc/{}/exe", running[0])).unwrap();
    assert!(
        exe.ends_with(b"agent 2.0.0 musl"),
        "the running agent is not 2.0.0"
    );
}

/// The `bin/agent run` processes of the agent installed at `home` (a path this host
/// sees), by their command line.
fn agent_processes(home: &Path) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            argv.len() >= 2 && argv[0].ends_with(b"/bin/agent") && argv[1] == b"run"
        })
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(home))
        })
        .collect()
}

#[test]
fn install_takes_the_static_musl_bundle_on_glibc_and_refuses_another_architecture() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let prefix = ctx.path("p");
    let args = format!("--prefix {} --no-systemd", prefix.display());

    // A release with nothing that runs on x86_64: refused, naming what it has.
    let d0 = quick_dist(&ctx, "d0", None, "");
    let b0 = ctx.pack_with(
        &d0,
        "0.9.0",
        "1",
        &key,
        "b0",
        &["--platform", "aarch64-unknown-linux-musl"],
    );
    ctx.publish_served(&server, &b0);
    let out = one_liner_here(&server, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    assert!(
        stderr.contains("x86_64-unknown-linux-gnu")
            && stderr.contains("only for: aarch64-unknown-linux-musl"),
        "{stderr}"
    );
    assert!(!prefix.join("agent").exists());

    // The static x86_64 bundle runs on this glibc machine too.
    let dist = quick_dist(&ctx, "d1", Some(&musl_bin("agent")), "");
    let stub = musl_bin("agent-bundle").display().to_string();
    let b1 = ctx.pack_with(
        &dist,
        "1.0.0",
        "1",
        &key,
        "b1",
        &["--stub", &stub, "--platform", "x86_64-unknown-linux-musl"],
    );
    ctx.republish(&server, &b1);
    let out = one_liner_here(&server, &args);
    assert!(
        out.status.success(),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    let row = wait_registered(&server, "1.0.0+1", "the static agent on glibc");
    assert_eq!(row["platform"], "x86_64-unknown-linux-musl");
}

#[test]
fn install_over_https_pins_the_ca_the_server_names() {
    let ctx = TestContext::new();
    let pki = Pki::new(&ctx.path("pki"));
    let (key, _) = ctx.keygen("keys");
    let dist = quick_dist(&ctx, "d1", None, "");
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let ca = pki.ca.display().to_string();
    let server = ctx.server_tls(
        "srv",
        &pki,
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_TLS_AGENT_CA", &ca),
        ],
    );
    ctx.publish(&server, &bundle);
    let sha = sha256_file(&bundle);
    wait_until(Duration::from_secs(30), "the HTTPS server to serve", || {
        pki.curl()
            .arg(server.https_url("/agentupdate/version"))
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&sha))
    });
    let prefix = ctx.path("p");
    let out = run(Command::new("sh").arg("-c").arg(format!(
        "curl -fsSL --cacert {ca} {} | sh -s -- --prefix {} --no-systemd",
        server.https_url("/install.sh"),
        prefix.display()
    )));
    assert!(
        out.status.success(),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    let home = prefix.join("agent");
    assert_eq!(
        read_file(&home.join("conf/ca.pem")).trim(),
        read_file(&pki.ca).trim()
    );
    let conf = read_file(&home.join("conf/agent.toml"));
    assert!(conf.contains("ca-file = \"conf/ca.pem\""), "{conf}");
    assert!(conf.contains(&server.https_url("")), "{conf}");
    wait_until(WAIT, "the agent to register over HTTPS", || {
        pki.curl()
            .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
            .arg(server.https_url("/admin/agents"))
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("1.0.0+1"))
    });
}

/// A machine given `--label env=prod` installs the release of the deployment those
/// labels select (prod pins 2.0.0+2 while default serves 1.0.0+1), so it joins on it
/// without an update; a label that is none is refused before anything is installed.
#[test]
fn install_with_a_label_installs_the_release_of_the_deployment_it_selects() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let now = e2e::now_secs();
    ctx.pack_signed_at(
        &quick_dist(&ctx, "d1", None, "one"),
        "1.0.0",
        "1",
        &key,
        "b1",
        now - 60,
    );
    ctx.pack_signed_at(
        &quick_dist(&ctx, "d2", None, "two"),
        "2.0.0",
        "2",
        &key,
        "b2",
        now,
    );
    let public = public.display().to_string();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")));
    run_ok(
        ctx.cmd("update-server")
            .args([
                "deployment",
                "create",
                "prod",
                "--selector",
                "env=prod",
                "--release",
                "1.0.0+1",
            ])
            .args(["--server", &server.url(""), "--token", TOKEN]),
    );
    run_ok(
        e2e::release_cmd(&ctx, &server, TOKEN, &["publish", "--deployment", "prod"])
            .arg(ctx.path("b2")),
    );
    let bundles = || {
        run_ok(Command::new("curl").args([
            "-fsS",
            &server.url("/install/bundles?platform=x86_64-unknown-linux-gnu&labels=env=prod"),
        ]))
    };
    // The server loads prod's release from the fleet's records within a moment.
    wait_until(WAIT, "the server to serve prod's release", || {
        String::from_utf8_lossy(&bundles().stdout).starts_with("deployment prod 2.0.0+2\n")
    });

    let prefix = ctx.path("p");
    let refused = one_liner_here(
        &server,
        &format!("--prefix {} --label env=a/b --no-systemd", prefix.display()),
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        why.contains("the server refused these labels") && why.contains("env"),
        "{why}"
    );
    assert!(
        !prefix.join("agent").exists(),
        "a refused label installed something"
    );

    let out = one_liner_here(
        &server,
        &format!(
            "--prefix {} --label env=prod --no-systemd",
            prefix.display()
        ),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        describe(&Command::new("sh"), &out)
    );
    assert!(
        said.contains("these labels select deployment prod: installing its release 2.0.0+2"),
        "{said}"
    );
    let row = wait_registered(&server, "2.0.0+2", "the prod machine");
    assert_eq!(row["deployment"], "prod");
    // Installed as 2.0.0+2: the only version it ever had.
    let home = prefix.join("agent");
    let versions: Vec<String> = fs::read_dir(home.join("versions"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        versions.len() == 1 && versions[0].contains("2.0.0"),
        "{versions:?}"
    );
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
}
