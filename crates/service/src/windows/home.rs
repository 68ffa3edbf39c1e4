//! Where things are: the agent's home, the service's name, the files the service shares
//! with the agent, the updater and its own command line.

use std::io::Write;
use std::os::windows::io::AsRawHandle;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_protocol::layout::{self, AgentHome};
use windows_sys::Win32::Storage::FileSystem::{LOCKFILE_EXCLUSIVE_LOCK, LockFileEx, UnlockFileEx};
use windows_sys::Win32::System::IO::OVERLAPPED;

/// The service name when nothing else names it.
pub(crate) const DEFAULT_NAME: &str = "agent";

/// `data\service-name`: the name `--install` registered the service under.
pub(crate) fn name_file(home: &AgentHome) -> PathBuf {
    home.data().join("service-name")
}

/// `--service-name`, else `AGENT_SERVICE_NAME`, else what `--install` recorded, else
/// `agent`.
pub(crate) fn service_name(flag: Option<&str>, home: &AgentHome) -> String {
    flag.map(str::to_owned)
        .or_else(|| std::env::var("AGENT_SERVICE_NAME").ok())
        .or_else(|| {
            let text = std::fs::read_to_string(name_file(home)).ok()?;
            let name = text.trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
        .unwrap_or_else(|| DEFAULT_NAME.to_owned())
}

/// `--home`, else `AGENT_HOME`, else the home this program lies in: `<home>\bin\` (the
/// installed service) or `<home>\versions\<v>\bin\` (a version's copy).
pub(crate) fn discover(flag: Option<&Path>) -> anyhow::Result<AgentHome> {
    if let Some(home) = flag
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("AGENT_HOME").map(PathBuf::from))
    {
        return Ok(AgentHome::new(home));
    }
    let exe = std::env::current_exe()?;
    let found = exe
        .ancestors()
        .skip(2)
        .step_by(2)
        .take(2)
        .find(|dir| dir.join("versions").is_dir())
        .map(Path::to_path_buf);
    found.map(AgentHome::new).ok_or_else(|| {
        anyhow::anyhow!(
            "cannot tell which agent this is: {} lies in no <home>\\bin\\; pass --home AGENT_HOME",
            exe.display()
        )
    })
}

/// `<home>\bin\agent-service.exe`: the program the service runs (its binPath).
pub(crate) fn installed_exe(home: &AgentHome) -> PathBuf {
    home.root().join("bin").join(layout::SERVICE_EXE)
}

/// Writes `run\stop-requested` (`<unix seconds> <who asked>`), before a stop that was
/// asked for; a write that fails only loses the words (the stop goes on).
pub(crate) fn request_stop(home: &AgentHome, by: &str) {
    let asked = agent_protocol::journal::StopRequest {
        at: now_secs(),
        by: by.to_owned(),
    };
    let _ = std::fs::create_dir_all(home.run());
    let _ = agent_extract::atomic::write(&home.stop_request(), asked.to_line().as_bytes());
}

/// Removes `run\stop-requested`: a start ends whatever stop was asked for before it.
pub(crate) fn clear_stop_request(home: &AgentHome) {
    let _ = std::fs::remove_file(home.stop_request());
}

/// `run\service.request`: `start` or `stop`, written by `agent-service.exe start|stop`
/// on the updater's behalf and taken by the running service.
pub(crate) fn request_file(home: &AgentHome) -> PathBuf {
    home.run().join("service.request")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    Start,
    Stop,
}

pub(crate) fn write_request(home: &AgentHome, request: Request) -> std::io::Result<()> {
    std::fs::create_dir_all(home.run())?;
    let text = match request {
        Request::Start => "start\n",
        Request::Stop => "stop\n",
    };
    agent_extract::atomic::write(&request_file(home), text.as_bytes())
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Reads and removes the pending request.
pub(crate) fn take_request(home: &AgentHome) -> Option<Request> {
    let path = request_file(home);
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    match text.trim() {
        "start" => Some(Request::Start),
        "stop" => Some(Request::Stop),
        _ => None,
    }
}

pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `(pid, exit code)` from `run\agent.exit`.
pub(crate) fn read_exit(home: &AgentHome) -> Option<(u32, i32)> {
    let text = std::fs::read_to_string(home.run().join(layout::AGENT_EXIT_FILE)).ok()?;
    let mut fields = text.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

pub(crate) use agent_service::clock::now_secs;
use agent_service::clock::timestamp;

/// Appends a line to `logs\service.log` (what `agent-wrapper.sh` writes to wrapper.log).
///
/// The service, the helper that restarts it after a self-replace and `agent-service
/// start` may write at the same moment: each line goes in one write, under a lock of
/// the file (Windows appends a write whole; Wine appends by writing at the end it saw,
/// and two processes' lines overwrote each other there).
pub(crate) fn log(home: &AgentHome, text: &str) {
    let _ = std::fs::create_dir_all(home.logs());
    let line = format!("{} agent-service: {text}\n", timestamp(now_secs()));
    // Read access too: LockFileEx wants a handle opened for reading or writing.
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(home.logs().join("service.log"))
    {
        let locked = lock(&file);
        let _ = file.write_all(line.as_bytes());
        if locked {
            unlock(&file);
        }
    }
}

/// The whole file, exclusively, waiting for other holders; false when it cannot be had
/// (the line is written anyway).
fn lock(file: &std::fs::File) -> bool {
    // SAFETY: an all-zero OVERLAPPED is its documented initial state.
    let mut at: OVERLAPPED = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is the open file's, and `at` outlives the call, which returns
    // once the lock is held (the handle is synchronous).
    unsafe {
        LockFileEx(
            file.as_raw_handle(),
            LOCKFILE_EXCLUSIVE_LOCK,
            0,
            u32::MAX,
            u32::MAX,
            &mut at,
        ) != 0
    }
}

fn unlock(file: &std::fs::File) {
    // SAFETY: as in `lock`.
    let mut at: OVERLAPPED = unsafe { std::mem::zeroed() };
    // SAFETY: as in `lock`; it releases the range `lock` took.
    unsafe {
        UnlockFileEx(file.as_raw_handle(), 0, u32::MAX, u32::MAX, &mut at);
    }
}

/// Seconds from the environment, or `default`.
pub(crate) fn env_secs(name: &str, default: u64) -> Duration {
    agent_service::knobs::secs(name, default)
}
