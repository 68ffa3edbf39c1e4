//! Remote configuration of a real fleet: real agents running Debian's node exporter as
//! their workload (docs/workload.md, "Configuring the fleet"), a real update-server, sets
//! pushed as an operator would. A set turning on the exporter's basic auth reaches every
//! agent and is seen from outside (`/metrics` asks for a password); a group's set reaches
//! only that group; a set the exporter cannot start with is refused in the exporter's own
//! words, undone, and halts its config rollout after the first wave; an agent killed at
//! random moments of applying always comes back on one complete set with one exporter.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, configure_agent, free_port, http, http_with_body,
    pid_gone, read_file, require_tool, run_ok, signal, start_wrappers, wait_until,
};
use serde_json::{Value, json};

use crate::update::{QUICK, WAIT, agents_running, health};

const NODE_EXPORTER: &str = "/usr/bin/prometheus-node-exporter";
const USER: &str = "prometheus";
const PASSWORD: &str = "fleet-secret";
/// bcrypt of [`PASSWORD`], cost 4 so that each scrape is quick; made once with
/// `python3 -c 'import crypt; print(crypt.crypt("fleet-secret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))'`
/// (`htpasswd -nbBC 10 "" fleet-secret` gives one of cost 10).
const BCRYPT: &str = "$2b$04$0wV1JN8muwt0agVidAw8zeZmxxVycaPx7ojN7iNk93ssQ4dxswVLy";
/// The web configuration the distribution ships: no TLS, no authentication.
const OPEN: &str = "# no TLS, no authentication: anyone may scrape\n";
/// A line of the textfile collector's file that the distribution ships.
const SITE: &str = "fleet_site{site=\"lab\"} 1\n";

fn basic_auth() -> String {
    let pair = format!("{USER}:{PASSWORD}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn web_config_with_auth() -> String {
    format!("basic_auth_users:\n  {USER}: {BCRYPT}\n")
}

/// The `[workload]` of that example: the exporter reads its web configuration and
/// its textfile metrics from `config-dir`. Healthy while it answers at all, `200` or `401`:
/// a set may turn authentication on.
fn workload_toml(port: u16) -> String {
    format!(
        r#"
[workload]
command = ["bin/node_exporter", "--web.listen-address=127.0.0.1:{port}", "--web.config.file={{config_dir}}/web-config.yml", "--collector.disable-defaults", "--collector.textfile", "--collector.textfile.directory={{config_dir}}"]
health-command = ["/bin/sh", "-c", "curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/metrics | grep -qx -e 200 -e 401"]
start-timeout = "10s"
stop-timeout = "5s"
"#
    )
}

struct Agent {
    home: PathBuf,
    port: u16,
    id: String,
}

struct Fleet {
    ctx: TestContext,
    server: ServerProc,
    agents: Vec<Agent>,
}

/// A server (admin token [`TOKEN`], `server_env` added) publishing a bundle that carries
/// the node exporter, and one installed agent per entry of `groups` (its `agent.group`),
/// each with its exporter on a port of its own; all started and registered, their
/// exporters answering.
fn fleet(groups: &[&str], server_env: &[(&str, &str)]) -> Fleet {
    require_tool("prometheus-node-exporter");
    require_tool("curl");
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let dist = ctx.dist("d1");
    fs::copy(NODE_EXPORTER, dist.join("bin/node_exporter")).unwrap();
    let workload = dist.join("conf.default/workload");
    fs::create_dir_all(&workload).unwrap();
    fs::write(workload.join("web-config.yml"), OPEN).unwrap();
    fs::write(workload.join("site.prom"), SITE).unwrap();
    let bundle = ctx.pack(&dist, "1.0.0", "1", &key, "b1");
    let mut env = vec![("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)];
    env.extend_from_slice(server_env);
    let server = ctx.server("srv", &env);
    ctx.publish_served(&server, &bundle);
    let agents: Vec<Agent> = groups
        .iter()
        .enumerate()
        .map(|(i, group)| {
            let home = ctx.install(&bundle, &format!("p{i}"));
            let port = free_port();
            fs::write(home.join("conf/agent-env.sh"), QUICK).unwrap();
            configure_agent(
                &home,
                &[server.url("")],
                &format!("group = {group:?}\n{}", workload_toml(port)),
            );
            Agent {
                home,
                port,
                id: String::new(),
            }
        })
        .collect();
    let homes: Vec<PathBuf> = agents.iter().map(|a| a.home.clone()).collect();
    start_wrappers(&homes);
    let mut fleet = Fleet {
        ctx,
        server,
        agents,
    };
    for i in 0..fleet.agents.len() {
        let home = fleet.agents[i].home.clone();
        wait_until(WAIT, "the agent to have an id", || {
            !read_file(&home.join("data/agent-id")).trim().is_empty()
        });
        fleet.agents[i].id = read_file(&home.join("data/agent-id")).trim().to_owned();
        fleet.wait_scrape(i, None, 200);
    }
    wait_until(WAIT, "every agent to register", || {
        fleet.agents.iter().all(|a| fleet.row(a).is_some())
    });
    fleet
}

impl Fleet {
    fn row(&self, agent: &Agent) -> Option<Value> {
        admin_agents(self.server.port, TOKEN)
            .into_iter()
            .find(|r| r["id"] == agent.id.as_str())
    }

    /// Pushes `files` as the set of `group` with `update-server config push`; its hash.
    fn push(&self, group: &str, name: &str, files: &[(&str, &str)]) -> String {
        let dir = self.ctx.path(name);
        fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            fs::write(dir.join(file), text).unwrap();
        }
        let out = run_ok(
            self.ctx
                .cmd("update-server")
                .args(["config", "push", "--group", group])
                .arg(&dir)
                .args(["--server", &self.server.url(""), "--token", TOKEN, "--json"]),
        );
        let pushed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(pushed["group"], group, "{pushed}");
        pushed["hash"].as_str().unwrap().to_owned()
    }

    /// `GET /admin/config`'s set for `group`.
    fn config_set(&self, group: &str) -> Value {
        let auth = format!("Bearer {TOKEN}");
        let answer = http(
            self.server.port,
            "GET",
            "/admin/config",
            &[("Authorization", &auth)],
        )
        .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        let all: Value = serde_json::from_slice(&answer.body).unwrap();
        all["sets"]
            .as_array()
            .and_then(|sets| sets.iter().find(|s| s["group"] == group).cloned())
            .unwrap_or_else(|| panic!("no set for {group} in {all}"))
    }

    fn wait_applied(&self, which: &[usize], hash: &str) {
        let start = Instant::now();
        loop {
            let last: Vec<Option<Value>> =
                which.iter().map(|&i| self.row(&self.agents[i])).collect();
            if last.iter().all(|r| {
                r.as_ref()
                    .is_some_and(|r| r["config_status"] == "APPLIED" && r["config_hash"] == hash)
            }) {
                return;
            }
            assert!(
                start.elapsed() < WAIT,
                "agents {which:?} never listed {hash} APPLIED; rows {last:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until agent `i`'s exporter answers `/metrics` with `status` (given
    /// `authorization`), and its agent reports the workload healthy.
    fn wait_scrape(&self, i: usize, authorization: Option<&str>, status: u16) -> String {
        let agent = &self.agents[i];
        let start = Instant::now();
        loop {
            let headers: Vec<(&str, &str)> = authorization
                .map(|a| ("Authorization", a))
                .into_iter()
                .collect();
            let last = match http(agent.port, "GET", "/metrics", &headers) {
                Ok(a)
                    if a.status == status && health(&agent.home)["workload"]["healthy"] == true =>
                {
                    return a.text();
                }
                Ok(a) => format!(
                    "{} {}",
                    a.status,
                    a.text().chars().take(200).collect::<String>()
                ),
                Err(e) => e.to_string(),
            };
            assert!(
                start.elapsed() < WAIT,
                "agent {i}'s exporter never answered {status}; last {last}\n{}",
                e2e::agent_logs(&agent.home)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until agent `i` has been in contact with the server `n` more times.
    fn wait_contacts(&self, i: usize, n: u64) {
        let home = &self.agents[i].home;
        let contact = || health(home)["last_contact"].as_u64().unwrap_or(0);
        let seen = contact();
        wait_until(WAIT, "more contacts with the server", || {
            contact() >= seen + n
        });
    }

    fn logs(&self) -> String {
        self.agents
            .iter()
            .map(|a| {
                format!(
                    "=== {} ({})\n{}",
                    a.id,
                    a.home.display(),
                    e2e::agent_logs(&a.home)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn stop(&self) {
        for a in &self.agents {
            run_ok(
                std::process::Command::new(a.home.join("current/bin/agent-wrapper.sh")).arg("stop"),
            );
        }
    }
}
/// The regular files of `dir`, or `None` when it is missing.
fn set_in(dir: &Path) -> Option<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir).ok()?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            files.insert(
                entry.file_name().to_string_lossy().into_owned(),
                fs::read_to_string(entry.path()).unwrap_or_default(),
            );
        }
    }
    Some(files)
}

fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Live node exporters started from this installation.
fn exporters(home: &Path) -> Vec<u32> {
    e2e::pids_mentioning(&home.join("conf/workload"))
        .into_iter()
        .filter(|pid| !pid_gone(*pid))
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.ends_with("bin/node_exporter"))
        })
        .collect()
}

fn leftovers(home: &Path) -> Vec<String> {
    fs::read_dir(home.join("conf"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".workload"))
        .collect()
}

#[test]
fn a_set_for_default_turns_on_basic_auth_on_every_real_exporter() {
    let fleet = fleet(&["", "", ""], &[]);
    let set = [
        ("web-config.yml", web_config_with_auth()),
        (
            "site.prom",
            format!("{SITE}fleet_config_set{{set=\"auth\"}} 1\n"),
        ),
    ];
    let set: Vec<(&str, &str)> = set.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let hash = fleet.push("default", "auth", &set);
    fleet.wait_applied(&[0, 1, 2], &hash);

    let auth = basic_auth();
    let wrong = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:not-it"))
    );
    for (i, agent) in fleet.agents.iter().enumerate() {
        let body = fleet.wait_scrape(i, Some(&auth), 200);
        assert!(
            body.contains("fleet_config_set{set=\"auth\"} 1") && body.contains("fleet_site"),
            "agent {i}'s exporter does not read the set's textfile: {}",
            body.lines()
                .filter(|l| l.starts_with("fleet"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let open = http(agent.port, "GET", "/metrics", &[]).unwrap();
        assert_eq!(open.status, 401, "agent {i} answers without the password");
        let refused = http(agent.port, "GET", "/metrics", &[("Authorization", &wrong)]).unwrap();
        assert_eq!(refused.status, 401, "agent {i} takes a wrong password");
        assert_eq!(
            set_in(&agent.home.join("conf/workload")),
            Some(files(&set)),
            "agent {i}"
        );
        assert_eq!(
            read_file(&agent.home.join("conf/workload.prev/web-config.yml")),
            OPEN,
            "agent {i} keeps the set before"
        );
        assert_eq!(read_file(&agent.home.join("data/config-hash")).trim(), hash);
        assert_eq!(exporters(&agent.home).len(), 1, "agent {i}: one exporter");
        let row = fleet.row(agent).unwrap();
        assert_eq!(row["config_status"], "APPLIED", "{row}");
        assert_eq!(row["config_hash"], json!(hash), "{row}");
    }
    // The rollout completes at the server's next look after the last APPLIED.
    wait_until(WAIT, "the config rollout to complete", || {
        fleet.config_set("default")["rollout"]["state"] == "completed"
    });
    let set = fleet.config_set("default");
    assert_eq!(set["applied"], 3, "{set}");
    assert_eq!(set["rollout"]["state"], "completed", "{set}");
    fleet.stop();
}

#[test]
fn a_set_for_canary_reaches_only_the_canary_agents() {
    let fleet = fleet(&["canary", "", ""], &[]);
    let web = web_config_with_auth();
    let set = [("web-config.yml", web.as_str()), ("site.prom", SITE)];
    let hash = fleet.push("canary", "canary", &set);
    fleet.wait_applied(&[0], &hash);
    fleet.wait_scrape(0, None, 401);
    fleet.wait_scrape(0, Some(&basic_auth()), 200);
    assert_eq!(
        set_in(&fleet.agents[0].home.join("conf/workload")),
        Some(files(&set))
    );

    // The others hear of it at none of their contacts.
    for i in 1..3 {
        fleet.wait_contacts(i, 3);
    }
    for i in 1..3 {
        let agent = &fleet.agents[i];
        let row = fleet.row(agent).unwrap();
        assert_eq!(row["group"], "", "{row}");
        assert_eq!(
            row["config_hash"], "",
            "agent {i} was sent the canary set: {row}"
        );
        assert_ne!(row["config_status"], "APPLIED", "{row}");
        assert_ne!(row["config_status"], "APPLYING", "{row}");
        assert_eq!(
            set_in(&agent.home.join("conf/workload")),
            Some(files(&[("web-config.yml", OPEN), ("site.prom", SITE)])),
            "agent {i}'s configuration changed"
        );
        assert!(!agent.home.join("conf/workload.prev").exists(), "agent {i}");
        let open = http(agent.port, "GET", "/metrics", &[]).unwrap();
        assert_eq!(open.status, 200, "agent {i} asks for a password");
    }
    assert_eq!(fleet.row(&fleet.agents[0]).unwrap()["group"], "canary");
    let set = fleet.config_set("canary");
    assert_eq!(set["applied"], 1, "{set}");
    assert_eq!(set["rollout"]["waves"][0]["agents"], 1, "{set}");
    fleet.stop();
}

#[test]
fn a_set_the_exporter_cannot_start_with_fails_in_its_words_and_halts_after_wave_one() {
    let fleet = fleet(
        &["", "", ""],
        &[
            ("UPDATE_SERVER_ROLLOUT_WAVES", "1,100%"),
            ("UPDATE_SERVER_ROLLOUT_MAX_FAILURES", "0"),
        ],
    );
    let web = web_config_with_auth();
    let good = [("web-config.yml", web.as_str()), ("site.prom", SITE)];
    let good_hash = fleet.push("default", "good", &good);
    fleet.wait_applied(&[0, 1, 2], &good_hash);

    let bad = [
        ("web-config.yml", "basic_auth_users: [\n"),
        ("site.prom", SITE),
    ];
    let bad_hash = fleet.push("default", "bad", &bad);
    let mut failed = None;
    wait_until(
        WAIT,
        "the first wave's agent to report the set FAILED",
        || {
            failed = (0..3).find(|&i| {
                fleet
                    .row(&fleet.agents[i])
                    .is_some_and(|r| r["config_status"] == "FAILED")
            });
            failed.is_some()
        },
    );
    let failed = failed.unwrap();
    let row = fleet.row(&fleet.agents[failed]).unwrap();
    let error = row["config_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("did not find expected node content"),
        "FAILED without the exporter's own words: {row}\n{}",
        fleet.logs()
    );
    wait_until(WAIT, "the config rollout to halt", || {
        fleet.config_set("default")["rollout"]["state"] == "halted"
    });
    let set = fleet.config_set("default");
    assert_eq!(set["hash"], json!(bad_hash), "{set}");
    assert_eq!(
        set["rollout"]["wave"], 1,
        "halted after its first wave: {set}"
    );
    assert!(
        set["rollout"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&fleet.agents[failed].id) && r.contains("FAILED")),
        "{set}"
    );

    // The failed agent runs the good set again: its exporter asks for the password.
    let home = &fleet.agents[failed].home;
    fleet.wait_scrape(failed, Some(&basic_auth()), 200);
    assert_eq!(
        http(fleet.agents[failed].port, "GET", "/metrics", &[])
            .unwrap()
            .status,
        401
    );
    assert_eq!(set_in(&home.join("conf/workload")), Some(files(&good)));
    assert_eq!(read_file(&home.join("data/config-hash")).trim(), good_hash);
    assert_eq!(read_file(&home.join("data/config-failed")).trim(), bad_hash);
    assert!(leftovers(home).is_empty(), "{:?}", leftovers(home));
    assert_eq!(
        exporters(home).len(),
        1,
        "one exporter\n{}",
        e2e::agent_logs(home)
    );

    // The others, outside the first wave, are never told.
    for i in (0..3).filter(|&i| i != failed) {
        fleet.wait_contacts(i, 3);
    }
    for i in (0..3).filter(|&i| i != failed) {
        let agent = &fleet.agents[i];
        let row = fleet.row(agent).unwrap();
        assert_eq!(row["config_status"], "APPLIED", "agent {i}: {row}");
        assert_eq!(row["config_hash"], json!(good_hash), "agent {i}: {row}");
        assert_eq!(
            set_in(&agent.home.join("conf/workload")),
            Some(files(&good))
        );
        assert!(!agent.home.join("data/config-failed").exists(), "agent {i}");
        assert!(
            !read_file(&agent.home.join("logs/workload.log")).contains("did not find expected"),
            "agent {i} tried the bad set"
        );
    }
    fleet.stop();
}

/// A small seeded generator: the test prints its seed, and `CONFIG_KILL_SEED` replays it.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn an_agent_killed_at_random_moments_of_applying_keeps_one_complete_set_and_one_exporter() {
    let fleet = fleet(&[""], &[]);
    let agent = &fleet.agents[0];
    let home = &agent.home;
    let seed = std::env::var("CONFIG_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("seed {seed} (CONFIG_KILL_SEED={seed} replays it)");
    let mut rng = XorShift(seed);
    let mut before = set_in(&home.join("conf/workload")).unwrap();
    let auth = basic_auth();
    for round in 0..8 {
        let web = if round % 2 == 0 {
            web_config_with_auth()
        } else {
            OPEN.to_owned()
        };
        let site = format!("{SITE}fleet_config_round {round}\n");
        let new = files(&[("web-config.yml", &web), ("site.prom", &site)]);
        let body = serde_json::to_vec(&json!({ "files": new })).unwrap();
        let bearer = format!("Bearer {TOKEN}");
        let answer = http_with_body(
            fleet.server.port,
            "PUT",
            "/admin/config/default",
            &[
                ("Authorization", &bearer),
                ("Content-Type", "application/json"),
            ],
            &body,
        )
        .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        let hash = serde_json::from_slice::<Value>(&answer.body).unwrap()["hash"]
            .as_str()
            .unwrap()
            .to_owned();
        // A random moment of the apply (learning, writing, swapping, restarting the
        // exporter, waiting for it), not a synchronisation: on this machine the agent
        // hears of the set at once (a long poll) and has applied it within ~40 ms.
        let delay = Duration::from_millis(rng.next() % 40);
        std::thread::sleep(delay);
        let agents = agents_running(home);
        for pid in &agents {
            signal(*pid, "KILL");
        }
        // Where the apply was, for the record: written beside, swapped in, or done.
        let phase = if read_file(&home.join("data/config-hash")).trim() == hash {
            "applied"
        } else if home.join("data/config-applying").exists() {
            "swapped in, waiting for the exporter"
        } else if !leftovers(home).is_empty() {
            "writing or checking the new set"
        } else {
            "not started"
        };
        let at_kill = set_in(&home.join("conf/workload"));
        eprintln!("round {round}: killed {agents:?} {delay:?} after the push: {phase}");
        assert!(
            at_kill.as_ref() == Some(&before) || at_kill.as_ref() == Some(&new),
            "round {round} (seed {seed}): config-dir right after the kill is neither set: {at_kill:?}"
        );

        // The wrapper's supervisor starts a new agent; it mends and applies the set.
        wait_until(WAIT, "a new agent to run and say so", || {
            let now = agents_running(home);
            let said = health(home)["pid"].as_u64().unwrap_or(0) as u32;
            now.len() == 1 && now[0] == said && !agents.contains(&said)
        });
        fleet.wait_applied(&[0], &hash);
        let want = if round % 2 == 0 {
            fleet.wait_scrape(0, Some(&auth), 200)
        } else {
            fleet.wait_scrape(0, None, 200)
        };
        assert!(
            want.contains(&format!("fleet_config_round {round}")),
            "round {round} (seed {seed}): the exporter does not read the new set"
        );
        assert_eq!(
            set_in(&home.join("conf/workload")),
            Some(new.clone()),
            "round {round} (seed {seed})"
        );
        assert_eq!(
            set_in(&home.join("conf/workload.prev")),
            Some(before.clone()),
            "round {round} (seed {seed}): workload.prev is not the set before"
        );
        assert!(
            leftovers(home).is_empty(),
            "round {round}: {:?}",
            leftovers(home)
        );
        let running = exporters(home);
        assert_eq!(
            running.len(),
            1,
            "round {round} (seed {seed}): exporters {running:?}\n{}",
            e2e::agent_logs(home)
        );
        assert_eq!(agents_running(home).len(), 1, "round {round}");
        before = new;
    }
    fleet.stop();
}
