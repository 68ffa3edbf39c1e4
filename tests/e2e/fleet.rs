//! A fleet: 30 agents, each in its own home and stamped older, started at once against
//! a server with download limit 5 and `Retry-After: 1`. All must end on the server's
//! version without ever exceeding the limit, each honouring every `503`'s wait.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::{TOKEN, TestContext, admin_agents, configure_agent, log_time, metric, read_file, run_ok};

const AGENTS: usize = 30;
const LIMIT: &str = "5";

/// (number of 503s, smallest gap between a 503 and the next request, in seconds).
fn busy_and_waits(log: &str) -> (usize, f64, f64) {
    let mut busy = 0;
    let mut min_gap = f64::MAX;
    let mut told_of_min = 0.0;
    let mut pending: Option<(f64, f64)> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Retry-After ").nth(1) {
            let told: f64 = rest
                .split('s')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            busy += 1;
            pending = log_time(line).map(|t| (t, told));
        } else if line.contains("requesting the bundle")
            && let Some((t, told)) = pending.take()
            && let Some(now) = log_time(line)
            && now - t < min_gap
        {
            min_gap = now - t;
            told_of_min = told;
        }
    }
    (busy, min_gap, told_of_min)
}

#[test]
fn thirty_agents_update_through_a_limit_of_five() {
    let ctx = TestContext::new();
    let (key, _) = ctx.keygen("keys");
    let bundle = ctx.pack(&ctx.dist("d"), "1.0.0", "1", &key, "b");
    let server = ctx.server(
        "srv",
        &[
            ("UPDATE_SERVER_DOWNLOADS_LIMIT", LIMIT),
            ("UPDATE_SERVER_DOWNLOADS_RETRY_AFTER", "1"),
            ("UPDATE_SERVER_ADMIN_TOKEN", TOKEN),
        ],
    );
    ctx.publish(&server, &bundle);

    let homes: Vec<PathBuf> = (0..AGENTS)
        .map(|i| {
            let home = ctx.install(&bundle, &format!("fleet/{i}"));
            configure_agent(&home, &[server.url("")], "");
            fs::write(
                home.join("conf/agent-env.sh"),
                "export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=120s\n",
            )
            .unwrap();
            run_ok(
                ctx.cmd("stamp")
                    .args(["agent", "--home"])
                    .arg(&home)
                    .args(["--version", "0.9.0", "--build", "1"]),
            );
            home
        })
        .collect();

    let started = Instant::now();
    let starters: Vec<_> = homes
        .iter()
        .map(|home| {
            let wrapper = home.join("current/bin/agent-wrapper.sh");
            std::thread::spawn(move || {
                run_ok(Command::new(wrapper).arg("start"));
            })
        })
        .collect();
    for s in starters {
        s.join().unwrap();
    }

    let deadline = Duration::from_secs(240);
    loop {
        let agents = admin_agents(server.port, TOKEN);
        let done = agents
            .iter()
            .filter(|a| a["version"] == "1.0.0+1" && a["update_status"] == "INSTALLED")
            .count();
        if done == AGENTS {
            break;
        }
        assert!(
            started.elapsed() < deadline,
            "after {deadline:?} only {done} of {AGENTS} agents INSTALLED; first home's update.log:\n{}",
            read_file(&homes[0].join("logs/update.log"))
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let wall = started.elapsed();

    let peak = metric(&server, "agentupdate_downloads_in_flight_peak");
    assert!(peak <= 5.0, "{peak} downloads in flight at once, limit 5");
    assert!(peak >= 1.0);

    let mut total_busy = 0;
    for home in &homes {
        let log = read_file(&home.join("logs/agent.log"));
        let (busy, min_gap, told) = busy_and_waits(&log);
        total_busy += busy;
        if busy > 0 {
            assert!(
                min_gap >= told,
                "{}: came back {min_gap:.3}s after a 503 that said {told}s",
                home.display()
            );
        }
        assert_eq!(
            fs::read_link(home.join("current")).unwrap(),
            Path::new("versions/1.0.0+1")
        );
    }
    assert!(
        total_busy > 0,
        "no agent was ever told to wait: the limit was not exercised"
    );
    eprintln!(
        "fleet: {AGENTS} agents INSTALLED in {:.1}s, {total_busy} 503s, peak {peak} downloads in flight",
        wall.as_secs_f64()
    );
}
