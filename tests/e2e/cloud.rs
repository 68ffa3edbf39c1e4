//! Several update-servers sharing one fleet on a real PostgreSQL (a throw-away cluster
//! per test, made with initdb): shared agents and switch, per-server limits, a rollout
//! that outlives the server that started it, a release dropped by hand on one server
//! served by all (an older one starting no rollout), and a database that goes away for
//! 20 s.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{
    Postgres, ServerProc, TOKEN, TestContext, admin_agents, configure_agent, free_port, http,
    http_open, metric, read_file, run, run_ok, signal, wait_until,
};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(180);

/// The environment of server `name` on `pg`, with `extra`.
fn env_for(pg: &Postgres, name: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("UPDATE_SERVER_DATABASE_URL".to_owned(), pg.url()),
        ("UPDATE_SERVER_SERVER_NAME".to_owned(), name.to_owned()),
        ("UPDATE_SERVER_ADMIN_TOKEN".to_owned(), TOKEN.to_owned()),
    ];
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

fn start(ctx: &TestContext, home: &str, port: u16, env: &[(String, String)]) -> ServerProc {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ctx.server_on(home, port, &env)
}

fn admin(server: &ServerProc, method: &str, path: &str, body: &str) -> (u16, Value) {
    e2e::admin_call(server, TOKEN, method, path, body)
}

fn register(server: &ServerProc, id: &str) -> u16 {
    register_as(server, id, "1.0.0+1")
}

fn register_as(server: &ServerProc, id: &str, version: &str) -> u16 {
    let body =
        serde_json::json!({ "id": id, "name": id, "platform": agent_protocol::layout::PLATFORM });
    e2e::agent_post(server, "/agent/register", version, None, &body.to_string()).status
}

fn download_status(server: &ServerProc) -> u16 {
    http(server.port, "HEAD", "/agentupdate/download", &[])
        .map(|a| a.status)
        .unwrap_or(0)
}

#[test]
fn startup_errors_say_what_is_wrong_with_the_database() {
    let ctx = TestContext::new();
    let pg = Postgres::start();
    let secret = e2e::PG_PASSWORD;
    let cases = [
        (
            format!(
                "postgres://postgres:{secret}@127.0.0.1:{}/fleet",
                free_port()
            ),
            "cannot reach PostgreSQL at 127.0.0.1",
        ),
        (
            format!(
                "postgres://postgres:not-{secret}@127.0.0.1:{}/fleet",
                pg.port
            ),
            "refused the login of user \"postgres\"",
        ),
        (
            format!("postgres://postgres:{secret}@127.0.0.1:{}/nosuch", pg.port),
            "database \"nosuch\" does not exist",
        ),
        (
            "postgres://postgres@127.0.0.1:notaport/fleet".to_owned(),
            "not a valid PostgreSQL URL",
        ),
    ];
    for (url, needle) in cases {
        let started = Instant::now();
        let out = run(ctx
            .cmd("update-server")
            .args(["--listen", "127.0.0.1:0", "--home"])
            .arg(ctx.path("srv"))
            .env("UPDATE_SERVER_DATABASE_URL", &url));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "started with {url}: {err}");
        assert!(err.contains(needle), "expected {needle:?} for {url}: {err}");
        assert!(!err.contains(secret), "the password is shown: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?} to say so",
            started.elapsed()
        );
    }
}

#[test]
fn two_servers_share_agents_and_the_switch_and_keep_their_own_limits() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    // Both start at once on the empty database: its schema is made once.
    let (env_a, env_b) = (env_for(&pg, "a", &[]), env_for(&pg, "b", &[]));
    let pair: Vec<(&str, Vec<(String, String)>)> = vec![("srv-a", env_a), ("srv-b", env_b)];
    let servers: Vec<ServerProc> = pair
        .into_iter()
        .map(|(home, env)| {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            ctx.spawn_server(home, free_port(), &env)
        })
        .collect();
    for s in &servers {
        wait_until(Duration::from_secs(30), "both servers to answer", || {
            http(s.port, "GET", "/healthz", &[]).is_ok_and(|a| a.status == 200)
        });
    }
    let (a, b) = (&servers[0], &servers[1]);
    ctx.publish_served(a, &b1);
    ctx.publish_served(b, &b1);

    assert_eq!(register(a, "through-a"), 200);
    let on_b = admin_agents(b.port, TOKEN);
    assert!(
        on_b.iter().any(|x| x["id"] == "through-a"),
        "b does not list the agent a registered: {on_b:?}"
    );

    // The fleet-wide switch, turned off on one, is off on the other within 5 s.
    assert_eq!(download_status(b), 200);
    let turned = Instant::now();
    assert_eq!(
        admin(a, "PUT", "/admin/settings", r#"{"auto_update": false}"#).0,
        200
    );
    wait_until(Duration::from_secs(5), "b to stop downloads", || {
        download_status(b) == 403
    });
    assert!(turned.elapsed() <= Duration::from_secs(5));
    assert_eq!(
        admin(b, "PUT", "/admin/settings", r#"{"auto_update": true}"#).0,
        200
    );
    wait_until(Duration::from_secs(5), "a to serve downloads again", || {
        download_status(a) == 200
    });

    // Each server's download limit is its own.
    let (status, settings) = admin(a, "PUT", "/admin/settings", r#"{"downloads_limit": 1}"#);
    assert_eq!(status, 200, "{settings}");
    assert_eq!(settings["downloads_limit"], 1);
    assert_eq!(settings["server"], "a");
    let (_, on_b) = admin(b, "GET", "/admin/settings", "");
    assert_eq!(on_b["downloads_limit"], 45, "{on_b}");
    let (held, reader) = http_open(a.port, "/agentupdate/download").unwrap();
    assert_eq!(held.status, 200);
    assert_eq!(
        http(a.port, "GET", "/agentupdate/download", &[])
            .unwrap()
            .status,
        503
    );
    assert_eq!(download_status(b), 200);
    // And it outlives a restart of the server that set it.
    let port_a = a.port;
    drop(reader);
    signal(a.pid, "TERM");
    wait_until(Duration::from_secs(30), "a to stop", || {
        e2e::pid_gone(a.pid)
    });
    let a = start(&ctx, "srv-a", port_a, &env_for(&pg, "a", &[]));
    assert_eq!(
        admin(&a, "GET", "/admin/settings", "").1["downloads_limit"],
        1
    );
}

/// `n` agents of 1.0.0 listing `urls` in order, started through their wrappers.
fn agents(ctx: &TestContext, bundle: &Path, urls: &[String], n: usize, env: &str) -> Vec<PathBuf> {
    let homes: Vec<PathBuf> = (0..n)
        .map(|i| {
            let home = ctx.install(bundle, &format!("fleet/{i}"));
            configure_agent(&home, urls, "");
            fs::write(home.join("conf/agent-env.sh"), env).unwrap();
            home
        })
        .collect();
    e2e::start_wrappers(&homes);
    homes
}

#[test]
fn a_rollout_outlives_the_server_that_started_it() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let plan = [
        ("UPDATE_SERVER_ROLLOUT_WAVES", "2,100%"),
        ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "2"),
    ];
    let env_a = env_for(&pg, "a", &plan);
    let env_b = env_for(&pg, "b", &plan);
    let a = start(&ctx, "srv-a", free_port(), &env_a);
    let b = start(&ctx, "srv-b", free_port(), &env_b);
    ctx.publish_served(&a, &b1);
    ctx.publish_served(&b, &b1);
    e2e::wait_rollout(&b, TOKEN, LONG, "the rollout of 1.0.0 to complete", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "completed"
    });
    let homes = agents(
        &ctx,
        &b1,
        &[a.url(""), b.url("")],
        6,
        "export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=60s\n",
    );
    wait_until(LONG, "six agents registered", || {
        admin_agents(b.port, TOKEN).len() == 6
    });

    // a starts the rollout; b gets the same bundle and follows it.
    ctx.republish(&a, &b2);
    let started = e2e::wait_rollout(&a, TOKEN, LONG, "a to start the rollout of 2.0.0", |r| {
        r["version"] == "2.0.0+2"
    });
    ctx.republish(&b, &b2);
    wait_until(LONG, "the first wave to be told", || {
        admin_agents(a.port, TOKEN)
            .iter()
            .filter(|x| !x["told_at"].is_null())
            .count()
            >= 2
    });
    signal(a.pid, "KILL");
    wait_until(Duration::from_secs(10), "a to die", || e2e::pid_gone(a.pid));

    let done = e2e::wait_rollout(&b, TOKEN, LONG, "the rollout to complete through b", |r| {
        r["version"] == "2.0.0+2" && r["state"] == "completed"
    });
    wait_until(LONG, "every agent on 2.0.0", || {
        let listed = admin_agents(b.port, TOKEN);
        listed.len() == 6 && listed.iter().all(|x| x["version"] == "2.0.0+2")
    });
    let a = start(&ctx, "srv-a", a.port, &env_a);
    let seen_by_a = e2e::admin_rollout(&a, TOKEN).unwrap();
    assert_eq!(seen_by_a["state"], "completed");
    assert_eq!(seen_by_a["started_at"], started["started_at"]);
    assert_eq!(seen_by_a["waves"], done["waves"]);

    // The database's own record: each wave opened once; a started, b finished.
    let twice = pg.psql(
        "fleet",
        "SELECT rollout_id, wave, count(*) FROM rollout_events WHERE kind = 'wave_opened' GROUP BY rollout_id, wave HAVING count(*) > 1",
    );
    assert_eq!(twice, "", "waves opened twice");
    let who = pg.psql(
        "fleet",
        "SELECT kind || ' ' || wave || ' ' || server FROM rollout_events e JOIN rollouts r ON r.id = e.rollout_id WHERE r.version = '2.0.0+2' ORDER BY e.id",
    );
    assert!(who.contains("started 0 a"), "{who}");
    assert!(who.contains("wave_opened 2 b"), "{who}");
    assert!(who.contains("completed 0 b"), "{who}");
    for home in &homes {
        assert!(read_file(&home.join("current/agent-version.properties")).contains("2.0.0"));
    }
}

fn healthz(server: &ServerProc) -> String {
    http(server.port, "GET", "/healthz", &[]).unwrap().text()
}

fn rollouts_in_database(pg: &Postgres) -> String {
    pg.psql(
        "fleet",
        "SELECT string_agg(version || ' ' || state, ', ' ORDER BY id) FROM rollouts",
    )
}

/// A hand drop is a publish (issue 59): dropped into one server's download directory, a
/// release is the fleet's, and every server serves it; an older one put back by hand
/// starts no rollout, and every server says the way back (a fresh signature and `release
/// rollback`). Before, each server served its own directory, out of step with the rest.
#[test]
fn a_release_dropped_by_hand_on_one_server_is_the_fleets_and_an_older_one_says_the_way_back() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let old = ctx.pack_signed_at(&ctx.dist("d-old"), "0.5.0", "1", &key, "old", now - 7200);
    let b0 = ctx.pack_signed_at(&ctx.dist("d0"), "0.9.0", "1", &key, "b0", now - 3600);
    let b1 = ctx.pack_signed_at(&ctx.dist("d1"), "1.0.0", "1", &key, "b1", now);
    let b2 = ctx.pack_signed_at(&ctx.dist("d2"), "2.0.0", "2", &key, "b2", now + 5);
    // The fleet runs 0.5.0; its one agent is told to update to 1.0.0 and never reports,
    // so the fleet's rollout of 1.0.0 stays under way.
    let plan = [("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%")];
    let a = start(&ctx, "srv-a", free_port(), &env_for(&pg, "a", &plan));
    let b = start(&ctx, "srv-b", free_port(), &env_for(&pg, "b", &plan));
    ctx.publish_served(&a, &old);
    e2e::wait_rollout(&a, TOKEN, LONG, "the rollout of 0.5.0 to complete", |r| {
        r["version"] == "0.5.0+1" && r["state"] == "completed"
    });
    b.wait_serving(&e2e::sha256_file(&old));
    assert_eq!(register_as(&a, "early", "0.5.0+1"), 200);

    // Dropped on b, served by a too, with one rollout.
    ctx.republish(&b, &b1);
    a.wait_serving(&e2e::sha256_file(&b1));
    e2e::wait_rollout(&a, TOKEN, LONG, "the rollout of 1.0.0", |r| {
        r["version"] == "1.0.0+1" && r["state"] == "running"
    });
    let (_, list) = admin(&a, "GET", "/admin/releases", "");
    assert_eq!(list["current"]["id"], "1.0.0+1", "{list}");
    assert_eq!(list["current"]["published_by"], "server", "{list}");
    assert_eq!(
        rollouts_in_database(&pg),
        "0.5.0+1 completed, 1.0.0+1 running"
    );

    // An older signature put back by hand: served everywhere, rolled out nowhere, and
    // every server says the way back.
    ctx.republish(&b, &b0);
    a.wait_serving(&e2e::sha256_file(&b0));
    for server in [&a, &b] {
        wait_until(
            Duration::from_secs(10),
            "each server to call the bundle stale",
            || healthz(server).contains("signed before"),
        );
        let health = healthz(server);
        assert!(health.starts_with("ok\nbundle mismatch: "), "{health}");
        for word in [
            "0.9.0",
            "1.0.0",
            "agent-bundle sign",
            "update-server release rollback --to 0.9.0+1",
        ] {
            assert!(health.contains(word), "{word:?} not in {health}");
        }
        assert_eq!(metric(server, "agentupdate_bundle_mismatch"), 1.0);
        assert_eq!(
            e2e::admin_rollout(server, TOKEN).unwrap()["version"],
            "1.0.0+1"
        );
    }
    assert_eq!(
        rollouts_in_database(&pg),
        "0.5.0+1 completed, 1.0.0+1 running"
    );
    // No agent of the fleet's rollout is refused meanwhile.
    assert_eq!(register(&b, "late"), 200);

    // A newer one dropped by hand on a is a publish: its rollout starts at once, once,
    // and both servers are in step again.
    ctx.republish(&a, &b2);
    b.wait_serving(&e2e::sha256_file(&b2));
    e2e::wait_rollout(&b, TOKEN, LONG, "the rollout of 2.0.0 to start", |r| {
        r["version"] == "2.0.0+2"
    });
    for server in [&a, &b] {
        wait_until(Duration::from_secs(10), "each server to be in step", || {
            !healthz(server).contains("mismatch")
        });
    }
    let rows = rollouts_in_database(&pg);
    assert!(
        rows.starts_with("0.5.0+1 completed, 1.0.0+1 ") && rows.contains("2.0.0+2 "),
        "{rows}"
    );
    assert_eq!(rows.matches(',').count(), 2, "{rows}");
}

fn journal_phase(home: &Path) -> String {
    serde_json::from_str::<Value>(&read_file(&home.join("data/update-journal.json")))
        .ok()
        .and_then(|j| j["phase"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn twenty_seconds_without_the_database_refuse_no_one_and_lose_no_report() {
    let pg = Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    // The three real agents are the first wave; the simulated fleet waits in the
    // second, which soaks for an hour: nobody is refused but by the rollout's plan.
    let env = env_for(
        &pg,
        "a",
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "group:real,100%"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "3600"),
        ],
    );
    let server = start(&ctx, "srv", free_port(), &env);
    ctx.publish_served(&server, &b1);
    e2e::wait_rollout(
        &server,
        TOKEN,
        LONG,
        "the rollout of 1.0.0 to complete",
        |r| r["state"] == "completed",
    );
    let homes = agents(
        &ctx,
        &b1,
        &[server.url("")],
        3,
        // The new version must stay healthy 6 s: its INSTALLED falls in the outage.
        "export AGENT_UPDATE_STABILITY_WINDOW=6s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=60s\n",
    );
    for home in &homes {
        let conf = home.join("conf/agent.toml");
        let text = read_file(&conf).replace("[agent]\n", "[agent]\ngroup = \"real\"\n");
        fs::write(&conf, text).unwrap();
        run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg("restart"));
    }
    let sim_json = ctx.path("sim.json");
    let mut sim = Command::new(e2e::bin_path("fleet-sim"))
        .args(["--server", &server.url(""), "--agents", "100"])
        .args([
            "--agent-version",
            "1.0.0+1",
            "--heartbeat",
            "1s",
            "--ramp",
            "1s",
        ])
        .args(["--duration", "45s", "--progress", "10s", "--json"])
        .arg(&sim_json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(LONG, "103 agents registered", || {
        admin_agents(server.port, TOKEN).len() == 103
    });

    ctx.republish(&server, &b2);
    // Every real agent told and updating; their INSTALLED comes 6 s after each switch.
    wait_until(LONG, "the real agents to be updating", || {
        homes.iter().all(|h| !journal_phase(h).is_empty())
    });
    pg.stop();
    let stopped = Instant::now();
    let committed = (0..150).any(|_| {
        let all = homes.iter().all(|h| journal_phase(h) == "committed");
        if !all {
            std::thread::sleep(Duration::from_millis(100));
        }
        all
    });
    assert!(
        committed,
        "the real agents did not commit 2.0.0 during the outage:\n{}\n--- server log:\n{}",
        homes
            .iter()
            .map(|h| format!(
                "--- {}: {}\n{}\n{}",
                h.display(),
                journal_phase(h),
                read_file(&h.join("logs/update.log")),
                read_file(&h.join("logs/agent.log"))
            ))
            .collect::<String>(),
        read_file(&server.home.join("server.log"))
    );
    // Their INSTALLED reports were taken (queued by the server) during the outage.
    wait_until(
        Duration::from_secs(5),
        "the reports to be delivered",
        || {
            homes.iter().all(|h| {
                fs::read_dir(h.join("data/outbox")).map_or(true, |mut d| d.next().is_none())
            })
        },
    );
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "the updates took the whole outage"
    );
    let health = http(server.port, "GET", "/healthz", &[]).unwrap();
    assert_eq!(health.status, 200);
    assert!(
        health.text().contains("database unreachable"),
        "{}",
        health.text()
    );
    assert_eq!(metric(&server, "agentupdate_database_up"), 0.0);
    // The outage lasts 20 s: that is the scenario, not a wait for something.
    std::thread::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed()));
    pg.start_server();

    wait_until(
        Duration::from_secs(30),
        "the queued writes to be written",
        || {
            metric(&server, "agentupdate_database_up") == 1.0
                && metric(&server, "agentupdate_database_queued_writes") == 0.0
        },
    );
    let ids: Vec<String> = homes
        .iter()
        .map(|h| format!("'{}'", read_file(&h.join("data/agent-id")).trim()))
        .collect();
    let rows = pg.psql(
        "fleet",
        &format!(
            "SELECT version || ' ' || update_status FROM agents WHERE id IN ({}) ORDER BY id",
            ids.join(",")
        ),
    );
    assert_eq!(
        rows.lines().collect::<Vec<_>>(),
        vec!["2.0.0+2 INSTALLED"; 3],
        "{rows}"
    );
    let outcomes = pg.psql(
        "fleet",
        &format!(
            "SELECT outcome FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id WHERE r.version = '2.0.0+2' AND agent_id IN ({})",
            ids.join(",")
        ),
    );
    assert_eq!(
        outcomes.lines().collect::<Vec<_>>(),
        vec!["INSTALLED"; 3],
        "{outcomes}"
    );

    assert!(sim.wait().unwrap().success());
    let report: Value = serde_json::from_str(&read_file(&sim_json)).unwrap();
    assert_eq!(report["refused"], 0, "{report}");
    assert_eq!(report["unavailable"], 0, "{report}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    for home in &homes {
        let log = read_file(&home.join("logs/agent.log"));
        assert!(!log.contains("answered 500"), "{log}");
        assert!(!log.contains("answered 503"), "{log}");
    }
    let server_log = read_file(&server.home.join("server.log"));
    assert!(
        server_log.contains("the fleet database is back"),
        "{server_log}"
    );
}
