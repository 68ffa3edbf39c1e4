//! Processes of an installation: the agent and its wrapper's supervisor, found by pid
//! file and checked by command line before any signal is sent (a pid may be recycled).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_protocol::layout::AgentHome;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// True if `pid` is `agent run` of the installation at `home`.
pub fn is_agent(pid: u32, home: &AgentHome) -> bool {
    is_alive(pid)
        && cmdline(pid).is_some_and(|c| {
            c.contains("/bin/agent run") && c.contains(&home.root().display().to_string())
        })
}

pub fn is_supervisor(pid: u32) -> bool {
    is_alive(pid) && cmdline(pid).is_some_and(|c| c.contains("agent-wrapper.sh __supervise"))
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The agent pid the wrapper's supervisor last recorded, alive or not.
pub fn recorded_agent_pid(home: &AgentHome) -> Option<u32> {
    read_pid(&home.pid_file())
}

/// The running agent of this installation, if any: the one `run/agent.pid` names or,
/// when that file says nothing useful (a full disk can leave it empty), one found among
/// the processes.
pub fn running_agent(home: &AgentHome) -> Option<u32> {
    read_pid(&home.pid_file())
        .filter(|&p| is_agent(p, home))
        .or_else(|| find_agent(home))
}

fn find_agent(home: &AgentHome) -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .find(|&pid| is_agent(pid, home))
}

pub fn running_supervisor(home: &AgentHome) -> Option<u32> {
    read_pid(&home.run().join("wrapper.pid")).filter(|&p| is_supervisor(p))
}

pub fn send(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = signal::kill(Pid::from_raw(raw), sig);
    }
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
        send(sup, Signal::SIGTERM);
    }
    if is_agent(pid, home) {
        send(pid, Signal::SIGTERM);
    }
    if wait_gone(pid, Duration::from_secs(10)) {
        stop_supervisor(home);
        return Stopped::Terminated;
    }
    if is_agent(pid, home) {
        send(pid, Signal::SIGKILL);
    }
    wait_gone(pid, Duration::from_secs(5));
    stop_supervisor(home);
    Stopped::Killed
}

/// A supervisor whose agent exited 0 ends by itself; give it a moment, then end it.
fn stop_supervisor(home: &AgentHome) {
    if let Some(sup) = running_supervisor(home) {
        if !wait_gone(sup, Duration::from_secs(3)) {
            send(sup, Signal::SIGTERM);
            if !wait_gone(sup, Duration::from_secs(5)) {
                send(sup, Signal::SIGKILL);
            }
        }
    }
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
    let script = version_dir.join("bin/agent-wrapper.sh");
    let mut cmd = Command::new(&script);
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
