//! Processes on Linux, read from `/proc` and signalled with kill(2).

use std::path::{Path, PathBuf};
use std::process::Command;

use agent_protocol::layout::{AgentHome, SERVICE_BIN, SUPERVISE_COMMAND, WRAPPER_SCRIPT};
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

/// True if `pid` supervises an agent: `agent-service __supervise`, or the supervisor of
/// a version from before `agent-service` (`agent-wrapper.sh __supervise`), which an
/// update from such a version finds running.
pub fn is_supervisor(pid: u32) -> bool {
    is_alive(pid) && cmdline(pid).is_some_and(|c| supervises(&c))
}

/// Whether a command line (arguments joined by spaces) is a supervisor's.
fn supervises(cmdline: &str) -> bool {
    let mut words = cmdline.split(' ');
    let program = words.next().unwrap_or_default();
    let service = format!("/{SERVICE_BIN}");
    (program.ends_with(&service) && words.any(|w| w == SUPERVISE_COMMAND))
        || cmdline.contains(&format!("{WRAPPER_SCRIPT} {SUPERVISE_COMMAND}"))
}

pub(super) fn find_agent(home: &AgentHome) -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .find(|&pid| is_agent(pid, home))
}

fn send(pid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = signal::kill(Pid::from_raw(raw), sig);
    }
}

pub(super) fn terminate(pid: u32) {
    send(pid, Signal::SIGTERM);
}

pub(super) fn kill(pid: u32) {
    send(pid, Signal::SIGKILL);
}

/// `<version_dir>/bin/agent-wrapper.sh`, the version's own wrapper.
pub(super) fn wrapper_command(_home: &AgentHome, version_dir: &Path) -> (PathBuf, Command) {
    let script = version_dir.join("bin/agent-wrapper.sh");
    let cmd = Command::new(&script);
    (script, cmd)
}

/// A link always: Unix deletes a running program's name like any other (the updater is
/// the bundle it installs, and a link costs no room).
pub(super) fn keep_by_copy(_bundle: &Path) -> bool {
    false
}

pub(super) fn detach() {
    let _ = nix::unistd::setsid();
}

#[cfg(test)]
mod tests {
    use super::supervises;

    #[test]
    fn supervisors_old_and_new_are_known_by_their_command_line() {
        assert!(supervises(
            "/opt/agent/versions/1.0.0+1/bin/agent-service __supervise --home /opt/agent "
        ));
        assert!(supervises(
            "/bin/sh /opt/agent/versions/0.9.0+1/bin/agent-wrapper.sh __supervise "
        ));
        assert!(!supervises(
            "/opt/agent/versions/1.0.0+1/bin/agent-service stop --home /opt/agent "
        ));
        assert!(!supervises("/opt/agent/current/bin/agent run "));
        assert!(!supervises("grep __supervise "));
    }
}
