//! The README's run command, followed by the one-liner it prints, typed as a new user
//! would: ends with a running agent registered at the server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::{TestContext, bin_path, free_port, metric, repo_root, require_tool, wait_until};

#[test]
fn quickstart_then_the_printed_one_liner_gives_a_registered_agent() {
    require_tool("wget");
    let ctx = TestContext::new();
    let port = free_port();
    let bin_dir = bin_path("agent").parent().unwrap().to_path_buf();
    let mut quickstart = Command::new(repo_root().join("scripts/quickstart.sh"));
    quickstart
        .env("UPDATE_SERVER_SERVER_LISTEN", format!("127.0.0.1:{port}"))
        .env("QUICKSTART_HOME", ctx.path("server-home"))
        .env("QUICKSTART_PREFIX", ctx.path("machine"))
        .env("AGENT_BIN_DIR", &bin_dir)
        .env("AGENT_DEV_KEYS", ctx.path("dev-keys"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut child = quickstart.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    // The context kills the server (it runs from the context's paths) at the end.
    let pid = child.id();
    std::mem::forget(child);
    // Keep draining the output: the server writes to it, and a closed pipe would end it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(cmd) = line.strip_prefix("    ") {
                let _ = tx.send(cmd.to_owned());
            }
        }
    });
    let commands: Vec<String> = (0..4)
        .filter_map(|_| rx.recv_timeout(Duration::from_secs(120)).ok())
        .collect();
    assert_eq!(commands.len(), 4, "quickstart printed {commands:?}");
    assert!(
        commands[0].contains("/install.sh | sh -s --"),
        "{commands:?}"
    );
    // The three by hand are the same install step by step; the one-liner is what to type.
    assert!(commands[1].starts_with("wget --content-disposition"));
    let commands = &commands[..1];
    let server = e2e::ServerProc {
        port,
        home: ctx.path("server-home"),
        pid,
    };
    wait_until(
        Duration::from_secs(60),
        "the quickstart server to serve",
        || {
            e2e::http(port, "GET", "/agentupdate/version", &[])
                .map(|a| a.status == 200)
                .unwrap_or(false)
        },
    );
    let user_dir = ctx.path("user");
    std::fs::create_dir_all(&user_dir).unwrap();
    for cmd in commands {
        let out = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(&user_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_until(Duration::from_secs(30), "the agent to register", || {
        metric(
            &server,
            "agentupdate_registrations_total{outcome=\"accepted\"}",
        ) >= 1.0
    });
    let status = Command::new(ctx.path("machine/agent/current/bin/agent-wrapper.sh"))
        .arg("status")
        .status()
        .unwrap();
    assert!(status.success());
    e2e::signal(pid, "TERM");
}
