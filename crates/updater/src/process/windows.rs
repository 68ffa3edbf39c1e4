//! Processes on Windows: looked at through their image path (a pid may be recycled, and
//! another process's command line is not readable without its memory), asked to stop
//! through the named event each agent waits on, ended with TerminateProcess.
// Win32 calls: std has no process inspection beyond its own children.
#![allow(unsafe_code)]

use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_protocol::layout::{self, AgentHome};
use windows_sys::Win32::Foundation::{HANDLE, STILL_ACTIVE};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, PROCESSENTRY32W, Process32FirstW, Process32NextW, TH32CS_SNAPPROCESS,
};
use windows_sys::Win32::System::Threading::{
    EVENT_MODIFY_STATE, GetExitCodeProcess, OpenEventW, OpenProcess, PROCESS_NAME_WIN32,
    PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_TERMINATE, QueryFullProcessImageNameW, SetEvent,
    TerminateProcess,
};

/// A handle this module just opened, owned (closed when dropped); `None` for null.
fn owned(h: HANDLE) -> Option<OwnedHandle> {
    // SAFETY: a live handle that nothing else owns or closes.
    (!h.is_null()).then(|| unsafe { OwnedHandle::from_raw_handle(h) })
}

fn open(pid: u32, access: u32) -> Option<OwnedHandle> {
    // SAFETY: plain call; a null handle is checked.
    owned(unsafe { OpenProcess(access, 0, pid) })
}

pub fn is_alive(pid: u32) -> bool {
    let Some(h) = open(pid, PROCESS_QUERY_LIMITED_INFORMATION) else {
        return false;
    };
    let mut code = 0u32;
    // SAFETY: a live handle and a valid out pointer.
    let ok = unsafe { GetExitCodeProcess(h.as_raw_handle(), &mut code) };
    ok != 0 && code == STILL_ACTIVE as u32
}

/// The full path of the program `pid` runs, while it runs.
pub(super) fn image_path(pid: u32) -> Option<PathBuf> {
    let h = open(pid, PROCESS_QUERY_LIMITED_INFORMATION)?;
    let mut buf = vec![0u16; 32768];
    let mut len = buf.len() as u32;
    // SAFETY: `len` is the buffer's size in u16s; the call writes at most that many.
    let ok = unsafe {
        QueryFullProcessImageNameW(
            h.as_raw_handle(),
            PROCESS_NAME_WIN32,
            buf.as_mut_ptr(),
            &mut len,
        )
    };
    if ok == 0 {
        return None;
    }
    buf.truncate(len as usize);
    Some(PathBuf::from(String::from_utf16_lossy(&buf)))
}

/// A path for comparing: no `\\?\` prefix, `\` separators, lower case (Windows file
/// names compare without case).
pub(super) fn comparable(path: &Path) -> String {
    let text = path.display().to_string().replace('/', "\\");
    let text = text.strip_prefix(r"\\?\").unwrap_or(&text);
    text.to_lowercase()
}

/// True if `pid` runs `<home>\versions\<v>\bin\agent.exe` (or the `current` form), and
/// not the launcher `<home>\bin\agent.exe`, which runs the agent's commands (`agent
/// uninstall`) and is no agent to stop.
pub fn is_agent(pid: u32, home: &AgentHome) -> bool {
    if !is_alive(pid) {
        return false;
    }
    let Some(image) = image_path(pid) else {
        return false;
    };
    let image = comparable(&image);
    let root = comparable(home.root());
    image.starts_with(&format!("{root}\\"))
        && image.ends_with("\\bin\\agent.exe")
        && image != format!("{root}\\bin\\agent.exe")
}

/// True if `pid` runs an `agent-service.exe`.
pub fn is_supervisor(pid: u32) -> bool {
    is_alive(pid)
        && image_path(pid).is_some_and(|p| comparable(&p).ends_with("\\agent-service.exe"))
}

/// Every process, as (pid, parent pid).
fn processes() -> Vec<(u32, u32)> {
    // SAFETY: plain call; an invalid handle is checked.
    let snap = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPPROCESS, 0) };
    if snap.is_null() || snap as isize == -1 {
        return Vec::new();
    }
    let Some(snap) = owned(snap) else {
        return Vec::new();
    };
    // SAFETY: PROCESSENTRY32W is plain data; dwSize is set before use as the API asks.
    let mut entry: PROCESSENTRY32W = unsafe { std::mem::zeroed() };
    entry.dwSize = std::mem::size_of::<PROCESSENTRY32W>() as u32;
    let mut pids = Vec::new();
    // SAFETY: a live snapshot handle and an entry with its size set.
    let mut more = unsafe { Process32FirstW(snap.as_raw_handle(), &mut entry) } != 0;
    while more {
        pids.push((entry.th32ProcessID, entry.th32ParentProcessID));
        // SAFETY: as above.
        more = unsafe { Process32NextW(snap.as_raw_handle(), &mut entry) } != 0;
    }
    pids
}

/// An agent.exe of this home other than this process and the one that started it: a
/// Windows process's command line is not at hand, so `agent.exe uninstall` (or `status`)
/// running `agent-service.exe stop` would otherwise be taken for the agent and ended.
pub(super) fn find_agent(home: &AgentHome) -> Option<u32> {
    let me = std::process::id();
    let all = processes();
    let asker = all
        .iter()
        .find(|&&(pid, _)| pid == me)
        .map(|&(_, parent)| parent);
    all.into_iter()
        .map(|(pid, _)| pid)
        .filter(|&pid| pid != me && pid != 0 && Some(pid) != asker)
        .find(|&pid| is_agent(pid, home))
}

/// Sets the agent's stop event (`Global\agent-stop-<pid>`); an agent that has none
/// (not one of ours, or not yet listening) is left to [`kill`].
pub(super) fn terminate(pid: u32) {
    let name: Vec<u16> = layout::stop_event_name(pid)
        .encode_utf16()
        .chain(Some(0))
        .collect();
    // SAFETY: a NUL-terminated name; a null handle is checked.
    let event = unsafe { OpenEventW(EVENT_MODIFY_STATE, 0, name.as_ptr()) };
    if event.is_null() {
        return;
    }
    let Some(event) = owned(event) else {
        return;
    };
    // SAFETY: a live event handle.
    unsafe { SetEvent(event.as_raw_handle()) };
}

pub(super) fn kill(pid: u32) {
    if let Some(h) = open(pid, PROCESS_TERMINATE) {
        // SAFETY: a live handle with terminate access.
        unsafe { TerminateProcess(h.as_raw_handle(), 1) };
    }
}

/// `<home>\bin\agent-service.exe`, the installed service's own program (it answers
/// `start|stop|restart|status` like the wrapper); the version's copy when the home has
/// none (installed without the service).
pub(super) fn wrapper_command(home: &AgentHome, version_dir: &Path) -> (PathBuf, Command) {
    let installed = home.root().join("bin").join(layout::SERVICE_EXE);
    let program = if installed.is_file() {
        installed
    } else {
        version_dir.join("bin").join(layout::SERVICE_EXE)
    };
    let cmd = Command::new(&program);
    (program, cmd)
}

/// A copy when `bundle` is this very program (an MSI's bundle updating the agent
/// itself): a hard link would be a name of a running program inside `versions\`, which
/// Windows refuses to delete, and would change with the MSI's file. The agent's own
/// updates run a copy (`data\update\updater.exe`) on the downloaded bundle: a link.
pub(super) fn keep_by_copy(bundle: &Path) -> bool {
    let canonical = |p: &Path| agent_extract::os::canonical(p).ok();
    std::env::current_exe()
        .ok()
        .and_then(|exe| canonical(&exe))
        .is_some_and(|exe| Some(exe) == canonical(bundle))
}

/// The agent starts the updater detached and out of the service's job
/// (`DETACHED_PROCESS`, `CREATE_BREAKAWAY_FROM_JOB`): nothing is left to leave here.
pub(super) fn detach() {}
