//! The supervisor (`agent-service __supervise`, started by `start` in its own session):
//! runs `current/bin/agent run`, records its pid and each exit, restarts a crashed
//! agent with backoff, and ends when the agent hands over to an updater, refuses its
//! configuration or is refused by the server, or when it is asked to stop (TERM, which
//! it passes on to the agent). What follows an exit is `policy::after_exit`'s decision.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agent_protocol::env_vars;
use agent_protocol::layout::AgentHome;
use agent_service::policy::{self, AfterExit, Backoff, Idle};
use agent_updater::{lock, process};

use super::home::{self, log};

/// How often the supervisor looks at its agent and at whether it was asked to stop.
const TICK: Duration = Duration::from_millis(50);

pub(crate) fn run(home: &AgentHome) {
    // Its own session: the end of whoever started it (a terminal, an updater) does not
    // take the supervisor with it.
    process::detach();
    let stopping = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stopping)) {
            log(home, &format!("cannot watch for signal {sig}: {e}"));
        }
    }
    let me = std::process::id();
    let _ = std::fs::create_dir_all(home.run());
    home::write_state(&home.supervisor_pid_file(), &format!("{me}\n"));
    let mut backoff = Backoff::with_max(agent_service::knobs::backoff_max());
    while !stopping.load(Ordering::SeqCst) {
        let started = Instant::now();
        let program = home::agent_program(home);
        let mut child = match spawn_agent(home) {
            Ok(child) => child,
            Err(e) => {
                // Nothing ran: as a crash at once, restarted after its pause.
                let AfterExit::Restart(pause) =
                    policy::after_exit(None, Duration::ZERO, false, &mut backoff)
                else {
                    break;
                };
                log(
                    home,
                    &format!(
                        "cannot start {}: {e}; trying again in {}s",
                        program.display(),
                        pause.as_secs()
                    ),
                );
                if !pause_for(pause, &stopping) || !between_restarts(home, me) {
                    break;
                }
                continue;
            }
        };
        let pid = child.id();
        home::write_state(&home.pid_file(), &format!("{pid}\n"));
        let code = exit_code(wait_agent(&mut child, &stopping));
        home::record_exit(home, pid, code);
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        let ran = started.elapsed();
        let holder = lock::holder(&home.update_lock());
        match policy::after_exit(Some(code), ran, holder.is_some(), &mut backoff) {
            AfterExit::HandedOver => {
                log(
                    home,
                    &format!(
                        "agent exited normally; the updater (pid {}) takes over",
                        holder.unwrap_or_default()
                    ),
                );
                break;
            }
            AfterExit::Idle(idle) => {
                log(home, &idle_words(idle));
                break;
            }
            AfterExit::Restart(pause) => {
                if code == 0 {
                    log(
                        home,
                        "agent exited with code 0 but no updater holds run/update.lock; starting it again",
                    );
                }
                log(
                    home,
                    &format!(
                        "agent exited with code {code} after {}s; restarting in {}s",
                        ran.as_secs(),
                        pause.as_secs()
                    ),
                );
                if !pause_for(pause, &stopping) || !between_restarts(home, me) {
                    break;
                }
            }
        }
    }
    if home::read_pid(&home.supervisor_pid_file()) == Some(me) {
        let _ = std::fs::remove_file(home.supervisor_pid_file());
    }
}

/// Why no agent is started again, in this platform's words.
fn idle_words(idle: Idle) -> String {
    match idle {
        Idle::Refused => {
            "agent refused by the server and updates are disabled; not restarting".into()
        }
        Idle::BadConfiguration(code) => format!(
            "agent refused its configuration (exit {code}); not restarting: fix conf/agent.toml or conf/agent-env.sh (see logs/agent.out), then start it again"
        ),
    }
}

/// `current/bin/agent run`, its output appended to `logs/agent.out` (or nowhere, when
/// that cannot be opened: a full disk must not keep the agent from starting).
fn spawn_agent(home: &AgentHome) -> std::io::Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.agent_out());
    let (o, e) = match out.and_then(|f| Ok((f.try_clone()?, f))) {
        Ok((a, b)) => (Stdio::from(a), Stdio::from(b)),
        Err(_) => (Stdio::null(), Stdio::null()),
    };
    Command::new(home::agent_program(home))
        .arg("run")
        .current_dir(home.root())
        .env(env_vars::AGENT_HOME, home.root())
        // Started by an updater or not, the agent's own later hand-offs and the
        // recovery after a crash are its own.
        .env_remove(env_vars::AGENT_UPDATER_ACTIVE)
        .env(env_vars::AGENT_SUPERVISED, "1")
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e)
        .spawn()
}

/// Waits for the agent to end; once asked to stop, passes TERM on to it (once) and goes
/// on waiting (`stop` KILLs it after its timeout).
fn wait_agent(child: &mut Child, stopping: &AtomicBool) -> Option<ExitStatus> {
    let mut told = false;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return child.wait().ok(),
        }
        if !told && stopping.load(Ordering::SeqCst) {
            process::terminate(child.id());
            told = true;
        }
        std::thread::sleep(TICK);
    }
}

/// The exit code as a shell reports it: the code, or 128 + the signal that ended it.
fn exit_code(status: Option<ExitStatus>) -> i32 {
    match status {
        Some(s) => s
            .code()
            .or_else(|| s.signal().map(|sig| 128 + sig))
            .unwrap_or(-1),
        None => -1,
    }
}

/// Sleeps `pause` unless asked to stop first; false when asked.
fn pause_for(pause: Duration, stopping: &AtomicBool) -> bool {
    let end = Instant::now() + pause;
    while Instant::now() < end {
        if stopping.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(TICK.min(end.saturating_duration_since(Instant::now())));
    }
    !stopping.load(Ordering::SeqCst)
}

/// Between two starts: runs recovery when an update was interrupted, and says whether
/// this supervisor goes on (false: recovery started an agent or a supervisor of its
/// own, which takes over).
fn between_restarts(home: &AgentHome, me: u32) -> bool {
    // While recovery runs this supervisor steps aside: the updater starts agents through
    // `start`, which must not take it for a supervisor between restarts (and leave the
    // start to it, while it waits for the updater).
    let _ = std::fs::remove_file(home.supervisor_pid_file());
    home::recover(home);
    if let Some(pid) = home::read_pid(&home.pid_file()).filter(|&p| process::is_agent(p, home)) {
        log(
            home,
            &format!("an agent (pid {pid}) was started by recovery; this supervisor ends"),
        );
        return false;
    }
    if let Some(sup) = process::running_supervisor(home).filter(|&s| s != me) {
        log(
            home,
            &format!("recovery started a supervisor (pid {sup}); this one ends"),
        );
        return false;
    }
    home::write_state(&home.supervisor_pid_file(), &format!("{me}\n"));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_read_as_the_shell_reads_them() {
        assert_eq!(exit_code(Some(ExitStatus::from_raw(3 << 8))), 3);
        assert_eq!(exit_code(Some(ExitStatus::from_raw(9))), 137);
        assert_eq!(exit_code(None), -1);
    }
}
