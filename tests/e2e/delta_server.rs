//! The server's side of deltas: a release change makes the delta from the bundle served
//! before, `/agentupdate/delta` sends it as a download is (headers, `Range`, the limit),
//! `agent-bundle apply-delta` rebuilds the served bundle from it byte for byte, and the
//! answers for what the server has no delta from.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{
    HttpAnswer, ServerProc, TestContext, http, http_open, metric, pad_dist, run_ok, sha256_bytes,
    sha256_file, wait_until,
};

/// Two bundles one README apart, signed with one key: `(old, new)`.
fn two_releases(ctx: &TestContext, pad: usize) -> (PathBuf, PathBuf) {
    let (key, _) = ctx.keygen("keys");
    let d1 = ctx.dist("d1");
    let d2 = ctx.dist("d2");
    if pad > 0 {
        pad_dist(&d1, pad);
        pad_dist(&d2, pad);
    }
    fs::write(d2.join("README.txt"), "The test agent, one line better.\n").unwrap();
    let old = ctx.pack(&d1, "1.0.0", "1", &key, "b1");
    let new = ctx.pack(&d2, "1.0.1", "2", &key, "b2");
    (old, new)
}

fn delta_path(from: &str) -> String {
    format!(
        "/agentupdate/delta?from={from}&platform={}",
        agent_protocol::layout::PLATFORM
    )
}

fn get_delta(server: &ServerProc, from: &str, headers: &[(&str, &str)]) -> HttpAnswer {
    http(server.port, "GET", &delta_path(from), headers).unwrap()
}

/// Asks for the delta until the worker has made it (`503` while it is made).
fn wait_delta(server: &ServerProc, from: &str) -> HttpAnswer {
    let mut last = None;
    wait_until(Duration::from_secs(60), "the delta to be made", || {
        let answer = get_delta(server, from, &[]);
        let done = answer.status != 503;
        if !done {
            assert!(
                answer.header("Retry-After").is_some(),
                "a 503 without Retry-After"
            );
        }
        last = Some(answer);
        done
    });
    let answer = last.unwrap();
    assert_eq!(
        answer.status,
        200,
        "{}\n--- server.log:\n{}",
        answer.text(),
        e2e::read_file(&server.home.join("server.log"))
    );
    answer
}

fn apply(ctx: &TestContext, old: &Path, delta: &[u8]) -> PathBuf {
    let delta_file = ctx.path("got.delta");
    fs::write(&delta_file, delta).unwrap();
    let out = ctx.path("rebuilt");
    run_ok(
        ctx.cmd("agent-bundle")
            .arg("apply-delta")
            .arg(old)
            .arg(&delta_file)
            .arg("--out")
            .arg(&out),
    );
    out
}

#[test]
fn a_release_change_makes_a_delta_that_rebuilds_the_served_bundle() {
    let ctx = TestContext::new();
    let (old, new) = two_releases(&ctx, 0);
    let server = ctx.server("home", &[]);
    ctx.publish_served(&server, &old);
    let old_sha = sha256_file(&old);
    let new_sha = sha256_file(&new);
    ctx.republish(&server, &new);

    let answer = wait_delta(&server, &old_sha);
    let delta = answer.body.clone();
    assert_eq!(
        answer.header("Content-Type"),
        Some("application/octet-stream")
    );
    assert_eq!(
        answer.header("Content-Length"),
        Some(delta.len().to_string().as_str())
    );
    assert_eq!(answer.header("Accept-Ranges"), Some("bytes"));
    let etag = format!("\"{}\"", sha256_bytes(&delta));
    assert_eq!(
        answer.header("ETag"),
        Some(etag.as_str()),
        "the delta's own sha256"
    );
    assert_eq!(
        answer.header("Content-Disposition").unwrap(),
        format!(
            "attachment; filename=\"agent-bundle-1.0.1.from-{}.delta\"",
            &old_sha[..12]
        )
    );
    let bundle_size = fs::metadata(&new).unwrap().len();
    assert!(
        (delta.len() as u64) * 100 < bundle_size,
        "one README changed: {} bytes of a {bundle_size}-byte bundle",
        delta.len()
    );
    let rebuilt = apply(&ctx, &old, &delta);
    assert_eq!(sha256_file(&rebuilt), new_sha, "rebuilt byte for byte");

    // Resume: a range, honoured while If-Range names this delta, and not otherwise.
    let tail = get_delta(&server, &old_sha, &[("Range", "bytes=10-")]);
    assert_eq!(tail.status, 206);
    assert_eq!(tail.body, delta[10..]);
    assert_eq!(
        tail.header("Content-Range").unwrap(),
        format!("bytes 10-{}/{}", delta.len() - 1, delta.len())
    );
    let stale = get_delta(
        &server,
        &old_sha,
        &[("Range", "bytes=10-"), ("If-Range", "\"something-else\"")],
    );
    assert_eq!(stale.status, 200);
    assert_eq!(stale.body, delta);
    let past = get_delta(&server, &old_sha, &[("Range", "bytes=999999999-")]);
    assert_eq!(past.status, 416);
    let head = http(server.port, "HEAD", &delta_path(&old_sha), &[]).unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(head.header("ETag"), Some(etag.as_str()));

    // What the server has no delta from.
    let unknown = get_delta(&server, &"ab".repeat(32), &[]);
    assert_eq!(unknown.status, 404);
    assert!(
        unknown.text().contains("no delta from"),
        "{}",
        unknown.text()
    );
    assert!(
        unknown.text().contains("download the bundle"),
        "{}",
        unknown.text()
    );
    let served = get_delta(&server, &new_sha, &[]);
    assert_eq!(served.status, 404);
    assert!(
        served.text().contains("already the served bundle"),
        "{}",
        served.text()
    );
    for bad in ["abc", &"zz".repeat(32), &format!("{old_sha}0"), ""] {
        let answer = get_delta(&server, bad, &[]);
        assert_eq!(answer.status, 400, "from={bad}: {}", answer.text());
        assert!(answer.text().contains("sha256"), "{}", answer.text());
    }
    let no_from = http(
        server.port,
        "GET",
        "/agentupdate/delta?platform=x86_64-unknown-linux-gnu",
        &[],
    )
    .unwrap();
    assert_eq!(no_from.status, 400);
    let elsewhere = http(
        server.port,
        "GET",
        &format!("/agentupdate/delta?from={old_sha}&platform=aarch64-unknown-linux-gnu"),
        &[],
    )
    .unwrap();
    assert_eq!(elsewhere.status, 404, "no bundle for that platform");

    // Bytes on the wire, counted apart from bundles.
    let sent = metric(&server, "agentupdate_bytes_sent_total{kind=\"delta\"}");
    let expected = (2 * delta.len() + delta.len() - 10) as f64;
    assert!(
        sent >= expected,
        "{sent} delta bytes counted, {expected} sent"
    );
    assert!(metric(&server, "agentupdate_delta_requests_total{answer=\"200\"}") >= 2.0);
    assert!(metric(&server, "agentupdate_delta_requests_total{answer=\"206\"}") >= 1.0);
    assert!(metric(&server, "agentupdate_delta_requests_total{answer=\"404\"}") >= 3.0);
    assert!(metric(&server, "agentupdate_delta_requests_total{answer=\"400\"}") >= 5.0);
    assert_eq!(
        metric(&server, "agentupdate_deltas_made_total{outcome=\"ready\"}"),
        1.0
    );
    assert_eq!(
        metric(&server, "agentupdate_bytes_sent_total{kind=\"bundle\"}"),
        0.0,
        "no bundle was downloaded"
    );

    // The base and the delta are on disk: a restarted server sends the same delta
    // without making it again.
    e2e::signal(server.pid, "TERM");
    wait_until(Duration::from_secs(20), "the server to stop", || {
        e2e::pid_gone(server.pid)
    });
    let again = ctx.server_on("home", server.port, &[]);
    again.wait_serving(&new_sha);
    let answer = wait_delta(&again, &old_sha);
    assert_eq!(answer.body, delta);
    assert_eq!(
        metric(&again, "agentupdate_deltas_made_total{outcome=\"ready\"}"),
        0.0,
        "taken from disk, not made again"
    );
}

#[test]
fn delta_downloads_share_the_download_limit() {
    let ctx = TestContext::new();
    // Large enough that a download not read holds its slot.
    let (old, new) = two_releases(&ctx, 16 << 20);
    let server = ctx.server(
        "home",
        &[
            ("UPDATE_SERVER_DOWNLOADS_LIMIT", "1"),
            ("UPDATE_SERVER_DOWNLOADS_RETRY_AFTER", "7"),
            ("UPDATE_SERVER_ADMIN_TOKEN", "s3cret"),
        ],
    );
    ctx.publish_served(&server, &old);
    let old_sha = sha256_file(&old);
    ctx.republish(&server, &new);
    let delta = wait_delta(&server, &old_sha).body;

    let busy_before = metric(&server, "agentupdate_delta_requests_total{answer=\"503\"}");
    let (head, held) = http_open(server.port, "/agentupdate/download").unwrap();
    assert_eq!(head.status, 200);
    let busy = get_delta(&server, &old_sha, &[]);
    assert_eq!(busy.status, 503, "{}", busy.text());
    assert_eq!(
        busy.header("Retry-After"),
        Some("7"),
        "downloads.retry-after"
    );
    drop(held);
    wait_until(Duration::from_secs(10), "the held download's slot", || {
        metric(&server, "agentupdate_downloads_in_flight") == 0.0
    });
    let (head, held) = http_open(server.port, &delta_path(&old_sha)).unwrap();
    assert_eq!(head.status, 200);
    drop(held);

    let set = |body: &str| {
        e2e::http_with_body(
            server.port,
            "PUT",
            "/admin/settings",
            &[
                ("Authorization", "Bearer s3cret"),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
        .unwrap()
        .status
    };
    assert_eq!(set(r#"{"downloads_limit": 0}"#), 200);
    let off = get_delta(&server, &old_sha, &[]);
    assert_eq!(off.status, 403, "{}", off.text());
    assert_eq!(set(r#"{"downloads_limit": 5, "auto_update": false}"#), 200);
    assert_eq!(get_delta(&server, &old_sha, &[]).status, 403);
    assert_eq!(set(r#"{"auto_update": true}"#), 200);
    let answer = get_delta(&server, &old_sha, &[]);
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, delta);
    assert_eq!(
        metric(&server, "agentupdate_delta_requests_total{answer=\"503\"}"),
        busy_before + 1.0
    );
    assert_eq!(
        metric(&server, "agentupdate_delta_requests_total{answer=\"403\"}"),
        2.0
    );
}

#[test]
fn fleet_sim_agents_take_deltas_and_count_their_bytes() {
    let ctx = TestContext::new();
    let (old, new) = two_releases(&ctx, 0);
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", "t"),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "100%"),
        ],
    );
    ctx.publish_served(&server, &old);
    let summary = ctx.path("sim.json");
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url(""), "--agents", "10"])
        .args(["--heartbeat", "300ms", "--ramp", "500ms"])
        .args(["--install-time", "100ms", "--deltas"])
        .args(["--until-rollout-end", "--token", "t", "--duration", "120s"])
        .arg("--json")
        .arg(&summary)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let pid = ctx.spawn(sim);
    // Each simulated agent reads the sha256 of the bundle it starts on, then registers.
    wait_until(
        Duration::from_secs(30),
        "the simulated agents to register",
        || e2e::admin_agents(server.port, "t").len() == 10,
    );
    ctx.republish(&server, &new);
    wait_until(Duration::from_secs(120), "fleet-sim to finish", || {
        e2e::pid_gone(pid)
    });
    let report: serde_json::Value = serde_json::from_str(&e2e::read_file(&summary)).unwrap();
    assert_eq!(report["rollout"]["state"], "completed", "{report}");
    assert_eq!(report["versions"]["1.0.1+2"], 10, "{report}");
    assert_eq!(report["deltas_taken"], 10, "{report}");
    assert_eq!(report["delta_fallbacks"], 0, "{report}");
    assert_eq!(report["bundle_bytes"], 0, "{report}");
    let delta_bytes = report["delta_bytes"].as_u64().unwrap();
    assert!(delta_bytes > 0, "{report}");
    assert!(
        delta_bytes * 100 < 10 * fs::metadata(&new).unwrap().len(),
        "{report}"
    );
    assert_eq!(
        metric(&server, "agentupdate_bytes_sent_total{kind=\"delta\"}"),
        delta_bytes as f64,
        "what the server sent is what the agents counted"
    );
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
}
