//! What one publish may cost the server (issue 64): a bundle whose distribution inflates
//! past `releases.max-unpacked` is refused with the limit, a `.minisig` is read no
//! further than a signature can be long, and a third upload at once is answered `503`
//! with `Retry-After`. Each refusal changes nothing, and the server's peak memory
//! (`VmHWM`) stays within a bound that does not grow with what it was sent.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::{ServerProc, TOKEN, TestContext, run_fails, run_ok, sha256_file, stdout};

const MIB: u64 = 1024 * 1024;

/// `update-server release publish FILES… --server URL --token T`.
fn publish(ctx: &TestContext, server: &ServerProc, files: &[&Path]) -> Command {
    let mut cmd = ctx.cmd("update-server");
    cmd.args(["release", "--token", TOKEN, "--server"])
        .arg(server.url(""))
        .arg("publish")
        .args(files);
    cmd
}

fn release_count(server: &ServerProc) -> usize {
    e2e::admin_releases(server, TOKEN)["releases"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The server's peak resident memory so far, in bytes (`VmHWM`).
fn peak_rss(server: &ServerProc) -> u64 {
    let status = fs::read_to_string(format!("/proc/{}/status", server.pid)).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

fn server(ctx: &TestContext, public: &Path) -> ServerProc {
    let public = public.display().to_string();
    ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", public.as_str()),
        ],
    )
}

/// A bomb: a signed bundle whose distribution carries `size` bytes of zeros (a sparse
/// file, so it costs the disk nothing), which compress to almost nothing.
fn zeros_bundle(ctx: &TestContext, key: &Path, version: &str, size: u64) -> std::path::PathBuf {
    let dist = ctx.dist(&format!("bomb-{version}"));
    let zeros = fs::File::create(dist.join("zeros")).unwrap();
    zeros.set_len(size).unwrap();
    ctx.pack(&dist, version, "2", key, &format!("bomb-out-{version}"))
}

#[test]
fn endless_data_a_bundle_that_inflates_past_the_limit_is_refused_with_the_limit() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b1");
    let server = server(&ctx, &public);
    run_ok(&mut publish(&ctx, &server, &[&b1]));
    let before = peak_rss(&server);

    // 600 MiB of zeros: over the default releases.max-unpacked of 512 MiB.
    let bomb = zeros_bundle(&ctx, &key, "2.0.0", 600 * MIB);
    assert!(fs::metadata(&bomb).unwrap().len() < 64 * MIB);
    let text = run_fails(&mut publish(&ctx, &server, &[&bomb]), 1);
    for word in [
        "agent-bundle-2.0.0",
        "unpacks to more than 512 MiB",
        "releases.max-unpacked = 512",
        "nothing changed",
    ] {
        assert!(text.contains(word), "refused without {word:?}:\n{text}");
    }
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b1).as_str())
    );
    assert_eq!(release_count(&server), 1);
    // Counted as it was inflated: 512 MiB went by, a few chunks at a time.
    let grew = peak_rss(&server).saturating_sub(before);
    assert!(
        grew < 100 * MIB,
        "the server's peak memory grew by {} MiB checking a bomb",
        grew / MIB
    );

    // Under the limit, the same kind of bundle is a release like any other; its delta
    // from the one before is made in bounded memory (the old maker inflated the tarball
    // whole, and held both bundles).
    let big = zeros_bundle(&ctx, &key, "3.0.0", 300 * MIB);
    run_ok(&mut publish(&ctx, &server, &[&big]));
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&big).as_str())
    );
    let from = sha256_file(&b1);
    let path = format!(
        "/agentupdate/delta?from={from}&platform={}",
        agent_protocol::layout::PLATFORM
    );
    let mut answered = 0;
    for _ in 0..600 {
        answered = e2e::http(server.port, "GET", &path, &[]).unwrap().status;
        if answered != 503 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        answered == 200 || answered == 404,
        "the delta was not made: {answered}"
    );
    let grew = peak_rss(&server).saturating_sub(before);
    assert!(
        grew < 200 * MIB,
        "the server's peak memory grew by {} MiB making a delta to a 300 MiB distribution",
        grew / MIB
    );
}

#[test]
fn a_signature_larger_than_a_signature_is_refused_unread() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b1");
    let server = server(&ctx, &public);
    run_ok(&mut publish(&ctx, &server, &[&b1]));
    let before = peak_rss(&server);

    // A valid bundle, and 1 MiB where its signature should be: refused once a few KiB
    // of it are in; the rest is read and dropped, so the client reads the answer.
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let boundary = "bounds-boundary";
    let part = |name: &str| {
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
    };
    let mut body = part("agent-bundle-2.0.0").into_bytes();
    body.extend_from_slice(&fs::read(&b2).unwrap());
    body.extend_from_slice(b"\r\n");
    body.extend_from_slice(part("agent-bundle-2.0.0.minisig").as_bytes());
    body.extend_from_slice(&vec![b'x'; MIB as usize]);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST /admin/releases HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let answer = String::from_utf8_lossy(&raw);
    assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
    for word in [
        "agent-bundle-2.0.0.minisig",
        "more than 8 KiB",
        "agent-bundle sign",
        "nothing changed",
    ] {
        assert!(answer.contains(word), "refused without {word:?}:\n{answer}");
    }
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b1).as_str())
    );
    assert_eq!(release_count(&server), 1);

    // The same through `release publish`, 700 MiB beside the bundle (a sparse file):
    // refused, and the command says why.
    let dir = ctx.path("huge-signature");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(&b2, dir.join("agent-bundle-2.0.0")).unwrap();
    let huge = fs::File::create(dir.join("agent-bundle-2.0.0.minisig")).unwrap();
    huge.set_len(700 * MIB).unwrap();
    let text = run_fails(&mut publish(&ctx, &server, &[&dir]), 1);
    for word in [
        "agent-bundle-2.0.0.minisig",
        "more than 8 KiB",
        "nothing changed",
    ] {
        assert!(text.contains(word), "refused without {word:?}:\n{text}");
    }
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b1).as_str())
    );
    assert_eq!(release_count(&server), 1);
    let grew = peak_rss(&server).saturating_sub(before);
    assert!(
        grew < 64 * MIB,
        "the server's peak memory grew by {} MiB refusing a huge signature",
        grew / MIB
    );

    // A signature of the right size still publishes.
    let said = stdout(&run_ok(&mut publish(&ctx, &server, &[&b2])));
    assert!(said.contains("published release 2.0.0+2"), "{said}");
}

#[test]
fn a_huge_signature_dropped_beside_a_bundle_is_refused_unread() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b1");
    let server = server(&ctx, &public);
    let before = peak_rss(&server);
    let dir = server.download_dir();
    fs::copy(&b1, dir.join("agent-bundle-1.0.0")).unwrap();
    let huge = fs::File::create(dir.join("agent-bundle-1.0.0.minisig")).unwrap();
    huge.set_len(700 * MIB).unwrap();
    e2e::wait_until(Duration::from_secs(30), "the store to look", || {
        e2e::http(server.port, "GET", "/healthz", &[])
            .unwrap()
            .text()
            .contains("larger than 8192 bytes")
    });
    let health = e2e::http(server.port, "GET", "/healthz", &[])
        .unwrap()
        .text();
    assert!(health.contains("agent-bundle-1.0.0.minisig"), "{health}");
    assert!(health.contains("not served"), "{health}");
    assert!(e2e::served_sha256(&server).is_none());
    let grew = peak_rss(&server).saturating_sub(before);
    assert!(
        grew < 64 * MIB,
        "the server's peak memory grew by {} MiB looking at a huge signature",
        grew / MIB
    );
    // Its own signature beside it, the bundle is served.
    fs::copy(
        format!("{}.minisig", b1.display()),
        dir.join("agent-bundle-1.0.0.minisig"),
    )
    .unwrap();
    server.wait_serving(&sha256_file(&b1));
}

/// Opens an upload and sends its start, then holds it: the server is receiving it.
fn held_upload(server: &ServerProc) -> TcpStream {
    let boundary = "held";
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        stream,
        "POST /admin/releases HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\n\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"f\"; filename=\"agent-bundle-9.0.0\"\r\nContent-Type: application/octet-stream\r\n\r\n0123456789",
        64 * MIB
    )
    .unwrap();
    stream.flush().unwrap();
    stream
}

#[test]
fn a_third_upload_at_once_is_told_to_come_back() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b1");
    let server = server(&ctx, &public);

    let first = held_upload(&server);
    let second = held_upload(&server);
    // Both are in the handler once they are answered nothing for a moment.
    std::thread::sleep(Duration::from_millis(500));
    let text = run_fails(&mut publish(&ctx, &server, &[&b1]), 1);
    assert!(text.contains("2 uploads already"), "{text}");
    assert!(text.contains("nothing changed"), "{text}");
    let auth = format!("Bearer {TOKEN}");
    let answer = e2e::http_with_body(
        server.port,
        "POST",
        "/admin/releases",
        &[
            ("Authorization", &auth),
            ("Content-Type", "multipart/form-data; boundary=x"),
        ],
        b"--x--\r\n",
    )
    .unwrap();
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.header("Retry-After"), Some("10"));
    assert!(e2e::served_sha256(&server).is_none());

    // The held uploads end (cut short): their slots are free again.
    drop(first);
    drop(second);
    let mut published = String::new();
    for _ in 0..50 {
        let out = e2e::run(&mut publish(&ctx, &server, &[&b1]));
        published = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        published.contains("published release 1.0.0+1"),
        "{published}"
    );
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b1).as_str())
    );
}
