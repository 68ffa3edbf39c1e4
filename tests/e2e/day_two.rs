//! Day two (issue 59, item 11): what an operator needs once the fleet runs. A backup of
//! the fleet database taken beside a running server brings up a second server with the
//! same agents and audit log; an agent's logs rotate by size and keep `[log] keep`
//! copies.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::{
    TOKEN, TestContext, admin_agents, admin_call, configure_agent, read_file, run_ok, stdout,
    wait_until,
};

/// `agent run` against its conf/agent.toml, stdout dropped, stderr appended to
/// `logs/agent.out` as agent-wrapper.sh does.
fn run_agent(ctx: &TestContext, home: &Path, env: &[(&str, &str)]) -> u32 {
    fs::create_dir_all(home.join("logs")).unwrap();
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("logs/agent.out"))
        .unwrap();
    let mut cmd = Command::new(home.join("current/bin/agent"));
    cmd.arg("run")
        .env("AGENT_HOME", home)
        .env_remove("AGENT_LOG")
        .stdout(Stdio::null())
        .stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    ctx.spawn(cmd)
}

fn ids(agents: &[serde_json::Value]) -> Vec<String> {
    let mut ids: Vec<String> = agents
        .iter()
        .map(|a| format!("{} {}", a["id"], a["name"]))
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_backup_beside_a_running_server_brings_up_a_server_with_the_same_fleet() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("dist"), "1.0.0", "1", &key, "b");
    let server = ctx.server("srv", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    ctx.publish_served(&server, &bundle);
    for i in 0..2 {
        let home = ctx.install(&bundle, &format!("m{i}"));
        configure_agent(&home, &[server.url("")], &format!("name = \"m{i}\"\n"));
        run_agent(&ctx, &home, &[]);
    }
    wait_until(Duration::from_secs(60), "both agents registered", || {
        admin_agents(server.port, TOKEN).len() == 2
    });
    // An audited change.
    run_ok(
        ctx.cmd("update-server")
            .args(["token", "create", "--name", "vera", "--role", "viewer"])
            .args(["--server", &server.url(""), "--token", TOKEN]),
    );
    let before = ids(&admin_agents(server.port, TOKEN));

    let backup = ctx.path("fleet-backup.db");
    let out = run_ok(
        ctx.cmd("update-server")
            .arg("--home")
            .arg(&server.home)
            .arg("backup")
            .arg("--out")
            .arg(&backup),
    );
    let said = stdout(&out);
    let size = fs::metadata(&backup).unwrap().len();
    assert!(said.contains(&format!("({size} bytes)")), "{said}");
    assert!(said.contains("fleet.db-wal"), "{said}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&backup).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    // Never over an existing file.
    let again = e2e::run(
        ctx.cmd("update-server")
            .arg("--home")
            .arg(&server.home)
            .args(["backup", "--out"])
            .arg(&backup),
    );
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    assert_eq!(fs::metadata(&backup).unwrap().len(), size);

    // PostgreSQL: the command to use instead, and a failure.
    let pg = e2e::run(
        ctx.cmd("update-server")
            .arg("--home")
            .arg(&server.home)
            .env("UPDATE_SERVER_DATABASE_URL", "postgres://fleet:pw@db/fleet")
            .args(["backup", "--out", "x.dump"]),
    );
    let pg_said = String::from_utf8_lossy(&pg.stderr);
    assert!(!pg.status.success());
    assert!(
        pg_said.contains("pg_dump --format=custom --file=x.dump 'postgres://fleet@db/fleet'"),
        "{pg_said}"
    );

    // Restore: the copy as another server's fleet.db.
    fs::create_dir_all(ctx.path("restored")).unwrap();
    fs::copy(&backup, ctx.path("restored/fleet.db")).unwrap();
    let restored = ctx.server("restored", &[("UPDATE_SERVER_ADMIN_TOKEN", TOKEN)]);
    assert_eq!(ids(&admin_agents(restored.port, TOKEN)), before);
    let (status, audit) = admin_call(&restored, TOKEN, "GET", "/admin/audit", "");
    assert_eq!(status, 200, "{audit}");
    assert!(audit.to_string().contains("vera"), "{audit}");
}

#[test]
fn an_agent_rotates_its_logs_by_size_and_keeps_keep_copies() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("dist"), "1.0.0", "1", &key, "b");
    let server = ctx.server("srv", &[]);
    ctx.publish_served(&server, &bundle);
    let home = ctx.install(&bundle, "m");
    configure_agent(
        &home,
        &[server.url("")],
        "\n[log]\nmax-size = \"1KiB\"\nkeep = 2\n",
    );
    let logs = home.join("logs");
    // The updater's output of updates long past: rotated when the agent starts.
    fs::create_dir_all(&logs).unwrap();
    fs::write(logs.join("update.out"), "an old update\n".repeat(500)).unwrap();

    // Debug logging writes a few lines a contact.
    run_agent(&ctx, &home, &[("AGENT_LOG", "debug")]);
    wait_until(
        Duration::from_secs(90),
        "agent.log.2 and agent.out.2",
        || logs.join("agent.log.2").exists() && logs.join("agent.out.2").exists(),
    );
    // A few more rotations.
    std::thread::sleep(Duration::from_secs(2));

    let mut names: Vec<String> = fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for stem in ["agent.log", "agent.out"] {
        let of: Vec<&String> = names
            .iter()
            .filter(|n| n.as_str() == stem || n.starts_with(&format!("{stem}.")))
            .collect();
        assert!(of.len() <= 3, "more than keep + 1 {stem} files: {names:?}");
    }
    for n in 1..=2 {
        let path = logs.join(format!("agent.log.{n}"));
        let text = read_file(&path);
        assert!(
            text.len() <= 1024 || text.lines().count() == 1,
            "{} holds {} bytes, past max-size",
            path.display(),
            text.len()
        );
    }
    // The console goes on in the new agent.out (stderr was pointed at it).
    wait_until(
        Duration::from_secs(30),
        "lines in the new agent.out",
        || fs::metadata(logs.join("agent.out")).is_ok_and(|m| m.len() > 0),
    );
    let old = read_file(&logs.join("update.out.1"));
    assert_eq!(old, "an old update\n".repeat(500));
    assert!(!logs.join("update.out").exists(), "{names:?}");
}
