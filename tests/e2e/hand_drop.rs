//! The operator's traps (issue 59, item 6): two ways to publish, and only one had a
//! history. A release dropped into the download directory by hand was served without
//! `release publish`'s checks (one without its `.minisig` was served, `/healthz` said ok
//! and a rollout started that every agent refused) and was not in the history, so
//! `release rollback` could not reach it. A hand drop is a publish now: checked the same
//! way, refused with `/healthz` degraded and nothing of it served, or recorded in the
//! history by `server`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{ServerProc, TOKEN, TestContext, run_ok, sha256_file, stdout, wait_until};

const WAIT: Duration = Duration::from_secs(60);

fn healthz(server: &ServerProc) -> String {
    e2e::http(server.port, "GET", "/healthz", &[])
        .unwrap()
        .text()
}

/// Copies `bundle` into the download directory, by hand, with its signature or without.
fn drop_by_hand(server: &ServerProc, bundle: &Path, signed: bool) {
    server.clear_bundles();
    let dir = server.download_dir();
    if signed {
        let sig = PathBuf::from(format!("{}.minisig", bundle.display()));
        fs::copy(&sig, dir.join(sig.file_name().unwrap())).unwrap();
    }
    fs::copy(bundle, dir.join(bundle.file_name().unwrap())).unwrap();
}

fn audit_of_releases(ctx: &TestContext, server: &ServerProc) -> String {
    stdout(&run_ok(
        ctx.cmd("update-server")
            .args(["audit", "--action", "release", "--token", TOKEN, "--server"])
            .arg(server.url("")),
    ))
}

#[test]
fn a_bundle_dropped_by_hand_without_its_signature_is_refused_and_nothing_of_it_is_served() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    // No key configured: the server checks a hand drop against the key it ships.
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &b1);
    e2e::wait_rollout(&server, TOKEN, WAIT, "1.0.0 to be rolled out", |r| {
        r["version"] == "1.0.0+1"
    });
    assert!(healthz(&server).starts_with("ok\n"), "{}", healthz(&server));

    drop_by_hand(&server, &b2, false);
    wait_until(WAIT, "/healthz to say the drop is refused", || {
        healthz(&server).starts_with("degraded\n")
    });
    let health = healthz(&server);
    eprintln!("/healthz with the unsigned drop:\n{health}");
    for word in [
        "bundle refused",
        "agent-bundle-2.0.0",
        "no signature",
        "agent-bundle sign",
        "still serving 1.0.0+1",
    ] {
        assert!(health.contains(word), "{word:?} not in {health}");
    }
    // Nothing of it is served, and no rollout of it starts.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(e2e::served_sha256(&server), Some(sha256_file(&b1)));
    assert_eq!(
        e2e::admin_rollout(&server, TOKEN).unwrap()["version"],
        "1.0.0+1"
    );
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["id"], "1.0.0+1", "{list}");
    assert!(
        healthz(&server).starts_with("degraded\n"),
        "said for as long as it lies there"
    );
    let log = e2e::read_file(&server.home.join("server.log"));
    assert_eq!(
        log.matches("agent-bundle-2.0.0.minisig beside it").count(),
        1,
        "logged once: {log}"
    );
    let audit = audit_of_releases(&ctx, &server);
    assert!(
        audit.contains("refused") && audit.contains("server:"),
        "{audit}"
    );

    // Its signature arrives: the same files are a publish now, by `server`.
    let sig = format!("{}.minisig", b2.display());
    fs::copy(
        &sig,
        server.download_dir().join("agent-bundle-2.0.0.minisig"),
    )
    .unwrap();
    server.wait_serving(&sha256_file(&b2));
    assert!(healthz(&server).starts_with("ok\n"), "{}", healthz(&server));
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["id"], "2.0.0+2", "{list}");
    assert_eq!(list["current"]["published_by"], "server", "{list}");
    e2e::wait_rollout(&server, TOKEN, WAIT, "2.0.0 to be rolled out", |r| {
        r["version"] == "2.0.0+2"
    });
}

#[test]
fn a_bundle_signed_by_another_key_dropped_by_hand_is_refused_where_a_key_is_set() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let (stranger, _) = ctx.keygen("stranger");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    // It ships the stranger's key (pack puts the signing key in), as a bundle made
    // elsewhere would: only the configured key tells it from the fleet's.
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &stranger, "b2");
    let public = public.display().to_string();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );
    ctx.publish_served(&server, &b1);
    drop_by_hand(&server, &b2, true);
    wait_until(WAIT, "/healthz to say the drop is refused", || {
        healthz(&server).starts_with("degraded\n")
    });
    let health = healthz(&server);
    assert!(
        health.contains("agent-bundle-2.0.0") && health.contains("does not verify"),
        "{health}"
    );
    assert_eq!(e2e::served_sha256(&server), Some(sha256_file(&b1)));
    assert_eq!(
        e2e::admin_releases(&server, TOKEN)["current"]["id"],
        "1.0.0+1"
    );
}

#[test]
fn a_signed_bundle_dropped_by_hand_is_in_the_history_and_release_rollback_reaches_it() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    // Signed a minute apart: two packs in the same second have no order to refuse by.
    let now = e2e::now_secs();
    let b1 = ctx.pack_signed_at(&ctx.dist("d1"), "1.0.0", "1", &key, "b1", now - 60);
    let d2 = ctx.dist("d2");
    fs::write(d2.join("README.txt"), "The second release.\n").unwrap();
    let b2 = ctx.pack_signed_at(&d2, "2.0.0", "2", &key, "b2", now);
    let public = public.display().to_string();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );

    // By hand: a publish like any other, by `server`.
    ctx.publish_served(&server, &b1);
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["id"], "1.0.0+1", "{list}");
    assert_eq!(list["current"]["kind"], "publish", "{list}");
    assert_eq!(list["current"]["published_by"], "server", "{list}");
    assert_eq!(list["serving"]["source"], "published", "{list}");
    let shown = stdout(&run_ok(&mut e2e::release_cmd(
        &ctx,
        &server,
        TOKEN,
        &["list"],
    )));
    assert!(
        shown.contains("* 1.0.0+1") && shown.contains("server"),
        "{shown}"
    );
    let audit = audit_of_releases(&ctx, &server);
    assert!(
        audit.contains("release.publish") && audit.contains("server:"),
        "{audit}"
    );
    e2e::wait_rollout(&server, TOKEN, WAIT, "1.0.0 to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });

    // A restart finds its own release in the directory: nothing new is recorded.
    e2e::signal(server.pid, "TERM");
    wait_until(WAIT, "the server to stop", || e2e::pid_gone(server.pid));
    let server = ctx.server_on(
        "srv",
        server.port,
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );
    assert_eq!(e2e::served_sha256(&server), Some(sha256_file(&b1)));
    assert_eq!(
        e2e::admin_releases(&server, TOKEN)["releases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(&b2));
    e2e::wait_rollout(&server, TOKEN, WAIT, "2.0.0 to complete", |r| {
        r["version"] == "2.0.0+2" && r["state"] == "completed"
    });

    // The old bundle put back by hand, with its old signature: taken, but its rollout
    // cannot start (agents would refuse the older signature), and /healthz says the way.
    drop_by_hand(&server, &b1, true);
    wait_until(WAIT, "/healthz to say the bundle is out of step", || {
        healthz(&server).contains("bundle mismatch")
    });
    let health = healthz(&server);
    eprintln!("/healthz with the old bundle put back:\n{health}");
    for word in [
        "signed before",
        "give it the fleet's bundle",
        "agent-bundle sign",
        "update-server release rollback --to 1.0.0+1",
    ] {
        assert!(health.contains(word), "{word:?} not in {health}");
    }

    // The way it names: fresh signatures over the kept bytes, then the rollback.
    let again = e2e::export_kept(&ctx, &server, TOKEN, "1.0.0+1", &ctx.path("again"));
    assert_eq!(
        sha256_file(&again.join("agent-bundle-1.0.0")),
        sha256_file(&b1)
    );
    e2e::sign_again(&ctx, &key, &again);
    let said = stdout(&run_ok(
        e2e::release_cmd(
            &ctx,
            &server,
            TOKEN,
            &["rollback", "--to", "1.0.0+1", "--signatures"],
        )
        .arg(&again),
    ));
    assert!(said.contains("1.0.0+1 is the target again"), "{said}");
    e2e::wait_rollout(&server, TOKEN, WAIT, "the rollback to 1.0.0", |r| {
        r["version"] == "1.0.0+1"
    });
    wait_until(WAIT, "the mismatch to end", || {
        !healthz(&server).contains("mismatch")
    });
    assert_eq!(e2e::served_sha256(&server), Some(sha256_file(&b1)));
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["kind"], "rollback", "{list}");
    let by: Vec<&str> = list["releases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["published_by"].as_str().unwrap())
        .collect();
    // Newest first: the rollback, the put-back, `release publish`, the first hand drop.
    assert_eq!(
        by,
        ["admin.token", "server", "admin.token", "server"],
        "{list}"
    );
}
