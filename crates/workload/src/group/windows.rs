//! The workload on Windows: in a job object of its own (nested in the service's job),
//! so that it and every process it starts end together. Windows has no TERM for a
//! program without a console: stopping ends the job. The job is closed with the agent
//! (kill-on-close), so a workload never outlives an agent that died, and none is left
//! serving across a hand-over.
// Win32 job and process calls have no safe wrapper in std.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent_protocol::layout::AgentHome;
use windows_sys::Win32::Foundation::{FILETIME, HANDLE};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectExtendedLimitInformation,
    SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Threading::{
    CREATE_NEW_PROCESS_GROUP, CREATE_NO_WINDOW, GetProcessTimes, OpenProcess,
    PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SET_QUOTA, PROCESS_TERMINATE, TerminateProcess,
};

/// How a group was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Nothing of it ran any more.
    Gone,
    /// Its job was ended.
    Terminated,
    /// A workload without a job (another agent's) was ended by its pid.
    Killed,
}

/// A handle this module just opened, owned (closed when dropped); `None` for null.
fn owned(h: HANDLE) -> Option<OwnedHandle> {
    // SAFETY: a live handle that nothing else owns or closes.
    (!h.is_null()).then(|| unsafe { OwnedHandle::from_raw_handle(h) })
}

/// The job of each workload this agent started, by the workload's pid.
static JOBS: Mutex<Option<HashMap<u32, OwnedHandle>>> = Mutex::new(None);

fn open(pid: u32, access: u32) -> Option<OwnedHandle> {
    // SAFETY: plain call; a null handle is checked.
    owned(unsafe { OpenProcess(access, 0, pid) })
}

/// The process's creation time (100 ns units since 1601): with the pid, it names one
/// process.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let h = open(pid, PROCESS_QUERY_LIMITED_INFORMATION)?;
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
    // SAFETY: a live handle and four valid out pointers.
    let ok = unsafe {
        GetProcessTimes(
            h.as_raw_handle(),
            &mut created,
            &mut exited,
            &mut kernel,
            &mut user,
        )
    };
    if ok == 0 || !agent_updater::process::is_alive(pid) {
        return None;
    }
    Some((u64::from(created.dwHighDateTime) << 32) | u64::from(created.dwLowDateTime))
}

/// The recorded workload itself while it runs (its children are in its job).
pub(super) fn members(pid: u32) -> Vec<(u32, u64)> {
    start_ticks(pid).map(|t| vec![(pid, t)]).unwrap_or_default()
}

/// A workload whose agent died before recording it ended with that agent's job.
pub(super) fn unrecorded(_home: &AgentHome) -> Option<(u32, Vec<u32>)> {
    None
}

/// No window, and a process group of its own (a console control event for the agent
/// does not reach it).
pub fn prepare(cmd: &mut tokio::process::Command) {
    cmd.creation_flags(CREATE_NO_WINDOW | CREATE_NEW_PROCESS_GROUP);
}

/// Puts the started workload in a job of its own that ends it, and whatever it starts,
/// when closed.
pub fn adopt(pid: u32) -> std::io::Result<()> {
    let last = std::io::Error::last_os_error;
    // SAFETY: plain call; a null handle is checked.
    let job = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
    let job = owned(job).ok_or_else(last)?;
    // SAFETY: plain data, zeroed as the API expects before the flags are set.
    let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
    limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
    // SAFETY: a live job handle and a pointer to a struct of the size passed.
    let ok = unsafe {
        SetInformationJobObject(
            job.as_raw_handle(),
            JobObjectExtendedLimitInformation,
            (&raw const limits).cast(),
            std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
        )
    };
    if ok == 0 {
        return Err(last());
    }
    let process = open(pid, PROCESS_SET_QUOTA | PROCESS_TERMINATE).ok_or_else(last)?;
    // SAFETY: live job and process handles.
    if unsafe { AssignProcessToJobObject(job.as_raw_handle(), process.as_raw_handle()) } == 0 {
        return Err(last());
    }
    let mut jobs = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    jobs.get_or_insert_with(HashMap::new).insert(pid, job);
    Ok(())
}

/// Ends the workload `pid` and everything in its job, and waits (up to `timeout`, at
/// least a few seconds) for it to be gone.
pub async fn stop(pid: u32, timeout: Duration) -> Stopped {
    let job = {
        let mut jobs = JOBS.lock().unwrap_or_else(|p| p.into_inner());
        jobs.get_or_insert_with(HashMap::new).remove(&pid)
    };
    let how = match job {
        Some(job) => {
            // SAFETY: a live job handle; dropping it afterwards closes it.
            unsafe { TerminateJobObject(job.as_raw_handle(), 1) };
            Stopped::Terminated
        }
        None => {
            if !agent_updater::process::is_alive(pid) {
                return Stopped::Gone;
            }
            if let Some(h) = open(pid, PROCESS_TERMINATE) {
                // SAFETY: a live handle with terminate access.
                unsafe { TerminateProcess(h.as_raw_handle(), 1) };
            }
            Stopped::Killed
        }
    };
    let end = Instant::now() + timeout.max(Duration::from_secs(5));
    while agent_updater::process::is_alive(pid) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    how
}

/// Windows has no signals: `workload.reload` is `restart` there.
pub fn signal_group(_pid: u32, _number: i32) -> Result<&'static str, String> {
    Err("workload.reload: signals do not exist on Windows; use reload = \"restart\"".into())
}

pub fn signal_name(_number: i32) -> Option<&'static str> {
    None
}

pub fn signal_number(_name: &str) -> Option<i32> {
    None
}

pub fn exit_signal(_status: &std::process::ExitStatus) -> Option<i32> {
    None
}

/// Stands for an output pipe: on Windows the workload is not left serving.
pub struct Output;

pub fn output_of<T>(_pipe: &T) -> Option<Output> {
    Some(Output)
}

/// The workload's job closes with this agent, so it cannot serve on after it: the
/// caller stops it instead.
pub fn hand_over_output(_output: Output, _log: &Path) -> Result<(), String> {
    Err("on Windows the workload ends with its agent's job".into())
}
/// The status of a process whose end could not be read.
pub fn unknown_exit() -> std::process::ExitStatus {
    use std::os::windows::process::ExitStatusExt;
    std::process::ExitStatus::from_raw(u32::MAX)
}
