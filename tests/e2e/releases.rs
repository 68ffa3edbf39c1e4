//! Releases as objects (issue 43): `update-server release publish` checks every file
//! before any agent can see it, a fleet on PostgreSQL serves a release published to one
//! server on every server, a release copied in by hand is taken whole, and `release
//! rollback` brings real agents back to the version they kept without a byte of bundle.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::{
    Postgres, ServerProc, TOKEN, TestContext, admin_agents, configure_agent, metric, property,
    read_file, run_fails, run_ok, sha256_file, stdout, wait_until,
};
use serde_json::Value;

const GNU: &str = "x86_64-unknown-linux-gnu";
const MUSL: &str = "x86_64-unknown-linux-musl";
const LONG: Duration = Duration::from_secs(180);

/// A server that trusts `public` (bundle.public-key), with the admin token.
fn server(ctx: &TestContext, home: &str, public: &Path, extra: &[(&str, &str)]) -> ServerProc {
    let public = public.display().to_string();
    let mut env = vec![
        ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
        ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", public.as_str()),
    ];
    env.extend_from_slice(extra);
    ctx.server(home, &env)
}

/// Copies `bundle` and its signature into `dir` under `name` (and `name.minisig`).
fn place(bundle: &Path, dir: &Path, name: &str) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let target = dir.join(name);
    fs::copy(bundle, &target).unwrap();
    fs::copy(
        format!("{}.minisig", bundle.display()),
        dir.join(format!("{name}.minisig")),
    )
    .unwrap();
    target
}

#[test]
fn a_publish_checks_every_file_and_a_refusal_changes_nothing() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let (stranger, _) = ctx.keygen("stranger");
    let dist = ctx.dist("d");
    let b1 = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let server = server(&ctx, "srv", &public, &[]);

    let said = stdout(&run_ok(
        e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")),
    ));
    assert!(said.contains("published release 1.0.0+1"), "{said}");
    // Served at once: the publish answers once the release is taken.
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b1).as_str())
    );
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["id"], "1.0.0+1", "{list}");
    assert_eq!(list["current"]["published_by"], "admin.token", "{list}");
    assert_eq!(list["serving"]["source"], "published", "{list}");

    // Each bad release is refused, naming its file and the reason.
    let untrusted = ctx.pack(&dist, "2.0.0", "2", &stranger, "untrusted");
    let mixed = ctx.path("mixed");
    place(
        &ctx.pack(&dist, "2.0.0", "2", &key, "m2"),
        &mixed,
        "agent-bundle-2.0.0",
    );
    place(
        &ctx.pack_with(&dist, "2.1.0", "3", &key, "m3", &["--platform", MUSL]),
        &mixed,
        &format!("agent-bundle-2.1.0-{MUSL}"),
    );
    let unsigned = ctx.path("unsigned");
    fs::create_dir_all(&unsigned).unwrap();
    fs::copy(
        ctx.pack(&dist, "2.0.0", "2", &key, "u"),
        unsigned.join("agent-bundle-2.0.0"),
    )
    .unwrap();
    let truncated = ctx.path("truncated");
    let cut = place(
        &ctx.pack(&dist, "2.0.0", "2", &key, "t"),
        &truncated,
        "agent-bundle-2.0.0",
    );
    let len = fs::metadata(&cut).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let wrong_name = ctx.path("wrong-name");
    place(
        &ctx.pack_with(&dist, "2.0.0", "2", &key, "w", &["--platform", MUSL]),
        &wrong_name,
        &format!("agent-bundle-2.0.0-{GNU}"),
    );

    let cases: [(&Path, &[&str]); 5] = [
        (
            untrusted.parent().unwrap(),
            &["agent-bundle-2.0.0", "does not verify"],
        ),
        (&mixed, &["agent-bundle-2.1.0", "one version and build"]),
        (
            &unsigned,
            &["agent-bundle-2.0.0", "no signature", "agent-bundle sign"],
        ),
        (&truncated, &["agent-bundle-2.0.0", "does not verify"]),
        (&wrong_name, &["agent-bundle-2.0.0", "name it"]),
    ];
    for (dir, words) in cases {
        let text = run_fails(
            e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(dir),
            1,
        );
        for word in words {
            assert!(
                text.contains(word),
                "{} refused without {word:?}:\n{text}",
                dir.display()
            );
        }
        assert!(text.contains("nothing changed"), "{text}");
        assert_eq!(
            e2e::served_sha256(&server).as_deref(),
            Some(sha256_file(&b1).as_str())
        );
        let list = e2e::admin_releases(&server, TOKEN);
        assert_eq!(list["releases"].as_array().unwrap().len(), 1, "{list}");
    }
    // A name that tries to climb out of the upload never lands anywhere.
    let (status, _) = e2e::admin_call(
        &server,
        TOKEN,
        "GET",
        "/admin/releases/1.0.0+1/files/..%2F..%2Ffleet.db",
        "",
    );
    assert_eq!(status, 404);
    let audit = stdout(&run_ok(
        ctx.cmd("update-server")
            .args(["audit", "--action", "release", "--token", TOKEN, "--server"])
            .arg(server.url("")),
    ));
    assert!(audit.matches("refused").count() >= 5, "{audit}");

    // The same build number with other bytes is another build: refused.
    let again = ctx.dist("d-again");
    fs::write(again.join("README.txt"), "Built again, differently.\n").unwrap();
    let rebuilt = ctx.pack(&again, "1.0.0", "1", &key, "rebuilt");
    assert_ne!(sha256_file(&rebuilt), sha256_file(&b1));
    let text = run_fails(
        e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(&rebuilt),
        1,
    );
    assert!(text.contains("other bytes"), "{text}");
}

#[test]
fn a_server_that_trusts_no_key_says_how_to_publish() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    let text = run_fails(
        e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")),
        1,
    );
    assert!(text.contains("releases.trusted-keys"), "{text}");
    assert!(e2e::served_sha256(&server).is_none());
}

#[test]
fn a_release_copied_in_file_by_file_is_never_served_half() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let dist = ctx.dist("d");
    let server = server(&ctx, "srv", &public, &[]);
    let old = ctx.path("old");
    place(
        &ctx.pack(&dist, "1.0.0", "1", &key, "o1"),
        &old,
        &format!("agent-bundle-1.0.0-{GNU}"),
    );
    place(
        &ctx.pack_with(&dist, "1.0.0", "1", &key, "o2", &["--platform", MUSL]),
        &old,
        &format!("agent-bundle-1.0.0-{MUSL}"),
    );
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(&old));
    let new = ctx.path("new");
    place(
        &ctx.pack(&dist, "2.0.0", "2", &key, "n1"),
        &new,
        &format!("agent-bundle-2.0.0-{GNU}"),
    );
    place(
        &ctx.pack_with(&dist, "2.0.0", "2", &key, "n2", &["--platform", MUSL]),
        &new,
        &format!("agent-bundle-2.0.0-{MUSL}"),
    );

    // Watch every answer while an operator swaps the files by hand, slowly.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stop = std::sync::Arc::clone(&stop);
        let port = server.port;
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(a) = e2e::http(port, "GET", "/agentupdate/version", &[]) {
                    let text = a.text();
                    seen.push((
                        a.status,
                        property(&text, "agent.latest.version").unwrap_or_default(),
                        property(&text, "agent.latest.platforms").unwrap_or_default(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        })
    };
    server.clear_bundles();
    let mut names: Vec<String> = fs::read_dir(&new)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        // Signatures first, then their bundle, 300 ms apart: a slow hand.
        std::thread::sleep(Duration::from_millis(300));
        fs::copy(new.join(&name), server.download_dir().join(&name)).unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "the new release to be served",
        || {
            e2e::http(server.port, "GET", "/agentupdate/version", &[]).is_ok_and(|a| {
                property(&a.text(), "agent.latest.version").as_deref() == Some("2.0.0")
            })
        },
    );
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher.join().unwrap();
    let both = format!("{GNU},{MUSL}");
    for (status, version, platforms) in &seen {
        assert_eq!(
            *status, 200,
            "an answer while the files were copied: {seen:?}"
        );
        assert_eq!(platforms, &both, "{version} was served half: {seen:?}");
    }
    assert!(seen.iter().any(|(_, v, _)| v == "1.0.0") && seen.iter().any(|(_, v, _)| v == "2.0.0"));
}

#[test]
fn a_release_published_to_one_server_of_a_postgres_fleet_is_served_by_both() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b1");
    let url = pg.url();
    let a = server(
        &ctx,
        "srv-a",
        &public,
        &[
            ("UPDATE_SERVER_DATABASE_URL", &url),
            ("UPDATE_SERVER_SERVER_NAME", "a"),
        ],
    );
    let b = server(
        &ctx,
        "srv-b",
        &public,
        &[
            ("UPDATE_SERVER_DATABASE_URL", &url),
            ("UPDATE_SERVER_SERVER_NAME", "b"),
        ],
    );

    let started = Instant::now();
    run_ok(e2e::release_cmd(&ctx, &a, TOKEN, &["publish"]).arg(&b1));
    let sha = sha256_file(&b1);
    assert_eq!(e2e::served_sha256(&a).as_deref(), Some(sha.as_str()));
    wait_until(
        Duration::from_secs(10),
        "server b to serve the release",
        || e2e::served_sha256(&b).as_deref() == Some(sha.as_str()),
    );
    eprintln!(
        "published to a, served by b {:.2}s after the publish began",
        started.elapsed().as_secs_f64()
    );
    // b had never seen the files: it took them from the fleet database.
    assert_eq!(
        sha256_file(&b.download_dir().join("agent-bundle-1.0.0")),
        sha
    );
    assert_eq!(e2e::admin_releases(&b, TOKEN)["current"]["id"], "1.0.0+1");

    // Exported from b, the release publishes on an isolated server.
    let out = ctx.path("export");
    run_ok(e2e::release_cmd(&ctx, &b, TOKEN, &["export", "--out"]).arg(&out));
    assert_eq!(sha256_file(&out.join("agent-bundle-1.0.0")), sha);
    let isolated = server(&ctx, "srv-isolated", &public, &[]);
    run_ok(e2e::release_cmd(&ctx, &isolated, TOKEN, &["publish"]).arg(&out));
    assert_eq!(e2e::served_sha256(&isolated).as_deref(), Some(sha.as_str()));

    // A bad release sent to b changes nothing on either server.
    let (stranger, _) = ctx.keygen("stranger");
    let bad = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &stranger, "bad");
    run_fails(e2e::release_cmd(&ctx, &b, TOKEN, &["publish"]).arg(&bad), 1);
    std::thread::sleep(Duration::from_millis(1500));
    for server in [&a, &b] {
        assert_eq!(e2e::served_sha256(server).as_deref(), Some(sha.as_str()));
    }
}

#[test]
fn a_release_rollback_brings_agents_back_from_their_kept_version() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let d2 = ctx.dist("d2");
    fs::write(d2.join("README.txt"), "The second release.\n").unwrap();
    ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let server = server(&ctx, "srv", &public, &[]);
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")));
    e2e::wait_rollout(&server, TOKEN, LONG, "1.0.0 to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    let homes: Vec<PathBuf> = (0..2)
        .map(|i| {
            let home = ctx.install(&b1, &format!("fleet/{i}"));
            configure_agent(&home, &[server.url("")], "");
            fs::write(
                home.join("conf/agent-env.sh"),
                crate::rollout::FLEET_AGENT_ENV,
            )
            .unwrap();
            home
        })
        .collect();
    e2e::start_wrappers(&homes);
    wait_until(LONG, "both agents to register", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .filter(|a| a["version"] == "1.0.0+1")
            .count()
            == 2
    });
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b2")));
    e2e::wait_rollout(&server, TOKEN, LONG, "2.0.0 to complete", |r| {
        r["version"] == "2.0.0+2" && r["state"] == "completed"
    });
    // One machine no longer keeps 1.0.0 (its disk was cleaned): it must download it.
    fs::remove_file(homes[1].join("versions/1.0.0+1/bundle")).unwrap();

    // The old signatures are refused, with the command that makes new ones.
    let text = run_fails(
        e2e::release_cmd(
            &ctx,
            &server,
            TOKEN,
            &["rollback", "--to", "1.0.0+1", "--signatures"],
        )
        .arg(ctx.path("b1")),
        1,
    );
    assert!(text.contains("agent-bundle sign"), "{text}");
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["id"], "2.0.0+2", "nothing changed: {list}");

    // The kept release, exported and signed again today.
    let again = e2e::export_kept(&ctx, &server, TOKEN, "1.0.0+1", &ctx.path("again"));
    assert_eq!(
        sha256_file(&again.join("agent-bundle-1.0.0")),
        sha256_file(&b1)
    );
    e2e::sign_again(&ctx, &key, &again);
    let sent = |kind: &str| {
        metric(
            &server,
            &format!("agentupdate_bytes_sent_total{{kind=\"{kind}\"}}"),
        )
    };
    let (bundle_bytes, delta_bytes) = (sent("bundle"), sent("delta"));
    let started = Instant::now();
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
    // An operator's rollback is meant: it does not wait for `rollout resume`.
    e2e::wait_rollout(&server, TOKEN, LONG, "the rollback to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    eprintln!(
        "release rollback of 2 agents: {:.1}s from the command to completed",
        started.elapsed().as_secs_f64()
    );
    let kept_log = read_file(&homes[0].join("logs/agent.log"));
    assert!(kept_log.contains("without a download"), "{kept_log}");
    let bundle = fs::metadata(&b1).unwrap().len() as f64;
    let downloaded = sent("bundle") - bundle_bytes + sent("delta") - delta_bytes;
    assert!(
        downloaded > 0.0 && downloaded <= bundle * 1.01,
        "only the agent that lost its kept bundle fetches bytes, once: {downloaded} bytes of a {bundle}-byte bundle"
    );
    let lost_log = read_file(&homes[1].join("logs/agent.log"));
    assert!(
        !lost_log.contains("1.0.0+1 without a download"),
        "{lost_log}"
    );
    let list = e2e::admin_releases(&server, TOKEN);
    assert_eq!(list["current"]["id"], "1.0.0+1", "{list}");
    assert_eq!(list["current"]["kind"], "rollback", "{list}");
    assert_eq!(list["releases"].as_array().unwrap().len(), 3, "{list}");
    let shown = stdout(&run_ok(&mut e2e::release_cmd(
        &ctx,
        &server,
        TOKEN,
        &["list"],
    )));
    assert!(
        shown.contains("* 1.0.0+1") && shown.contains("rollback"),
        "{shown}"
    );
}

/// Issue 59: after a rollback to the version an agent runs, it was still listed
/// `RETRYING … the machine is at fault` (for the release it had refused) for minutes. An
/// agent on the fleet's target is retrying nothing.
#[test]
fn a_rollback_to_the_version_an_agent_runs_ends_its_retrying() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let server = server(&ctx, "srv", &public, &[]);
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")));
    let secret = "9a".repeat(32);
    let auth = format!("Bearer {secret}");
    let call = |path: &str, body: Value| {
        let answer = e2e::http_with_body(
            server.port,
            "POST",
            path,
            &[
                ("Content-Type", "application/json"),
                ("Agent-Version", "1.0.0+1"),
                ("Authorization", &auth),
            ],
            body.to_string().as_bytes(),
        )
        .unwrap();
        answer.status
    };
    let hello = serde_json::json!({ "id": "stuck-1", "name": "stuck", "platform": e2e_platform() });
    assert_eq!(call("/agent/register", hello.clone()), 200);
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b2")));
    e2e::wait_rollout(&server, TOKEN, LONG, "2.0.0 to run", |r| {
        r["version"] == "2.0.0+2"
    });
    // Told, and the machine's disk is full: it retries.
    assert_eq!(call("/agent/connect", hello.clone()), 409);
    let retrying = serde_json::json!({
        "id": "stuck-1", "from": "1.0.0+1", "to": "2.0.0+2", "status": "RETRYING",
        "error": "not enough disk space in /opt/agent/data/update: need 400 bytes, 12 free; free some space",
    });
    assert_eq!(call("/agentupdate/report", retrying), 200);
    let status = || {
        admin_agents(server.port, TOKEN)
            .into_iter()
            .find(|a| a["id"] == "stuck-1")
            .map(|a| a["update_status"].clone())
    };
    wait_until(LONG, "the agent to be listed RETRYING", || {
        status() == Some(Value::from("RETRYING"))
    });

    // Back to 1.0.0, which it runs.
    let again = ctx.path("again");
    run_ok(
        e2e::release_cmd(
            &ctx,
            &server,
            TOKEN,
            &["export", "--release", "1.0.0+1", "--out"],
        )
        .arg(&again),
    );
    run_ok(
        ctx.cmd("agent-bundle")
            .args(["sign", "--key"])
            .arg(&key)
            .arg(again.join("agent-bundle-1.0.0")),
    );
    run_ok(
        e2e::release_cmd(
            &ctx,
            &server,
            TOKEN,
            &["rollback", "--to", "1.0.0+1", "--signatures"],
        )
        .arg(&again),
    );
    e2e::wait_rollout(&server, TOKEN, LONG, "the rollback to run", |r| {
        r["version"] == "1.0.0+1"
    });
    assert_eq!(call("/agent/connect", hello), 200);
    wait_until(LONG, "its RETRYING to end", || {
        status() != Some(Value::from("RETRYING"))
    });
    drop(b1);
}

fn e2e_platform() -> &'static str {
    agent_protocol::layout::PLATFORM
}
