//! Slow and malicious HTTP clients against a real server on a real socket, with short
//! clocks from the environment: none of them holds a download slot, a connection or
//! memory for long, and none takes the bundle offline.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use e2e::{ServerProc, TestContext, http, metric, sha256_bytes, sha256_file, wait_until};

use crate::server::bundle_of_size;

/// A server with these settings, serving a bundle of `pad` bytes.
fn serving(
    ctx: &TestContext,
    env: &[(&str, &str)],
    pad: usize,
) -> (ServerProc, std::path::PathBuf) {
    let bundle = bundle_of_size(ctx, "2.2.0", pad, "out");
    let server = ctx.server("home", env);
    ctx.publish_served(&server, &bundle);
    (server, bundle)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// True once the server has closed `s` (EOF or a reset), reading what it sent first.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
}

fn anon_kib(pid: u32) -> u64 {
    e2e::status_kib(pid, "RssAnon")
}

#[test]
fn stalled_readers_lose_their_slots_and_the_next_download_succeeds() {
    let ctx = TestContext::new();
    // Far larger than the socket buffers on both ends, so a client that reads nothing stalls.
    let (server, bundle) = serving(
        &ctx,
        &[
            ("UPDATE_SERVER_DOWNLOADS_LIMIT", "4"),
            ("UPDATE_SERVER_DOWNLOADS_STALL_TIMEOUT", "2"),
        ],
        48 << 20,
    );
    let stalled: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = connect(server.port);
            s.write_all(b"GET /agentupdate/download HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    wait_until(Duration::from_secs(10), "four downloads in flight", || {
        metric(&server, "agentupdate_downloads_in_flight") == 4.0
    });
    let busy = http(server.port, "GET", "/agentupdate/download", &[]).unwrap();
    assert_eq!(busy.status, 503, "the limit is reached");
    let started = Instant::now();
    wait_until(
        Duration::from_secs(15),
        "the stalled downloads to be ended",
        || metric(&server, "agentupdate_downloads_in_flight") == 0.0,
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "ended before the stall timeout"
    );
    assert_eq!(metric(&server, "agentupdate_downloads_stalled_total"), 4.0);
    let answer = http(server.port, "GET", "/agentupdate/download", &[]).unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(sha256_bytes(&answer.body), sha256_file(&bundle));
    drop(stalled);
}

#[test]
fn half_sent_requests_are_closed_after_the_header_timeout() {
    let ctx = TestContext::new();
    let (server, _) = serving(&ctx, &[("UPDATE_SERVER_SERVER_HEADER_TIMEOUT", "2")], 0);
    let mut clients: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = connect(server.port);
            s.write_all(b"GET /agentupdate/version HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    for s in &mut clients {
        assert!(closed_by_server(s));
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "took {took:?} to close 300 half-sent requests"
    );
    assert!(
        metric(
            &server,
            "agentupdate_connections_closed_total{reason=\"header-timeout\"}"
        ) >= 300.0
    );
    // The server still answers.
    assert_eq!(
        http(server.port, "GET", "/agentupdate/version", &[])
            .unwrap()
            .status,
        200
    );
}

#[test]
fn huge_heads_sent_slowly_get_431_and_leave_memory_flat() {
    let ctx = TestContext::new();
    let (server, _) = serving(&ctx, &[], 0);
    let idle = anon_kib(server.pid);
    let mut clients: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = connect(server.port);
            s.write_all(b"GET /agentupdate/version HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // 400 KB of header per connection, a kilobyte at a time, round-robin.
    let line = format!("X-Pad: {}\r\n", "a".repeat(1014));
    let mut peak = 0;
    let mut refused = vec![false; clients.len()];
    for _round in 0..400 {
        for (i, s) in clients.iter_mut().enumerate() {
            if !refused[i] && s.write_all(line.as_bytes()).is_err() {
                refused[i] = true;
            }
        }
        peak = peak.max(anon_kib(server.pid));
        if refused.iter().all(|r| *r) {
            break;
        }
    }
    for s in &mut clients {
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    }
    assert!(
        peak < 64 * 1024,
        "anonymous memory reached {peak} KiB (idle {idle} KiB) under 300 slow huge heads"
    );
}

#[test]
fn a_flood_of_idle_connections_never_takes_the_bundle_offline() {
    e2e::raise_fd_limit();
    let ctx = TestContext::new();
    let (server, bundle) = serving(
        &ctx,
        &[
            ("UPDATE_SERVER_SERVER_MAX_CONNECTIONS", "100"),
            ("UPDATE_SERVER_SERVER_HEADER_TIMEOUT", "3"),
        ],
        1 << 20,
    );
    let flood: Vec<TcpStream> = (0..3000)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", server.port)).ok())
        .collect();
    assert!(
        flood.len() > 1000,
        "only {} flood connections opened",
        flood.len()
    );
    // During the flood: a new client waits for a connection (the flood's are closed after
    // the header timeout), and is then served, never refused.
    for path in ["/agentupdate/version", "/agentupdate/download"] {
        let answer = http(server.port, "GET", path, &[]).unwrap();
        assert_eq!(
            answer.status,
            200,
            "{path} during the flood: {}",
            answer.text()
        );
    }
    assert!(metric(&server, "agentupdate_connections_open") <= 100.0);
    drop(flood);
    let answer = http(server.port, "GET", "/agentupdate/download", &[]).unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(sha256_bytes(&answer.body), sha256_file(&bundle));
    let log = e2e::read_file(&server.home.join("server.log"));
    assert!(!log.contains("Too many open files"), "{log}");
}

/// Sends raw request text and returns the status code.
fn status_of(port: u16, request: &str) -> u16 {
    let mut s = connect(port);
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn conditional_requests_host_and_ranges_follow_the_rfcs() {
    let ctx = TestContext::new();
    let (server, bundle) = serving(&ctx, &[], 0);
    let etag = format!("\"{}\"", sha256_file(&bundle));
    let weak = format!("W/{etag}");
    let get = |headers: &[(&str, &str)]| {
        http(server.port, "GET", "/agentupdate/download", headers)
            .unwrap()
            .status
    };
    assert_eq!(get(&[("If-None-Match", &weak)]), 304, "weak comparison");
    assert_eq!(get(&[("If-None-Match", &etag)]), 304);
    assert_eq!(get(&[("If-None-Match", "\"other\"")]), 200);
    assert_eq!(get(&[("If-Match", "\"other\"")]), 412);
    assert_eq!(get(&[("If-Match", &weak)]), 412, "strong comparison");
    assert_eq!(get(&[("If-Match", &etag)]), 200);
    assert_eq!(
        get(&[("If-Unmodified-Since", "Thu, 01 Jan 1970 00:00:00 GMT")]),
        412
    );
    assert_eq!(
        get(&[("If-Unmodified-Since", "Fri, 01 Jan 2100 00:00:00 GMT")]),
        200
    );
    let plus = http(
        server.port,
        "GET",
        "/agentupdate/download",
        &[("Range", "bytes=+1-2")],
    )
    .unwrap();
    assert_eq!(plus.status, 200, "bytes=+1-2 is no range");
    assert_eq!(
        plus.body.len() as u64,
        std::fs::metadata(&bundle).unwrap().len()
    );
    let weak_if_range = http(
        server.port,
        "GET",
        "/agentupdate/download",
        &[("Range", "bytes=0-9"), ("If-Range", &weak)],
    )
    .unwrap();
    assert_eq!(weak_if_range.status, 200, "If-Range compares strongly");
    let no_host = "GET /agentupdate/version HTTP/1.1\r\nConnection: close\r\n\r\n";
    assert_eq!(status_of(server.port, no_host), 400);
    let two_hosts =
        "GET /agentupdate/version HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n";
    assert_eq!(status_of(server.port, two_hosts), 400);
    let http10 = "GET /agentupdate/version HTTP/1.0\r\n\r\n";
    assert_eq!(
        status_of(server.port, http10),
        200,
        "HTTP/1.0 needs no Host"
    );
}

#[test]
fn error_answers_to_anonymous_clients_name_no_server_paths() {
    let ctx = TestContext::new();
    let server = ctx.server("home", &[]);
    for path in ["/agentupdate/version", "/agentupdate/download"] {
        let answer = http(server.port, "GET", path, &[]).unwrap();
        assert_eq!(answer.status, 503);
        let body = answer.text();
        assert!(body.contains("no bundle to serve"), "{body}");
        assert!(
            !body.contains(&server.home.display().to_string()) && !body.contains("/tmp"),
            "{body}"
        );
    }
    // The log keeps the detail.
    wait_until(Duration::from_secs(5), "the detail in the log", || {
        e2e::read_file(&server.home.join("server.log"))
            .contains(&server.download_dir().display().to_string())
    });
}
