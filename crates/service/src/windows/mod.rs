//! `agent-service.exe` on Windows: the command line (what `agent-wrapper.sh` answers,
//! plus `install`, `uninstall` and `run`), the service, and its agent.
// Win32 calls (job objects) have no safe wrapper in std.
#![allow(unsafe_code)]

mod home;
mod job;
mod scm;
mod supervise;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use agent_protocol::env_vars;
use agent_protocol::layout::{self, AgentHome};
use agent_service::cli;
use agent_updater::process;
use windows_service::service::ServiceState;

use home::{Request, log};

const USAGE: &str = "usage: agent-service.exe start|stop|restart|status|install|uninstall|run [--service-name NAME] [--home AGENT_HOME]";

pub(crate) fn main() -> ExitCode {
    let args = match cli::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agent-service: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.command == "help" || args.command.is_empty() {
        println!("{USAGE}");
        return if args.command.is_empty() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let home = match home::discover(args.home.as_deref()) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("agent-service: {e}");
            return ExitCode::from(2);
        }
    };
    let name = home::service_name(args.service_name.as_deref(), &home);
    let result = match args.command.as_str() {
        "run" => scm::run(name, home).map(|()| ExitCode::SUCCESS),
        "start" => start(&name, &home),
        "stop" => stop(&name, &home),
        "restart" => restart(&name, &home),
        "status" => Ok(status(&name, &home)),
        "install" => install(&name, &home, args.no_start),
        "uninstall" => uninstall(&name, &home),
        "__restart-service" => restart_after(&name, &home, args.after),
        other => {
            eprintln!("agent-service: unknown command {other}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("agent-service: {e:#}");
        ExitCode::FAILURE
    })
}

/// Driven by the updater (`AGENT_UPDATER_ACTIVE`): the service stays up and only its
/// agent is started or stopped.
fn for_updater() -> bool {
    agent_service::knobs::for_updater()
}

fn running(name: &str) -> bool {
    scm::state(name).is_some_and(|(state, pid)| {
        // Wine keeps saying RUNNING after the service's process died: check the process.
        matches!(state, ServiceState::Running | ServiceState::StartPending)
            && pid.is_none_or(process::is_alive)
    })
}

/// Starts the agent (through the service) and waits for it to report itself.
fn start(name: &str, home: &AgentHome) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(home.run())?;
    if let Some(pid) = process::running_agent(home) {
        println!("agent is already running (pid {pid})");
        return Ok(ExitCode::SUCCESS);
    }
    let _ = std::fs::remove_file(home.pid_file());
    let _ = std::fs::remove_file(home.run().join(agent_protocol::layout::AGENT_EXIT_FILE));
    home::clear_stop_request(home);
    let service_up = running(name);
    if for_updater() || service_up {
        home::write_request(home, Request::Start)?;
    }
    if !service_up {
        scm::start(name, Duration::from_secs(30))?;
    }
    let within = home::env_secs(env_vars::AGENT_START_TIMEOUT, 30);
    wait_started(home, within)
}

/// The wrapper's rule: up when the agent named in `run\agent.pid` wrote
/// `run\health.json` naming itself; an agent that exits first did not start.
fn wait_started(home: &AgentHome, within: Duration) -> anyhow::Result<ExitCode> {
    let end = Instant::now() + within;
    let mut last = None;
    loop {
        if let Some(pid) = home::read_pid(&home.pid_file()) {
            last = Some(pid);
            if !process::is_alive(pid) {
                let settle = Instant::now() + Duration::from_secs(2);
                let mut code = None;
                while code.is_none() && Instant::now() < settle {
                    code = home::read_exit(home)
                        .filter(|(p, _)| *p == pid)
                        .map(|(_, c)| c);
                    std::thread::sleep(Duration::from_millis(50));
                }
                let code = code.map_or("?".into(), |c| c.to_string());
                log(
                    home,
                    &format!("agent (pid {pid}) exited at once with code {code}"),
                );
                anyhow::bail!(
                    "agent did not start: it exited at once (exit {code}); see {}:\n{}",
                    home.agent_out().display(),
                    agent_extract::atomic::tail_lines(&home.agent_out(), 5)
                );
            }
            let health =
                std::fs::read_to_string(home.run().join("health.json")).unwrap_or_default();
            if agent_service::observe::health_names(&health, pid) {
                println!("agent started (pid {pid})");
                return Ok(ExitCode::SUCCESS);
            }
        }
        if Instant::now() >= end {
            if let Some(pid) = last.filter(|&p| process::is_alive(p)) {
                println!(
                    "agent started (pid {pid}); it has not reported itself within {}s",
                    within.as_secs()
                );
                return Ok(ExitCode::SUCCESS);
            }
            anyhow::bail!(
                "agent did not start within {}s; see {} and {}",
                within.as_secs(),
                home.agent_out().display(),
                home.logs().join("service.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the agent: for the updater only the agent (the service stays up); otherwise
/// the service, which stops its agent first.
fn stop(name: &str, home: &AgentHome) -> anyhow::Result<ExitCode> {
    let agent = process::running_agent(home);
    let stop_timeout = agent_service::knobs::stop_timeout();
    if for_updater() && running(name) {
        home::write_request(home, Request::Stop)?;
        if let Some(pid) = agent
            && !process::wait_gone(pid, stop_timeout + Duration::from_secs(10))
        {
            anyhow::bail!(
                "agent (pid {pid}) did not stop; see {}",
                home.logs().join("service.log").display()
            );
        }
    } else {
        // Asked for by whoever runs this, not an updater: said before anything stops
        // (the service says it too, for `net stop` and a shutdown, which do not come
        // through here).
        if !for_updater() {
            home::request_stop(home, "agent-service.exe stop");
        }
        if scm::state(name).is_some() {
            scm::stop(name, stop_timeout + Duration::from_secs(10))?;
        }
    }
    // Whatever else runs of this installation goes too (a service that died, under Wine).
    if let Some(pid) = agent.filter(|&p| process::is_alive(p)) {
        process::kill(pid);
        process::wait_gone(pid, Duration::from_secs(5));
    }
    match agent {
        Some(pid) => println!("agent stopped (pid {pid})"),
        None => println!("agent is not running"),
    }
    Ok(ExitCode::SUCCESS)
}

fn status(name: &str, home: &AgentHome) -> ExitCode {
    let service = match scm::state(name) {
        Some((state, pid)) => format!(
            "service {name}: {state:?}{}",
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
        ),
        None => format!("service {name}: not installed"),
    };
    match process::running_agent(home) {
        Some(pid) => {
            println!("agent is running (pid {pid}); {service}");
            ExitCode::SUCCESS
        }
        None => {
            println!("agent is not running; {service}");
            ExitCode::FAILURE
        }
    }
}

/// Registers the service under `name`, running `<home>\bin\agent-service.exe` (copied
/// there from `current`'s version), and starts it unless `no_start`.
fn install(name: &str, home: &AgentHome, no_start: bool) -> anyhow::Result<ExitCode> {
    let exe = home::installed_exe(home);
    if !exe.is_file() {
        anyhow::bail!(
            "{} is missing; install the agent with agent-bundle --install",
            exe.display()
        );
    }
    if scm::state(name).is_some() {
        anyhow::bail!(
            "a service named {name} exists already; pick another with --service-name, or remove it with agent-service.exe uninstall --service-name {name}"
        );
    }
    scm::install(name, &exe, home)?;
    agent_extract::atomic::write(&home::name_file(home), format!("{name}\n").as_bytes())?;
    log(
        home,
        &format!("registered the service {name} ({})", exe.display()),
    );
    println!(
        "registered the service {name} (automatic start): {}",
        exe.display()
    );
    if no_start {
        return Ok(ExitCode::SUCCESS);
    }
    start(name, home)
}

fn uninstall(name: &str, home: &AgentHome) -> anyhow::Result<ExitCode> {
    let _ = stop(name, home);
    scm::uninstall(name)?;
    let _ = std::fs::remove_file(home::name_file(home));
    log(home, &format!("removed the service {name}"));
    println!("removed the service {name}");
    Ok(ExitCode::SUCCESS)
}

/// `restart`: the configuration the agent would read is checked first, with the agent's
/// own parser; a refused one stops nothing (the running agent keeps its configuration).
fn restart(name: &str, home: &AgentHome) -> anyhow::Result<ExitCode> {
    if let Ok(version_dir) = agent_extract::current::read_dir(&home.current()) {
        let program = version_dir.join("bin").join(layout::AGENT_EXE_WINDOWS);
        if let Err(said) = agent_service::config_check::check(&program, home.root()) {
            eprintln!("{said}");
            eprintln!(
                "{}",
                agent_service::config_check::refused(&program, "agent-service")
            );
            return Ok(ExitCode::from(layout::EXIT_CONFIG));
        }
    }
    stop(name, home)?;
    start(name, home)
}

/// Run from the new program after a self-replace: waits for the old service process to
/// end, then starts the service again (the pending start request is its to honour).
fn restart_after(name: &str, home: &AgentHome, after: Option<u32>) -> anyhow::Result<ExitCode> {
    if let Some(pid) = after {
        process::wait_gone(pid, Duration::from_secs(60));
    }
    scm::start(name, Duration::from_secs(60))?;
    log(
        home,
        &format!("the service {name} runs again on its new program"),
    );
    Ok(ExitCode::SUCCESS)
}
