//! Configuring a fleet of real agents whose workload is Debian's node exporter, as the
//! README's "Configuring the fleet" does: a set carrying the exporter's
//! `--web.config.file` turns on basic auth, observable from outside (`/metrics` answers
//! 401 without the password); a set for group `canary` reaches only the canary agent;
//! a set the exporter cannot run with is refused with the exporter's own words, the
//! fleet stays on the good set and the config rollout halts after its first wave; and
//! an agent SIGKILLed at random moments of applying always comes back on one complete
//! set with one exporter running.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::{
    ServerProc, TestContext, admin_agents, configure_agent, free_port, http, read_file,
    require_tool, run_ok, signal, wait_until,
};
use serde_json::Value;

use crate::update::{QUICK, TOKEN, WAIT, agents_running, start};
use crate::workload::{NODE_EXPORTER, exporters};

/// The user and password the pushed web config asks for; `HASH` is bcrypt of the
/// password (cost 10), as `htpasswd -nbB` would write it.
const USER: &str = "fleet";
const PASSWORD: &str = "fleet-secret";
const HASH: &str = "$2b$10$pp59ZJl1.QCfSuzr6oYgt.M6aDnThKhoURRgil5CDjaryr/LHBtcW";

fn auth_config(comment: &str) -> String {
    format!("# {comment}\nbasic_auth_users:\n  {USER}: {HASH}\n")
}

/// A bundle carrying the exporter as `bin/node_exporter`, its web config (empty: no
/// auth) seeded in `conf.default/workload/`.
fn exporter_bundle(ctx: &TestContext) -> PathBuf {
    require_tool("prometheus-node-exporter");
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d1");
    fs::copy(NODE_EXPORTER, dist.join("bin/node_exporter")).unwrap();
    fs::create_dir_all(dist.join("conf.default/workload")).unwrap();
    fs::write(dist.join("conf.default/workload/web-config.yml"), "").unwrap();
    ctx.pack(&dist, "1.0.0", "1", &key, "b1")
}

/// The operator's conf/agent.toml for agent `name` in `group`: its exporter on `port`
/// reading `web-config.yml` from the configuration directory, its health checked with
/// the credentials the fleet's sets turn on (an exporter without auth ignores them).
fn agent_toml(name: &str, group: &str, port: u16) -> String {
    format!(
        r#"name = "{name}"
group = "{group}"

[workload]
command = ["bin/node_exporter", "--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults", "--collector.loadavg", "--web.config.file={{config_dir}}/web-config.yml"]
health-url = "http://{USER}:{PASSWORD}@127.0.0.1:{port}/metrics"
start-timeout = "5s"
stop-timeout = "3s"
"#
    )
}

struct Agent {
    name: String,
    home: PathBuf,
    port: u16,
}

fn install(
    ctx: &TestContext,
    server: &ServerProc,
    bundle: &Path,
    name: &str,
    group: &str,
) -> Agent {
    let home = ctx.install(bundle, name);
    let port = free_port();
    fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
    configure_agent(&home, &[server.url("")], &agent_toml(name, group, port));
    start(&home);
    Agent {
        name: name.to_owned(),
        home,
        port,
    }
}

/// The status `/metrics` answers without credentials and with them (0: no answer).
fn metrics_status(port: u16) -> (u16, u16) {
    let plain = http(port, "GET", "/metrics", &[]).map_or(0, |a| a.status);
    let basic = format!(
        "Basic {}",
        base64_of(format!("{USER}:{PASSWORD}").as_bytes())
    );
    let authed =
        http(port, "GET", "/metrics", &[("Authorization", &basic)]).map_or(0, |a| a.status);
    (plain, authed)
}

fn base64_of(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn row(server: &ServerProc, name: &str) -> Option<Value> {
    admin_agents(server.port, TOKEN)
        .into_iter()
        .find(|r| r["name"] == name)
}

fn logs(agent: &Agent) -> String {
    format!(
        "--- {} workload.log:\n{}\n--- agent.log:\n{}",
        agent.name,
        read_file(&agent.home.join("logs/workload.log")),
        read_file(&agent.home.join("logs/agent.log")),
    )
}

/// Pushes `files` as group `group`'s set with the CLI; returns the set's hash.
fn push(
    ctx: &TestContext,
    server: &ServerProc,
    group: &str,
    dir: &str,
    files: &[(&str, &str)],
) -> String {
    let path = ctx.path(dir);
    fs::create_dir_all(&path).unwrap();
    for (name, body) in files {
        fs::write(path.join(name), body).unwrap();
    }
    let out = run_ok(
        ctx.cmd("update-server")
            .args(["config", "push", "--group", group])
            .arg(&path)
            .args(["--server", &server.url(""), "--token", TOKEN, "--json"]),
    );
    let pushed: Value = serde_json::from_slice(&out.stdout).unwrap();
    pushed["hash"].as_str().unwrap().to_owned()
}

fn wait_status(server: &ServerProc, agent: &Agent, hash: &str, status: &str) -> Value {
    let mut last = None;
    let start = Instant::now();
    loop {
        last = row(server, &agent.name).or(last);
        if last
            .as_ref()
            .is_some_and(|r| r["config_hash"] == hash && r["config_status"] == status)
        {
            return last.unwrap_or_default();
        }
        assert!(
            start.elapsed() < WAIT,
            "{} never {status} with {hash}; last {last:?}\n{}",
            agent.name,
            logs(agent)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_answering(agent: &Agent, want: (u16, u16)) {
    wait_until(
        WAIT,
        &format!("{}'s exporter to answer {want:?}", agent.name),
        || metrics_status(agent.port) == want,
    );
}

#[test]
fn a_fleet_of_exporters_turns_on_basic_auth_by_group_and_refuses_a_set_they_cannot_run() {
    let ctx = TestContext::new();
    let bundle = exporter_bundle(&ctx);
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    ctx.publish_served(&server, &bundle);
    let fleet: Vec<Agent> = [("edge-1", ""), ("edge-2", ""), ("canary-1", "canary")]
        .iter()
        .map(|(name, group)| install(&ctx, &server, &bundle, name, group))
        .collect();
    let (edges, canary) = (&fleet[..2], &fleet[2]);
    for a in &fleet {
        wait_answering(a, (200, 200));
        wait_until(WAIT, "the agent listed", || row(&server, &a.name).is_some());
    }

    // The canary set: basic auth on the canary agent only.
    let canary_hash = push(
        &ctx,
        &server,
        "canary",
        "canary-set",
        &[("web-config.yml", &auth_config("canary"))],
    );
    let r = wait_status(&server, canary, &canary_hash, "APPLIED");
    assert_eq!(r["config_error"], Value::Null, "{r}");
    wait_answering(canary, (401, 200));
    for a in edges {
        assert_eq!(metrics_status(a.port), (200, 200), "{}", logs(a));
        let r = row(&server, &a.name).unwrap();
        assert_ne!(r["config_hash"], canary_hash.as_str(), "{r}");
    }

    // The default set: every agent of the group, in waves, each APPLIED with the hash.
    let good = push(
        &ctx,
        &server,
        "default",
        "good-set",
        &[("web-config.yml", &auth_config("default"))],
    );
    for a in edges {
        wait_status(&server, a, &good, "APPLIED");
        wait_answering(a, (401, 200));
        assert_eq!(
            read_file(&a.home.join("conf/workload/web-config.yml")),
            auth_config("default")
        );
    }
    assert_eq!(
        row(&server, &canary.name).unwrap()["config_hash"],
        canary_hash.as_str()
    );

    // A set the exporter cannot parse: it exits at start. The first wave's agent says
    // FAILED with the exporter's words and runs the good set again; the rollout halts;
    // the other agent is never told.
    let bad = push(
        &ctx,
        &server,
        "default",
        "bad-set",
        &[("web-config.yml", "basic_auth_users: [not, a, map\n")],
    );
    // The row keeps the hash the agent runs (the good one, once it has put it back)
    // beside the outcome of the last set it was sent.
    let start = Instant::now();
    let (failed, r) = loop {
        let told: Vec<(&Agent, Value)> = edges
            .iter()
            .filter_map(|a| row(&server, &a.name).map(|r| (a, r)))
            .filter(|(_, r)| r["config_status"] == "FAILED")
            .collect();
        if let Some((a, r)) = told.into_iter().next() {
            break (a, r);
        }
        assert!(
            start.elapsed() < WAIT,
            "no agent reported the bad set {bad} FAILED: {:?}\n{}\n{}",
            admin_agents(server.port, TOKEN),
            logs(&edges[0]),
            logs(&edges[1])
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let error = r["config_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("did not find expected"),
        "the exporter's own words: {r}\n{}",
        logs(failed)
    );
    assert!(
        read_file(&failed.home.join("data/config-failed")).contains(&bad),
        "the failed hash is remembered\n{}",
        logs(failed)
    );
    wait_answering(failed, (401, 200));
    assert_eq!(
        read_file(&failed.home.join("conf/workload/web-config.yml")),
        auth_config("default"),
        "{}",
        logs(failed)
    );
    wait_until(WAIT, "the default set's config rollout halted", || {
        let auth = format!("Bearer {TOKEN}");
        let a = http(
            server.port,
            "GET",
            "/admin/config",
            &[("Authorization", &auth)],
        )
        .unwrap();
        let status: Value = serde_json::from_slice(&a.body).unwrap_or_default();
        status["sets"].as_array().is_some_and(|sets| {
            sets.iter()
                .any(|s| s["group"] == "default" && s["rollout"]["state"] == "halted")
        })
    });
    // The other agent keeps contacting the server and is never offered the bad set.
    let other = edges.iter().find(|a| a.name != failed.name).unwrap();
    let seen = row(&server, &other.name).unwrap()["last_contact"].clone();
    wait_until(
        WAIT,
        "two more contacts from the agent outside the wave",
        || row(&server, &other.name).is_some_and(|r| r["last_contact"] != seen),
    );
    let seen = row(&server, &other.name).unwrap()["last_contact"].clone();
    wait_until(WAIT, "another contact", || {
        row(&server, &other.name).is_some_and(|r| r["last_contact"] != seen)
    });
    let r = row(&server, &other.name).unwrap();
    assert_eq!(r["config_hash"], good.as_str(), "{r}");
    assert_eq!(r["config_status"], "APPLIED", "{r}");
    assert!(
        !read_file(&other.home.join("logs/agent.log")).contains(&bad[..12]),
        "{}",
        logs(other)
    );
    assert_eq!(metrics_status(other.port), (401, 200));
    for a in &fleet {
        assert_eq!(exporters(&a.home).len(), 1, "{}", logs(a));
    }
}

/// The regular files of `dir` and their contents.
fn files_of(dir: &Path) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        read_file(&e.path()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_agent_killed_at_random_moments_of_applying_keeps_one_complete_set_and_one_exporter() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    println!("seed {seed} (set E2E_KILL_SEED to repeat)");
    let mut state = std::env::var("E2E_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed)
        | 1;
    let mut next = move || {
        // xorshift64: enough to spread the moments, and repeatable from the seed.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let ctx = TestContext::new();
    let bundle = exporter_bundle(&ctx);
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    let agent = install(&ctx, &server, &bundle, "kill-1", "");
    wait_answering(&agent, (200, 200));
    let config_dir = agent.home.join("conf/workload");
    let mut sets = vec![files_of(&config_dir)];
    for round in 1..=6 {
        // Each set differs; every other one turns auth off again.
        let body = if round % 2 == 1 {
            auth_config(&format!("round {round}"))
        } else {
            format!("# round {round}: no auth\n")
        };
        let hash = push(
            &ctx,
            &server,
            "default",
            &format!("set-{round}"),
            &[("web-config.yml", &body)],
        );
        let mut files = BTreeMap::new();
        files.insert("web-config.yml".to_owned(), body);
        sets.push(files);
        // The random moment: from before the agent hears of the set to after it is
        // healthy on it (a contact a second, a restart and its check within it).
        let delay = Duration::from_millis(next() % 1500);
        std::thread::sleep(delay);
        for pid in agents_running(&agent.home) {
            signal(pid, "KILL");
        }
        wait_until(WAIT, "the killed agent gone", || {
            agents_running(&agent.home).is_empty()
        });
        // Before the wrapper starts another: one whole set, the one before or this one.
        let now = files_of(&config_dir);
        assert!(
            sets[sets.len() - 2..].contains(&now),
            "round {round} (killed after {delay:?}): config-dir holds neither set whole: {now:?}\n{}",
            logs(&agent)
        );
        // The wrapper starts a new agent, which mends what was half done and applies
        // the set again if it had not finished.
        wait_status(&server, &agent, &hash, "APPLIED");
        let want = if round % 2 == 1 {
            (401, 200)
        } else {
            (200, 200)
        };
        wait_answering(&agent, want);
        assert_eq!(
            files_of(&config_dir),
            sets[round],
            "round {round}: the set applied is the one in config-dir"
        );
        let leftovers: Vec<String> = fs::read_dir(agent.home.join("conf"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".workload.new"))
            .collect();
        assert!(leftovers.is_empty(), "round {round}: {leftovers:?}");
        assert_eq!(
            exporters(&agent.home).len(),
            1,
            "round {round}\n{}",
            logs(&agent)
        );
    }
}
