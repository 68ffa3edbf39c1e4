//! The fleet page's part of issue 63, in a real headless Chromium: an operator approves
//! another's waiting change with a button (and sees no Approve on their own), an admin
//! makes a token (shown once), lists tokens with their last use and revokes one, the
//! others see only their own name and role, and the audit log pages by who, what and
//! what to.

use std::time::Duration;

use e2e::webdriver::Browser;
use e2e::{ServerProc, TestContext, admin_call, wait_until};
use serde_json::json;

const ADMIN: &str = "page-governance-admin";

fn sign_in(b: &Browser, server: &ServerProc, token: &str) {
    b.goto(&server.url("/"));
    if b.try_find("form[action='/signout']").is_some() {
        b.click(&b.find("form[action='/signout'] button"));
        b.wait_for("form[action='/signin']");
    }
    let field = b.find("form[action='/signin'] input[type=password][name=token]");
    b.type_into(&field, token);
    b.click(&b.find("form[action='/signin'] button[type=submit]"));
    b.wait_for("form[action='/signout']");
}

/// A configuration push by `token`: its status and answer.
fn push(server: &ServerProc, token: &str, group: &str) -> (u16, serde_json::Value) {
    admin_call(
        server,
        token,
        "PUT",
        &format!("/admin/config/{group}"),
        json!({ "files": { "app.conf": format!("group = {group}\n") } }).to_string(),
    )
}

#[test]
fn people_approve_manage_tokens_and_filter_the_audit_log_on_the_page() {
    let ctx = TestContext::new();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", ADMIN),
            ("UPDATE_SERVER_APPROVAL_REQUIRED", "true"),
        ],
    );
    let b = Browser::start(&ctx);

    // The admin makes Bob's token on the page: shown once, listed without it.
    sign_in(&b, &server, ADMIN);
    b.goto(&server.url("/tokens"));
    b.type_into(&b.find("form[action='/tokens'] input[name=name]"), "bob");
    b.click(&b.find("form[action='/tokens'] select[name=role] option[value=operator]"));
    b.type_into(&b.find("form[action='/tokens'] input[name=expires]"), "90d");
    b.click(&b.find("form[action='/tokens'] button[type=submit]"));
    let bob = b.text(&b.wait_for("#new-token"));
    assert!(bob.len() >= 32, "{bob:?}");
    let rows = b.texts("#tokens tbody tr");
    assert!(
        rows.iter()
            .any(|r| r.contains("bob") && r.contains("operator")),
        "{rows:?}"
    );
    b.goto(&server.url("/tokens"));
    assert!(b.try_find("#new-token").is_none(), "shown once");
    assert!(!b.source().contains(&bob), "the token is never shown again");
    let (status, made) = admin_call(
        &server,
        ADMIN,
        "POST",
        "/admin/tokens",
        json!({ "name": "alice", "role": "operator" }).to_string(),
    );
    assert_eq!(status, 201, "{made}");
    let alice = made["token"].as_str().unwrap().to_owned();
    let (status, listed) = admin_call(&server, ADMIN, "GET", "/admin/tokens", "");
    assert_eq!(status, 200);
    let bob_row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bob")
        .unwrap()
        .clone();
    assert!(bob_row["expires_at"].as_i64().is_some(), "{listed}");

    // Alice's push waits; Bob, signed in with the token the page made, approves it.
    let (status, parked) = push(&server, &alice, "web");
    assert_eq!(status, 202, "{parked}");
    let id = parked["id"].as_i64().unwrap();
    sign_in(&b, &server, &bob);
    assert_eq!(
        b.text(&b.wait_for("#waiting")),
        "1",
        "the overview says one waits"
    );
    b.goto(&server.url("/rollouts"));
    let waiting = b.texts("#approvals tbody tr");
    assert!(
        waiting
            .iter()
            .any(|r| r.contains("config.push") && r.contains("alice")),
        "{waiting:?}"
    );
    b.click(&b.find(&format!("form[action='/approvals/{id}/approve'] button")));
    b.wait_url("/rollouts");
    wait_until(
        Duration::from_secs(10),
        "the approved set to be stored",
        || {
            let (_, sets) = admin_call(&server, ADMIN, "GET", "/admin/config", "");
            sets.to_string().contains("\"web\"")
        },
    );
    assert!(
        b.try_find(&format!("form[action='/approvals/{id}/approve']"))
            .is_none(),
        "decided: no longer waiting"
    );
    // Bob's own change: Withdraw, never Approve.
    let (status, own) = push(&server, &bob, "db");
    assert_eq!(status, 202, "{own}");
    let own = own["id"].as_i64().unwrap();
    b.goto(&server.url("/rollouts"));
    assert!(
        b.try_find(&format!("form[action='/approvals/{own}/approve']"))
            .is_none()
    );
    let withdraw = b.find(&format!("form[action='/approvals/{own}/reject'] button"));
    assert_eq!(b.text(&withdraw), "Withdraw");
    b.click(&withdraw);
    b.wait_url("/rollouts");
    let (_, list) = admin_call(&server, ADMIN, "GET", "/admin/approvals", "");
    let states: Vec<(i64, String)> = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_i64().unwrap(),
                a["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(states.contains(&(id, "approved".into())), "{states:?}");
    assert!(states.contains(&(own, "rejected".into())), "{states:?}");

    // An operator's tokens page: their own name and role, nobody else's tokens.
    b.goto(&server.url("/tokens"));
    let me = b.text(&b.find("#me"));
    assert!(me.contains("bob") && me.contains("operator"), "{me}");
    assert!(b.try_find("#tokens").is_none());
    assert!(b.try_find("form[action='/tokens']").is_none());
    assert!(!b.source().contains("alice"));

    // The audit log, done to group web: the request, the approval and the push, not db.
    b.goto(&server.url("/audit?target=web"));
    let lines = b.texts("table.audit tbody tr");
    for action in ["approval.request", "approval.approve", "config.push"] {
        assert!(
            lines.iter().any(|l| l.contains(action)),
            "{action} missing: {lines:?}"
        );
    }
    assert!(lines.iter().all(|l| !l.contains("group: db")), "{lines:?}");
    let pushed: Vec<&String> = lines.iter().filter(|l| l.contains("config.push")).collect();
    assert!(
        pushed
            .iter()
            .any(|l| l.contains("alice") && l.contains("bob")),
        "the applied push names both: {pushed:?}"
    );
    b.goto(&server.url("/audit?who=bob&action=approval&target=web"));
    let bobs = b.texts("table.audit tbody tr");
    assert_eq!(bobs.len(), 1, "{bobs:?}");
    assert!(bobs[0].contains("approval.approve"), "{bobs:?}");

    // The admin revokes Alice's token on the page: refused from the next request on.
    sign_in(&b, &server, ADMIN);
    b.goto(&server.url("/tokens"));
    b.click(&b.find("form[action='/tokens/alice/revoke'] button"));
    b.wait_url("/tokens");
    assert!(
        b.texts("#tokens tbody tr")
            .iter()
            .all(|r| !r.contains("alice")),
        "revoked"
    );
    let (status, _) = admin_call(&server, &alice, "GET", "/admin/approvals", "");
    assert_eq!(status, 401);
    let (_, log) = admin_call(&server, ADMIN, "GET", "/admin/audit?action=token", "");
    let via_page: Vec<&serde_json::Value> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["details"]["via"] == "page")
        .collect();
    assert!(
        via_page.iter().any(|e| e["action"] == "token.create")
            && via_page.iter().any(|e| e["action"] == "token.revoke"),
        "{log}"
    );
}
