//! The audit log kept for `audit.keep` (what is older deleted, the deletion recorded)
//! and exported: `update-server audit export` streams a time range as JSON lines or CSV.

use std::time::Duration;

use e2e::{TOKEN, TestContext, admin_call, run, run_ok, stdout, wait_until};
use serde_json::Value;

fn export(ctx: &TestContext, port: u16, args: &[&str]) -> String {
    let out = run_ok(
        ctx.cmd("update-server")
            .args(["audit", "export"])
            .args(args)
            .args(["--server", &format!("127.0.0.1:{port}"), "--token", TOKEN]),
    );
    stdout(&out)
}

#[test]
fn the_audit_log_is_exported_as_json_lines_and_csv_a_page_at_a_time() {
    let ctx = TestContext::new();
    let s = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    for name in ["ann", "bob", "cyd"] {
        let body = format!(r#"{{"name":"{name}","role":"viewer"}}"#);
        let (status, answer) = admin_call(&s, TOKEN, "POST", "/admin/tokens", body);
        assert_eq!(status, 201, "{answer}");
    }
    // Over a thousand refused calls (recorded): an export of several pages.
    for _ in 0..1100 {
        let (status, _) = admin_call(&s, "wrong", "DELETE", "/admin/tokens/ann", "");
        assert_eq!(status, 401);
    }
    let jsonl = export(&ctx, s.port, &["--format", "jsonl"]);
    let entries: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(entries.len() >= 1103, "{}", entries.len());
    let ids: Vec<i64> = entries.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "oldest first, each once"
    );
    let created: Vec<&str> = entries
        .iter()
        .filter(|e| e["action"] == "token.create")
        .map(|e| e["details"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(created, ["ann", "bob", "cyd"]);
    assert!(entries[0]["time"].as_str().unwrap().ends_with('Z'));

    let csv = export(&ctx, s.port, &["--format", "csv"]);
    let mut lines = csv.split("\r\n");
    assert_eq!(
        lines.next(),
        Some("id,at,time,who,address,action,outcome,details")
    );
    // The first export is an entry now: one more row.
    assert_eq!(
        csv.matches("\r\n").count(),
        1 + entries.len() + 1,
        "{csv:.300}"
    );
    assert!(
        csv.contains(",token.create,done,\"{\"\"name\"\":\"\"ann\"\""),
        "{csv:.600}"
    );

    // A range: nothing before the server started, nothing after now.
    let none = export(
        &ctx,
        s.port,
        &["--format", "jsonl", "--until", "2000-01-01"],
    );
    assert!(none.is_empty(), "{none:.200}");
    let future = export(
        &ctx,
        s.port,
        &["--format", "jsonl", "--since", "2999-01-01T00:00:00Z"],
    );
    assert!(future.is_empty());
    let recent = export(&ctx, s.port, &["--format", "jsonl", "--since", "1h"]);
    assert!(recent.lines().count() >= entries.len());

    // A time that is none is refused with the ways to write one.
    let mut bad = ctx.cmd("update-server");
    bad.args([
        "audit",
        "export",
        "--format",
        "csv",
        "--since",
        "last tuesday",
    ])
    .args([
        "--server",
        &format!("127.0.0.1:{}", s.port),
        "--token",
        TOKEN,
    ]);
    let out = run(&mut bad);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("400") && said.contains("2025-03-01"),
        "{said}"
    );

    // Each export is itself recorded, with its range.
    let (_, log) = admin_call(&s, TOKEN, "GET", "/admin/audit?action=audit.export", "");
    assert!(log["total"].as_i64().unwrap() >= 5, "{log}");
}

#[test]
fn entries_older_than_audit_keep_are_deleted_and_the_deletion_is_recorded() {
    let ctx = TestContext::new();
    let s = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_AUDIT_KEEP", "3s"),
            ("UPDATE_SERVER_SERVER_NAME", "keeper"),
        ],
    );
    let (status, _) = admin_call(
        &s,
        TOKEN,
        "POST",
        "/admin/tokens",
        r#"{"name":"old","role":"viewer"}"#,
    );
    assert_eq!(status, 201);
    let entries = || {
        let (_, log) = admin_call(&s, TOKEN, "GET", "/admin/audit?per_page=500", "");
        log["entries"].as_array().unwrap().clone()
    };
    assert!(entries().iter().any(|e| e["action"] == "token.create"));
    let mut pruned = Value::Null;
    wait_until(
        Duration::from_secs(30),
        "the old entry deleted, and that recorded",
        || {
            let now = entries();
            let gone = !now.iter().any(|e| e["action"] == "token.create");
            if let Some(p) = now.iter().find(|e| e["action"] == "audit.prune") {
                pruned = p.clone();
            }
            gone && !pruned.is_null()
        },
    );
    assert_eq!(pruned["who"], "server:keeper", "{pruned}");
    assert_eq!(pruned["details"]["keep"], "3s", "{pruned}");
    assert!(
        pruned["details"]["deleted"].as_i64().unwrap() >= 1,
        "{pruned}"
    );
}
