//! The names the Windows launcher, `<home>\bin\agent.exe`, shares with the programs
//! around it: the bundle installs it, the service keeps it current, and `agent
//! uninstall` lets go of it while it runs the uninstall.

use std::path::PathBuf;

/// What a version carries in its `bin\`: copied to `<home>\bin\agent.exe`.
pub const LAUNCHER_EXE: &str = "agent-launcher.exe";

/// Where `agent uninstall`, run through the launcher, moves the launcher's program
/// (Windows refuses to delete a running program, but lets it be renamed): a name in the
/// temporary directory made of the uninstalling agent's pid, which the launcher knows as
/// its child's, and deletes once it has ended.
pub fn set_aside(agent_pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("agent-launcher-{agent_pid}.exe.old"))
}
