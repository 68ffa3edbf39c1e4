//! Staged rollouts with real agents run through their wrappers against a real server:
//! waves open in order, a broken bundle halts after its first wave, a silent one times
//! out, a killed server carries on, a downgrade waits for an operator, groups go first.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, configure_agent, http, http_with_body, log_time,
    metric, read_file, run, run_ok, signal, wait_until,
};
use serde_json::Value;

pub(crate) const OLD: &str = "1.0.0+1";
pub(crate) const NEW: &str = "2.0.0+2";
pub(crate) const LONG: Duration = Duration::from_secs(180);

/// A server, `n` agents of 1.0.0 running through their wrappers and registered under
/// the completed rollout of 1.0.0, and a 2.0.0 bundle ready to publish.
pub(crate) struct Fleet {
    pub(crate) ctx: TestContext,
    pub(crate) server: ServerProc,
    pub(crate) homes: Vec<PathBuf>,
    pub(crate) b2: PathBuf,
    pub(crate) key: PathBuf,
    server_env: Vec<(String, String)>,
}

/// What every fleet agent's conf/agent-env.sh says unless a test says otherwise.
pub(crate) const FLEET_AGENT_ENV: &str =
    "export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=120s\n";

fn fleet(
    n: usize,
    server_env: &[(&str, &str)],
    groups: &[&str],
    dist2: impl FnOnce(&Path),
) -> Fleet {
    fleet_with(n, server_env, groups, FLEET_AGENT_ENV, dist2)
}

/// [`fleet`], with `agent_env` as every agent's conf/agent-env.sh.
pub(crate) fn fleet_with(
    n: usize,
    server_env: &[(&str, &str)],
    groups: &[&str],
    agent_env: &str,
    dist2: impl FnOnce(&Path),
) -> Fleet {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let d2 = ctx.dist("d2");
    dist2(&d2);
    let b2 = ctx.pack(&d2, "2.0.0", "2", &key, "b2");
    let mut env: Vec<(String, String)> = vec![("UPDATE_SERVER_ADMIN_TOKEN".into(), TOKEN.into())];
    env.extend(
        server_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let server = start_server(&ctx, None, &env);
    ctx.publish_served(&server, &b1);
    e2e::wait_rollout(
        &server,
        TOKEN,
        LONG,
        "the rollout of 1.0.0 to complete",
        |r| r["version"] == OLD && r["state"] == "completed",
    );
    let homes: Vec<PathBuf> = (0..n)
        .map(|i| {
            let home = ctx.install(&b1, &format!("fleet/{i}"));
            let group = groups.get(i).copied().unwrap_or("");
            configure_agent(&home, &[server.url("")], &format!("group = \"{group}\"\n"));
            fs::write(home.join("conf/agent-env.sh"), agent_env).unwrap();
            home
        })
        .collect();
    e2e::start_wrappers(&homes);
    wait_until(LONG, "every agent to register", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .filter(|a| a["version"] == OLD)
            .count()
            == n
    });
    Fleet {
        ctx,
        server,
        homes,
        b2,
        key,
        server_env: env,
    }
}

/// update-server with `env`, on `port` if given (a restart) or a free one.
fn start_server(ctx: &TestContext, port: Option<u16>, env: &[(String, String)]) -> ServerProc {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    match port {
        None => ctx.server("srv", &env),
        Some(port) => ctx.server_on("srv", port, &env),
    }
}

pub(crate) fn agent_home<'a>(f: &'a Fleet, id: &str) -> &'a Path {
    f.homes
        .iter()
        .find(|h| read_file(&h.join("data/agent-id")).trim() == id)
        .map(PathBuf::as_path)
        .unwrap_or_else(|| panic!("no home for agent {id}"))
}

/// When the agent's own log says it was refused and started updating (unix seconds).
fn told_in_log(home: &Path) -> Option<f64> {
    read_file(&home.join("logs/agent.log"))
        .lines()
        .find(|l| l.contains(&format!("expects {NEW}; updating")))
        .and_then(log_time)
}

fn secs(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a time: {v}"))
}

#[test]
fn a_good_bundle_goes_out_in_waves_in_order_and_completes() {
    let f = fleet(
        10,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "2,50%,100%"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "2"),
        ],
        &[],
        |_| {},
    );
    f.ctx.republish(&f.server, &f.b2);
    let done = e2e::wait_rollout(
        &f.server,
        TOKEN,
        LONG,
        "the rollout of 2.0.0 to complete",
        |r| r["version"] == NEW && r["state"] == "completed",
    );
    assert_eq!(done["previous"], OLD);
    let waves = done["waves"].as_array().unwrap();
    let sizes: Vec<u64> = waves
        .iter()
        .map(|w| w["agents"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [2, 3, 5], "{done}");
    // Waves opened in order, each after the one before completed and soaked.
    for pair in waves.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(
            secs(&after["opened_at"]) >= secs(&before["completed_at"]) + 2.0,
            "a wave opened before the one before it completed and soaked: {done}"
        );
    }
    // Each wave opened once, by the database's own record.
    let events = done["events"].as_array().unwrap();
    for w in 1..=3 {
        let opened = events
            .iter()
            .filter(|e| e["kind"] == "wave_opened" && e["wave"] == w)
            .count();
        assert_eq!(opened, 1, "wave {w} opened {opened} times: {done}");
    }
    let agents = admin_agents(f.server.port, TOKEN);
    assert_eq!(agents.len(), 10);
    let first_done = secs(&waves[0]["completed_at"]);
    for a in &agents {
        assert_eq!(a["version"], NEW, "{a}");
        let wave = a["wave"].as_u64().unwrap();
        let told = secs(&a["told_at"]);
        let home = agent_home(&f, a["id"].as_str().unwrap());
        let logged =
            told_in_log(home).unwrap_or_else(|| panic!("{} never logged the 409", home.display()));
        if wave > 1 {
            // Nobody outside the first wave was told before the first wave completed:
            // not by the server's record, not by the agent's own log.
            assert!(
                told >= first_done,
                "wave {wave} told at {told} before wave 1 completed at {first_done}"
            );
            assert!(
                logged >= first_done - 0.001,
                "{} updated at {logged}, wave 1 completed at {first_done}",
                home.display()
            );
        }
        let opened = secs(&waves[wave as usize - 1]["opened_at"]);
        assert!(
            told >= opened,
            "told at {told} before its wave {wave} opened at {opened}"
        );
        assert_eq!(
            fs::read_link(home.join("current")).unwrap(),
            Path::new("versions").join(NEW)
        );
    }
    assert_eq!(
        metric(&f.server, "agentupdate_rollout_state{state=\"completed\"}"),
        1.0
    );
}

#[test]
fn a_broken_bundle_halts_after_its_first_wave_and_the_rest_are_never_told() {
    let f = fleet(
        10,
        &[("UPDATE_SERVER_ROLLOUT_WAVES", "2,50%,100%")],
        &[],
        |d| crate::update::script_agent(d, "exit 1"),
    );
    f.ctx.republish(&f.server, &f.b2);
    let halted = e2e::wait_rollout(&f.server, TOKEN, LONG, "the rollout to halt", |r| {
        r["version"] == NEW && r["state"] == "halted"
    });
    let reason = halted["reason"].as_str().unwrap();
    assert!(
        reason.contains("failed") && reason.contains("INSTALL_FAILED"),
        "{reason}"
    );
    assert_eq!(halted["wave"], 1, "{halted}");
    // Give the fleet time to misbehave, if it would.
    std::thread::sleep(Duration::from_secs(6));
    let status = e2e::admin_rollout(&f.server, TOKEN).unwrap();
    assert_eq!(status["state"], "halted");
    assert_eq!(status["wave"], 1);
    let agents = admin_agents(f.server.port, TOKEN);
    let mut untouched = 0;
    for a in &agents {
        let home = agent_home(&f, a["id"].as_str().unwrap());
        let health: Value =
            serde_json::from_str(&read_file(&home.join("run/health.json"))).unwrap();
        // Everyone runs the previous version and is accepted (no 409, not degraded).
        assert_eq!(a["version"], OLD, "{a}");
        assert!(
            health["refused_by_server"].is_null(),
            "{}: {health}",
            home.display()
        );
        if a["wave"] != 1 {
            untouched += 1;
            assert!(a["told_at"].is_null(), "told outside the first wave: {a}");
            let log = read_file(&home.join("logs/agent.log"));
            assert!(
                !log.contains("downloading agent"),
                "{} downloaded the bundle",
                home.display()
            );
        }
    }
    assert_eq!(untouched, 8);
    let downloads = metric(&f.server, "agentupdate_downloads_total{code=\"200\"}");
    assert!(
        downloads <= 2.0,
        "{downloads} downloads for a first wave of 2"
    );
    assert_eq!(
        metric(
            &f.server,
            "agentupdate_rollout_halts_total{cause=\"failures\"}"
        ),
        1.0
    );
}

#[test]
fn a_bundle_that_never_reports_times_out_and_that_counts_as_a_failure() {
    let f = fleet(
        4,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE", "8"),
        ],
        &[],
        // Hangs before it is healthy; the updater would wait 120 s for it.
        |d| crate::update::script_agent(d, "while :; do sleep 1; done"),
    );
    f.ctx.republish(&f.server, &f.b2);
    let halted = e2e::wait_rollout(&f.server, TOKEN, LONG, "the rollout to halt", |r| {
        r["version"] == NEW && r["state"] == "halted"
    });
    assert_eq!(halted["waves"][0]["timed_out"], 1, "{halted}");
    let reason = halted["reason"].as_str().unwrap();
    assert!(reason.contains("TIMED_OUT"), "{reason}");
    let timed_out: Vec<Value> = admin_agents(f.server.port, TOKEN)
        .into_iter()
        .filter(|a| a["update_status"] == "TIMED_OUT")
        .collect();
    assert_eq!(timed_out.len(), 1, "{timed_out:?}");
    assert_eq!(timed_out[0]["wave"], 1);
}

#[test]
fn a_server_killed_mid_rollout_carries_on_from_its_wave_and_opens_no_wave_twice() {
    let f = fleet(
        6,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "2,50%,100%"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "2"),
        ],
        &[],
        |_| {},
    );
    f.ctx.republish(&f.server, &f.b2);
    let before = e2e::wait_rollout(&f.server, TOKEN, LONG, "the second wave to open", |r| {
        r["version"] == NEW && r["wave"] == 2
    });
    signal(f.server.pid, "KILL");
    wait_until(Duration::from_secs(10), "the server to die", || {
        e2e::pid_gone(f.server.pid)
    });
    let server = start_server(&f.ctx, Some(f.server.port), &f.server_env);
    let done = e2e::wait_rollout(
        &server,
        TOKEN,
        LONG,
        "the rollout to complete after the restart",
        |r| r["version"] == NEW && r["state"] == "completed",
    );
    for w in 0..2 {
        assert_eq!(
            done["waves"][w]["opened_at"],
            before["waves"][w]["opened_at"],
            "wave {} was opened again: {done}",
            w + 1
        );
    }
    let events = done["events"].as_array().unwrap();
    for w in 1..=3 {
        let opened = events
            .iter()
            .filter(|e| e["kind"] == "wave_opened" && e["wave"] == w)
            .count();
        assert_eq!(opened, 1, "wave {w} opened {opened} times");
    }
    for a in admin_agents(server.port, TOKEN) {
        assert_eq!(a["version"], NEW, "{a}");
    }
}

#[test]
fn a_downgrade_starts_halted_and_the_rollout_command_resumes_it() {
    let f = fleet(2, &[], &[], |_| {});
    f.ctx.republish(&f.server, &f.b2);
    e2e::wait_rollout(&f.server, TOKEN, LONG, "2.0.0 to complete", |r| {
        r["version"] == NEW && r["state"] == "completed"
    });
    // 1.0.0 signed again today: a deliberate downgrade.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let again = f
        .ctx
        .pack_signed_at(&f.ctx.dist("d1b"), "1.0.0", "1", &f.key, "b1b", now + 5);
    f.ctx.republish(&f.server, &again);
    let halted = e2e::wait_rollout(
        &f.server,
        TOKEN,
        LONG,
        "the downgrade to start halted",
        |r| r["version"] == OLD && r["state"] == "halted",
    );
    assert!(
        halted["reason"]
            .as_str()
            .unwrap()
            .starts_with("downgrade: "),
        "{halted}"
    );
    assert_eq!(halted["previous"], NEW);
    std::thread::sleep(Duration::from_secs(3));
    for a in admin_agents(f.server.port, TOKEN) {
        assert_eq!(
            a["version"], NEW,
            "an agent was told to downgrade before resume: {a}"
        );
    }
    let cli = |args: &[&str]| {
        let mut c = f.ctx.cmd("update-server");
        c.args(["rollout"])
            .args(args)
            .args(["--server", &f.server.url(""), "--token", TOKEN]);
        c
    };
    let table = String::from_utf8(run_ok(&mut cli(&["status"])).stdout).unwrap();
    assert!(
        table.contains("halted") && table.contains("downgrade"),
        "{table}"
    );
    run_ok(&mut cli(&["resume"]));
    e2e::wait_rollout(&f.server, TOKEN, LONG, "the downgrade to complete", |r| {
        r["version"] == OLD && r["state"] == "completed"
    });
    wait_until(LONG, "both agents on 1.0.0", || {
        admin_agents(f.server.port, TOKEN)
            .iter()
            .all(|a| a["version"] == OLD)
    });
    let json: Value =
        serde_json::from_slice(&run_ok(&mut cli(&["status", "--json"])).stdout).unwrap();
    assert_eq!(json["state"], "completed");
    // A wrong token is refused with the server's words, exit 1.
    let out = run(f.ctx.cmd("update-server").args([
        "rollout",
        "halt",
        "--server",
        &f.server.url(""),
        "--token",
        "wrong",
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
}

#[test]
fn group_waves_take_the_canary_group_first() {
    let f = fleet(
        4,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "group:canary,100%"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "1"),
        ],
        &["", "", "canary", ""],
        |_| {},
    );
    f.ctx.republish(&f.server, &f.b2);
    let done = e2e::wait_rollout(&f.server, TOKEN, LONG, "the rollout to complete", |r| {
        r["version"] == NEW && r["state"] == "completed"
    });
    assert_eq!(done["waves"][0]["agents"], 1, "{done}");
    let first_done = secs(&done["waves"][0]["completed_at"]);
    for a in admin_agents(f.server.port, TOKEN) {
        let canary = a["group"] == "canary";
        assert_eq!(a["wave"], if canary { 1 } else { 2 }, "{a}");
        if !canary {
            assert!(secs(&a["told_at"]) >= first_done, "{a}");
        }
    }
}

#[test]
fn halt_advance_and_resume_through_the_admin_api() {
    let f = fleet(
        3,
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_WAVE_WAIT", "600"),
        ],
        &[],
        |_| {},
    );
    let post = |path: &str, body: &str| {
        let auth = format!("Bearer {TOKEN}");
        http_with_body(
            f.server.port,
            "POST",
            path,
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
        .unwrap()
    };
    f.ctx.republish(&f.server, &f.b2);
    // The first wave completes, then soaks for ten minutes: advance opens the next now.
    e2e::wait_rollout(&f.server, TOKEN, LONG, "the soak", |r| {
        r["version"] == NEW && r["state"] == "soaking"
    });
    let halted = post(
        "/admin/rollout/halt",
        r#"{"reason": "checking dashboards"}"#,
    );
    assert_eq!(halted.status, 200, "{}", halted.text());
    assert!(halted.text().contains("checking dashboards"));
    let refused = post("/admin/rollout/advance", "");
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert!(refused.text().contains("resume"), "{}", refused.text());
    assert_eq!(post("/admin/rollout/resume", "").status, 200);
    let advanced = post("/admin/rollout/advance", "");
    assert_eq!(advanced.status, 200, "{}", advanced.text());
    e2e::wait_rollout(&f.server, TOKEN, LONG, "the rollout to complete", |r| {
        r["version"] == NEW && r["state"] == "completed"
    });
    assert_eq!(post("/admin/rollout/halt", "").status, 409);
    let unauthorized = http(f.server.port, "GET", "/admin/rollout", &[]).unwrap();
    assert_eq!(unauthorized.status, 401);
}
