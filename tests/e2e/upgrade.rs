//! Databases made by the release before one rollout engine (schema 0006, commit d43dc20)
//! open in this one: the bundle rollout and the config rollout it had under way are found
//! where they were, and go on, on SQLite and on PostgreSQL. The fixtures, and the script
//! that made them with that release, are in crates/fleet/tests/fixtures.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use e2e::{PG_PASSWORD, Postgres, ServerProc, TestContext, repo_root, run_ok};
use serde_json::{Value, json};

/// The admin token and plan the fixtures' server ran with.
const TOKEN: &str = "fixture";
const ENV: [(&str, &str); 3] = [
    ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
    ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
    ("UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE", "86400"),
];

/// The fixtures' agents were told when the fixtures were made, and the plan gives them a
/// day to answer: moved to now, so that the rollouts are under way whenever the test runs
/// (not timed out a day after the fixtures were made).
fn told_now() -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "UPDATE rollout_agents SET told_at = {now_ms} WHERE told_at IS NOT NULL; UPDATE config_rollout_agents SET told_at = {now_ms} WHERE told_at IS NOT NULL;"
    )
}

fn fixture(name: &str) -> PathBuf {
    repo_root().join("crates/fleet/tests/fixtures").join(name)
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// An admin API call; a null `body` sends none.
fn admin(server: &ServerProc, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    e2e::admin_call(server, TOKEN, method, path, body)
}

/// What the old server last answered is what the new one answers; then both rollouts
/// go on under the new engine, and a new rollout gets an id of its own.
fn finds_the_rollouts_where_they_were(server: &ServerProc, made_by: &str) {
    let before_rollout = fixture_json(&format!("{made_by}.rollout.json"));
    let before_config = fixture_json(&format!("{made_by}.config.json"));
    // The fixture is what it says: both kinds under way, agents told in each.
    assert_eq!(before_rollout["state"], "running", "{before_rollout}");
    assert_eq!(before_rollout["version"], "2.0.0+2");
    assert_eq!(
        before_config["sets"][0]["state"], "running",
        "{before_config}"
    );
    assert_eq!(before_config["sets"][0]["applying"], 1, "{before_config}");

    assert_eq!(e2e::admin_rollout(server, TOKEN).unwrap(), before_rollout);
    assert_eq!(
        admin(server, "GET", "/admin/config", &Value::Null).1,
        before_config
    );

    // They go on: each one's next wave opens when an operator says so.
    let (status, body) = admin(server, "POST", "/admin/rollout/advance", &Value::Null);
    assert_eq!(status, 200, "{body}");
    assert_eq!(e2e::admin_rollout(server, TOKEN).unwrap()["wave"], 2);
    let (status, body) = admin(server, "POST", "/admin/config/edge/advance", &Value::Null);
    assert_eq!(status, 200, "{body}");
    let (_, config) = admin(server, "GET", "/admin/config", &Value::Null);
    assert_eq!(config["sets"][0]["rollout"]["wave"], 2, "{config}");

    // A set pushed now is a rollout of its own beside the moved ones.
    let files = json!({"files": {"other.yaml": "scrape: 30s\n"}});
    let (status, body) = admin(server, "PUT", "/admin/config/core", &files);
    assert_eq!(status, 200, "{body}");
    let (_, config) = admin(server, "GET", "/admin/config", &Value::Null);
    let groups: Vec<(&str, &str)> = config["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["group"].as_str().unwrap(),
                s["state"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [("core", "completed"), ("edge", "running")],
        "{config}"
    );
    assert_eq!(
        e2e::admin_rollout(server, TOKEN).unwrap()["version"],
        "2.0.0+2"
    );
}

#[test]
fn a_sqlite_fleet_of_the_release_before_keeps_its_rollouts() {
    let ctx = TestContext::new();
    let home = ctx.path("srv");
    fs::create_dir_all(&home).unwrap();
    fs::copy(fixture("fleet-0006.sqlite"), home.join("fleet.db")).unwrap();
    // No SQLite client in the tests' tools but Python's own module.
    run_ok(
        Command::new("python3")
            .args(["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()"])
            .arg(home.join("fleet.db"))
            .arg(told_now()),
    );
    let server = ctx.server("srv", &ENV);
    finds_the_rollouts_where_they_were(&server, "fleet-0006.sqlite");
}

#[test]
fn a_postgres_fleet_of_the_release_before_keeps_its_rollouts() {
    let pg = Postgres::start();
    let psql = || {
        let mut cmd = Command::new("psql");
        cmd.args(["-h", "127.0.0.1", "-p", &pg.port.to_string()])
            .args(["-U", "postgres", "-d", "fleet", "-X", "-q"])
            .args(["-v", "ON_ERROR_STOP=1"])
            .env("PGPASSWORD", PG_PASSWORD);
        cmd
    };
    run_ok(psql().arg("-f").arg(fixture("fleet-0006.sql")));
    run_ok(psql().args(["-c", &told_now()]));
    let ctx = TestContext::new();
    let url = pg.url();
    let mut env = ENV.to_vec();
    env.push(("UPDATE_SERVER_DATABASE_URL", url.as_str()));
    let server = ctx.server("srv", &env);
    finds_the_rollouts_where_they_were(&server, "fleet-0006.sql");
    assert_eq!(
        pg.psql(
            "fleet",
            "SELECT string_agg(rollout_kind || ' ' || state, ', ' ORDER BY id) FROM rollouts"
        ),
        "bundle completed, bundle running, config running, config completed"
    );
    assert_eq!(
        pg.psql("fleet", "SELECT to_regclass('config_rollouts') IS NULL"),
        "t"
    );
}
