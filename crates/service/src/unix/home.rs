//! Where things are and what the supervisor shares with the agent and the updater: the
//! agent's home, the pid and exit files in `run/`, the log, the stop request, recovery
//! of an interrupted update, and a workload an agent left behind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_protocol::env_vars;
use agent_protocol::layout::{self, AgentHome};
use agent_service::clock::{now_secs, timestamp};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// `--home`, else `AGENT_HOME` (the wrapper sets it), else the home this program lies
/// in: `<home>/versions/<v>/bin/agent-service`.
pub(crate) fn discover(flag: Option<&Path>) -> anyhow::Result<AgentHome> {
    if let Some(home) = flag
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(env_vars::AGENT_HOME).map(PathBuf::from))
    {
        return Ok(AgentHome::new(home));
    }
    let exe = std::env::current_exe()?;
    exe.ancestors()
        .nth(3)
        .filter(|home| home.join("versions").is_dir())
        .map(AgentHome::new)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "cannot tell which agent this is: {} lies in no <home>/versions/<v>/bin/; pass --home AGENT_HOME",
                exe.display()
            )
        })
}

/// `<home>/current/bin/agent`: what the supervisor runs (the link is followed at each
/// start, so a start after an update runs the new version).
pub(crate) fn agent_program(home: &AgentHome) -> PathBuf {
    home.current().join("bin").join(layout::AGENT_BIN)
}

/// Appends a line to `logs/wrapper.log`, in one write (O_APPEND keeps the lines of the
/// supervisor and of a command run beside it whole). A log that cannot be written
/// loses the line, nothing else.
pub(crate) fn log(home: &AgentHome, text: &str) {
    let _ = std::fs::create_dir_all(home.logs());
    let line = format!("{} agent-service: {text}\n", timestamp(now_secs()));
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.wrapper_log())
    {
        let _ = file.write_all(line.as_bytes());
    }
}

pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Writes a small state file in place, as the shell did (`echo > file`): on a full disk
/// it is left empty, which every reader takes for "unknown" and looks at the processes
/// instead, never for a stale pid.
pub(crate) fn write_state(path: &Path, text: &str) {
    let _ = std::fs::write(path, text);
}

/// Records the agent's exit in `run/agent.exit` (`<pid> <exit code> <unix seconds>`),
/// which `start` and the updater read to tell a crash from a slow start.
pub(crate) fn record_exit(home: &AgentHome, pid: u32, code: i32) {
    write_state(&home.exit_file(), &format!("{pid} {code} {}\n", now_secs()));
}

/// The exit code `run/agent.exit` records for agent `pid`.
pub(crate) fn exit_code_of(home: &AgentHome, pid: u32) -> Option<i32> {
    let text = std::fs::read_to_string(home.exit_file()).ok()?;
    agent_updater::health::parse_exit_file(&text)
        .filter(|(p, _)| *p == pid)
        .map(|(_, code)| code)
}

/// Writes `run/stop-requested` (`<unix seconds> <who asked>`) before a stop that was
/// asked for; a write that fails only loses the words (the stop goes on).
pub(crate) fn request_stop(home: &AgentHome, by: &str) {
    let asked = agent_protocol::journal::StopRequest {
        at: now_secs(),
        by: by.to_owned(),
    };
    let _ = std::fs::create_dir_all(home.run());
    write_state(&home.stop_request(), &asked.to_line());
}

/// Removes `run/stop-requested`: a start ends whatever stop was asked for before it.
pub(crate) fn clear_stop_request(home: &AgentHome) {
    let _ = std::fs::remove_file(home.stop_request());
}

/// Finishes or rolls back an update that was interrupted (the updater died, or the new
/// version keeps crashing before it committed): `data/update/updater --recover`, waited
/// for. Nothing to do without a journal; an updater that still holds `run/update.lock`
/// makes it a no-op.
pub(crate) fn recover(home: &AgentHome) {
    if !home.journal().is_file() {
        return;
    }
    let updater = home.update_dir().join(layout::updater_file_name());
    if !is_executable(&updater) {
        return;
    }
    log(home, "an update was interrupted; running recovery");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.wrapper_log());
    let (o, e) = match out.and_then(|f| Ok((f.try_clone()?, f))) {
        Ok((a, b)) => (Stdio::from(a), Stdio::from(b)),
        Err(_) => (Stdio::null(), Stdio::null()),
    };
    let ran = Command::new(&updater)
        .arg(format!("--update={}", home.root().display()))
        .arg("--recover")
        .env_remove(env_vars::AGENT_UPDATER_ACTIVE)
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e)
        .status();
    match ran {
        Ok(status) if status.success() => {}
        Ok(status) => log(
            home,
            &format!(
                "recovery did not finish ({status}); see {}",
                home.update_log().display()
            ),
        ),
        Err(e) => log(
            home,
            &format!("cannot run recovery {}: {e}", updater.display()),
        ),
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The workload's process group if the agent left it running (it was killed before it
/// could stop it) and the record still names that very process: `run/workload.pid`,
/// and `run/workload.starttime` matching the process's start time now.
pub(crate) fn leftover_workload(home: &AgentHome) -> Option<u32> {
    let pid = read_pid(&home.workload_pid_file())?;
    let record = std::fs::read_to_string(home.workload_start_file()).ok()?;
    let mut fields = record.split_whitespace();
    let recorded: u32 = fields.next()?.parse().ok()?;
    let ticks: u64 = fields.next()?.parse().ok()?;
    (recorded == pid && start_ticks(pid) == Some(ticks)).then_some(pid)
}

/// The start time of `pid` in clock ticks since boot (`/proc/<pid>/stat`, field 22):
/// with the pid, it names one process for the whole uptime.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: count after its end.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(crate) fn signal_group(pgid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pgid) {
        let _ = signal::killpg(Pid::from_raw(raw), sig);
    }
}

/// Stops the whole process group of a workload its agent left behind: TERM, up to 10 s,
/// then KILL.
pub(crate) fn stop_leftover_workload(home: &AgentHome) {
    let Some(pgid) = leftover_workload(home) else {
        return;
    };
    log(
        home,
        &format!("the agent left its workload (pid {pgid}) running; stopping its process group"),
    );
    signal_group(pgid, Signal::SIGTERM);
    let end = Instant::now() + Duration::from_secs(10);
    while agent_updater::process::is_alive(pgid) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal_group(pgid, Signal::SIGKILL);
    let _ = std::fs::remove_file(home.workload_pid_file());
    let _ = std::fs::remove_file(home.workload_start_file());
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_start_time() {
        assert!(super::start_ticks(std::process::id()).is_some());
    }
}
