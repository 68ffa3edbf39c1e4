//! Deployments (the deployments issue, items 3 to 6) with real agents: a pinned
//! deployment keeps its agents on its release while `default` moves on, a label changed
//! on the server moves an agent to the deployment it now selects, a release published
//! for one deployment is served beside the current one and reaches only its agents, a
//! halted deployment leaves the others running, and every change is refused in words or
//! audited.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::{
    ServerProc, TOKEN, TestContext, admin_agents, admin_call, configure_agent, run_fails, run_ok,
    stdout, wait_until,
};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(180);

fn cli(ctx: &TestContext, server: &ServerProc, args: &[&str]) -> Command {
    e2e::admin_cmd(ctx, server, TOKEN, args)
}

/// The version each agent runs, by its `n` label.
fn versions(server: &ServerProc) -> Vec<(String, String, String)> {
    let mut rows: Vec<(String, String, String)> = admin_agents(server.port, TOKEN)
        .iter()
        .map(|a| {
            (
                a["labels"]["n"].as_str().unwrap_or("?").to_owned(),
                a["version"].as_str().unwrap_or("?").to_owned(),
                a["deployment"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    rows.sort();
    rows
}

fn runs(server: &ServerProc, n: &str, version: &str) -> bool {
    versions(server)
        .iter()
        .any(|(m, v, _)| m == n && v == version)
}

fn id_of(server: &ServerProc, n: &str) -> String {
    admin_agents(server.port, TOKEN)
        .into_iter()
        .find(|a| a["labels"]["n"] == n)
        .and_then(|a| a["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no agent with n={n}"))
}

fn deployment(server: &ServerProc, name: &str) -> Value {
    let (status, answer) = admin_call(
        server,
        TOKEN,
        "GET",
        &format!("/admin/deployments/{name}"),
        "",
    );
    assert_eq!(status, 200, "{answer}");
    answer
}

/// Installs an agent from `bundle` with `labels` (TOML inline-table body) and the
/// fleet's short stability window.
fn agent(ctx: &TestContext, bundle: &Path, server: &ServerProc, n: usize, labels: &str) -> PathBuf {
    let home = ctx.install(bundle, &format!("fleet/{n}"));
    configure_agent(
        &home,
        &[server.url("")],
        &format!("labels = {{ n = \"{n}\"{labels} }}\n"),
    );
    fs::write(
        home.join("conf/agent-env.sh"),
        crate::rollout::FLEET_AGENT_ENV,
    )
    .unwrap();
    home
}

/// Three agents installed from `bundle` (1.0.0+1), labelled `n=0..2` and with the `env`
/// each is given (none for ""), started and registered with `server`.
fn three_agents(
    ctx: &TestContext,
    bundle: &Path,
    server: &ServerProc,
    envs: [&str; 3],
) -> Vec<PathBuf> {
    let homes: Vec<PathBuf> = envs
        .iter()
        .enumerate()
        .map(|(n, env)| {
            let labels = if env.is_empty() {
                String::new()
            } else {
                format!(", env = \"{env}\"")
            };
            agent(ctx, bundle, server, n, &labels)
        })
        .collect();
    e2e::start_wrappers(&homes);
    wait_until(LONG, "three agents on 1.0.0+1", || {
        versions(server)
            .iter()
            .filter(|(_, v, _)| v == "1.0.0+1")
            .count()
            == 3
    });
    homes
}

#[test]
fn a_pinned_deployment_stays_while_default_moves_and_labels_and_releases_move_agents() {
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let now = e2e::now_secs();
    let b1 = ctx.pack_signed_at(&ctx.dist("d1"), "1.0.0", "1", &key, "b1", now - 120);
    let d2 = ctx.dist("d2");
    fs::write(d2.join("README.txt"), "The second release.\n").unwrap();
    ctx.pack_signed_at(&d2, "2.0.0", "2", &key, "b2", now - 60);
    let d3 = ctx.dist("d3");
    fs::write(d3.join("README.txt"), "A fix for production.\n").unwrap();
    ctx.pack_signed_at(&d3, "2.0.1", "3", &key, "b3", now);
    let public = public.display().to_string();
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", &public),
        ],
    );
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b1")));
    let homes = three_agents(&ctx, &b1, &server, ["prod", "prod", ""]);

    // Refusals change nothing and say what to do.
    let said = run_fails(
        &mut cli(
            &ctx,
            &server,
            &[
                "deployment",
                "create",
                "prod",
                "--selector",
                "env in (prod",
                "--release",
                "1.0.0+1",
            ],
        ),
        1,
    );
    assert!(said.contains("column"), "{said}");
    let said = run_fails(
        &mut cli(
            &ctx,
            &server,
            &[
                "deployment",
                "create",
                "prod",
                "--selector",
                "env=prod",
                "--release",
                "9.9.9+9",
            ],
        ),
        1,
    );
    assert!(
        said.contains("9.9.9+9 is not kept") && said.contains("release publish"),
        "{said}"
    );
    let said = run_fails(
        &mut cli(&ctx, &server, &["deployment", "remove", "default"]),
        1,
    );
    assert!(said.contains("cannot be removed"), "{said}");

    // Production pinned to 1.0.0+1, one agent a wave, an hour between waves.
    let said = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &[
            "deployment",
            "create",
            "prod",
            "--selector",
            "env=prod",
            "--release",
            "1.0.0+1",
            "--priority",
            "10",
            "--waves",
            "1,100%",
            "--wave-wait",
            "3600",
        ],
    )));
    assert!(
        said.contains("deployment prod") && said.contains("env=prod"),
        "{said}"
    );
    wait_until(LONG, "the prod agents to follow prod", || {
        versions(&server)
            .iter()
            .filter(|(_, _, d)| d == "prod")
            .count()
            == 2
    });

    // default moves to 2.0.0+2: only the agent prod does not select updates.
    run_ok(e2e::release_cmd(&ctx, &server, TOKEN, &["publish"]).arg(ctx.path("b2")));
    e2e::wait_rollout(&server, TOKEN, LONG, "default's 2.0.0 to complete", |r| {
        r["version"] == "2.0.0+2" && r["state"] == "completed"
    });
    wait_until(LONG, "agent 2 on 2.0.0+2", || runs(&server, "2", "2.0.0+2"));
    assert!(
        runs(&server, "0", "1.0.0+1") && runs(&server, "1", "1.0.0+1"),
        "{:?}",
        versions(&server)
    );
    let prod = deployment(&server, "prod");
    assert_eq!(prod["agents"], 2, "{prod}");
    assert_eq!(prod["release"], "1.0.0+1", "{prod}");
    // Each machine says which deployment it follows, as the server told it.
    for (home, name) in [(&homes[0], "prod"), (&homes[2], "default")] {
        wait_until(LONG, "agent status to name its deployment", || {
            stdout(&run_ok(
                Command::new(home.join("current/bin/agent")).arg("status"),
            ))
            .contains(&format!("deployment: {name}\n"))
        });
    }
    let listed = stdout(&run_ok(&mut cli(&ctx, &server, &["deployment", "list"])));
    assert!(
        listed.contains("(every agent)") && listed.contains("env=prod"),
        "{listed}"
    );

    // A fix published for prod alone: served beside the current release (by name), it
    // reaches prod's first wave, one agent, and prod soaks; default is unchanged.
    let said = stdout(&run_ok(
        e2e::release_cmd(&ctx, &server, TOKEN, &["publish", "--deployment", "prod"])
            .arg(ctx.path("b3")),
    ));
    assert!(said.contains("for deployment prod"), "{said}");
    wait_until(LONG, "one prod agent on 2.0.1+3", || {
        runs(&server, "0", "2.0.1+3") || runs(&server, "1", "2.0.1+3")
    });
    wait_until(LONG, "prod to soak after its first wave", || {
        deployment(&server, "prod")["rollout"]["state"] == "soaking"
    });
    let (fixed, waiting) = if runs(&server, "0", "2.0.1+3") {
        ("0", "1")
    } else {
        ("1", "0")
    };
    assert!(
        runs(&server, waiting, "1.0.0+1"),
        "{:?} {}",
        versions(&server),
        deployment(&server, "prod")
    );
    let log = e2e::agent_logs(&homes[fixed.parse::<usize>().unwrap()]);
    assert!(log.contains("2.0.1+3"), "{log}");
    assert_eq!(
        e2e::admin_releases(&server, TOKEN)["current"]["id"],
        "2.0.0+2"
    );
    assert!(runs(&server, "2", "2.0.0+2"), "{:?}", versions(&server));
    // An anonymous client asks for prod's release by name; an unknown one is a 404.
    let text = e2e::http(
        server.port,
        "GET",
        "/agentupdate/version?release=2.0.1%2B3",
        &[],
    )
    .unwrap()
    .text();
    assert!(text.contains("2.0.1"), "{text}");
    let missing = e2e::http(
        server.port,
        "GET",
        "/agentupdate/version?release=7.0.0%2B7",
        &[],
    )
    .unwrap();
    assert_eq!(missing.status, 404, "{}", missing.text());
    assert!(
        missing.text().contains("not served here"),
        "{}",
        missing.text()
    );

    // prod halted: default's rollout is another, and keeps its state.
    run_ok(&mut cli(
        &ctx,
        &server,
        &["deployment", "halt", "prod", "--reason", "change freeze"],
    ));
    let prod = deployment(&server, "prod");
    assert_eq!(prod["rollout"]["state"], "halted", "{prod}");
    assert!(
        prod["rollout"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("change freeze")),
        "{prod}"
    );
    let default = e2e::admin_rollout(&server, TOKEN).unwrap();
    assert_eq!(default["state"], "completed", "{default}");

    // A label set on the server moves the prod agent still waiting out of the halted
    // deployment: it follows default now, and updates to default's release.
    let id = id_of(&server, waiting);
    run_ok(&mut cli(
        &ctx,
        &server,
        &["agent", "label", &id, "env=staging"],
    ));
    wait_until(
        LONG,
        "the moved agent to follow default onto 2.0.0+2",
        || runs(&server, waiting, "2.0.0+2"),
    );
    assert!(runs(&server, fixed, "2.0.1+3"), "{:?}", versions(&server));
    assert_eq!(deployment(&server, "prod")["agents"], 1);

    // prod goes back to 1.0.0+1: its old signature is refused (agents would take it
    // for a replay), fresh ones over the kept bytes are taken, and the fixed agent
    // returns to the version it kept.
    let again = e2e::export_kept(&ctx, &server, TOKEN, "1.0.0+1", &ctx.path("again"));
    let back = |signatures: &Path| {
        let mut cmd = e2e::release_cmd(
            &ctx,
            &server,
            TOKEN,
            &[
                "rollback",
                "--to",
                "1.0.0+1",
                "--deployment",
                "prod",
                "--signatures",
            ],
        );
        cmd.arg(signatures);
        cmd
    };
    let said = run_fails(&mut back(&again), 1);
    assert!(said.contains("agent-bundle sign"), "{said}");
    assert_eq!(deployment(&server, "prod")["release"], "2.0.1+3");
    e2e::sign_again(&ctx, &key, &again);
    let said = stdout(&run_ok(&mut back(&again)));
    assert!(said.contains("deployment prod's target again"), "{said}");
    wait_until(LONG, "the fixed prod agent back on 1.0.0+1", || {
        runs(&server, fixed, "1.0.0+1")
    });
    assert_eq!(
        e2e::admin_releases(&server, TOKEN)["current"]["id"],
        "2.0.0+2"
    );
    assert!(runs(&server, waiting, "2.0.0+2"), "{:?}", versions(&server));

    // Each change is in the audit log.
    let audit = stdout(&run_ok(&mut cli(
        &ctx,
        &server,
        &["audit", "--action", "deployment"],
    )));
    for action in ["deployment.create", "deployment.set", "deployment.halt"] {
        assert!(audit.contains(action), "{action} not in {audit}");
    }
}

/// Three deployments at once on two servers of one PostgreSQL fleet: each release is
/// published to one server and served by the other to the agents its deployment
/// selects, and each agent converges to its own deployment's release.
#[test]
fn three_deployments_at_once_on_two_servers_over_postgres() {
    let pg = e2e::Postgres::start();
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let now = e2e::now_secs();
    let b1 = ctx.pack_signed_at(&ctx.dist("d1"), "1.0.0", "1", &key, "b1", now - 120);
    for (dir, version, build, at) in [("b2", "2.0.0", "2", now - 60), ("b3", "3.0.0", "3", now)] {
        let dist = ctx.dist(&format!("d-{dir}"));
        fs::write(dist.join("README.txt"), format!("Release {version}.\n")).unwrap();
        ctx.pack_signed_at(&dist, version, build, &key, dir, at);
    }
    let url = pg.url();
    let public = public.display().to_string();
    let start = |home: &str, name: &str| {
        ctx.server(
            home,
            &[
                ("UPDATE_SERVER_DATABASE_URL", url.as_str()),
                ("UPDATE_SERVER_SERVER_NAME", name),
                ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
                ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", public.as_str()),
            ],
        )
    };
    let a = start("srv-a", "a");
    let b = start("srv-b", "b");
    run_ok(e2e::release_cmd(&ctx, &a, TOKEN, &["publish"]).arg(ctx.path("b1")));
    // prod and beta, made on a, start on 1.0.0+1 (the only release yet).
    for (name, selector) in [("prod", "env=prod"), ("beta", "env=beta")] {
        run_ok(&mut cli(
            &ctx,
            &a,
            &[
                "deployment",
                "create",
                name,
                "--selector",
                selector,
                "--release",
                "1.0.0+1",
            ],
        ));
    }
    // Every agent talks to b.
    three_agents(&ctx, &b1, &b, ["prod", "beta", ""]);

    // A release for each deployment, published to a; b serves each from the fleet
    // database to the agents of that deployment alone.
    run_ok(
        e2e::release_cmd(&ctx, &a, TOKEN, &["publish", "--deployment", "prod"]).arg(ctx.path("b2")),
    );
    run_ok(
        e2e::release_cmd(&ctx, &a, TOKEN, &["publish", "--deployment", "beta"]).arg(ctx.path("b3")),
    );
    wait_until(LONG, "prod on 2.0.0+2 and beta on 3.0.0+3", || {
        runs(&b, "0", "2.0.0+2") && runs(&b, "1", "3.0.0+3")
    });
    assert!(runs(&b, "2", "1.0.0+1"), "{:?}", versions(&b));
    for server in [&a, &b] {
        let listed = versions(server);
        assert_eq!(
            listed,
            vec![
                ("0".into(), "2.0.0+2".into(), "prod".into()),
                ("1".into(), "3.0.0+3".into(), "beta".into()),
                ("2".into(), "1.0.0+1".into(), "default".into()),
            ],
            "as server {} lists them",
            server.port
        );
    }
    for (name, release) in [("prod", "2.0.0+2"), ("beta", "3.0.0+3")] {
        wait_until(
            LONG,
            "each deployment's rollout to complete on both",
            || {
                [&a, &b].iter().all(|s| {
                    let d = deployment(s, name);
                    d["release"] == release && d["rollout"]["state"] == "completed"
                })
            },
        );
    }
    // default's release is unchanged on both.
    for server in [&a, &b] {
        assert_eq!(
            e2e::admin_releases(server, TOKEN)["current"]["id"],
            "1.0.0+1"
        );
    }
}

/// `HH:MM` (UTC) `hours` from now: a window that is closed for a while yet.
fn hhmm_in(hours: u64) -> String {
    let at = (e2e::now_secs() + hours * 3600) % 86_400;
    format!("{:02}:{:02}", at / 3600, (at % 3600) / 60)
}

fn healthz(server: &ServerProc) -> String {
    e2e::http(server.port, "GET", "/healthz", &[])
        .unwrap()
        .text()
}

/// The windows `server` lists for `deployment`: (id, groups joined, start).
fn windows_of(server: &ServerProc, deployment: &str) -> Vec<(i64, String, String)> {
    let (status, answer) = admin_call(
        server,
        TOKEN,
        "GET",
        &format!("/admin/maintenance?deployment={deployment}"),
        "",
    );
    assert_eq!(status, 200, "{answer}");
    answer["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["id"].as_i64().unwrap(),
                w["groups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g.as_str().unwrap())
                    .collect::<Vec<_>>()
                    .join(","),
                w["start"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Fleet policy is live data (item 5): the first server's file seeds `default`; a
/// second whose file says otherwise follows the fleet and says so; a deployment's own
/// window, added on one server, holds that deployment's agents on the other within
/// seconds, and its removal lets them install; every change is audited, and a bad one
/// is refused in words and changes nothing.
#[test]
fn maintenance_windows_and_waves_are_fleet_data_every_server_follows() {
    let pg = e2e::Postgres::start();
    let ctx = TestContext::new();
    let (key, public) = ctx.keygen("keys");
    let b1 = ctx.two_releases(&key);
    let url = pg.url();
    let public = public.display().to_string();
    let config = ctx.path("server-a.toml");
    fs::write(
        &config,
        format!(
            "[rollout]\nwaves = [\"1\", \"100%\"]\n\n[[maintenance]]\ngroups = [\"db\"]\nstart = \"{}\"\nduration = \"1h\"\n",
            hhmm_in(6)
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let env = |name: &'static str| {
        vec![
            ("UPDATE_SERVER_DATABASE_URL", url.clone()),
            ("UPDATE_SERVER_SERVER_NAME", name.to_owned()),
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN.to_owned()),
            ("UPDATE_SERVER_BUNDLE_PUBLIC_KEY", public.clone()),
        ]
    };
    let env_a = env("a");
    let env_a: Vec<(&str, &str)> = env_a.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = ctx.server_with("srv-a", e2e::free_port(), &["--config", &config], &env_a);
    // b has no file: no window, `[rollout]`'s defaults.
    let env_b = env("b");
    let env_b: Vec<(&str, &str)> = env_b.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let b = ctx.server("srv-b", &env_b);

    // a seeded the fleet: b lists a's window and waves, and says its file differs.
    assert_eq!(windows_of(&b, "default").len(), 1, "a's window, seen on b");
    assert_eq!(
        deployment(&b, "default")["policy"]["waves"],
        serde_json::json!(["1", "100%"])
    );
    let said = healthz(&b);
    assert!(
        said.contains("policy differs") && said.contains("[rollout] and [[maintenance]]"),
        "{said}"
    );
    assert!(!healthz(&a).contains("policy differs"), "{}", healthz(&a));
    wait_until(LONG, "b's log to say it follows the fleet", || {
        fs::read_to_string(b.home.join("server.log"))
            .unwrap_or_default()
            .contains("differ from the fleet's policy for deployment default; the server follows the fleet")
    });

    run_ok(e2e::release_cmd(&ctx, &a, TOKEN, &["publish"]).arg(ctx.path("b1")));
    run_ok(&mut cli(
        &ctx,
        &a,
        &[
            "deployment",
            "create",
            "prod",
            "--selector",
            "env=prod",
            "--release",
            "1.0.0+1",
        ],
    ));
    // Refused in words, nothing added: a window that is none, a deployment that is not.
    let bad = run_fails(
        &mut cli(
            &ctx,
            &a,
            &[
                "maintenance",
                "add",
                "--deployment",
                "prod",
                "--start",
                "25:00",
                "--duration",
                "1h",
            ],
        ),
        1,
    );
    assert!(bad.contains("start"), "{bad}");
    let none = run_fails(
        &mut cli(
            &ctx,
            &a,
            &[
                "maintenance",
                "add",
                "--deployment",
                "nope",
                "--start",
                "02:00",
                "--duration",
                "1h",
            ],
        ),
        1,
    );
    assert!(none.contains("no deployment \"nope\""), "{none}");
    assert!(windows_of(&a, "prod").is_empty());

    // prod's own window, closed for hours, added on a.
    let start = hhmm_in(5);
    let added = stdout(&run_ok(&mut cli(
        &ctx,
        &a,
        &[
            "maintenance",
            "add",
            "--deployment",
            "prod",
            "--groups",
            "*",
            "--start",
            &start,
            "--duration",
            "1h",
        ],
    )));
    assert!(added.contains("to deployment prod"), "{added}");
    wait_until(Duration::from_secs(5), "b to list prod's window", || {
        windows_of(&b, "prod").len() == 1
    });
    let (id, groups, listed_start) = windows_of(&b, "prod").remove(0);
    assert_eq!(
        (groups.as_str(), listed_start.as_str()),
        ("*", start.as_str())
    );
    let listed = stdout(&run_ok(&mut cli(&ctx, &b, &["maintenance", "list"])));
    assert!(
        listed.contains("prod") && listed.contains(&start),
        "{listed}"
    );

    // prod's agent (on b) is held for its window when prod moves; default's is not
    // (its window names group db only).
    three_agents(&ctx, &b1, &b, ["prod", "", ""]);
    run_ok(
        e2e::release_cmd(&ctx, &a, TOKEN, &["publish", "--deployment", "prod"]).arg(ctx.path("b2")),
    );
    wait_until(LONG, "prod's agent waiting for its window", || {
        admin_agents(b.port, TOKEN)
            .iter()
            .any(|a| a["labels"]["n"] == "0" && a["update_status"] == "WAITING_WINDOW")
    });
    assert!(runs(&b, "0", "1.0.0+1"), "{:?}", versions(&b));

    // Removed on b: the agent installs at once.
    run_ok(&mut cli(
        &ctx,
        &b,
        &["maintenance", "remove", &id.to_string()],
    ));
    wait_until(LONG, "prod's agent on 2.0.0+2", || runs(&b, "0", "2.0.0+2"));
    assert!(
        runs(&b, "1", "1.0.0+1") && runs(&b, "2", "1.0.0+1"),
        "{:?}",
        versions(&b)
    );

    // Waves set on b for default are a's too.
    run_ok(&mut cli(
        &ctx,
        &b,
        &["deployment", "set", "default", "--waves", "2,100%"],
    ));
    wait_until(
        Duration::from_secs(5),
        "a to read default's new waves",
        || deployment(&a, "default")["policy"]["waves"] == serde_json::json!(["2", "100%"]),
    );

    let (status, audit) = admin_call(&a, TOKEN, "GET", "/admin/audit?per_page=100", "");
    assert_eq!(status, 200, "{audit}");
    let actions: Vec<(String, String)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap_or("").to_owned(),
                e["outcome"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    for (action, outcome) in [
        ("maintenance.add", "done"),
        ("maintenance.add", "refused"),
        ("maintenance.remove", "done"),
        ("deployment.set", "done"),
    ] {
        assert!(
            actions.iter().any(|(a, o)| a == action && o == outcome),
            "{action} {outcome} in {actions:?}"
        );
    }
}
