//! `agent-service`: the agent's supervisor and the commands that drive it, one program
//! on both systems. On Unix it is what `agent-wrapper.sh start|stop|restart|status|kill`
//! runs (the script reads `conf/agent-env.sh` and hands over): `start` leaves a
//! supervisor (`__supervise`) running `current/bin/agent run`. On Windows it is the
//! service (`agent-service.exe start|stop|restart|status`, `install`, `uninstall`, and
//! `run`, what the service manager starts), running `versions\<v>\bin\agent.exe run` in
//! a job object. Either way it restarts a crashed agent with backoff, starts none while
//! an updater runs, and stops it gracefully; what to do after an exit is decided in
//! `agent_service::policy` (pure), and the platform module acts.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as os;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as os;

fn main() -> std::process::ExitCode {
    os::main()
}
