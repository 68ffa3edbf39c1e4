//! Commands and connection settings (issue 66), end to end with installed agents run by
//! their supervisor: a restart of the workload (its pid changes) and of the agent (its
//! pid changes, the next agent reports it), a credential rotation interrupted by
//! `kill -9` between the candidate and its acceptance, a refused candidate that falls
//! back, moves to a dead URL (the agent stays) and to a second server (it stays there),
//! and the same commands to OpAMP agents (hand-made protobuf: neither registry client
//! implements `ServerToAgentCommand` or `ConnectionSettingsOffers`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agent_opamp::proto::{AgentCapabilities, AgentToServer, CommandType, ServerToAgent};
use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, admin_call, agent_logs, configure_agent,
    free_port, http_with_body, pid_gone, read_file, run_ok, stdout, wait_until,
};
use prost::Message as _;

use crate::rollout::{LONG, OLD};

/// A workload that names the home in its argv, and the environment that makes the
/// supervisor quick to start a killed agent again.
const WORKLOAD: &str = "labels = { team = \"cmd\" }\n\n[workload]\ncommand = [\"/bin/sh\", \"-c\", \"while :; do sleep 1; done\", \"{home}\"]\n";

struct One {
    ctx: TestContext,
    server: ServerProc,
    home: PathBuf,
    bundle: PathBuf,
    id: String,
}

/// An agent of 1.0.0 installed, run by its wrapper against a server, registered with
/// its workload running.
fn one_agent() -> One {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    let home = ctx.install(&bundle, "p");
    configure_agent(&home, &[server.url("")], WORKLOAD);
    fs::write(
        home.join("conf/agent-env.sh"),
        "export AGENT_RESTART_BACKOFF_MAX=1\n",
    )
    .unwrap();
    crate::update::start(&home);
    wait_until(LONG, "the agent to register with its workload", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == OLD)
            && pid_of(&home, "run/workload.pid").is_some()
    });
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    One {
        ctx,
        server,
        home,
        bundle,
        id,
    }
}

impl Drop for One {
    fn drop(&mut self) {
        let _ = Command::new(self.home.join("current/bin/agent-wrapper.sh"))
            .arg("stop")
            .output();
    }
}

fn pid_of(home: &Path, file: &str) -> Option<u32> {
    read_file(&home.join(file))
        .trim()
        .parse()
        .ok()
        .filter(|pid| !pid_gone(*pid))
}

fn row(server: &ServerProc, id: &str) -> serde_json::Value {
    admin_agents(server.port, TOKEN)
        .into_iter()
        .find(|a| a["id"] == id)
        .unwrap_or_default()
}

fn cli(ctx: &TestContext, server: &ServerProc, args: &[&str]) -> Command {
    e2e::admin_cmd(ctx, server, TOKEN, args)
}

/// Waits until the agent's last command is `id` and ended; returns its row.
fn wait_command(one: &One, server: &ServerProc, id: &str) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let ended =
        |c: &serde_json::Value| c["id"] == id && (c["status"] == "DONE" || c["status"] == "FAILED");
    let start = Instant::now();
    while start.elapsed() < LONG {
        last = row(server, &one.id)["last_command"].clone();
        if ended(&last) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "command {id} never ended; last {last}\n{}\n--- server.log:\n{}",
        agent_logs(&one.home),
        read_file(&server.home.join("server.log"))
    );
}

/// A call on an agent route with `token` as the agent's bearer: its status.
fn register_with(server: &ServerProc, id: &str, token: &str) -> u16 {
    let body = format!(r#"{{"id":"{id}","name":"h","platform":"x86_64-unknown-linux-gnu"}}"#);
    e2e::agent_post(server, "/agent/connect", OLD, Some(token), &body).status
}

#[test]
fn a_restart_of_the_workload_changes_its_pid_and_one_of_the_agent_changes_the_agents() {
    let one = one_agent();
    let row0 = row(&one.server, &one.id);
    assert_eq!(
        row0["capabilities"],
        serde_json::json!(["restart", "rotate-credentials", "move", "telemetry"]),
        "{row0}"
    );
    assert_eq!(row0["endpoint"], one.server.url(""), "{row0}");
    assert_eq!(row0["last_command"], serde_json::Value::Null);
    let workload = pid_of(&one.home, "run/workload.pid").unwrap();
    let agent = pid_of(&one.home, "run/agent.pid").unwrap();

    let path = format!("/admin/agents/{}/restart", one.id);
    let (status, asked) = admin_call(&one.server, TOKEN, "POST", &path, r#"{"workload": true}"#);
    assert_eq!(status, 200, "{asked}");
    assert_eq!(asked["kind"], "restart");
    assert_eq!(asked["argument"], "workload");
    let id = asked["id"].as_str().unwrap().to_owned();
    let done = wait_command(&one, &one.server, &id);
    assert_eq!(done["status"], "DONE", "{done}\n{}", agent_logs(&one.home));
    let after = pid_of(&one.home, "run/workload.pid").unwrap();
    assert_ne!(after, workload, "the workload runs under a new pid");
    assert!(pid_gone(workload), "the old workload is gone");
    assert_eq!(
        pid_of(&one.home, "run/agent.pid"),
        Some(agent),
        "only the workload restarted"
    );

    // The agent itself, by the command line, through its supervisor.
    let said = stdout(&run_ok(&mut cli(
        &one.ctx,
        &one.server,
        &["agent", "restart", &one.id],
    )));
    assert!(said.contains("it restarts at its next contact"), "{said}");
    let id = row(&one.server, &one.id)["last_command"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = wait_command(&one, &one.server, &id);
    assert_eq!(done["status"], "DONE", "{done}");
    wait_until(LONG, "a new agent process", || {
        pid_of(&one.home, "run/agent.pid").is_some_and(|p| p != agent)
    });
    assert!(pid_gone(agent), "the old agent is gone");
    let supervisor = read_file(&one.home.join("logs/wrapper.log"));
    assert!(
        supervisor.contains("code 75") && supervisor.contains("restarting in 0s"),
        "the supervisor started it again at once, not as a crash:\n{supervisor}"
    );
    // Both are in the audit log, as operator actions.
    let (_, audit) = admin_call(&one.server, TOKEN, "GET", "/admin/audit", "");
    let restarts = audit.to_string().matches("\"agent.restart\"").count();
    assert_eq!(restarts, 2, "{audit}");
}

#[test]
fn a_rotation_killed_between_candidate_and_acceptance_ends_with_the_new_credential_alone() {
    let one = one_agent();
    let token_file = one.home.join("data/agent-token");
    let candidate = one.home.join("data/agent-token.candidate");
    let old = read_file(&token_file).trim().to_owned();
    assert_eq!(register_with(&one.server, &one.id, &old), 200);

    // Until the agent is caught with the candidate kept and the old credential still in
    // place (steps 3 to 8), killed there with -9.
    let mut caught = false;
    for _ in 0..5 {
        let agent = pid_of(&one.home, "run/agent.pid").unwrap();
        let (status, asked) = admin_call(
            &one.server,
            TOKEN,
            "POST",
            &format!("/admin/agents/{}/rotate-credentials", one.id),
            "",
        );
        assert_eq!(status, 200, "{asked}");
        let start = Instant::now();
        while !candidate.exists() && start.elapsed() < LONG {
            std::thread::sleep(Duration::from_micros(200));
        }
        // At once, not through a `kill` process: the window is a round trip long.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(agent).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        );
        if candidate.exists() && read_file(&token_file).trim() == old {
            caught = true;
            break;
        }
        // It finished first: the next rotation starts from its new credential.
        wait_until(LONG, "the agent back", || {
            pid_of(&one.home, "run/agent.pid").is_some_and(|p| p != agent)
        });
    }
    assert!(
        caught,
        "the agent was never caught between the candidate and its acceptance"
    );
    let new = read_file(&candidate).trim().to_owned();
    assert_ne!(new, old);

    // The supervisor starts it again; it presents the candidate first and keeps it.
    wait_until(LONG, "the candidate to become the credential", || {
        !candidate.exists() && read_file(&token_file).trim() == new
    });
    let id = row(&one.server, &one.id)["last_command"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = wait_command(&one, &one.server, &id);
    assert_eq!(done["kind"], "rotate-credentials", "{done}");
    assert_eq!(done["status"], "DONE", "{done}");
    assert!(
        row(&one.server, &one.id)["credential_age_s"]
            .as_i64()
            .is_some_and(|age| age < 120),
        "the credential is new"
    );
    assert_eq!(
        register_with(&one.server, &one.id, &old),
        401,
        "the old one is refused"
    );
    assert_eq!(
        register_with(&one.server, &one.id, &new),
        200,
        "the new one works"
    );

    // A candidate the server refuses is dropped, and the old credential used again.
    run_ok(Command::new(one.home.join("current/bin/agent-wrapper.sh")).arg("stop"));
    fs::write(&candidate, "0".repeat(64)).unwrap();
    let before = row(&one.server, &one.id)["last_contact"].clone();
    crate::update::start(&one.home);
    wait_until(LONG, "the refused candidate to be dropped", || {
        !candidate.exists()
    });
    assert_eq!(read_file(&token_file).trim(), new, "the credential stays");
    wait_until(LONG, "the agent to talk with its credential", || {
        let r = row(&one.server, &one.id);
        r["last_contact"] != before
    });
    let log = read_file(&one.home.join("logs/agent.log"));
    assert!(log.contains("refused this agent's new credential"), "{log}");
}

#[test]
fn a_move_to_a_dead_url_stays_and_a_move_to_a_second_server_is_kept() {
    let one = one_agent();
    let conf = one.home.join("conf/agent.toml");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let said = stdout(&run_ok(&mut cli(
        &one.ctx,
        &one.server,
        &["agents", "move", "--selector", "team=cmd", "--to", &dead],
    )));
    assert!(said.contains(&one.id), "{said}");
    let id = row(&one.server, &one.id)["last_command"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = wait_command(&one, &one.server, &id);
    assert_eq!(failed["status"], "FAILED", "{failed}");
    assert!(
        failed["error"].as_str().unwrap_or_default().contains(&dead),
        "{failed}"
    );
    assert!(read_file(&conf).contains(&one.server.url("")), "it stays");
    assert!(!read_file(&conf).contains(&dead));
    let status = stdout(&run_ok(
        Command::new(one.home.join("current/bin/agent"))
            .arg("status")
            .current_dir(&one.home),
    ));
    assert!(
        status.contains("not moved"),
        "agent status says why:\n{status}"
    );
    let before = row(&one.server, &one.id)["last_contact"].clone();
    wait_until(LONG, "the agent to go on talking to its server", || {
        row(&one.server, &one.id)["last_contact"] != before
    });

    // A second server, its own fleet, serving the same release.
    let second = one
        .ctx
        .server("srv2", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    one.ctx.publish_served(&second, &one.bundle);
    let (status, asked) = admin_call(
        &one.server,
        TOKEN,
        "POST",
        &format!("/admin/agents/{}/move", one.id),
        format!(r#"{{"to": "{}"}}"#, second.url("")),
    );
    assert_eq!(status, 200, "{asked}");
    let done = wait_command(&one, &one.server, asked["id"].as_str().unwrap());
    assert_eq!(done["status"], "DONE", "{done}");
    wait_until(LONG, "the second server to hear the agent", || {
        admin_agents(second.port, TOKEN)
            .iter()
            .any(|a| a["id"] == one.id && a["endpoint"] == second.url(""))
    });
    let text = read_file(&conf);
    assert!(text.contains(&second.url("")), "{text}");
    assert!(!text.contains(&one.server.url("")), "{text}");
    assert!(
        text.contains("team = \"cmd\""),
        "the rest of the file stays:\n{text}"
    );
    // It stays there across a restart.
    run_ok(Command::new(one.home.join("current/bin/agent-wrapper.sh")).arg("restart"));
    let before = row(&second, &one.id)["last_contact"].clone();
    wait_until(LONG, "the restarted agent at the second server", || {
        row(&second, &one.id)["last_contact"] != before
    });
}

/// `POST /v1/opamp` of `msg` with `authorization`; the status and the answer.
fn opamp_post(
    server: &ServerProc,
    msg: &AgentToServer,
    authorization: Option<&str>,
) -> (u16, ServerToAgent) {
    let mut headers = vec![("Content-Type", "application/x-protobuf")];
    if let Some(a) = authorization {
        headers.push(("Authorization", a));
    }
    let answer = http_with_body(
        server.port,
        "POST",
        agent_opamp::OPAMP_PATH,
        &headers,
        &msg.encode_to_vec(),
    )
    .unwrap();
    let decoded = ServerToAgent::decode(answer.body.as_slice()).unwrap_or_default();
    (answer.status, decoded)
}

fn opamp_row(server: &ServerProc, uid: [u8; 16]) -> serde_json::Value {
    let id = uuid_text(uid);
    admin_agents(server.port, TOKEN)
        .into_iter()
        .find(|a| a["id"] == id)
        .unwrap_or_default()
}

fn uuid_text(uid: [u8; 16]) -> String {
    let h: String = uid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[test]
fn opamp_agents_get_a_restart_alone_and_a_rotated_credential_as_connection_settings() {
    const ENROLL: &str = "enrol-cmd";
    let ctx = TestContext::new();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN", ENROLL),
        ],
    );
    let enrolled = format!("Bearer {ENROLL}");
    let takes = [
        0x01, 0x90, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0x66,
    ];
    let plain = [
        0x01, 0x90, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0x67,
    ];
    let mut msg = crate::opamp::described(takes, 1, "cmd-takes");
    msg.capabilities |= AgentCapabilities::AcceptsRestartCommand as u64
        | AgentCapabilities::AcceptsOpAmpConnectionSettings as u64;
    let (status, _) = opamp_post(&server, &msg, Some(&enrolled));
    assert_eq!(status, 200);
    let other = crate::opamp::described(plain, 1, "cmd-plain");
    assert_eq!(opamp_post(&server, &other, Some(&enrolled)).0, 200);
    let row0 = opamp_row(&server, takes);
    let caps = row0["capabilities"].as_array().cloned().unwrap_or_default();
    assert!(caps.contains(&"AcceptsRestartCommand".into()), "{row0}");

    // A restart: alone in its message, once.
    for uid in [takes, plain] {
        let (status, asked) = admin_call(
            &server,
            TOKEN,
            "POST",
            &format!("/admin/agents/{}/restart", uuid_text(uid)),
            "{}",
        );
        assert_eq!(status, 200, "{asked}");
    }
    msg.sequence_num = 2;
    let (status, answer) = opamp_post(&server, &msg, Some(&enrolled));
    assert_eq!(status, 200);
    assert_eq!(
        answer.command.map(|c| c.r#type),
        Some(CommandType::Restart as i32)
    );
    assert!(answer.remote_config.is_none() && answer.packages_available.is_none());
    assert!(answer.connection_settings.is_none() && answer.flags == 0);
    assert_eq!(opamp_row(&server, takes)["last_command"]["status"], "DONE");
    msg.sequence_num = 3;
    assert!(
        opamp_post(&server, &msg, Some(&enrolled))
            .1
            .command
            .is_none(),
        "told once"
    );
    let mut other = other;
    other.sequence_num = 2;
    let (_, answer) = opamp_post(&server, &other, Some(&enrolled));
    assert!(
        answer.command.is_none(),
        "not to an agent that does not take it"
    );
    let refused = opamp_row(&server, plain)["last_command"].clone();
    assert_eq!(refused["status"], "FAILED", "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("AcceptsRestartCommand"),
        "{refused}"
    );

    // A rotation: the new credential as the Authorization header of its connection.
    let (status, _) = admin_call(
        &server,
        TOKEN,
        "POST",
        &format!("/admin/agents/{}/rotate-credentials", uuid_text(takes)),
        "",
    );
    assert_eq!(status, 200);
    msg.sequence_num = 4;
    let (_, answer) = opamp_post(&server, &msg, Some(&enrolled));
    let headers = answer
        .connection_settings
        .and_then(|c| c.opamp)
        .and_then(|o| o.headers)
        .map(|h| h.headers)
        .unwrap_or_default();
    let auth = headers
        .iter()
        .find(|h| h.key == "Authorization")
        .map(|h| h.value.clone())
        .expect("an Authorization header offered");
    assert!(auth.starts_with("Bearer ") && auth != enrolled);
    msg.sequence_num = 5;
    assert_eq!(
        opamp_post(&server, &msg, Some(&auth)).0,
        200,
        "the new credential is taken"
    );
    assert_eq!(opamp_row(&server, takes)["last_command"]["status"], "DONE");
    msg.sequence_num = 6;
    assert_eq!(
        opamp_post(&server, &msg, Some(&enrolled)).0,
        401,
        "the enrollment token no longer speaks for it"
    );
    msg.sequence_num = 7;
    assert_eq!(opamp_post(&server, &msg, Some(&auth)).0, 200);
    // Agents without credentials of their own are unchanged.
    other.sequence_num = 3;
    assert_eq!(opamp_post(&server, &other, Some(&enrolled)).0, 200);
    assert_eq!(opamp_post(&server, &other, Some("Bearer guess")).0, 401);
    let shaped = format!("Bearer {}", "0".repeat(64));
    assert_eq!(
        opamp_post(&server, &other, Some(&shaped)).0,
        401,
        "a credential of nobody's"
    );
}

/// A command asked on one server of a PostgreSQL fleet reaches an agent whose connect is
/// held on the other, long before its heartbeat: it is kept in the fleet database, and
/// the other server's settings read wakes the held connect.
#[test]
fn a_restart_asked_on_one_server_reaches_an_agent_held_on_the_other() {
    let pg = e2e::Postgres::start();
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let (a, b) = e2e::two_servers_on(&ctx, &pg, TOKEN, &b1);
    let home = ctx.install(&b1, "p");
    configure_agent(&home, &[b.url("")], WORKLOAD);
    let conf = read_file(&home.join("conf/agent.toml")).replace(
        "heartbeat = \"1s\"",
        "heartbeat = \"60s\"\nlong-poll = true",
    );
    fs::write(home.join("conf/agent.toml"), conf).unwrap();
    crate::update::start(&home);
    let stop = || {
        let _ = Command::new(home.join("current/bin/agent-wrapper.sh"))
            .arg("stop")
            .output();
    };
    wait_until(LONG, "the agent to hold a connect on b", || {
        e2e::metric(&b, "agentupdate_connects_held") >= 1.0
            && pid_of(&home, "run/workload.pid").is_some()
    });
    let id = read_file(&home.join("data/agent-id")).trim().to_owned();
    let workload = pid_of(&home, "run/workload.pid").unwrap();
    let asked = Instant::now();
    let (status, command) = admin_call(
        &a,
        TOKEN,
        "POST",
        &format!("/admin/agents/{id}/restart"),
        r#"{"workload": true}"#,
    );
    assert_eq!(status, 200, "{command}");
    wait_until(LONG, "the restart to be done, as a says", || {
        row(&a, &id)["last_command"]["status"] == "DONE"
    });
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the command took {took:?} (heartbeat 60 s)\n{}",
        agent_logs(&home)
    );
    assert_ne!(pid_of(&home, "run/workload.pid"), Some(workload));
    stop();
}
