//! The agent against a real update-server and against a scripted hostile one. The
//! attack tests are named as TUF implementations name them; each asserts what the
//! agent logged and that nothing it downloaded was executed.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::fake::{FakeServer, Handler, Request, respond};
use e2e::{
    TOKEN, TestContext, admin_agents, configure_agent, run_ok, sha256_file, wait_log, wait_until,
};

const NEW: &str = "2.0.0+2";

struct Installed {
    ctx: TestContext,
    home: PathBuf,
    key: PathBuf,
}

/// Agent 1.0.0+1 installed from a bundle signed with the test key.
fn installed() -> Installed {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d1");
    let b1 = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    Installed { ctx, home, key }
}

pub(crate) fn md5_file(path: &Path) -> String {
    let out = run_ok(Command::new("md5sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// `/agentupdate/version` for `bundle`, naming `version+build`.
pub(crate) fn version_text(bundle: &Path, version: &str, build: &str) -> String {
    format!(
        "server.version=9.9.9\nserver.build-number=1\nagent.latest.version={version}\nagent.latest.build-number={build}\nagent.latest.md5={}\nagent.latest.sha256={}\nagent.latest.size={}\nagent.latest.filename=agent-bundle-{version}\n",
        md5_file(bundle),
        sha256_file(bundle),
        fs::metadata(bundle).unwrap().len()
    )
}

/// Accepts NEW, refuses every other version with the directive.
fn directive(req: &Request, _: usize, s: &mut TcpStream) {
    if req.header("Agent-Version") == Some(NEW) {
        respond(s, 200, &[], b"{}");
    } else {
        let body = format!(
            r#"{{"error":"agent_not_supported","expected":"{NEW}","download":"/agentupdate/download"}}"#
        );
        respond(
            s,
            409,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
    }
}

/// A server that refuses every version but NEW, describes `version_text`, serves the
/// signature, and answers downloads with `download`.
fn hostile(version_text: String, signature: String, download: Handler) -> FakeServer {
    let mut routes = update_routes(version_text, signature, download);
    routes.insert("/agent/register", Box::new(directive));
    routes.insert("/agent/connect", Box::new(directive));
    FakeServer::start(routes)
}

/// Version, signature, download and report routes; the directive is the caller's.
pub(crate) fn update_routes(
    version_text: String,
    signature: String,
    download: Handler,
) -> HashMap<&'static str, Handler> {
    let mut routes: HashMap<&'static str, Handler> = HashMap::new();
    routes.insert(
        "/agentupdate/version",
        Box::new(move |_, _, s| respond(s, 200, &[], version_text.as_bytes())),
    );
    routes.insert(
        "/agentupdate/download.minisig",
        Box::new(move |_, _, s| respond(s, 200, &[], signature.as_bytes())),
    );
    routes.insert(
        "/agentupdate/report",
        Box::new(|_, _, s| respond(s, 200, &[], b"{}")),
    );
    routes.insert("/agentupdate/download", download);
    routes
}

pub(crate) fn serve_file(bundle: &Path) -> Handler {
    let bytes = fs::read(bundle).unwrap();
    Box::new(move |_, _, s| respond(s, 200, &[], &bytes))
}

/// `agent run` in the foreground against `url`, with short timeouts.
fn run_agent(ctx: &TestContext, home: &Path, url: &str) -> u32 {
    let mut cmd = Command::new(home.join("current/bin/agent"));
    cmd.arg("run")
        .env("AGENT_SERVER_URLS", url)
        .env("AGENT_AGENT_HEARTBEAT", "1s")
        .env("AGENT_UPDATE_READ_TIMEOUT", "1s")
        .env("AGENT_UPDATE_DOWNLOAD_TIMEOUT", "5s")
        .env_remove("AGENT_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    ctx.spawn(cmd)
}

/// Nothing was handed to an updater, and no downloaded file is executable.
fn assert_nothing_executed(home: &Path) {
    assert!(
        !home.join("data/update-journal.json").exists(),
        "journal written"
    );
    assert!(
        fs::symlink_metadata(home.join("data/update/updater")).is_err(),
        "updater link made"
    );
    if let Ok(entries) = fs::read_dir(home.join("data/update")) {
        for e in entries.flatten() {
            let mode = e.metadata().unwrap().permissions().mode();
            assert_eq!(mode & 0o111, 0, "{} is executable", e.path().display());
        }
    }
    assert!(
        !fs::read_to_string(home.join("logs/agent.log"))
            .unwrap_or_default()
            .contains("updater started"),
        "an updater was started"
    );
}

const LOG_WAIT: Duration = Duration::from_secs(30);

/// A server whose fleet database is busy answers `503` with `Retry-After`: the agent asks
/// it again after that wait (a failover at once would register on the next server of the
/// same fleet, a write more for the busy database), and moves on only after three busy
/// answers in a row.
#[test]
fn a_busy_server_is_asked_again_after_its_wait_and_left_after_three_busy_answers() {
    let Installed { ctx, home, .. } = installed();
    let busy_answer = |_: &Request, _: usize, s: &mut TcpStream| {
        respond(
            s,
            503,
            &[("Retry-After", "1"), ("Content-Type", "application/json")],
            br#"{"error":"the fleet database is unreachable; try again shortly"}"#,
        )
    };
    let mut routes: HashMap<&'static str, Handler> = HashMap::new();
    routes.insert("/agent/register", Box::new(busy_answer));
    routes.insert("/agent/connect", Box::new(busy_answer));
    let busy = FakeServer::start(routes);
    let accepting = |_: &Request, _: usize, s: &mut TcpStream| respond(s, 200, &[], b"{}");
    let mut routes: HashMap<&'static str, Handler> = HashMap::new();
    routes.insert("/agent/register", Box::new(accepting));
    routes.insert("/agent/connect", Box::new(accepting));
    let next = FakeServer::start(routes);

    run_agent(&ctx, &home, &format!("{}, {}", busy.url(), next.url()));
    wait_until(LOG_WAIT, "the agent to connect to the next server", || {
        next.requests("/agent/connect").len() >= 2
    });
    let asked = busy.requests("/agent/register");
    assert_eq!(asked.len(), 3, "registers on the busy server: {asked:?}");
    assert!(busy.requests("/agent/connect").is_empty());
    for pair in asked.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_millis(950),
            "asked again after {gap:?}, before the 1 s the server asked for"
        );
    }
    // It registered once on the next server, after the third busy answer.
    let registered = next.requests("/agent/register");
    assert_eq!(registered.len(), 1, "{registered:?}");
    assert!(registered[0].at > asked[2].at);
    let log = wait_log(&home, "agent.log", "failing over to", LOG_WAIT);
    assert!(
        log.contains("busy (503: {\"error\":\"the fleet database is unreachable; try again shortly\"}), asks to come back in 1s; trying again in 1."),
        "{log}"
    );
}

#[test]
fn matching_agent_registers_and_heartbeats_with_a_real_server() {
    let t = installed();
    let server = t.ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let b1 = t.ctx.path("b1/agent-bundle-1.0.0");
    t.ctx.publish(&server, &b1);
    configure_agent(&t.home, &[server.url("")], "");
    let mut cmd = Command::new(t.home.join("current/bin/agent"));
    cmd.arg("run").stdout(Stdio::null()).stderr(Stdio::null());
    t.ctx.spawn(cmd);
    let mut first_contact = String::new();
    wait_until(Duration::from_secs(20), "the agent to be listed", || {
        let agents = admin_agents(server.port, TOKEN);
        agents.first().is_some_and(|a| {
            first_contact = a["last_contact"].as_str().unwrap_or_default().to_owned();
            a["version"] == "1.0.0+1"
        })
    });
    let id = fs::read_to_string(t.home.join("data/agent-id")).unwrap();
    assert_eq!(admin_agents(server.port, TOKEN)[0]["id"], id.trim());
    wait_until(
        Duration::from_secs(20),
        "a heartbeat to move last_contact",
        || {
            admin_agents(server.port, TOKEN)[0]["last_contact"]
                .as_str()
                .is_some_and(|c| c != first_contact)
        },
    );
    let health: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(t.home.join("run/health.json")).unwrap()).unwrap();
    assert_eq!(health["version"], "1.0.0+1");
    assert_eq!(health["components_started"], true);
    assert!(health["last_contact"].is_u64());
}

#[test]
fn arbitrary_installation() {
    let t = installed();
    let (other_key, _) = t.ctx.keygen("other-keys");
    let b2 = t
        .ctx
        .pack(&t.ctx.dist("d2"), "2.0.0", "2", &other_key, "b2");
    let sig = fs::read_to_string(t.ctx.path("b2/agent-bundle-2.0.0.minisig")).unwrap();
    let server = hostile(version_text(&b2, "2.0.0", "2"), sig, serve_file(&b2));
    run_agent(&t.ctx, &t.home, &server.url());
    let log = wait_log(
        &t.home,
        "agent.log",
        "arbitrary installation refused",
        LOG_WAIT,
    );
    assert!(log.contains("running degraded"), "{log}");
    assert_nothing_executed(&t.home);
    assert!(
        !t.home.join("data/update/agent-bundle-2.0.0").exists(),
        "unverified bundle kept"
    );
}

#[test]
fn mix_and_match() {
    let t = installed();
    // A genuine, correctly signed 3.0.0, offered under the name 2.0.0.
    let b3 = t.ctx.pack(&t.ctx.dist("d3"), "3.0.0", "3", &t.key, "b3");
    let sig = fs::read_to_string(t.ctx.path("b3/agent-bundle-3.0.0.minisig")).unwrap();
    let server = hostile(version_text(&b3, "2.0.0", "2"), sig, serve_file(&b3));
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "mix-and-match", LOG_WAIT);
    assert_nothing_executed(&t.home);
}

#[test]
fn rollback_attack() {
    let t = installed();
    // Genuine 2.0.0, but signed an hour before the running 1.0.0 was.
    let b2 = t
        .ctx
        .pack_signed_at(&t.ctx.dist("d2"), "2.0.0", "2", &t.key, "b2", now() - 3600);
    let sig = fs::read_to_string(t.ctx.path("b2/agent-bundle-2.0.0.minisig")).unwrap();
    let server = hostile(version_text(&b2, "2.0.0", "2"), sig, serve_file(&b2));
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "rollback attack", LOG_WAIT);
    assert_nothing_executed(&t.home);
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn genuine_2(t: &Installed) -> (PathBuf, String) {
    let b2 = t.ctx.pack(&t.ctx.dist("d2"), "2.0.0", "2", &t.key, "b2");
    let sig = fs::read_to_string(t.ctx.path("b2/agent-bundle-2.0.0.minisig")).unwrap();
    (b2, sig)
}

#[test]
fn endless_data() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    let bytes = fs::read(&b2).unwrap();
    let server = hostile(
        version_text(&b2, "2.0.0", "2"),
        sig,
        Box::new(move |_, _, s| {
            // No length, the real bundle, then garbage forever.
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
            let _ = s.write_all(&bytes);
            let junk = vec![b'x'; 64 * 1024];
            for _ in 0..16 * 1024 {
                if s.write_all(&junk).is_err() {
                    return;
                }
            }
        }),
    );
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "more than the advertised", LOG_WAIT);
    assert_nothing_executed(&t.home);
    let size = fs::metadata(&b2).unwrap().len();
    for e in fs::read_dir(t.home.join("data/update")).unwrap().flatten() {
        assert!(
            e.metadata().unwrap().len() <= size,
            "wrote past the advertised size"
        );
    }
}

#[test]
fn slow_retrieval() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    let len = fs::metadata(&b2).unwrap().len();
    let server = hostile(
        version_text(&b2, "2.0.0", "2"),
        sig,
        Box::new(move |_, _, s| {
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
            let _ = s.write_all(&[0u8; 100]);
            std::thread::sleep(Duration::from_secs(30)); // the stall under test
        }),
    );
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "no data for", LOG_WAIT);
    assert_nothing_executed(&t.home);
}

#[test]
fn hash_mismatch() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    // The server describes the genuine bundle and serves other bytes of the same size.
    let mut tampered = fs::read(&b2).unwrap();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0xff;
    let server = hostile(
        version_text(&b2, "2.0.0", "2"),
        sig,
        Box::new(move |_, _, s| respond(s, 200, &[], &tampered)),
    );
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(
        &t.home,
        "agent.log",
        "mismatch: /agentupdate/version says",
        LOG_WAIT,
    );
    assert_nothing_executed(&t.home);
    assert!(!t.home.join("data/update/agent-bundle-2.0.0").exists());
}

/// A server whose description names another sha256 than the signature vouches for is
/// refused before a single byte is downloaded.
#[test]
fn a_description_the_signature_contradicts_is_refused_before_downloading() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    let text = version_text(&b2, "2.0.0", "2").replace(&sha256_file(&b2), &"ab".repeat(32));
    let server = hostile(text, sig, serve_file(&b2));
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "mix-and-match", LOG_WAIT);
    assert!(server.requests("/agentupdate/download").is_empty());
    assert_nothing_executed(&t.home);
}

#[test]
fn truncated_then_resumed() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    let bytes = fs::read(&b2).unwrap();
    let half = bytes.len() / 2;
    let server = hostile(
        version_text(&b2, "2.0.0", "2"),
        sig,
        Box::new(move |req, n, s| {
            if n == 0 {
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    bytes.len()
                );
                let _ = s.write_all(&bytes[..half]);
                return; // connection cut
            }
            let start: usize = req
                .header("Range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.trim_end_matches('-').parse().ok())
                .unwrap_or(0);
            let range = format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len());
            respond(s, 206, &[("Content-Range", &range)], &bytes[start..]);
        }),
    );
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "updater started", LOG_WAIT);
    let downloads = server.requests("/agentupdate/download");
    assert!(downloads.len() >= 2);
    let resumed = &downloads[1];
    let range = resumed.header("Range").unwrap();
    let from: usize = range["bytes=".len()..range.len() - 1].parse().unwrap();
    assert!(from > 0, "resumed from 0: {range}");
    let sha = sha256_file(&b2);
    assert_eq!(
        resumed.header("If-Range"),
        Some(format!("\"{sha}\"").as_str())
    );
    // The bytes handed to the updater are the bundle's, whole.
    let journal: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(t.home.join("data/update-journal.json")).unwrap())
            .unwrap();
    assert_eq!(journal["bundle_sha256"], sha);
}

#[test]
fn retry_after_honoured() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    let server = hostile(
        version_text(&b2, "2.0.0", "2"),
        sig,
        Box::new(|_, _, s| respond(s, 503, &[("Retry-After", "2")], b"busy")),
    );
    run_agent(&t.ctx, &t.home, &server.url());
    wait_until(Duration::from_secs(30), "three download attempts", || {
        server.requests("/agentupdate/download").len() >= 3
    });
    let times: Vec<_> = server
        .requests("/agentupdate/download")
        .iter()
        .map(|r| r.at)
        .collect();
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_secs(2),
            "came back after {gap:?}, told 2 s"
        );
    }
    let log = wait_log(&t.home, "agent.log", "Retry-After 2s", LOG_WAIT);
    assert!(log.contains("server busy (503"), "{log}");
    assert_nothing_executed(&t.home);
}

#[test]
fn bad_version_not_retried() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    fs::create_dir_all(t.home.join("data")).unwrap();
    fs::write(
        t.home.join("data/bad-versions"),
        format!("{} 2.0.0+2 0 crashed at start\n", sha256_file(&b2)),
    )
    .unwrap();
    let server = hostile(version_text(&b2, "2.0.0", "2"), sig, serve_file(&b2));
    run_agent(&t.ctx, &t.home, &server.url());
    wait_log(&t.home, "agent.log", "is in data/bad-versions", LOG_WAIT);
    // It keeps checking what the server offers, on a slow backoff, and never downloads.
    wait_until(
        Duration::from_secs(30),
        "a second look at /agentupdate/version",
        || server.requests("/agentupdate/version").len() >= 2,
    );
    assert!(server.requests("/agentupdate/download").is_empty());
    let connects = server.requests("/agent/connect").len();
    let versions = server.requests("/agentupdate/version").len();
    assert!(
        versions < connects,
        "re-checked on every heartbeat ({versions} of {connects})"
    );
    assert_nothing_executed(&t.home);
}

#[test]
fn updates_disabled_exits_3_naming_the_version() {
    let t = installed();
    let (b2, sig) = genuine_2(&t);
    let server = hostile(version_text(&b2, "2.0.0", "2"), sig, serve_file(&b2));
    let out = Command::new(t.home.join("current/bin/agent"))
        .arg("run")
        .env("AGENT_SERVER_URLS", server.url())
        .env("AGENT_UPDATE_ENABLED", "false")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requires agent version 2.0.0+2"), "{err}");
    assert!(server.requests("/agentupdate/download").is_empty());
}

#[test]
fn status_check_clear_bad_and_update_on_request() {
    let t = installed();
    let (b2, _) = genuine_2(&t);
    let server = t.ctx.server("srv", &[]);
    t.ctx.publish(&server, &b2);
    wait_until(Duration::from_secs(20), "the server to offer 2.0.0", || {
        e2e::http(server.port, "GET", "/agentupdate/version", &[])
            .map(|a| a.text().contains("agent.latest.version=2.0.0"))
            .unwrap_or(false)
    });
    configure_agent(&t.home, &[server.url("")], "");
    let agent = || {
        let mut c = Command::new(t.home.join("current/bin/agent"));
        c.env("AGENT_UPDATE_STABILITY_WINDOW", "1s");
        c
    };
    let status = e2e::stdout(&run_ok(agent().arg("status")));
    assert!(
        status.contains("agent 1.0.0+1") && status.contains("updates:  enabled"),
        "{status}"
    );

    let check = e2e::stdout(&run_ok(agent().args(["update", "--check"])));
    assert!(
        check.contains("offers 2.0.0+2") && check.contains("would download, verify and install it"),
        "{check}"
    );

    fs::write(
        t.home.join("data/bad-versions"),
        format!("{} 2.0.0+2 0 test\n", sha256_file(&b2)),
    )
    .unwrap();
    let check = e2e::stdout(&run_ok(agent().args(["update", "--check"])));
    assert!(check.contains("failed here before"), "{check}");
    let status = e2e::stdout(&run_ok(agent().arg("status")));
    assert!(status.contains(&sha256_file(&b2)), "{status}");
    let cleared = e2e::stdout(&run_ok(agent().args(["update", "--clear-bad"])));
    assert!(cleared.contains("forgot 1"), "{cleared}");
    assert!(!t.home.join("data/bad-versions").exists());

    let out = e2e::stdout(&run_ok(agent().arg("update")));
    assert!(out.contains("updater started"), "{out}");
    wait_log(&t.home, "update.log", "committed", Duration::from_secs(60));
    assert_eq!(
        fs::read_link(t.home.join("current")).unwrap(),
        Path::new("versions/2.0.0+2")
    );
}
