//! What a new user meets on the first day: each test is a regression test named after
//! what broke when the project was tried on a fresh clone.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{
    TestContext, bin_path, configure_agent, free_port, metric, pids_mentioning, read_file,
    repo_root, run, run_fails, run_ok, stdout, wait_log, wait_until,
};

use crate::update::{
    self, NEW, OLD, WAIT, agents_running, assert_rolled_back, prepare_env_file, script_agent,
    serve_setup, start, wait_running, wait_server_status,
};

/// The `total` seconds of the first update.log line containing `needle`.
fn log_total(log: &str, needle: &str) -> f64 {
    let line = log
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} in update.log:\n{log}"));
    line.rsplit("total ")
        .next()
        .and_then(|t| t.trim_end_matches([')', 's']).parse().ok())
        .unwrap_or_else(|| panic!("no total in {line:?}"))
}

/// Only what the wrapper needs to keep a test short; the update's timings stay the defaults.
const DEFAULT_TIMINGS: &str = "export AGENT_RESTART_BACKOFF_MAX=2\n";

/// Seconds from the switch to the old version running again, from update.log.
fn rollback_seconds(home: &Path) -> f64 {
    let log = read_file(&home.join("logs/update.log"));
    log_total(&log, &format!("started {OLD} again"))
        - log_total(&log, &format!("current -> versions/{NEW}"))
}

#[test]
fn a_version_that_exits_at_once_is_rolled_back_within_ten_seconds_not_sixty_five() {
    let (s, server) = serve_setup(prepare_env_file(
        DEFAULT_TIMINGS,
        |d| script_agent(d, "exit 1"),
        None,
    ));
    start(&s.home);
    assert_rolled_back(&s, Some(&server), "exited at once");
    let seconds = rollback_seconds(&s.home);
    assert!(
        seconds < 10.0,
        "rollback took {seconds:.1}s from the switch (default health-timeout 60s)\n{}",
        read_file(&s.home.join("logs/update.log"))
    );
}

#[test]
fn a_version_that_crashes_two_seconds_after_start_is_rolled_back_within_ten_seconds() {
    let (s, server) = serve_setup(prepare_env_file(
        DEFAULT_TIMINGS,
        |d| {
            script_agent(
                d,
                r#"printf '{"version":"2.0.0+2","pid":%s,"components_started":true,"last_contact":null}' $$ > "$AGENT_HOME/run/health.json"
sleep 2
exit 1"#,
            )
        },
        None,
    ));
    start(&s.home);
    assert_rolled_back(&s, Some(&server), "during the stability window");
    let seconds = rollback_seconds(&s.home);
    assert!(
        seconds < 10.0,
        "rollback took {seconds:.1}s from the switch"
    );
}

/// The faster detection must not fail a good version on a busy machine: the default
/// 10 s stability window, with the other tests running and a core kept busy.
#[test]
fn a_healthy_version_on_a_loaded_machine_is_not_rolled_back_by_the_faster_detection() {
    let (s, server) = serve_setup(prepare_env_file(DEFAULT_TIMINGS, |_| {}, None));
    let mut busy = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    start(&s.home);
    wait_server_status(&server, NEW, "INSTALLED", &s.home);
    let _ = busy.kill();
    let _ = busy.wait();
    let log = read_file(&s.home.join("logs/update.log"));
    assert!(!log.contains("rolling back"), "{log}");
    assert!(log.contains("10s of stability"), "{log}");
    wait_running(&s.home, NEW);
}

/// After a rollback the agent used to back off (95 s, then 197 s) although every 409
/// already named what the server expected; now a changed offer is tried at once.
#[test]
fn a_degraded_agent_installs_a_fixed_bundle_within_fifteen_seconds_of_its_publication() {
    let (s, server) = update::with_server("", |d| script_agent(d, "exit 1"), None);
    start(&s.home);
    assert_rolled_back(&s, Some(&server), "exited at once");
    // It knows the bundle is bad from the 409 alone and stays quiet (no download).
    wait_log(
        &s.home,
        "agent.log",
        "waiting for the server to offer another bundle",
        WAIT,
    );
    let downloads = metric(&server, "agentupdate_downloads_total{code=\"200\"}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        metric(&server, "agentupdate_downloads_total{code=\"200\"}"),
        downloads,
        "the known-bad bundle was downloaded again"
    );

    let key = s.ctx.path("keys/update.key");
    let fixed = s.ctx.pack(&s.ctx.dist("d3"), "2.0.1", "3", &key, "b3");
    for entry in fs::read_dir(server.download_dir()).unwrap().flatten() {
        fs::remove_file(entry.path()).unwrap();
    }
    let published = Instant::now();
    s.ctx.publish(&server, &fixed);
    wait_server_status(&server, "2.0.1+3", "INSTALLED", &s.home);
    let took = published.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the fixed bundle took {took:?} from publication to INSTALLED"
    );
    wait_running(&s.home, "2.0.1+3");
}

#[test]
fn wrapper_stop_and_restart_say_they_stopped_a_running_agent_without_noise() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    configure_agent(&home, &["http://127.0.0.1:1".to_owned()], "");
    let wrapper = home.join("current/bin/agent-wrapper.sh");
    start(&home);
    let pid = read_file(&home.join("run/agent.pid")).trim().to_owned();
    let out = run_ok(Command::new(&wrapper).arg("stop"));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(&format!("agent stopped (pid {pid})")),
        "{text}"
    );
    assert!(
        !text.contains("not running") && !text.contains("cannot open"),
        "{text}"
    );
    assert!(
        read_file(&home.join("logs/wrapper.log")).contains(&format!("stopped agent (pid {pid})")),
        "no stopped line in wrapper.log"
    );
    assert!(agents_running(&home).is_empty());
    // Logs written to files carry no colour codes.
    for log in ["agent.out", "agent.log", "wrapper.log"] {
        let text = read_file(&home.join("logs").join(log));
        assert!(!text.is_empty() || log == "agent.out", "{log} is empty");
        assert!(!text.contains('\u{1b}'), "{log} has ANSI codes:\n{text}");
    }

    start(&home);
    let pid = read_file(&home.join("run/agent.pid")).trim().to_owned();
    let out = run_ok(Command::new(&wrapper).arg("restart"));
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(&format!("agent stopped (pid {pid})")),
        "{text}"
    );
    assert!(text.contains("agent started (pid"), "{text}");
    assert!(
        !text.contains("not running") && !text.contains("cannot open"),
        "{text}"
    );
    wait_until(Duration::from_secs(10), "one agent", || {
        agents_running(&home).len() == 1
    });
}

#[test]
fn a_config_typo_stops_the_supervisor_and_start_and_restart_say_why() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    configure_agent(
        &home,
        &["http://127.0.0.1:1".to_owned()],
        "\n[update]\nenabeld = true\n",
    );
    let wrapper = home.join("current/bin/agent-wrapper.sh");
    let text = run_fails(Command::new(&wrapper).arg("start"), 1);
    assert!(
        text.contains("configuration") && text.contains("enabeld"),
        "{text}"
    );
    // No restart loop: one line in wrapper.log, and nothing left running.
    std::thread::sleep(Duration::from_secs(3));
    let log = read_file(&home.join("logs/wrapper.log"));
    assert_eq!(log.matches("refused its configuration").count(), 1, "{log}");
    assert!(!log.contains("restarting in"), "{log}");
    assert!(pids_mentioning(&home).is_empty(), "something still runs");
    // restart checks first: the configuration's exit code, the key, nothing stopped.
    let text = run_fails(Command::new(&wrapper).arg("restart"), 78);
    assert!(
        text.contains("configuration") && text.contains("line 8, key `enabeld`"),
        "{text}"
    );
}

#[test]
fn misspelt_environment_variables_are_errors_naming_them() {
    let ctx = TestContext::new();
    let text = run_fails(
        ctx.cmd("update-server")
            .args(["--listen", "127.0.0.1:0", "--home"])
            .arg(ctx.path("home"))
            .env("UPDATE_SERVER_DOWNLOADS_LIMT", "5"),
        1,
    );
    assert!(
        text.contains("UPDATE_SERVER_DOWNLOADS_LIMT")
            && text.contains("UPDATE_SERVER_DOWNLOADS_LIMIT"),
        "{text}"
    );
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    let text = run_fails(
        Command::new(home.join("current/bin/agent"))
            .arg("status")
            .env("AGENT_UPDATE_ENABELD", "false"),
        78,
    );
    assert!(text.contains("AGENT_UPDATE_ENABELD"), "{text}");
}

#[test]
fn every_subcommand_answers_help_with_exit_0() {
    let ctx = TestContext::new();
    for args in [
        &["--help"][..],
        &["-h"],
        &["help"],
        &["pack", "--help"],
        &["help", "pack"],
        &["keygen", "--help"],
        &["verify", "--help"],
    ] {
        let out = run_ok(ctx.cmd("agent-bundle").args(args));
        assert!(stdout(&out).contains("Usage"), "agent-bundle {args:?}");
    }
    for args in [&["--help"][..], &["agent", "--help"], &["server", "--help"]] {
        run_ok(ctx.cmd("stamp").args(args));
    }
    let out = run_ok(ctx.cmd("stamp").args(["agent", "--help"]));
    let help = stdout(&out);
    let version_line = help.lines().find(|l| l.contains("--version <V>")).unwrap();
    assert!(
        version_line.contains("believe"),
        "no help text: {version_line}"
    );
    run_ok(ctx.cmd("update-server").arg("--help"));
    for args in [&["rollout", "--help"][..], &["rollout", "status", "--help"]] {
        run_ok(ctx.cmd("update-server").args(args));
    }
    run_ok(ctx.cmd("fleet-sim").arg("--help"));
    for args in [&["--help"][..], &["run", "--help"], &["update", "--help"]] {
        run_ok(ctx.cmd("agent").args(args));
    }
}

#[test]
fn install_takes_its_prefix_after_a_space() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    run_ok(Command::new(&b1).arg("--install").arg(ctx.path("opt")));
    assert!(ctx.path("opt/agent/current/bin/agent").exists());
}

#[test]
fn a_truncated_bundle_is_called_truncated_and_installs_nothing() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let bytes = fs::read(&b1).unwrap();
    let cut = ctx.path("agent-bundle-1.0.0");
    fs::write(&cut, &bytes[..bytes.len() - bytes.len() / 10]).unwrap();
    run_ok(Command::new("chmod").arg("755").arg(&cut));
    for args in [
        vec!["--version".to_owned()],
        vec![format!("--install={}", ctx.path("opt").display())],
    ] {
        let text = run_fails(Command::new(&cut).args(&args), 1);
        assert!(
            text.contains("truncated or damaged") && text.contains("again"),
            "{args:?}: {text}"
        );
    }
    assert!(!ctx.path("opt").exists(), "a prefix was made");
}

#[test]
fn a_failed_install_leaves_no_empty_prefix_directory() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    // A --trust-key file that is not there.
    let text = run_fails(
        Command::new(&b1)
            .arg(format!("--install={}", ctx.path("opt/deep").display()))
            .arg("--trust-key")
            .arg(ctx.path("no-such.pub")),
        1,
    );
    assert!(text.contains("--trust-key"), "{text}");
    assert!(!ctx.path("opt").exists(), "the prefix was left behind");
    // A --trust-key without the .minisig beside the bundle.
    let lone = ctx.path("lone/agent-bundle-1.0.0");
    fs::create_dir_all(lone.parent().unwrap()).unwrap();
    fs::copy(&b1, &lone).unwrap();
    let text = run_fails(
        Command::new(&lone)
            .arg(format!("--install={}", ctx.path("opt2").display()))
            .arg("--trust-key")
            .arg(&public),
        1,
    );
    assert!(text.contains(".minisig"), "{text}");
    assert!(!ctx.path("opt2").exists(), "the prefix was left behind");
}

#[test]
fn install_force_refuses_to_move_current_under_a_running_agent() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let home = ctx.install(&b1, "p");
    configure_agent(&home, &["http://127.0.0.1:1".to_owned()], "");
    start(&home);
    let force = || {
        let mut c = Command::new(&b2);
        c.arg(format!("--install={}", ctx.path("p").display()))
            .arg("--force");
        c
    };
    let text = run_fails(&mut force(), 1);
    assert!(
        text.contains("is running") && text.contains("agent-wrapper.sh stop"),
        "{text}"
    );
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/1.0.0+1")
    );
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("stop"));
    run_ok(&mut force());
    assert_eq!(
        fs::read_link(home.join("current")).unwrap(),
        Path::new("versions/2.0.0+2")
    );
}

#[test]
fn a_missing_update_key_is_reported_by_check_and_nothing_is_downloaded() {
    let s = update::prepare("", |_| {}, None);
    let (s, server) = serve_setup(s);
    fs::remove_file(s.home.join("conf/update.pub")).unwrap();
    let text = run_fails(
        Command::new(s.home.join("current/bin/agent"))
            .args(["update", "--check"])
            .env_remove("AGENT_LOG"),
        1,
    );
    assert!(text.contains("conf/update.pub"), "{text}");
    start(&s.home);
    let log = wait_log(
        &s.home,
        "agent.log",
        "cannot read the trusted update key",
        WAIT,
    );
    assert!(log.contains("conf/update.pub"), "{log}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        metric(&server, "agentupdate_downloads_total{code=\"200\"}"),
        0.0,
        "a bundle that cannot be verified was downloaded"
    );
    assert_eq!(
        fs::read_link(s.home.join("current")).unwrap(),
        Path::new("versions/1.0.0+1")
    );
}

#[test]
fn demo_exits_0_and_leaves_no_work_directory_or_process_behind() {
    let ctx = TestContext::new();
    let tmp = ctx.path("tmp");
    fs::create_dir_all(&tmp).unwrap();
    let bin_dir = bin_path("agent").parent().unwrap().to_path_buf();
    let out = run(Command::new(repo_root().join("scripts/demo.sh"))
        .env("TMPDIR", &tmp)
        .env("AGENT_BIN_DIR", &bin_dir)
        .env("AGENT_DEV_KEYS", ctx.path("dev-keys"))
        // Its own dist/: quickstarts of tests running at once do not share one.
        .env("AGENT_DIST_ROOT", ctx.path("dist"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()));
    assert!(
        out.status.success(),
        "demo.sh failed\n{}\n{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains("rolled back"), "{}", stdout(&out));
    let left: Vec<_> = fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(pids_mentioning(&tmp).is_empty(), "processes left behind");
}

#[test]
fn quickstart_run_twice_leaves_the_running_server_and_its_bundle_alone() {
    let ctx = TestContext::new();
    let port = free_port();
    let bin_dir = bin_path("agent").parent().unwrap().to_path_buf();
    let quickstart = |listen: &str| {
        let mut c = Command::new(repo_root().join("scripts/quickstart.sh"));
        c.env("UPDATE_SERVER_SERVER_LISTEN", listen)
            .env("QUICKSTART_HOME", ctx.path("server-home"))
            .env("QUICKSTART_PREFIX", ctx.path("machine"))
            .env("AGENT_BIN_DIR", &bin_dir)
            .env("AGENT_DEV_KEYS", ctx.path("dev-keys"))
            // Its own dist/: quickstarts of tests running at once do not share one.
            .env("AGENT_DIST_ROOT", ctx.path("dist"))
            .stdin(Stdio::null());
        c
    };
    let first = format!("127.0.0.1:{port}");
    let mut cmd = quickstart(&first);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    ctx.spawn(cmd);
    wait_until(
        Duration::from_secs(120),
        "the first quickstart to serve",
        || {
            e2e::http(port, "GET", "/agentupdate/version", &[])
                .map(|a| a.status == 200)
                .unwrap_or(false)
        },
    );
    let served = e2e::http(port, "GET", "/agentupdate/version", &[])
        .unwrap()
        .text();
    let downloads = ctx.path("server-home/downloads/agent");
    let listing = |dir: &Path| {
        let mut files: Vec<(String, String)> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e2e::sha256_file(&e.path()),
                )
            })
            .collect();
        files.sort();
        files
    };
    let before = listing(&downloads);
    // The same address, then another address with the same home: both refused.
    for listen in [first.clone(), format!("127.0.0.1:{}", free_port())] {
        let text = run_fails(&mut quickstart(&listen), 1);
        assert!(text.contains("Nothing was changed"), "{text}");
        assert_eq!(
            listing(&downloads),
            before,
            "the running server's bundle was touched"
        );
        assert_eq!(
            e2e::http(port, "GET", "/agentupdate/version", &[])
                .unwrap()
                .text(),
            served
        );
    }
}
