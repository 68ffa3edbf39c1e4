//! The README's run command, followed by the one-liner it prints, typed as a new user
//! would: ends with a running agent registered at the server; and the page it turns on,
//! signed in to with the token it prints.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::webdriver::Browser;
use e2e::{
    TestContext, bin_path, free_port, metric, repo_root, require_tool, run_ok, stdout, wait_until,
};

#[test]
fn quickstart_then_the_printed_one_liner_gives_a_registered_agent() {
    require_tool("wget");
    let ctx = TestContext::new();
    let port = free_port();
    let (pid, rx) = start_quickstart(
        &ctx,
        &[],
        &[("UPDATE_SERVER_SERVER_LISTEN", format!("127.0.0.1:{port}"))],
    );
    // The commands to type are the lines indented by four.
    let commands: Vec<String> = rx
        .iter()
        .filter_map(|line| line.strip_prefix("    ").map(str::to_owned))
        .take(5)
        .collect();
    assert_eq!(commands.len(), 5, "quickstart printed {commands:?}");
    assert!(
        commands[0].contains("/install.sh | sh -s --"),
        "{commands:?}"
    );
    // The three by hand are the same install step by step; the one-liner is what to type.
    assert!(commands[1].starts_with("wget --content-disposition"));
    // Windows' one-liner comes last, naming the server's MSI.
    assert!(
        commands[4].starts_with(&format!(
            "msiexec /i http://127.0.0.1:{port}/agentupdate/agent.msi /qn SERVER_URL=http://127.0.0.1:{port} ENROLL_TOKEN="
        )),
        "{commands:?}"
    );
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

/// Starts the quickstart with `args`; returns its pid and every line it prints, as they
/// come (the server's own output, after them, is drained too).
fn start_quickstart(
    ctx: &TestContext,
    args: &[&str],
    env: &[(&str, String)],
) -> (u32, std::sync::mpsc::Receiver<String>) {
    let bin_dir = bin_path("agent").parent().unwrap().to_path_buf();
    let mut quickstart = Command::new(repo_root().join("scripts/quickstart.sh"));
    quickstart
        .args(args)
        .env("QUICKSTART_HOME", ctx.path("server-home"))
        .env("QUICKSTART_PREFIX", ctx.path("machine"))
        .env("AGENT_BIN_DIR", &bin_dir)
        .env("AGENT_DEV_KEYS", ctx.path("dev-keys"))
        // Its own dist/: quickstarts of tests running at once do not share one.
        .env("AGENT_DIST_ROOT", ctx.path("dist"))
        .env_remove("UPDATE_SERVER_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    for (k, v) in env {
        quickstart.env(k, v);
    }
    let mut child = quickstart.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let pid = child.id();
    // The context's drop does not know this child: the test ends it by its pid.
    std::mem::forget(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (pid, rx)
}

/// Lines up to and including the first that contains `last`.
fn lines_until(rx: &std::sync::mpsc::Receiver<String>, last: &str) -> Vec<String> {
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(180)) {
        let done = line.contains(last);
        lines.push(line);
        if done {
            return lines;
        }
    }
    panic!(
        "the quickstart never printed {last:?}; it printed:\n{}",
        lines.join("\n")
    );
}

/// Regression: the quickstart left the admin API and the page off, so `rollout status`
/// answered 403 and the page offered a sign-in that could never succeed.
#[test]
fn the_quickstart_turns_the_page_on_and_its_printed_token_signs_in_with_chromium() {
    let ctx = TestContext::new();
    let port = free_port();
    let (pid, rx) = start_quickstart(&ctx, &["--listen", &format!("127.0.0.1:{port}")], &[]);
    let printed = lines_until(&rx, "agent status");
    let text = printed.join("\n");
    let token = printed
        .iter()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token printed:\n{text}"))
        .to_owned();
    assert!(token.len() >= 32, "{token}");
    assert!(text.contains("loopback only"), "{text}");
    assert!(
        text.contains(&format!("http://127.0.0.1:{port}/")),
        "{text}"
    );
    // Kept in the home for its owner alone.
    let file = ctx.path("server-home/admin-token");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", file.display());
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    let server = e2e::ServerProc {
        port,
        home: ctx.path("server-home"),
        pid,
    };
    wait_until(Duration::from_secs(60), "the quickstart server", || {
        e2e::http(port, "GET", "/healthz", &[]).is_ok_and(|a| a.status == 200)
    });

    // The CLI form it printed works as written (the shell expands the $(cat …)).
    let cli = printed
        .iter()
        .find(|l| l.contains("update-server rollout status"))
        .unwrap_or_else(|| panic!("no CLI line:\n{text}"));
    let out = run_ok(
        Command::new("sh")
            .arg("-c")
            .arg(cli.trim())
            .current_dir(repo_root()),
    );
    assert!(stdout(&out).contains("rollout of"), "{}", stdout(&out));

    let b = Browser::start(&ctx);
    b.goto(&server.url("/"));
    let field = b.find("form[action='/signin'] input[type=password][name=token]");
    b.type_into(&field, &token);
    b.click(&b.find("form[action='/signin'] button[type=submit]"));
    b.wait_for("form[action='/signout']");
    assert!(b.try_find("#total").is_some(), "{}", b.source());

    // A second run keeps the token and does not show it again.
    e2e::signal(pid, "TERM");
    wait_until(Duration::from_secs(20), "the first server to end", || {
        e2e::pid_gone(pid)
    });
    let (pid, rx) = start_quickstart(&ctx, &["--listen", &format!("127.0.0.1:{port}")], &[]);
    let again = lines_until(&rx, "agent status").join("\n");
    assert!(!again.contains(&token), "{again}");
    assert!(again.contains("admin-token"), "{again}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token);
    e2e::signal(pid, "TERM");
}

/// Regression: the quickstart printed `curl … http://127.0.0.1:7080/install.sh` "on a
/// real machine" and packed that address into the bundle. With `--listen` on every
/// address and `--public-url`, install.sh and the printed commands name the public URL.
#[test]
fn the_quickstart_with_a_public_url_hands_it_to_install_sh_and_says_so() {
    let ctx = TestContext::new();
    let port = free_port();
    let public = format!("http://agents.example.test:{port}");
    let (pid, rx) = start_quickstart(
        &ctx,
        &[
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--public-url",
            &public,
        ],
        &[],
    );
    let text = lines_until(&rx, "agent status").join("\n");
    assert!(!text.contains("loopback only"), "{text}");
    assert!(
        text.contains(&format!("curl -fsSL {public}/install.sh")),
        "{text}"
    );
    // Windows' one-liner beside it, naming the same server.
    assert!(
        text.contains(&format!(
            "msiexec /i {public}/agentupdate/agent.msi /qn SERVER_URL={public} ENROLL_TOKEN="
        )),
        "{text}"
    );
    wait_until(Duration::from_secs(60), "the quickstart server", || {
        e2e::http(port, "GET", "/healthz", &[]).is_ok_and(|a| a.status == 200)
    });
    let script = e2e::http(port, "GET", "/install.sh", &[]).unwrap().text();
    assert!(script.contains(&public), "{script}");
    e2e::signal(pid, "TERM");
}
