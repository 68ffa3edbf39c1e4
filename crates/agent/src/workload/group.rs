//! The workload's process group on Linux: who is in it (read from `/proc`), signals to
//! all of it, and the record in `run/` that lets the next agent find a workload its
//! predecessor left behind without mistaking a recycled pid for it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_protocol::layout::AgentHome;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

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
pub fn members(pgid: u32) -> Vec<(u32, u64)> {
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

pub fn signal_group(pgid: u32, sig: Signal) {
    if let Ok(raw) = i32::try_from(pgid) {
        let _ = signal::killpg(Pid::from_raw(raw), sig);
    }
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
    signal_group(pgid, Signal::SIGTERM);
    // A stopped process only sees TERM once it runs again.
    signal_group(pgid, Signal::SIGCONT);
    if wait_empty(pgid, timeout).await {
        return Stopped::Terminated;
    }
    signal_group(pgid, Signal::SIGKILL);
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

/// `run/workload.pid`: the workload's pid (its process group), one number.
pub fn pid_file(home: &AgentHome) -> PathBuf {
    home.run().join("workload.pid")
}

/// `run/workload.starttime`: the start time (clock ticks) of the process the pid file
/// names, so that a pid recycled by another program is never taken for the workload.
pub fn start_file(home: &AgentHome) -> PathBuf {
    home.run().join("workload.starttime")
}

/// Put in each started workload's environment, with a value unique to that start: a
/// workload whose agent was killed between starting it and recording its pid is found
/// by it.
pub const INSTANCE_ENV: &str = "AGENT_WORKLOAD_INSTANCE";

/// `run/workload.starting`: the instance ([`INSTANCE_ENV`]) of the latest start, written
/// before it.
pub fn starting_file(home: &AgentHome) -> PathBuf {
    home.run().join("workload.starting")
}

/// Notes the instance about to be started. Not synced: after a power loss no process of
/// it runs to be found.
pub fn about_to_start(home: &AgentHome, instance: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(home.run())?;
    std::fs::write(starting_file(home), format!("{instance}\n"))
}

/// Whether a `/proc/<pid>/environ` (NUL-separated) names this instance.
pub fn environ_names(environ: &[u8], instance: &str) -> bool {
    let wanted = format!("{INSTANCE_ENV}={instance}");
    environ
        .split(|b| *b == 0)
        .any(|var| var == wanted.as_bytes())
}

/// Records the running workload (the start time first: a pid file without its start
/// time is never acted on).
pub fn record(home: &AgentHome, pid: u32, ticks: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(home.run())?;
    write(&start_file(home), &format!("{pid} {ticks}\n"))?;
    write(&pid_file(home), &format!("{pid}\n"))
}

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    agent_extract::atomic::write(path, text.as_bytes())
        .map_err(|e| std::io::Error::other(e.to_string()))
}

pub fn forget(home: &AgentHome) {
    let _ = std::fs::remove_file(pid_file(home));
    let _ = std::fs::remove_file(start_file(home));
    let _ = std::fs::remove_file(starting_file(home));
}

/// A workload an agent left running: the one recorded in `run/`, or else the latest
/// one started, found by its instance in its environment. `(pgid, live members)`.
pub fn leftover(home: &AgentHome) -> Option<(u32, Vec<u32>)> {
    recorded(home).or_else(|| unrecorded(home))
}

/// The latest start's processes, when its agent died before recording it.
fn unrecorded(home: &AgentHome) -> Option<(u32, Vec<u32>)> {
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

/// The workload recorded in `run/` whose processes still run. Members count only if
/// they started no earlier than the recorded leader (a group id is not reused while any
/// member lives, and a new group under a recycled pid starts later than the record).
fn recorded(home: &AgentHome) -> Option<(u32, Vec<u32>)> {
    let pid: u32 = std::fs::read_to_string(pid_file(home))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let record = std::fs::read_to_string(start_file(home)).ok()?;
    let mut fields = record.split_whitespace();
    let recorded_pid: u32 = fields.next()?.parse().ok()?;
    let ticks: u64 = fields.next()?.parse().ok()?;
    if recorded_pid != pid {
        return None;
    }
    leftover_of(pid, ticks, &members(pid), start_ticks(pid))
}

/// The pure part of [`leftover`]: given the group's members and the leader's current
/// start time (if a process has that pid), which processes are the recorded workload.
pub fn leftover_of(
    pid: u32,
    ticks: u64,
    members: &[(u32, u64)],
    leader_now: Option<u64>,
) -> Option<(u32, Vec<u32>)> {
    // The pid now names a process that started after the record: recycled.
    if leader_now.is_some_and(|now| now != ticks) {
        return None;
    }
    let ours: Vec<u32> = members
        .iter()
        .filter(|&&(_, started)| started >= ticks)
        .map(|&(p, _)| p)
        .collect();
    (!ours.is_empty()).then_some((pid, ours))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_leader_with_its_start_time_is_the_workload() {
        assert_eq!(
            leftover_of(100, 5000, &[(100, 5000), (101, 5003)], Some(5000)),
            Some((100, vec![100, 101]))
        );
    }

    #[test]
    fn an_instance_is_found_by_its_whole_variable_only() {
        let environ = b"PATH=/bin\0AGENT_WORKLOAD_INSTANCE=abc-1\0HOME=/root\0";
        assert!(environ_names(environ, "abc-1"));
        assert!(!environ_names(environ, "abc"));
        assert!(!environ_names(environ, "abc-12"));
        assert!(!environ_names(
            b"X_AGENT_WORKLOAD_INSTANCE=abc-1\0",
            "abc-1"
        ));
        assert!(!environ_names(b"", "abc-1"));
    }

    #[test]
    fn a_recycled_pid_is_not_the_workload() {
        assert_eq!(leftover_of(100, 5000, &[(100, 9000)], Some(9000)), None);
        assert_eq!(leftover_of(100, 5000, &[], Some(9000)), None);
    }

    #[test]
    fn children_of_a_leader_that_died_are_still_the_workload() {
        assert_eq!(
            leftover_of(100, 5000, &[(130, 5100)], None),
            Some((100, vec![130]))
        );
        assert_eq!(leftover_of(100, 5000, &[], None), None);
    }

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
