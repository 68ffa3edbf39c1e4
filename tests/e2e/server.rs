//! update-server as operators and agents meet it: real process, real sockets.

use std::fs;
use std::io::Read;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use e2e::{
    TestContext, http, http_open, metric, pad_dist, pid_gone, property, require_tool, run_ok,
    sha256_bytes, sha256_file, signal, wait_until,
};

/// Polls /agentupdate/version until it answers 200 (and names `version`, if not empty).
fn wait_served(server: &e2e::ServerProc, version: &str) {
    let wanted = format!("agent.latest.version={version}\n");
    wait_until(Duration::from_secs(10), "the bundle to be served", || {
        http(server.port, "GET", "/agentupdate/version", &[])
            .map(|r| r.status == 200 && (version.is_empty() || r.text().contains(&wanted)))
            .unwrap_or(false)
    });
}

pub(crate) fn bundle_of_size(
    ctx: &TestContext,
    version: &str,
    pad: usize,
    out: &str,
) -> std::path::PathBuf {
    let key = ctx.path("keys/update.key");
    if !key.exists() {
        ctx.keygen("keys");
    }
    let dist = ctx.dist(&format!("dist-{version}"));
    pad_dist(&dist, pad);
    ctx.pack(&dist, version, "1", &key, out)
}

#[test]
fn wget_saves_the_named_bundle_and_curl_resumes_a_cut_download() {
    require_tool("wget");
    require_tool("curl");
    let ctx = TestContext::new();
    let bundle = bundle_of_size(&ctx, "2.2.0", 4 << 20, "out");
    let server = ctx.server("home", &[]);
    ctx.publish(&server, &bundle);
    wait_served(&server, "");
    let version = http(server.port, "GET", "/agentupdate/version", &[]).unwrap();
    assert_eq!(version.header("cache-control"), Some("no-store"));
    let advertised = property(&version.text(), "agent.latest.sha256").unwrap();
    assert_eq!(advertised, sha256_file(&bundle));

    fs::create_dir(ctx.path("wget")).unwrap();
    run_ok(
        Command::new("wget")
            .args([
                "-q",
                "--content-disposition",
                &server.url("/agentupdate/download"),
            ])
            .current_dir(ctx.path("wget")),
    );
    assert_eq!(
        sha256_file(&ctx.path("wget/agent-bundle-2.2.0")),
        advertised
    );

    // A download cut in half, resumed with curl -C -, verifies.
    let whole = fs::read(&bundle).unwrap();
    fs::create_dir(ctx.path("curl")).unwrap();
    let partial = ctx.path("curl/agent-bundle-2.2.0");
    fs::write(&partial, &whole[..whole.len() / 2]).unwrap();
    run_ok(
        Command::new("curl")
            .args(["-sf", "-C", "-", "-o"])
            .arg(&partial)
            .arg(server.url("/agentupdate/download")),
    );
    assert_eq!(sha256_file(&partial), advertised);
    run_ok(
        ctx.cmd("agent-bundle")
            .arg("verify")
            .arg(&partial)
            .arg("--pub")
            .arg(ctx.path("keys/update.pub"))
            .arg("--sig")
            .arg(format!("{}.minisig", bundle.display())),
    );
    assert!(metric(&server, "agentupdate_downloads_total{code=\"206\"}") >= 1.0);
}

#[test]
fn limit_five_with_two_hundred_clients_never_exceeds_five() {
    let ctx = TestContext::new();
    // Large enough that a body cannot sit whole in the socket buffers.
    let bundle = bundle_of_size(&ctx, "2.2.0", 24 << 20, "out");
    let server = ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_DOWNLOADS_LIMIT", "5"),
            ("UPDATE_SERVER_DOWNLOADS_RETRY_AFTER", "7"),
        ],
    );
    ctx.publish(&server, &bundle);
    wait_served(&server, "");
    let clients = 200;
    let answered = Arc::new(Barrier::new(clients + 1));
    let release = Arc::new(Barrier::new(clients + 1));
    let port = server.port;
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (answered, release) = (Arc::clone(&answered), Arc::clone(&release));
            std::thread::spawn(move || {
                let (head, mut body) = http_open(port, "/agentupdate/download").unwrap();
                answered.wait();
                release.wait();
                let mut data = Vec::new();
                body.read_to_end(&mut data).unwrap();
                (head, data)
            })
        })
        .collect();
    // Every client has its answer and the five lucky ones hold their bodies unread.
    answered.wait();
    let in_flight = metric(&server, "agentupdate_downloads_in_flight");
    release.wait();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok: Vec<_> = results.iter().filter(|(h, _)| h.status == 200).collect();
    let refused: Vec<_> = results.iter().filter(|(h, _)| h.status == 503).collect();
    assert_eq!(ok.len(), 5, "clients with a body");
    assert_eq!(refused.len(), clients - 5, "every other client is refused");
    assert!(
        refused
            .iter()
            .all(|(h, _)| h.header("retry-after") == Some("7")),
        "503 without Retry-After: 7"
    );
    assert_eq!(
        in_flight, 5.0,
        "server's own count while five bodies were held"
    );
    let expected = sha256_file(&bundle);
    assert!(ok.iter().all(|(_, body)| sha256_bytes(body) == expected));
    assert!(metric(&server, "agentupdate_downloads_in_flight_peak") <= 5.0);
}

#[test]
fn clients_that_hang_up_mid_body_free_their_slots() {
    let ctx = TestContext::new();
    let bundle = bundle_of_size(&ctx, "2.2.0", 16 << 20, "out");
    let server = ctx.server("home", &[("UPDATE_SERVER_DOWNLOADS_LIMIT", "5")]);
    ctx.publish(&server, &bundle);
    wait_served(&server, "");
    for _ in 0..20 {
        let batch: Vec<_> = (0..5)
            .map(|_| http_open(server.port, "/agentupdate/download").unwrap())
            .collect();
        for (head, mut body) in batch {
            assert_eq!(head.status, 200);
            let mut some = vec![0u8; 64 * 1024];
            body.read_exact(&mut some).unwrap();
            drop(body); // hang up mid-body
        }
        wait_until(Duration::from_secs(10), "slots to be released", || {
            metric(&server, "agentupdate_downloads_in_flight") == 0.0
        });
    }
    let answer = http(server.port, "GET", "/agentupdate/download", &[]).unwrap();
    assert_eq!(answer.status, 200, "a download after 100 hang-ups");
    assert_eq!(sha256_bytes(&answer.body), sha256_file(&bundle));
}

#[test]
fn replacing_the_bundle_does_not_change_running_downloads() {
    let ctx = TestContext::new();
    let old = bundle_of_size(&ctx, "2.2.0", 16 << 20, "old");
    let new = bundle_of_size(&ctx, "2.3.0", 1 << 20, "new");
    let server = ctx.server("home", &[]);
    ctx.publish(&server, &old);
    wait_served(&server, "2.2.0");
    let running: Vec<_> = (0..10)
        .map(|_| http_open(server.port, "/agentupdate/download").unwrap())
        .collect();
    // The operator swaps the bundle, even overwriting the old file in place first.
    let dropped = server.download_dir().join("agent-bundle-2.2.0");
    fs::write(&dropped, b"garbage written over the old bundle").unwrap();
    fs::remove_file(&dropped).unwrap();
    fs::remove_file(server.download_dir().join("agent-bundle-2.2.0.minisig")).unwrap();
    ctx.publish(&server, &new);
    wait_served(&server, "2.3.0");
    let expected = sha256_file(&old);
    for (head, mut body) in running {
        assert_eq!(head.status, 200);
        let mut data = Vec::new();
        body.read_to_end(&mut data).unwrap();
        assert_eq!(
            sha256_bytes(&data),
            expected,
            "a running download changed bytes"
        );
    }
    let now = http(server.port, "GET", "/agentupdate/download", &[]).unwrap();
    assert_eq!(sha256_bytes(&now.body), sha256_file(&new));
}

#[test]
fn limit_zero_and_fleet_switch_answer_403() {
    let ctx = TestContext::new();
    let bundle = bundle_of_size(&ctx, "2.2.0", 0, "out");
    let server = ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_DOWNLOADS_LIMIT", "0"),
            ("UPDATE_SERVER_ADMIN_TOKEN", "s3cret"),
        ],
    );
    ctx.publish(&server, &bundle);
    wait_served(&server, "");
    assert_eq!(
        http(server.port, "GET", "/agentupdate/download", &[])
            .unwrap()
            .status,
        403
    );
    assert_eq!(
        http(server.port, "GET", "/agentupdate/download.minisig", &[])
            .unwrap()
            .status,
        200,
        "the signature is never limited"
    );
    let auth = ("Authorization", "Bearer s3cret");
    let set = |body: &str| {
        e2e::http_with_body(
            server.port,
            "PUT",
            "/admin/settings",
            &[auth, ("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .unwrap()
    };
    assert_eq!(set(r#"{"downloads_limit": 3}"#).status, 200);
    assert_eq!(
        http(server.port, "GET", "/agentupdate/download", &[])
            .unwrap()
            .status,
        200
    );
    assert_eq!(set(r#"{"auto_update": false}"#).status, 200);
    assert_eq!(
        http(server.port, "GET", "/agentupdate/download", &[])
            .unwrap()
            .status,
        403
    );
    assert_eq!(
        http(
            server.port,
            "GET",
            "/admin/settings",
            &[("Authorization", "Bearer wrong")]
        )
        .unwrap()
        .status,
        401
    );
    assert_eq!(
        set(r#"{"downloads_limit": 1000000}"#).status,
        400,
        "limit above max-connections"
    );
}

#[test]
fn sigterm_refuses_new_connections_and_lets_running_downloads_finish() {
    let ctx = TestContext::new();
    let bundle = bundle_of_size(&ctx, "2.2.0", 16 << 20, "out");
    let server = ctx.server("home", &[("UPDATE_SERVER_SERVER_SHUTDOWN_GRACE", "30")]);
    ctx.publish(&server, &bundle);
    wait_served(&server, "2.2.0");
    let (head, mut body) = http_open(server.port, "/agentupdate/download").unwrap();
    assert_eq!(head.status, 200);
    let mut first = vec![0u8; 64 * 1024];
    body.read_exact(&mut first).unwrap();

    signal(server.pid, "TERM");
    wait_until(
        Duration::from_secs(10),
        "new connections to be refused",
        || std::net::TcpStream::connect(("127.0.0.1", server.port)).is_err(),
    );
    assert!(!pid_gone(server.pid), "exited with a download running");
    let mut rest = Vec::new();
    body.read_to_end(&mut rest).unwrap();
    first.extend_from_slice(&rest);
    assert_eq!(
        sha256_bytes(&first),
        sha256_file(&bundle),
        "download cut by SIGTERM"
    );
    wait_until(Duration::from_secs(10), "the server to exit", || {
        pid_gone(server.pid)
    });
}

#[test]
fn sigterm_grace_period_ends_stalled_downloads() {
    let ctx = TestContext::new();
    let bundle = bundle_of_size(&ctx, "2.2.0", 16 << 20, "out");
    let server = ctx.server("home", &[("UPDATE_SERVER_SERVER_SHUTDOWN_GRACE", "1")]);
    ctx.publish(&server, &bundle);
    wait_served(&server, "2.2.0");
    // A client that never reads: without the grace period the server would wait forever.
    let (_head, _stalled) = http_open(server.port, "/agentupdate/download").unwrap();
    signal(server.pid, "TERM");
    wait_until(
        Duration::from_secs(10),
        "the server to exit after its grace",
        || pid_gone(server.pid),
    );
}
