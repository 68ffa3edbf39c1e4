//! Updates through deltas, end to end: a real server makes the delta from the bundle the
//! agent was installed from, a real agent rebuilds the new bundle from it, and a proxy
//! between them counts (or damages) what crosses the wire.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::proxy::Proxy;
use e2e::{
    ServerProc, TOKEN, TestContext, in_target_dir, read_file, run_ok, sha256_file, wait_log,
    wait_until,
};

use crate::update::{
    NEW, OLD, QUICK, WAIT, agent_record, current, operator_conf, start, wait_running,
    wait_server_status,
};

/// A program of this size rides in the distribution (incompressible, like a real binary).
const PROGRAM: usize = 20 << 20;

struct Release {
    ctx: TestContext,
    home: PathBuf,
    b1: PathBuf,
    b2: PathBuf,
    dist2: PathBuf,
}

/// Agent 1.0.0 installed from `b1`; `b2` is 2.0.0, made from a copy of 1.0.0's
/// distribution that `change` edits.
fn release(program: bool, change: impl FnOnce(&Path)) -> Release {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let d1 = ctx.dist("d1");
    fs::create_dir_all(d1.join("share")).unwrap();
    fs::write(d1.join("share/motd.txt"), "release one\n").unwrap();
    if program {
        e2e::pad_dist(&d1, PROGRAM);
        fs::rename(d1.join("lib/payload.bin"), d1.join("bin/program")).unwrap();
    }
    let d2 = ctx.path("d2");
    run_ok(Command::new("cp").arg("-a").arg(&d1).arg(&d2));
    change(&d2);
    let b1 = ctx.pack(&d1, "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let home = ctx.install(&b1, "p");
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    Release {
        ctx,
        home,
        b1,
        b2,
        dist2: d2,
    }
}

/// The server serves 1.0.0 and the agent runs it, talking through `proxy`; then 2.0.0 is
/// released. Returns the bytes the server sent through the proxy during the update.
fn update_through(r: &Release, server: &ServerProc, proxy: &Proxy) -> u64 {
    r.ctx.publish_served(server, &r.b1);
    operator_conf(&r.home, &proxy.url());
    start(&r.home);
    wait_until(WAIT, "the agent to register on 1.0.0", || {
        agent_record(server).is_some_and(|a| a["version"] == OLD)
    });
    let before = proxy.bytes_down();
    r.ctx.republish(server, &r.b2);
    wait_server_status(server, NEW, "INSTALLED", &r.home);
    wait_running(&r.home, NEW);
    proxy.bytes_down() - before
}

fn server(ctx: &TestContext) -> ServerProc {
    ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)])
}

fn size(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

fn assert_installed_is(r: &Release, files: &[&str]) {
    assert_eq!(current(&r.home), format!("versions/{NEW}"));
    for file in files {
        assert_eq!(
            sha256_file(&r.home.join("current").join(file)),
            sha256_file(&r.dist2.join(file)),
            "current/{file} is not the release's own"
        );
    }
    // The rebuilt bundle is kept with its version: the next update's base.
    assert_eq!(
        sha256_file(&r.home.join(format!("versions/{NEW}/bundle"))),
        sha256_file(&r.b2)
    );
}

#[test]
fn delta_of_a_one_file_release_crosses_the_wire_in_under_one_percent_of_the_bundle() {
    let r = release(true, |d2| {
        fs::write(d2.join("share/motd.txt"), "release two\n").unwrap();
    });
    assert_eq!(
        sha256_file(&r.home.join(format!("versions/{OLD}/bundle"))),
        sha256_file(&r.b1),
        "--install keeps the bundle it installed from"
    );
    let server = server(&r.ctx);
    let proxy = Proxy::start(server.port);
    let sent = update_through(&r, &server, &proxy);

    let bundle = size(&r.b2);
    eprintln!("one file changed: {sent} bytes on the wire for a {bundle}-byte bundle");
    assert!(bundle > PROGRAM as u64);
    assert!(
        sent * 100 < bundle,
        "{sent} bytes crossed the wire for a {bundle}-byte bundle\n--- agent.log:\n{}",
        read_file(&r.home.join("logs/agent.log"))
    );
    let log = wait_log(&r.home, "agent.log", "from a delta of", WAIT);
    assert!(!log.contains("no delta:"), "{log}");
    assert_installed_is(&r, &["share/motd.txt", "bin/program", "bin/agent"]);
}

#[test]
fn delta_of_a_rebuilt_agent_is_under_five_percent_and_installs_that_build() {
    let rebuilt = in_target_dir("rebuilt/agent");
    assert!(
        rebuilt.is_file(),
        "{} is missing: scripts/test.sh builds it (AGENT_BUILD_NOTE=rebuilt cargo build -p agent)",
        rebuilt.display()
    );
    let r = release(false, |d2| {
        fs::copy(&rebuilt, d2.join("bin/agent")).unwrap();
    });
    assert_ne!(
        sha256_file(&r.home.join("current/bin/agent")),
        sha256_file(&rebuilt),
        "the second build must differ from the first"
    );
    let server = server(&r.ctx);
    let proxy = Proxy::start(server.port);
    let sent = update_through(&r, &server, &proxy);

    let bundle = size(&r.b2);
    eprintln!("agent rebuilt: {sent} bytes on the wire for a {bundle}-byte bundle");
    assert!(
        sent * 20 < bundle,
        "{sent} bytes crossed the wire for a {bundle}-byte bundle (target/rebuilt/agent must be \
         built from this very tree, as scripts/test.sh does)\n--- agent.log:\n{}",
        read_file(&r.home.join("logs/agent.log"))
    );
    wait_log(&r.home, "agent.log", "from a delta of", WAIT);
    assert_installed_is(&r, &["bin/agent"]);
    let out = run_ok(Command::new(r.home.join("current/bin/agent")).arg("--version"));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(", rebuilt)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn delta_damaged_in_flight_falls_back_to_the_whole_bundle_and_says_why() {
    let r = release(false, |d2| {
        fs::write(d2.join("share/motd.txt"), "release two\n").unwrap();
    });
    let server = server(&r.ctx);
    // 90 bytes after the magic: the length of the delta's first operation (the header
    // is 81 bytes, then the operation's tag and its offset), so the damage always counts.
    let proxy = Proxy::flipping_a_delta(server.port, 90);
    let sent = update_through(&r, &server, &proxy);

    assert!(proxy.flipped(), "no delta passed through the proxy");
    assert!(
        sent > size(&r.b2),
        "only {sent} bytes came: the whole bundle was not downloaded"
    );
    let log = read_file(&r.home.join("logs/agent.log"));
    assert!(
        log.contains("no delta: unusable delta")
            || log.contains("no delta: the bundle rebuilt from the delta has"),
        "the log does not say why the delta was not used:\n{log}"
    );
    assert!(!log.contains("from a delta of"), "{log}");
    assert_installed_is(&r, &["share/motd.txt", "bin/agent"]);
}

#[test]
fn delta_cut_in_flight_resumes_where_it_stopped_instead_of_the_whole_bundle() {
    let r = release(true, |d2| {
        fs::write(d2.join("share/motd.txt"), "release two\n").unwrap();
    });
    let server = server(&r.ctx);
    // Past the header and into the operations: the agent has part of the delta.
    let proxy = Proxy::cutting_a_delta(server.port, 120);
    let sent = update_through(&r, &server, &proxy);

    assert!(proxy.flipped(), "no delta passed through the proxy");
    let bundle = size(&r.b2);
    let log = read_file(&r.home.join("logs/agent.log"));
    assert!(
        log.contains("the delta was cut") && log.contains("asking for the rest (Range: bytes="),
        "the agent did not resume the delta:\n{log}"
    );
    assert!(
        sent * 100 < bundle,
        "{sent} bytes crossed the wire for a {bundle}-byte bundle: the whole bundle came\n{log}"
    );
    assert!(!log.contains("no delta:"), "{log}");
    wait_log(&r.home, "agent.log", "from a delta of", WAIT);
    assert_installed_is(&r, &["share/motd.txt", "bin/program"]);
    // The server answered the rest as a range.
    assert!(
        e2e::metric(&server, "agentupdate_delta_requests_total{answer=\"206\"}") >= 1.0,
        "the server answered no delta request with 206"
    );
}

#[test]
fn delta_from_a_bundle_the_server_never_served_is_a_whole_download() {
    let r = release(false, |d2| {
        fs::write(d2.join("share/motd.txt"), "release two\n").unwrap();
    });
    let server = server(&r.ctx);
    let proxy = Proxy::start(server.port);
    // 2.0.0 only: 1.0.0's bundle was never served, so no delta can start from it.
    r.ctx.publish_served(&server, &r.b2);
    operator_conf(&r.home, &proxy.url());
    start(&r.home);
    wait_server_status(&server, NEW, "INSTALLED", &r.home);
    assert!(proxy.bytes_down() > size(&r.b2));
    let log = read_file(&r.home.join("logs/agent.log"));
    assert!(
        log.contains("no delta: the server has no delta for this agent (404: this server has no delta from bundle"),
        "{log}"
    );
    assert_installed_is(&r, &["share/motd.txt"]);
}
