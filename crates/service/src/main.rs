//! `agent-service.exe start|stop|restart|status`, `install`, `uninstall`, and `run` (what
//! the service manager starts): the agent as a Windows service. It plays
//! `agent-wrapper.sh`'s part: runs `versions\<v>\bin\agent.exe run` in a job object,
//! restarts it with backoff, starts none while an updater runs, stops it through its
//! stop event then the job. What to do after an exit is decided in `agent_service::policy` (pure);
//! the platform module acts. On other systems it only says to use the wrapper.

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

#[cfg(not(windows))]
mod unix;
#[cfg(not(windows))]
use unix as os;

fn main() -> std::process::ExitCode {
    os::main()
}
