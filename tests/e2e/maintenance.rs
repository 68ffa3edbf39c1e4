//! Maintenance windows with real agents and a real server: nothing installs before the
//! window opens, agents wait `WAITING_WINDOW` with the opening, and install within
//! seconds of it (held long polls are woken, at the default 30 s heartbeat); a late
//! arriver installs in the next window, or at once with `catch-up = "at-once"`. A bad
//! `[[maintenance]]` stops the server with the key named.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, admin_call, configure_agent, free_port, log_time,
    now_secs, read_file, run_fails, run_ok, wait_until,
};
use serde_json::Value;

const OLD: &str = "1.0.0+1";
const NEW: &str = "2.0.0+2";
const LONG: Duration = Duration::from_secs(120);

/// How long before the first window setup may take (the window opens on a whole
/// minute, so 45 to 105 s after the test starts; a loaded machine may take most of it).
const LEAD: u64 = 45;

/// `secs` (unix, UTC) as `HH:MM`.
fn hhmm(secs: u64) -> String {
    format!("{:02}:{:02}", secs % 86_400 / 3600, secs % 3600 / 60)
}

/// `secs` (unix) as RFC 3339 in UTC, whole seconds (as the server writes it).
fn rfc3339(secs: u64) -> String {
    // Civil from days (H. Hinnant's algorithm).
    let days = (secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let t = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

fn agent(port: u16, home: &Path) -> Value {
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    admin_agents(port, TOKEN)
        .into_iter()
        .find(|a| a["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{} is not listed", home.display()))
}

/// When the agent's log says it was refused and started updating (unix seconds).
fn updating_since(home: &Path) -> Option<f64> {
    read_file(&home.join("logs/agent.log"))
        .lines()
        .find(|l| l.contains(&format!("expects {NEW}; updating")))
        .and_then(log_time)
}

/// When the agent's log says it downloaded and verified the release ahead of its window.
fn downloaded_ahead(home: &Path) -> Option<f64> {
    read_file(&home.join("logs/agent.log"))
        .lines()
        .find(|l| {
            l.contains(&format!(
                "downloaded and verified {NEW} ahead of its maintenance window"
            ))
        })
        .and_then(log_time)
}

/// The bytes the agent's update fetched once it was told (the download after its
/// `updating` line): none when it had the bundle ahead.
fn fetched_when_told(home: &Path) -> Option<u64> {
    read_file(&home.join("logs/agent.log"))
        .lines()
        .skip_while(|l| !l.contains(&format!("expects {NEW}; updating")))
        .find_map(|l| {
            let (_, rest) = l.split_once("downloaded ")?;
            let (n, _) = rest.split_once(" bytes in ")?;
            n.parse().ok()
        })
}

fn wrapper(home: &Path, what: &str) {
    run_ok(Command::new(home.join("current/bin/agent-wrapper.sh")).arg(what));
}

fn wait_clock(until: u64) {
    wait_until(
        Duration::from_secs(until.saturating_sub(now_secs()) + 5),
        "the clock",
        || now_secs() >= until,
    );
}

/// A server with `windows` (server.toml text), and agents of 1.0.0 in `groups` that
/// hold long polls at the default 30 s heartbeat, registered under 1.0.0's rollout.
fn windowed_fleet(
    ctx: &TestContext,
    windows: &str,
    groups: &[&str],
) -> (ServerProc, Vec<PathBuf>, PathBuf) {
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let config = ctx.path("server.toml");
    fs::write(&config, windows).unwrap();
    let config = config.display().to_string();
    let server = ctx.server_with(
        "srv",
        free_port(),
        &["--config", &config],
        &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)],
    );
    ctx.publish_served(&server, &b1);
    e2e::wait_rollout(&server, TOKEN, LONG, "the rollout of 1.0.0", |r| {
        r["version"] == OLD && r["state"] == "completed"
    });
    // The default 30 s heartbeat (from the environment: it outranks agent.toml).
    let env = "export AGENT_AGENT_HEARTBEAT=30s\nexport AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=60s\n";
    let mut homes = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        let home = ctx.install(&b1, &format!("fleet/{i}"));
        let extra = format!("group = \"{group}\"\nlong-poll = true\n");
        configure_agent(&home, &[server.url("")], &extra);
        fs::write(home.join("conf/agent-env.sh"), env).unwrap();
        homes.push(home);
    }
    e2e::start_wrappers(&homes);
    wait_until(LONG, "the agents to register on 1.0.0", || {
        let on_old = |a: &Value| a["version"] == OLD;
        admin_agents(server.port, TOKEN)
            .iter()
            .filter(|a| on_old(a))
            .count()
            == groups.len()
    });
    (server, homes, b2)
}

#[test]
fn agents_wait_for_their_window_install_when_it_opens_and_late_arrivers_catch_up() {
    let ctx = TestContext::new();
    // The first whole minute at least LEAD seconds away; a second window two minutes on.
    let opens = (now_secs() + LEAD).div_ceil(60) * 60;
    let second = opens + 120;
    let windows = format!(
        r#"
[[maintenance]]
groups = ["db"]
start = "{a}"
duration = "1m"
timezone = "UTC"

[[maintenance]]
groups = ["db"]
start = "{b}"
duration = "1m"

[[maintenance]]
groups = ["eager"]
start = "{a}"
duration = "60s"
catch-up = "at-once"
"#,
        a = hhmm(opens),
        b = hhmm(second),
    );
    let (server, homes, b2) = windowed_fleet(&ctx, &windows, &["db", "db", "db", "eager"]);
    let (on_time, late_db, late_eager) = (&homes[..2], &homes[2], &homes[3]);
    // The late arrivers are away through the first window.
    wrapper(late_db, "stop");
    wrapper(late_eager, "stop");
    assert!(
        now_secs() + 5 < opens,
        "setup took too long: the window opens at {opens}, it is {}",
        now_secs()
    );

    ctx.republish(&server, &b2);
    let waiting = format!("next window opens at {}", rfc3339(opens));
    wait_until(LONG, "the on-time agents to wait for their window", || {
        on_time.iter().all(|h| {
            let a = agent(server.port, h);
            a["update_status"] == "WAITING_WINDOW" && a["update_error"] == waiting.as_str()
        })
    });
    // On the machine, `agent status` and `agent update --check` say it too, with the
    // opening the server named (issue 59: they said nothing, and "would install").
    let opening = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(opens));
    let said = |args: &[&str]| {
        String::from_utf8(
            e2e::run_ok(Command::new(on_time[0].join("current/bin/agent")).args(args)).stdout,
        )
        .unwrap()
    };
    wait_until(LONG, "agent status to name the window", || {
        said(&["status"]).contains(&format!(
            "waits for this machine's maintenance window: it opens {opening}"
        ))
    });
    let check = said(&["update", "--check"]);
    assert!(check.contains(&format!("it opens {opening}")), "{check}");
    // Counted in /metrics like every update status.
    let by_status = "agentupdate_agents_by_update_status{status=\"WAITING_WINDOW\"}";
    assert_eq!(e2e::metric(&server, by_status), 2.0);
    // The windows and their next openings.
    let (status, listed) = admin_call(&server, TOKEN, "GET", "/admin/maintenance", "");
    assert_eq!(status, 200, "{listed}");
    let listed = listed["windows"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(listed[0]["next_opening"], opens, "{listed:?}");
    assert_eq!(listed[1]["next_opening"], second, "{listed:?}");
    assert_eq!(listed[2]["catch_up"], "at-once", "{listed:?}");
    assert_eq!(listed[0]["open"], false, "{listed:?}");

    // The release is downloaded and verified ahead (update.download-ahead, the default).
    wait_until(LONG, "the on-time agents to download ahead", || {
        on_time.iter().all(|h| downloaded_ahead(h).is_some())
    });
    for h in on_time {
        let at = downloaded_ahead(h).unwrap_or_default();
        assert!(
            at < opens as f64,
            "{} downloaded at {at}, not ahead of {opens}",
            h.display()
        );
    }
    // Nothing installs before the opening.
    while now_secs() + 1 < opens {
        for h in on_time {
            assert_eq!(
                agent(server.port, h)["version"],
                OLD,
                "{} updated early",
                h.display()
            );
            assert!(
                updating_since(h).is_none(),
                "{} started updating before its window",
                h.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Both install within seconds of the opening, told by their held long polls.
    wait_until(
        LONG,
        "the on-time agents to install in their window",
        || {
            on_time
                .iter()
                .all(|h| agent(server.port, h)["update_status"] == "INSTALLED")
        },
    );
    for h in on_time {
        let a = agent(server.port, h);
        assert_eq!(a["version"], NEW, "{a}");
        let began = updating_since(h).expect("no updating line");
        assert!(
            began >= opens as f64 - 0.5 && began <= opens as f64 + 10.0,
            "{} began updating at {began}, the window opened at {opens}",
            h.display()
        );
        assert_eq!(
            fetched_when_told(h),
            Some(0),
            "{}: the update at the opening downloaded again",
            h.display()
        );
    }

    // The late arrivers come back after the first window closed.
    wait_clock(opens + 61);
    wrapper(late_db, "start");
    wrapper(late_eager, "start");
    // catch-up = "at-once": at once.
    wait_until(LONG, "the at-once late arriver to install", || {
        agent(server.port, late_eager)["update_status"] == "INSTALLED"
    });
    assert!(
        now_secs() < second,
        "the at-once late arriver waited for the next window"
    );
    // next-window: it waits for the second window.
    let next = format!("next window opens at {}", rfc3339(second));
    wait_until(LONG, "the next-window late arriver to wait", || {
        let a = agent(server.port, late_db);
        a["update_status"] == "WAITING_WINDOW" && a["update_error"] == next.as_str()
    });
    assert_eq!(agent(server.port, late_db)["version"], OLD);
    wait_until(
        LONG,
        "the late arriver to install in the next window",
        || agent(server.port, late_db)["update_status"] == "INSTALLED",
    );
    let began = updating_since(late_db).expect("no updating line");
    assert!(
        began >= second as f64 - 0.5,
        "{} began updating at {began}, before its next window at {second}",
        late_db.display()
    );
    let done = e2e::wait_rollout(&server, TOKEN, LONG, "the rollout to complete", |r| {
        r["version"] == NEW && r["state"] == "completed"
    });
    assert_eq!(done["waves"][0]["failed"], 0, "{done}");
    assert_eq!(done["waves"][0]["timed_out"], 0, "{done}");
}

#[test]
fn a_bad_maintenance_window_stops_the_server_naming_the_key() {
    let ctx = TestContext::new();
    for (table, key, words) in [
        (
            "days = [\"mon\", \"funday\"]\nstart = \"02:00\"\nduration = \"3h\"",
            "maintenance.days",
            "funday",
        ),
        (
            "start = \"25:00\"\nduration = \"3h\"",
            "maintenance.start",
            "25:00",
        ),
        (
            "start = \"02:00\"\nduration = \"3h\"\ntimezone = \"Mars/Olympus_Mons\"",
            "maintenance.timezone",
            "Mars/Olympus_Mons",
        ),
        (
            "start = \"02:00\"\nduration = \"0m\"",
            "maintenance.duration",
            "duration",
        ),
    ] {
        let file = ctx.path("bad.toml");
        fs::write(&file, format!("[[maintenance]]\n{table}\n")).unwrap();
        let home = ctx.path("bad-home");
        let text = run_fails(
            ctx.cmd("update-server")
                .arg("--config")
                .arg(&file)
                .arg("--listen")
                .arg(format!("127.0.0.1:{}", free_port()))
                .arg("--home")
                .arg(&home),
            1,
        );
        assert!(
            text.contains(key) && text.contains(words) && text.contains("bad.toml"),
            "{table}: {text}"
        );
        // Nothing started: not even its home was made.
        assert!(
            !home.exists(),
            "{} appeared for a bad config",
            home.display()
        );
    }
}

/// fleet-sim's agents behave as real ones at a window: told the release and the opening,
/// they fetch it ahead (the server's bytes are all sent before the opening), nothing
/// installs early, and all install when the server wakes their held connects.
#[test]
fn fleet_sim_agents_fetch_ahead_of_their_window_and_install_when_it_opens() {
    const AGENTS: u64 = 20;
    let ctx = TestContext::new();
    let opens = (now_secs() + LEAD).div_ceil(60) * 60;
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let config = ctx.path("server.toml");
    let window = format!(
        "[[maintenance]]\ngroups = [\"db\"]\nstart = \"{}\"\nduration = \"10m\"\n",
        hhmm(opens)
    );
    fs::write(&config, window).unwrap();
    let config = config.display().to_string();
    let server = ctx.server_with(
        "srv",
        free_port(),
        &["--config", &config],
        &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)],
    );
    ctx.publish_served(&server, &b1);
    let summary = ctx.path("sim.json");
    let mut sim = ctx.cmd("fleet-sim");
    sim.args(["--server", &server.url(""), "--agents", &AGENTS.to_string()])
        .args(["--group", "db=1", "--long-poll", "--heartbeat", "30s"])
        .args(["--ramp", "1s", "--install-time", "1s", "--download", "full"])
        .args(["--deltas", "--until-rollout-end", "--token", TOKEN])
        .args(["--duration", "240s", "--json"])
        .arg(&summary)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let pid = ctx.spawn(sim);
    wait_until(LONG, "the simulated agents to register", || {
        admin_agents(server.port, TOKEN).len() as u64 == AGENTS
    });
    ctx.republish(&server, &b2);
    assert!(
        now_secs() + 10 < opens,
        "setup took too long: the window opens at {opens}, it is {}",
        now_secs()
    );
    let sent = || {
        e2e::metric(&server, "agentupdate_bytes_sent_total{kind=\"bundle\"}")
            + e2e::metric(&server, "agentupdate_bytes_sent_total{kind=\"delta\"}")
    };
    wait_until(
        LONG,
        "the simulated agents to wait for their window",
        || {
            let agents = admin_agents(server.port, TOKEN);
            agents
                .iter()
                .all(|a| a["update_status"] == "WAITING_WINDOW" && a["version"] == OLD)
        },
    );
    // Fetched ahead: the bytes stop growing before the opening.
    wait_until(LONG, "the fetches ahead", || sent() > 0.0);
    let mut before = sent();
    while now_secs() + 2 < opens {
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            admin_agents(server.port, TOKEN)
                .iter()
                .all(|a| a["version"] == OLD),
            "an agent updated before its window"
        );
        before = sent();
    }
    wait_until(LONG, "fleet-sim to finish", || e2e::pid_gone(pid));
    let report: Value = serde_json::from_str(&read_file(&summary)).unwrap();
    assert_eq!(report["rollout"]["state"], "completed", "{report}");
    assert_eq!(report["versions"][NEW], AGENTS, "{report}");
    assert_eq!(report["ahead_taken"], AGENTS, "{report}");
    let ahead = report["ahead_bytes"].as_u64().unwrap();
    assert!(ahead > 0, "{report}");
    assert_eq!(
        ahead,
        report["bundle_bytes"].as_u64().unwrap() + report["delta_bytes"].as_u64().unwrap(),
        "every byte was fetched ahead: {report}"
    );
    assert_eq!(sent(), before, "the server sent bytes after the opening");
    let ended = report["rollout"]["ended_at"].as_f64().unwrap();
    assert!(
        ended >= opens as f64,
        "the rollout ended at {ended}, before the window opened at {opens}"
    );
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
}
