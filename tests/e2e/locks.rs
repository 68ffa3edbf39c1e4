//! Update locks (issue 42): the workload or a person holds off bundle updates on one
//! machine; the rest of the fleet updates, the locked agent is `DEFERRED` with the
//! lock's reason, and it updates within seconds of the release, of `update.max-defer`,
//! or of an operator's override.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::{TOKEN, admin_agents, admin_call, read_file, run_ok, stdout, wait_until};

use crate::rollout::{FLEET_AGENT_ENV, Fleet, LONG, NEW, OLD, fleet_with};

fn agent(home: &Path, args: &[&str]) -> String {
    stdout(&run_ok(
        Command::new(home.join("current/bin/agent")).args(args),
    ))
}

fn row(f: &Fleet, home: &Path) -> serde_json::Value {
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    admin_agents(f.server.port, TOKEN)
        .into_iter()
        .find(|a| a["id"] == id.as_str())
        .unwrap_or_default()
}

fn installed(f: &Fleet, home: &Path) -> bool {
    let r = row(f, home);
    r["version"] == NEW && r["update_status"] == "INSTALLED"
}

#[test]
fn a_lock_defers_one_agent_with_its_reason_while_the_other_updates_and_its_release_updates_it() {
    let f = fleet_with(2, &[], &[], FLEET_AGENT_ENV, |_| {});
    let (locked, free) = (&f.homes[0], &f.homes[1]);
    let said = agent(
        locked,
        &["lock", "take", "backup", "--reason", "nightly backup"],
    );
    assert!(said.contains("taken"), "{said}");
    f.ctx.republish(&f.server, &f.b2);
    wait_until(LONG, "the free agent to install 2.0.0", || {
        installed(&f, free)
    });
    wait_until(
        LONG,
        "the locked agent to be DEFERRED with its lock's reason",
        || {
            let r = row(&f, locked);
            r["update_status"] == "DEFERRED"
                && r["update_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("backup (nightly backup)"))
        },
    );
    assert_eq!(row(&f, locked)["version"], OLD);
    let status = agent(locked, &["status"]);
    assert!(
        status.contains("locks:") && status.contains("nightly backup"),
        "{status}"
    );
    // Downloaded ahead: the verified bundle waits.
    assert!(
        fs::read_dir(locked.join("data/update"))
            .map(|d| d.flatten().any(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("agent-bundle-2.0.0")))
            .unwrap_or(false),
        "nothing was downloaded ahead"
    );

    let released = Instant::now();
    agent(locked, &["lock", "release", "backup"]);
    wait_until(LONG, "the released agent to install 2.0.0", || {
        installed(&f, locked)
    });
    let took = released.elapsed();
    eprintln!(
        "installed {:.1}s after the lock's release",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn max_defer_overrides_a_lock_left_forever_and_says_which() {
    let env = format!("{FLEET_AGENT_ENV}export AGENT_UPDATE_MAX_DEFER=4s\n");
    let f = fleet_with(1, &[], &[], &env, |_| {});
    let home = &f.homes[0];
    // The workload's own lock: a file whose text is the reason, never released.
    fs::create_dir_all(home.join("run/update-locks")).unwrap();
    fs::write(home.join("run/update-locks/batch"), "payroll batch\n").unwrap();
    f.ctx.republish(&f.server, &f.b2);
    wait_until(LONG, "the agent to be DEFERRED", || {
        row(&f, home)["update_status"] == "DEFERRED"
    });
    wait_until(LONG, "max-defer to let the update through", || {
        installed(&f, home)
    });
    let log = read_file(&home.join("logs/agent.log"));
    assert!(
        log.contains("max-defer") && log.contains("despite the update locks batch (payroll batch)"),
        "{log}"
    );
}

#[test]
fn an_operator_overrides_the_locks_at_once_from_the_page_and_a_viewer_may_not() {
    let f = fleet_with(1, &[], &[], FLEET_AGENT_ENV, |_| {});
    let home = &f.homes[0];
    agent(
        home,
        &["lock", "take", "maintenance", "--reason", "disk swap"],
    );
    f.ctx.republish(&f.server, &f.b2);
    wait_until(LONG, "the agent to be DEFERRED", || {
        row(&f, home)["update_status"] == "DEFERRED"
    });
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    let viewer = {
        let mut cmd = f.ctx.cmd("update-server");
        cmd.args([
            "token", "create", "--name", "vera", "--role", "viewer", "--server",
        ])
        .arg(f.server.url(""))
        .args(["--token", TOKEN]);
        stdout(&run_ok(&mut cmd)).trim().to_owned()
    };
    let path = format!("/admin/agents/{id}/override-locks");
    let (status, _) = admin_call(&f.server, &viewer, "POST", &path, "");
    assert_eq!(status, 403);
    // The page refuses a viewer the same way, and records it.
    let (status, body) = press_override(f.server.port, &viewer, &id);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("may not override"), "{body}");
    // Still held.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(row(&f, home)["version"], OLD);

    let overridden = Instant::now();
    let (status, body) = press_override(f.server.port, TOKEN, &id);
    assert_eq!(status, 303, "{body}");
    wait_until(LONG, "the overridden agent to install 2.0.0", || {
        installed(&f, home)
    });
    let took = overridden.elapsed();
    eprintln!("installed {:.1}s after the override", took.as_secs_f64());
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let (_, audit) = admin_call(
        &f.server,
        TOKEN,
        "GET",
        "/admin/audit?action=agent.override_locks",
        "",
    );
    let entries = audit["entries"].as_array().cloned().unwrap_or_default();
    let outcomes: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["who"].as_str().unwrap_or_default().to_owned(),
                e["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    // Newest first: the page's override, the page's refusal, the API's refusal.
    assert_eq!(
        outcomes,
        [
            ("admin.token".to_owned(), "done".to_owned()),
            ("vera".to_owned(), "refused".to_owned()),
            ("vera".to_owned(), "refused".to_owned()),
        ],
        "{audit}"
    );
    assert_eq!(entries[0]["details"]["via"], "page", "{audit}");
    let log = read_file(&home.join("logs/agent.log"));
    assert!(
        log.contains("an operator overrode the update locks"),
        "{log}"
    );
}

/// Signs in to the page with `token`, opens the agent's page and presses its Override
/// locks button: the answer's status and body.
fn press_override(port: u16, token: &str, id: &str) -> (u16, String) {
    let cookie = crate::page::http_sign_in(port, token);
    let page = e2e::http(
        port,
        "GET",
        &format!("/agents/{id}"),
        &[("Cookie", &cookie)],
    )
    .expect("the agent's page answers");
    let html = page.text();
    assert!(html.contains("Override locks"), "{html}");
    let form = format!("csrf={}", crate::page::hidden_csrf(&html));
    let answer = e2e::http_with_body(
        port,
        "POST",
        &format!("/agents/{id}/override-locks"),
        &[
            ("Cookie", &cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        form.as_bytes(),
    )
    .expect("the button's POST answers");
    (answer.status, answer.text())
}
