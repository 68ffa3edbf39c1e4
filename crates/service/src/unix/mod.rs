//! `agent-service start|stop|restart|status|kill` on Unix: what `agent-wrapper.sh`
//! (which reads `conf/agent-env.sh` and hands its command here) answers, and the
//! supervisor `start` leaves running (`__supervise`, [`supervise`]). The same commands
//! as the Windows half, over pid files in `run/` and signals instead of a service
//! manager.

mod home;
mod supervise;

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use agent_protocol::env_vars;
use agent_protocol::layout::{AgentHome, EXIT_CONFIG, SUPERVISE_COMMAND};
use agent_service::clock::now_secs;
use agent_service::{cli, config_check, knobs, observe};
use agent_updater::process;
use nix::sys::signal::Signal;

use home::log;

const USAGE: &str = "usage: agent-service start|stop|restart|status|kill [--home AGENT_HOME]\n(run it as <AGENT_HOME>/current/bin/agent-wrapper.sh, which reads conf/agent-env.sh first)";

/// Who asks for a stop, in `run/stop-requested` (the updater's verdict quotes it).
const STOP_BY: &str = "agent-wrapper.sh stop";

pub(crate) fn main() -> ExitCode {
    let args = match cli::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agent-service: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(option) = args.windows_option() {
        eprintln!("agent-service: {option} is an option of the Windows service only\n{USAGE}");
        return ExitCode::from(2);
    }
    if args.command == "help" {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let home = match home::discover(args.home.as_deref()) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("agent-service: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.command.as_str() {
        "start" => start(&home),
        "stop" => Ok(stop(&home)),
        "restart" => restart(&home),
        "status" => Ok(status(&home)),
        "kill" => Ok(kill(&home)),
        SUPERVISE_COMMAND => {
            supervise::run(&home);
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("agent-service: {e:#}");
        ExitCode::FAILURE
    })
}

/// Starts the supervisor, which starts the agent, and waits for the agent to report
/// itself; then (unless an updater asked, which judges that itself) for its first
/// contact with a server, to say at once when there is none and why.
fn start(home: &AgentHome) -> anyhow::Result<ExitCode> {
    let _ = std::fs::create_dir_all(home.run());
    let _ = std::fs::create_dir_all(home.logs());
    home::clear_stop_request(home);
    // An updater runs this for the transaction it owns: no recovery of it here.
    if !knobs::for_updater() {
        home::recover(home);
    }
    if let Some(pid) = process::running_agent(home) {
        println!("agent is already running (pid {pid})");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(sup) = process::running_supervisor(home) {
        // Started by an updater, a live supervisor is the old version's, whose agent just
        // exited for this update: it is on its way out (it never restarts an agent while
        // the updater holds the lock). Taking it for a supervisor between restarts would
        // start nothing and leave the updater judging the old agent's exit.
        if knobs::for_updater() {
            let end = Instant::now() + Duration::from_secs(10);
            while process::is_supervisor(sup) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if process::is_supervisor(sup) {
            println!(
                "the agent is between restarts (supervisor pid {sup} retries with backoff; see {})",
                home.wrapper_log().display()
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    let _ = std::fs::remove_file(home.pid_file());
    let _ = std::fs::remove_file(home.exit_file());
    let started_at = now_secs();
    Command::new(std::env::current_exe()?)
        .arg(SUPERVISE_COMMAND)
        .arg("--home")
        .arg(home.root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let within = knobs::secs(env_vars::AGENT_START_TIMEOUT, 15);
    Ok(wait_started(home, within, started_at))
}

/// Up means: the agent named in `run/agent.pid` wrote `run/health.json` naming itself.
/// An agent that exits first did not start, whatever the supervisor does next.
fn wait_started(home: &AgentHome, within: Duration, started_at: u64) -> ExitCode {
    let end = Instant::now() + within;
    let mut last = None;
    loop {
        if let Some(pid) = home::read_pid(&home.pid_file()) {
            last = Some(pid);
            if !process::is_alive(pid) {
                return exited_at_once(home, pid);
            }
            let health = std::fs::read_to_string(home.health_file()).unwrap_or_default();
            if observe::health_names(&health, pid) {
                println!("agent started (pid {pid})");
                log(home, &format!("started agent (pid {pid})"));
                // The updater judges contact itself, on its own clock.
                if !knobs::for_updater() {
                    await_contact(home, started_at);
                }
                return ExitCode::SUCCESS;
            }
        }
        if Instant::now() >= end {
            if let Some(pid) = last.filter(|&p| process::is_alive(p)) {
                println!(
                    "agent started (pid {pid}); it has not reported itself within {}s",
                    within.as_secs()
                );
                log(
                    home,
                    &format!("started agent (pid {pid}); no run/health.json yet"),
                );
                return ExitCode::SUCCESS;
            }
            eprintln!(
                "agent did not start within {}s; see {} and {}",
                within.as_secs(),
                home.agent_out().display(),
                home.wrapper_log().display()
            );
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Says why the agent `pid` ended before it reported itself, with the last lines of
/// its console.
fn exited_at_once(home: &AgentHome, pid: u32) -> ExitCode {
    // The supervisor records the exit code right after it reaps the agent.
    let settle = Instant::now() + Duration::from_secs(2);
    let mut code = home::exit_code_of(home, pid);
    while code.is_none() && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(50));
        code = home::exit_code_of(home, pid);
    }
    let code = code.map_or("?".to_owned(), |c| c.to_string());
    if code == EXIT_CONFIG.to_string() {
        eprintln!(
            "agent did not start: it refused its configuration (exit {code}); fix it and start again:"
        );
    } else {
        eprintln!(
            "agent did not start: it exited at once (exit {code}); see {}:",
            home.agent_out().display()
        );
    }
    let tail = agent_extract::atomic::tail_lines(&home.agent_out(), 5);
    for line in tail.lines() {
        eprintln!("    {line}");
    }
    log(
        home,
        &format!("agent (pid {pid}) exited at once with code {code}"),
    );
    ExitCode::FAILURE
}

/// Waits up to `AGENT_START_CONTACT_WAIT` seconds (5) for the agent's first contact
/// with a server; when there is none, says so with the agent's own words for why (the
/// agent keeps trying either way).
fn await_contact(home: &AgentHome, since: u64) {
    let wait = knobs::secs(env_vars::AGENT_START_CONTACT_WAIT, 5);
    let end = Instant::now() + wait;
    let why = loop {
        let health = std::fs::read_to_string(home.health_file()).unwrap_or_default();
        if observe::has_contact(&health) {
            return;
        }
        let errors = std::fs::read_to_string(home.last_errors()).unwrap_or_default();
        if let Some(why) = observe::contact_error_since(&errors, since) {
            break why;
        }
        if Instant::now() >= end {
            let toml = std::fs::read_to_string(home.agent_toml()).unwrap_or_default();
            let servers = observe::servers(&toml)
                .unwrap_or_else(|| "the servers in conf/agent.toml".to_owned());
            break format!("no answer yet from {servers}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("no contact with a server yet: {why}");
    println!(
        "  the agent keeps trying; check server.urls in {}, see `agent status` and {}",
        home.agent_toml().display(),
        home.logs().join("agent.log").display()
    );
    log(
        home,
        &format!("no contact within {}s of the start: {why}", wait.as_secs()),
    );
}

/// A configuration the new agent would refuse (exit 78) must not cost the running one:
/// restart checks it first, with the agent's own parser, and keeps the agent if it fails.
fn restart(home: &AgentHome) -> anyhow::Result<ExitCode> {
    let program = home::agent_program(home);
    if let Err(said) = config_check::check(&program, home.root()) {
        eprintln!("{said}");
        eprintln!("{}", config_check::refused(&program, "agent-wrapper.sh"));
        return Ok(ExitCode::from(EXIT_CONFIG));
    }
    stop(home);
    start(home)
}

/// TERM to the supervisor (it passes it on and restarts nothing) and to the agent, up
/// to `AGENT_STOP_TIMEOUT` seconds for the agent to end, then KILL; then a workload the
/// agent could not stop.
fn stop(home: &AgentHome) -> ExitCode {
    // Said before anything is signalled, so that an updater watching a new version sees
    // why it ends. The updater's own stops (a rollback) are not requests: not said.
    if !knobs::for_updater() {
        home::request_stop(home, STOP_BY);
    }
    let sup = process::running_supervisor(home);
    let agent = process::running_agent(home);
    if sup.is_none() && agent.is_none() {
        let _ = std::fs::remove_file(home.pid_file());
        println!("agent is not running");
        return ExitCode::SUCCESS;
    }
    if let Some(sup) = sup {
        process::terminate(sup);
    }
    if let Some(pid) = agent {
        process::terminate(pid);
        let timeout = knobs::stop_timeout();
        if !process::wait_gone(pid, timeout) {
            log(
                home,
                &format!(
                    "agent (pid {pid}) did not stop within {}s; killing it",
                    timeout.as_secs()
                ),
            );
            if process::is_agent(pid, home) {
                process::kill(pid);
            }
        }
    }
    if let Some(sup) = sup {
        process::wait_gone(sup, Duration::from_secs(5));
    }
    let _ = std::fs::remove_file(home.pid_file());
    // The agent stops its workload first; one it could not (it was killed) goes now.
    home::stop_leftover_workload(home);
    match (agent, sup) {
        (Some(pid), _) => {
            log(home, &format!("stopped agent (pid {pid})"));
            println!("agent stopped (pid {pid})");
        }
        (None, sup) => {
            log(
                home,
                &format!(
                    "stopped the supervisor (pid {}) between restarts",
                    sup.unwrap_or_default()
                ),
            );
            println!("agent stopped (it was between restarts)");
        }
    }
    ExitCode::SUCCESS
}

/// KILL to the supervisor, the agent and a workload the agent left: no waiting, no
/// words to anyone.
fn kill(home: &AgentHome) -> ExitCode {
    if let Some(sup) = process::running_supervisor(home) {
        process::kill(sup);
    }
    if let Some(pid) = process::running_agent(home) {
        process::kill(pid);
        println!("agent killed (pid {pid})");
        log(home, &format!("killed agent (pid {pid})"));
    }
    if let Some(pgid) = home::leftover_workload(home) {
        home::signal_group(pgid, Signal::SIGKILL);
        log(
            home,
            &format!("killed the workload's process group (pid {pgid})"),
        );
    }
    let _ = std::fs::remove_file(home.pid_file());
    let _ = std::fs::remove_file(home.supervisor_pid_file());
    ExitCode::SUCCESS
}

fn status(home: &AgentHome) -> ExitCode {
    match process::running_agent(home) {
        Some(pid) => {
            println!("agent is running (pid {pid})");
            ExitCode::SUCCESS
        }
        None => {
            println!("agent is not running");
            ExitCode::FAILURE
        }
    }
}
