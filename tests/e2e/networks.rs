//! Networks end to end (docs/install.md, "Networks: proxies and download sources"):
//! agents behind Debian's squid (with a user and password, from `server.proxy` and from
//! `HTTPS_PROXY`) talking to an HTTPS server with a pinned CA, `NO_PROXY` and
//! `proxy = "none"`, a proxy that refuses the credentials, a proxy that goes away; and
//! bundle bytes from an nginx download source, with a corrupted copy, a missing one and a
//! stalled source falling back to the server.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::networks::{Nginx, Squid, stalled_source};
use e2e::{
    Pki, ServerProc, TOKEN, TestContext, admin_agents, configure_agent, metric, read_file, run_ok,
    sha256_file, stdout, wait_log, wait_until,
};

use crate::update::{NEW, QUICK, WAIT, current, start};

/// Distinctive, so that finding it anywhere is a finding.
const PASSWORD: &str = "Sq1d-pa55-e2e";
const WRONG_PASSWORD: &str = "N0t-the-Pa55";

/// A distribution whose agent binary differs from 1.0.0's.
fn dist_2(ctx: &TestContext) -> PathBuf {
    let dist = ctx.dist("d2");
    let mut bin = fs::read(dist.join("bin/agent")).unwrap();
    bin.extend_from_slice(b"agent 2.0.0 marker");
    fs::write(dist.join("bin/agent"), bin).unwrap();
    dist
}

/// 1.0.0 and 2.0.0, signed with one key.
fn bundles(ctx: &TestContext) -> (PathBuf, PathBuf) {
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&dist_2(ctx), "2.0.0", "2", &key, "b2");
    (b1, b2)
}

/// The operator's edit after `--install`: the server and a quick heartbeat, with what the
/// installer wrote (the CA, the proxy) kept.
fn point_at(home: &Path, url: &str) {
    let path = home.join("conf/agent.toml");
    let text: String = read_file(&path)
        .lines()
        .map(|l| match l {
            l if l.starts_with("urls = ") => format!("urls = [\"{url}\"]\n"),
            l if l.starts_with("heartbeat = ") => "heartbeat = \"1s\"\n".to_owned(),
            l => format!("{l}\n"),
        })
        .collect();
    fs::write(path, text).unwrap();
}

/// `b1 --install=<ctx>/<prefix>` with `args`; returns AGENT_HOME and what it printed.
fn install(ctx: &TestContext, b1: &Path, prefix: &str, args: &[&str]) -> (PathBuf, String) {
    let out = run_ok(
        Command::new(b1)
            .arg(format!("--install={}", ctx.path(prefix).display()))
            .args(args),
    );
    (
        fs::canonicalize(ctx.path(prefix).join("agent")).unwrap(),
        stdout(&out),
    )
}

fn curl_tls(pki: &Pki, server: &ServerProc, path: &str, auth: bool) -> String {
    let mut c = pki.curl();
    if auth {
        c.args(["-H", &format!("Authorization: Bearer {TOKEN}")]);
    }
    let out = c.arg(server.https_url(path)).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn agents_tls(pki: &Pki, server: &ServerProc) -> Vec<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(&curl_tls(pki, server, "/admin/agents", true))
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

fn agent_id(home: &Path) -> String {
    read_file(&home.join("data/agent-id")).trim().to_owned()
}

fn record<'a>(agents: &'a [serde_json::Value], home: &Path) -> Option<&'a serde_json::Value> {
    let id = agent_id(home);
    agents.iter().find(|a| a["id"] == id.as_str())
}

/// Every file under `dir`, read as text.
fn all_text_under(dir: &Path) -> String {
    let mut out = String::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.push_str(&all_text_under(&path));
            } else {
                out.push_str(&String::from_utf8_lossy(
                    &fs::read(&path).unwrap_or_default(),
                ));
            }
        }
    }
    out
}

#[test]
fn agents_behind_squid_register_long_poll_and_update_over_https_and_never_bypass_it() {
    let ctx = TestContext::new();
    let pki = Pki::new(&ctx.path("pki"));
    let (b1, b2) = bundles(&ctx);
    let server = ctx.server_tls("srv", &pki, &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish(&server, &b2);
    let sha2 = sha256_file(&b2);
    wait_until(Duration::from_secs(30), "the server to serve 2.0.0", || {
        curl_tls(&pki, &server, "/agentupdate/version", false).contains(&sha2)
    });
    let squid = Squid::start(&ctx, "squid", &[server.port], Some(("alice", PASSWORD)));
    let ca = pki.ca.display().to_string();
    let shown = format!("http://alice:***@127.0.0.1:{}", squid.port);

    // A: server.proxy, written by --install --proxy.
    let proxy = squid.url(Some(("alice", PASSWORD)));
    let (a, said) = install(&ctx, &b1, "a", &["--ca-file", &ca, "--proxy", &proxy]);
    assert!(said.contains(&shown), "{said}");
    assert!(
        !said.contains(PASSWORD),
        "--install printed the password:\n{said}"
    );
    assert!(read_file(&a.join("conf/agent.toml")).contains(&format!("proxy = \"{proxy}\"")));
    fs::write(a.join("conf/agent-env.sh"), QUICK).unwrap();
    point_at(&a, &server.https_url(""));

    // B: HTTPS_PROXY in the agent's environment.
    let (b, _) = install(&ctx, &b1, "b", &["--ca-file", &ca]);
    fs::write(
        b.join("conf/agent-env.sh"),
        format!("{QUICK}export HTTPS_PROXY={proxy}\n"),
    )
    .unwrap();
    point_at(&b, &server.https_url(""));

    // D: the wrong password.
    let wrong = squid.url(Some(("alice", WRONG_PASSWORD)));
    let (d, _) = install(&ctx, &b1, "d", &["--ca-file", &ca, "--proxy", &wrong]);
    fs::write(d.join("conf/agent-env.sh"), QUICK).unwrap();
    point_at(&d, &server.https_url(""));

    for home in [&a, &b, &d] {
        start(home);
    }
    wait_until(WAIT, "A and B to report 2.0.0 INSTALLED", || {
        let agents = agents_tls(&pki, &server);
        [&a, &b].iter().all(|home| {
            record(&agents, home)
                .is_some_and(|r| r["version"] == NEW && r["update_status"] == "INSTALLED")
        })
    });
    for home in [&a, &b] {
        assert!(current(home).ends_with(NEW), "{}", current(home));
        assert_eq!(sha256_file(&home.join("versions/2.0.0+2/bundle")), sha2);
    }
    // Everything went through squid's CONNECT tunnels, as alice, and the new versions
    // hold their long polls through them too.
    wait_until(
        Duration::from_secs(30),
        "a long poll held through squid",
        || {
            curl_tls(&pki, &server, "/metrics", false)
                .lines()
                .find_map(|l| l.strip_prefix("agentupdate_held_connects_total "))
                .and_then(|n| n.trim().parse::<f64>().ok())
                .is_some_and(|n| n > 0.0)
        },
    );
    let log = squid.access_log();
    // Squid logs a tunnel when it closes; a tunnel carries many requests (the old
    // versions' pooled connections are closed when they exit).
    assert!(squid.tunnels_to(server.port) >= 2, "{log}");
    assert!(log.contains(" alice "), "{log}");

    // The wrong password: a clear error naming the proxy, and the server never hears of D.
    let d_log = wait_log(&d, "agent.log", "407", WAIT);
    assert!(d_log.contains(&shown), "{d_log}");
    assert!(d_log.contains("server.proxy"), "{d_log}");
    assert!(record(&agents_tls(&pki, &server), &d).is_none());

    // agent status names the proxy, never the password.
    let status = stdout(&run_ok(
        Command::new(a.join("current/bin/agent"))
            .arg("status")
            .env("AGENT_HOME", &a),
    ));
    assert!(status.contains(&format!("proxy:    {shown}")), "{status}");

    // Squid goes away: the agents say they lost their server through it, and do not go
    // around it.
    squid.stop();
    for home in [&a, &b] {
        let text = wait_log(home, "agent.log", "cannot reach the proxy", WAIT);
        assert!(text.contains(&shown), "{text}");
    }
    let contact =
        |home: &Path| record(&agents_tls(&pki, &server), home).map(|r| r["last_contact"].clone());
    let before = (contact(&a), contact(&b));
    // An absence is seen only over a window: three heartbeats.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        (contact(&a), contact(&b)),
        before,
        "an agent reached the server around squid"
    );

    // The password is nowhere: no log, no report, no status, not the server's log.
    for home in [&a, &b, &d] {
        let logs = all_text_under(&home.join("logs"));
        assert!(
            !logs.contains(PASSWORD) && !logs.contains(WRONG_PASSWORD),
            "{logs}"
        );
        let data = all_text_under(&home.join("data"));
        assert!(!data.contains(PASSWORD), "{}", home.display());
    }
    assert!(!status.contains(PASSWORD), "{status}");
    let server_log = read_file(&server.home.join("server.log"));
    assert!(!server_log.contains(PASSWORD), "{server_log}");
}

#[test]
fn the_environment_proxy_is_followed_no_proxy_goes_direct_and_none_ignores_it() {
    let ctx = TestContext::new();
    let (b1, _) = bundles(&ctx);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    // The version the agents run: they are accepted as they are.
    ctx.publish_served(&server, &b1);
    // Nothing listens there: a request through it fails, one that goes direct does not.
    let dead = format!("http://127.0.0.1:{}", e2e::free_port());
    let agent = |name: &str, env: &str, extra: &str| {
        let home = ctx.install(&b1, name);
        fs::write(home.join("conf/agent-env.sh"), format!("{QUICK}{env}")).unwrap();
        configure_agent(&home, &[server.url("")], "");
        let conf = home.join("conf/agent.toml");
        let text = read_file(&conf).replacen("[server]\n", &format!("[server]\n{extra}"), 1);
        fs::write(conf, text).unwrap();
        start(&home);
        home
    };
    let direct = agent(
        "no-proxy",
        &format!(
            "export http_proxy={dead}\nexport HTTPS_PROXY={dead}\nexport NO_PROXY=localhost,127.0.0.1\n"
        ),
        "",
    );
    let none = agent(
        "none",
        &format!("export http_proxy={dead}\n"),
        "proxy = \"none\"\n",
    );
    let proxied = agent("proxied", &format!("export http_proxy={dead}\n"), "");
    let started = std::time::Instant::now();
    while !{
        let agents = admin_agents(server.port, TOKEN);
        record(&agents, &direct).is_some() && record(&agents, &none).is_some()
    } {
        assert!(
            started.elapsed() < WAIT,
            "the NO_PROXY and proxy = none agents did not register:\n{}\n---\n{}",
            all_text_under(&direct.join("logs")),
            all_text_under(&none.join("logs"))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let said = wait_log(&proxied, "agent.log", "cannot reach the proxy", WAIT);
    assert!(said.contains(&format!("{dead} (http_proxy)")), "{said}");
    assert!(record(&admin_agents(server.port, TOKEN), &proxied).is_none());
    let started = read_file(&direct.join("logs/agent.log"));
    assert!(
        started.contains("direct to localhost,127.0.0.1"),
        "{started}"
    );
}

#[test]
fn bundle_bytes_come_from_nginx_and_a_source_that_fails_falls_back_to_the_server() {
    let ctx = TestContext::new();
    let (b1, b2) = bundles(&ctx);
    let size = fs::metadata(&b2).unwrap().len();
    let name = b2.file_name().unwrap().to_string_lossy().into_owned();
    let nginx = Nginx::start(&ctx, "nginx");
    nginx.serve("good", &b2);
    // The same size, one byte changed in the middle.
    let bad = nginx.serve("corrupt", &b2);
    let mut bytes = fs::read(&bad).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&bad, bytes).unwrap();
    fs::create_dir_all(nginx.www.join("missing")).unwrap();
    let head = fs::read(&b2).unwrap()[..64 * 1024].to_vec();
    let stalled = format!("http://127.0.0.1:{}/cdn", stalled_source(head, size));

    let cases = [
        ("good", nginx.url("good")),
        ("corrupt", nginx.url("corrupt/")),
        ("missing", nginx.url("missing")),
        ("stalled", stalled),
    ];
    let runs: Vec<(&str, ServerProc, PathBuf)> = cases
        .into_iter()
        .map(|(case, source)| {
            let server = ctx.server(
                &format!("srv-{case}"),
                &[
                    ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
                    ("UPDATE_SERVER_DOWNLOADS_PUBLIC_URL", source.as_str()),
                ],
            );
            ctx.publish_served(&server, &b2);
            let home = ctx.install(&b1, &format!("p-{case}"));
            fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
            // Whole bundles only (deltas stay with the server), and a stall seen in 2 s.
            configure_agent(
                &home,
                &[server.url("")],
                "\n[update]\ndeltas = false\nread-timeout = \"2s\"\n",
            );
            start(&home);
            (case, server, home)
        })
        .collect();

    for (case, server, home) in &runs {
        wait_until(
            WAIT,
            &format!("the {case} agent to report 2.0.0 INSTALLED"),
            || {
                admin_agents(server.port, TOKEN)
                    .iter()
                    .any(|r| r["version"] == NEW && r["update_status"] == "INSTALLED")
            },
        );
        // The right bytes, wherever they came from.
        assert_eq!(
            sha256_file(&home.join("versions/2.0.0+2/bundle")),
            sha256_file(&b2),
            "{case}"
        );
        let log = read_file(&home.join("logs/agent.log"));
        let sent = metric(server, "agentupdate_bytes_sent_total{kind=\"bundle\"}");
        let from_source = metric(
            server,
            "agentupdate_source_downloads_total{from=\"source\"}",
        );
        let fell_back = metric(
            server,
            "agentupdate_source_downloads_total{from=\"server\"}",
        );
        if *case == "good" {
            assert_eq!(sent, 0.0, "the server sent bundle bytes:\n{log}");
            assert_eq!((from_source, fell_back), (1.0, 0.0));
            assert!(!log.contains("the download source failed"), "{log}");
            continue;
        }
        assert!(sent >= size as f64, "{case}: the server sent {sent} bytes");
        assert_eq!((from_source, fell_back), (0.0, 1.0), "{case}");
        let failed: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("the download source failed"))
            .collect();
        assert_eq!(failed.len(), 1, "{case}: {log}");
        let why = match *case {
            "corrupt" => "mismatch",
            "missing" => "answered 404",
            _ => "no data for",
        };
        assert!(
            failed[0].contains(why) && failed[0].contains("downloading from the server"),
            "{case}: {}",
            failed[0]
        );
    }
    let access = nginx.access_log();
    assert!(
        access.contains(&format!("GET /good/{name} HTTP/1.1\" 200")),
        "{access}"
    );
    assert!(
        access.contains(&format!("GET /missing/{name} HTTP/1.1\" 404")),
        "{access}"
    );
}

#[test]
fn the_install_script_fetches_through_the_proxy_it_is_given_and_hands_it_to_the_agent() {
    e2e::require_tool("curl");
    let ctx = TestContext::new();
    let (b1, _) = bundles(&ctx);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    let squid = Squid::start(&ctx, "squid", &[server.port], Some(("alice", PASSWORD)));
    let proxy = squid.url(Some(("alice", PASSWORD)));
    let out = e2e::run(Command::new("sh").arg("-c").arg(format!(
        "curl -fsSL {} | sh -s -- --no-systemd --prefix {} --proxy {proxy}",
        server.url("/install.sh"),
        ctx.path("p").display()
    )));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(!said.contains(PASSWORD), "{said}");
    assert!(
        said.contains(&format!("http://alice:***@127.0.0.1:{}", squid.port)),
        "{said}"
    );
    // The script's own downloads went through squid, as alice.
    let log = squid.access_log();
    let download = format!("GET {}", server.url("/agentupdate/download"));
    assert!(
        log.lines()
            .any(|l| l.contains(&download) && l.contains(" alice ") && l.contains("/200 ")),
        "{log}"
    );
    // And so does the agent it installed.
    let home = fs::canonicalize(ctx.path("p/agent")).unwrap();
    assert!(read_file(&home.join("conf/agent.toml")).contains(&format!("proxy = \"{proxy}\"")));
    wait_until(WAIT, "the installed agent to register", || {
        !admin_agents(server.port, TOKEN).is_empty()
    });
    let register = format!("POST {}", server.url("/agent/register"));
    wait_until(Duration::from_secs(30), "squid to log the register", || {
        squid.access_log().contains(&register)
    });
}
