//! Trust end to end: HTTPS with a private CA made by openssl, per-agent credentials and
//! enrollment, and signing-key rotation with real agents, a real server and minisign.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_protocol::minisign::PublicKey;
use e2e::{
    Pki, ServerProc, TOKEN, TestContext, admin_agents, http, http_with_body, pad_dist, read_file,
    run, run_fails, run_ok, sha256_file, signal, stdout, wait_log, wait_until,
};

use crate::update::{
    QUICK, WAIT, current, health, script_agent, serve_to, start, wait_server_status,
};

/// Agent 1.0.0 installed from a bundle signed with key `a`, with short update timings.
struct OnKeyA {
    ctx: TestContext,
    home: PathBuf,
    a_key: PathBuf,
    a_pub: PathBuf,
}

fn installed_on_key_a() -> OnKeyA {
    let ctx = TestContext::new();
    let (a_key, a_pub) = ctx.keygen("a");
    let d1 = ctx.dist("d1");
    let b1 = ctx.pack(&d1, "1.0.0", "1", &a_key, "b1");
    let home = ctx.install(&b1, "p");
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    OnKeyA {
        ctx,
        home,
        a_key,
        a_pub,
    }
}

/// A distribution whose agent binary differs from every other version's.
fn version_dist(ctx: &TestContext, dir: &str, version: &str) -> PathBuf {
    let dist = ctx.dist(dir);
    let mut bin = fs::read(dist.join("bin/agent")).unwrap();
    bin.extend_from_slice(format!("agent {version} marker").as_bytes());
    fs::write(dist.join("bin/agent"), bin).unwrap();
    dist
}

fn key_id(public: &Path) -> String {
    PublicKey::parse(&read_file(public))
        .unwrap()
        .key_id()
        .to_string()
}

/// `agent-bundle rotate-key`; returns the statement's .minisig.
fn rotate(ctx: &TestContext, old_key: &Path, new_pub: &Path, out: &str) -> PathBuf {
    run_ok(
        ctx.cmd("agent-bundle")
            .args(["rotate-key", "--old"])
            .arg(old_key)
            .arg("--new")
            .arg(new_pub)
            .args(["--out", out]),
    );
    ctx.path(out)
        .join(format!("rotation-{}.minisig", key_id(new_pub)))
}

fn verify_with(ctx: &TestContext, bundle: &Path, public: &Path) -> std::process::Output {
    run(ctx
        .cmd("agent-bundle")
        .arg("verify")
        .arg(bundle)
        .arg("--pub")
        .arg(public))
}

fn retired(home: &Path) -> String {
    read_file(&home.join("data/retired-keys"))
}

#[test]
fn rotation_a_to_b_is_followed_and_then_a_is_retired() {
    let OnKeyA {
        ctx,
        home,
        a_key,
        a_pub,
    } = installed_on_key_a();
    let (b_key, b_pub) = ctx.keygen("b");
    let statement = rotate(&ctx, &a_key, &b_pub, "rot");
    let a_id = key_id(&a_pub);

    // The statement is an ordinary minisign signature over B's public key file.
    require_minisign();
    for signed in [
        ctx.path(&format!("rot/rotation-{}.pub", key_id(&b_pub))),
        b_pub.clone(),
    ] {
        run_ok(
            Command::new("minisign")
                .args(["-V", "-m"])
                .arg(&signed)
                .arg("-x")
                .arg(&statement)
                .arg("-p")
                .arg(&a_pub),
        );
    }

    let d2 = version_dist(&ctx, "d2", "2.0.0");
    let alone = ctx.pack(&d2, "2.0.0", "2", &b_key, "alone");
    let out = verify_with(&ctx, &alone, &a_pub);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("carries no rotation"),
        "{}",
        stdout(&out)
    );

    let server = serve_to(&ctx, &home, &alone);
    start(&home);
    wait_log(&home, "agent.log", "carries no rotation", WAIT);
    assert!(current(&home).ends_with("1.0.0+1"));
    assert!(!home.join("data/update-journal.json").exists());

    // Another build: the server has 2.0.0+2 in its history already, and one build
    // number is one set of bytes.
    let chained = ctx.pack_with(
        &d2,
        "2.0.0",
        "3",
        &b_key,
        "chained",
        &["--rotation", &statement.display().to_string()],
    );
    let out = verify_with(&ctx, &chained, &a_pub);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!(
            "key rotation followed: {a_id} -> {}",
            key_id(&b_pub)
        )),
        "{}",
        stdout(&out)
    );
    ctx.republish(&server, &chained);
    wait_server_status(&server, "2.0.0+3", "INSTALLED", &home);
    assert_eq!(
        fs::read(home.join("conf/update.pub")).unwrap(),
        fs::read(&b_pub).unwrap()
    );
    assert_eq!(
        fs::read(home.join("conf/update.pub.prev")).unwrap(),
        fs::read(&a_pub).unwrap()
    );
    assert!(retired(&home).starts_with(&a_id), "{}", retired(&home));
    assert!(read_file(&home.join("logs/update.log")).contains("signing key rotated"));

    // The old key signs a newer version: refused by name, before any download.
    let d3 = version_dist(&ctx, "d3", "3.0.0");
    let by_old_key = ctx.pack(&d3, "3.0.0", "3", &a_key, "b3");
    ctx.republish(&server, &by_old_key);
    wait_log(&home, "agent.log", "key_retired", WAIT);
    assert!(current(&home).ends_with("2.0.0+3"));
    assert!(!home.join("data/update/agent-bundle-3.0.0").exists());
}

#[test]
fn an_agent_that_skipped_b_follows_a_b_c_and_a_broken_middle_link_is_refused() {
    let OnKeyA {
        ctx,
        home,
        a_key,
        a_pub,
    } = installed_on_key_a();
    let (b_key, b_pub) = ctx.keygen("b");
    let (c_key, c_pub) = ctx.keygen("c");
    let (x_key, _) = ctx.keygen("x");
    let ab = rotate(&ctx, &a_key, &b_pub, "rot");
    let bc = rotate(&ctx, &b_key, &c_pub, "rot");
    let xc = rotate(&ctx, &x_key, &c_pub, "bad");
    let (a_id, b_id, c_id) = (key_id(&a_pub), key_id(&b_pub), key_id(&c_pub));
    let d2 = version_dist(&ctx, "d2", "2.0.0");

    // pack refuses a chain whose links do not follow one another.
    let refused = run_fails(
        ctx.cmd("agent-bundle")
            .args(["pack", "--dist"])
            .arg(&d2)
            .args(["--version", "2.0.0", "--build", "2", "--key"])
            .arg(&c_key)
            .args(["--out", "nope", "--rotation"])
            .arg(&ab)
            .arg("--rotation")
            .arg(&xc),
        1,
    );
    assert!(refused.contains("does not follow statement 1"), "{refused}");

    let good = ctx.pack_with(
        &d2,
        "2.0.0",
        "2",
        &c_key,
        "good",
        &[
            "--rotation",
            &ab.display().to_string(),
            "--rotation",
            &bc.display().to_string(),
        ],
    );
    let out = verify_with(&ctx, &good, &a_pub);
    assert!(
        stdout(&out).contains(&format!(
            "key rotation followed: {a_id} -> {b_id} -> {c_id}"
        )),
        "{}",
        stdout(&out)
    );
    let out = verify_with(&ctx, &good, &b_pub);
    assert!(
        stdout(&out).contains(&format!("key rotation followed: {b_id} -> {c_id}")),
        "{}",
        stdout(&out)
    );

    // What pack never makes: the same bundle with the second link signed by key X.
    let parts = ctx.path("parts");
    fs::create_dir_all(&parts).unwrap();
    let listing = Command::new("unzip")
        .arg("-Z1")
        .arg(&good)
        .output()
        .unwrap();
    let names: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("rotations/02-")),
        "{names:?}"
    );
    let _ = Command::new("unzip")
        .arg("-q")
        .arg(&good)
        .arg("-d")
        .arg(&parts)
        .status();
    fs::copy(&xc, parts.join(format!("rotations/02-{c_id}.minisig"))).unwrap();
    let files: Vec<(String, PathBuf)> = names
        .iter()
        .filter(|n| !n.ends_with('/'))
        .map(|n| (n.clone(), parts.join(n)))
        .collect();
    let part_list: Vec<e2e::Part<'_>> = files
        .iter()
        .map(|(name, file)| e2e::Part { name, file })
        .collect();
    let broken = e2e::hand_made_bundle(&ctx.path("broken"), "2.0.0", "2", &c_key, &part_list);
    let out = verify_with(&ctx, &broken, &a_pub);
    assert!(!out.status.success());
    assert!(
        stdout(&out).contains("breaks at statement 2"),
        "{}",
        stdout(&out)
    );

    let server = serve_to(&ctx, &home, &broken);
    start(&home);
    wait_log(&home, "agent.log", "breaks at statement 2", WAIT);
    assert!(current(&home).ends_with("1.0.0+1"));
    assert_eq!(
        fs::read(home.join("conf/update.pub")).unwrap(),
        fs::read(&a_pub).unwrap()
    );

    // The good chain as another build: the server has the broken 2.0.0+2 in its
    // history, and one build number is one set of bytes.
    let good = ctx.pack_with(
        &d2,
        "2.0.0",
        "3",
        &c_key,
        "good3",
        &[
            "--rotation",
            &ab.display().to_string(),
            "--rotation",
            &bc.display().to_string(),
        ],
    );
    ctx.republish(&server, &good);
    wait_server_status(&server, "2.0.0+3", "INSTALLED", &home);
    assert_eq!(
        fs::read(home.join("conf/update.pub")).unwrap(),
        fs::read(&c_pub).unwrap()
    );
    let retired = retired(&home);
    let ids: Vec<&str> = retired
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(ids, [a_id.as_str(), b_id.as_str()], "{retired}");
}

#[test]
fn a_rolled_back_rotation_leaves_the_trust_exactly_as_it_was() {
    let OnKeyA {
        ctx,
        home,
        a_key,
        a_pub,
    } = installed_on_key_a();
    let (b_key, b_pub) = ctx.keygen("b");
    let statement = rotate(&ctx, &a_key, &b_pub, "rot");
    let d2 = version_dist(&ctx, "d2", "2.0.0");
    script_agent(&d2, "echo 'broken on purpose' >&2; exit 1");
    let bundle = ctx.pack_with(
        &d2,
        "2.0.0",
        "2",
        &b_key,
        "b2",
        &["--rotation", &statement.display().to_string()],
    );
    let conf_before = fs::read(home.join("conf/update.pub")).unwrap();
    let server = serve_to(&ctx, &home, &bundle);
    start(&home);
    wait_server_status(&server, "1.0.0+1", "INSTALL_FAILED", &home);
    assert_eq!(fs::read(home.join("conf/update.pub")).unwrap(), conf_before);
    assert_eq!(conf_before, fs::read(&a_pub).unwrap());
    assert!(!home.join("conf/update.pub.prev").exists());
    assert!(!home.join("data/retired-keys").exists());
    assert!(current(&home).ends_with("1.0.0+1"));
}

fn require_minisign() {
    e2e::require_tool("minisign");
}

/// The operator's edit after `--install`: the server's URL and a quick heartbeat, with
/// everything the installer wrote (the CA, the enrollment token) kept.
fn point_at(home: &Path, url: &str) {
    let path = home.join("conf/agent.toml");
    let text: String = read_file(&path)
        .lines()
        .map(|l| {
            if l.starts_with("urls = ") {
                format!("urls = [\"{url}\"]")
            } else if l.starts_with("heartbeat = ") {
                "heartbeat = \"1s\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(path, text).unwrap();
}

fn admin_agents_tls(pki: &Pki, server: &ServerProc) -> Vec<serde_json::Value> {
    let out = pki
        .curl()
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .arg(server.https_url("/admin/agents"))
        .output()
        .unwrap();
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Copies the bundle to an HTTPS server and waits until it describes it.
fn publish_tls(ctx: &TestContext, pki: &Pki, server: &ServerProc, bundle: &Path) {
    ctx.publish(server, bundle);
    let sha = sha256_file(bundle);
    wait_until(
        Duration::from_secs(30),
        "the HTTPS server to serve the bundle",
        || {
            pki.curl()
                .arg(server.https_url("/agentupdate/version"))
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&sha))
        },
    );
}

#[test]
fn the_whole_update_over_https_with_a_pinned_ca() {
    let ctx = TestContext::new();
    let pki = Pki::new(&ctx.path("pki"));
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&version_dist(&ctx, "d2", "2.0.0"), "2.0.0", "2", &key, "b2");
    let server = ctx.server_tls("srv", &pki, &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    publish_tls(&ctx, &pki, &server, &b2);

    // Provisioning tools with the CA.
    let version = pki
        .curl()
        .arg(server.https_url("/agentupdate/version"))
        .output()
        .unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).contains("agent.latest.version=2.0.0"));
    // HTTP/2 and HTTP/1.1 are both offered by ALPN: each client gets the one it asks for.
    for (flag, spoken) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let answer = pki
            .curl()
            .args([flag, "-o", "/dev/null", "-w", "%{http_version}"])
            .arg(server.https_url("/agentupdate/version"))
            .output()
            .unwrap();
        assert!(answer.status.success(), "curl {flag}: {answer:?}");
        assert_eq!(
            String::from_utf8_lossy(&answer.stdout),
            spoken,
            "curl {flag}"
        );
    }
    e2e::require_tool("wget");
    let fetched = ctx.path("wget-bundle");
    run_ok(
        Command::new("wget")
            .arg("-q")
            .arg(format!("--ca-certificate={}", pki.ca.display()))
            .arg("-O")
            .arg(&fetched)
            .arg(server.https_url("/agentupdate/download")),
    );
    assert_eq!(sha256_file(&fetched), sha256_file(&b2));
    let curled = ctx.path("curl-bundle");
    run_ok(
        pki.curl()
            .arg("-o")
            .arg(&curled)
            .arg(server.https_url("/agentupdate/download")),
    );
    assert_eq!(sha256_file(&curled), sha256_file(&b2));
    // Without the CA, curl refuses the server.
    let untrusted = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(server.https_url("/agentupdate/version"))
        .output()
        .unwrap();
    assert!(!untrusted.status.success());

    // Plain HTTP to the HTTPS port learns nothing.
    if let Ok(answer) = http(server.port, "GET", "/agentupdate/version", &[]) {
        assert!(!answer.text().contains("agent.latest"), "{}", answer.text());
        assert_ne!(answer.status, 200);
    }

    // An agent installed with the CA pinned updates over HTTPS.
    let install = run_ok(
        Command::new(&b1)
            .arg(format!("--install={}", ctx.path("p").display()))
            .arg("--ca-file")
            .arg(&pki.ca),
    );
    assert!(stdout(&install).contains("ca.pem"), "{}", stdout(&install));
    let home = fs::canonicalize(ctx.path("p/agent")).unwrap();
    assert_eq!(read_file(&home.join("conf/ca.pem")), read_file(&pki.ca));
    assert!(read_file(&home.join("conf/agent.toml")).contains("ca-file"));
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    point_at(&home, &server.https_url(""));

    // One without it refuses the server, says why, and never updates.
    let stranger = ctx.install(&b1, "q");
    fs::write(stranger.join("conf/agent-env.sh"), QUICK).unwrap();
    point_at(&stranger, &server.https_url(""));

    start(&home);
    start(&stranger);
    wait_until(WAIT, "the pinned agent to report 2.0.0 INSTALLED", || {
        admin_agents_tls(&pki, &server)
            .iter()
            .any(|a| a["version"] == "2.0.0+2" && a["update_status"] == "INSTALLED")
    });
    let said = wait_log(&stranger, "agent.log", "certificate", WAIT);
    assert!(said.contains("server.ca-file"), "{said}");
    assert!(current(&stranger).ends_with("1.0.0+1"));
    assert!(!stranger.join("data/update-journal.json").exists());
    let stranger_id = read_file(&stranger.join("data/agent-id")).trim().to_owned();
    assert!(
        !admin_agents_tls(&pki, &server)
            .iter()
            .any(|a| a["id"] == stranger_id.as_str()),
        "the server heard from the agent without the CA"
    );
    // Said once, not every heartbeat.
    let log = read_file(&stranger.join("logs/agent.log"));
    assert!(
        log.matches("certificate").count() <= 4,
        "the certificate failure is repeated:\n{log}"
    );
}

#[test]
fn certificate_errors_are_clear_and_a_renewed_certificate_is_picked_up() {
    let ctx = TestContext::new();
    let pki = Pki::new(&ctx.path("pki"));
    let (other_cert, _) = pki.issue("other", 1);
    let (expired_cert, expired_key) = pki.issue("expired", -1);
    let cases: [(&str, PathBuf, PathBuf); 3] = [
        ("missing.pem", ctx.path("pki/missing.pem"), pki.key.clone()),
        (
            "is not the key of the certificate",
            other_cert,
            pki.key.clone(),
        ),
        ("expired", expired_cert, expired_key),
    ];
    for (needle, cert, key) in cases {
        let out = run(ctx
            .cmd("update-server")
            .args(["--listen", "127.0.0.1:0", "--home"])
            .arg(ctx.path("bad-home"))
            .env("UPDATE_SERVER_TLS_CERT", &cert)
            .env("UPDATE_SERVER_TLS_KEY", &key));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "started with {cert:?}: {err}");
        assert!(err.contains(needle), "expected {needle:?} in: {err}");
    }

    // A download under way survives a certificate reload.
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d1");
    pad_dist(&dist, 3 << 20);
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let server = ctx.server_tls("srv", &pki, &[]);
    publish_tls(&ctx, &pki, &server, &bundle);
    assert!(pki.presented_subject(server.port).contains("CN = server"));
    let slow_copy = ctx.path("slow-copy");
    let mut slow = pki
        .curl()
        .args(["--limit-rate", "1M", "--max-time", "60", "-o"])
        .arg(&slow_copy)
        .arg(server.https_url("/agentupdate/download"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the slow download to start",
        || fs::metadata(&slow_copy).is_ok_and(|m| m.len() > 0),
    );

    let (renewed_cert, renewed_key) = pki.issue("renewed", 1);
    fs::copy(&renewed_key, ctx.path("pki/next.key")).unwrap();
    fs::copy(&renewed_cert, ctx.path("pki/next.pem")).unwrap();
    fs::rename(ctx.path("pki/next.key"), &pki.key).unwrap();
    fs::rename(ctx.path("pki/next.pem"), &pki.cert).unwrap();
    signal(server.pid, "HUP");
    wait_until(Duration::from_secs(10), "the renewed certificate", || {
        pki.presented_subject(server.port).contains("CN = renewed")
    });
    assert!(
        slow.wait().unwrap().success(),
        "the download under way was cut"
    );
    assert_eq!(sha256_file(&slow_copy), sha256_file(&bundle));

    // A broken replacement is refused and the one in force stays.
    let log = server.home.join("server.log");
    let kept = |log: &Path| {
        read_file(log)
            .matches("the certificate in force stays")
            .count()
    };
    let refusals = kept(&log);
    fs::write(&pki.cert, "not a certificate\n").unwrap();
    signal(server.pid, "HUP");
    wait_until(
        Duration::from_secs(10),
        "the broken certificate refused",
        || kept(&log) > refusals,
    );
    assert!(pki.presented_subject(server.port).contains("CN = renewed"));
}

fn hello_body(id: &str) -> Vec<u8> {
    serde_json::json!({
        "id": id,
        "name": "forger",
        "platform": agent_protocol::layout::PLATFORM,
    })
    .to_string()
    .into_bytes()
}

#[test]
fn forged_reports_and_a_stolen_id_get_401_and_change_nothing() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    let server = serve_to(&ctx, &home, &b1);
    start(&home);
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    wait_until(WAIT, "the agent to register and keep its token", || {
        home.join("data/agent-token").exists()
            && admin_agents(server.port, TOKEN)
                .iter()
                .any(|a| a["id"] == id.as_str())
    });
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(home.join("data/agent-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let before = admin_agents(server.port, TOKEN);

    let report = serde_json::json!({
        "id": id, "from": "1.0.0+1", "to": "9.0.0+9",
        "status": "INSTALL_FAILED", "error": "forged",
    })
    .to_string();
    let guessed = format!("Bearer {}", "0".repeat(43));
    for headers in [vec![], vec![("Authorization", guessed.as_str())]] {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend(headers.iter().copied());
        let answer = http_with_body(
            server.port,
            "POST",
            "/agentupdate/report",
            &all,
            report.as_bytes(),
        )
        .unwrap();
        assert_eq!(answer.status, 401, "{}", answer.text());
    }
    // Another machine claiming the id.
    let claim = http_with_body(
        server.port,
        "POST",
        "/agent/register",
        &[
            ("Content-Type", "application/json"),
            ("Agent-Version", "1.0.0+1"),
        ],
        &hello_body(&id),
    )
    .unwrap();
    assert_eq!(claim.status, 401, "{}", claim.text());
    assert!(!claim.text().contains("token\":\""), "{}", claim.text());

    let after = admin_agents(server.port, TOKEN);
    let fields = |v: &[serde_json::Value]| -> Vec<(String, String, String, String)> {
        v.iter()
            .map(|a| {
                (
                    a["id"].to_string(),
                    a["name"].to_string(),
                    a["update_status"].to_string(),
                    a["update_error"].to_string(),
                )
            })
            .collect()
    };
    assert_eq!(fields(&before), fields(&after));
    assert!(!after.iter().any(|a| a["update_error"] == "forged"));

    // The operator's way back for an agent that lost its data/: forget the token.
    run_ok(
        ctx.cmd("update-server")
            .args(["agents", "forget-token", &id, "--token", TOKEN, "--server"])
            .arg(server.url("")),
    );
    let fresh = http_with_body(
        server.port,
        "POST",
        "/agent/register",
        &[
            ("Content-Type", "application/json"),
            ("Agent-Version", "1.0.0+1"),
        ],
        &hello_body(&id),
    )
    .unwrap();
    assert_eq!(fresh.status, 200, "{}", fresh.text());
    assert!(fresh.text().contains("\"token\""), "{}", fresh.text());
}

#[test]
fn enrollment_needs_the_token_and_an_agent_installed_with_it_updates() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&version_dist(&ctx, "d2", "2.0.0"), "2.0.0", "2", &key, "b2");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", "s3cret-enrol"),
        ],
    );
    ctx.publish_served(&server, &b2);
    let headers = [
        ("Content-Type", "application/json"),
        ("Agent-Version", "1.0.0+1"),
    ];
    let without = http_with_body(
        server.port,
        "POST",
        "/agent/register",
        &headers,
        &hello_body("x1"),
    )
    .unwrap();
    assert_eq!(without.status, 401, "{}", without.text());
    let mut wrong = headers.to_vec();
    wrong.push(("Enrollment-Token", "guess"));
    let guessed = http_with_body(
        server.port,
        "POST",
        "/agent/register",
        &wrong,
        &hello_body("x1"),
    )
    .unwrap();
    assert_eq!(guessed.status, 401, "{}", guessed.text());
    assert!(admin_agents(server.port, TOKEN).is_empty());

    run_ok(
        Command::new(&b1)
            .arg(format!("--install={}", ctx.path("p").display()))
            .args(["--enroll-token", "s3cret-enrol"]),
    );
    let home = fs::canonicalize(ctx.path("p/agent")).unwrap();
    assert!(read_file(&home.join("conf/agent.toml")).contains("s3cret-enrol"));
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    point_at(&home, &server.url(""));
    start(&home);
    wait_server_status(&server, "2.0.0+2", "INSTALLED", &home);

    // A new enrollment token locks out no agent that already has its credentials.
    signal(server.pid, "TERM");
    wait_until(Duration::from_secs(20), "the server to stop", || {
        e2e::pid_gone(server.pid)
    });
    let server = ctx.server_on(
        "srv",
        server.port,
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", "rotated-enrol"),
        ],
    );
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("restart"));
    let restarted = e2e::now_secs();
    wait_until(
        WAIT,
        "the agent to register again after the restart",
        || {
            health(&home)["last_contact"]
                .as_u64()
                .is_some_and(|t| t >= restarted)
        },
    );
    let log = read_file(&home.join("logs/agent.log"));
    assert!(!log.contains("answered 401"), "{log}");
    assert!(
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == "2.0.0+2")
    );
}

/// The answer to an agent's first register is lost (the server committed it, the agent
/// never heard it); then the server is killed and started again before the agent's
/// next try. The agent registers on its retry, with no operator, and is never refused;
/// a stranger with its id and without its secret still is.
#[test]
fn a_first_register_whose_answer_is_lost_ends_registered_without_an_operator() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let home = ctx.install(&b1, "p");
    let server = serve_to(&ctx, &home, &b1);
    let proxy = e2e::proxy::Proxy::losing_the_answer_to(server.port, "POST /agent/register");
    crate::update::operator_conf(&home, &proxy.url());
    start(&home);
    wait_until(
        WAIT,
        "the proxy to lose the answer to the first register",
        || proxy.lost_an_answer(),
    );
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    // Its secret was kept before it was first sent.
    let secret = read_file(&home.join("data/agent-token")).trim().to_owned();
    assert_eq!(secret.len(), 64, "{secret}");
    signal(server.pid, "KILL");
    wait_until(WAIT, "the killed server to be gone", || {
        e2e::pid_gone(server.pid)
    });
    let server = ctx.server_on("srv", server.port, &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let contact = || {
        admin_agents(server.port, TOKEN)
            .into_iter()
            .find(|a| a["id"] == id.as_str())
            .and_then(|a| a["last_contact"].as_str().map(str::to_owned))
    };
    wait_until(WAIT, "the agent to be registered and in contact", || {
        contact().is_some()
    });
    let first = contact();
    wait_until(WAIT, "the agent to call again", || contact() != first);
    let log = read_file(&home.join("logs/agent.log"));
    assert!(!log.contains("401"), "the agent was refused: {log}");
    assert_eq!(
        read_file(&home.join("data/agent-token")).trim(),
        secret,
        "the agent's secret changed"
    );
    let server_log = read_file(&server.home.join("server.log"));
    assert!(
        !server_log.contains("refused a call without the agent's credentials"),
        "{server_log}"
    );
    // A stranger replaying the id without the secret.
    let claim = http_with_body(
        server.port,
        "POST",
        "/agent/register",
        &[
            ("Content-Type", "application/json"),
            ("Agent-Version", "1.0.0+1"),
        ],
        &hello_body(&id),
    )
    .unwrap();
    assert_eq!(claim.status, 401, "{}", claim.text());
}
