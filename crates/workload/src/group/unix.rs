//! The workload's process group on Linux: who is in it (read from `/proc`), signals to
//! all of it, and how its output outlives a hand-over.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_protocol::layout::AgentHome;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::{environ_names, starting_file};

/// Fields of `/proc/<pid>/stat` after the command name (which may hold spaces).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The process's start time in clock ticks since boot (field 22): with the pid, it
/// names one process for the whole uptime.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Live (not zombie) processes whose process group is `pgid`, with their start times.
pub(super) fn members(pgid: u32) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(fields) = stat_fields(pid) else {
            continue;
        };
        let state = fields.first().map(String::as_str);
        let group = fields.get(2).and_then(|g| g.parse::<u32>().ok());
        let ticks = fields.get(19).and_then(|t| t.parse::<u64>().ok());
        if state != Some("Z")
            && group == Some(pgid)
            && let Some(ticks) = ticks
        {
            found.push((pid, ticks));
        }
    }
    found
}

fn send_group(pgid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pgid) {
        let _ = signal::killpg(Pid::from_raw(raw), sig);
    }
}

/// `SIGTERM` for 15: a signal's name, for messages.
pub fn signal_name(number: i32) -> Option<&'static str> {
    Signal::try_from(number).ok().map(Signal::as_str)
}

/// Signal `number` by its name (`HUP` or `SIGHUP`), for `workload.reload`.
pub fn signal_number(name: &str) -> Option<i32> {
    let name = name.to_ascii_uppercase();
    let full = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    full.parse::<Signal>().ok().map(|s| s as i32)
}

/// Sends signal `number` to the whole group; its name, for the log.
pub fn signal_group(pgid: u32, number: i32) -> Result<&'static str, String> {
    let signal =
        Signal::try_from(number).map_err(|e| format!("workload.reload: signal {number}: {e}"))?;
    send_group(pgid, signal);
    Ok(signal.as_str())
}

/// How a group was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Nothing of it ran any more.
    Gone,
    /// Every member ended after TERM within the timeout.
    Terminated,
    /// Some ignored TERM and were killed.
    Killed,
}

/// TERM to the whole group, up to `timeout` for all of it to end, then KILL.
pub async fn stop(pgid: u32, timeout: Duration) -> Stopped {
    if members(pgid).is_empty() {
        return Stopped::Gone;
    }
    send_group(pgid, Signal::SIGTERM);
    // A stopped process only sees TERM once it runs again.
    send_group(pgid, Signal::SIGCONT);
    if wait_empty(pgid, timeout).await {
        return Stopped::Terminated;
    }
    send_group(pgid, Signal::SIGKILL);
    wait_empty(pgid, Duration::from_secs(5)).await;
    Stopped::Killed
}

async fn wait_empty(pgid: u32, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    // Most programs are gone within milliseconds of TERM, and a restart's downtime is
    // this wait: learn of the leader's end at once, then look for the rest of its group
    // every millisecond for the first 100 ms, then every 20 ms.
    leader_end(pgid, timeout).await;
    let start = Instant::now();
    loop {
        if members(pgid).is_empty() {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        let pause = if now - start < Duration::from_millis(100) {
            1
        } else {
            20
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Returns when the process `pid` has ended (or at `timeout`, or at once when the kernel
/// offers no pidfd for it: the caller looks at the group itself anyway).
async fn leader_end(pid: u32, timeout: Duration) {
    use rustix::process::{Pid, PidfdFlags, pidfd_open};
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return;
    };
    let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
        return;
    };
    // A pidfd turns readable when its process ends; one blocking poll on a spare thread.
    let _ = tokio::task::spawn_blocking(move || {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let limit = Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        poll(&mut [PollFd::new(&fd, PollFlags::IN)], Some(&limit))
    })
    .await;
}

/// The latest start's processes, when its agent died before recording it.
pub(super) fn unrecorded(home: &AgentHome) -> Option<(u32, Vec<u32>)> {
    let instance = std::fs::read_to_string(starting_file(home)).ok()?;
    let instance = instance.trim();
    if instance.is_empty() {
        return None;
    }
    let entries = std::fs::read_dir("/proc").ok()?;
    // The workload leads its own group; any of its processes names it.
    let pgid = entries.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        if !environ_names(&environ, instance) {
            return None;
        }
        stat_fields(pid)?.get(2)?.parse::<u32>().ok()
    })?;
    let members: Vec<u32> = members(pgid).into_iter().map(|(p, _)| p).collect();
    (!members.is_empty()).then_some((pgid, members))
}

/// A second read end of one of the workload's output pipes.
pub type Output = OwnedFd;

/// Duplicates an output pipe's read end, for [`hand_over_output`].
pub fn output_of(pipe: &impl std::os::fd::AsFd) -> Option<Output> {
    pipe.as_fd().try_clone_to_owned().ok()
}

/// Makes the workload lead its own process group, so that it is stopped whole.
pub fn prepare(cmd: &mut tokio::process::Command) {
    cmd.process_group(0);
}

/// Nothing to do once started: the group was made at spawn.
pub fn adopt(_pid: u32) -> std::io::Result<()> {
    Ok(())
}

/// The signal that ended a process, if one did.
pub fn exit_signal(status: &std::process::ExitStatus) -> Option<i32> {
    status.signal()
}

/// Starts `cat` reading one of the workload's output pipes into the log, so that it
/// outlives this agent. tokio put the pipe in non-blocking mode (a flag of the open
/// pipe, shared by every duplicate), which `cat` does not expect.
pub fn hand_over_output(fd: OwnedFd, log: &Path) -> Result<(), String> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(&fd, FcntlArg::F_GETFL).map_err(|e| format!("fcntl: {e}"))?;
    let blocking = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(&fd, FcntlArg::F_SETFL(blocking)).map_err(|e| format!("fcntl: {e}"))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut cat = std::process::Command::new("cat");
    // Not the workload's group (its stop must not take the reader first), nor the
    // agent's (the wrapper's).
    std::os::unix::process::CommandExt::process_group(&mut cat, 0)
        .stdin(Stdio::from(fd))
        .stdout(Stdio::from(file))
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("cannot start cat: {e}"))
}

/// The status of a process whose end could not be read.
pub fn unknown_exit() -> std::process::ExitStatus {
    std::process::ExitStatus::from_raw(-1)
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_group() {
        let me = std::process::id();
        let ticks = start_ticks(me).unwrap();
        let pgid = nix::unistd::getpgrp().as_raw() as u32;
        assert!(members(pgid).iter().any(|&(p, t)| p == me && t == ticks));
    }

    /// A process group of a shell and two sleeps, with `env`, once all three run. Its
    /// leader is reaped by a thread of its own, as init would reap an orphan.
    async fn a_group_of_three(
        env: &[(&str, &str)],
    ) -> (
        u32,
        std::thread::JoinHandle<std::io::Result<std::process::ExitStatus>>,
    ) {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "sleep 60 & sleep 60; wait"])
            .envs(env.iter().copied())
            .process_group(0);
        let mut child = cmd.spawn().unwrap();
        let pgid = child.id();
        let reaper = std::thread::spawn(move || child.wait());
        let deadline = Instant::now() + Duration::from_secs(10);
        while members(pgid).len() < 3 {
            assert!(
                Instant::now() < deadline,
                "the group never had its three processes"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (pgid, reaper)
    }

    /// A group whose leader is not our child (as a predecessor's workload is not): its
    /// end is seen, the leader's children go with it, and nothing is left.
    #[tokio::test]
    async fn a_group_is_stopped_whole_and_seen_gone() {
        let (pgid, reaper) = a_group_of_three(&[]).await;
        assert_eq!(
            stop(pgid, Duration::from_secs(10)).await,
            Stopped::Terminated
        );
        assert!(members(pgid).is_empty());
        assert_eq!(stop(pgid, Duration::from_secs(10)).await, Stopped::Gone);
        reaper.join().unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_workload_started_but_never_recorded_is_found_by_its_instance() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        let instance = uuid::Uuid::now_v7().simple().to_string();
        about_to_start(&home, &instance).unwrap();
        // As an agent killed right after the start: no pid file, no start time.
        let (pgid, reaper) = a_group_of_three(&[(INSTANCE_ENV, &instance)]).await;
        assert!(!pid_file(&home).exists());
        let (found, mut members_found) = leftover(&home).expect("found by its instance");
        assert_eq!(found, pgid);
        members_found.sort_unstable();
        let mut all: Vec<u32> = members(pgid).into_iter().map(|(p, _)| p).collect();
        all.sort_unstable();
        assert_eq!(members_found, all);
        // Another instance's note finds nothing of it.
        about_to_start(&home, "someone-else").unwrap();
        assert_eq!(leftover(&home), None);
        stop(pgid, Duration::from_secs(10)).await;
        reaper.join().unwrap().unwrap();
        forget(&home);
        assert!(!starting_file(&home).exists());
    }
}
