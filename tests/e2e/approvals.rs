//! Approvals (issue 63): while the fleet requires it, a change that moves agents made by
//! one operator waits until another approves it; then it is applied as it would have
//! been (real agents move), and the audit log names both. One's own change is never
//! approved by oneself; a rejected or lapsed change is never applied; the switch is the
//! fleet's, live on every server of a PostgreSQL fleet, where a publish parked on one
//! server is approved on another, which serves the bytes the first kept.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{
    Postgres, ServerProc, TestContext, admin_agents, admin_call, configure_agent, run_fails,
    run_ok, sha256_file, stdout, wait_until,
};
use serde_json::{Value, json};

const ADMIN: &str = "approvals-admin-token";
const LONG: Duration = Duration::from_secs(180);

/// A server that trusts `public`, with the bootstrap admin token.
fn server(ctx: &TestContext, home: &str, public: &Path, extra: &[(&str, &str)]) -> ServerProc {
    let public = public.display().to_string();
    let mut env = vec![
        ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
        ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", public.as_str()),
    ];
    env.extend_from_slice(extra);
    ctx.server(home, &env)
}

/// A named token with `role`, made by the admin.
fn token(server: &ServerProc, name: &str, role: &str) -> String {
    let (status, made) = admin_call(
        server,
        ADMIN,
        "POST",
        "/admin/tokens",
        json!({ "name": name, "role": role }).to_string(),
    );
    assert_eq!(status, 201, "{made}");
    made["token"].as_str().unwrap().to_owned()
}

/// `update-server ARGS… --server URL --token TOKEN`.
fn cli(
    ctx: &TestContext,
    server: &ServerProc,
    token: &str,
    args: &[&str],
) -> std::process::Command {
    let mut cmd = ctx.cmd("update-server");
    cmd.args(args)
        .args(["--token", token, "--server"])
        .arg(server.url(""));
    cmd
}

/// The audit log's entries with `action`, newest first.
fn audited(server: &ServerProc, action: &str) -> Vec<Value> {
    let (status, log) = admin_call(
        server,
        ADMIN,
        "GET",
        &format!("/admin/audit?action={action}"),
        "",
    );
    assert_eq!(status, 200, "{log}");
    log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == action)
        .cloned()
        .collect()
}

fn approvals(server: &ServerProc) -> Value {
    let (status, list) = admin_call(server, ADMIN, "GET", "/admin/approvals", "");
    assert_eq!(status, 200, "{list}");
    list
}

#[test]
fn a_publish_waits_for_another_operator_and_then_agents_move() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let d2 = ctx.dist("d2");
    fs::write(d2.join("README.txt"), "The second release.\n").unwrap();
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let server = server(&ctx, "srv", &public, &[]);
    run_ok(cli(&ctx, &server, ADMIN, &["release", "publish"]).arg(ctx.path("b1")));
    e2e::wait_rollout(&server, ADMIN, LONG, "1.0.0 to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    let home: PathBuf = ctx.install(&b1, "fleet/0");
    configure_agent(&home, &[server.url("")], "");
    fs::write(
        home.join("conf/agent-env.sh"),
        crate::rollout::FLEET_AGENT_ENV,
    )
    .unwrap();
    e2e::start_wrappers(std::slice::from_ref(&home));
    wait_until(LONG, "the agent to register on 1.0.0", || {
        admin_agents(server.port, ADMIN)
            .iter()
            .any(|a| a["version"] == "1.0.0+1")
    });
    let alice = token(&server, "alice", "operator");
    let bob = token(&server, "bob", "operator");
    let viewer = token(&server, "vera", "viewer");
    // Someone is told when a change waits: a receiver that checks the signature.
    const SECRET: &str = "an-approvals-secret-of-32-bytes!";
    let receiver = crate::webhooks::Receiver::start(&ctx, "receiver", SECRET, 0, 0);
    let (status, hook) = admin_call(
        &server,
        ADMIN,
        "POST",
        "/admin/webhooks",
        json!({ "url": receiver.url, "events": ["approval.requested"], "secret": SECRET })
            .to_string(),
    );
    assert_eq!(status, 201, "{hook}");

    // An operator may not switch approvals; an admin does.
    run_fails(
        &mut cli(&ctx, &server, &alice, &["approval", "require", "on"]),
        1,
    );
    let said = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        ADMIN,
        &["approval", "require", "on"],
    )));
    assert!(said.contains("approval is required"), "{said}");

    // Alice's publish is checked and kept, and waits: nothing is served of it.
    let said = stdout(&run_ok(
        cli(&ctx, &server, &alice, &["release", "publish"]).arg(ctx.path("b2")),
    ));
    assert!(said.contains("waits for approval"), "{said}");
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b1).as_str()),
        "nothing changed before approval"
    );
    let list = approvals(&server);
    assert_eq!(list["required"], true, "{list}");
    let waiting = &list["approvals"][0];
    assert_eq!(waiting["state"], "awaiting-approval", "{list}");
    assert_eq!(waiting["action"], "release.publish", "{list}");
    assert_eq!(waiting["requested_by"], "alice", "{list}");
    assert_eq!(waiting["subject"]["release"], "2.0.0+2", "{list}");
    let id = waiting["id"].as_i64().unwrap();
    let asked = audited(&server, "approval.request");
    assert_eq!(asked[0]["who"], "alice", "{asked:?}");
    assert_eq!(asked[0]["details"]["approval"], id, "{asked:?}");
    wait_until(
        Duration::from_secs(30),
        "approval.requested at the receiver",
        || !receiver.delivered().is_empty(),
    );
    let told = &receiver.delivered()[0];
    assert_eq!(told["event"], "approval.requested", "{told}");
    assert_eq!(told["verified"], true, "{told}");
    assert_eq!(told["data"]["who"], "alice", "{told}");
    assert_eq!(told["data"]["details"]["approval"], id, "{told}");
    assert_eq!(
        told["data"]["details"]["action"], "release.publish",
        "{told}"
    );

    // Alice may not approve her own change, nor a viewer anyone's: refused and recorded.
    let path = format!("/admin/approvals/{id}/approve");
    let (status, answer) = admin_call(&server, &alice, "POST", &path, "");
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("another operator"),
        "{answer}"
    );
    let (status, answer) = admin_call(&server, &viewer, "POST", &path, "");
    assert_eq!(status, 403, "{answer}");
    let refused = audited(&server, "approval.approve");
    assert!(
        refused
            .iter()
            .any(|e| e["who"] == "alice" && e["outcome"] == "refused"),
        "{refused:?}"
    );
    assert_eq!(
        approvals(&server)["approvals"][0]["state"],
        "awaiting-approval"
    );

    // Bob approves: the release is published as Alice's, and the agent moves to it.
    let said = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &bob,
        &["approval", "approve", &id.to_string()],
    )));
    assert!(said.contains("approved change"), "{said}");
    assert_eq!(
        e2e::served_sha256(&server).as_deref(),
        Some(sha256_file(&b2).as_str())
    );
    let releases = e2e::admin_releases(&server, ADMIN);
    assert_eq!(releases["current"]["id"], "2.0.0+2", "{releases}");
    assert_eq!(releases["current"]["published_by"], "alice", "{releases}");
    wait_until(LONG, "the agent to move to 2.0.0", || {
        admin_agents(server.port, ADMIN)
            .iter()
            .any(|a| a["version"] == "2.0.0+2")
    });
    let published = audited(&server, "release.publish");
    assert_eq!(published[0]["who"], "alice", "{published:?}");
    assert_eq!(
        published[0]["details"]["approved_by"], "bob",
        "{published:?}"
    );
    let approved = audited(&server, "approval.approve");
    assert!(
        approved.iter().any(|e| e["who"] == "bob"
            && e["outcome"] == "done"
            && e["details"]["requested_by"] == "alice"),
        "{approved:?}"
    );
    // Decided once: a second approval finds nothing to decide.
    let (status, answer) = admin_call(&server, ADMIN, "POST", &path, "");
    assert_eq!(status, 409, "{answer}");
    let listed = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &bob,
        &["approval", "list"],
    )));
    assert!(
        listed.contains("approved") && listed.contains("alice"),
        "{listed}"
    );
}

#[test]
fn a_rejected_or_lapsed_change_is_never_applied() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    // Seeded from the file on a new fleet; a change waits 4 s at most.
    let server = server(
        &ctx,
        "srv",
        &public,
        &[
            ("UPDATE_SERVER_APPROVAL_REQUIRED", "true"),
            ("UPDATE_SERVER_APPROVAL_EXPIRES", "4s"),
        ],
    );
    let alice = token(&server, "alice", "operator");
    let bob = token(&server, "bob", "operator");
    assert_eq!(approvals(&server)["required"], true);

    // A configuration push waits; Bob rejects it with a reason: no set is stored.
    let conf = ctx.path("conf");
    fs::create_dir_all(&conf).unwrap();
    fs::write(conf.join("app.conf"), "level = debug\n").unwrap();
    let said = stdout(&run_ok(
        cli(&ctx, &server, &alice, &["config", "push", "--group", "web"]).arg(&conf),
    ));
    assert!(said.contains("waits for approval"), "{said}");
    let id = approvals(&server)["approvals"][0]["id"].as_i64().unwrap();
    // What approving it would apply is read first, in full.
    let shown = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &bob,
        &["approval", "show", &id.to_string()],
    )));
    assert!(shown.contains("--- app.conf\nlevel = debug"), "{shown}");
    run_ok(&mut cli(
        &ctx,
        &server,
        &bob,
        &[
            "approval",
            "reject",
            &id.to_string(),
            "--reason",
            "not on a Friday",
        ],
    ));
    let list = approvals(&server);
    let rejected = &list["approvals"][0];
    assert_eq!(rejected["state"], "rejected", "{list}");
    assert_eq!(rejected["decided_by"], "bob", "{list}");
    assert_eq!(rejected["reason"], "not on a Friday", "{list}");
    let (_, sets) = admin_call(&server, ADMIN, "GET", "/admin/config", "");
    assert!(
        !sets.to_string().contains("\"web\""),
        "a rejected push stored nothing: {sets}"
    );
    let (status, _) = admin_call(
        &server,
        &bob,
        "POST",
        &format!("/admin/approvals/{id}/approve"),
        "",
    );
    assert_eq!(status, 409, "a rejected change cannot be approved after");

    // A change with nothing to apply is refused at once rather than parked.
    let (status, answer) = admin_call(
        &server,
        &alice,
        "POST",
        "/admin/deployments",
        json!({ "name": "canary", "selector": "env in (prod", "release": "1.0.0+1" }).to_string(),
    );
    assert_eq!(status, 400, "{answer}");

    // A deployment for a kept release waits, and lapses: never applied.
    run_ok(&mut cli(
        &ctx,
        &server,
        ADMIN,
        &["approval", "require", "off"],
    ));
    run_ok(cli(&ctx, &server, ADMIN, &["release", "publish"]).arg(ctx.path("b1")));
    run_ok(&mut cli(
        &ctx,
        &server,
        ADMIN,
        &["approval", "require", "on"],
    ));
    let (status, parked) = admin_call(
        &server,
        &alice,
        "POST",
        "/admin/deployments",
        json!({ "name": "canary", "selector": "env=canary", "release": "1.0.0+1" }).to_string(),
    );
    assert_eq!(status, 202, "{parked}");
    assert_eq!(parked["state"], "awaiting-approval", "{parked}");
    let id = parked["id"].as_i64().unwrap();
    wait_until(
        Duration::from_secs(30),
        "the change to lapse and be recorded",
        || !audited(&server, "approval.expire").is_empty(),
    );
    let lapsed = audited(&server, "approval.expire");
    assert!(
        lapsed[0]["who"].as_str().unwrap().starts_with("server:"),
        "{lapsed:?}"
    );
    assert_eq!(lapsed[0]["details"]["requested_by"], "alice", "{lapsed:?}");
    let list = approvals(&server);
    assert_eq!(list["approvals"][0]["state"], "expired", "{list}");
    let (status, answer) = admin_call(
        &server,
        &bob,
        "POST",
        &format!("/admin/approvals/{id}/approve"),
        "",
    );
    assert_eq!(status, 409, "{answer}");
    let (status, _) = admin_call(&server, ADMIN, "GET", "/admin/deployments/canary", "");
    assert_eq!(status, 404, "a lapsed deployment was never made");
}

#[test]
fn the_switch_holds_on_every_server_of_a_postgres_fleet_at_once() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let public = public.display().to_string();
    let pg = Postgres::start();
    let url = pg.url();
    let env = |name| {
        [
            ("UPDATE_SERVER_DATABASE_URL", url.as_str()),
            ("UPDATE_SERVER_SERVER_NAME", name),
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", public.as_str()),
        ]
    };
    let a = ctx.server("srv-a", &env("a"));
    let b = ctx.server("srv-b", &env("b"));
    let alice = token(&a, "alice", "operator");
    let bob = token(&a, "bob", "operator");
    let push = |server: &ServerProc| {
        admin_call(
            server,
            &alice,
            "PUT",
            "/admin/config/web",
            json!({ "files": { "app.conf": "level = info\n" } }).to_string(),
        )
    };

    // Switched on through one server: the other parks the very next change.
    let (status, answer) = admin_call(
        &a,
        ADMIN,
        "PUT",
        "/admin/approval",
        json!({ "required": true }).to_string(),
    );
    assert_eq!(
        (status, &answer["required"]),
        (200, &json!(true)),
        "{answer}"
    );
    let (status, parked) = push(&b);
    assert_eq!(status, 202, "{parked}");
    let id = parked["id"].as_i64().unwrap();
    // Approved on the other server: applied once, for the fleet.
    let (status, answer) = admin_call(
        &a,
        &bob,
        "POST",
        &format!("/admin/approvals/{id}/approve"),
        "",
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["applied"], true, "{answer}");
    let (_, sets) = admin_call(&b, ADMIN, "GET", "/admin/config", "");
    assert!(sets.to_string().contains("\"web\""), "{sets}");
    let switched = audited(&a, "approval.require");
    assert_eq!(switched[0]["details"]["required"], true, "{switched:?}");

    // A publish parked on one server and approved on the other: the approving server
    // takes the kept bytes from the fleet database, and both serve them.
    let said = stdout(&run_ok(
        cli(&ctx, &a, &alice, &["release", "publish"]).arg(ctx.path("b1")),
    ));
    assert!(said.contains("waits for approval"), "{said}");
    assert_eq!(
        e2e::served_sha256(&b),
        None,
        "nothing served before approval"
    );
    let id = approvals(&b)["approvals"][0]["id"].as_i64().unwrap();
    let (status, answer) = admin_call(
        &b,
        &bob,
        "POST",
        &format!("/admin/approvals/{id}/approve"),
        "",
    );
    assert_eq!(status, 200, "{answer}");
    let sha = sha256_file(&b1);
    b.wait_serving(&sha);
    a.wait_serving(&sha);

    // Switched off through the other: applied at once on both.
    let (status, _) = admin_call(
        &b,
        ADMIN,
        "PUT",
        "/admin/approval",
        json!({ "required": false }).to_string(),
    );
    assert_eq!(status, 200);
    let (status, pushed) = push(&a);
    assert_eq!(status, 200, "{pushed}");
    assert!(pushed["hash"].is_string(), "{pushed}");
}

#[test]
fn a_rollback_waits_and_one_a_newer_release_overtook_is_refused_on_approval() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let now = e2e::now_secs();
    let dist = |name: &str, text: &str| {
        let d = ctx.dist(name);
        fs::write(d.join("README.txt"), text).unwrap();
        d
    };
    ctx.pack_signed_at(&dist("d1", "one\n"), "1.0.0", "1", &key, "b1", now - 100);
    ctx.pack_signed_at(&dist("d2", "two\n"), "2.0.0", "2", &key, "b2", now - 50);
    // Signed later than any signature made below: a release that overtakes them.
    ctx.pack_signed_at(&dist("d3", "three\n"), "3.0.0", "3", &key, "b3", now + 3600);
    let server = server(&ctx, "srv", &public, &[]);
    for b in ["b1", "b2"] {
        run_ok(cli(&ctx, &server, ADMIN, &["release", "publish"]).arg(ctx.path(b)));
    }
    let alice = token(&server, "alice", "operator");
    let bob = token(&server, "bob", "operator");
    run_ok(&mut cli(
        &ctx,
        &server,
        ADMIN,
        &["approval", "require", "on"],
    ));
    let rollback = |to: &str, dir: &Path| {
        let dir = dir.display().to_string();
        let said = stdout(&run_ok(&mut cli(
            &ctx,
            &server,
            &alice,
            &["release", "rollback", "--to", to, "--signatures", &dir],
        )));
        assert!(said.contains("waits for approval"), "{said}");
        approvals(&server)["approvals"][0]["id"].as_i64().unwrap()
    };

    // A rollback to 1.0.0 waits, with its fresh signatures checked; approved, it is made.
    let again = e2e::export_kept(&ctx, &server, ADMIN, "1.0.0+1", &ctx.path("again1"));
    e2e::sign_again(&ctx, &key, &again);
    let signed = e2e::now_secs();
    let id = rollback("1.0.0+1", &again);
    assert_eq!(
        e2e::admin_releases(&server, ADMIN)["current"]["id"],
        "2.0.0+2"
    );
    let (status, answer) = admin_call(
        &server,
        &bob,
        "POST",
        &format!("/admin/approvals/{id}/approve"),
        "",
    );
    assert_eq!(status, 200, "{answer}");
    let releases = e2e::admin_releases(&server, ADMIN);
    assert_eq!(releases["current"]["id"], "1.0.0+1", "{releases}");
    assert_eq!(releases["current"]["kind"], "rollback", "{releases}");
    assert_eq!(releases["current"]["published_by"], "alice", "{releases}");

    // A rollback to 2.0.0 signed later still waits; meanwhile 3.0.0 (signed later than
    // it) is published: approving the rollback would offer agents a replay. Refused.
    wait_until(Duration::from_secs(5), "the clock to pass a second", || {
        e2e::now_secs() > signed
    });
    let again = e2e::export_kept(&ctx, &server, ADMIN, "2.0.0+2", &ctx.path("again2"));
    e2e::sign_again(&ctx, &key, &again);
    let id = rollback("2.0.0+2", &again);
    run_ok(&mut cli(
        &ctx,
        &server,
        ADMIN,
        &["approval", "require", "off"],
    ));
    run_ok(cli(&ctx, &server, ADMIN, &["release", "publish"]).arg(ctx.path("b3")));
    run_ok(&mut cli(
        &ctx,
        &server,
        ADMIN,
        &["approval", "require", "on"],
    ));
    let (status, answer) = admin_call(
        &server,
        &bob,
        "POST",
        &format!("/admin/approvals/{id}/approve"),
        "",
    );
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("sign again"),
        "{answer}"
    );
    let list = approvals(&server);
    let failed = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .unwrap();
    assert_eq!(failed["state"], "failed", "{list}");
    assert_eq!(
        e2e::admin_releases(&server, ADMIN)["current"]["id"],
        "3.0.0+3",
        "nothing changed"
    );
}
