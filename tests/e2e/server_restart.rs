//! The operator's traps (issue 59, item 5): changing a maintenance window needed a
//! restart, and a restart signed every operator out of the page. Sessions are kept in
//! the fleet database (only the cookie's hash), so the same cookie works after a restart
//! and on another server of a PostgreSQL fleet; SIGHUP reads server.toml's windows
//! again without a restart, and a file that does not read keeps the old ones.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::{
    Postgres, ServerProc, TOKEN, TestContext, http, http_with_body, pid_gone, read_file, run_ok,
    sha256_bytes, signal, wait_until,
};
use serde_json::Value;

use crate::page::http_sign_in;

const WAIT: Duration = Duration::from_secs(30);

/// What `GET /` answers `cookie`: `Some(csrf)` of the signed-in overview, `None` for the
/// sign-in form.
fn signed_in(server: &ServerProc, cookie: &str) -> Option<String> {
    let answer = http(server.port, "GET", "/", &[("Cookie", cookie)]).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let html = answer.text();
    if !html.contains("id=\"total\"") {
        assert!(
            html.contains("name=\"token\""),
            "neither overview nor sign-in: {html}"
        );
        return None;
    }
    let at = html.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
    Some(html[at..at + html[at..].find('"').unwrap()].to_owned())
}

fn stop(server: &ServerProc) {
    signal(server.pid, "TERM");
    wait_until(WAIT, "the server to stop", || pid_gone(server.pid));
}

/// Every byte of the fleet database's files (the database, its WAL).
fn database_bytes(home: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in fs::read_dir(home).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("fleet.db") {
            all.extend(fs::read(entry.path()).unwrap());
        }
    }
    all
}

#[test]
fn a_page_session_survives_a_restart_and_a_forged_or_expired_cookie_does_not() {
    let ctx = TestContext::new();
    let env = [("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)];
    let server = ctx.server("srv", &env);
    let cookie = http_sign_in(server.port, TOKEN);
    let csrf = signed_in(&server, &cookie).expect("signed in");
    let value = cookie.trim_start_matches("fleet_session=").to_owned();

    stop(&server);
    let stored = database_bytes(&server.home);
    let hash = sha256_bytes(value.as_bytes());
    assert!(
        !stored.windows(value.len()).any(|w| w == value.as_bytes()),
        "the cookie itself is in the fleet database"
    );
    assert!(
        stored.windows(hash.len()).any(|w| w == hash.as_bytes()),
        "the session is in the fleet database, by its hash"
    );

    let server = ctx.server_on("srv", server.port, &env);
    assert_eq!(
        signed_in(&server, &cookie).as_deref(),
        Some(csrf.as_str()),
        "the same session, with the same CSRF token, after a restart"
    );
    // Its CSRF binding holds: a button with another token is refused, with its own taken.
    let post = |path: &str, form: &str| {
        http_with_body(
            server.port,
            "POST",
            path,
            &[
                ("Cookie", cookie.as_str()),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            form.as_bytes(),
        )
        .unwrap()
        .status
    };
    assert_eq!(post("/signout", &format!("csrf={}", "0".repeat(64))), 403);

    // Forged: a cookie of the right form that no one was given.
    let forged = format!("fleet_session={}", "ab".repeat(32));
    assert_eq!(signed_in(&server, &forged), None);
    // The database's own value (the hash) is no cookie either.
    assert_eq!(signed_in(&server, &format!("fleet_session={hash}")), None);

    // Expired: a second session, signed in 25 hours ago (past its maximum age).
    let old = http_sign_in(server.port, TOKEN);
    assert!(signed_in(&server, &old).is_some());
    stop(&server);
    let old_hash = sha256_bytes(old.trim_start_matches("fleet_session=").as_bytes());
    let day_ago_ms = (e2e::now_secs() - 25 * 3600) * 1000;
    run_ok(Command::new("python3").args([
        "-c",
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()",
        &server.home.join("fleet.db").display().to_string(),
        &format!("UPDATE page_sessions SET started_at = {day_ago_ms} WHERE id_hash = '{old_hash}'"),
    ]));
    let server = ctx.server_on("srv", server.port, &env);
    assert_eq!(
        signed_in(&server, &old),
        None,
        "a session past its maximum age"
    );
    assert!(signed_in(&server, &cookie).is_some());

    // Signing out ends it for good: the row goes, a replayed cookie is refused.
    assert_eq!(post("/signout", &format!("csrf={csrf}")), 303);
    assert_eq!(signed_in(&server, &cookie), None);
    stop(&server);
    let server = ctx.server_on("srv", server.port, &env);
    assert_eq!(signed_in(&server, &cookie), None, "after a restart too");
}

#[test]
fn a_session_made_on_one_server_of_a_postgres_fleet_is_valid_on_the_other() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let url = pg.url();
    let env = |name| {
        [
            ("UPDATE_SERVER_DATABASE_URL", url.as_str()),
            ("UPDATE_SERVER_SERVER_NAME", name),
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
        ]
    };
    let a = ctx.server("srv-a", &env("a"));
    let b = ctx.server("srv-b", &env("b"));
    let cookie = http_sign_in(a.port, TOKEN);
    let csrf = signed_in(&a, &cookie).expect("signed in on a");
    assert_eq!(signed_in(&b, &cookie), Some(csrf.clone()), "known to b");
    // Signed out on b: ended on a too.
    let out = http_with_body(
        b.port,
        "POST",
        "/signout",
        &[
            ("Cookie", cookie.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        format!("csrf={csrf}").as_bytes(),
    )
    .unwrap();
    assert_eq!(out.status, 303, "{}", out.text());
    assert_eq!(signed_in(&a, &cookie), None);
}

/// `GET /admin/maintenance`: each window's groups and start.
fn windows(server: &ServerProc) -> Vec<(Value, String)> {
    let (status, listing) = e2e::admin_call(server, TOKEN, "GET", "/admin/maintenance", "");
    assert_eq!(status, 200, "{listing}");
    listing["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["groups"].clone(), w["start"].as_str().unwrap().to_owned()))
        .collect()
}

fn window(groups: &str, start: &str) -> String {
    format!("[[maintenance]]\ngroups = [{groups}]\nstart = \"{start}\"\nduration = \"1h\"\n\n")
}

#[test]
fn sighup_takes_new_maintenance_windows_and_a_file_that_does_not_read_keeps_the_old() {
    let ctx = TestContext::new();
    let file = ctx.path("server.toml");
    let head = format!("[admin]\ntoken = \"{TOKEN}\"\n\n");
    fs::write(&file, format!("{head}{}", window("\"db\"", "02:00"))).unwrap();
    let config = file.display().to_string();
    let server = ctx.server_with("srv", e2e::free_port(), &["--config", &config], &[]);
    let log = server.home.join("server.log");
    assert_eq!(
        windows(&server),
        [(serde_json::json!(["db"]), "02:00".to_owned())]
    );

    // Changed and a second window added: taken on SIGHUP, no restart.
    fs::write(
        &file,
        format!(
            "{head}{}{}",
            window("\"db\"", "03:30"),
            window("\"web\", \"edge\"", "22:15")
        ),
    )
    .unwrap();
    signal(server.pid, "HUP");
    let wanted = [
        (serde_json::json!(["db"]), "03:30".to_owned()),
        (serde_json::json!(["web", "edge"]), "22:15".to_owned()),
    ];
    wait_until(WAIT, "the new windows to be listed", || {
        windows(&server) == wanted
    });
    assert!(!pid_gone(server.pid), "the same process");
    let said = read_file(&log);
    assert!(
        said.contains("maintenance windows are now") && said.contains("03:30"),
        "{said}"
    );

    // A window that is no window (its table is at line 9): nothing changes, and the log
    // says the file and the line.
    let bad = format!(
        "{head}{}{}",
        window("\"db\"", "03:30"),
        window("\"web\", \"edge\"", "25:00")
    );
    assert_eq!(bad.lines().nth(8), Some("[[maintenance]]"));
    fs::write(&file, bad).unwrap();
    signal(server.pid, "HUP");
    let line = refusal(&log, 1);
    assert!(
        line.contains(&config) && line.contains("line 9") && line.contains("maintenance.start"),
        "{line}"
    );
    assert!(line.contains("keeps its maintenance windows"), "{line}");
    assert_eq!(windows(&server), wanted);

    // A file that does not parse: the same, naming its line.
    fs::write(&file, format!("{head}[[maintenance]\nstart = \"04:00\"\n")).unwrap();
    signal(server.pid, "HUP");
    let line = refusal(&log, 2);
    assert!(line.contains(&config) && line.contains("line 4"), "{line}");
    assert_eq!(windows(&server), wanted);

    // Fixed, with the windows removed: none from now on.
    fs::write(&file, &head).unwrap();
    signal(server.pid, "HUP");
    wait_until(WAIT, "the windows to be gone", || {
        windows(&server).is_empty()
    });
}

/// The `n`th line of the server's log that says a reload was not taken.
fn refusal(log: &Path, n: usize) -> String {
    let find = || {
        read_file(log)
            .lines()
            .filter(|l| l.contains("not taken"))
            .nth(n - 1)
            .map(str::to_owned)
    };
    wait_until(WAIT, "a reload refused in the log", || find().is_some());
    find().unwrap()
}
