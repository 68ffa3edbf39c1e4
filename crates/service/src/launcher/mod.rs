//! `<home>\bin\agent.exe`: the launcher, a stable path for the agent's command line on
//! Windows. The agent's own program lives in `versions\<v>\bin\` and changes with every
//! update; the launcher reads `current` at each run and runs that version's `agent.exe`
//! with the same arguments, the same console and the same exit code, so `agent status`
//! works from a fixed place (the MSI puts `<home>\bin` on the system `PATH`). It holds
//! no logic of the agent's: a launcher of any version runs an agent of any version.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as platform;
#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as platform;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use agent_protocol::layout;

/// The agent's home from the launcher's own path, `<home>\bin\agent.exe`.
pub fn home_of(exe: &Path) -> Option<PathBuf> {
    let home = exe.parent()?.parent()?;
    (home.join("current").exists() || home.join("versions").is_dir()).then(|| home.to_owned())
}

/// The program the launcher runs for the home: `versions\<current>\bin\agent.exe`.
pub fn program(home: &Path) -> Result<PathBuf, String> {
    let version_dir = agent_extract::current::read_dir(&home.join("current")).map_err(|e| {
        format!(
            "no agent is installed at {} ({e}); install it with its MSI (msiexec /i agent.msi) or agent-bundle-<version>.exe --install",
            home.display()
        )
    })?;
    Ok(version_dir.join("bin").join(layout::AGENT_EXE_WINDOWS))
}

/// Runs the current version's agent with `args`, and answers its exit code.
pub fn run(args: Vec<OsString>) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!(
                "agent: cannot tell where this launcher lies ({e}); run <home>\\versions\\<version>\\bin\\agent.exe"
            );
            return ExitCode::FAILURE;
        }
    };
    let Some(home) = home_of(&exe) else {
        eprintln!(
            "agent: {} lies in no agent's home (<home>\\bin\\agent.exe, beside <home>\\current); run the agent.exe of <home>\\versions\\<version>\\bin",
            exe.display()
        );
        return ExitCode::FAILURE;
    };
    let program = match program(&home) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut child = match Command::new(&program).args(args).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "agent: cannot run {} ({e}); is the installation whole? `agent-service.exe status` in {} says",
                program.display(),
                home.join("bin").display()
            );
            return ExitCode::FAILURE;
        }
    };
    let pid = child.id();
    let status = child.wait();
    platform::after(pid);
    match status {
        // Windows' exit codes are 32 bits; the agent's own are small.
        Ok(status) => ExitCode::from(
            status
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .unwrap_or(1),
        ),
        Err(e) => {
            eprintln!("agent: lost {} ({e})", program.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_runs_the_version_current_names() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        std::fs::create_dir_all(home.join("versions/2.0.0+7/bin")).unwrap();
        std::fs::create_dir_all(home.join("bin")).unwrap();
        // Before an install there is no current: the launcher says how to install.
        let none = program(home).unwrap_err();
        assert!(none.contains("msiexec /i"), "{none}");
        std::fs::write(home.join("current"), "2.0.0+7\n").unwrap();
        assert_eq!(
            program(home).unwrap(),
            home.join("versions/2.0.0+7/bin/agent.exe")
        );
        assert_eq!(home_of(&home.join("bin/agent.exe")).as_deref(), Some(home));
        assert_eq!(home_of(&dir.path().join("elsewhere/bin/agent.exe")), None);
    }
}
