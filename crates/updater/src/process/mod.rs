//! Processes of an installation: the agent and its supervisor (the wrapper's on Unix,
//! the service on Windows), found by pid file and checked by what they run before any
//! signal is sent (a pid may be recycled). How a process is looked at and signalled is
//! each platform's own ([`unix`], [`windows`]); what to do is decided here.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_protocol::layout::AgentHome;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as os;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

pub use os::{is_agent, is_alive, is_supervisor};

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The agent pid the supervisor last recorded, alive or not.
pub fn recorded_agent_pid(home: &AgentHome) -> Option<u32> {
    read_pid(&home.pid_file())
}

/// The running agent of this installation, if any: the one `run/agent.pid` names or,
/// when that file says nothing useful (a full disk can leave it empty), one found among
/// the processes.
pub fn running_agent(home: &AgentHome) -> Option<u32> {
    read_pid(&home.pid_file())
        .filter(|&p| is_agent(p, home))
        .or_else(|| os::find_agent(home))
}

pub fn running_supervisor(home: &AgentHome) -> Option<u32> {
    read_pid(&home.supervisor_pid_file()).filter(|&p| is_supervisor(p))
}

/// Asks `pid` to end (TERM on Unix, its stop event on Windows).
pub fn terminate(pid: u32) {
    os::terminate(pid);
}

/// Ends `pid` at once.
pub fn kill(pid: u32) {
    os::kill(pid);
}

/// Leaves the session of whoever started this process (so that its end does not take
/// this one with it).
pub fn detach() {
    os::detach();
}

/// Polls until `pid` is gone; true if it went within `timeout`.
pub fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while is_alive(pid) {
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    true
}

/// How the agent stopped, for the log.
pub enum Stopped {
    NotRunning,
    Exited,
    Terminated,
    Killed,
}

/// Waits for the agent `pid` to exit on its own for `patience`, then TERMs it (and its
/// supervisor, which would restart it), then KILLs. The pid is re-checked to be this
/// installation's agent before each signal.
pub fn stop_agent(home: &AgentHome, pid: Option<u32>, patience: Duration) -> Stopped {
    let Some(pid) = pid.filter(|&p| is_alive(p)) else {
        stop_supervisor(home);
        return Stopped::NotRunning;
    };
    if wait_gone(pid, patience) {
        stop_supervisor(home);
        return Stopped::Exited;
    }
    if let Some(sup) = running_supervisor(home) {
        terminate(sup);
    }
    if is_agent(pid, home) {
        terminate(pid);
    }
    if wait_gone(pid, Duration::from_secs(10)) {
        stop_supervisor(home);
        return Stopped::Terminated;
    }
    if is_agent(pid, home) {
        kill(pid);
    }
    wait_gone(pid, Duration::from_secs(5));
    stop_supervisor(home);
    Stopped::Killed
}

/// A supervisor whose agent exited 0 ends by itself; give it a moment, then end it.
fn stop_supervisor(home: &AgentHome) {
    if let Some(sup) = running_supervisor(home) {
        if !wait_gone(sup, Duration::from_secs(3)) {
            terminate(sup);
            if !wait_gone(sup, Duration::from_secs(5)) {
                kill(sup);
            }
        }
    }
}

/// Whether the updater keeps `bundle` beside its version as a copy rather than a hard
/// link: on Windows when `bundle` is the running program (see the platform module).
pub fn keep_by_copy(bundle: &Path) -> bool {
    os::keep_by_copy(bundle)
}

/// The command a person runs to start the agent by hand, in this system's words: the
/// version's `agent-wrapper.sh start`, or on Windows `<home>\bin\agent-service.exe start`.
pub fn start_command(home: &AgentHome, version_dir: &Path) -> String {
    format!(
        "{} start",
        os::wrapper_command(home, version_dir).0.display()
    )
}

/// Runs `<version_dir>/bin/agent-wrapper.sh <action>`, marked as driven by the updater
/// (so its `start` does not run recovery on the transaction this process owns).
pub fn wrapper(home: &AgentHome, version_dir: &Path, action: &str) -> Result<String, String> {
    wrapper_within(home, version_dir, action, None)
}

/// Like [`wrapper`]; `start` waits at most `within` for the agent to appear.
pub fn wrapper_within(
    home: &AgentHome,
    version_dir: &Path,
    action: &str,
    within: Option<Duration>,
) -> Result<String, String> {
    let (script, mut cmd) = os::wrapper_command(home, version_dir);
    if let Some(within) = within {
        cmd.env("AGENT_START_TIMEOUT", within.as_secs().max(1).to_string());
    }
    let out = cmd
        .arg(action)
        .env("AGENT_HOME", home.root())
        .env("AGENT_UPDATER_ACTIVE", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "{} {action} failed ({}): {text}",
            script.display(),
            out.status
        ))
    }
}
