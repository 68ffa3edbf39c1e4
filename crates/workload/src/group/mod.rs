//! The workload's process group: the record in `run/` that lets the next agent find a
//! workload its predecessor left behind without mistaking a recycled pid for it, and
//! (per platform) who is in the group and how it is stopped: a process group read from
//! `/proc` on Linux ([`unix`]), a job object on Windows ([`windows`]).

use std::path::{Path, PathBuf};

use agent_protocol::layout::AgentHome;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as os;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

pub use os::{
    Output, Stopped, adopt, exit_signal, hand_over_output, output_of, prepare, signal_group,
    signal_name, signal_number, start_ticks, stop, unknown_exit,
};

/// `run/workload.pid` ([`AgentHome::workload_pid_file`]).
pub fn pid_file(home: &AgentHome) -> PathBuf {
    home.workload_pid_file()
}

/// `run/workload.starttime` ([`AgentHome::workload_start_file`]).
pub fn start_file(home: &AgentHome) -> PathBuf {
    home.workload_start_file()
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
    recorded(home).or_else(|| os::unrecorded(home))
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
    leftover_of(pid, ticks, &os::members(pid), start_ticks(pid))
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
}
