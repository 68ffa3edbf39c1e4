//! Credentials over a machine's life (issue 45): `agent uninstall` leaves nothing running
//! and the server lists the agent `LEFT` with its credentials revoked; an operator's
//! `agents remove` forgets a lost machine, whose rollout waves then wait for nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, admin_call, configure_agent, pids_mentioning,
    read_file, run, run_ok, stdout, wait_until,
};

use crate::rollout::{LONG, NEW, OLD};

/// A workload that names the home in its argv, so a leftover process is found by it.
const WORKLOAD: &str =
    "\n[workload]\ncommand = [\"/bin/sh\", \"-c\", \"while :; do sleep 1; done\", \"{home}\"]\n";

struct One {
    ctx: TestContext,
    server: ServerProc,
    home: PathBuf,
    b2: PathBuf,
}

fn one_agent(server_env: &[(&str, &str)]) -> One {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let b1 = ctx.pack(&ctx.dist("d1"), "1.0.0", "1", &key, "b1");
    let b2 = ctx.pack(&ctx.dist("d2"), "2.0.0", "2", &key, "b2");
    let mut env = vec![("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)];
    env.extend_from_slice(server_env);
    let server = ctx.server("srv", &env);
    ctx.publish_served(&server, &b1);
    let home = ctx.install(&b1, "p");
    configure_agent(&home, &[server.url("")], WORKLOAD);
    crate::update::start(&home);
    wait_until(LONG, "the agent to register with its workload", || {
        admin_agents(server.port, TOKEN)
            .iter()
            .any(|a| a["version"] == OLD)
            && home.join("run/workload.pid").exists()
    });
    One {
        ctx,
        server,
        home,
        b2,
    }
}

fn agent_cmd(home: &Path) -> Command {
    let mut cmd = Command::new(home.join("current/bin/agent"));
    // From any directory.
    cmd.current_dir("/");
    cmd
}

/// A register with the agent's (revoked) secret.
fn register_with(server: &ServerProc, id: &str, secret: &str) -> u16 {
    let body = format!(r#"{{"id":"{id}","name":"h","platform":"x86_64-unknown-linux-gnu"}}"#);
    e2e::agent_post(server, "/agent/register", OLD, Some(secret), &body).status
}

#[test]
fn uninstall_leaves_no_process_keeps_what_the_operator_owns_and_the_server_lists_it_left() {
    let o = one_agent(&[]);
    let id = read_file(&o.home.join("data/agent-id")).trim().to_owned();
    let secret = read_file(&o.home.join("data/agent-token"))
        .trim()
        .to_owned();
    assert!(!pids_mentioning(&o.home).is_empty());

    // Without --yes and without a terminal it asks nobody and changes nothing.
    let refused = run(agent_cmd(&o.home)
        .arg("uninstall")
        .stdin(std::process::Stdio::null()));
    assert_ne!(refused.status.code(), Some(0));
    assert!(o.home.join("versions").is_dir());

    let out = run_ok(agent_cmd(&o.home).args(["uninstall", "--yes"]));
    let said = stdout(&out);
    assert!(said.contains("left the fleet"), "{said}");
    wait_until(LONG, "every process of the installation to end", || {
        pids_mentioning(&o.home).is_empty()
    });
    for gone in ["versions", "current", "run"] {
        assert!(
            o.home.join(gone).symlink_metadata().is_err(),
            "{gone} is still there"
        );
    }
    for kept in ["conf/agent.toml", "logs/agent.log"] {
        assert!(o.home.join(kept).is_file(), "{kept} was not kept");
    }
    // The identity is kept aside: an agent installed here again enrolls as a new one.
    assert!(!o.home.join("data/agent-id").exists());
    let aside: Vec<_> = fs::read_dir(o.home.join("data"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("left-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");

    let row = admin_agents(o.server.port, TOKEN)
        .into_iter()
        .find(|a| a["id"] == id.as_str())
        .expect("the agent is still listed");
    assert_eq!(row["update_status"], "LEFT", "{row}");
    assert_eq!(register_with(&o.server, &id, &secret), 401);

    // A second run has nothing to do; --purge then takes the rest.
    let agent = o.ctx.path("agent-copy");
    fs::copy(e2e::bin_path("agent"), &agent).unwrap();
    let again = run_ok(
        Command::new(&agent)
            .arg("--home")
            .arg(&o.home)
            .args(["uninstall", "--yes"]),
    );
    assert!(
        stdout(&again).contains("nothing to uninstall"),
        "{}",
        stdout(&again)
    );
    run_ok(
        Command::new(&agent)
            .arg("--home")
            .arg(&o.home)
            .args(["uninstall", "--purge", "--yes"]),
    );
    assert!(!o.home.exists(), "--purge left {}", o.home.display());
}

#[test]
fn uninstall_without_a_server_still_uninstalls_and_says_the_server_was_not_told() {
    let o = one_agent(&[]);
    e2e::signal(o.server.pid, "KILL");
    let out = run_ok(agent_cmd(&o.home).args(["uninstall", "--yes", "--purge"]));
    let said = stdout(&out);
    assert!(said.contains("the server was not told"), "{said}");
    wait_until(LONG, "every process of the installation to end", || {
        pids_mentioning(&o.home).is_empty()
    });
    assert!(!o.home.exists());
}

/// Two agents; one machine is lost (killed, never back). An operator removes it: its
/// credentials are refused, a viewer may not remove, and the next release's rollout
/// completes with the other agent, not waiting out the lost one's deadline.
#[test]
fn a_removed_machine_is_refused_and_no_rollout_waits_for_it() {
    let o = one_agent(&[]);
    let lost = o.ctx.install(
        &o.ctx.pack(
            &o.ctx.dist("d1b"),
            "1.0.0",
            "1",
            &o.ctx.keygen("k2").0,
            "b1b",
        ),
        "lost",
    );
    // The lost machine trusts the release's key like the other.
    fs::copy(o.home.join("conf/update.pub"), lost.join("conf/update.pub")).unwrap();
    configure_agent(&lost, &[o.server.url("")], "");
    crate::update::start(&lost);
    wait_until(LONG, "two agents", || {
        admin_agents(o.server.port, TOKEN).len() == 2
    });
    let lost_id = read_file(&lost.join("data/agent-id")).trim().to_owned();
    let secret = read_file(&lost.join("data/agent-token")).trim().to_owned();
    for pid in pids_mentioning(&lost) {
        e2e::signal(pid, "KILL");
    }

    // A viewer's forged remove: refused, audited, nothing changed.
    let viewer = {
        let mut cmd = o.ctx.cmd("update-server");
        cmd.args([
            "token", "create", "--name", "vera", "--role", "viewer", "--server",
        ])
        .arg(o.server.url(""))
        .args(["--token", TOKEN]);
        stdout(&run_ok(&mut cmd)).trim().to_owned()
    };
    let (status, _) = admin_call(
        &o.server,
        &viewer,
        "DELETE",
        &format!("/admin/agents/{lost_id}"),
        "",
    );
    assert_eq!(status, 403);
    let (_, audit) = admin_call(&o.server, TOKEN, "GET", "/admin/audit", "");
    assert!(
        audit.to_string().contains("agent.remove") && audit.to_string().contains("vera"),
        "{audit}"
    );
    assert_eq!(admin_agents(o.server.port, TOKEN).len(), 2);

    let mut remove = o.ctx.cmd("update-server");
    remove
        .args(["agent", "remove", &lost_id, "--server"])
        .arg(o.server.url(""))
        .args(["--token", TOKEN]);
    let said = stdout(&run_ok(&mut remove));
    assert!(said.contains("removed agent"), "{said}");
    assert_eq!(register_with(&o.server, &lost_id, &secret), 401);
    assert!(
        !admin_agents(o.server.port, TOKEN)
            .iter()
            .any(|a| a["id"] == lost_id.as_str())
    );

    o.ctx.republish(&o.server, &o.b2);
    e2e::wait_rollout(
        &o.server,
        TOKEN,
        LONG,
        "the rollout of 2.0.0 to complete",
        |r| r["version"] == NEW && r["state"] == "completed",
    );
}
